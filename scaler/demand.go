package scaler

import (
	"math"
	"time"

	gpuscalerv1 "github.com/gpuscaler/gpuscaler/proto/gpuscaler/v1"
)

// DemandWindow is the time constant of a queue's demand estimates: each report weighs in
// by 1 − e^(−Δ/DemandWindow), Δ being the time since the previous report, so what
// happened a minute ago counts for about a third of what happens now. Short enough to
// follow a burst within a HPA sync or two, long enough that one busy second is not read
// as the rate.
const DemandWindow = time.Minute

// demand is what a queue's reports say of its traffic, folded in report by report as the
// stream delivers them. It depends only on the reports and on when NATS stored them, so
// every scaler replica that read the same stream holds the same estimates. A replica
// that restarts holds none until it has seen an item finish (see queueDemand).
type demand struct {
	// arrivals and completions are items per second; inFlight is the items being
	// worked on, averaged over time.
	arrivals, completions, inFlight float64
	// service is how long an item takes, in seconds, by Little's law: inFlight /
	// completions. Zero until an item is seen to finish. It is kept while the queue is
	// idle: it is a property of the work, not of the traffic.
	service float64
}

// next folds report r, stored at stored, into what old knew (nil: nothing).
//
// Completions are not in the report: they are what left the backlog, the previous
// backlog plus the arrivals less the backlog now. That holds only between consecutive
// reports of one producer; across a gap in its sequence (a lost report) or another
// producer's report, arrivals are still folded in but completions are not.
func (old *queueEntry) nextDemand(r *gpuscalerv1.QueueReport, stored time.Time) demand {
	if old == nil {
		return demand{}
	}
	d := old.demand
	dt := max(stored.Sub(old.stored).Seconds(), 1e-3)
	alpha := -math.Expm1(-dt / DemandWindow.Seconds())
	d.arrivals += alpha * (float64(r.GetArrivals())/dt - d.arrivals)
	prev := old.report
	if r.GetProducerId() != prev.GetProducerId() || r.GetSequence() != prev.GetSequence()+1 {
		return d
	}
	finished := float64(prev.Backlog()) + float64(r.GetArrivals()) - float64(r.Backlog())
	d.completions += alpha * (max(finished, 0)/dt - d.completions)
	d.inFlight += alpha * ((float64(prev.GetInFlight())+float64(r.GetInFlight()))/2 - d.inFlight)
	if finished > 0 && d.completions > 0 {
		d.service = d.inFlight / d.completions
	}
	return d
}

// queueDemand is the queue-demand metric: the replicas, each serving t.Concurrency items
// at once, that the queue's traffic needs for its items to start within t.TargetWait
// (DESIGN.md, "The demand metric"):
//
//	(λ·S + waiting·S / targetWait) / c
//
// λ is the arrival rate and S the service time, both measured over DemandWindow. λ·S is
// Little's law: the items being served at once at this rate, which c to a replica take
// λ·S/c replicas. The second part starts the items waiting now within targetWait: a
// replica starts c/S of them per second. A long targetWait runs the replicas nearly full
// and lets a burst queue; a short one drains every burst at once.
//
// Unlike backlog / queueTarget, the metric follows the arrival rate, which it sees at
// the first report of a burst, rather than the items piling up while replicas load, and
// the items that did pile up ask for what starts them within targetWait, not for a
// replica per queueTarget items, which arrives after the burst is over.
//
// Until an item has been seen to finish, S is unknown and the metric is the backlog
// over c: every item held by a replica at once, as queue-backlog with queueTarget c.
func queueDemand(t *Trigger, d demand, waiting, inFlight float64) float64 {
	c := float64(max(t.Concurrency, 1))
	if d.service == 0 {
		return (waiting + inFlight) / c
	}
	return (d.arrivals*d.service + waiting*d.service/t.TargetWait.Seconds()) / c
}
