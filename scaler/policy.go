package scaler

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	gpuscalerv1 "github.com/gpuscaler/gpuscaler/proto/gpuscaler/v1"
	"github.com/gpuscaler/gpuscaler/scaler/demand"
	"github.com/gpuscaler/gpuscaler/scaler/metadata"
)

// nodesFresh fails with ErrUnavailable, its message begun with what, when no node has
// reported within t's staleAfter: the collectors, or the scaler's view of NATS, are
// down. s.mu must be held.
func (s *State) nodesFresh(t *Trigger, now time.Time, what string) error {
	switch {
	case len(s.nodes) == 0:
		return fmt.Errorf("%w: %sno node report since this scaler started at %s; are the collectors running and publishing to NATS?",
			ErrUnavailable, what, stamp(s.started))
	case now.Sub(s.newestNode) > t.StaleAfter:
		return fmt.Errorf("%w: %sno node has reported since %s, %s ago, longer than staleAfter %s; are the collectors running?",
			ErrUnavailable, what, stamp(s.newestNode), now.Sub(s.newestNode).Round(time.Second), t.StaleAfter)
	}
	return nil
}

// readQueue reads the backlog of t's queue. s.mu must be held.
func (s *State) readQueue(t *Trigger, now time.Time) metricReading {
	m := metricReading{defined: true}
	e := s.queues[queueKey{t.Namespace, t.Queue}]
	if e == nil && s.atQueueLimit(t.Namespace) {
		m.err = fmt.Errorf("%w: no report for queue %s/%s: namespace %s has %d queues, as many as the scaler's --max-queues-per-namespace allows, and reports of new ones are dropped",
			ErrUnavailable, t.Namespace, t.Queue, t.Namespace, s.queuesPerNS[t.Namespace])
		return m
	}
	if e == nil {
		m.err = fmt.Errorf("%w: no report for queue %s/%s since this scaler started at %s; is its producer running and publishing to NATS?",
			ErrUnavailable, t.Namespace, t.Queue, stamp(s.started))
		return m
	}
	q := e.sum(now, t.StaleAfter)
	if q.live == 0 {
		m.err = e.unavailable(now, t.StaleAfter)
		return m
	}
	m.value = q.waiting + q.inFlight
	m.running = q.inFlight
	m.active = m.value > t.ActivationQueueDepth // on the backlog, whatever the metric
	if t.TargetWait > 0 {
		m.demand = true
		m.coldStart = triggerColdStart(t, q)
		m.demandIn = demand.Inputs{Traffic: q.demand, Concurrency: t.Concurrency, TargetWait: t.TargetWait, ColdStart: m.coldStart.duration(), Waiting: q.waiting, InFlight: m.running, OldestWait: q.oldestWait, Tolerance: t.ScaleUpTolerance}
		m.need = demand.Demand(m.demandIn)
		m.value = m.need.Replicas
	}
	return m
}

// capQueue caps a queue's backlog, for a capacityAware trigger, at what the cluster can
// place now: the backlog, in items, at which KEDA wants as many Jobs as are running, plus
// those free GPUs can take, plus the headroom (see capBacklog), all less the ScaledJob's
// minReplicaCount (see standby). The activation decision stays on the whole backlog
// while capacity is known: the queue has work either way.
//
// When capacity is unknown (no node has reported within staleAfter) the backlog fails
// with ErrUnavailable, and with it the activation decision (Reading.Active fails when the
// queue, its one part, fails). KEDA asks a ScaledJob's trigger for its metric first and
// drops a trigger that errors from the poll without asking IsActive
// (GetMetricsAndActivity, pkg/scalers/external_scaler.go; getScaledJobMetrics,
// pkg/scaling/scale_handler.go): it creates no Job for it, leaves the Jobs it made
// running, and marks the ScaledJob's Ready condition with the error. Uncapped, the
// backlog would create Jobs to sit Pending; a 0 would stop the work in silence; and an
// IsActive of true beside the error would tell whoever asks it alone (an older KEDA, a
// ScaledObject) to scale on a count nobody has.
func (s *State) capQueue(t *Trigger, m *metricReading) {
	if !m.defined || m.err != nil {
		return
	}
	// The Jobs' pods are read before the free devices and again after, and the fewer
	// running Jobs taken: a node report applied between the reads can show a new Job's
	// GPUs neither held nor free (the first read: a Job too few, for one poll), or a
	// finished Job's GPUs both held and free (the second read leaves it out), never a Job
	// counted twice (a Job too many, Pending).
	running, err := s.runningJobsOf(t, m)
	if err != nil {
		m.value, m.err = 0, err
		return
	}
	slots, err := s.capacity(t)
	if err != nil {
		m.value, m.err = 0, err
		return
	}
	if again, err := s.runningJobsOf(t, m); err == nil {
		running = min(running, again)
	}
	jobs := running + slots + t.CapacityHeadroom
	m.value = max(0, min(standby(t, m.value), capBacklog(t.QueueTarget, jobs-t.MinReplicaCount)))
}

// runningJobsOf returns the running Jobs the cap counts for t, whose queue m is: the
// Jobs' pods holding devices when t has a podSelector, else the items in flight over
// queueTarget, rounded up.
func (s *State) runningJobsOf(t *Trigger, m *metricReading) (int, error) {
	if t.PodSelector != nil {
		return s.jobsHoldingDevices(t)
	}
	return runningJobs(t.QueueTarget, m.running), nil
}

// jobsHoldingDevices counts the running Jobs of a capacityAware trigger from its
// podSelector, which selects the Jobs' pods: the selected pods holding devices, one pod
// per Job. A Job holding its GPUs without an item (loading its model, or finishing after
// acking it) is counted, as KEDA counts it unfinished and its GPUs are not free; counted
// from the items in flight it would be subtracted twice, and free GPUs would go unused
// until it took an item. A Job whose pod the collector has not yet reported holding
// GPUs is missing here, but its GPUs still show free, so the sum with the free slots
// holds. It fails as a GPU metric fails: a node holding a selected pod gone silent, a
// pod or device the collector could not describe, the pods' node forgotten.
func (s *State) jobsHoldingDevices(t *Trigger) (int, error) {
	now := s.now()
	key := selKey{t.Namespace, t.PodSelector.String()}
	s.mu.RLock()
	sel := s.selections[key]
	err := s.podsKnown("the running Jobs are counted from their pods, and ")
	s.mu.RUnlock()
	if err != nil {
		return 0, err
	}
	if sel == nil {
		sel = s.selectionFor(t.Namespace, t.PodSelector, key)
	}
	sum := s.sumGPUs(t, sel, now)
	var r Reading
	s.judgeGPUs(t, now, sum, &r) // t has no utilisation activation: only the failures above
	if r.gpuActiveErr != nil {
		return 0, r.gpuActiveErr
	}
	return sum.pods, nil
}

// standby returns backlog less the items the ScaledJob's minReplicaCount standby Jobs
// hold or will take, queueTarget each. KEDA hands its scaling strategy the unfinished
// Jobs less minReplicaCount (pkg/scaling/executor/scale_jobs.go, getScalingDecision), so
// under the default strategy it creates ⌈value/queueTarget⌉ − (unfinished −
// minReplicaCount) Jobs: the standby Jobs are never subtracted. Busy, their items are in
// the backlog; idle, they will take the next ones. Either way the value must leave them
// out, or KEDA creates a Job for each of them again: Pending, where the cap is what
// stopped the rest.
func standby(t *Trigger, backlog float64) float64 {
	if t.MinReplicaCount == 0 {
		return backlog
	}
	return (thousandths(backlog) - float64(t.MinReplicaCount)*thousandths(t.QueueTarget)) / 1000
}

// runningJobs returns the Jobs working on running items: ⌈running/target⌉. KEDA made one
// Job per target items, rounding up, and a Job with a part batch holds its GPUs as a full
// one does. Rounding down would leave it out, and since KEDA subtracts every Job not
// finished, it would create one Job fewer than the free GPUs take. Rounding up errs only
// where Jobs take more than target items each, which is not how KEDA sizes them. The
// target is taken in thousandths, as KEDA sees it (see capBacklog).
func runningJobs(target, running float64) int {
	return int(math.Ceil(running * 1000 / thousandths(target)))
}

// capBacklog returns the backlog, in items, at which a ScaledJob with queueTarget target
// wants jobs Jobs. KEDA divides a ScaledJob's value by its target and rounds up to a
// number of Jobs (pkg/scaling/scaledjob/metrics.go), then, under the default scaling
// strategy, creates that many less the Jobs not finished yet beyond minReplicaCount
// (pkg/scaling/executor/scale_jobs.go). The cap must be in items, as the backlog is: a
// count of Jobs compared with items would let a queueTarget of 4 create a quarter of the
// Jobs the GPUs can take, and one of 0.5 twice as many.
//
// KEDA sees the value and the target as quantities printed to three decimals
// (pkg/scalers/scaler.go, quantityFromFloat64) and divides them in floating point, so
// the maths is done in those thousandths. A whole target divides a whole value exactly.
// A fractional one need not: a value of exactly n targets can come out a hair above n
// and round up to a Job too many (for a target of 0.003, about one n in fifteen), so the
// cap is then one thousandth of an item less, which still divides to more than n-1 for
// any target of 0.002 or more. For a target of 0.001, where a thousandth is a whole Job,
// it stays exact.
func capBacklog(target float64, jobs int) float64 {
	if jobs <= 0 {
		return 0
	}
	perJob := thousandths(target)
	capped := float64(jobs) * perJob
	if math.Mod(perJob, 1000) != 0 && perJob >= 2 {
		capped--
	}
	return capped / 1000
}

// thousandths returns v in thousandths, rounded as KEDA prints a quantity: %.3f.
func thousandths(v float64) float64 {
	f, _ := strconv.ParseFloat(strconv.FormatFloat(v, 'f', 3, 64), 64)
	return math.Round(f * 1000)
}

// capacity counts the replicas of t that free devices can take now: on each node that
// reported within staleAfter, matches t's nodeSelector and would take t's Jobs (see
// placeable), its free devices of t's MIG profile, or its free whole GPUs divided by
// gpusPerReplica (rounded down per node: a replica cannot span nodes). Nodes silent
// longer are counted as full, and so are nodes the scheduler would place no Job on. It
// walks the nodes of t's pool (see nodePool) without holding the state's lock.
func (s *State) capacity(t *Trigger) (int, error) {
	now := s.now()
	key := ""
	if t.NodeSelector != nil {
		key = t.NodeSelector.String()
	}
	s.mu.RLock()
	err := s.nodesFresh(t, now, "capacity unknown: ")
	pool := s.pools[key]
	s.mu.RUnlock()
	if err != nil {
		return 0, err
	}
	if pool == nil {
		pool = s.poolFor(key, t.NodeSelector)
	}
	pool.lastRead.Store(now.UnixNano())
	slots := 0
	for _, slot := range pool.nodes.load() {
		slots += slotsOn(t, slot.v.Load(), now).slots
	}
	return slots, nil
}

// nodeSlots is what capacity finds on one node for a trigger (see slotsOn).
type nodeSlots struct {
	// free counts the free devices of the trigger's kind (its MIG profile's, or whole
	// GPUs); gpuSlots the replicas they take; slots the replicas the node takes, its
	// CPU and memory counted.
	free, gpuSlots, slots int
	// stale: the node has been silent longer than staleAfter.
	stale bool
	// blocked says why the scheduler would place none of the Jobs there.
	blocked blocker
	// limitedBy names what of the node's free CPU and memory takes fewer replicas than
	// its devices: "CPU", "memory" or "CPU and memory"; empty when nothing does.
	limitedBy string
	// resourcesUnknown: the trigger gives cpuPerReplica or memoryPerReplica and the
	// node did not report its CPU and memory, so it is counted on its devices alone.
	resourcesUnknown bool
}

// slotsOn returns what e gives t: its free devices of t's kind and the replicas of t
// they can take (for whole GPUs, free divided by gpusPerReplica rounded down, as a
// replica cannot span nodes), no more than its free CPU and memory take (see fits). A
// node silent longer than t's staleAfter is stale and takes none: it counts as full.
// So does a node the scheduler would place none of t's Jobs on; blocked then says why
// (see placeable).
func slotsOn(t *Trigger, e *nodeEntry, now time.Time) nodeSlots {
	n := nodeSlots{free: e.free[t.GPUProfile]}
	if now.Sub(e.stored) > t.StaleAfter {
		n.stale = true
		return n
	}
	if n.blocked = e.placeable(t); n.blocked.blocks() {
		return n
	}
	n.gpuSlots = n.free
	if t.GPUProfile == "" {
		n.gpuSlots = n.free / max(t.GPUsPerReplica, 1)
	}
	n.slots = n.gpuSlots
	if t.CPUPerReplica == 0 && t.MemoryPerReplica == 0 {
		return n
	}
	res := e.report.GetResources()
	if res == nil {
		n.resourcesUnknown = true
		return n
	}
	var by []string
	for _, r := range []struct {
		name       string
		alloc, req uint64
		perReplica int64
	}{
		{"CPU", res.GetCpuAllocatableMillis(), res.GetCpuRequestedMillis(), t.CPUPerReplica},
		{"memory", res.GetMemoryAllocatableBytes(), res.GetMemoryRequestedBytes(), t.MemoryPerReplica},
	} {
		if r.perReplica == 0 {
			continue
		}
		if f := fits(r.alloc, r.req, r.perReplica); f < n.gpuSlots {
			by = append(by, r.name)
			n.slots = min(n.slots, f)
		}
	}
	n.limitedBy = strings.Join(by, " and ")
	return n
}

// fits returns how many replicas requesting perReplica each fit in allocatable less
// requested, as the scheduler's NodeResourcesFit filter admits a pod only where its
// request is within what the node's bound pods leave (kubernetes
// pkg/scheduler/framework/plugins/noderesources/fit.go, fitsRequest). Requests beyond
// allocatable leave none. Both are bounded by the report's validation (under 2^50), so
// the quotient fits an int.
func fits(allocatable, requested uint64, perReplica int64) int {
	if requested >= allocatable || perReplica <= 0 {
		return 0
	}
	return int((allocatable - requested) / uint64(perReplica))
}

// blocker is what keeps a trigger's Jobs off a node: its cordon, or a taint they do not
// tolerate. The zero blocker blocks nothing.
type blocker struct {
	cordoned bool
	taint    *gpuscalerv1.Taint
}

func (b blocker) blocks() bool { return b.cordoned || b.taint != nil }

// String says why, for explain: "cordoned", "tainted key=value:Effect".
func (b blocker) String() string {
	switch {
	case b.cordoned:
		return "cordoned"
	case b.taint != nil:
		kv := b.taint.GetKey()
		if v := b.taint.GetValue(); v != "" {
			kv += "=" + v
		}
		return "tainted " + kv + ":" + b.taint.GetEffect()
	}
	return ""
}

// taintUnschedulable is the taint a pod must tolerate to be placed on a cordoned node
// (k8s.io/api core/v1 well_known_taints.go, TaintNodeUnschedulable).
var taintUnschedulable = metadata.Taint{Key: "node.kubernetes.io/unschedulable", Effect: gpuscalerv1.TaintNoSchedule}

// placeable says what, if anything, keeps the scheduler from placing t's Jobs on e, as
// its filters decide (kubernetes pkg/scheduler/framework/plugins):
//   - NodeUnschedulable: a cordoned node (spec.unschedulable, as kubectl cordon and drain
//     set it) takes a pod only if it tolerates node.kubernetes.io/unschedulable:NoSchedule;
//   - TaintToleration: a pod must tolerate every NoSchedule and NoExecute taint, the
//     cluster autoscaler's ToBeDeletedByClusterAutoscaler on a node it removes included.
//
// t's Jobs tolerate what t's tolerations key says, and the NoSchedule taint named after
// the resource they ask for (nvidia.com/gpu, nvidia.com/mig-1g.10gb): the
// ExtendedResourceToleration admission plugin gives every pod that asks for an extended
// resource that toleration (plugin/pkg/admission/extendedresourcetoleration), GKE
// enables it for its GPU pools' nvidia.com/gpu taint, and elsewhere a GPU Job on a pool
// tainted so carries it by hand or runs nowhere. A node whose collector did not report
// its scheduling state (no API access, or a collector older than the field) blocks
// nothing: it counts as it did before.
func (e *nodeEntry) placeable(t *Trigger) blocker {
	s := e.report.GetScheduling()
	if s == nil {
		return blocker{}
	}
	if s.GetUnschedulable() && !e.tolerates(t, taintUnschedulable) {
		return blocker{cordoned: true}
	}
	for _, taint := range s.GetTaints() {
		if !e.tolerates(t, metadata.Taint{Key: taint.GetKey(), Value: taint.GetValue(), Effect: taint.GetEffect()}) {
			return blocker{taint: taint}
		}
	}
	return blocker{}
}

// tolerates reports whether t's Jobs tolerate taint on e.
func (e *nodeEntry) tolerates(t *Trigger, taint metadata.Taint) bool {
	for _, tol := range t.Tolerations {
		if tol.Tolerates(taint) {
			return true
		}
	}
	if taint.Effect != gpuscalerv1.TaintNoSchedule {
		return false
	}
	for _, pr := range e.resources {
		if pr.profile == t.GPUProfile && pr.resource == taint.Key {
			return true
		}
	}
	return false
}

// judgeGPUs turns the sums into t's GPU metrics and activity, or the error that stands
// for them.
func (s *State) judgeGPUs(t *Trigger, now time.Time, sum gpuSums, r *Reading) {
	fail := r.failGPU
	gpus, pods, utilSum, memSum := sum.gpus, sum.pods, sum.util, sum.mem
	stale, unknown, noUtil, noMem := sum.stale, sum.unknown, sum.noUtil, sum.noMem
	if e, v := stale.e, stale.v; e != nil {
		fail(fmt.Errorf("%w: node %s last reported at %s, %s ago, longer than staleAfter %s, and then held GPU %s of pod %s/%s, which podSelector %q selects",
			ErrUnavailable, e.report.GetNode(), stamp(e.stored), now.Sub(e.stored).Round(time.Second), t.StaleAfter,
			e.device(v), t.Namespace, v.pod, t.PodSelector.String()))
		return
	}
	if e, v := unknown.e, unknown.v; e != nil {
		if v.unattributed {
			fail(fmt.Errorf("%w: pod %s/%s on node %s holds device %s, which its collector could not match to a GPU (%s), so its GPU readings are unknown",
				ErrUnavailable, t.Namespace, v.pod, e.report.GetNode(), e.device(v), e.unattributedReason(v)))
		} else {
			fail(fmt.Errorf("%w: pod %s/%s on node %s holds GPU %s, but its collector could not read the pod's labels (no API access, or its pod informer not yet synced), so podSelector %q cannot tell whether it selects it",
				ErrUnavailable, t.Namespace, v.pod, e.report.GetNode(), e.device(v), t.PodSelector.String()))
		}
		return
	}
	if pods == 0 {
		s.mu.RLock()
		err := s.tombstoned(t)
		s.mu.RUnlock()
		if err != nil {
			fail(err)
			return
		}
	}
	var utilErr, memErr error
	if e, v := noUtil.e, noUtil.v; e != nil {
		why := fmt.Sprintf("its collector's source (%s) cannot measure it", e.report.GetSource())
		if u := e.unhealthy(v); u != "" {
			why = "the GPU is unhealthy: " + u
		}
		utilErr = fmt.Errorf("%w: GPU %s on node %s (pod %s/%s) reports no utilisation; %s",
			ErrUnavailable, e.device(v), e.report.GetNode(), t.Namespace, v.pod, why)
	}
	if e, v := noMem.e, noMem.v; e != nil {
		why := ""
		if u := e.unhealthy(v); u != "" {
			why = "; the GPU is unhealthy: " + u
		}
		memErr = fmt.Errorf("%w: GPU %s on node %s (pod %s/%s) reports no framebuffer use and size%s",
			ErrUnavailable, e.device(v), e.report.GetNode(), t.Namespace, v.pod, why)
	}

	perReplica := float64(t.GPUsPerReplica)
	if perReplica == 0 {
		perReplica = 1
		if pods > 0 {
			perReplica = gpus / float64(pods)
		}
	}
	r.gpuUtil.value, r.gpuUtil.err = utilSum/perReplica, utilErr
	r.gpuMemory.value, r.gpuMemory.err = memSum/perReplica, memErr
	if t.ActivateOnUtil {
		r.gpuActiveErr = utilErr
		r.gpuActive = utilErr == nil && gpus > 0 && utilSum/gpus > t.ActivationGPUUtil
	} else {
		r.gpuActive = gpus > 0
	}
	if utilErr != nil {
		r.gpuUtil.value = 0
	}
	if memErr != nil {
		r.gpuMemory.value = 0
	}
}

// tombstoned fails with ErrUnavailable when a forgotten node's last report had a pod that
// t's podSelector selects: t then selects no live pod, and reading the forgotten pods'
// absence as an idle workload would be a silent zero. s.mu must be held.
func (s *State) tombstoned(t *Trigger) error {
	var found culprit
	for _, e := range s.tombsByNS[t.Namespace] {
		for _, v := range e.gpusOf(t.Namespace) {
			if v.selectedBy(t.PodSelector) {
				found.consider(e, v)
				break
			}
		}
	}
	e, v := found.e, found.v
	if e == nil {
		return nil
	}
	return fmt.Errorf("%w: node %s last reported at %s and was forgotten at %s (the stream's max age), when it held GPU %s of pod %s/%s, which podSelector %q selects; no live pod is selected since. This clears when the node reports again, a selected pod reports from a live node, or %s after it was forgotten",
		ErrUnavailable, e.report.GetNode(), stamp(e.stored), stamp(e.forgotten), e.device(v), t.Namespace, v.pod, t.PodSelector.String(), s.tombstoneTTL)
}

// culprit remembers the GPU an error will name: the first by node name, then by its place
// in the report (measured devices before unattributed ones) and pod.
type culprit struct {
	e *nodeEntry
	v gpuView
}

func (c *culprit) consider(e *nodeEntry, v gpuView) {
	if c.e == nil || e.report.GetNode() < c.e.report.GetNode() || e == c.e && namedBefore(&v, &c.v) {
		c.e, c.v = e, v
	}
}

// namedBefore reports whether an error names a before b, two views of one node: measured
// devices before unattributed ones, then by place in the report, then by pod.
func namedBefore(a, b *gpuView) bool {
	switch {
	case a.unattributed != b.unattributed:
		return !a.unattributed
	case a.index != b.index:
		return a.index < b.index
	}
	return a.pod < b.pod
}

// stamp formats a time for error messages: UTC, to the second.
func stamp(t time.Time) string {
	return t.UTC().Format(time.RFC3339)
}
