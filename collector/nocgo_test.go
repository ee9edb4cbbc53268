//go:build !cgo

package collector

import (
	"errors"
	"strings"
	"testing"

	"github.com/gpuscaler/gpuscaler/collector/sim"
)

// TestNoCgoSources: built without cgo, --source dcgm, nvml and auto fail at start saying
// why and what to do, and the sources that need no C library still open. (make static
// runs it with CGO_ENABLED=0.)
func TestNoCgoSources(t *testing.T) {
	tests := map[string]struct {
		kind string
		want []string
	}{
		"dcgm": {kind: "dcgm", want: []string{"the dcgm source needs cgo", "libdcgm"}},
		"nvml": {kind: "nvml", want: []string{"the nvml source needs cgo", "libnvidia-ml"}},
		"auto": {kind: "auto", want: []string{"no GPU source available", "neither the DCGM nor the NVML source"}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			src, err := OpenSource(SourceConfig{Kind: tc.kind})
			if err == nil {
				src.Close()
				t.Fatalf("got source %s, want an error", src.Name())
			}
			if !errors.Is(err, ErrNoCgo) {
				t.Errorf("got error %v, want one wrapping ErrNoCgo", err)
			}
			if tc.kind == "auto" && !errors.Is(err, ErrNoGPUSource) {
				t.Errorf("got error %v, want one wrapping ErrNoGPUSource", err)
			}
			want := append([]string{"built without cgo (CGO_ENABLED=0)", "C compiler", "CGO_ENABLED=1", "--source exporter", "--source sim"}, tc.want...)
			for _, w := range want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("got error %q, want it to say %q", err, w)
				}
			}
			if n := strings.Count(err.Error(), "without cgo"); n != 1 {
				t.Errorf("got error %q, saying \"without cgo\" %d times, want once", err, n)
			}
		})
	}
	simulated, err := sim.New("n", sim.Config{GPUs: 1})
	if err != nil {
		t.Fatal(err)
	}
	for _, cfg := range []SourceConfig{{Kind: "sim", Sim: simulated}, {Kind: "exporter", ExporterURL: "http://localhost:9400/metrics"}} {
		src, err := OpenSource(cfg)
		if err != nil {
			t.Fatalf("%s without cgo: %v", cfg.Kind, err)
		}
		src.Close()
	}
}
