package scaler

import (
	"cmp"
	"errors"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	gpuscalerv1 "github.com/gpuscaler/gpuscaler/proto/gpuscaler/v1"
)

// State is the scaler's picture of the cluster: the latest report of every node and every
// queue, and when NATS stored it. The NATS followers' shards apply events, each subject's
// on one shard, in order; any number read. Readers see each report whole: a report is replaced, never edited.
type State struct {
	now     func() time.Time
	started time.Time
	// applied counts the events applied, for throughput measurements.
	applied atomic.Uint64

	mu sync.RWMutex // guards every field below
	// nodes holds the latest report per node name.
	nodes map[string]*nodeEntry
	// byNamespace indexes nodes by the namespaces of the pods holding their GPUs, so a
	// podSelector trigger reads the few nodes that hold its namespace's pods.
	byNamespace map[string]map[string]*nodeEntry
	// newestNode is the newest stored time of any node report.
	newestNode time.Time
	gpus       int
	// queues holds the latest report of each producer per namespace/queue, and
	// queuesPerNS counts them by namespace: a namespace holding maxQueuesPerNS queues gets
	// no new one, and a queue with maxProducersPerQueue producers no new producer (zero
	// or less: no limit), so one tenant cannot grow the state without bound.
	queues               map[queueKey]*queueEntry
	queuesPerNS          map[string]int
	maxQueuesPerNS       int
	maxProducersPerQueue int
	// tombstones holds nodes forgotten (Forget) while their last report had pods holding
	// GPUs, by node name, and tombsByNS indexes them as byNamespace indexes nodes: a
	// trigger that selected those pods, and now selects no live pod, answers Unavailable
	// rather than reading their absence as an idle workload. A tombstone goes when its node
	// reports again, after tombstoneTTL, or, oldest first, past maxTombstones.
	tombstones    map[string]*nodeEntry
	tombsByNS     map[string]map[string]*nodeEntry
	tombstoneTTL  time.Duration
	maxTombstones int // defaultMaxTombstones; tests lower it
	// selections are what the podSelectors that triggers read select, kept up to date
	// as nodes report (see selection), by namespace and selector; selIndex finds those a
	// report may concern, by namespace. candidates is the applier's scratch space.
	selections map[selKey]*selection
	selIndex   map[string]*selectionIndex
	candidates []candidate
	// pools are the nodes capacityAware triggers count free GPUs on, by nodeSelector.
	pools map[string]*nodePool
	// queueWatch holds the watchers to wake on a queue's report. Node reports wake no one:
	// a workload at zero replicas holds no GPUs, so GPU activity can never be what wakes
	// it, and KEDA polls IsActive for everything else.
	queueWatch map[queueKey]map[*Watch]struct{}
	// onProducerLeft, when set, is told of every ProducerLeft, after s.mu is released.
	onProducerLeft func(ProducerLeft)
	// pods, when set, is what the Kubernetes API says of pods: a node's report is
	// believed only of the pods it places on that node (claims.go), and onDropped, when
	// set, is told of every pod dropped, after s.mu is released.
	pods      PodDirectory
	onDropped func(DroppedClaim)
}

type queueKey struct{ namespace, queue string }

type nodeEntry struct {
	// report is what the state keeps of the node's report: its name, source, labels and
	// unattributed devices. The GPU samples, pods and devices are kept only in the
	// compact forms below (gpus, nsGPUs, free), so a tracked GPU costs a few hundred
	// bytes rather than its whole decoded message.
	report *gpuscalerv1.NodeReport
	// gpus holds, in the report's order, what messages say of each GPU.
	gpus []gpuInfo
	// stored is when NATS stored the report: the one clock every scaler replica shares.
	stored time.Time
	// forgotten is when Forget dropped the node and kept it as a tombstone; zero for a
	// live node. Written under State.mu before the entry becomes a tombstone.
	forgotten time.Time
	// namespaces of the pods that hold the node's GPUs, without repeats, and for each the
	// GPUs its pods hold, flattened for reading: a read walks one array rather than
	// chasing pointers through protobuf messages scattered over the heap.
	namespaces []string
	nsGPUs     [][]gpuView
	// free counts the allocatable devices not allocated, by MIG profile ("" for whole GPUs).
	free map[string]int
	// resources are the resource names the node offers its devices under, by MIG
	// profile, renamed replicas left out: a Job asking for one tolerates its taint (see
	// placeable). Usually one.
	resources []profileResource
	// selections are those the node's pods take part in. Written under State.mu.
	selections []*selection
}

// gpuInfo is what an error message names of a GPU: its device id and, when unhealthy, why.
type gpuInfo struct{ id, unhealthy string }

// gpuView is what a podSelector trigger reads of one pod's hold on one device. A device
// held by several pods (shared by time-slicing, MPS or GKE sharing) gives each a view
// with its share of the device:
//   - share is the pod's part of the device in GPUs: 1 over the number of pods holding
//     it (1 for a device held by one pod);
//   - util is the pod's own utilisation where the collector measured every pod's
//     (PodRef.gpu_util), else the device's utilisation times share: a shared device's
//     figure split evenly among its pods;
//   - memPct is the device's framebuffer use times share.
//
// Summed over a trigger's pods, a device then counts once, whole, when the trigger
// selects all its pods, and in part when it shares the device with other workloads.
type gpuView struct {
	labels  podLabels // the pod's labels
	pod     string    // the pod's name
	share   float64   // GPUs this hold stands for, 0 < share <= 1
	util    float64   // utilisation in GPU-percent (percent times share); valid when hasUtil
	memPct  float64   // framebuffer used in GPU-percent; valid when hasMem
	hasUtil bool
	hasMem  bool
	// coldStart is the pod's cold start as its collector measured it, in seconds; 0 when
	// not measured (see coldStartOfPod).
	coldStart float64
	// labelsUnknown says the collector could not read the pod's labels: no podSelector
	// can tell whether it selects the pod.
	labelsUnknown bool
	// unattributed says the pod holds a device the collector could not match to a GPU:
	// the view stands for no GPU (share and readings are zero), and index is in
	// report.Unattributed rather than report.Gpus.
	unattributed bool
	// index is the device's place in the report, for messages: what a message needs of
	// it (id, health, reason) is read from there, keeping the view small, as every read
	// walks these views.
	index int32
}

// device returns the id of the device v stands for in e's report.
func (e *nodeEntry) device(v gpuView) string {
	if v.unattributed {
		return e.report.GetUnattributed()[v.index].GetId()
	}
	return e.gpus[v.index].id
}

// unattributedReason returns why v's device could not be matched to a GPU.
func (e *nodeEntry) unattributedReason(v gpuView) string {
	if r := e.report.GetUnattributed()[v.index].GetReason(); r != "" {
		return r
	}
	return "no reason given"
}

// unhealthy returns why v's GPU is unhealthy, "" when it is healthy.
func (e *nodeEntry) unhealthy(v gpuView) string {
	if v.unattributed {
		return ""
	}
	return e.gpus[v.index].unhealthy
}

// gpusOf returns the GPUs held by pods of namespace ns.
func (e *nodeEntry) gpusOf(ns string) []gpuView {
	for i, n := range e.namespaces {
		if n == ns {
			return e.nsGPUs[i]
		}
	}
	return nil
}

// NewState returns an empty State that tells time with now (time.Now when nil).
func NewState(now func() time.Time) *State {
	if now == nil {
		now = time.Now
	}
	return &State{
		now:         now,
		started:     now(),
		nodes:       make(map[string]*nodeEntry),
		byNamespace: make(map[string]map[string]*nodeEntry),
		tombstones:  make(map[string]*nodeEntry),
		tombsByNS:   make(map[string]map[string]*nodeEntry),
		queues:      make(map[queueKey]*queueEntry),
		queuesPerNS: make(map[string]int),
		queueWatch:  make(map[queueKey]map[*Watch]struct{}),
		selections:  make(map[selKey]*selection),
		selIndex:    make(map[string]*selectionIndex),
		pools:       make(map[string]*nodePool),
		// Set here, not by SetNodeTombstoneTTL, so a State made for a test or a bench
		// keeps the production default.
		tombstoneTTL:         DefaultNodeTombstoneTTL,
		maxTombstones:        defaultMaxTombstones,
		maxQueuesPerNS:       DefaultMaxQueuesPerNamespace,
		maxProducersPerQueue: DefaultMaxProducersPerQueue,
	}
}

// DefaultMaxQueuesPerNamespace bounds the queues the state tracks per namespace. Each
// costs well under a KiB here (and its last report in the stream); a namespace runs tens
// of queues, so the bound leaves two orders of magnitude for legitimate use while a
// tenant flooding its own namespace with made-up queue names stops at about 1 MiB.
const DefaultMaxQueuesPerNamespace = 1000

// ErrQueueLimit refuses a report for a queue the state does not track yet when its
// namespace already has as many queues as the limit allows.
var ErrQueueLimit = errors.New("queue limit of the namespace reached")

// SetMaxQueuesPerNamespace sets how many queues the state tracks per namespace; zero or
// less sets no limit. The default is DefaultMaxQueuesPerNamespace. Queues tracked already
// stay when a lower limit is set; new ones wait until Forget brings the namespace under it.
func (s *State) SetMaxQueuesPerNamespace(n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.maxQueuesPerNS = n
}

// atQueueLimit reports whether namespace ns may get no new queue. s.mu must be held.
func (s *State) atQueueLimit(ns string) bool {
	return s.maxQueuesPerNS > 0 && s.queuesPerNS[ns] >= s.maxQueuesPerNS
}

// NamespacesAtQueueLimit reports how many namespaces have as many queues as they may.
func (s *State) NamespacesAtQueueLimit() int {
	s.mu.RLock()
	defer s.mu.RUnlock()
	n := 0
	for ns := range s.queuesPerNS {
		if s.atQueueLimit(ns) {
			n++
		}
	}
	return n
}

// Apply records a decoded event that NATS stored at stored, replacing what was known of
// its node or queue, and wakes the watchers it may concern. It refuses, with
// ErrQueueLimit, a report of a new queue in a namespace at its limit of queues; the
// queues it tracks keep being updated.
func (s *State) Apply(ev gpuscalerv1.Event, stored time.Time) error {
	defer s.applied.Add(1)
	switch {
	case ev.Node != nil:
		s.applyNode(ev.Node, stored)
	case ev.Queue != nil:
		return s.applyQueue(ev.Queue, stored)
	}
	return nil
}

// applyNode keeps nothing of r, neither its messages nor its strings, so that r may be
// decoded into reused memory, its strings pointing into the message's bytes
// (gpuscalerv1.NodeDecoder): what the entry keeps is taken from prev, the node's
// previous entry, where it did not change, and copied where it did.
func (s *State) applyNode(r *gpuscalerv1.NodeReport, stored time.Time) {
	// One shard applies all of a node's reports, in order: prev stays its latest.
	s.mu.RLock()
	prev := s.nodes[r.GetNode()]
	claims := claimCheck{node: r.GetNode(), pods: s.pods}
	onDropped := s.onDropped
	s.mu.RUnlock()
	if claims.pods != nil {
		claims.synced = claims.pods.Synced()
	}
	e := &nodeEntry{report: keepReport(r, prev), stored: stored}
	if claims.synced {
		if res, ok := claims.pods.NodeResources(claims.node); ok {
			var was *gpuscalerv1.NodeResources
			if prev != nil {
				was = prev.report.GetResources()
			}
			e.report.Resources = keepResources(res, was)
		}
	}
	e.indexNamespaces(r, prev, &claims)
	e.countFree(r, prev)
	if onDropped != nil {
		for _, d := range claims.dropped {
			onDropped(d)
		}
	}
	name := e.report.GetNode()
	s.mu.Lock()
	defer s.mu.Unlock()
	old := s.nodes[name]
	// Index first, then unindex what is left of old: a namespace in both keeps its
	// place in the index, which is updated in place rather than deleted and added back.
	index(s.byNamespace, e)
	if old != nil {
		s.unindex(old)
	}
	if tomb := s.tombstones[name]; tomb != nil {
		s.bury(tomb)
	}
	s.nodes[name] = e
	s.gpus += len(e.gpus)
	s.updateSelections(old, e)
	s.updatePools(name, e)
	if stored.After(s.newestNode) {
		s.newestNode = stored
	}
}

// index adds e to a namespace index, in place of an older entry of its node.
func index(m map[string]map[string]*nodeEntry, e *nodeEntry) {
	name := e.report.GetNode()
	for _, ns := range e.namespaces {
		set := m[ns]
		if set == nil {
			set = make(map[string]*nodeEntry)
			m[ns] = set
		}
		set[name] = e
	}
}

// unindexFrom removes e from a namespace index where a newer entry of its node has not
// taken its place.
func unindexFrom(m map[string]map[string]*nodeEntry, e *nodeEntry) {
	name := e.report.GetNode()
	for _, ns := range e.namespaces {
		set := m[ns]
		if set[name] != e {
			continue
		}
		delete(set, name)
		if len(set) == 0 {
			delete(m, ns)
		}
	}
}

// unindex removes e from the namespace index and the GPU count. s.mu must be held.
func (s *State) unindex(e *nodeEntry) {
	s.gpus -= len(e.gpus)
	unindexFrom(s.byNamespace, e)
}

// bury drops a tombstone. s.mu must be held.
func (s *State) bury(tomb *nodeEntry) {
	delete(s.tombstones, tomb.report.GetNode())
	unindexFrom(s.tombsByNS, tomb)
}

// indexNamespaces groups the pods' holds on devices in report r by the pods' namespace:
// the devices matched to GPUs (see gpuView for a shared device's split) and those the
// collector could not match. It shares labels, pod names and device ids with prev, the
// node's previous entry, where they did not change: a node's pods change far more
// seldom than it reports. Only the pods claims believes count, with the labels it
// gives: a device's other pods are left out, as if the node had not named them.
func (e *nodeEntry) indexNamespaces(r *gpuscalerv1.NodeReport, prev *nodeEntry, claims *claimCheck) {
	last := -1 // the namespace added to last: a node's pods are mostly of one
	slot := func(ns string) int {
		if last >= 0 && e.namespaces[last] == ns {
			return last
		}
		if last = slices.Index(e.namespaces, ns); last < 0 {
			last = len(e.namespaces)
			var was string
			if prev != nil {
				if i := slices.Index(prev.namespaces, ns); i >= 0 {
					was = prev.namespaces[i]
				}
			}
			e.namespaces = append(e.namespaces, keep(ns, was))
			var views []gpuView
			if last == 0 { // room for every view in the first: most nodes hold one namespace
				views = make([]gpuView, 0, len(r.GetGpus())+len(r.GetUnattributed()))
			}
			e.nsGPUs = append(e.nsGPUs, views)
		}
		return last
	}
	// reuse returns the pod's name and labels as prev holds them when they did not
	// change, looking first at the view in the same place, where it almost always is.
	reuse := func(p *gpuscalerv1.PodRef, labels map[string]string, at int) (string, podLabels) {
		if prev != nil {
			views := prev.gpusOf(p.GetNamespace())
			if at < len(views) && views[at].pod == p.GetName() && views[at].labels.equal(labels) {
				return views[at].pod, views[at].labels
			}
			for _, v := range views {
				if v.pod == p.GetName() && v.labels.equal(labels) {
					return v.pod, v.labels
				}
			}
		}
		return strings.Clone(p.GetName()), newPodLabels(labels)
	}
	add := func(p *gpuscalerv1.PodRef, c claim, v gpuView) {
		j := slot(p.GetNamespace())
		v.pod, v.labels = reuse(p, c.labels, len(e.nsGPUs[j]))
		v.labelsUnknown = c.unknown
		e.nsGPUs[j] = append(e.nsGPUs[j], v)
	}
	var room [4]claim
	believed := room[:0] // the pods of one device claims believes; reused
	e.gpus = make([]gpuInfo, len(r.GetGpus()))
	for gi, g := range r.GetGpus() {
		var was gpuInfo
		if prev != nil && gi < len(prev.gpus) {
			was = prev.gpus[gi]
		}
		e.gpus[gi] = gpuInfo{id: keep(g.DeviceID(), was.id), unhealthy: keep(g.GetUnhealthy(), was.unhealthy)}
		believed = believed[:0]
		for i := range g.NumPods() {
			p := g.PodAt(i)
			if labels, unknown, ok := claims.check(p); ok {
				believed = append(believed, claim{p, labels, unknown})
			}
		}
		n := len(believed)
		if n == 0 {
			continue
		}
		share := 1 / float64(n)
		// A pod's own figure counts only on a shared device, and only when every pod of
		// the device has one: a partial split would pass for the whole device's use.
		own := g.GetShared()
		for i := 0; own && i < n; i++ {
			own = believed[i].pod.GpuUtil != nil
		}
		var memPct float64
		hasMem := g.FbUsedBytes != nil && g.GetFbTotalBytes() > 0
		if hasMem {
			memPct = 100 * float64(g.GetFbUsedBytes()) / float64(g.GetFbTotalBytes())
		}
		for _, c := range believed {
			p := c.pod
			v := gpuView{share: share, index: int32(gi)}
			switch {
			case own:
				v.util, v.hasUtil = p.GetGpuUtil(), true
			case g.GpuUtil != nil:
				v.util, v.hasUtil = g.GetGpuUtil()*share, true
			}
			if hasMem {
				v.memPct, v.hasMem = memPct*share, true
			}
			v.coldStart = coldStartOfPod(p)
			add(p, c, v)
		}
	}
	for ui, u := range r.GetUnattributed() {
		p := u.GetPod()
		labels, unknown, ok := claims.check(p)
		if !ok {
			// The device stays unattributed, held by no pod the node may name.
			e.report.Unattributed[ui].Pod = nil
			continue
		}
		add(p, claim{p, labels, unknown}, gpuView{unattributed: true, index: int32(ui)})
	}
}

// claim is a pod a report names that claimCheck believes, with the labels to match.
type claim struct {
	pod     *gpuscalerv1.PodRef
	labels  map[string]string
	unknown bool
}

// countFree counts the node's free devices by MIG profile: what a Job asking for
// nvidia.com/gpu or nvidia.com/mig-<profile> can be given. A device of an unhealthy GPU
// is never free: a replica placed there would not run. Replicas renamed by the device
// plugin's renameByDefault (nvidia.com/gpu.shared, nvidia.com/mig-<profile>.shared) are a
// resource of their own, which such a Job cannot use, so they are not counted; replicas
// offered under the plain name are, one each, as the scheduler hands them out.
func (e *nodeEntry) countFree(r *gpuscalerv1.NodeReport, prev *nodeEntry) {
	allocated := make(map[string]struct{}, len(r.GetAllocated()))
	for _, d := range r.GetAllocated() {
		allocated[d.GetId()] = struct{}{}
	}
	e.free = make(map[string]int, 1)
	e.keepResources(r, prev)
	for _, d := range r.GetAllocatable() {
		if _, taken := allocated[d.GetId()]; taken || d.GetUnhealthy() || d.RenamedReplica() {
			continue
		}
		p := d.Profile()
		if p != "" {
			// The key as kept, even when counted already: assigning to a map with an equal
			// string key stores the new key, which would point into the report.
			p = keepProfile(p, e.free, prev)
		}
		e.free[p]++
	}
}

// profileResource is a resource name a node offers devices of a MIG profile under.
type profileResource struct{ profile, resource string }

// keepResources sets e.resources from r's allocatable devices, prev's where they did not
// change.
func (e *nodeEntry) keepResources(r *gpuscalerv1.NodeReport, prev *nodeEntry) {
	var found [4]profileResource
	got := found[:0]
	for _, d := range r.GetAllocatable() {
		if d.RenamedReplica() {
			continue
		}
		pr := profileResource{d.Profile(), d.GetResource()}
		if !slices.Contains(got, pr) {
			got = append(got, pr)
		}
	}
	if prev != nil && slices.Equal(got, prev.resources) {
		e.resources = prev.resources
		return
	}
	e.resources = make([]profileResource, len(got))
	for i, pr := range got {
		e.resources[i] = profileResource{strings.Clone(pr.profile), strings.Clone(pr.resource)}
	}
}

// Defaults of the tombstones Forget keeps.
const (
	// DefaultNodeTombstoneTTL is how long a forgotten node's pods keep the triggers that
	// selected them, and select no live pod, Unavailable.
	DefaultNodeTombstoneTTL = time.Hour
	// defaultMaxTombstones bounds the forgotten nodes kept: each holds its last report, a few
	// KiB for 8 GPUs, so at most some tens of MiB.
	defaultMaxTombstones = 4096
)

// SetNodeTombstoneTTL sets how long Forget keeps a forgotten node's pods as tombstones;
// zero or less keeps none. The default is DefaultNodeTombstoneTTL.
func (s *State) SetNodeTombstoneTTL(ttl time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.tombstoneTTL = max(ttl, 0)
}

// Forget drops nodes and queues whose latest report NATS stored before cutoff (now less
// the stream's MaxAge). A node whose last report had pods holding GPUs is kept as a
// tombstone (see State.tombstones), forgotten as of its report's stored time plus
// MaxAge, and dropped the tombstone TTL after that. Both times derive from when NATS
// stored the report, not from when this replica ran Forget, and the stream keeps the
// report as long as the tombstone lasts: so a replica that restarts and replays the
// stream makes the same tombstones as one that ran all along. It returns how many live
// entries it dropped.
func (s *State) Forget(cutoff time.Time) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	maxAge := now.Sub(cutoff)
	for _, tomb := range s.tombstones {
		if !now.Before(tomb.forgotten.Add(s.tombstoneTTL)) {
			s.bury(tomb)
		}
	}
	n := 0
	for name, e := range s.nodes {
		if e.stored.Before(cutoff) {
			s.unindex(e)
			s.updateSelections(e, nil)
			s.updatePools(name, nil)
			delete(s.nodes, name)
			n++
			if e.forgotten = e.stored.Add(maxAge); len(e.namespaces) > 0 && now.Before(e.forgotten.Add(s.tombstoneTTL)) {
				s.tombstones[name] = e
				index(s.tombsByNS, e)
			}
		}
	}
	if extra := len(s.tombstones) - s.maxTombstones; extra > 0 {
		tombs := slices.Collect(maps.Values(s.tombstones))
		slices.SortFunc(tombs, func(a, b *nodeEntry) int {
			return cmp.Or(a.forgotten.Compare(b.forgotten), cmp.Compare(a.report.GetNode(), b.report.GetNode()))
		})
		for _, tomb := range tombs[:extra] {
			s.bury(tomb)
		}
	}
	if len(s.nodes) == 0 {
		s.newestNode = time.Time{}
	}
	s.dropIdleSelections(now.Add(-selectionIdleAfter))
	s.dropIdlePools(now.Add(-selectionIdleAfter))
	return n + s.forgetQueues(cutoff)
}

// Applied returns how many events have been applied since the State was made.
func (s *State) Applied() uint64 { return s.applied.Load() }

// Tombstones reports how many forgotten nodes are kept as tombstones.
func (s *State) Tombstones() int {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return len(s.tombstones)
}

// Size reports how many nodes, GPU samples and queues the state holds.
func (s *State) Size() (nodes, gpus, queues int) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return len(s.nodes), s.gpus, len(s.queues)
}

// Watch is a registration for wake-ups when reports arrive that may change a trigger's
// activation: QueueReports of its queue (State), or news of its JetStream consumer
// (workQueues). C receives at most one pending signal: wake-ups that come while one is
// pending merge into it, so a slow reader costs the writer nothing.
type Watch struct {
	// C is signalled after a report that may change the trigger's backlog was applied.
	C <-chan struct{}
	c chan struct{}
	// activationDepth is the trigger's activationQueueDepth; sawInactive records that a
	// backlog at or below it was applied, even if it rose again before the watcher looked.
	// Wake-ups merge, so without it a brief dip could go unseen. It speaks for the queue
	// part alone: the watcher judges whether the whole trigger went inactive.
	activationDepth float64
	sawInactive     atomic.Bool
	// staleAfter is the trigger's: the producers whose backlog a report's notify sums.
	staleAfter time.Duration

	mu      sync.Mutex // guards stops and stopped
	stops   []func()
	stopped bool
}

func newWatch(t *Trigger) *Watch {
	w := &Watch{c: make(chan struct{}, 1), activationDepth: t.ActivationQueueDepth, staleAfter: t.StaleAfter}
	w.C = w.c
	return w
}

// Watch registers a watcher for t's queue reports. The caller must call Stop when done.
func (s *State) Watch(t *Trigger) *Watch {
	w := newWatch(t)
	if t.Queue == "" {
		return w
	}
	k := queueKey{t.Namespace, t.Queue}
	s.mu.Lock()
	defer s.mu.Unlock()
	addWatch(s.queueWatch, k, w)
	w.onStop(func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		removeWatch(s.queueWatch, k, w)
	})
	return w
}

func addWatch[K comparable](m map[K]map[*Watch]struct{}, k K, w *Watch) {
	set := m[k]
	if set == nil {
		set = make(map[*Watch]struct{})
		m[k] = set
	}
	set[w] = struct{}{}
}

func removeWatch[K comparable](m map[K]map[*Watch]struct{}, k K, w *Watch) {
	set := m[k]
	delete(set, w)
	if len(set) == 0 {
		delete(m, k)
	}
}

// onStop adds f to what Stop undoes; after Stop it runs f at once.
func (w *Watch) onStop(f func()) {
	w.mu.Lock()
	if !w.stopped {
		w.stops = append(w.stops, f)
		w.mu.Unlock()
		return
	}
	w.mu.Unlock()
	f()
}

// Stop unregisters the watcher everywhere. It is safe to call more than once.
func (w *Watch) Stop() {
	w.mu.Lock()
	stops := w.stops
	w.stops, w.stopped = nil, true
	w.mu.Unlock()
	for _, f := range stops {
		f()
	}
}

// SawInactive reports whether a backlog at or below the trigger's activation depth was
// applied since the last call.
func (w *Watch) SawInactive() bool { return w.sawInactive.Swap(false) }

// notify tells the watcher a backlog was applied, and wakes it without blocking.
func (w *Watch) notify(backlog float64) {
	if backlog <= w.activationDepth {
		w.sawInactive.Store(true)
	}
	w.wake()
}

// wake signals the watcher without blocking.
func (w *Watch) wake() {
	select {
	case w.c <- struct{}{}:
	default:
	}
}
