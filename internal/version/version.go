// Package version holds the build's version, stamped by the linker:
// -X github.com/gpuscaler/gpuscaler/internal/version.Version=v1.2.3 (and .Commit).
package version

import (
	"fmt"
	"runtime"
)

// Set at build time; "dev" and "unknown" in a plain go build.
var (
	Version = "dev"
	Commit  = "unknown"
)

// String describes the build on one line, ending in whether it was built with cgo: a
// static binary (CGO_ENABLED=0) runs every command, but its collector has no DCGM or
// NVML source.
func String() string {
	cgo := "cgo"
	if !Cgo {
		cgo = "no cgo: no DCGM or NVML source"
	}
	return fmt.Sprintf("gpuscaler %s (commit %s, %s, %s/%s, %s)", Version, Commit, runtime.Version(), runtime.GOOS, runtime.GOARCH, cgo)
}
