package scaler

import (
	"time"

	gpuscalerv1 "github.com/gpuscaler/gpuscaler/proto/gpuscaler/v1"
)

// The cold start: how long a new replica takes to serve, which the queue-demand metric
// reads (demand.Inputs.ColdStart). A trigger's figure is the first of (docs/triggers.md,
// "Cold starts"):
//  1. its coldStart key: its author knows what a first start costs (an image pull, a
//     node brought up) that no measurement of an earlier start saw;
//  2. the largest its queue's live producers measured (a gateway: a backend replica from
//     its endpoint first seen not ready to ready), read from the stream, so every scaler
//     replica reads the same;
//  3. with a podSelector, the largest the collectors measured of the selected pods (from
//     first seen holding GPUs to busy), remembered after the pods are gone: a workload at
//     zero has none, and waking it is when the figure matters (see rememberColdStart);
//  4. else unknown.

// Sources of a cold start, as explain and the status page name them
// (gpuscalerv1.ColdStart.source).
const (
	coldStartFromTrigger   = "trigger"
	coldStartFromProducer  = "producer"
	coldStartFromCollector = "collector"
)

// coldStartMemory is how long a selection's remembered cold start stands against smaller
// ones the collectors measure later: a larger figure replaces it at once, a smaller one
// only once reads have seen smaller ones alone for this long, with pods running. A
// workload at zero keeps its figure however long it stays there, and one quick start
// after it does not replace it.
const coldStartMemory = time.Hour

// coldStartFigure is a trigger's cold start and whose figure it is. The zero value is
// unknown. It is compared with ==.
type coldStartFigure struct {
	seconds float64
	// source is one of the coldStartFrom constants; empty when unknown.
	source string
	// producer names the producer that measured it; namespace, pod and node the pod the
	// collector of node measured.
	producer             string
	namespace, pod, node string
}

// duration returns the figure as demand.Inputs wants it; 0 when unknown.
func (f coldStartFigure) duration() time.Duration {
	return time.Duration(f.seconds * float64(time.Second))
}

// proto returns the figure as explain and the status page carry it; nil when unknown.
func (f coldStartFigure) proto() *gpuscalerv1.ColdStart {
	if f.source == "" {
		return nil
	}
	c := &gpuscalerv1.ColdStart{Seconds: f.seconds, Source: f.source, ProducerId: f.producer}
	if f.pod != "" {
		c.Pod, c.Node = f.namespace+"/"+f.pod, f.node
	}
	return c
}

// measuredColdStart returns a cold start a producer or collector reported, in seconds,
// when it is one the scaler takes: finite, above 0 and at most
// gpuscalerv1.MaxColdStartSeconds; else 0, as not measured. A collector's figure is
// validated with its report; a producer's is not, so a report with a figure that makes
// no sense still counts its queue.
func measuredColdStart(seconds float64) float64 {
	if !(seconds > 0 && seconds <= gpuscalerv1.MaxColdStartSeconds) { // NaN is neither
		return 0
	}
	return seconds
}

// coldStartOfPod returns the cold start p's collector measured, in seconds; 0 when none.
func coldStartOfPod(p *gpuscalerv1.PodRef) float64 {
	return measuredColdStart(p.GetColdStartSeconds())
}

// triggerColdStart returns t's cold start from its key, else from its queue's live
// producers q; unknown when neither gives one (then the collectors may, see
// collectorColdStart). t has a queue and targetWait.
func triggerColdStart(t *Trigger, q queueSum) coldStartFigure {
	if t.ColdStart > 0 {
		return coldStartFigure{seconds: t.ColdStart.Seconds(), source: coldStartFromTrigger}
	}
	return q.producerColdStart()
}

// producerColdStart returns the largest cold start q's live producers measured; unknown
// when none did.
func (q queueSum) producerColdStart() coldStartFigure {
	if q.coldStart == 0 {
		return coldStartFigure{}
	}
	return coldStartFigure{seconds: q.coldStart, source: coldStartFromProducer, producer: q.coldStartBy}
}

// collectorColdStart returns the cold start the collectors measured of sel's pods, as
// sum (read at now) found them and sel remembers (see rememberColdStart); unknown when
// neither has one.
func collectorColdStart(sel *selection, sum gpuSums, ns string, now time.Time) coldStartFigure {
	var cur coldStartFigure
	if e, v := sum.coldStartPod.e, sum.coldStartPod.v; e != nil && sum.coldStart > 0 {
		cur = coldStartFigure{seconds: sum.coldStart, source: coldStartFromCollector, namespace: ns, pod: v.pod, node: e.report.GetNode()}
	}
	return sel.rememberColdStart(cur, now)
}

// rememberColdStart keeps the largest cold start the collectors measured of the
// selection's pods, and returns the figure to use now: cur, the largest a read sees now,
// or the one remembered where it is larger. cur replaces the remembered figure when it
// is as large or larger (the remembered pod itself, while it runs), or once reads have
// seen only smaller ones for coldStartMemory: a slow start is not forgotten when quick
// ones follow, nor while the pods are gone. Reads may race; each stores what a read saw,
// and the next read settles it. It allocates only when the figure changes.
func (sel *selection) rememberColdStart(cur coldStartFigure, now time.Time) coldStartFigure {
	rem := sel.coldStart.Load()
	if cur.seconds == 0 {
		sel.coldStartOthers.Store(0)
		if rem != nil {
			return *rem
		}
		return cur
	}
	if rem != nil && cur.seconds < rem.seconds {
		since := sel.coldStartOthers.Load()
		if since == 0 {
			sel.coldStartOthers.Store(now.UnixNano())
			return *rem
		}
		if now.Sub(time.Unix(0, since)) <= coldStartMemory {
			return *rem
		}
	}
	if rem == nil || *rem != cur {
		sel.coldStart.Store(&cur)
	}
	sel.coldStartOthers.Store(0)
	return cur
}
