//go:build !cgo

package nvml

import (
	"context"

	"github.com/gpuscaler/gpuscaler/collector/sourceerr"
	gpuscalerv1 "github.com/gpuscaler/gpuscaler/proto/gpuscaler/v1"
)

// A binary built without cgo (CGO_ENABLED=0, a static scaler image or a machine with no
// C compiler) has no NVML source: go-nvml calls libnvidia-ml through C and does not
// compile without it. This stand-in keeps the package's API, so the same code builds
// either way, and makes --source nvml fail at start saying why, rather than the build
// failing inside go-nvml.

// Source is the NVML source. Without cgo there is none: New fails, and no Source is
// ever made.
type Source struct{}

// New fails with an error wrapping sourceerr.ErrNoCgo: the NVML source needs cgo.
func New(Config) (*Source, error) {
	return nil, sourceerr.NoCgo("nvml", "go-nvml calls libnvidia-ml through C")
}

func (*Source) Name() string { return "nvml" }

func (*Source) Collect(context.Context) ([]*gpuscalerv1.GPUSample, error) {
	return nil, sourceerr.NoCgo("nvml", "go-nvml calls libnvidia-ml through C")
}

func (*Source) PodUsage() map[string]map[string]float64 { return nil }

func (*Source) Close() error { return nil }
