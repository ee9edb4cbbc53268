// Package demand folds a queue's traffic (arrival rate, service time by Little's law), as
// its producers measure it or as the scaler estimates it from their reports, and turns
// it into the replicas that traffic needs: the queue-demand metric (docs/triggers.md,
// "Scaling on demand"). It is pure arithmetic, apart from the scaler, so the producer API
// can share it, its fuzz targets run fast and replay can check it by hand.
package demand

import (
	"math"
	"time"
)

// Inputs is what the queue-demand metric reads of a queue and its trigger.
type Inputs struct {
	// Traffic is the queue's traffic, summed over its live producers.
	Traffic Estimate
	// Concurrency is the items one replica serves at once; TargetWait the trigger's
	// targetWait.
	Concurrency int
	TargetWait  time.Duration
	// ColdStart is how long a new replica takes to serve (the trigger's coldStart, or a
	// measured figure); 0: unknown.
	ColdStart time.Duration
	// Waiting and InFlight are the queue's items now, summed over its live producers.
	Waiting, InFlight float64
	// OldestWait is how long the oldest waiting item has waited, the longest any live
	// producer measured (Waits); 0: none waits, or no producer measures it.
	OldestWait time.Duration
	// Tolerance is the HPA's tolerance for scaling up, the share of the replicas within
	// which it leaves them as they are (the trigger's scaleUpTolerance, HPATolerance
	// unless the cluster or the HPA sets another): a missed wait goes just past it (see
	// Demand). The zero value is a tolerance of none, not the default: a caller sets it.
	Tolerance float64
}

// HPASync is how often the HPA reads the metric and acts on it (kube-controller-manager's
// --horizontal-pod-autoscaler-sync-period, 15 s by default): a replica asked for now is
// asked for up to this late.
const HPASync = 15 * time.Second

// HPATolerance is the HPA's tolerance (kube-controller-manager's
// --horizontal-pod-autoscaler-tolerance, 0.1 by default): it leaves the replicas as they
// are while the metric is within this share of them. Since Kubernetes 1.33 an HPA may
// set its own for each direction (behavior.scaleUp.tolerance, the HPAConfigurableTolerance
// feature gate), which a ScaledObject passes on from
// advanced.horizontalPodAutoscalerConfig; the trigger's scaleUpTolerance repeats it.
const HPATolerance = 0.1

// pastTolerance is how far past the HPA's tolerance the metric goes when a wait is
// missed (see Demand): a hundredth of a replica, ten of the thousandths KEDA passes a
// metric on in, so that no rounding on the way leaves it at the tolerance.
const pastTolerance = 0.01

// Horizon is how far ahead the metric looks: how long replicas asked for now take to
// serve, the HPA's sync and the cold start, and never less than Window (a minute: about
// a model load and a sync), which it is while the cold start is unknown. Replay chose
// the floor: on the dense traces' loads (23–52 s) a horizon of the cold start alone
// made no difference beyond noise, where with loads three times as long, leaving the
// cold start out let the p99 wait reach twice targetWait (docs/replay.md).
func Horizon(coldStart time.Duration) time.Duration {
	if coldStart <= 0 {
		return Window
	}
	return max(Window, coldStart+HPASync)
}

// Need is the queue-demand metric and its parts, for explain.
type Need struct {
	// Replicas is the metric: Serving plus Draining, at most Most.
	Replicas float64
	// Serving is the replicas that serve the arrivals, Batched among them; Draining
	// those that start the items waiting now; Most the replicas that would give every
	// item in flight, waiting or expected over the horizon a slot of its own.
	Serving, Draining, Most float64
	// Batched is the part of Serving for items that arrive together: the slots for the
	// batch-mates ahead of them that Erlang's slots do not start within targetWait
	// (BatchSlots), over concurrency.
	Batched float64
	// Horizon is how far ahead the metric looked (see Horizon).
	Horizon time.Duration
	// Rate is the arrival rate Serving and Most are for, in items a second: the minute's
	// rate, or the level where it is below it and no rise shows (Level), plus Rise, how
	// much the rate is expected to rise by the time replicas asked for now serve (see
	// Served and Rise).
	Rate, Rise float64
	// Level says the minute's rate was above the arrivals' level, an upward fluctuation
	// of traffic that fluctuates about a steady level, and the level was served.
	Level bool
	// Backlog says the service time is unknown and the metric is the backlog over
	// concurrency.
	Backlog bool
	// Missed says the oldest waiting item has waited targetWait while the metric asked
	// for more replicas than are serving, within the HPA's tolerance of them, and the
	// metric was raised past it (see Demand).
	Missed bool
}

// Replicas is the queue-demand metric (see Demand).
func Replicas(in Inputs) float64 { return Demand(in).Replicas }

// Demand is the queue-demand metric: the replicas, each serving c = concurrency items at
// once, that the queue's traffic needs for 99 in 100 of its items to start within
// targetWait T, cold starts included (docs/triggers.md, "Scaling on demand"). It looks
// a horizon H ahead, how long replicas asked for now take to serve (Horizon), and is the
// sum of two parts:
//
//   - Draining: the items waiting now, q, started within T + H, by which replicas asked
//     for now are serving and a wait of T has been allowed: a slot starts (T+H)/S items
//     of S seconds each over that span, but never more than one item that is waiting
//     now, so q·min(S, T+H)/(T+H) slots.
//   - Serving: the arrivals, λ a second (Served: the minute's rate, or the level the
//     traffic fluctuates about where the minute's is above it and no rise shows, plus
//     Rise), of S seconds each. Started within T of the horizon's end, the arrivals of the
//     horizon need λS·H/(T+H) busy slots (the fluid model: a queue of λT may stand, its
//     items each waiting T), and to keep 99 in 100 of them within T, the fewest slots m
//     that Erlang's C formula says keep the chance of waiting longer than T at most 1 in
//     100 for that load: C(m, a)·e^(−(m−a)·T/S) ≤ 0.01 (the M/M/m queue). A short T buys
//     headroom above λS for the randomness of arrivals, so no arrival waits for a cold
//     start; a long one lets a queue stand rather than ask for a replica at every
//     fluctuation, which the HPA would hold for its 5-minute scale-down window. Erlang's
//     arrivals come one at a time; items that arrive together (a dispersion D above 1)
//     each find their batch-mates ahead of them, and BatchSlots more slots start those
//     that Erlang's slots do not start within T.
//
// The sum, over c, is at most the items in flight, waiting and expected over the
// horizon, λH, over c: a slot each. The arrival rate is the minute's at most, never a
// burst's alone: the items a burst brings are waiting and drained, and counted again as
// a rate that repeats only as far as the minute's rate says. Once the oldest waiting
// item has waited T (OldestWait), a sum above the replicas serving, within the HPA's
// tolerance of them (Inputs.Tolerance), is raised just past it (Need.Missed), so the HPA
// adds a replica.
//
// The parts fall as T grows, with no switch between models: as T shrinks towards 0 the
// metric becomes Erlang's for the whole load, with a slot for each batch-mate, plus a
// slot for each waiting item over the horizon, and as T grows past S it becomes the
// fluid model's. Until an item has been seen to finish, S is unknown
// and the metric is the backlog over c: every item held by a replica at once, as
// queue-backlog with queueTarget c.
func Demand(in Inputs) Need {
	e := in.Traffic
	c := max(in.Concurrency, 1)
	h := Horizon(in.ColdStart)
	if e.Service == 0 {
		v := (in.Waiting + in.InFlight) / float64(c)
		return Need{Replicas: v, Draining: v, Most: v, Horizon: h, Backlog: true}
	}
	s, t, hs := e.Service, in.TargetWait.Seconds(), h.Seconds()
	n := Need{Horizon: h, Rise: Rise(e, h)}
	rate := Served(e)
	n.Level = rate < e.Arrivals
	rate += n.Rise
	n.Rate = rate
	n.Serving = ServingReplicas(rate*s*hs/(t+hs), s, t, c)
	n.Draining = in.Waiting * min(s, t+hs) / (t + hs) / float64(c)
	n.Most = (in.InFlight + in.Waiting + rate*hs) / float64(c)
	// Never more batch-mates than the items expected over the horizon: a queue whose
	// traffic has faded expects no batch, whatever its last dispersion.
	n.Batched = min(BatchSlots(e.Dispersion, n.Serving*float64(c), s, t), rate*hs) / float64(c)
	n.Serving += n.Batched
	n.Replicas = min(n.Serving+n.Draining, n.Most)
	// While items wait every slot is busy, so the items in flight are the replicas
	// serving, r. The HPA leaves r replicas as they are while the metric is within its
	// tolerance of r, and the metric settles there on a rise, with a queue standing (the
	// fluid model lets λT stand) whose items each wait about targetWait. Once the oldest
	// has waited targetWait the wait is missed now: a metric above r goes past the
	// tolerance, so the HPA adds a replica or more (⌈tolerance × r + 0.01⌉).
	if r := in.InFlight / float64(c); in.Waiting > 0 && r > 0 && in.OldestWait >= in.TargetWait && n.Replicas > r {
		if past := min(r*(1+max(in.Tolerance, 0))+pastTolerance, n.Most); past > n.Replicas {
			n.Replicas, n.Missed = past, true
		}
	}
	return n
}

// trendNoise is the variance of the difference between two exponentially weighted
// averages of arrivals at random, over Window and TrendWindow, per item a second: each
// has the variance λ/2w of its own window w, and they share λ/(w + w').
var trendNoise = func() float64 {
	w, w2 := Window.Seconds(), TrendWindow.Seconds()
	return 1/(2*w) + 1/(2*w2) - 2/(w+w2)
}()

// trendSignificance is how many standard deviations of its own noise the difference
// between the two averages must exceed before Rise reads it as a rise: about one reading
// in forty of a steady rate's noise passes it.
const trendSignificance = 2

// Served returns the arrival rate the queue-demand metric serves, before any rise: the
// arrivals' level e.Level where that is known, below the minute's rate e.Arrivals and
// the rate is not rising beyond its noise; otherwise the minute's rate. A minute's rate
// above the level, while the traffic fluctuates about a steady level (its window is then
// long) and no rise shows, is an upward fluctuation: replicas asked for it would serve
// after it has passed and be held for the HPA's scale-down window, five minutes by
// default. Where the level moves from minute to minute the window is Window and the
// two agree. A rise is served from the minute's rate, which lags it least, plus Rise:
// the level, averaged over longer, would lag it by its window. A rate below the level
// is served as it is, a fall costing nothing to follow, as the HPA holds the replicas
// through it anyway.
func Served(e Estimate) float64 {
	if e.LevelWindow > 0 && e.Level < e.Arrivals && !(trendBeyondNoise(e) > 0) {
		return e.Level
	}
	return e.Arrivals
}

// trendBeyondNoise is the part of e's trend beyond trendSignificance standard deviations
// of the noise of the two averages it is the difference of, that noise being of
// arrivals at random or, where they arrive in batches, of the measured dispersion; 0 or
// less for none.
func trendBeyondNoise(e Estimate) float64 {
	if !(e.Trend > 0) || !(e.Arrivals > 0) {
		return 0
	}
	noise := math.Sqrt(max(1, e.Dispersion)*e.Arrivals*trendNoise) / (TrendWindow - Window).Seconds()
	return e.Trend - trendSignificance*noise
}

// Rise returns how much the arrival rate e.Arrivals, the average over Window, is
// expected to have risen by the time replicas asked for now serve: e.Trend, the rise a
// second, times Window (the average lags a steady rise by that much) plus horizon. Only
// the part of the trend beyond its noise counts (trendBeyondNoise); a fall counts as
// none, as the HPA holds the replicas for its scale-down window anyway and a fall that
// turns is then served.
func Rise(e Estimate, horizon time.Duration) float64 {
	return max(0, trendBeyondNoise(e)) * (Window + horizon).Seconds()
}

// BatchSlots returns the slots, beyond the m that Erlang's formula gives, that items
// arriving together need for the batch-mates ahead of them to start within the wait:
// an item that arrives in a batch finds (d − 1)/2 batch-mates ahead of it on average
// (d being the arrivals' index of dispersion, Estimate.Dispersion, which for batches
// arriving at random is the mean batch an item arrives in, E[X²]/E[X]). The m slots,
// items service seconds long, start m·wait/service of them in turn within the wait;
// the others need slots of their own, each starting max(1, wait/service) of them. It
// is 0 for arrivals at random (d ≤ 1), and once the wait is long enough for the m
// slots to start the batch-mates.
func BatchSlots(d, m, service, wait float64) float64 {
	if !(d > 1) {
		return 0
	}
	return max(0, (d-1)/2-m*wait/service) / max(1, wait/service)
}

// tail is the share of arrivals allowed to wait longer than targetWait: it makes
// targetWait a p99.
const tail = 0.01

// erlangSlots bounds the exact Erlang computation, whose cost grows with the slots
// (4,096 cost about 10 µs): above it, Halfin and Whitt's approximation for many servers
// stands in, which is within a few percent there and better beyond.
const erlangSlots = 4096

// ServingReplicas returns the replicas of c slots each that serve an offered load of a
// busy slots (λ·S), each item service seconds long, with at most tail of the arrivals
// waiting longer than wait: the fewest slots that do, over c. It is not rounded up to
// whole replicas: the HPA rounds the metric once, with its 10% tolerance, and a
// replica's worth of slots rounded here as well would be asked for on top whenever
// the drain adds a fraction (on Azure LLM at half speed, rounding here cost 2–4% more
// GPU-hours for queueTarget 8's p99 wait).
func ServingReplicas(a, service, wait float64, c int) float64 {
	if a <= 0 {
		return 0
	}
	if a > erlangSlots {
		return halfinWhitt(a, service, wait) / float64(c)
	}
	// Erlang B by its recurrence over the slots, B(0) = 1, B(m) = a·B / (m + a·B), and
	// from it Erlang C = m·B / (m − a·(1 − B)), for m > a.
	b := 1.0
	for m := 1; ; m++ {
		b = a * b / (float64(m) + a*b)
		if float64(m) <= a {
			continue
		}
		erlangC := float64(m) * b / (float64(m) - a*(1-b))
		if erlangC*math.Exp(-(float64(m)-a)*wait/service) <= tail || m >= 2*erlangSlots {
			return float64(m) / float64(c)
		}
	}
}

// halfinWhitt returns the slots m = a + β√a for which C·e^(−β√a·wait/service) is
// tail, C being Halfin and Whitt's limit of Erlang C for many servers,
// 1 / (1 + β·Φ(β)/φ(β)) (Φ and φ: the standard normal distribution and density). Both
// fall as β grows, so β is found by bisection.
func halfinWhitt(a, service, wait float64) float64 {
	chance := func(beta float64) float64 {
		phi := math.Exp(-beta*beta/2) / math.Sqrt(2*math.Pi)
		cdf := 0.5 * math.Erfc(-beta/math.Sqrt2)
		return math.Exp(-beta*math.Sqrt(a)*wait/service) / (1 + beta*cdf/phi)
	}
	lo, hi := 0.0, 10.0
	for range 60 {
		if mid := (lo + hi) / 2; chance(mid) > tail {
			lo = mid
		} else {
			hi = mid
		}
	}
	return math.Max(math.Ceil(a+hi*math.Sqrt(a)), math.Floor(a)+1)
}
