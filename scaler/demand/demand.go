// Package demand estimates a queue's traffic from its producer's reports (arrival rate,
// service time by Little's law) and turns it into the replicas that traffic needs: the
// queue-demand metric (docs/triggers.md, "Scaling on demand"). It is pure arithmetic, apart
// from the scaler, so its fuzz target runs fast and replay can check it by hand.
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
}

// Rate is the arrival rate the metric serves: the larger of the rates over Window and
// BurstWindow.
func (e Estimate) Rate() float64 { return max(e.Arrivals, e.Burst) }

// Replicas is the queue-demand metric: the replicas, each serving c = concurrency items
// at once, that the queue's traffic needs for its items to start within targetWait
// (docs/triggers.md, "Scaling on demand"). Which of two models answers depends on how
// targetWait compares with the service time S:
//
//   - Erlang, while targetWait is shorter than S: serving plus draining. Serving is the
//     fewest slots m that serve the arrivals, λ per second (the larger of the rates
//     over Window and BurstWindow) of S seconds each, with at most 1 in 100 of them
//     waiting longer than targetWait, over c: m/c replicas, a fraction the HPA rounds up
//     with its tolerance. The chance an arrival waits longer than w in a queue served by
//     m slots is C(m, λS)·e^(−(m−λS)·w/S), C being Erlang's C formula (the M/M/m
//     queue). λS is the slots Little's law says are busy; a short targetWait buys
//     headroom above them for the randomness of arrivals. Draining starts the items
//     waiting now within targetWait, shorter than S, so a slot each: waiting/c replicas
//     (a replica added for them starts c at once; counting c/S a second of each,
//     waiting·S/(c·targetWait), would ask for more replicas than there are items).
//   - Fluid, once targetWait is at least S: the replicas that start the items waiting
//     now and those arriving over the next Window within targetWait of it,
//     (waiting + λ·Window)·S / (c·(targetWait + Window)). A wait that long lets a queue
//     absorb the randomness Erlang pays headroom for, and lets it stand for a while
//     rather than ask for a replica at every fluctuation, which the HPA would hold for
//     its 5-minute scale-down window. There it is always the fewer replicas of the two
//     (Erlang's serving exceeds λS/c, and its drain, at least c/S a second of each
//     replica, waiting·S/(c·targetWait), exceeds the fluid's), so it is also the fewer
//     that still meets the wait.
//
// Unlike backlog / queueTarget, the metric follows the arrival rate, which it sees in
// the first report of a burst, and the items that piled up while replicas loaded ask for
// what starts them within targetWait, not for a replica per queueTarget items, which
// arrives after the burst is over.
//
// Until an item has been seen to finish, S is unknown and the metric is the backlog
// over c: every item held by a replica at once, as queue-backlog with queueTarget c.
func Replicas(in Inputs) float64 {
	e, targetWait, waiting, inFlight := in.Traffic, in.TargetWait, in.Waiting, in.InFlight
	c := max(in.Concurrency, 1)
	if e.Service == 0 {
		return (waiting + inFlight) / float64(c)
	}
	wait, rate := targetWait.Seconds(), e.Rate()
	if Fluid(targetWait, e.Service) {
		return fluidReplicas(rate, e.Service, wait, c, waiting)
	}
	return erlangReplicas(rate, e.Service, wait, c, waiting)
}

// Fluid says whether Replicas answers by the fluid model, targetWait being at least the
// service time (in seconds), rather than by Erlang's.
func Fluid(targetWait time.Duration, service float64) bool {
	return targetWait.Seconds() >= service
}

// erlangReplicas is Erlang's model: serving λ within wait, plus a slot for each item
// waiting now.
func erlangReplicas(rate, service, wait float64, c int, waiting float64) float64 {
	return ServingReplicas(rate*service, service, wait, c) + waiting/float64(c)
}

// fluidReplicas is the fluid model: the items waiting now and those arriving over the
// next Window, started within wait of it.
func fluidReplicas(rate, service, wait float64, c int, waiting float64) float64 {
	h := Window.Seconds()
	return (waiting + rate*h) * service / (float64(c) * (wait + h))
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
