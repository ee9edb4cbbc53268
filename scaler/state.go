package scaler

import (
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/apimachinery/pkg/labels"

	gpuscalerv1 "github.com/gpuscaler/gpuscaler/proto/gpuscaler/v1"
)

// State is the scaler's picture of the cluster: the latest report of every node and every
// queue, and when NATS stored it. One goroutine applies events (the NATS follower); any
// number read. Readers see each report whole: a report is replaced, never edited.
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
	byNamespace map[string]map[*nodeEntry]struct{}
	// newestNode is the newest stored time of any node report.
	newestNode time.Time
	gpus       int
	// queues holds the latest report per namespace/queue.
	queues map[queueKey]*queueEntry
	// queueWatch holds the watchers to wake on a queue's report. Node reports wake no one:
	// a workload at zero replicas holds no GPUs, so GPU activity can never be what wakes
	// it, and KEDA polls IsActive for everything else.
	queueWatch map[queueKey]map[*Watch]struct{}
}

type queueKey struct{ namespace, queue string }

type nodeEntry struct {
	report *gpuscalerv1.NodeReport
	// stored is when NATS stored the report: the one clock every scaler replica shares.
	stored time.Time
	// namespaces of the pods that hold the node's GPUs, without repeats, and for each the
	// GPUs its pods hold, flattened for reading: a read walks one array rather than
	// chasing pointers through protobuf messages scattered over the heap.
	namespaces []string
	nsGPUs     [][]gpuView
	// free counts the allocatable devices not allocated, by MIG profile ("" for whole GPUs).
	free map[string]int
}

// gpuView is what a podSelector trigger reads of one GPU held by a pod.
type gpuView struct {
	labels  labels.Set // the pod's labels
	pod     string     // the pod's name
	util    float64    // GPU utilisation, percent; valid when hasUtil
	memPct  float64    // framebuffer used, percent of total; valid when hasMem
	hasUtil bool
	hasMem  bool
	index   int // in report.Gpus, for messages
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

type queueEntry struct {
	report *gpuscalerv1.QueueReport
	stored time.Time
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
		byNamespace: make(map[string]map[*nodeEntry]struct{}),
		queues:      make(map[queueKey]*queueEntry),
		queueWatch:  make(map[queueKey]map[*Watch]struct{}),
	}
}

// Apply records a decoded event that NATS stored at stored, replacing what was known of
// its node or queue, and wakes the watchers it may concern.
func (s *State) Apply(ev gpuscalerv1.Event, stored time.Time) {
	defer s.applied.Add(1)
	switch {
	case ev.Node != nil:
		s.applyNode(ev.Node, stored)
	case ev.Queue != nil:
		s.applyQueue(ev.Queue, stored)
	}
}

func (s *State) applyQueue(r *gpuscalerv1.QueueReport, stored time.Time) {
	k := queueKey{r.GetNamespace(), r.GetQueue()}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.queues[k] = &queueEntry{report: r, stored: stored}
	backlog := float64(r.Backlog())
	for w := range s.queueWatch[k] {
		w.notify(backlog)
	}
}

func (s *State) applyNode(r *gpuscalerv1.NodeReport, stored time.Time) {
	e := &nodeEntry{report: r, stored: stored}
	e.indexNamespaces()
	e.countFree()
	s.mu.Lock()
	defer s.mu.Unlock()
	old := s.nodes[r.GetNode()]
	if old != nil {
		s.unindex(old)
	}
	s.nodes[r.GetNode()] = e
	s.gpus += len(r.GetGpus())
	for _, ns := range e.namespaces {
		set := s.byNamespace[ns]
		if set == nil {
			set = make(map[*nodeEntry]struct{})
			s.byNamespace[ns] = set
		}
		set[e] = struct{}{}
	}
	if stored.After(s.newestNode) {
		s.newestNode = stored
	}
}

// unindex removes e from the namespace index and the GPU count. s.mu must be held.
func (s *State) unindex(e *nodeEntry) {
	s.gpus -= len(e.report.GetGpus())
	for _, ns := range e.namespaces {
		set := s.byNamespace[ns]
		delete(set, e)
		if len(set) == 0 {
			delete(s.byNamespace, ns)
		}
	}
}

// indexNamespaces groups the node's GPUs by the namespace of the pod holding them.
func (e *nodeEntry) indexNamespaces() {
	for i, g := range e.report.GetGpus() {
		p := g.GetPod()
		if p == nil {
			continue
		}
		j := slices.Index(e.namespaces, p.GetNamespace())
		if j < 0 {
			j = len(e.namespaces)
			e.namespaces = append(e.namespaces, p.GetNamespace())
			e.nsGPUs = append(e.nsGPUs, nil)
		}
		v := gpuView{labels: p.GetLabels(), pod: p.GetName(), index: i}
		if g.GpuUtil != nil {
			v.util, v.hasUtil = g.GetGpuUtil(), true
		}
		if g.FbUsedBytes != nil && g.GetFbTotalBytes() > 0 {
			v.memPct, v.hasMem = 100*float64(g.GetFbUsedBytes())/float64(g.GetFbTotalBytes()), true
		}
		e.nsGPUs[j] = append(e.nsGPUs[j], v)
	}
}

// countFree counts the node's free devices by MIG profile.
func (e *nodeEntry) countFree() {
	allocated := make(map[string]struct{}, len(e.report.GetAllocated()))
	for _, d := range e.report.GetAllocated() {
		allocated[d.GetId()] = struct{}{}
	}
	e.free = make(map[string]int, 1)
	for _, d := range e.report.GetAllocatable() {
		if _, taken := allocated[d.GetId()]; !taken {
			e.free[d.Profile()]++
		}
	}
}

// Forget drops nodes and queues whose latest report NATS stored before cutoff: the stream
// has dropped them too (its MaxAge), so a restarted replica would not know them either.
// It returns how many entries it dropped.
func (s *State) Forget(cutoff time.Time) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for name, e := range s.nodes {
		if e.stored.Before(cutoff) {
			s.unindex(e)
			delete(s.nodes, name)
			n++
		}
	}
	if len(s.nodes) == 0 {
		s.newestNode = time.Time{}
	}
	for k, e := range s.queues {
		if e.stored.Before(cutoff) {
			delete(s.queues, k)
			n++
		}
	}
	return n
}

// Applied returns how many events have been applied since the State was made.
func (s *State) Applied() uint64 { return s.applied.Load() }

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
	// Wake-ups merge, so without it a brief dip could go unseen.
	activationDepth float64
	sawInactive     atomic.Bool

	mu      sync.Mutex // guards stops and stopped
	stops   []func()
	stopped bool
}

func newWatch(t *Trigger) *Watch {
	w := &Watch{c: make(chan struct{}, 1), activationDepth: t.ActivationQueueDepth}
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
