//go:build !cgo

package collector

import "github.com/gpuscaler/gpuscaler/collector/sourceerr"

// A binary built without cgo (CGO_ENABLED=0, a static scaler image or a machine with no
// C compiler) has no DCGM or NVML source: go-dcgm and go-nvml call libdcgm and
// libnvidia-ml through C and do not compile without it. These stand-ins keep the
// package's API, so the same code builds either way, and make --source dcgm|nvml fail at
// start saying why, rather than the build failing inside go-nvml.

// NewDCGM fails with an error wrapping ErrNoCgo: the DCGM source needs cgo.
func NewDCGM(DCGMConfig) (Source, error) {
	return nil, sourceerr.NoCgo("dcgm", "go-dcgm calls libdcgm through C")
}

// NewNVML fails with an error wrapping ErrNoCgo: the NVML source needs cgo.
func NewNVML(NVMLConfig) (Source, error) {
	return nil, sourceerr.NoCgo("nvml", "go-nvml calls libnvidia-ml through C")
}
