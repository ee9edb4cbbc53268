package replay

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/gpuscaler/gpuscaler/cmd/gpuscaler/internal/inference"
	"github.com/gpuscaler/gpuscaler/cmd/gpuscaler/internal/kedarules"
	"github.com/gpuscaler/gpuscaler/cmd/gpuscaler/internal/traces"
	"github.com/gpuscaler/gpuscaler/scaler"
)

// TestTargetWaitSweep: the sweep runs from 10 ms to 10 min, twelve settings a decade
// from 100 ms, each the last times 1.1 to 1.25 (E12's steps), written as the trigger
// key takes them.
func TestTargetWaitSweep(t *testing.T) {
	ws := TargetWaitSweep()
	if ws[0] != 10*time.Millisecond || ws[1] != 100*time.Millisecond || ws[len(ws)-1] != 10*time.Minute {
		t.Fatalf("sweep %v: want 10ms, 100ms … 10m0s", ws)
	}
	for i := 2; i < len(ws)-1; i++ {
		if r := float64(ws[i]) / float64(ws[i-1]); r < 1.09 || r > 1.25 {
			t.Errorf("%s after %s: a step of %.3f, want E12's 1.1 to 1.22", ws[i], ws[i-1], r)
		}
	}
	for _, want := range []time.Duration{1200 * time.Millisecond, 4700 * time.Millisecond, 82 * time.Second, 560 * time.Second} {
		if !slices.Contains(ws, want) {
			t.Errorf("sweep %v lacks %s", ws, want)
		}
	}
}

// TestReverse: a request d before the last arrives d after the first, in arrival order,
// with its own service time, across services; played backwards twice, the scenario is
// what it was.
func TestReverse(t *testing.T) {
	s := time.Second
	sc := &Scenario{Services: []inference.Service{
		{Name: "a", Requests: []inference.Request{{At: 10 * s, Service: 1 * s}, {At: 12 * s, Service: 2 * s}, {At: 40 * s, Service: 3 * s}}},
		{Name: "b", Requests: []inference.Request{{At: 20 * s, Service: 4 * s}, {At: 50 * s, Service: 5 * s}}},
	}}
	orig := fmt.Sprint(sc.Services)
	sc.Reverse()
	want := "[{a [{20s 3s} {48s 2s} {50s 1s}]} {b [{10s 5s} {40s 4s}]}]"
	if got := fmt.Sprint(sc.Services); got != want {
		t.Errorf("reversed: %s, want %s", got, want)
	}
	sc.Reverse()
	if got := fmt.Sprint(sc.Services); got != orig {
		t.Errorf("reversed twice: %s, want %s", got, orig)
	}
}

// TestSetHPATolerance: the modelled HPAs tolerate the share given both ways, and every
// queue-demand trigger repeats it as scaleUpTolerance, in the recommended policy and in
// the sweep; queue-backlog triggers, which do not read it, are left as they were, and no
// policy's metadata is shared with another's.
func TestSetHPATolerance(t *testing.T) {
	s := time.Second
	reqs := []LLMRequest{{At: 0, Prompt: 100, Output: 100}, {At: 10 * s, Prompt: 100, Output: 100}}
	load, err := traces.NewDurations([]time.Duration{30 * s})
	if err != nil {
		t.Fatal(err)
	}
	sc, err := LLM(FormatAzureLLM, reqs, DefaultLLMServiceModel, 1, load, 1)
	if err != nil {
		t.Fatal(err)
	}
	if sc.Config.Tolerances != nil {
		t.Fatalf("tolerances %+v before any is set, want nil (the HPA's defaults)", *sc.Config.Tolerances)
	}
	sc.SetHPATolerance(0.2)
	if got := sc.Config.Tolerances; got == nil || *got != (kedarules.Tolerances{ScaleDown: 0.2, ScaleUp: 0.2}) {
		t.Errorf("tolerances %v, want 0.2 both ways", got)
	}
	demand, backlog := 0, 0
	for _, p := range append(slices.Clone(sc.Policies), sc.Sweeps...) {
		_, isDemand := p.Metadata[scaler.KeyTargetWait]
		got, repeated := p.Metadata[scaler.KeyScaleUpTolerance]
		switch {
		case isDemand && got != "0.2":
			t.Errorf("%s %s: scaleUpTolerance %q, want 0.2", p.Name, p.Setting, got)
		case !isDemand && repeated:
			t.Errorf("%s %s: scaleUpTolerance %q on a trigger without targetWait", p.Name, p.Setting, got)
		case isDemand:
			demand++
		case p.Metadata != nil:
			backlog++
		}
	}
	if demand < 2 || backlog < 2 {
		t.Errorf("%d queue-demand and %d queue-backlog triggers: the scenario should have both", demand, backlog)
	}
	sc.Sweeps[len(sc.Sweeps)-1].Metadata["x"] = "y"
	for _, p := range sc.Sweeps[:len(sc.Sweeps)-1] {
		if p.Metadata["x"] != "" {
			t.Fatalf("%s shares its metadata with another policy", p.Setting)
		}
	}
}
