package demand

import (
	"math"
	"math/rand/v2"
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
// concurrency; then serving plus draining over the horizon, a minute while the cold
// start is unknown.
func TestReplicas(t *testing.T) {
	if got := Replicas(Inputs{Traffic: Estimate{Arrivals: 3}, Concurrency: 4, TargetWait: 10 * time.Second, Waiting: 6, InFlight: 2}); got != 2 {
		t.Errorf("no service time yet: Replicas = %g, want (6+2)/4 = 2", got)
	}
	// Half an arrival a second of 20 s each, within 10 s: the arrivals of the next
	// minute need 10·60/70 busy slots, and Erlang's headroom for their p99; the 20
	// waiting start within 70 s, a slot starting 70/20 of them.
	e := Estimate{Arrivals: 0.5, Service: 20}
	n := Demand(Inputs{Traffic: e, Concurrency: 4, TargetWait: 10 * time.Second, Waiting: 20, InFlight: 3})
	if want := ServingReplicas(10*60/70.0, 20, 10, 4); n.Serving != want {
		t.Errorf("serving %g, want %g", n.Serving, want)
	}
	if want := 20 * 20 / 70.0 / 4; math.Abs(n.Draining-want) > 1e-12 {
		t.Errorf("draining %g, want %g", n.Draining, want)
	}
	if n.Horizon != Window || n.Replicas != n.Serving+n.Draining {
		t.Errorf("got %+v, want the sum over a horizon of a minute", n)
	}
	// Items of 10 min each: a slot starts one of the waiting within 70 s, not 70/600.
	e.Service = 600
	if got, want := Demand(Inputs{Traffic: e, Concurrency: 4, TargetWait: 10 * time.Second, Waiting: 20}).Draining, 20/4.0; got != want {
		t.Errorf("draining items longer than the horizon: %g, want a slot each, %g", got, want)
	}
}

// TestBurstCountedOnce is issue 26's defect 2: a one-off burst of 100 items at one item
// per replica asked for 160 replicas at S = 10 s and T = 2 s, 411 at S = 60 s and
// T = 10 s, 3,086 at S = 600 s and T = 30 s: counted once in the 20 s rate, multiplied
// by S as if it would repeat, and again as waiting. The metric now reads the minute's
// rate and is never more than a slot for each item waiting or expected over the horizon
// at that rate.
func TestBurstCountedOnce(t *testing.T) {
	idle := &gpuscalerv1.QueueReport{ProducerId: "p", Sequence: 1}
	burst := &gpuscalerv1.QueueReport{ProducerId: "p", Sequence: 2, Waiting: 100, Arrivals: 100}
	for _, tc := range []struct {
		service, wait float64
		before        float64
		capped        bool // the cap, a slot per item, binds
	}{{10, 2, 160, false}, {60, 10, 411, false}, {600, 30, 3086, true}} {
		e := Estimate{Service: tc.service}.Next(idle, burst, time.Second)
		expected := e.Arrivals * Window.Seconds() // the minute's rate over the next minute
		n := Demand(Inputs{Traffic: e, Concurrency: 1, TargetWait: time.Duration(tc.wait * float64(time.Second)), Waiting: 100})
		most, sum := 100+expected, n.Serving+n.Draining
		if math.Abs(n.Most-most) > 1e-9 || n.Replicas != min(sum, most) {
			t.Errorf("S=%g T=%g: %+v, want serving plus draining, at most %g", tc.service, tc.wait, n, most)
		}
		if capped := sum > most; capped != tc.capped {
			t.Errorf("S=%g T=%g: serving %g plus draining %g against the cap %g: capped %t, want %t", tc.service, tc.wait, n.Serving, n.Draining, most, capped, tc.capped)
		}
		// Before the cap, the waiting items count once each: at most a slot per item
		// waiting, and the rate's slots for the minute's arrivals only S long each.
		if n.Draining > 100+1e-9 {
			t.Errorf("S=%g T=%g: draining %g for 100 items", tc.service, tc.wait, n.Draining)
		}
		if n.Replicas > tc.before/2 {
			t.Errorf("S=%g T=%g: %g replicas, more than half the %g of before", tc.service, tc.wait, n.Replicas, tc.before)
		}
	}
}

// TestDemandIsContinuousAndFallsWithTheWait is issue 26's defect 3: the metric switched
// from Erlang's model to the fluid one at T = S, its waiting term falling about 7× there,
// so a noisy S near T made it flap. Now a longer targetWait never asks for more, and a
// step across S moves it no more than the step does elsewhere.
func TestDemandIsContinuousAndFallsWithTheWait(t *testing.T) {
	for _, c := range []int{1, 8} {
		for _, s := range []float64{0.5, 6.65, 30, 600} {
			for _, rate := range []float64{0, 0.3, 5, 80} {
				for _, waiting := range []float64{0, 7, 400} {
					e := Estimate{Arrivals: rate, Service: s}
					at := func(w float64) float64 {
						return Replicas(Inputs{Traffic: e, Concurrency: c, TargetWait: time.Duration(w * float64(time.Second)), Waiting: waiting, InFlight: rate * s})
					}
					prev := math.Inf(1)
					for w := 0.01; w < 3600; w *= 1.05 {
						v := at(w)
						if v > prev+1e-9 {
							t.Fatalf("λ=%g S=%g c=%d waiting=%g: %g replicas within %.3g s, more than %g within a shorter wait", rate, s, c, waiting, v, w, prev)
						}
						prev = v
					}
					// Across S, where the old metric switched models, and across S − H,
					// where draining stops giving a slot to each waiting item: a step of
					// 0.2% moves it no more than a slot (Erlang's slots are whole) or 0.5%.
					for _, at0 := range []float64{s, s - Window.Seconds()} {
						if at0 <= 0 {
							continue
						}
						if below, above := at(at0*0.999), at(at0*1.001); below-above > max(1/float64(c), below/200)+1e-9 {
							t.Errorf("λ=%g S=%g c=%d waiting=%g: %g just below %g s, %g just above", rate, s, c, waiting, below, at0, above)
						}
					}
				}
			}
		}
	}
}

// TestHorizonIsTheColdStart is issue 26's defect 5: the metric had no idea how long a
// new replica takes. It looks as far ahead as replicas asked for now take to serve, the
// HPA's sync and the cold start, and never less than a minute; and it provisions for
// the arrivals of that span: a longer cold start never asks for fewer serving replicas.
func TestHorizonIsTheColdStart(t *testing.T) {
	e := Estimate{Arrivals: 5, Service: 6.65}
	prev := 0.0
	for _, tc := range []struct{ cold, horizon time.Duration }{
		{0, Window}, // unknown
		{time.Second, Window},
		{30 * time.Second, Window},
		{52 * time.Second, 67 * time.Second},
		{90 * time.Second, 105 * time.Second},
		{5 * time.Minute, 5*time.Minute + HPASync},
	} {
		if h := Horizon(tc.cold); h != tc.horizon {
			t.Errorf("cold start %s: horizon %s, want %s", tc.cold, h, tc.horizon)
		}
		n := Demand(Inputs{Traffic: e, Concurrency: 8, TargetWait: 10 * time.Second, ColdStart: tc.cold, InFlight: 33})
		if n.Horizon != tc.horizon || n.Serving < prev {
			t.Errorf("cold start %s: %+v, want horizon %s and at least %g serving", tc.cold, n, tc.horizon, prev)
		}
		prev = n.Serving
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
		v := Replicas(Inputs{Traffic: e, Concurrency: 1 + int(seqStep), TargetWait: time.Duration(waitSeconds%3600+1) * time.Second, Waiting: float64(prev.GetWaiting()), InFlight: float64(prev.GetInFlight()), OldestWait: time.Duration(gapMillis) * time.Second})
		if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
			t.Fatalf("Replicas = %g from estimate %+v", v, e)
		}
	})
}

// TestRateOverAMinute: five arrivals a second for ten seconds after nothing: the
// minute's estimate has seen 15% of that rate.
func TestRateOverAMinute(t *testing.T) {
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
}

// TestBatchSlots by hand: items arriving in batches of 21 (dispersion 21) find 10
// batch-mates ahead of them on average. 4 busy slots of items 2 s long start 2 of them
// a second in turn: none at once, leaving 10 that need slots of their own; within 1 s,
// 2, leaving 8; within 4 s, 8, and the 2 left need one slot, which starts 2 in that
// time; within 5 s, all of them. With no slots busy, a wait of 100 s for items of 10 s
// takes a slot for every 10 of them. Arrivals at random, or smoother, or of an unknown
// dispersion, need none.
func TestBatchSlots(t *testing.T) {
	for _, tc := range []struct{ d, m, service, wait, want float64 }{
		{21, 4, 2, 0, 10},
		{21, 4, 2, 1, 8},
		{21, 4, 2, 4, 1},
		{21, 4, 2, 5, 0},
		{21, 4, 2, 60, 0},
		{21, 0, 10, 100, 1},
		{1, 4, 2, 0, 0},
		{0.5, 4, 2, 0, 0},
		{0, 4, 2, 0, 0},
		{math.NaN(), 4, 2, 0, 0},
	} {
		if got := BatchSlots(tc.d, tc.m, tc.service, tc.wait); got != tc.want {
			t.Errorf("BatchSlots(d=%g, m=%g, S=%g, wait=%g) = %g, want %g", tc.d, tc.m, tc.service, tc.wait, got, tc.want)
		}
	}
}

// TestDemandBatched: arrivals in batches add BatchSlots for Erlang's slots over the
// concurrency to what Erlang's formula asks for arrivals at random, and nothing once
// targetWait lets those slots start the batch-mates in turn; a dispersion of 1 is
// Erlang's answer, as an unknown one is.
func TestDemandBatched(t *testing.T) {
	in := Inputs{Traffic: Estimate{Arrivals: 3, Service: 13}, Concurrency: 8, TargetWait: 10 * time.Millisecond}
	random := Demand(in)
	in.Traffic.Dispersion = 1
	if n := Demand(in); n != random || n.Batched != 0 {
		t.Errorf("dispersion 1: %+v, want %+v, as for an unknown dispersion", n, random)
	}
	in.Traffic.Dispersion = 9
	n := Demand(in)
	want := BatchSlots(9, random.Serving*8, 13, 0.01) / 8
	if math.Abs(n.Batched-want) > 1e-12 || math.Abs(n.Serving-random.Serving-want) > 1e-12 || n.Replicas != n.Serving+n.Draining {
		t.Errorf("batches of about 9: %+v, want Erlang's %g plus %g", n, random.Serving, want)
	}
	in.TargetWait = 2 * time.Second
	if n := Demand(in); n.Batched != 0 {
		t.Errorf("targetWait 2s: batched %g, want 0: the slots start 6 items within it, the 4 batch-mates ahead included", n.Batched)
	}
}

// TestBatchedFadesWithTheTraffic: a queue whose traffic has faded expects no batch:
// the slots for batch-mates are at most the items expected over the horizon, not the
// (d − 1)/2 of its last dispersion.
func TestBatchedFadesWithTheTraffic(t *testing.T) {
	in := Inputs{Traffic: Estimate{Arrivals: 1e-4, Service: 10, Dispersion: 41}, Concurrency: 1, TargetWait: 10 * time.Millisecond, InFlight: 3}
	if n := Demand(in); n.Batched > 1e-4*60+1e-12 {
		t.Errorf("batched %g for 1e-4 arrivals a second, want at most the %g expected over the minute", n.Batched, 1e-4*60)
	}
}

// TestRiseByHand: the two averages' noise for 10 arrivals a second at random is
// √(10·(1/120 + 1/360 − 2/240)) = 1/6 a second, 1/720 a second per second over the two
// minutes between their windows. A rise of 0.01 a second per second less twice that,
// over the minute the average lags and the horizon's minute: (0.01 − 1/360)·120 = 0.8667.
// Batches of 9 triple the noise; a cold start of 90 s makes the horizon 105 s; a rise
// within the noise, or a fall, counts as none.
func TestRiseByHand(t *testing.T) {
	for _, tc := range []struct {
		name    string
		e       Estimate
		horizon time.Duration
		want    float64
	}{
		{"random", Estimate{Arrivals: 10, Trend: 0.01}, time.Minute, (0.01 - 1.0/360) * 120},
		{"batches of 9", Estimate{Arrivals: 10, Trend: 0.01, Dispersion: 9}, time.Minute, (0.01 - 3.0/360) * 120},
		{"a 90 s cold start", Estimate{Arrivals: 10, Trend: 0.01}, Horizon(90 * time.Second), (0.01 - 1.0/360) * 165},
		{"within the noise", Estimate{Arrivals: 10, Trend: 0.0027}, time.Minute, 0},
		{"a fall", Estimate{Arrivals: 10, Trend: -0.05}, time.Minute, 0},
		{"no arrivals", Estimate{Trend: 0.05}, time.Minute, 0},
		{"not a number", Estimate{Arrivals: 10, Trend: math.NaN()}, time.Minute, 0},
	} {
		if got := Rise(tc.e, tc.horizon); math.Abs(got-tc.want) > 1e-9 {
			t.Errorf("%s: Rise = %g, want %g", tc.name, got, tc.want)
		}
	}
}

// TestDemandRising: the metric of a rising queue is the metric of the rate it rises to,
// Need.Rise more arrivals a second, for the serving slots and the cap alike.
func TestDemandRising(t *testing.T) {
	in := Inputs{Traffic: Estimate{Arrivals: 10, Service: 4, Trend: 0.01}, Concurrency: 4, TargetWait: 2 * time.Second, Waiting: 5, InFlight: 30}
	n := Demand(in)
	flat := in
	flat.Traffic = Estimate{Arrivals: 10 + n.Rise, Service: 4}
	if want := Demand(flat); n.Rise == 0 || n.Serving != want.Serving || n.Most != want.Most || n.Replicas != want.Replicas {
		t.Errorf("rising: %+v, want the need of %g a second, %+v", n, 10+n.Rise, want)
	}
}

// TestRiseReadsNoiseAsNone: a steady rate's noise seldom passes for a rise, and a real
// rise is followed. Arrivals at random, 20 a second (or 2 a second in batches of 10),
// counted in report intervals of a second for an hour: the rise the metric adds is 0 in
// most of the readings after the first ten minutes and under a twentieth of the rate
// in all but a few. Then 20 a second rising by 0.05 a second per second: after ten
// minutes of it the rate with the rise is within 15% of the rate two minutes on (the
// lag and the horizon), where the minute's average alone is 10% short.
func TestRiseReadsNoiseAsNone(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	for _, tc := range []struct {
		name         string
		batches      float64
		batch        int
		measureBatch bool
	}{{"at random", 20, 1, false}, {"in batches of 10", 2, 10, true}} {
		var e Estimate
		var readings, rising, large int
		for i := range 3600 {
			n := arrivalsIn(r, tc.batches, 1, tc.batch)
			e = e.Fold(Interval{Length: time.Second, Arrivals: n}).MeasureDispersion(time.Second, n)
			if i < 600 {
				continue
			}
			readings++
			rise := Rise(e, time.Minute)
			if rise > 0 {
				rising++
			}
			if rise > 1 {
				large++
			}
		}
		if rising*10 > readings || large*100 > readings {
			t.Errorf("%s: %d of %d readings rising, %d by more than 1 a second; want under a tenth and a hundredth", tc.name, rising, readings, large)
		}
	}
	var e Estimate
	for i := range 1200 {
		rate := 20.0
		if i >= 600 {
			rate += 0.05 * float64(i-600)
		}
		e = e.Fold(Interval{Length: time.Second, Arrivals: arrivalsIn(r, rate, 1, 1)})
	}
	ahead := 20 + 0.05*(1200+120-600)
	if got := e.Arrivals + Rise(e, time.Minute); math.Abs(got/ahead-1) > 0.15 || e.Arrivals/ahead > 0.9 {
		t.Errorf("rising: %g a second with the rise, %g without, want about %g", got, e.Arrivals, ahead)
	}
}

// TestServedLevel: the arrivals' level is served where it is known, below the minute's
// rate and no rise shows; otherwise the minute's rate is, a fall included, and a rise
// beyond its noise, which the minute's rate lags least, with the rise on top.
func TestServedLevel(t *testing.T) {
	demandFor := func(e Estimate) Need {
		return Demand(Inputs{Traffic: e, Concurrency: 2, TargetWait: 10 * time.Second})
	}
	e := Estimate{Arrivals: 4, Service: 10, Level: 3, LevelWindow: 240}
	if rate := Served(e); rate != 3 {
		t.Errorf("Served = %g, want the level 3", rate)
	}
	n, want := demandFor(e), demandFor(Estimate{Arrivals: 3, Service: 10})
	if !n.Level || n.Rate != 3 || n.Serving != want.Serving || n.Most != want.Most {
		t.Errorf("demand %+v, want the level served: %+v", n, want)
	}
	for name, e := range map[string]Estimate{
		"a level above the rate": {Arrivals: 4, Service: 10, Level: 5, LevelWindow: 240},
		"an unknown level":       {Arrivals: 4, Service: 10},
		"a trend within noise":   {Arrivals: 4, Service: 10, Trend: 0.001, Dispersion: 1},
	} {
		n, want := demandFor(e), demandFor(Estimate{Arrivals: 4, Service: 10})
		if n.Level || n.Rate != 4 || n.Serving != want.Serving {
			t.Errorf("%s: demand %+v, want the minute's rate served: %+v", name, n, want)
		}
	}
	// Within its noise a trend leaves the level served; beyond it, the minute's rate
	// with the rise over a minute and the horizon.
	e.Trend, e.Dispersion = 0.001, 1
	if rate := Served(e); rate != 3 {
		t.Errorf("Served with a trend within its noise = %g, want the level 3", rate)
	}
	e.Trend = 0.1
	noise := math.Sqrt(4*trendNoise) / 120
	rise := (0.1 - 2*noise) * 120
	if rate, n := Served(e), demandFor(e); rate != 4 || n.Level || math.Abs(n.Rise-rise) > 1e-9 || math.Abs(n.Rate-(4+rise)) > 1e-9 {
		t.Errorf("rising: Served %g, demand %+v; want the minute's 4 and a rise of %g", rate, n, rise)
	}
}

// TestMissedWaitGoesPastTheTolerance: on a rise the metric settles within the HPA's
// tolerance of the replicas serving, with a queue standing. Nine replicas of 8 slots,
// all busy (72 in flight), 100 waiting, 5.4 arrivals a second of 13 s each (a load of
// 70 slots), targetWait 18 s: the metric asks for about 9.2 replicas, within 10% of
// nine, so the HPA does nothing (backwards Azure at half speed, seed 3, 31 minutes in:
// docs/replay.md). Once the oldest item has waited 18 s it asks for 9.91: the HPA adds a
// replica. Not before, not while the metric asks for no more than those serving, not
// while none waits, and never more than Most.
func TestMissedWaitGoesPastTheTolerance(t *testing.T) {
	in := Inputs{Traffic: Estimate{Arrivals: 5.4, Service: 13}, Concurrency: 8, TargetWait: 18 * time.Second, Waiting: 100, InFlight: 72, Tolerance: HPATolerance}
	base := Demand(in)
	if base.Replicas <= 9 || base.Replicas > 9*(1+HPATolerance) {
		t.Fatalf("the case wants a metric within the tolerance above nine: %+v", base)
	}
	for _, tc := range []struct {
		name   string
		change func(*Inputs)
		missed bool
	}{
		{"the oldest has waited less than targetWait", func(in *Inputs) { in.OldestWait = 17 * time.Second }, false},
		{"the oldest has waited targetWait", func(in *Inputs) { in.OldestWait = 18 * time.Second }, true},
		{"longer", func(in *Inputs) { in.OldestWait = time.Minute }, true},
		{"the metric asks for no more than those serving", func(in *Inputs) { in.OldestWait, in.InFlight = time.Minute, 80 }, false},
		{"none waits", func(in *Inputs) { in.OldestWait, in.Waiting = time.Minute, 0 }, false},
		{"none in flight", func(in *Inputs) { in.OldestWait, in.InFlight = time.Minute, 0 }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := in
			tc.change(&c)
			n, plain := Demand(c), c
			plain.OldestWait = 0
			want := Demand(plain)
			if !tc.missed {
				if n != want {
					t.Errorf("got %+v, want the metric as it is, %+v", n, want)
				}
				return
			}
			serving := c.InFlight / float64(c.Concurrency)
			if !n.Missed || n.Replicas/serving <= 1+HPATolerance || n.Replicas > serving*(1+HPATolerance)+0.02 {
				t.Errorf("got %g (missed %v): want just past the tolerance of %g replicas, so the HPA adds one", n.Replicas, n.Missed, serving)
			}
			if n.Serving != want.Serving || n.Draining != want.Draining || n.Most != want.Most {
				t.Errorf("the parts moved: %+v, want %+v", n, want)
			}
		})
	}
	// Fifty replicas busy, one item waiting and 30 expected over the horizon: past the
	// tolerance (55 replicas) is more than a slot for each item in flight, waiting or
	// expected (53.9), which caps the metric, raised or not.
	few := Inputs{Traffic: Estimate{Arrivals: 0.5, Service: 1000}, Concurrency: 8, TargetWait: 5 * time.Second, Waiting: 1, InFlight: 400, OldestWait: time.Minute, Tolerance: HPATolerance}
	if n := Demand(few); n.Serving+n.Draining <= 50 || n.Missed || n.Replicas != n.Most || n.Most >= 55 {
		t.Errorf("capped: %+v", n)
	}
	// The metric, 9.21, is within 20% and 5% of nine replicas, which an HPA tolerating
	// that much leaves as they are: it goes past each. An HPA that tolerates none adds a
	// replica at any metric above nine: the metric is left as it is.
	for _, tc := range []struct {
		tolerance, want float64
		missed          bool
	}{{0.2, 9*1.2 + pastTolerance, true}, {0.05, 9*1.05 + pastTolerance, true}, {0, 0, false}} {
		c := in
		c.OldestWait, c.Tolerance = time.Minute, tc.tolerance
		n := Demand(c)
		if tc.missed && (!n.Missed || math.Abs(n.Replicas-tc.want) > 1e-9) {
			t.Errorf("tolerance %g: got %g (missed %v), want %g", tc.tolerance, n.Replicas, n.Missed, tc.want)
		}
		if !tc.missed && (n.Missed || n.Replicas != base.Replicas) {
			t.Errorf("tolerance %g: got %g (missed %v), want the metric as it is, %g, already past the tolerance", tc.tolerance, n.Replicas, n.Missed, base.Replicas)
		}
	}
}
