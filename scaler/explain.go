package scaler

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/labels"

	pb "github.com/gpuscaler/gpuscaler/proto/externalscaler"
	gpuscalerv1 "github.com/gpuscaler/gpuscaler/proto/gpuscaler/v1"
	"github.com/gpuscaler/gpuscaler/scaler/demand"
	"github.com/gpuscaler/gpuscaler/scaler/metadata"
)

// explainer serves the Explainer service beside the ExternalScaler one, on the same
// server and so under the same TLS.
type explainer struct {
	gpuscalerv1.UnimplementedExplainerServer
	srv *Server
}

func (x explainer) Explain(ctx context.Context, req *gpuscalerv1.ExplainRequest) (*gpuscalerv1.Explanation, error) {
	return x.srv.Explain(ctx, req)
}

// Explain reads one trigger as KEDA's calls would, through the same code, and says from
// what: the queue report or consumer, the nodes and GPUs of the selected pods, the free
// capacity, how old each is, and reasons an operator can act on. Its answer is a KEDA
// read: for a trigger KEDA does not poll it makes the selection or node pool that read
// makes, dropped like any other after selectionIdleAfter unread. What the answer came
// from is found by walking the namespace's nodes, apart from the selection, so it costs
// what a read cost before selections; the state's lock is held only to copy the list of
// entries, which never change once applied.
func (s *Server) Explain(_ context.Context, req *gpuscalerv1.ExplainRequest) (*gpuscalerv1.Explanation, error) {
	if req == nil {
		return nil, status.Error(codes.InvalidArgument, "request is required")
	}
	now := s.state.now()
	ex := &gpuscalerv1.Explanation{
		Namespace: req.GetNamespace(),
		Name:      req.GetName(),
		ReadAt:    timestamppb.New(now),
		Ready:     s.checkReady() == nil,
		Answer:    &gpuscalerv1.Answer{},
	}
	t, _, err := s.trigger(&pb.ScaledObjectRef{Name: req.GetName(), Namespace: req.GetNamespace(), ScalerMetadata: req.GetMetadata()})
	if err != nil {
		setError(&ex.Answer.ErrorCode, &ex.Answer.Error, err)
		ex.Reasons = append(ex.Reasons, "KEDA gets this error from every call for this trigger, so nothing scales on it: fix the trigger's metadata. KEDA reports it in the ScaledObject's (or ScaledJob's) status and events.")
		return ex, nil
	}
	ex.Effective = effective(t)

	var r Reading
	if ex.Ready {
		r = s.read(t)
	}
	uncapped := r.uncapped
	s.answer(ex, t, r)

	if t.Queue != "" {
		ex.Queue = s.state.queueStatus(t, now)
		if r.queue.demand {
			// The figure the metric used, whoever gave it, rather than the producers'.
			ex.Queue.ColdStart = r.queue.coldStart.proto()
		}
	} else if t.Stream != "" {
		ex.Queue = &gpuscalerv1.QueueStatus{Namespace: t.Namespace, Queue: t.Stream + "/" + t.Consumer, FromConsumer: true}
		if uncapped.defined && uncapped.err == nil {
			ex.Queue.Backlog = int64(uncapped.value)
			ex.Queue.InFlight = int64(uncapped.running)
			ex.Queue.Waiting = ex.Queue.Backlog - ex.Queue.InFlight
		}
	}
	if t.PodSelector != nil {
		ex.Nodes, ex.NamespaceGpuPods = s.state.explainGPUs(t, now)
	}
	if t.CapacityAware {
		ex.Capacity = s.state.explainCapacity(t, now)
		// Only a cap that was made: when capacity is unknown the backlog KEDA gets is an
		// error, not a cap at 0, and the explanation must not read as one.
		if uncapped.defined && uncapped.err == nil && r.queue.err == nil {
			ex.Capacity.Backlog = uncapped.value
			ex.Capacity.Capped = r.queue.value
			running, _ := s.state.runningJobsOf(t, &uncapped)
			ex.Capacity.RunningJobs = int32(running)
		}
	}
	ex.Reasons = reasons(ex, t, r)
	if t.PodSelector != nil && ex.Ready {
		ex.Reasons = append(ex.Reasons, podClaimsReason(s.state.ChecksPodClaims()))
	}
	return ex, nil
}

// coldStartReason says which cold start the queue-demand metric read, and whose.
func coldStartReason(t *Trigger, c *gpuscalerv1.ColdStart) string {
	if c == nil {
		where := "no producer of the queue measured one (a gateway does, for a Service route)"
		if t.PodSelector != nil {
			where += ", nor did a collector of a pod podSelector selects"
		}
		return "Cold start (how long a new replica takes to serve) unknown: the trigger gives no coldStart, " + where + ". Give the trigger a coldStart if new replicas take long to serve."
	}
	return "Cold start (how long a new replica takes to serve): " + c.Describe() + " (see docs/triggers.md, Cold starts)."
}

// podClaimsReason says whom the scaler believes of which pods hold a node's GPUs.
func podClaimsReason(checks, synced bool) string {
	switch {
	case !checks:
		return "This scaler has no Kubernetes API access (--kubeconfig none): it believes every node's report of which pods hold its GPUs, and with what labels, so any node, or anyone who may publish a node's reports, can speak for this namespace's pods. Give it --kubeconfig (the chart does) to believe a node only of the pods the API places on it."
	case !synced:
		return "This scaler checks the pods each node reports against the Kubernetes API, and has not yet listed them: triggers that read pods are Unavailable until it has."
	}
	return "The pods each node reports are checked against the Kubernetes API: a node is believed only of the pods the API places on it, and podSelector matches the labels the API holds."
}

// answer fills ex.Answer with what IsActive, GetMetricSpec and GetMetrics answer for t
// from r, read when the state is ready.
func (s *Server) answer(ex *gpuscalerv1.Explanation, t *Trigger, r Reading) {
	a := ex.Answer
	var activeErr error
	if ex.Ready {
		a.Active, activeErr = r.Active()
	} else {
		activeErr = errNotReady
	}
	if activeErr != nil {
		a.Active = false
		setError(&a.ErrorCode, &a.Error, toStatus(activeErr))
	}
	for _, m := range t.MetricSpecs() {
		ma := &gpuscalerv1.MetricAnswer{Name: m.Name, Target: m.Target}
		v, err := r.Metric(m.Name)
		if !ex.Ready {
			err = errNotReady
		}
		if err != nil {
			setError(&ma.ErrorCode, &ma.Error, toStatus(err))
		} else {
			ma.Value = v
			ma.Replicas = replicasFor(v, m.Target)
		}
		a.Metrics = append(a.Metrics, ma)
	}
}

// replicasFor is what a metric's value alone asks of an HPA (AverageValue):
// ceil(value / target), before KEDA's min and max replica counts; saturated as toInt64
// saturates, for a backlog near the uint64 a QueueReport allows.
func replicasFor(value, target float64) int64 {
	return toInt64(math.Ceil(value / target))
}

// setError writes err's gRPC code name and message.
func setError(code, msg *string, err error) {
	st := status.Convert(err)
	*code, *msg = st.Code().String(), st.Message()
}

// effective renders t as the scaler understood it: every key it uses, with defaults.
func effective(t *Trigger) map[string]string {
	m := map[string]string{KeyStaleAfter: t.StaleAfter.String()}
	num := func(v float64) string { return strconv.FormatFloat(v, 'g', -1, 64) }
	if t.Queue != "" || t.Stream != "" {
		if t.Queue != "" {
			m[KeyQueue] = t.Queue
		} else {
			m[KeyStream], m[KeyConsumer] = t.Stream, t.Consumer
		}
		if t.TargetWait > 0 {
			m[KeyTargetWait] = t.TargetWait.String()
			m[KeyConcurrency] = strconv.Itoa(t.Concurrency)
			// Six figures: "0.3" as a quantity reads 0.30000000000000004 as a float.
			m[KeyScaleUpTolerance] = strconv.FormatFloat(t.ScaleUpTolerance, 'g', 6, 64)
			if t.ColdStart > 0 {
				m[KeyColdStart] = t.ColdStart.String()
			}
		} else {
			m[KeyQueueTarget] = num(t.QueueTarget)
		}
		m[KeyActivationQueueDepth] = num(t.ActivationQueueDepth)
		if !t.CapacityAware {
			m[KeyPushInterval] = t.PushInterval.String()
		}
	}
	if t.PodSelector != nil {
		m[KeyPodSelector] = t.PodSelector.String()
		if t.GPUUtilTarget > 0 {
			m[KeyGPUUtilTarget] = num(t.GPUUtilTarget)
		}
		if t.ActivateOnUtil {
			m[KeyActivationGPUUtil] = num(t.ActivationGPUUtil)
		}
		if t.GPUMemoryTarget > 0 {
			m[KeyGPUMemoryTarget] = num(t.GPUMemoryTarget)
		}
	}
	switch {
	case t.GPUProfile != "":
		m[KeyGPUsPerReplica] = t.GPUProfile
	case t.GPUsPerReplica > 0:
		m[KeyGPUsPerReplica] = strconv.Itoa(t.GPUsPerReplica)
	}
	if t.CapacityAware {
		m[KeyCapacityAware] = "true"
		m[KeyCapacityHeadroom] = strconv.Itoa(t.CapacityHeadroom)
		m[KeyMinReplicaCount] = strconv.Itoa(t.MinReplicaCount)
		if t.NodeSelector != nil {
			m[KeyNodeSelector] = t.NodeSelector.String()
		}
		if t.Tolerations != nil {
			m[KeyTolerations] = metadata.FormatTolerations(t.Tolerations)
		}
		if t.CPUPerReplica > 0 {
			m[KeyCPUPerReplica] = resource.NewMilliQuantity(t.CPUPerReplica, resource.DecimalSI).String()
		}
		if t.MemoryPerReplica > 0 {
			m[KeyMemoryPerReplica] = resource.NewQuantity(t.MemoryPerReplica, resource.BinarySI).String()
		}
	}
	return m
}

// queueStatus returns what the state holds of t's queue, only its name when nothing.
func (s *State) queueStatus(t *Trigger, now time.Time) *gpuscalerv1.QueueStatus {
	s.mu.RLock()
	defer s.mu.RUnlock()
	e := s.queues[queueKey{t.Namespace, t.Queue}]
	if e == nil {
		return &gpuscalerv1.QueueStatus{Namespace: t.Namespace, Queue: t.Queue}
	}
	return e.status(now, t.StaleAfter)
}

func clampInt64(v uint64) int64 {
	if v > math.MaxInt64 {
		return math.MaxInt64
	}
	return int64(v)
}

// Queues returns what every queue's producers last reported, by namespace and name, the
// sums over those live for staleAfter.
func (s *State) Queues(staleAfter time.Duration) []*gpuscalerv1.QueueStatus {
	now := s.now()
	s.mu.RLock()
	out := make([]*gpuscalerv1.QueueStatus, 0, len(s.queues))
	for _, e := range s.queues {
		out = append(out, e.status(now, staleAfter))
	}
	s.mu.RUnlock()
	slices.SortFunc(out, func(a, b *gpuscalerv1.QueueStatus) int {
		return cmp.Or(strings.Compare(a.Namespace, b.Namespace), strings.Compare(a.Queue, b.Queue))
	})
	return out
}

// Nodes returns the latest report of every live node, by name: its GPUs, the pods
// holding each, and its free devices.
func (s *State) Nodes() []*gpuscalerv1.NodeStatus {
	now := s.now()
	entries := s.entries(nil)
	out := make([]*gpuscalerv1.NodeStatus, 0, len(entries))
	for _, e := range entries {
		out = append(out, e.status(now, nil))
	}
	return out
}

// entries copies the live node entries, of namespace ns's pods only when ns is not nil,
// sorted by node name. Entries never change once applied, so they are read after the
// lock is released.
func (s *State) entries(ns *string) []*nodeEntry {
	s.mu.RLock()
	var out []*nodeEntry
	if ns == nil {
		out = make([]*nodeEntry, 0, len(s.nodes))
		for _, e := range s.nodes {
			out = append(out, e)
		}
	} else {
		for _, e := range s.byNamespace[*ns] {
			out = append(out, e)
		}
	}
	s.mu.RUnlock()
	slices.SortFunc(out, func(a, b *nodeEntry) int { return strings.Compare(a.report.GetNode(), b.report.GetNode()) })
	return out
}

// status renders e, with the holds keep keeps (every hold when keep is nil). With keep
// set, a GPU none of whose holds is kept is left out.
func (e *nodeEntry) status(now time.Time, keep func(*gpuView) bool) *gpuscalerv1.NodeStatus {
	n := &gpuscalerv1.NodeStatus{
		Node:     e.report.GetNode(),
		Source:   e.report.GetSource(),
		Stored:   timestamppb.New(e.stored),
		Age:      durationpb.New(now.Sub(e.stored)),
		GpuCount: int32(len(e.gpus)),
		Free:     make(map[string]int32, len(e.free)),
		Labels:   e.report.GetNodeLabels(),
		// Shared, not copied: the entry's report never changes once applied.
		Scheduling: e.report.GetScheduling(),
	}
	for profile, free := range e.free {
		n.Free[profile] = int32(free)
	}
	gpus := make([]*gpuscalerv1.GPUStatus, len(e.gpus))
	for i, g := range e.gpus {
		gpus[i] = &gpuscalerv1.GPUStatus{Device: g.id, Unhealthy: g.unhealthy}
	}
	for j, ns := range e.namespaces {
		for k := range e.nsGPUs[j] {
			v := &e.nsGPUs[j][k]
			if keep != nil && !keep(v) {
				continue
			}
			if v.unattributed {
				if keep != nil { // with keep nil, every unattributed device is listed below
					n.Unattributed = append(n.Unattributed, &gpuscalerv1.UnattributedStatus{
						Device: e.device(*v), Reason: e.unattributedReason(*v), Namespace: ns, Pod: v.pod,
					})
				}
				continue
			}
			h := &gpuscalerv1.GPUHold{Namespace: ns, Pod: v.pod, Share: v.share, LabelsUnknown: v.labelsUnknown}
			if v.hasUtil {
				h.Util = proto.Float64(v.util)
			}
			if v.hasMem {
				h.Memory = proto.Float64(v.memPct)
			}
			g := gpus[v.index]
			g.Holds = append(g.Holds, h)
		}
	}
	if keep == nil {
		// Every unattributed device, whoever holds it.
		for _, u := range e.report.GetUnattributed() {
			us := &gpuscalerv1.UnattributedStatus{Device: u.GetId(), Reason: u.GetReason()}
			if p := u.GetPod(); p != nil {
				us.Namespace, us.Pod = p.GetNamespace(), p.GetName()
			}
			n.Unattributed = append(n.Unattributed, us)
		}
	}
	for _, g := range gpus {
		if keep == nil || len(g.Holds) > 0 {
			slices.SortFunc(g.Holds, func(a, b *gpuscalerv1.GPUHold) int {
				return cmp.Or(strings.Compare(a.Namespace, b.Namespace), strings.Compare(a.Pod, b.Pod))
			})
			n.Gpus = append(n.Gpus, g)
		}
	}
	return n
}

// explainGPUs returns the nodes holding GPUs of the pods t's podSelector selects, or
// cannot tell whether it selects, each with those GPUs only; and how many pods of the
// namespace hold GPUs at all.
func (s *State) explainGPUs(t *Trigger, now time.Time) (nodes []*gpuscalerv1.NodeStatus, nsPods int32) {
	keep := func(v *gpuView) bool { return v.selectedBy(t.PodSelector) }
	for _, e := range s.entries(&t.Namespace) {
		views := e.gpusOf(t.Namespace)
		var pods []string
		selected := false
		for k := range views {
			if !slices.Contains(pods, views[k].pod) {
				pods = append(pods, views[k].pod)
			}
			selected = selected || keep(&views[k])
		}
		nsPods += int32(len(pods))
		if selected {
			n := e.status(now, keep)
			n.Stale = now.Sub(e.stored) > t.StaleAfter
			nodes = append(nodes, n)
		}
	}
	return nodes, nsPods
}

// explainCapacity returns what t's capacity count finds on each node its nodeSelector
// matches, as capacity counts it.
func (s *State) explainCapacity(t *Trigger, now time.Time) *gpuscalerv1.Capacity {
	c := &gpuscalerv1.Capacity{
		Headroom:        int32(t.CapacityHeadroom),
		GpusPerReplica:  int32(max(t.GPUsPerReplica, 1)),
		Profile:         t.GPUProfile,
		JobsFromPods:    t.PodSelector != nil,
		MinReplicaCount: int32(t.MinReplicaCount),
	}
	if t.GPUProfile != "" {
		c.GpusPerReplica = 0
	}
	if t.NodeSelector != nil {
		c.NodeSelector = t.NodeSelector.String()
	}
	for _, e := range s.entries(nil) {
		if t.NodeSelector != nil && !t.NodeSelector.Matches(labels.Set(e.report.GetNodeLabels())) {
			continue
		}
		n := slotsOn(t, e, now)
		nc := &gpuscalerv1.NodeCapacity{
			Node:              e.report.GetNode(),
			Free:              int32(n.free),
			Slots:             int32(n.slots),
			Age:               durationpb.New(now.Sub(e.stored)),
			Stale:             n.stale,
			Unplaceable:       n.blocked.String(),
			SchedulingUnknown: e.report.GetScheduling() == nil,
			GpuSlots:          int32(n.gpuSlots),
			LimitedBy:         n.limitedBy,
			ResourcesUnknown:  n.resourcesUnknown,
		}
		c.Slots += nc.Slots
		c.Nodes = append(c.Nodes, nc)
	}
	return c
}

// reasons says, in sentences an operator can act on, what made ex's answer and what
// would change it.
func reasons(ex *gpuscalerv1.Explanation, t *Trigger, r Reading) []string {
	var out []string
	add := func(format string, args ...any) { out = append(out, fmt.Sprintf(format, args...)) }
	if !ex.Ready {
		add("The scaler is restoring its state from NATS: KEDA gets Unavailable until it is ready, and keeps the workload as it is (or applies the ScaledObject's fallback).")
		return out
	}
	a := ex.Answer
	switch {
	case a.Active && t.GPUOnly():
		add("Active, always: a trigger with only podSelector never answers inactive while its pods can be judged. At zero replicas there are no GPUs to read, so it could never wake the workload again; KEDA therefore never scales this workload to zero, whatever the ScaledObject's other triggers say (as it refuses for cpu and memory triggers alone), and from zero brings it back to minReplicaCount or 1. To let it scale to zero and wake on work, add a queue, or a stream and consumer, to this trigger; a queue in a trigger of its own beside this one does not.")
	case a.Active:
		add("Active: KEDA scales the workload from zero to minReplicaCount (at least 1) and keeps it there while the trigger stays active.")
	case a.Error != "":
		add("IsActive fails (%s): KEDA neither scales to nor from zero on this trigger and, after fallback.failureThreshold failures, applies the ScaledObject's fallback if it has one; with fallback.replicas 0 that is a scale to zero.", a.ErrorCode)
	default:
		add("Inactive: KEDA scales the workload to zero (when minReplicaCount is 0) once the trigger has been inactive for cooldownPeriod.")
	}
	if q := ex.Queue; q != nil && r.queue.defined && r.queue.err == nil {
		backlog := float64(q.Backlog)
		if r.queue.active {
			add("The queue's backlog %s is above activationQueueDepth %s.", num(backlog), num(t.ActivationQueueDepth))
		} else {
			add("The queue's backlog %s is at or below activationQueueDepth %s: the queue alone does not activate the trigger.", num(backlog), num(t.ActivationQueueDepth))
		}
		if r.queue.demand {
			n := r.queue.need
			switch {
			case n.Backlog:
				add("queue-demand %.3g: no item has been seen to finish, so the service time is unknown, and the metric is the backlog over concurrency %d.",
					r.queue.value, t.Concurrency)
			default:
				add("queue-demand %.3g: replicas of %d slots for 99 in 100 items to start within targetWait %s, looking %s ahead (%s): %.3g serve %.3g arrivals a second of %.3g s each, %.3g start the %d waiting (see docs/triggers.md).",
					r.queue.value, t.Concurrency, t.TargetWait, n.Horizon, horizonWhy(n.Horizon), n.Serving, n.Rate, q.ServiceSeconds, n.Draining, q.Waiting)
				if n.Level && q.LevelWindowSeconds > demand.Window.Seconds() {
					add("The arrivals fluctuate about a steady level, %.3g a second over the last %s (the window their own minute counts set): the minute's %.3g a second is a fluctuation above it, which replicas would serve only after it passed and the HPA would then hold for its scale-down window, so the level is served.",
						q.ArrivalLevel, time.Duration(q.LevelWindowSeconds*float64(time.Second)).Round(time.Second), q.ArrivalRate)
				}
				if n.Rise > 0 {
					add("The arrivals are rising, %.3g a second more each minute: the serving replicas are for %.3g a second, the rate expected once replicas asked for now serve (the average lags a steady rise by its window's worth, and the horizon adds its own).",
						60*q.ArrivalTrend, n.Rate)
				}
				if n.Batched > 0 {
					add("Of those serving, %.3g are for items that arrive together (dispersion %.3g, the variance of the arrivals a producer counts in a report interval over their mean, over ten minutes): each finds its batch-mates ahead of it, and those the other slots do not start within targetWait need slots of their own.",
						n.Batched, q.ArrivalDispersion)
				}
				if n.Missed {
					add("The oldest waiting item has waited %s, targetWait or longer, with every slot busy: the metric is raised to %.3g, past the HPA's %.3g%% tolerance of the %.3g replicas serving, so that the HPA adds a replica rather than leave a queue standing.",
						time.Duration(q.OldestWaitSeconds*float64(time.Second)).Round(100*time.Millisecond), n.Replicas, 100*t.ScaleUpTolerance, float64(q.InFlight)/float64(t.Concurrency))
				} else if n.Replicas < n.Serving+n.Draining {
					add("That is capped at %.3g: a slot for every item in flight, waiting or expected over the horizon.", n.Most)
				}
			}
			add("%s", trafficSource(q))
			add("%s", coldStartReason(t, q.ColdStart))
			if cold := r.queue.coldStart.duration(); cold > t.TargetWait {
				add("targetWait %s is shorter than the cold start %s: it holds while replicas are up before the items come, which the metric's headroom is for; a wake from zero, or a burst beyond that headroom, waits a cold start whatever the metric.",
					t.TargetWait, cold.Round(time.Second))
			}
		}
	}
	if t.PodSelector != nil && r.hasGPU && r.gpuActiveErr == nil {
		var gpus float64
		for _, n := range ex.Nodes {
			for _, g := range n.Gpus {
				for _, h := range g.Holds {
					gpus += h.Share
				}
			}
		}
		switch {
		case len(ex.Nodes) == 0 && ex.NamespaceGpuPods > 0:
			add("podSelector %q selects none of the %d pods holding GPUs in namespace %s: check the selector against the workload's pod labels.", t.PodSelector.String(), ex.NamespaceGpuPods, t.Namespace)
		case len(ex.Nodes) == 0 && t.GPUOnly():
			add("No pod in namespace %s holds a GPU: a workload at zero replicas holds none. The trigger answers active all the same, so KEDA brings the workload back to one replica.", t.Namespace)
		case len(ex.Nodes) == 0:
			add("No pod in namespace %s holds a GPU: a workload at zero replicas holds none, so its GPU part is inactive and cannot wake it; the queue (or KEDA's minReplicaCount) must.", t.Namespace)
		case t.GPUOnly():
			add("The selected pods hold %s GPUs; gpu-util and gpu-memory move the workload between KEDA's floor of one replica and maxReplicaCount.", num(gpus))
		case t.ActivateOnUtil && r.gpuActive:
			add("The selected pods hold %s GPUs whose average utilisation is above activationGpuUtil %s.", num(gpus), num(t.ActivationGPUUtil))
		case t.ActivateOnUtil:
			add("The selected pods hold %s GPUs whose average utilisation is at or below activationGpuUtil %s: the GPU part is inactive.", num(gpus), num(t.ActivationGPUUtil))
		default:
			add("The selected pods hold %s GPUs: the GPU part is active while they hold any.", num(gpus))
		}
	}
	for _, m := range a.Metrics {
		if m.Error != "" {
			add("%s fails (%s): the HPA cannot compute it, and on this metric alone keeps the current replica count rather than guess; KEDA's fallback applies after fallback.failureThreshold failures.", m.Name, m.ErrorCode)
			continue
		}
		add("%s is %s against a target of %s per replica: on its own it asks the HPA for %d replicas, before KEDA's minReplicaCount and maxReplicaCount (a ScaledJob divides by the average target of its metrics instead).",
			m.Name, num(m.Value), num(m.Target), m.Replicas)
	}
	if most, failed := mostReplicas(a.Metrics); len(a.Metrics) > 1 && failed == 0 {
		add("With %d metrics, the HPA of a ScaledObject takes the one that asks for the most replicas: %d.", len(a.Metrics), most)
	} else if failed > 0 && failed < len(a.Metrics) {
		add("%d of %d metrics fail: the HPA may still scale up on the others (to %d here), but does not scale down while any fails (computeReplicasForMetrics in kube-controller-manager).", failed, len(a.Metrics), most)
	}
	if c := ex.Capacity; c != nil {
		unplaceableReasons(c, add)
	}
	if c := ex.Capacity; c != nil && c.Backlog > c.Capped {
		counted := fmt.Sprintf("the %s items in flight over queueTarget %s, rounded up", num(r.queue.running), num(t.QueueTarget))
		if c.JobsFromPods {
			counted = fmt.Sprintf("the pods podSelector %q selects that hold devices", t.PodSelector.String())
		}
		add("capacityAware capped the backlog from %s to %s items: %d Jobs running (%s), plus the %d more free devices take on the nodes nodeSelector matches, plus capacityHeadroom %d, less minReplicaCount %d, so no Job is created that would wait Pending for a GPU.",
			num(c.Backlog), num(c.Capped), c.RunningJobs, counted, c.Slots, c.Headroom, c.MinReplicaCount)
		if !c.JobsFromPods {
			add("Without podSelector, a Job that holds its GPUs without an item (loading its model, or finishing after its item) is not counted as running, though KEDA subtracts it and its GPUs are not free: the cap is a Job lower for each until it takes an item. Set podSelector to the Jobs' pods (scaledjob.keda.sh/name=<the ScaledJob's name>) to count them.")
		}
	}
	if t.CapacityAware {
		add("minReplicaCount %d must be the ScaledJob's spec.minReplicaCount, which the scaler cannot see: KEDA never subtracts that many unfinished Jobs, so with too low a value here it creates a Job beyond what fits for each busy standby Job.", t.MinReplicaCount)
	}
	return out
}

// unplaceableReasons says which nodes' free devices capacity left out because the
// scheduler would place none of the trigger's Jobs there, which it counted without
// knowing (see placeable), which take fewer Jobs for their free CPU or memory, and which
// it counted on their devices alone as their CPU and memory are unknown (see slotsOn).
func unplaceableReasons(c *gpuscalerv1.Capacity, add func(string, ...any)) {
	unit := "GPUs"
	if c.GetProfile() != "" {
		unit = c.GetProfile() + " slices"
	}
	var out, unknown, limited, resUnknown []string
	for _, n := range c.GetNodes() {
		if n.GetStale() || n.GetFree() == 0 {
			continue
		}
		if n.GetUnplaceable() != "" {
			out = append(out, fmt.Sprintf("%s: %s, %d free %s not counted", n.GetNode(), n.GetUnplaceable(), n.GetFree(), unit))
			continue
		}
		if n.GetSchedulingUnknown() {
			unknown = append(unknown, fmt.Sprintf("%s: %d free %s counted", n.GetNode(), n.GetFree(), unit))
		}
		switch {
		case n.GetLimitedBy() != "":
			limited = append(limited, fmt.Sprintf("%s: %s for %d of %d Jobs its free %s take", n.GetNode(), n.GetLimitedBy(), n.GetSlots(), n.GetGpuSlots(), unit))
		case n.GetResourcesUnknown():
			resUnknown = append(resUnknown, fmt.Sprintf("%s: %d free %s counted", n.GetNode(), n.GetFree(), unit))
		}
	}
	if len(out) > 0 {
		add("Left out of capacity, as the scheduler would place none of this trigger's Jobs there: %s. A Job tolerating a taint counts its node through the tolerations key; node.kubernetes.io/unschedulable:NoSchedule tolerates a cordon.",
			firstNodes(out))
	}
	if len(unknown) > 0 {
		add("Counted without knowing whether the scheduler would place the Jobs there, as the collector did not report whether the node is cordoned or tainted (no API access to its Node, or a collector older than this scaler): %s.",
			firstNodes(unknown))
	}
	if len(limited) > 0 {
		add("Counted for fewer Jobs than their free %s take, as the scheduler places a Job only where the node's allocatable CPU and memory, less what its pods request, cover cpuPerReplica and memoryPerReplica: %s.",
			unit, firstNodes(limited))
	}
	if len(resUnknown) > 0 {
		add("Counted on their free %s alone, as the collector did not report the node's CPU and memory (no API access to its Node or pods, or a collector older than this scaler): %s.",
			unit, firstNodes(resUnknown))
	}
}

// firstNodes joins what is said of the first 10 nodes, and counts the rest.
func firstNodes(items []string) string {
	const most = 10
	if len(items) <= most {
		return strings.Join(items, "; ")
	}
	return fmt.Sprintf("%s; and %d nodes more", strings.Join(items[:most], "; "), len(items)-most)
}

// mostReplicas returns the most replicas the metrics that answer ask for, and how many
// fail.
func mostReplicas(ms []*gpuscalerv1.MetricAnswer) (most int64, failed int) {
	for _, m := range ms {
		if m.Error != "" {
			failed++
			continue
		}
		most = max(most, m.Replicas)
	}
	return most, failed
}

func num(v float64) string { return strconv.FormatFloat(v, 'f', -1, 64) }

// horizonWhy says where queue-demand's horizon comes from.
func horizonWhy(h time.Duration) string {
	if h == demand.Window {
		return "a minute, at least"
	}
	return fmt.Sprintf("the cold start and the HPA's %s sync", demand.HPASync)
}

// trafficSource says where a queue's arrival rate and service time come from: measured
// by its producers, the same figures on every scaler replica, or estimated by this
// replica from the differences between their reports since it started.
func trafficSource(q *gpuscalerv1.QueueStatus) string {
	live := 0
	for _, p := range q.GetProducers() {
		if !p.GetStopped() && !p.GetStale() {
			live++
		}
	}
	switch m := int(q.GetMeasuringProducers()); {
	case m > 0 && m == live:
		return "Its arrival rate and service time are measured by its producers: every scaler replica reads the same."
	case m > 0:
		return fmt.Sprintf("Its arrival rate and service time are measured by %d of its %d live producers; for the others they are estimated from differences between reports (a producer that does not measure), since this scaler replica started.", m, live)
	default:
		return "Its arrival rate and service time are estimated from differences between reports (a producer that does not measure), since this scaler replica started."
	}
}
