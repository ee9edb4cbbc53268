package scaler

import (
	"errors"
	"fmt"

	"github.com/gpuscaler/gpuscaler/scaler/demand"
)

// The read of a trigger, in one place. KEDA's calls (IsActive, StreamIsActive and
// GetMetrics in server.go), Explain (explain.go) and, through it, the status page all
// make the same read, Server.read:
//
//  1. State.Read takes the state's lock once, reads the queue's producers (readQueue,
//     policy.go) and finds the podSelector's selection, then, without the lock, sums
//     what the selection holds (sumGPUs, selection.go) and judges it (judgeGPUs,
//     policy.go);
//  2. a stream+consumer trigger's backlog comes from the followed JetStream consumer
//     (workqueue.go);
//  3. a capacityAware trigger's backlog is capped at what free devices take (capQueue).
//
// The policies (policy.go) decide each part; this file only puts them together, so
// every caller gets the same Reading. GetMetricSpec needs no data and reads nothing.

// checkReady fails with errNotReady until the state is restored from NATS.
func (s *Server) checkReady() error {
	select {
	case <-s.ready:
		return nil
	default:
		return errNotReady
	}
}

// active is IsActive's answer: the read's activation decision, once the state is ready.
func (s *Server) active(t *Trigger) (bool, error) {
	if err := s.checkReady(); err != nil {
		return false, err
	}
	return s.read(t).Active()
}

// look reads t for StreamIsActive: whether the trigger is active, and whether its GPU
// part alone is. Unknown counts as inactive: only a true moves KEDA. The stream opens
// once the state is ready, so readiness needs no check here.
func (s *Server) look(t *Trigger) (active, gpuActive bool) {
	r := s.read(t)
	active, _ = r.Active()
	return active, r.hasGPU && r.gpuActiveErr == nil && r.gpuActive
}

// read answers t from every source: the state for queues and GPUs, the followed
// JetStream consumer for stream triggers, then the capacity cap, keeping the backlog
// before the cap in Reading.uncapped for Explain. It does not check readiness: callers
// that answer KEDA check it first (checkReady), and StreamIsActive opens once ready.
func (s *Server) read(t *Trigger) Reading {
	r := s.state.Read(t)
	switch {
	case t.Stream != "" && s.work == nil:
		r.queue = metricReading{defined: true, err: fmt.Errorf("%w: this scaler follows no JetStream consumers (stream %q)", ErrUnavailable, t.Stream)}
	case t.Stream != "":
		r.queue = s.work.read(t)
	}
	r.uncapped = r.queue
	if t.CapacityAware {
		s.state.capQueue(t, &r.queue)
	}
	return r
}

// Read evaluates t's queue and GPU parts against the latest reports. A stream+consumer
// backlog and the capacity cap come from Server.read, which composes the sources. A
// capacityAware trigger's podSelector selects its Jobs' pods for the cap (see capQueue),
// not a GPU part.
func (s *State) Read(t *Trigger) Reading {
	now := s.now()
	var (
		r   Reading
		sel *selection
		key selKey
	)
	gpuPart := t.PodSelector != nil && !t.CapacityAware
	s.mu.RLock()
	if t.Queue != "" {
		r.queue = s.readQueue(t, now)
	}
	if gpuPart {
		r.hasGPU = true
		r.gpuUtil.defined = t.GPUUtilTarget > 0
		r.gpuMemory.defined = t.GPUMemoryTarget > 0
		err := s.podsKnown("")
		if err == nil {
			err = s.nodesFresh(t, now, "")
		}
		if err != nil {
			r.failGPU(err)
		} else {
			key = selKey{t.Namespace, t.PodSelector.String()}
			sel = s.selections[key]
		}
	}
	s.mu.RUnlock()
	if gpuPart && r.gpuActiveErr == nil {
		if sel == nil {
			sel = s.selectionFor(t.Namespace, t.PodSelector, key)
		}
		sum := s.sumGPUs(t, sel, now)
		s.judgeGPUs(t, now, sum, &r)
		if q := &r.queue; q.demand && q.err == nil && q.coldStart.source == "" {
			// Neither the trigger nor a producer gives a cold start: the collectors may.
			if q.coldStart = collectorColdStart(sel, sum, t.Namespace, now); q.coldStart.source != "" {
				q.demandIn.ColdStart = q.coldStart.duration()
				q.need = demand.Demand(q.demandIn)
				q.value = q.need.Replicas
			}
		}
	}
	return r
}

// failGPU fails every GPU part of r with err.
func (r *Reading) failGPU(err error) {
	r.gpuUtil.err, r.gpuMemory.err, r.gpuActiveErr = err, err, err
}

// ErrUnavailable reports that data a trigger needs is absent or stale. The gRPC server
// answers it with Unavailable: KEDA never scales a workload to zero while a trigger
// errors, and applies the ScaledObject's fallback if it has one. A silent zero here would
// scale a production service to nothing.
var ErrUnavailable = errors.New("data unavailable")

// Reading is what the latest reports say about one trigger. Each metric the trigger gives
// has a value or an error, never both.
type Reading struct {
	queue, gpuUtil, gpuMemory metricReading
	// uncapped is the queue's reading before the capacity cap: queue itself for a
	// trigger that is not capacityAware. Explain shows both.
	uncapped metricReading
	// gpuActive and gpuActiveErr judge GPU activity: average utilisation above
	// activationGpuUtil.
	gpuActive    bool
	gpuActiveErr error
	hasGPU       bool
}

type metricReading struct {
	defined bool
	value   float64
	// active is the queue's activation decision (backlog above activationQueueDepth).
	active bool
	// running is what of the backlog is being worked on now (in flight, ack pending):
	// the capacity cap keeps it.
	running float64
	// demand says the value is queue-demand, not queue-backlog; demandIn is what it was
	// computed from, need how (for explain), and coldStart the cold start in it and
	// whose figure that is.
	demand    bool
	demandIn  demand.Inputs
	need      demand.Need
	coldStart coldStartFigure
	err       error
}

// Metric returns the named metric's value. It fails with ErrUnavailable when the data is
// absent or stale, and with ErrUnknownMetric when the trigger does not give that metric.
func (r Reading) Metric(name string) (float64, error) {
	var m metricReading
	switch name {
	case MetricQueueBacklog, MetricQueueDemand:
		m = r.queue
		if r.queue.defined && (name == MetricQueueDemand) != r.queue.demand {
			m.defined = false
		}
	case MetricGPUUtil:
		m = r.gpuUtil
	case MetricGPUMemory:
		m = r.gpuMemory
	}
	if !m.defined {
		return 0, fmt.Errorf("%w: this trigger gives no metric %q", ErrUnknownMetric, name)
	}
	return m.value, m.err
}

// ErrUnknownMetric reports a metric name the trigger does not give. The gRPC server
// answers it with NotFound.
var ErrUnknownMetric = errors.New("unknown metric")

// Active is the trigger's activation decision, which KEDA takes as it is: true when any
// part is active on fresh data. When no part is active and some part cannot be judged,
// it fails with that part's error rather than answering false. A trigger with only
// podSelector (Trigger.GPUOnly) is active whenever its GPUs can be judged, idle or held
// by no pod: KEDA scales to zero on inactive (scaleToZeroOrIdle), and from zero replicas,
// holding no GPUs, it could never become active again.
func (r Reading) Active() (bool, error) {
	if r.hasGPU && !r.queue.defined {
		return r.gpuActiveErr == nil, r.gpuActiveErr
	}
	if r.queue.defined && r.queue.err == nil && r.queue.active {
		return true, nil
	}
	if r.hasGPU && r.gpuActiveErr == nil && r.gpuActive {
		return true, nil
	}
	var errs []error
	if r.queue.defined && r.queue.err != nil {
		errs = append(errs, r.queue.err)
	}
	if r.hasGPU && r.gpuActiveErr != nil {
		errs = append(errs, r.gpuActiveErr)
	}
	return false, errors.Join(errs...)
}
