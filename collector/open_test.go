package collector

import (
	"errors"
	"strings"
	"testing"

	"github.com/gpuscaler/gpuscaler/collector/sim"
)

// TestOpenSourceAuto runs on a machine without NVIDIA libraries: auto must say what it
// tried and what to use instead. On a GPU machine it opens DCGM or NVML.
func TestOpenSourceAuto(t *testing.T) {
	src, err := OpenSource(SourceConfig{Kind: "auto"})
	if err == nil {
		src.Close()
		t.Skip("a GPU source is available here")
	}
	if errors.Is(err, ErrNoCgo) {
		t.Skip("built without cgo: TestNoCgoSources checks this error")
	}
	if !errors.Is(err, ErrNoGPUSource) {
		t.Fatalf("error %v, want ErrNoGPUSource", err)
	}
	for _, want := range []string{"tried DCGM", "and NVML", "--source exporter", "--source sim"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
	if strings.Count(err.Error(), ErrNoGPUSource.Error()) != 1 {
		t.Errorf("error %q repeats %q", err, ErrNoGPUSource)
	}
}

func TestOpenSourceKinds(t *testing.T) {
	simulated, _ := sim.New("n", sim.Config{GPUs: 1})
	if src, err := OpenSource(SourceConfig{Kind: "sim", Sim: simulated}); err != nil || src.Name() != "sim" {
		t.Fatalf("sim: %v, %v", src, err)
	}
	if _, err := OpenSource(SourceConfig{Kind: "sim"}); err == nil {
		t.Fatal("sim without a simulated node succeeded")
	}
	var never *sim.Node // a node never made, in the Source interface: not nil to == nil
	if src, err := OpenSource(SourceConfig{Kind: "sim", Sim: never}); err == nil {
		t.Fatalf("sim with a nil *sim.Node gave %#v, want an error", src)
	}
	if src, err := OpenSource(SourceConfig{Kind: "exporter", ExporterURL: "http://localhost:9400/metrics"}); err != nil || src.Name() != "exporter" {
		t.Fatalf("exporter: %v, %v", src, err)
	}
	if _, err := OpenSource(SourceConfig{Kind: "gpu"}); err == nil || !strings.Contains(err.Error(), "unknown GPU source") {
		t.Fatalf("unknown kind: %v", err)
	}
}
