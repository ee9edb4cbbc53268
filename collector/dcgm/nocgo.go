//go:build !cgo

package dcgm

import (
	"context"

	"github.com/gpuscaler/gpuscaler/collector/sourceerr"
	gpuscalerv1 "github.com/gpuscaler/gpuscaler/proto/gpuscaler/v1"
)

// A binary built without cgo (CGO_ENABLED=0, a static scaler image or a machine with no
// C compiler) has no DCGM source: go-dcgm calls libdcgm through C and does not compile
// without it. This stand-in keeps the package's API, so the same code builds either way,
// and makes --source dcgm fail at start saying why, rather than the build failing inside
// go-dcgm.

// Source is the DCGM source. Without cgo there is none: New fails, and no Source is
// ever made.
type Source struct{}

// New fails with an error wrapping sourceerr.ErrNoCgo: the DCGM source needs cgo.
func New(Config) (*Source, error) {
	return nil, sourceerr.NoCgo("dcgm", "go-dcgm calls libdcgm through C")
}

func (*Source) Name() string { return "dcgm" }

func (*Source) Collect(context.Context) ([]*gpuscalerv1.GPUSample, error) {
	return nil, sourceerr.NoCgo("dcgm", "go-dcgm calls libdcgm through C")
}

func (*Source) Close() error { return nil }
