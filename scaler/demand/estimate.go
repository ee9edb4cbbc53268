package demand

import (
	"math"
	"time"

	gpuscalerv1 "github.com/gpuscaler/gpuscaler/proto/gpuscaler/v1"
)

// Window is the time constant of a queue's demand estimates: each interval weighs in
// by 1 − e^(−Δ/Window), Δ being its length, so what happened a minute ago counts for
// about a third of what happens now. Long enough that one busy second is not read as the
// rate; a burst shows at once in the items waiting, which the metric drains.
const Window = time.Minute

// DispersionWindow is the time constant of a queue's dispersion (Estimate.Dispersion):
// how its items arrive, at random or in batches, is a property of their source, not of
// the traffic's level, so it is averaged over ten minutes, 600 report intervals of a
// second.
const DispersionWindow = 10 * time.Minute

// TrendWindow is the time constant of the slower of the two arrival rates whose
// difference is the rate's trend (Estimate.Trend): for a rate rising steadily, the
// estimate over Window lags it by Window's worth of rise and the one over TrendWindow by
// TrendWindow's, so their difference over TrendWindow − Window is the rise a second.
const TrendWindow = 3 * time.Minute

// MaxLevelWindow is the longest window the arrival level (Estimate.Level) is averaged
// over: the drift of the level is measured between minute counts at most four minutes
// apart, five minutes of counts, and the level is taken to be steady no further than
// that; beyond it a slow rise over the hour would lag unseen.
const MaxLevelWindow = 5 * time.Minute

// DriftWindow is the time constant of what the level's window is worked out from: how
// much the minute's count changes from one minute to the next and over four, averaged
// over thirty minute counts.
const DriftWindow = 30 * time.Minute

// driftLag is the longer of the two lags, in minute counts, the level's drift is
// measured over (the shorter is one).
const driftLag = 4

// maxDispersionInterval is the longest interval whose arrivals count in the dispersion:
// ten report intervals of the default second.
const maxDispersionInterval = 10 * time.Second

// Estimate is a queue's traffic, or one producer's share of it, folded in interval by
// interval (Fold). Where the producer measures (queue.Reporter does), it folds its own
// exact figures and publishes the result in every report (QueueTraffic), so every scaler
// replica, one started a second ago included, reads the same estimate from the stream
// (FromTraffic). For a producer that does not, the scaler folds what the differences
// between its reports tell (Next), and a replica that restarts starts that estimate
// from nothing.
type Estimate struct {
	// Arrivals and Completions are items per second; InFlight is the items being
	// worked on, averaged over time.
	Arrivals, Completions, InFlight float64
	// Dropped is the rate of items that left the queue unserved (timed out, cancelled,
	// refused), per second.
	Dropped float64
	// Service is how long an item takes, in seconds, by Little's law: inFlight /
	// completions. Zero until an item is seen to finish. It is kept while the queue is
	// idle: it is a property of the work, not of the traffic.
	Service float64
	// Dispersion is the index of dispersion of the arrivals over the intervals a
	// measuring producer counts them in (its report interval, a second by default): the
	// variance of an interval's arrivals over their mean, over DispersionWindow
	// (MeasureDispersion). It is 1 for items that arrive at random (a Poisson process)
	// and, for batches arriving at random, the mean batch an item arrives in
	// (E[X²]/E[X]). It depends on the interval: batches that come at regular times read
	// lower over intervals longer than their spacing. 0: unknown, as for a producer that
	// does not measure, or one that has measured for less than a minute.
	Dispersion float64
	// Trend is how fast the arrival rate rises (negative: falls), in items a second per
	// second: the difference between the arrivals over Window and over TrendWindow, each
	// corrected for the time it has folded in (so that a constant rate from the first
	// interval on shows no trend), over TrendWindow − Window. A queue that starts from
	// idle shows its start as a rise. 0 until a minute of intervals has been folded in.
	Trend float64
	// Level is the arrival rate averaged over LevelWindow seconds, a window the traffic
	// sets: the steady-state gain of a Kalman filter for a level that drifts under
	// noise (a local-level model), the drift and the noise worked out from the
	// variance of the change of the minute's count one minute and driftLag minutes
	// apart over DriftWindow (a level that drifts moves further over four minutes than
	// over one; noise moves both alike). Traffic whose level moves from one minute to
	// the next keeps Window; traffic that fluctuates about a steady level is averaged
	// over up to MaxLevelWindow. Both 0 until DispersionWindow of minute counts have
	// been folded in.
	Level, LevelWindow float64

	// What Dispersion is the ratio of, both over DispersionWindow: the squared change of
	// the rate from one interval to the next, weighed so that its mean is the dispersion
	// times the rate (spread), and the rate (level); the seconds folded in; and the last
	// interval's arrivals and length. For a sum of producers (Add), dispersed is the
	// arrival rate of those whose dispersion is known, and summed says it is one.
	spread, level, age, lastArrivals, lastSecs float64
	dispersed                                  float64
	summed                                     bool
	// The arrivals over TrendWindow, and the seconds folded into the rates (for the
	// correction Trend makes, the start of each estimate from 0).
	slow, folded float64
	// The level's average; the minute count in progress and its seconds; the last
	// driftLag minute counts' rates, newest first, and how many have been counted; the
	// squared change of the rate one and driftLag counts apart.
	levelAvg         averaged
	count, countSecs float64
	counts           [driftLag]float64
	minutes          int
	change1, change4 averaged
}

// Interval is what happened to a queue, or to a producer's share of it, over one
// interval: the figures Fold takes.
type Interval struct {
	// Length is the interval's length.
	Length time.Duration
	// Arrivals, Completions and Dropped are the items that arrived, finished after they
	// started, and left unstarted in it.
	Arrivals, Completions, Dropped float64
	// Busy is the item-seconds in flight over it: the integral of the items in flight
	// over time.
	Busy float64
}

// Fold returns e with interval iv folded in: every rate moves towards iv's by
// 1 − e^(−length/Window), and the service time
// is the busy item-seconds over the completions, both over Window, once iv saw an item
// finish. An interval shorter than a millisecond counts as one.
func (e Estimate) Fold(iv Interval) Estimate {
	secs := seconds(iv.Length)
	e = e.foldArrivals(secs, iv.Arrivals, iv.Dropped)
	alpha := share(secs, Window)
	e.Completions += alpha * (max(iv.Completions, 0)/secs - e.Completions)
	e.InFlight += alpha * (max(iv.Busy, 0)/secs - e.InFlight)
	if iv.Completions > 0 && e.Completions > 0 {
		e.Service = e.InFlight / e.Completions
	}
	return e
}

// seconds is an interval's length in seconds, one shorter than a millisecond counting
// as a millisecond: rates over it stay finite.
func seconds(d time.Duration) float64 { return max(d.Seconds(), 1e-3) }

// share is the weight secs seconds get in an exponentially weighted average with time
// constant window, 1 − e^(−secs/window): what an interval that long moves the average
// by, and what an average started from 0 holds of the rate after that long.
func share(secs float64, window time.Duration) float64 {
	return -math.Expm1(-secs / window.Seconds())
}

// foldArrivals folds arrivals and drops over secs seconds into e's rates, leaving
// completions and service alone.
func (e Estimate) foldArrivals(secs, arrivals, dropped float64) Estimate {
	alpha := share(secs, Window)
	rate := max(arrivals, 0) / secs
	e.Arrivals += alpha * (rate - e.Arrivals)
	e.Dropped += alpha * (max(dropped, 0)/secs - e.Dropped)
	e.slow += share(secs, TrendWindow) * (rate - e.slow)
	e.folded += secs
	if e.folded >= Window.Seconds() {
		// Each average started from 0 and holds share(folded, its window) of the rate so far.
		e.Trend = (e.Arrivals/share(e.folded, Window) - e.slow/share(e.folded, TrendWindow)) / (TrendWindow - Window).Seconds()
	}
	return e.foldLevel(secs, max(arrivals, 0))
}

// foldLevel folds arrivals over secs seconds into e's level: the rate moves the level by
// the share of its window (Window until the window is known), and each minute's count,
// once complete, into the changes the window is worked out from.
func (e Estimate) foldLevel(secs, arrivals float64) Estimate {
	window := Window
	if e.LevelWindow > 0 {
		window = time.Duration(e.LevelWindow * float64(time.Second))
	}
	e.levelAvg = e.levelAvg.fold(share(secs, window), arrivals/secs)
	e.count += arrivals
	e.countSecs += secs
	if e.countSecs >= Window.Seconds() {
		e = e.foldMinute()
	}
	if e.LevelWindow > 0 {
		e.Level = e.levelAvg.mean()
	}
	return e
}

// foldMinute folds the minute count just completed into the changes of the rate one
// and driftLag counts apart, and works out the level's window from them once
// DispersionWindow of counts are in.
func (e Estimate) foldMinute() Estimate {
	rate := e.count / e.countSecs
	b := share(e.countSecs, DriftWindow)
	if e.minutes >= 1 {
		d := rate - e.counts[0]
		e.change1 = e.change1.fold(b, d*d)
	}
	if e.minutes >= driftLag {
		d := rate - e.counts[driftLag-1]
		e.change4 = e.change4.fold(b, d*d)
	}
	copy(e.counts[1:], e.counts[:driftLag-1])
	e.counts[0] = rate
	e.minutes++
	e.count, e.countSecs = 0, 0
	if time.Duration(e.minutes)*Window >= DispersionWindow {
		e.LevelWindow = levelWindow(e.change1.mean(), e.change4.mean()).Seconds()
	}
	return e
}

// averaged is an exponentially weighted average started from nothing: what it holds,
// and the weight it has gathered, over which it is the average corrected for that
// start.
type averaged struct{ sum, weight float64 }

// fold moves a towards v by share.
func (a averaged) fold(share, v float64) averaged {
	a.sum += share * (v - a.sum)
	a.weight += share * (1 - a.weight)
	return a
}

// mean is a's average, corrected for its start from nothing.
func (a averaged) mean() float64 { return a.sum / a.weight }

// levelWindow returns the window to average the arrivals over, given the mean squared
// change of the minute's rate one minute apart, v1, and driftLag (k) minutes apart, vk.
// A level that drifts by w² a minute under noise n² moves the rate by k·w² + 2n² over k
// minutes, so w² = (vk − v1)/(k − 1) and n² = (v1 − w²)/2. The Kalman filter for that
// level, in its steady state, moves by K = (−q + √(q² + 4q))/2 of each minute's error,
// q = w²/n²: an average over −1 min/ln(1 − K), from Window (the level moves as fast as
// the counts) to MaxLevelWindow (it does not move).
func levelWindow(v1, vk float64) time.Duration {
	drift := max(0, (vk-v1)/(driftLag-1))
	noise := (v1 - drift) / 2
	if !(noise > 0) {
		return Window
	}
	q := drift / noise
	k := (-q + math.Sqrt(q*q+4*q)) / 2
	if !(k > 0) {
		return MaxLevelWindow
	}
	w := time.Duration(-Window.Seconds() / math.Log1p(-min(k, 1-1e-9)) * float64(time.Second))
	return min(max(w, Window), MaxLevelWindow)
}

// MeasureDispersion folds an interval length long that counted arrivals into e's
// dispersion; a measuring producer calls it for each of its report intervals (Measure
// does), which it times exactly. Of items arriving at rate λ with index of dispersion
// D, an interval ℓ long counts n arrivals whose rate n/ℓ has variance Dλ/ℓ, so the
// change of rate from one interval to the next, squared and divided by 1/ℓ + 1/ℓ', has
// mean Dλ whatever the lengths; D is its average over the average rate. A change of the
// rate itself, a rise, a fall, a start after an idle hour, weighs in once, as one
// pair of intervals, where a deviation from an average that lags it would weigh in
// for as long as the lag. Each pair weighs in by its shorter interval: a Reporter woken
// at once by an item reports an interval of no length with that one arrival in it,
// which says little. Intervals longer than maxDispersionInterval (a producer's gap)
// end a pair, as the rate moves over them. The dispersion is known once a minute of
// intervals has been folded.
func (e Estimate) MeasureDispersion(length time.Duration, arrivals float64) Estimate {
	secs, arrivals := seconds(length), max(arrivals, 0)
	if secs > maxDispersionInterval.Seconds() {
		e.lastSecs = 0
		return e
	}
	if e.lastSecs > 0 {
		beta := share(min(secs, e.lastSecs), DispersionWindow)
		change := arrivals/secs - e.lastArrivals/e.lastSecs
		e.spread += beta * (change*change/(1/secs+1/e.lastSecs) - e.spread)
		e.level += beta * (arrivals/secs - e.level)
		e.age += secs
		if e.age >= Window.Seconds() && e.level > 0 {
			e.Dispersion = e.spread / e.level
		}
	}
	e.lastArrivals, e.lastSecs = arrivals, secs
	return e
}

// Next folds report r, stored dt after prev (the producer's previous report, nil if
// none), into e: the estimate of a producer that does not measure its traffic (its
// reports carry no QueueTraffic).
//
// Completions are not in the report: they are what left the backlog, the previous
// backlog plus the arrivals less the backlog now, less the items the report says were
// dropped unserved (a drop that counted as a completion would shorten the service time
// towards 0). The busy item-seconds are the trapezoid of the two reports' items in
// flight. That holds only between consecutive reports of one producer; across a gap in
// its sequence (a lost report), arrivals and drops are still folded in but completions
// are not.
func (e Estimate) Next(prev, r *gpuscalerv1.QueueReport, dt time.Duration) Estimate {
	if prev == nil {
		return Estimate{}
	}
	if r.GetProducerId() != prev.GetProducerId() || r.GetSequence() != prev.GetSequence()+1 {
		return e.foldArrivals(seconds(dt), float64(r.GetArrivals()), float64(r.GetDropped()))
	}
	finished := float64(prev.Backlog()) + float64(r.GetArrivals()) - float64(r.Backlog()) - float64(r.GetDropped())
	return e.Fold(Interval{
		Length:      dt,
		Arrivals:    float64(r.GetArrivals()),
		Completions: max(finished, 0),
		Dropped:     float64(r.GetDropped()),
		Busy:        (float64(prev.GetInFlight()) + float64(r.GetInFlight())) / 2 * seconds(dt),
	})
}

// Add returns the estimate of a queue whose traffic is e's and o's, two of its
// producers': the rates and the items in flight add, and the service time is, by
// Little's law again, the mean of the two known ones weighed by their completions
// (Σ completions·S ÷ Σ completions); while neither completes, the longer of the two
// known. Each producer's own S weighs in, not its items in flight: S is kept while a
// producer's completions fade (items in flight, none finishing), where in flight over
// completions would grow without bound, and a producer that knows no S yet adds
// nothing to the others'. The dispersion is the known ones' weighed by their arrival
// rates, as the variances of independent arrivals add (a producer whose dispersion is
// unknown is left out, not counted as random); while none of those has arrivals, the
// largest known. The levels add, a producer whose level is unknown adding its minute's
// rate, and the level's window is the producers' weighed by their arrival rates (an
// unknown one's counting as Window; while none has arrivals, the longest); the level
// is unknown only while every producer's is. Sums add in any order to the same figures.
func (e Estimate) Add(o Estimate) Estimate {
	s := Estimate{
		Arrivals:    e.Arrivals + o.Arrivals,
		Completions: e.Completions + o.Completions,
		InFlight:    e.InFlight + o.InFlight,
		Dropped:     e.Dropped + o.Dropped,
		Service:     max(e.Service, o.Service),
		Trend:       e.Trend + o.Trend,
	}
	var weight, weighed, variance float64
	for _, x := range []Estimate{e, o} {
		if x.Service > 0 && x.Completions > 0 {
			weight += x.Completions
			weighed += x.Completions * x.Service
		}
		r := x.dispersedRate()
		s.dispersed += r
		variance += x.Dispersion * r
		s.Dispersion = max(s.Dispersion, x.Dispersion)
	}
	if weight > 0 {
		s.Service = weighed / weight
	}
	if s.dispersed > 0 {
		s.Dispersion = variance / s.dispersed
	}
	if e.LevelWindow > 0 || o.LevelWindow > 0 {
		var windowed float64
		for _, x := range []Estimate{e, o} {
			level, window := x.Arrivals, Window.Seconds()
			if x.LevelWindow > 0 {
				level, window = x.Level, x.LevelWindow
			}
			s.Level += level
			windowed += x.Arrivals * window
			s.LevelWindow = max(s.LevelWindow, window)
		}
		if s.Arrivals > 0 {
			s.LevelWindow = windowed / s.Arrivals
		}
	}
	s.summed = true
	return s
}

// dispersedRate is the arrival rate of the producers in e whose dispersion is known:
// what e's dispersion weighs by in a sum.
func (e Estimate) dispersedRate() float64 {
	switch {
	case e.summed:
		return e.dispersed
	case e.Dispersion > 0:
		return e.Arrivals
	}
	return 0
}

// Totals are a producer's counts of its share of a queue since it started: the totals a
// QueueTraffic carries.
type Totals struct {
	Arrivals, Completions, Dropped uint64
	// Busy is the item-seconds in flight.
	Busy float64
}

// Since returns the interval from prev to t, length long: the figures Fold takes.
func (t Totals) Since(prev Totals, length time.Duration) Interval {
	return Interval{
		Length:      length,
		Arrivals:    float64(t.Arrivals - prev.Arrivals),
		Completions: float64(t.Completions - prev.Completions),
		Dropped:     float64(t.Dropped - prev.Dropped),
		Busy:        t.Busy - prev.Busy,
	}
}

// Measure is a measuring producer's account between its reports: its totals as of the
// last report and its estimate. queue.Reporter keeps one, and so does the replay's
// producer, so both report alike.
type Measure struct {
	Totals   Totals
	Estimate Estimate
	// Waits tells the oldest waiting item's wait from the arrivals totals reported.
	Waits Waits
}

// Report folds in what happened since the last report, the totals now, length after
// it, and fills dst with the figures this report carries. It does not allocate.
func (m *Measure) Report(now Totals, length time.Duration, dst *gpuscalerv1.QueueTraffic) {
	iv := now.Since(m.Totals, length)
	m.Estimate = m.Estimate.Fold(iv).MeasureDispersion(length, iv.Arrivals)
	m.Totals = now
	m.Estimate.Traffic(now, dst)
}

// Oldest fills dst with how long the oldest of waiting items had waited at at, the
// time of the report Report just filled dst for (Waits), on the same clock as every
// earlier report's.
func (m *Measure) Oldest(at time.Duration, waiting uint64, dst *gpuscalerv1.QueueTraffic) {
	dst.OldestWaitSeconds = bounded(m.Waits.Oldest(at, m.Totals.Arrivals, waiting).Seconds(), 0, gpuscalerv1.MaxWindowSeconds)
}

// Traffic fills dst with e and totals, the figures a measuring producer reports. Rates
// above gpuscalerv1.MaxTrafficRate, a service time above gpuscalerv1.MaxServiceSeconds
// a dispersion above gpuscalerv1.MaxDispersion, a trend beyond ±MaxTrafficRate and a
// level's window above gpuscalerv1.MaxWindowSeconds are reported at those bounds, and a figure that is not a number as 0, so the report stays
// valid. It does not allocate.
func (e Estimate) Traffic(totals Totals, dst *gpuscalerv1.QueueTraffic) {
	dst.ArrivalsTotal = totals.Arrivals
	dst.CompletionsTotal = totals.Completions
	dst.DroppedTotal = totals.Dropped
	dst.BusySecondsTotal = bounded(totals.Busy, 0, math.MaxFloat64)
	dst.ArrivalRate = bounded(e.Arrivals, 0, gpuscalerv1.MaxTrafficRate)
	dst.CompletionRate = bounded(e.Completions, 0, gpuscalerv1.MaxTrafficRate)
	dst.DropRate = bounded(e.Dropped, 0, gpuscalerv1.MaxTrafficRate)
	dst.ServiceSeconds = bounded(e.Service, 0, gpuscalerv1.MaxServiceSeconds)
	dst.ArrivalDispersion = bounded(e.Dispersion, 0, gpuscalerv1.MaxDispersion)
	dst.ArrivalTrend = bounded(e.Trend, -gpuscalerv1.MaxTrafficRate, gpuscalerv1.MaxTrafficRate)
	dst.ArrivalLevel = bounded(e.Level, 0, gpuscalerv1.MaxTrafficRate)
	dst.LevelWindowSeconds = bounded(e.LevelWindow, 0, gpuscalerv1.MaxWindowSeconds)
}

// bounded returns v within lo to hi; 0 for NaN.
func bounded(v, lo, hi float64) float64 {
	if math.IsNaN(v) {
		return 0
	}
	return min(max(v, lo), hi)
}

// FromTraffic returns the estimate a producer reported (a valid QueueTraffic:
// gpuscalerv1.QueueReport.Validate). For Add to weigh producers by Little's law it
// takes the items in flight to be the completions times the service time.
// A producer that has seen no item finish (service time 0) weighs nothing: its unknown
// service time must not pull the others' towards 0.
func FromTraffic(t *gpuscalerv1.QueueTraffic) Estimate {
	e := Estimate{
		Arrivals:   t.GetArrivalRate(),
		Dropped:    t.GetDropRate(),
		Service:    t.GetServiceSeconds(),
		Dispersion: t.GetArrivalDispersion(),
		Trend:      t.GetArrivalTrend(),
	}
	if w := t.GetLevelWindowSeconds(); w > 0 {
		e.Level, e.LevelWindow = t.GetArrivalLevel(), w
	}
	if e.Service > 0 {
		e.Completions = t.GetCompletionRate()
		e.InFlight = e.Completions * e.Service
	}
	return e
}
