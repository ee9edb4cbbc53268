package replay

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/gpuscaler/gpuscaler/cmd/gpuscaler/internal/inference"
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
