// Package sourceerr holds the errors a GPU source fails with when it cannot read the
// GPUs at all, so that every source (collector/dcgm, nvml, exporter) and the collector's
// OpenSource, which opens them by name, share one error to test with errors.Is without
// importing each other. Package collector re-exports them.
package sourceerr

import (
	"errors"
	"fmt"
)

// ErrNoGPUSource reports that a source found no way to read the GPUs (no library, no
// driver, no GPU, no page), and --source auto that no source could.
var ErrNoGPUSource = errors.New("no GPU source available")

// ErrNoCgo reports that a source needs cgo and this binary was built without it: the
// DCGM and NVML sources call the NVIDIA libraries through C.
var ErrNoCgo = errors.New("this binary was built without cgo (CGO_ENABLED=0)")

// NoGPULibraryHint names the sources that read GPUs without an NVIDIA library in this
// process, for errors that say what to use instead.
const NoGPULibraryHint = "--source exporter to read an existing dcgm-exporter, or --source sim for simulated GPUs"

// NoCgo is the error a source that needs cgo fails with in a binary built without it:
// it wraps ErrNoCgo, names the source and why it needs C, and says what to do.
func NoCgo(source, why string) error {
	return fmt.Errorf("%w: the %s source needs cgo (%s); build gpuscaler with a C compiler and CGO_ENABLED=1 "+
		"(CONTRIBUTING.md, Building), or use %s", ErrNoCgo, source, why, NoGPULibraryHint)
}
