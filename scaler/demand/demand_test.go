package demand

import (
	"math"
	"testing"
	"time"

	gpuscalerv1 "github.com/gpuscaler/gpuscaler/proto/gpuscaler/v1"
)

// Erlang C by hand, for one and two slots per replica. With a = 0.5 busy slots of
// S = 1 s each:
//   - m = 1: C = a = 0.5; P(wait > w) = 0.5·e^(−0.5w): 0.0034 for w = 10s, 0.30 for 1s.
//   - m = 2: B = 1/13, C = 0.1; P(wait > 1s) = 0.1·e^(−1.5) = 0.022.
//   - m = 3: C = 0.01515; P(wait > 1s) = 0.01515·e^(−2.5) = 0.0012.
//   - 3 slots are 1.5 two-slot replicas: the HPA, not the metric, rounds up.
func TestServingReplicasByHand(t *testing.T) {
	for _, tc := range []struct {
		a, service, wait float64
		c                int
		want             float64
	}{
		{0.5, 1, 10, 1, 1},
		{0.5, 1, 1, 1, 3},
		{0.5, 1, 1, 2, 1.5},
		{0, 1, 1, 1, 0},        // no arrivals: no replica serves them
		{7.9, 1, 3600, 8, 1},   // a wait an hour long: the slots just above the load
		{8, 1, 3600, 8, 1.125}, // m must exceed a: 8 slots at a load of 8 never catch up
	} {
		if got := ServingReplicas(tc.a, tc.service, tc.wait, tc.c); got != tc.want {
			t.Errorf("ServingReplicas(a=%g, S=%g, wait=%g, c=%d) = %g, want %g", tc.a, tc.service, tc.wait, tc.c, got, tc.want)
		}
	}
}

// TestServingReplicasMonotonic: more load or a shorter wait never asks for fewer
// replicas, and the replicas always hold more slots than the load keeps busy.
func TestServingReplicasMonotonic(t *testing.T) {
	waits := []float64{0.01, 0.1, 1, 5, 30, 120, 3600}
	for _, c := range []int{1, 4, 8} {
		for _, s := range []float64{0.5, 5, 30} {
			prevLoad := 0.0
			for a := 0.05; a < 3000; a *= 1.7 {
				prevWait := math.Inf(1)
				for _, w := range waits {
					n := ServingReplicas(a, s, w, c)
					if n*float64(c) <= a {
						t.Fatalf("ServingReplicas(a=%g, S=%g, wait=%g, c=%d) = %g: %g slots for a load of %g", a, s, w, c, n, n*float64(c), a)
					}
					if n > prevWait {
						t.Fatalf("a longer wait asked for more: ServingReplicas(a=%g, S=%g, wait=%g, c=%d) = %g, %g for a shorter one", a, s, w, c, n, prevWait)
					}
					prevWait = n
				}
				n := ServingReplicas(a, s, 30, c)
				if n < prevLoad {
					t.Fatalf("more load asked for fewer: ServingReplicas(a=%g, S=%g, 30, c=%d) = %g, below %g", a, s, c, n, prevLoad)
				}
				prevLoad = n
			}
		}
	}
}

// TestServingReplicasLargeLoads: square-root staffing takes over above erlangSlots
// within a few percent of the exact answer, so the metric has no step there.
func TestServingReplicasLargeLoads(t *testing.T) {
	exact := ServingReplicas(erlangSlots-1, 5, 1, 1)
	approx := ServingReplicas(erlangSlots+1, 5, 1, 1)
	if d := math.Abs(approx-exact) / exact; d > 0.03 {
		t.Errorf("at %d slots: exact %g, square-root staffing %g: %.1f%% apart, want within 3%%", erlangSlots, exact, approx, 100*d)
	}
}

// TestReplicas: until an item is seen to finish, the metric is the backlog over the
// concurrency; then, within a wait shorter than a service time, Erlang's serving plus
// draining, where the waiting items need one slot each, not the 20·20/(4·10) = 10
// replicas that starting c/S a second per replica would take.
func TestReplicas(t *testing.T) {
	if got := Replicas(Inputs{Traffic: Estimate{Arrivals: 3}, Concurrency: 4, TargetWait: 10 * time.Second, Waiting: 6, InFlight: 2}); got != 2 {
		t.Errorf("no service time yet: Replicas = %g, want (6+2)/4 = 2", got)
	}
	e := Estimate{Arrivals: 0.5, Service: 20}
	want := ServingReplicas(10, 20, 10, 4) + 20/4.0
	if got := Replicas(Inputs{Traffic: e, Concurrency: 4, TargetWait: 10 * time.Second, Waiting: 20, InFlight: 3}); got != want {
		t.Errorf("Replicas = %g, want %g", got, want)
	}
	// Within 5 s, a quarter of the service time: 4 waiting still need one slot each.
	if got, want := Replicas(Inputs{Traffic: e, Concurrency: 4, TargetWait: 5 * time.Second, Waiting: 4, InFlight: 3}), ServingReplicas(10, 20, 5, 4)+1; got != want {
		t.Errorf("Replicas within 5 s = %g, want %g", got, want)
	}
}

// FuzzDemand folds any sequence of reports and checks the metric stays a finite,
// non-negative number of replicas: the reports are outside input.
func FuzzDemand(f *testing.F) {
	f.Add(uint64(2), uint64(10), uint64(2), uint16(1000), uint8(1), uint16(30))
	f.Add(uint64(0), uint64(0), uint64(0), uint16(0), uint8(0), uint16(1))
	f.Add(uint64(math.MaxUint64), uint64(math.MaxUint64), uint64(math.MaxUint64), uint16(1), uint8(2), uint16(65535))
	f.Fuzz(func(t *testing.T, waiting, inFlight, arrivals uint64, gapMillis uint16, seqStep uint8, waitSeconds uint16) {
		var (
			e    Estimate
			prev *gpuscalerv1.QueueReport
		)
		seq := uint64(1)
		for i := range uint64(6) {
			r := &gpuscalerv1.QueueReport{Waiting: waiting >> i, InFlight: inFlight >> (5 - i), Arrivals: arrivals ^ i, ProducerId: "p", Sequence: seq}
			e, prev = e.Next(prev, r, time.Duration(gapMillis)*time.Millisecond), r
			seq += uint64(seqStep)
		}
		v := Replicas(Inputs{Traffic: e, Concurrency: 1 + int(seqStep), TargetWait: time.Duration(waitSeconds%3600+1) * time.Second, Waiting: float64(prev.GetWaiting()), InFlight: float64(prev.GetInFlight())})
		if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
			t.Fatalf("Replicas = %g from estimate %+v", v, e)
		}
	})
}

// TestBurstRaisesTheRateFast: five arrivals a second for ten seconds after nothing. The
// minute's estimate has seen 15% of that rate, the burst's 39%; the metric serves the
// larger.
func TestBurstRaisesTheRateFast(t *testing.T) {
	var (
		e    Estimate
		prev *gpuscalerv1.QueueReport
	)
	for i := range uint64(11) {
		arrivals := uint64(5)
		if i == 0 {
			arrivals = 0
		}
		r := &gpuscalerv1.QueueReport{InFlight: 1, Arrivals: arrivals, ProducerId: "p", Sequence: i + 1}
		e, prev = e.Next(prev, r, time.Second), r
	}
	if want := 5 * -math.Expm1(-10.0/60); math.Abs(e.Arrivals-want) > 1e-9 {
		t.Errorf("rate over a minute = %g, want %g", e.Arrivals, want)
	}
	if want := 5 * -math.Expm1(-10.0/20); math.Abs(e.Burst-want) > 1e-9 {
		t.Errorf("rate over 20 s = %g, want %g", e.Burst, want)
	}
	e.Service = 1
	if got, want := Replicas(Inputs{Traffic: e, Concurrency: 1, TargetWait: 500 * time.Millisecond, Waiting: 0, InFlight: 0}), ServingReplicas(e.Burst, 1, 0.5, 1); got != want {
		t.Errorf("Replicas = %g, want %g, serving the burst's rate", got, want)
	}
}

// TestReplicasFluidOnceTheWaitIsAService: two arrivals a second of 5 s each. Within 30 s,
// a wait of six service times, the fluid model asks for (0 + 2·60)·5 / (30 + 60) = 6.67
// replicas where Erlang asks for 11 (C(11, 10)·e^(−6) < 1%): the fewer. Within 2 s,
// less than a service time, Erlang alone.
func TestReplicasFluidOnceTheWaitIsAService(t *testing.T) {
	e := Estimate{Arrivals: 2, Burst: 2, Service: 5}
	if got := ServingReplicas(10, 5, 30, 1); got != 11 {
		t.Fatalf("ServingReplicas(10, 5, 30, 1) = %g, want 11", got)
	}
	if got, want := Replicas(Inputs{Traffic: e, Concurrency: 1, TargetWait: 30 * time.Second, Waiting: 0, InFlight: 10}), 120*5/90.0; math.Abs(got-want) > 1e-9 {
		t.Errorf("Replicas within 30 s = %g, want the fluid %g", got, want)
	}
	// 45 waiting within 30 s: Erlang 11 + 45·5/30 = 18.5; fluid (45 + 120)·5/90 = 9.17.
	if got, want := Replicas(Inputs{Traffic: e, Concurrency: 1, TargetWait: 30 * time.Second, Waiting: 45, InFlight: 10}), 165*5/90.0; math.Abs(got-want) > 1e-9 {
		t.Errorf("Replicas with 45 waiting = %g, want the fluid %g", got, want)
	}
	if got, want := Replicas(Inputs{Traffic: e, Concurrency: 1, TargetWait: 2 * time.Second, Waiting: 0, InFlight: 10}), ServingReplicas(10, 5, 2, 1); got != want {
		t.Errorf("Replicas within 2 s = %g, want Erlang's %g", got, want)
	}
}

// TestFluidIsTheFewerOnceTheWaitIsAService: for targetWait at or above the service time
// the metric is the fluid model alone, and that is the fewer replicas of the two models
// at every load, backlog and concurrency tried: Erlang's serving exceeds λS/c and its
// drain, even at its least (c/S a second per replica: waiting·S/(c·T)), exceeds the
// fluid's, so the switch at S is the same as taking the fewer.
func TestFluidIsTheFewerOnceTheWaitIsAService(t *testing.T) {
	for _, c := range []int{1, 4, 8} {
		for _, s := range []float64{0.1, 1, 6.65, 30} {
			for _, w := range []float64{1, 1.5, 4, 60, 3600} {
				wait := s * w
				for rate := 0.0; rate < 500; rate = rate*2.5 + 0.01 {
					for _, waiting := range []float64{0, 1, 37, 5000} {
						fluid := fluidReplicas(rate, s, wait, c, waiting)
						erlang := ServingReplicas(rate*s, s, wait, c) + waiting*s/(float64(c)*wait)
						if fluid > erlang {
							t.Fatalf("λ=%g S=%g T=%g c=%d waiting=%g: fluid %g above Erlang's %g", rate, s, wait, c, waiting, fluid, erlang)
						}
						e := Estimate{Arrivals: rate, Burst: rate, Service: s}
						if got := Replicas(Inputs{Traffic: e, Concurrency: c, TargetWait: time.Duration(wait * float64(time.Second)), Waiting: waiting, InFlight: 0}); math.Abs(got-fluid) > 1e-9*max(fluid, 1) {
							t.Fatalf("λ=%g S=%g T=%g c=%d waiting=%g: Replicas = %g, want the fluid %g", rate, s, wait, c, waiting, got, fluid)
						}
					}
				}
			}
		}
	}
}
