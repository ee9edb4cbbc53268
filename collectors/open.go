package collectors

import (
	"errors"
	"fmt"
	"strings"
	"time"
)

// SourceConfig says which GPU source to open and how.
type SourceConfig struct {
	// Kind is "auto" (DCGM, else NVML), "dcgm", "nvml", "exporter" or "sim". Empty means auto.
	Kind string
	// Every is the report interval: DCGM samples its fields at it.
	Every time.Duration
	// DCGMAddr is a standalone nv-hostengine; empty uses DCGM's embedded host engine.
	DCGMAddr string
	// ExporterURL is the dcgm-exporter /metrics URL the exporter source scrapes.
	ExporterURL string
	// Sim is the simulated node the sim source reads.
	Sim *Sim
	// NVML configures the NVML source (auto falling back to it, or nvml).
	NVML NVMLConfig
}

// SourceKinds lists the values of SourceConfig.Kind.
var SourceKinds = []string{"auto", "dcgm", "nvml", "exporter", "sim"}

// OpenSource opens the source cfg names. With auto it tries DCGM, then NVML, and fails
// with an error wrapping ErrNoGPUSource that says what each attempt found and what to do.
func OpenSource(cfg SourceConfig) (Source, error) {
	switch cfg.Kind {
	case "", "auto":
		d, dcgmErr := NewDCGM(DCGMConfig{Addr: cfg.DCGMAddr, Every: cfg.Every})
		if dcgmErr == nil {
			return d, nil
		}
		n, nvmlErr := NewNVML(cfg.NVML)
		if nvmlErr == nil {
			return n, nil
		}
		return nil, fmt.Errorf("%w: tried DCGM (%s) and NVML (%s); on a node without the NVIDIA libraries use "+
			"--source exporter to read an existing dcgm-exporter, or --source sim for simulated GPUs", ErrNoGPUSource,
			unwrapNoSource(dcgmErr), unwrapNoSource(nvmlErr))
	case "dcgm":
		return NewDCGM(DCGMConfig{Addr: cfg.DCGMAddr, Every: cfg.Every})
	case "nvml":
		return NewNVML(cfg.NVML)
	case "exporter":
		return NewExporter(cfg.ExporterURL, nil, max(cfg.Every, time.Second))
	case "sim":
		if cfg.Sim == nil {
			return nil, errors.New("the sim source needs a simulated node")
		}
		return cfg.Sim, nil
	default:
		return nil, fmt.Errorf("unknown GPU source %q: want one of %v", cfg.Kind, SourceKinds)
	}
}

// unwrapNoSource drops the "no GPU source available: " prefix from a source's error, so
// a message naming several does not repeat it.
func unwrapNoSource(err error) string {
	msg, _ := strings.CutPrefix(err.Error(), ErrNoGPUSource.Error()+": ")
	return msg
}
