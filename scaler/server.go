package scaler

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/gpuscaler/gpuscaler/proto/externalscaler"
)

// errNotReady answers calls that arrive before the state is restored from NATS: answering
// from half a picture could scale a workload on missing data.
var errNotReady = errors.New("scaler is restoring its state from NATS and not ready yet")

// Server implements KEDA's ExternalScaler service over a State. It is safe for
// concurrent use.
type Server struct {
	pb.UnimplementedExternalScalerServer

	state *State
	work  *workQueues     // the JetStream consumers stream+consumer triggers name
	ready <-chan struct{} // closed once the state is restored
	done  <-chan struct{} // closed when the scaler stops: ends open streams cleanly
	stale time.Duration   // staleAfter for triggers that give none
	// maxStale bounds a trigger's staleAfter: the stream's max age, after which a silent
	// node is forgotten. A longer staleAfter would trust a node the scaler no longer knows.
	maxStale time.Duration
	metrics  *metrics
	log      *slog.Logger
	// triggers caches parsed metadata; nil parses on every call. A Trigger is never
	// changed once parsed, so calls share it.
	triggers *triggerCache
	// calls records each trigger's last calls for the status page; nil records none, as
	// does a server without a trigger cache, whose entries name the triggers.
	calls *callRecorder
	// now tells time for the spacing of pushes (pushInterval); nil means time.Now.
	now func() time.Time
}

func (s *Server) clock() time.Time {
	if s.now == nil {
		return time.Now()
	}
	return s.now()
}

// NewLocalServer returns a Server over state, ready at once, for callers in this process:
// gpuscaler replay drives a State on a clock of its own and asks the Server exactly what
// KEDA would, through the same unary methods, without gRPC or NATS; a push is the caller
// asking IsActive after each event it applies. It serves no StreamIsActive, follows no
// JetStream consumers (stream triggers are Unavailable) and records no calls. staleAfter
// defaults to DefaultStaleAfter, as in the scaler.
func NewLocalServer(state *State) *Server {
	ready := make(chan struct{})
	close(ready)
	return &Server{
		state:    state,
		ready:    ready,
		done:     make(chan struct{}),
		stale:    DefaultStaleAfter,
		maxStale: DefaultStreamMaxAge,
		log:      slog.New(slog.DiscardHandler),
		triggers: newTriggerCache(defaultTriggerCacheSize),
	}
}

// IsActive answers KEDA's activation question. KEDA applies no threshold of its own to an
// external scaler: this answer is the decision.
func (s *Server) IsActive(_ context.Context, ref *pb.ScaledObjectRef) (*pb.IsActiveResponse, error) {
	t, k, err := s.trigger(ref)
	active := false
	if err == nil {
		if active, err = s.active(t); err != nil {
			err = toStatus(err)
		}
	}
	s.calls.isActive(k, active, err)
	if err != nil {
		return nil, err
	}
	return &pb.IsActiveResponse{Result: active}, nil
}

// StreamIsActive sends the trigger's activation state when opened, then true each time the
// trigger as a whole becomes active, as soon as the report that made it so is applied,
// unless the stream sent true less than the trigger's pushInterval ago. KEDA ignores a
// pushed false, so none is sent after the first message. It ends with a nil error when
// the scaler stops, so KEDA reconnects in 2 s rather than backing off.
//
// KEDA answers every true with RequestScale and a ScaledObject status write
// (startPushScalers and handleResult in pkg/scaling/scale_handler.go: lastActiveTime
// changes each time). While replicas are up a push buys nothing, and sparse traffic, a
// request every 2 s, would write the status every 2 s. A push within pushInterval of the
// last one is not needed to wake a workload: the last push set lastActiveTime, and KEDA
// scales to zero only a cooldownPeriod after that (scaleToZeroOrIdle in
// pkg/scaling/executor/scale_scaledobjects.go), which pushInterval must not exceed. So
// the first activation after a quiet pushInterval, the one that can find the workload at
// zero, is pushed at once; one held is pushed when the interval has passed if the trigger
// is still active then, and otherwise left to KEDA's polls.
func (s *Server) StreamIsActive(ref *pb.ScaledObjectRef, stream pb.ExternalScaler_StreamIsActiveServer) (err error) {
	t, k, err := s.trigger(ref)
	if err != nil {
		s.calls.streamEnded(k, false, err)
		return err
	}
	opened := false
	defer func() { s.calls.streamEnded(k, opened, err) }()
	ctx := stream.Context()
	select {
	case <-s.ready:
	case <-s.done:
		return nil
	case <-ctx.Done():
		return status.FromContextError(ctx.Err()).Err()
	}
	// Watch before the first read, so no report slips between the two.
	w := s.state.Watch(t)
	defer w.Stop()
	if t.Stream != "" {
		if err := s.work.watch(t, w); err != nil {
			return toStatus(err)
		}
	}
	s.metrics.streamsOpen.Inc()
	defer s.metrics.streamsOpen.Dec()

	active, gpuActive := s.look(t)
	if err := stream.Send(&pb.IsActiveResponse{Result: active}); err != nil {
		return err
	}
	s.calls.streamOpened(k, active)
	opened = true
	// lastPush is when this stream last sent true: KEDA acts on the opening message as on
	// a push. Zero while it has sent none, so the first activation is always pushed.
	var lastPush time.Time
	if active {
		lastPush = s.clock()
	}
	// A held activation is pushed when pushInterval has passed since the last push, if
	// the trigger is active still: KEDA may not have acted on that push (a ScaledObject
	// paused, its metric names not set yet, a failed scale: startPushScalers and
	// RequestScale skip those without writing lastActiveTime), or the ScaledObject's
	// cooldownPeriod may be shorter than pushInterval. A workload at zero with work
	// waiting then wakes a pushInterval after the push at the latest, not a poll later.
	var deferred *time.Timer
	var deferredC <-chan time.Time
	defer func() {
		if deferred != nil {
			deferred.Stop()
		}
	}()
	push := func(what string) error {
		if deferred != nil {
			deferred.Stop()
			deferred, deferredC = nil, nil
		}
		if err := stream.Send(&pb.IsActiveResponse{Result: true}); err != nil {
			return err
		}
		lastPush = s.clock()
		s.metrics.activationsPushed.Inc()
		s.calls.streamSent(k)
		s.log.Debug(what, "namespace", ref.GetNamespace(), "scaledObject", ref.GetName())
		return nil
	}
	for {
		select {
		case <-s.done:
			return nil
		case <-ctx.Done():
			return status.FromContextError(ctx.Err()).Err()
		case <-deferredC:
			deferred, deferredC = nil, nil
			now, gpuNow := s.look(t)
			if now {
				if err := push("pushed a held activation: still active a pushInterval after the last push"); err != nil {
					return err
				}
			}
			active, gpuActive = now, gpuNow
		case <-w.C:
			// Taken before the look, so a dip applied during it wakes the next one.
			dipped := w.SawInactive()
			now, gpuNow := s.look(t)
			// A backlog at or below activationQueueDepth since the last look made the whole
			// trigger inactive, however briefly, unless its GPU part held it active. Node
			// reports wake no stream, so that part is known only at the looks: active at
			// both, it is taken as active between them. Otherwise a combined trigger whose
			// pods are busy while its queue is empty would push true on every heartbeat of
			// that queue, and KEDA writes the ScaledObject's status for each push. A
			// workload at zero replicas holds no GPUs, so its GPU part is inactive and the
			// push that wakes it is never held back.
			if dipped && !(gpuActive && gpuNow) {
				active = false
			}
			if now && !active {
				at := s.clock()
				if !lastPush.IsZero() && at.Sub(lastPush) < t.PushInterval {
					s.metrics.activationsHeld.Inc()
					s.calls.streamHeld(k)
					s.log.Debug("held activation: pushed one within pushInterval", "namespace", ref.GetNamespace(),
						"scaledObject", ref.GetName(), "lastPush", lastPush, "pushInterval", t.PushInterval)
					if deferred == nil {
						deferred = time.NewTimer(t.PushInterval - at.Sub(lastPush))
						deferredC = deferred.C
					}
				} else if err := push("pushed activation"); err != nil {
					return err
				}
			}
			active, gpuActive = now, gpuNow
		}
	}
}

// GetMetricSpec returns the trigger's metrics and per-replica targets. It needs no data,
// so it answers before the state is restored.
func (s *Server) GetMetricSpec(_ context.Context, ref *pb.ScaledObjectRef) (*pb.GetMetricSpecResponse, error) {
	t, k, err := s.trigger(ref)
	s.calls.metricSpec(k, err)
	if err != nil {
		return nil, err
	}
	specs := t.MetricSpecs()
	resp := &pb.GetMetricSpecResponse{MetricSpecs: make([]*pb.MetricSpec, 0, len(specs))}
	for _, m := range specs {
		resp.MetricSpecs = append(resp.MetricSpecs, &pb.MetricSpec{
			MetricName:      m.Name,
			TargetSize:      max(1, toInt64(m.Target)), // KEDA before 2.17 reads only this
			TargetSizeFloat: m.Target,
		})
	}
	return resp, nil
}

// GetMetrics returns the current value of one metric. The HPA sums it over the trigger
// and divides by the target (AverageValue): desired replicas = ceil(value / target).
func (s *Server) GetMetrics(_ context.Context, req *pb.GetMetricsRequest) (*pb.GetMetricsResponse, error) {
	t, k, err := s.trigger(req.GetScaledObjectRef())
	var v float64
	if err == nil {
		if err = s.checkReady(); err == nil {
			v, err = s.read(t).Metric(req.GetMetricName())
		}
		if err != nil {
			err = toStatus(err)
		}
	}
	s.calls.metric(k, req.GetMetricName(), v, err)
	if err != nil {
		return nil, err
	}
	return &pb.GetMetricsResponse{MetricValues: []*pb.MetricValue{{
		MetricName:       req.GetMetricName(),
		MetricValue:      toInt64(v), // KEDA before 2.17 reads only this
		MetricValueFloat: v,
	}}}, nil
}

// trigger parses the ScaledObject's trigger metadata; errors are gRPC statuses. The key
// names the trigger to the call recorder, even when its metadata is invalid.
func (s *Server) trigger(ref *pb.ScaledObjectRef) (*Trigger, callKey, error) {
	if ref == nil {
		return nil, callKey{}, status.Error(codes.InvalidArgument, "scaledObjectRef is required")
	}
	parse := func() (*Trigger, error) {
		t, err := ParseTrigger(ref.GetNamespace(), ref.GetScalerMetadata(), s.stale)
		if err != nil {
			return nil, toStatus(err)
		}
		if s.maxStale > 0 && t.StaleAfter > s.maxStale {
			return nil, toStatus(&MetadataError{Key: KeyStaleAfter, Value: t.StaleAfter.String(),
				Want: fmt.Sprintf("at most %s, the scaler's --stream-max-age, after which a silent node is forgotten", s.maxStale)})
		}
		return t, nil
	}
	if s.triggers == nil {
		t, err := parse()
		return t, callKey{}, err
	}
	e := s.triggers.entry(ref.GetNamespace(), ref.GetScalerMetadata(), parse)
	return e.t, callKey{entry: e, name: ref.GetName()}, e.err
}

// toInt64 rounds v for the integer fields, saturating where int64 ends.
func toInt64(v float64) int64 {
	if v >= math.MaxInt64 {
		return math.MaxInt64
	}
	return int64(math.Round(v))
}

// toStatus translates the scaler's errors to gRPC status codes at the handler boundary.
func toStatus(err error) error {
	code := codes.Internal
	switch {
	case errors.Is(err, ErrInvalidMetadata):
		code = codes.InvalidArgument
	case errors.Is(err, ErrConsumerLimit):
		// KEDA handles every error code alike (pkg/scalers/external_scaler.go); this one
		// tells an operator reading the call's code that a limit, not stale data, failed it.
		code = codes.ResourceExhausted
	case errors.Is(err, ErrUnavailable), errors.Is(err, errNotReady):
		code = codes.Unavailable
	case errors.Is(err, ErrUnknownMetric):
		code = codes.NotFound
	}
	return status.Error(code, err.Error())
}
