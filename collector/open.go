package collector

import (
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpuscaler/gpuscaler/collector/dcgm"
	"github.com/gpuscaler/gpuscaler/collector/exporter"
	"github.com/gpuscaler/gpuscaler/collector/nvml"
	"github.com/gpuscaler/gpuscaler/collector/sourceerr"
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
	// Sim is the simulated node (a collector/sim Node) the sim source reads.
	Sim Source
	// Log receives a source's notices (DCGM's lost connection, refused profiling
	// fields, …); nil discards them.
	Log *slog.Logger
	// Registerer takes a source's own metrics (DCGM's unsupported fields); nil registers
	// none.
	Registerer prometheus.Registerer
	// NVML configures the NVML source (auto falling back to it, or nvml).
	NVML nvml.Config
}

// dcgmConfig is the dcgm.Config cfg gives.
func (cfg SourceConfig) dcgmConfig() dcgm.Config {
	return dcgm.Config{Addr: cfg.DCGMAddr, Every: cfg.Every, Log: cfg.Log, Registerer: cfg.Registerer}
}

// nvmlConfig is the nvml.Config cfg gives: cfg.NVML, with Log and Registerer from cfg
// where it sets none.
func (cfg SourceConfig) nvmlConfig() nvml.Config {
	n := cfg.NVML
	if n.Log == nil {
		n.Log = cfg.Log
	}
	if n.Registerer == nil {
		n.Registerer = cfg.Registerer
	}
	return n
}

// ErrNoCgo reports that a source needs cgo and this binary was built without it: the
// DCGM and NVML sources call the NVIDIA libraries through C.
var ErrNoCgo = sourceerr.ErrNoCgo

// SourceKinds lists the values of SourceConfig.Kind.
var SourceKinds = []string{"auto", "dcgm", "nvml", "exporter", "sim"}

// OpenSource opens the source cfg names. With auto it tries DCGM, then NVML, and fails
// with an error wrapping ErrNoGPUSource that says what each attempt found and what to do.
func OpenSource(cfg SourceConfig) (Source, error) {
	switch cfg.Kind {
	case "", "auto":
		d, dcgmErr := dcgm.New(cfg.dcgmConfig())
		if dcgmErr == nil {
			return d, nil
		}
		n, nvmlErr := nvml.New(cfg.nvmlConfig())
		if nvmlErr == nil {
			return n, nil
		}
		if errors.Is(dcgmErr, ErrNoCgo) && errors.Is(nvmlErr, ErrNoCgo) {
			// One reason for both: saying it twice would hide the way out.
			return nil, fmt.Errorf("%w: %w: it has neither the DCGM nor the NVML source (go-dcgm and go-nvml call the "+
				"NVIDIA libraries through C); build gpuscaler with a C compiler and CGO_ENABLED=1 (CONTRIBUTING.md, Building), "+
				"or use %s", ErrNoGPUSource, ErrNoCgo, sourceerr.NoGPULibraryHint)
		}
		return nil, fmt.Errorf("%w: tried DCGM (%s) and NVML (%s); on a node without the NVIDIA libraries use %s",
			ErrNoGPUSource, unwrapNoSource(dcgmErr), unwrapNoSource(nvmlErr), sourceerr.NoGPULibraryHint)
	case "dcgm":
		return opened(dcgm.New(cfg.dcgmConfig()))
	case "nvml":
		return opened(nvml.New(cfg.nvmlConfig()))
	case "exporter":
		return opened(exporter.New(cfg.ExporterURL, nil, max(cfg.Every, time.Second)))
	case "sim":
		if isNil(cfg.Sim) {
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

// opened returns what a source's constructor gave as a Source: nil, not a nil pointer
// in a non-nil interface, when it failed.
func opened[S Source](src S, err error) (Source, error) {
	if err != nil {
		return nil, err
	}
	return src, nil
}

// isNil reports whether s is nil, or an interface holding a nil pointer (a *sim.Node
// never made), which a caller's == nil would miss.
func isNil(s Source) bool {
	if s == nil {
		return true
	}
	v := reflect.ValueOf(s)
	return v.Kind() == reflect.Pointer && v.IsNil()
}
