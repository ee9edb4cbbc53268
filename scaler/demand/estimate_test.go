package demand

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	gpuscalerv1 "github.com/gpuscaler/gpuscaler/proto/gpuscaler/v1"
)

// TestFoldLeavesDropsOut: two arrivals a second, one of them dropped, and ten items
// always in flight: one completes a second, in ten seconds. The drops have a rate of
// their own, and do not shorten the service time.
func TestFoldLeavesDropsOut(t *testing.T) {
	var e Estimate
	for range 120 {
		e = e.Fold(Interval{Length: time.Second, Arrivals: 2, Completions: 1, Dropped: 1, Busy: 10})
	}
	if math.Abs(e.Service-10) > 1e-9 {
		t.Errorf("service time = %g s, want 10", e.Service)
	}
	if want := -math.Expm1(-120.0 / 60); math.Abs(e.Dropped-want) > 1e-9 || math.Abs(e.Arrivals-2*want) > 1e-9 {
		t.Errorf("rates: %g arrivals, %g drops a second; want %g, %g", e.Arrivals, e.Dropped, 2*want, want)
	}
}

// TestFoldKeepsServiceWhileIdle: the service time is a property of the work; an idle
// minute leaves it as it was, while the rates fall.
func TestFoldKeepsServiceWhileIdle(t *testing.T) {
	e := Estimate{}.Fold(Interval{Length: time.Second, Arrivals: 4, Completions: 4, Busy: 8})
	for range 60 {
		e = e.Fold(Interval{Length: time.Second})
	}
	if e.Service != 2 {
		t.Errorf("service time after an idle minute = %g s, want 2", e.Service)
	}
	if e.Arrivals >= 4*-math.Expm1(-1.0/60) {
		t.Errorf("arrival rate after an idle minute = %g, want it fallen", e.Arrivals)
	}
}

// TestNextIsFoldOfDifferences: the fallback folds what two consecutive reports imply
// (completions from the backlog, busy seconds by the trapezoid), through the same
// Fold a measuring producer runs.
func TestNextIsFoldOfDifferences(t *testing.T) {
	prev := &gpuscalerv1.QueueReport{ProducerId: "p", Sequence: 1, Waiting: 6, InFlight: 4}
	r := &gpuscalerv1.QueueReport{ProducerId: "p", Sequence: 2, Waiting: 3, InFlight: 2, Arrivals: 5, Dropped: 1}
	// Left the backlog: 10 + 5 − 5 − 1 dropped = 9 completions; in flight (4+2)/2 for 2 s.
	got := Estimate{}.Next(prev, r, 2*time.Second)
	want := Estimate{}.Fold(Interval{Length: 2 * time.Second, Arrivals: 5, Completions: 9, Dropped: 1, Busy: 6})
	if got != want {
		t.Errorf("Next = %+v, want %+v", got, want)
	}
}

// TestTrafficRoundTrip: what a measuring producer reports (Traffic) is what the scaler
// reads back (FromTraffic): the rates and the service time, as they are.
func TestTrafficRoundTrip(t *testing.T) {
	var e Estimate
	totals, prev := Totals{}, Totals{}
	for i := range 90 {
		prev, totals = totals, Totals{Arrivals: totals.Arrivals + 3, Completions: totals.Completions + 2, Dropped: totals.Dropped + 1, Busy: totals.Busy + 8}
		if i == 80 {
			totals.Arrivals += 50 // a burst
		}
		iv := totals.Since(prev, time.Second)
		e = e.Fold(iv).MeasureDispersion(time.Second, iv.Arrivals)
	}
	var tr gpuscalerv1.QueueTraffic
	e.Traffic(totals, &tr)
	if tr.GetArrivalsTotal() != totals.Arrivals || tr.GetCompletionsTotal() != 180 || tr.GetDroppedTotal() != 90 || tr.GetBusySecondsTotal() != 720 {
		t.Errorf("totals %v, want %+v", &tr, totals)
	}
	got := FromTraffic(&tr)
	if got.Arrivals != e.Arrivals || got.Completions != e.Completions || got.Dropped != e.Dropped || got.Service != e.Service ||
		got.Dispersion != e.Dispersion || e.Dispersion == 0 || got.Trend != e.Trend || e.Trend == 0 {
		t.Errorf("FromTraffic(Traffic(e)) = %+v, want the rates, service time, dispersion and trend of %+v", got, e)
	}
	if math.Abs(got.Service-4) > 1e-9 {
		t.Errorf("service time = %g s, want 8 busy seconds over 2 completions a second, 4", got.Service)
	}
}

// TestTrafficStaysValid: figures beyond what a report may carry are reported at the
// bounds, so a producer's report is never dropped as invalid.
func TestTrafficStaysValid(t *testing.T) {
	var tr gpuscalerv1.QueueTraffic
	Estimate{Arrivals: 1e300, Completions: math.Inf(1), Dropped: -1, Service: 1e20, Dispersion: math.Inf(1)}.Traffic(Totals{Busy: -3}, &tr)
	r := &gpuscalerv1.QueueReport{Namespace: "ml", Queue: "q", ProducerId: "p", Traffic: &tr}
	if err := r.Validate(); err != nil {
		t.Fatalf("Traffic made an invalid report: %v", err)
	}
	Estimate{Dispersion: math.NaN(), Trend: math.NaN()}.Traffic(Totals{}, &tr)
	if err := r.Validate(); err != nil || tr.GetArrivalDispersion() != 0 || tr.GetArrivalTrend() != 0 {
		t.Fatalf("a dispersion and trend that are not numbers: reported %g, %g (%v), want 0", tr.GetArrivalDispersion(), tr.GetArrivalTrend(), err)
	}
	for _, trend := range []float64{math.Inf(1), math.Inf(-1), -1e300} {
		Estimate{Trend: trend}.Traffic(Totals{}, &tr)
		if err := r.Validate(); err != nil || math.Abs(tr.GetArrivalTrend()) != gpuscalerv1.MaxTrafficRate {
			t.Fatalf("a trend of %g: reported %g (%v), want ±%g", trend, tr.GetArrivalTrend(), err, float64(gpuscalerv1.MaxTrafficRate))
		}
	}
}

// TestAddMeasuredProducers: two producers' reported figures add by Little's law, each
// weighed by its reported completions: 3 a second of 2 s and 1 a second of 10 s are 4 a
// second of 4 s.
func TestAddMeasuredProducers(t *testing.T) {
	a := FromTraffic(&gpuscalerv1.QueueTraffic{ArrivalRate: 3, CompletionRate: 3, ServiceSeconds: 2})
	b := FromTraffic(&gpuscalerv1.QueueTraffic{ArrivalRate: 2, CompletionRate: 1, DropRate: 1, ServiceSeconds: 10})
	s := a.Add(b)
	if s.Arrivals != 5 || math.Abs(s.Service-4) > 1e-9 || s.Dropped != 1 {
		t.Errorf("sum = %+v, want 5 arrivals a second, 1 dropped, 4 s each", s)
	}
	// An idle producer that knows its service time leaves the other's alone.
	idle := FromTraffic(&gpuscalerv1.QueueTraffic{ServiceSeconds: 60})
	if s := a.Add(idle); s.Service != 2 {
		t.Errorf("with an idle producer: service %g s, want 2", s.Service)
	}
	// One that has seen nothing finish yet adds its arrivals, not its unknown service.
	fresh := FromTraffic(&gpuscalerv1.QueueTraffic{ArrivalRate: 7})
	if s := a.Add(fresh); s.Service != 2 || s.Arrivals != 10 {
		t.Errorf("with a producer that has seen nothing finish: %g arrivals a second of %g s, want 10 of 2", s.Arrivals, s.Service)
	}
}

// FuzzFold folds any intervals and reads the estimate back through a report: it stays
// finite and not negative, the report valid, and the metric a finite number of replicas,
// the dispersion and the slots for batch-mates included.
func FuzzFold(f *testing.F) {
	f.Add(int64(time.Second), 2.0, 1.0, 1.0, 10.0, uint16(30))
	f.Add(int64(8*time.Second), 30.0, 1.0, 0.0, 10.0, uint16(0))
	f.Add(int64(0), 0.0, 0.0, 0.0, 0.0, uint16(1))
	f.Add(int64(-5), math.MaxFloat64, math.MaxFloat64, math.NaN(), math.Inf(1), uint16(65535))
	f.Fuzz(func(t *testing.T, length int64, arrivals, completions, dropped, busy float64, waitSeconds uint16) {
		var e Estimate
		for i := range 64 {
			// Lengths from length down to length/128, and every third interval
			// without arrivals, so the dispersion is folded too.
			l, n := time.Duration(length>>(i%8)), arrivals*float64(i%3)
			e = e.Fold(Interval{Length: l, Arrivals: n, Completions: completions, Dropped: dropped, Busy: busy}).MeasureDispersion(l, n)
		}
		var tr gpuscalerv1.QueueTraffic
		e.Traffic(Totals{}, &tr)
		if err := (&gpuscalerv1.QueueReport{Namespace: "ml", Queue: "q", ProducerId: "p", Traffic: &tr}).Validate(); err != nil {
			t.Fatalf("Traffic of %+v: %v", e, err)
		}
		// As the scaler reads it from the stream; and, where the intervals are what a
		// producer counts (finite, not negative), as the producer holds it, unbounded.
		read := []Estimate{FromTraffic(&tr).Add(FromTraffic(&tr))}
		if counts := []float64{arrivals, completions, dropped, busy}; !slices.ContainsFunc(counts, func(x float64) bool { return !(x >= 0 && x <= math.MaxFloat64) }) {
			read = append(read, e)
		}
		for _, wait := range []time.Duration{10 * time.Millisecond, time.Duration(waitSeconds%3600+1) * time.Second} {
			for _, traffic := range read {
				v := Replicas(Inputs{Traffic: traffic, Concurrency: 2, TargetWait: wait, Waiting: 3})
				if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
					t.Fatalf("Replicas = %g at targetWait %s from %+v", v, wait, traffic)
				}
			}
		}
	})
}

// TestAddKeepsEachServiceTime: a producer that does not measure keeps its service time
// while its completions fade with items still in flight; a second, idle producer joining
// the queue must not turn the first's 600 s into its in flight over its completions
// (1,631 s here), as summing the two did.
func TestAddKeepsEachServiceTime(t *testing.T) {
	busy := Estimate{Arrivals: 0.01, Completions: 0.001, InFlight: 1.631, Service: 600}
	if s := busy.Add(Estimate{}); s.Service != 600 {
		t.Errorf("with an idle producer: service %g s, want 600", s.Service)
	}
	// Two that complete: weighed by their completions, 1 a second of 2 s and 3 of 6 s.
	a, b := Estimate{Completions: 1, InFlight: 2, Service: 2}, Estimate{Completions: 3, InFlight: 18, Service: 6}
	if s := a.Add(b); math.Abs(s.Service-5) > 1e-12 {
		t.Errorf("service %g s, want (1·2 + 3·6)/4 = 5", s.Service)
	}
}

// arrivalsIn counts the arrivals of a Poisson process of rate batches a second, each
// batch batch items, in an interval secs long.
func arrivalsIn(r *rand.Rand, rate, secs float64, batch int) float64 {
	n := 0
	for x := r.ExpFloat64() / rate; x < secs; x += r.ExpFloat64() / rate {
		n += batch
	}
	return float64(n)
}

// measured is e with an interval of secs seconds that counted n arrivals folded in as a
// measuring producer folds it: its rates and its dispersion.
func measured(e Estimate, secs, n float64) Estimate {
	length := time.Duration(secs * float64(time.Second))
	return e.Fold(Interval{Length: length, Arrivals: n}).MeasureDispersion(length, n)
}

// TestDispersion: the index of dispersion, measured over report intervals of a second,
// or of any length from 0.1 s to 3 s (each change of rate is weighed by the two
// intervals' lengths), is 1 for items arriving at random and the batch, 10, for batches
// of 10 arriving at random; it is unknown (0) for the first minute.
func TestDispersion(t *testing.T) {
	for _, tc := range []struct {
		name         string
		rate         float64 // batches a second
		batch        int
		randomLength bool
		want         float64
	}{
		{"at random, 1 s intervals", 3, 1, false, 1},
		{"at random, intervals of 0.1-3 s", 3, 1, true, 1},
		{"at random, 1000 a second", 1000, 1, false, 1},
		{"batches of 10, 1 s intervals", 0.3, 10, false, 10},
		{"batches of 10, intervals of 0.1-3 s", 0.3, 10, true, 10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := rand.New(rand.NewPCG(1, 2))
			var e Estimate
			for elapsed := 0.0; elapsed < 3600; {
				secs := 1.0
				if tc.randomLength {
					secs = 0.1 + 2.9*r.Float64()
				}
				e = measured(e, secs, arrivalsIn(r, tc.rate, secs, tc.batch))
				elapsed += secs
				if elapsed < 55 && e.Dispersion != 0 {
					t.Fatalf("dispersion %g after %.0f s, want 0 (unknown) for the first minute", e.Dispersion, elapsed)
				}
			}
			if math.Abs(e.Dispersion-tc.want) > 0.15*tc.want {
				t.Errorf("dispersion = %.3g, want %g within 15%%", e.Dispersion, tc.want)
			}
		})
	}
}

// TestDispersionFollowsTheRate: items arriving at random at a rate that ramps, steps,
// stops and starts again after an idle hour are the arrival rate's to follow, not
// dispersion, at 10 or 1,000 a second. Read as deviations from the minute's rate, which
// lags a change, a start after idle read 854 at 1,000 a second (a review's figures), a
// halving 12.5; a change now weighs in as one pair of intervals. Nor does a first
// report of one arrival in no time at all (a Reporter woken at once by its first item),
// which once made the rate 500 a second and the dispersion 26,000.
func TestDispersionFollowsTheRate(t *testing.T) {
	for _, scale := range []float64{10, 1000} {
		r := rand.New(rand.NewPCG(3, 4))
		e := measured(Estimate{}, 0, 1)
		rate := func(i int) float64 {
			switch {
			case i < 600: // a ramp up
				return 0.1 + 0.9*float64(i)/600
			case i < 900:
				return 1
			case i < 1200: // a step down to half
				return 0.5
			case i < 1500: // a stop
				return 0
			case i < 1501: // an idle hour, in one interval
				return -1
			default: // a start after it
				return 1
			}
		}
		for i := range 2400 {
			switch rt := rate(i); {
			case rt < 0:
				e = measured(e, 3600, 0)
			default:
				e = measured(e, 1, arrivalsIn(r, scale*rt, 1, 1))
			}
			// A change weighs in once, by its square over twice the rate and the
			// window: 1,000 a second stopping reads 1.5 for as long as it is idle.
			if i > 60 && e.Dispersion > 2 {
				t.Fatalf("%g a second at most, second %d (rate %g): dispersion %.3g, want about 1", scale, i, scale*max(rate(i), 0), e.Dispersion)
			}
		}
		if e.Dispersion < 0.8 {
			t.Errorf("%g a second at most: dispersion %.3g at the end, want about 1", scale, e.Dispersion)
		}
	}
}

// TestAddDispersion: the variances of producers' arrivals add, so their dispersions
// weigh in by their arrival rates; one that does not know its own adds nothing to the
// others', in whatever order the sum is taken (a queue's producers are summed in a
// map's order). A sum that weighed the unknown one's rate in once it had been added to
// a known one read 6.33 for the three below in one order and 3 in another.
func TestAddDispersion(t *testing.T) {
	unknown := FromTraffic(&gpuscalerv1.QueueTraffic{ArrivalRate: 5})
	bursty := FromTraffic(&gpuscalerv1.QueueTraffic{ArrivalRate: 1, ArrivalDispersion: 9})
	random := FromTraffic(&gpuscalerv1.QueueTraffic{ArrivalRate: 3, ArrivalDispersion: 1})
	for _, order := range [][]Estimate{
		{unknown, bursty, random}, {unknown, random, bursty}, {bursty, unknown, random},
		{bursty, random, unknown}, {random, unknown, bursty}, {random, bursty, unknown},
	} {
		var s Estimate
		for _, x := range order {
			s = s.Add(x)
		}
		if math.Abs(s.Dispersion-3) > 1e-12 || s.Arrivals != 9 {
			t.Errorf("dispersion %g, arrivals %g; want (1·9 + 3·1)/4 = 3, 9", s.Dispersion, s.Arrivals)
		}
	}
	if s := bursty.Add(unknown); s.Dispersion != 9 {
		t.Errorf("with a producer that does not know its dispersion: %g, want 9", s.Dispersion)
	}
	idle := FromTraffic(&gpuscalerv1.QueueTraffic{ArrivalDispersion: 4})
	if s := idle.Add(Estimate{}); s.Dispersion != 4 {
		t.Errorf("an idle producer's dispersion alone: %g, want 4", s.Dispersion)
	}
}

// TestDispersionOnlyMeasured: the scaler's estimate of a producer that does not
// measure (Next) has no dispersion: the scaler times its reports as it stores them,
// and their jitter, or a lost report's arrivals counted in the next, would read as
// dispersion.
func TestDispersionOnlyMeasured(t *testing.T) {
	var e Estimate
	var prev *gpuscalerv1.QueueReport
	for seq := uint64(1); seq <= 300; seq++ {
		r := &gpuscalerv1.QueueReport{ProducerId: "p", Sequence: seq, Arrivals: 10 * (seq % 3)}
		e = e.Next(prev, r, time.Second)
		prev = r
	}
	if e.Dispersion != 0 || e.Arrivals == 0 {
		t.Errorf("a producer that does not measure: dispersion %g (arrivals %g a second), want unknown", e.Dispersion, e.Arrivals)
	}
}

// rampFolded folds the first secs seconds of arrivals at rate(t) a second into e,
// interval by interval, counting each interval's expected arrivals (no noise).
func rampFolded(e Estimate, from, secs float64, rate func(t float64) float64) Estimate {
	for t := from; t < from+secs; t++ {
		e = e.Fold(Interval{Length: time.Second, Arrivals: rate(t + 0.5)})
	}
	return e
}

// TestTrend: the rate's rise a second, from the difference between its averages over a
// minute and over three. A constant rate shows none from the first interval on (each
// average is corrected for having started from 0); a steady rise of 0.01 a second reads
// 0.01 once both averages have settled; a fall reads negative; a start after an idle
// hour reads as a rise. Unknown (0) for the first minute.
func TestTrend(t *testing.T) {
	steady := func(float64) float64 { return 5 }
	if e := rampFolded(Estimate{}, 0, 59, steady); e.Trend != 0 {
		t.Errorf("trend after 59 s = %g, want 0: unknown for a minute", e.Trend)
	}
	for _, secs := range []float64{60, 180, 600} {
		if e := rampFolded(Estimate{}, 0, secs, steady); math.Abs(e.Trend) > 1e-9 {
			t.Errorf("trend of a constant rate after %g s = %g, want 0", secs, e.Trend)
		}
	}
	ramp := func(t float64) float64 { return 2 + 0.01*t }
	if e := rampFolded(Estimate{}, 0, 1200, ramp); math.Abs(e.Trend-0.01) > 0.0002 {
		t.Errorf("trend of a rate rising 0.01 a second, after 20 minutes = %g, want 0.01", e.Trend)
	}
	e := rampFolded(Estimate{}, 0, 600, func(float64) float64 { return 10 })
	if e = rampFolded(e, 600, 60, func(float64) float64 { return 2 }); !(e.Trend < -0.02) {
		t.Errorf("trend a minute after a fall from 10 to 2 a second = %g, want below -0.02", e.Trend)
	}
	e = rampFolded(e, 660, 3600, func(float64) float64 { return 0 })
	if math.Abs(e.Trend) > 1e-3 {
		t.Errorf("trend after an idle hour = %g, want about 0", e.Trend)
	}
	if e = rampFolded(e, 4260, 60, steady); !(e.Trend > 0.01) {
		t.Errorf("trend a minute into 5 a second after an idle hour = %g, want a rise", e.Trend)
	}
}

// TestAddTrend: the trends of a queue's producers add, as their rates do.
func TestAddTrend(t *testing.T) {
	a := rampFolded(Estimate{}, 0, 1800, func(t float64) float64 { return 1 + 0.01*t })
	b := rampFolded(Estimate{}, 0, 1800, func(t float64) float64 { return 20 - 0.005*t })
	if got, want := a.Add(b).Trend, a.Trend+b.Trend; got != want || math.Abs(want-0.005) > 0.0002 {
		t.Errorf("trend of the sum = %g, want %g, about 0.005", got, want)
	}
}

// TestLevelWindowByHand: the window from the changes of the minute's count one and four
// minutes apart. Noise alone (both alike, or four apart less than one): the level does
// not move, and is averaged over the longest window. Drift alone (four apart four times
// one): it moves as fast as the counts, a minute. Drift and noise alike (q = 1: 3 and
// 6): K = (√5 − 1)/2. A twentieth as much drift as noise (2.05 and 2.2): K = 0.2, an
// average over −1 min/ln 0.8, 269 s. No change at all says nothing: a minute.
func TestLevelWindowByHand(t *testing.T) {
	secs := func(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }
	for _, tc := range []struct {
		v1, v4 float64
		want   time.Duration
	}{
		{2, 2, MaxLevelWindow},
		{1, 0.5, MaxLevelWindow},
		{1, 4, Window},
		{3, 6, secs(-60 / math.Log(1-(math.Sqrt(5)-1)/2))},
		{2.05, 2.2, secs(-60 / math.Log(0.8))},
		{0, 0, Window},
	} {
		if got := levelWindow(tc.v1, tc.v4); (got - tc.want).Abs() > time.Millisecond {
			t.Errorf("levelWindow(%g, %g) = %v, want %v", tc.v1, tc.v4, got, tc.want)
		}
	}
}

// TestLevel: measured as a producer folds its report intervals, items arriving at
// random at a steady 5 a second, or in batches of 10 at a steady 0.5 a second, are
// averaged over longer than the minute, on average over an hour, at random over at
// least two (the drift measured over thirty minute counts is noisy itself, and now and
// then reads as some), their level 5 within its noise; a level that moves every minute
// by more than the counts' noise (a random walk of 2 a second a minute about 20) keeps
// the minute. Both are unknown for the first ten minutes of counts, and a report
// carries them.
func TestLevel(t *testing.T) {
	for _, batch := range []int{1, 10} {
		r := rand.New(rand.NewPCG(5, uint64(batch)))
		var e Estimate
		for range 599 {
			e = measured(e, 1, arrivalsIn(r, 5/float64(batch), 1, batch))
		}
		if e.LevelWindow != 0 || e.Level != 0 {
			t.Errorf("batches of %d: level %g over %g s after 599 s, want unknown (0)", batch, e.Level, e.LevelWindow)
		}
		var windows, levels float64
		for range 3600 {
			e = measured(e, 1, arrivalsIn(r, 5/float64(batch), 1, batch))
			windows += e.LevelWindow / 3600
			levels += e.Level / 3600
		}
		// Batches of ten make the minute's count ten times as noisy, and the drift
		// measured from it too: their window is longer than a minute, but less so.
		least := map[int]float64{1: 120, 10: 80}[batch]
		if windows < least || math.Abs(levels-5) > 0.4 {
			t.Errorf("batches of %d at a steady 5 a second: level %g over %g s on average over an hour, want 5 over at least %g s", batch, levels, windows, least)
		}
		var tr gpuscalerv1.QueueTraffic
		e.Traffic(Totals{}, &tr)
		if got := FromTraffic(&tr); got.Level != e.Level || got.LevelWindow != e.LevelWindow {
			t.Errorf("FromTraffic(Traffic(e)): level %g over %g s, want %g over %g s", got.Level, got.LevelWindow, e.Level, e.LevelWindow)
		}
	}
	r := rand.New(rand.NewPCG(7, 8))
	var e Estimate
	rate, windows := 20.0, 0.0
	for m := range 70 {
		rate = max(1, rate+2*r.NormFloat64())
		for range 60 {
			e = measured(e, 1, arrivalsIn(r, rate, 1, 1))
			if m >= 10 {
				windows += e.LevelWindow / 3600
			}
		}
	}
	if windows > 90 || e.LevelWindow != Window.Seconds() || math.Abs(e.Level-e.Arrivals) > 1e-3*e.Arrivals {
		t.Errorf("a level moving every minute: level %g over %g s at the end, over %g s on average; want the minute's %g over about 60 s", e.Level, e.LevelWindow, windows, e.Arrivals)
	}
}

// TestAddLevel: the levels of a queue's producers add, one whose level is unknown
// adding its minute's rate; the window is their windows weighed by their rates (an
// unknown one's a minute); the level is unknown while every producer's is; and sums
// add in any order.
func TestAddLevel(t *testing.T) {
	a := Estimate{Arrivals: 4, Level: 3, LevelWindow: 300}
	b := Estimate{Arrivals: 1, Level: 2, LevelWindow: 60}
	u := Estimate{Arrivals: 2}
	for _, tc := range []struct {
		name          string
		sum           Estimate
		level, window float64
	}{
		{"two known", a.Add(b), 5, (4*300 + 60) / 5.0},
		{"and an unknown", a.Add(b).Add(u), 7, (4*300 + 60 + 2*60) / 7.0},
		{"in another order", u.Add(b).Add(a), 7, (4*300 + 60 + 2*60) / 7.0},
		{"two unknown", u.Add(u), 0, 0},
		{"idle", Estimate{LevelWindow: 120}.Add(Estimate{LevelWindow: 300}), 0, 300},
	} {
		if math.Abs(tc.sum.Level-tc.level) > 1e-9 || math.Abs(tc.sum.LevelWindow-tc.window) > 1e-9 {
			t.Errorf("%s: level %g over %g s, want %g over %g s", tc.name, tc.sum.Level, tc.sum.LevelWindow, tc.level, tc.window)
		}
	}
}
