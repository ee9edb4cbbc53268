package scaler

import (
	"maps"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"k8s.io/apimachinery/pkg/labels"
	selop "k8s.io/apimachinery/pkg/selection"
)

// A selection is what one podSelector selects in one namespace, kept up to date as nodes
// report, so that reading a trigger costs the nodes that hold its pods and nothing else:
// neither the namespace's other pods nor the other triggers.
//
// Reads take no lock. The applier, which alone writes (under State.mu), never waits for a
// read:
//   - a node's part (selPart) is built whole and swapped into its slot atomically;
//   - the list of slots, sorted by node name, is copied and replaced whole when a node
//     starts or stops holding selected pods, which happens when pods are scheduled or
//     end, not on every report.
//
// A read may therefore see one node's newer report next to another's older one, as any
// read between two reports would: every part is one report, whole.
type selection struct {
	selector labels.Selector
	parts    nodeList[selPart]
	// built is closed once the selection holds every node (see selectionFor).
	built chan struct{}
	// lastRead is when a trigger last read the selection (State's clock, Unix
	// nanoseconds): Forget drops selections no trigger has read for selectionIdleAfter.
	lastRead atomic.Int64
	// coldStart is the largest cold start the collectors measured of the selected pods
	// that a read saw, kept after the pods are gone (see rememberColdStart), and
	// coldStartOthers since when reads have seen only smaller ones (State's clock, Unix
	// nanoseconds; 0: they have not).
	coldStart       atomic.Pointer[coldStartFigure]
	coldStartOthers atomic.Int64
}

type selKey struct{ namespace, selector string }

// selPart is what one node report gives a selection: the sums over the GPUs held by the
// selected pods, and where in the report to find the GPU an error names. Positions index
// e.nsGPUs[ns]; -1 means none.
type selPart struct {
	e  *nodeEntry
	ns int32
	// first is the first view the selector selects (or cannot tell): named when the node
	// is stale. unknown is the first whose pod's labels or device are unknown; noUtil and
	// noMem the first without utilisation or framebuffer figures.
	first, unknown, noUtil, noMem int32
	pods                          int32
	gpus, util, mem               float64
	// coldStart is the largest cold start measured of the node's selected pods, and
	// coldStartAt the view of its pod; -1 when none was measured.
	coldStart   float64
	coldStartAt int32
}

func (p *selPart) view(i int32) gpuView { return p.e.nsGPUs[p.ns][i] }

// selectedBy reports whether sel selects v's pod, or cannot tell because the collector
// could not read the pod's labels: either way the pod is the trigger's to account for.
func (v *gpuView) selectedBy(sel labels.Selector) bool {
	return v.labelsUnknown || sel.Matches(&v.labels)
}

// part computes into p what e gives a selection of namespace e.namespaces[j], trying the
// views at the positions in only (ascending), or every view when only is nil. It reports
// false when the selector selects none of them (and can tell).
func (e *nodeEntry) part(p *selPart, j int, sel labels.Selector, only []int32) bool {
	*p = selPart{e: e, ns: int32(j), first: -1, unknown: -1, noUtil: -1, noMem: -1, coldStartAt: -1}
	var seen [16]string // the node's selected pods: a pod never spans nodes
	pods := seen[:0]
	views := e.nsGPUs[j]
	for k := 0; k < len(views) && (only == nil || k < len(only)); k++ {
		at := int32(k)
		if only != nil {
			at = only[k]
		}
		v := &views[at]
		if !v.selectedBy(sel) {
			continue
		}
		if p.first < 0 {
			p.first = at
		}
		if v.labelsUnknown || v.unattributed {
			p.unknown = firstOf(views, p.unknown, at)
			continue
		}
		p.gpus += v.share
		if v.coldStart > p.coldStart {
			p.coldStart, p.coldStartAt = v.coldStart, at
		}
		if !slices.Contains(pods, v.pod) {
			pods = append(pods, v.pod)
			p.pods++
		}
		if v.hasUtil {
			p.util += v.util
		} else {
			p.noUtil = firstOf(views, p.noUtil, at)
		}
		if v.hasMem {
			p.mem += v.memPct
		} else {
			p.noMem = firstOf(views, p.noMem, at)
		}
	}
	return p.first >= 0
}

// firstOf returns whichever of views[cur] and views[at] an error names first (see
// namedBefore); cur -1 is none.
func firstOf(views []gpuView, cur, at int32) int32 {
	if cur < 0 || namedBefore(&views[at], &views[cur]) {
		return at
	}
	return cur
}

// nodeList maps node names to values, for readers that take no lock: the slots, sorted
// by node name, are copied and replaced whole when a node joins or leaves, and a slot's
// value is swapped atomically when its node reports again. One writer at a time (the
// applier, under State.mu).
type nodeList[T any] struct {
	p atomic.Pointer[[]*nodeSlot[T]]
}

type nodeSlot[T any] struct {
	node string
	v    atomic.Pointer[T]
}

// load returns the slots, sorted by node name.
func (l *nodeList[T]) load() []*nodeSlot[T] {
	if p := l.p.Load(); p != nil {
		return *p
	}
	return nil
}

func (l *nodeList[T]) find(node string) (int, bool) {
	return slices.BinarySearchFunc(l.load(), node, func(s *nodeSlot[T], node string) int { return strings.Compare(s.node, node) })
}

// set makes v the node's value.
func (l *nodeList[T]) set(node string, v *T) {
	i, found := l.find(node)
	cur := l.load()
	if found {
		cur[i].v.Store(v)
		return
	}
	slot := &nodeSlot[T]{node: node}
	slot.v.Store(v)
	next := make([]*nodeSlot[T], 0, len(cur)+1)
	next = append(append(append(next, cur[:i]...), slot), cur[i:]...)
	l.p.Store(&next)
}

// drop removes the node.
func (l *nodeList[T]) drop(node string) {
	i, found := l.find(node)
	if !found {
		return
	}
	cur := l.load()
	next := make([]*nodeSlot[T], 0, len(cur)-1)
	next = append(append(next, cur[:i]...), cur[i+1:]...)
	l.p.Store(&next)
}

// build fills an empty list at once: vals by node name.
func (l *nodeList[T]) build(vals map[string]*T) {
	slots := make([]*nodeSlot[T], 0, len(vals))
	for node, v := range vals {
		slot := &nodeSlot[T]{node: node}
		slot.v.Store(v)
		slots = append(slots, slot)
	}
	slices.SortFunc(slots, func(a, b *nodeSlot[T]) int { return strings.Compare(a.node, b.node) })
	l.p.Store(&slots)
}

// merge adds slots, sorted by node name, in one copy; where a node is in the list
// already, its slot there stays.
func (l *nodeList[T]) merge(slots []*nodeSlot[T]) {
	cur := l.load()
	next := make([]*nodeSlot[T], 0, len(cur)+len(slots))
	i, j := 0, 0
	for i < len(cur) || j < len(slots) {
		switch {
		case j == len(slots) || i < len(cur) && cur[i].node < slots[j].node:
			next = append(next, cur[i])
			i++
		case i == len(cur) || slots[j].node < cur[i].node:
			next = append(next, slots[j])
			j++
		default: // the same node: keep the list's
			next = append(next, cur[i])
			i, j = i+1, j+1
		}
	}
	l.p.Store(&next)
}

// selectionIndex finds the selections of one namespace that may select a pod, without
// matching every selector against every pod of every report: a selection whose selector
// requires a label value (app=x, app in (x,y)) is found through that label; the others
// (only !=, notin, exists) are tried on every pod of the namespace.
type selectionIndex struct {
	all []*selection
	// byLabel finds selections by label key, then value. The keys are few (app, tier...),
	// so a pod's labels are looked up by these keys rather than each label hashed.
	byLabel   map[string]map[string][]*selection
	unindexed []*selection
}

type labelPair struct{ key, value string }

// indexPairs returns the label pairs under which sel is indexed: the values of its first
// requirement that names them, or nil when none does.
func indexPairs(sel labels.Selector) []labelPair {
	reqs, _ := sel.Requirements()
	for _, r := range reqs {
		switch r.Operator() {
		case selop.Equals, selop.DoubleEquals, selop.In:
			vals := r.ValuesUnsorted()
			pairs := make([]labelPair, len(vals))
			for i, v := range vals {
				pairs[i] = labelPair{r.Key(), v}
			}
			return pairs
		}
	}
	return nil
}

func (x *selectionIndex) add(sel *selection) {
	x.all = append(x.all, sel)
	pairs := indexPairs(sel.selector)
	if len(pairs) == 0 {
		x.unindexed = append(x.unindexed, sel)
		return
	}
	for _, p := range pairs {
		values := x.byLabel[p.key]
		if values == nil {
			values = make(map[string][]*selection)
			x.byLabel[p.key] = values
		}
		values[p.value] = append(values[p.value], sel)
	}
}

func (x *selectionIndex) remove(sel *selection) {
	del := func(s []*selection) []*selection {
		return slices.DeleteFunc(s, func(o *selection) bool { return o == sel })
	}
	x.all = del(x.all)
	x.unindexed = del(x.unindexed)
	for _, p := range indexPairs(sel.selector) {
		values := x.byLabel[p.key]
		if values[p.value] = del(values[p.value]); len(values[p.value]) == 0 {
			delete(values, p.value)
		}
		if len(values) == 0 {
			delete(x.byLabel, p.key)
		}
	}
}

// candidate is a selection a report may concern, and the positions of the views that may
// be its pods' (nil: all of them).
type candidate struct {
	sel   *selection
	views []int32
	all   bool
}

// candidates returns, in dst (reused: its view lists keep their storage), the selections
// that may select one of views' pods. A selection found through a label value can only
// select the views that carry it, so only those are tried.
func (x *selectionIndex) candidates(dst []candidate, views []gpuView) []candidate {
	find := func(sel *selection) *candidate {
		for i := range dst {
			if dst[i].sel == sel {
				return &dst[i]
			}
		}
		if len(dst) < cap(dst) {
			dst = dst[:len(dst)+1]
			c := &dst[len(dst)-1]
			c.sel, c.views, c.all = sel, c.views[:0], false
			return c
		}
		dst = append(dst, candidate{sel: sel})
		return &dst[len(dst)-1]
	}
	addAll := func(sels []*selection) {
		for _, sel := range sels {
			find(sel).all = true
		}
	}
	for i := range views {
		if views[i].labelsUnknown { // any selector may select it
			addAll(x.all)
			return dst
		}
	}
	addAll(x.unindexed)
	for key, values := range x.byLabel {
		for i := range views {
			v, ok := views[i].labels.Lookup(key)
			if !ok {
				continue
			}
			for _, sel := range values[v] {
				if c := find(sel); !c.all && (len(c.views) == 0 || c.views[len(c.views)-1] != int32(i)) {
					c.views = append(c.views, int32(i))
				}
			}
		}
	}
	return dst
}

// sumGPUs sums the GPUs held by the pods sel selects, node by node in name order, so
// every call and replica sums in the same order and names the same GPU in an error. It
// takes no lock (see selection): its cost is the nodes holding the selected pods.
func (s *State) sumGPUs(t *Trigger, sel *selection, now time.Time) gpuSums {
	<-sel.built
	sel.lastRead.Store(now.UnixNano())
	var sum gpuSums
	slots := sel.parts.load()
	if testHookReading != nil {
		testHookReading()
	}
	for _, slot := range slots {
		p := slot.v.Load()
		if now.Sub(p.e.stored) > t.StaleAfter {
			sum.stale = culprit{p.e, p.view(p.first)}
			break // the first by name: nothing else is read from stale data
		}
		if p.unknown >= 0 && sum.unknown.e == nil {
			sum.unknown = culprit{p.e, p.view(p.unknown)}
		}
		if p.noUtil >= 0 && sum.noUtil.e == nil {
			sum.noUtil = culprit{p.e, p.view(p.noUtil)}
		}
		if p.noMem >= 0 && sum.noMem.e == nil {
			sum.noMem = culprit{p.e, p.view(p.noMem)}
		}
		sum.gpus += p.gpus
		sum.pods += int(p.pods)
		if p.coldStart > sum.coldStart { // the first node by name, on a tie
			sum.coldStart, sum.coldStartPod = p.coldStart, culprit{p.e, p.view(p.coldStartAt)}
		}
		sum.util += p.util
		sum.mem += p.mem
	}
	return sum
}

// testHookReading, when set by a test, runs in the middle of every podSelector read.
var testHookReading func()

// gpuSums is what a trigger's selected pods hold, summed over nodes, and the first node
// (by name) found stale, holding a pod it cannot describe, or missing a figure: every
// call and replica should name the same one.
type gpuSums struct {
	gpus                          float64 // GPUs the selected pods hold: a shared device in part
	pods                          int
	util, mem                     float64
	stale, unknown, noUtil, noMem culprit
	// coldStart is the largest cold start measured of the selected pods, in seconds, and
	// coldStartPod where: 0 and none when none was.
	coldStart    float64
	coldStartPod culprit
}

// selectionIdleAfter is how long a selection no trigger reads is still kept up to date.
// KEDA reads every trigger at least every pollingInterval (30 s by default) and the HPA
// every 15 s; a selection silent this long belongs to a trigger that is gone.
const selectionIdleAfter = 10 * time.Minute

// testHookBuilding, when set by a test, runs while a selection is built outside the lock.
var testHookBuilding func()

// selectionFor returns the selection of namespace ns and selector sel, building it from
// the nodes of the namespace when no trigger read it before. The building walks every
// node of the namespace, so it runs outside the state's lock: the selection is
// registered first, so that reports applied meanwhile update it themselves, and the
// nodes whose entry has not changed since are added at the end. Readers wait for it.
func (s *State) selectionFor(ns string, sel labels.Selector, key selKey) *selection {
	s.mu.Lock()
	if found := s.selections[key]; found != nil {
		s.mu.Unlock()
		<-found.built
		return found
	}
	x := &selection{selector: sel, built: make(chan struct{})}
	x.lastRead.Store(s.now().UnixNano()) // not idle while it is built
	s.selections[key] = x
	idx := s.selIndex[ns]
	if idx == nil {
		idx = &selectionIndex{byLabel: make(map[string]map[string][]*selection)}
		s.selIndex[ns] = idx
	}
	idx.add(x)
	entries := slices.Collect(maps.Values(s.byNamespace[ns]))
	s.mu.Unlock()
	defer close(x.built)

	var found []*nodeSlot[selPart]
	for _, e := range entries {
		if p := new(selPart); e.part(p, slices.Index(e.namespaces, ns), sel, nil) {
			slot := &nodeSlot[selPart]{node: e.report.GetNode()}
			slot.v.Store(p)
			found = append(found, slot)
		}
	}
	slices.SortFunc(found, func(a, b *nodeSlot[selPart]) int { return strings.Compare(a.node, b.node) })
	if testHookBuilding != nil {
		testHookBuilding()
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	found = slices.DeleteFunc(found, func(slot *nodeSlot[selPart]) bool {
		e := slot.v.Load().e
		if s.nodes[slot.node] != e { // reported again since, so updated x itself, or forgotten
			return true
		}
		e.selections = append(e.selections, x)
		return false
	})
	x.parts.merge(found)
	return x
}

// updateSelections gives e's parts to the selections that select its pods, and takes
// old's away from those that no longer do. old may be nil (a new node) and so may e (a
// node forgotten). s.mu must be held.
func (s *State) updateSelections(old, e *nodeEntry) {
	if e != nil {
		node := e.report.GetNode()
		var parts []selPart // allocated once per report, for every part it gives
		for j, ns := range e.namespaces {
			idx := s.selIndex[ns]
			if idx == nil {
				continue
			}
			s.candidates = idx.candidates(s.candidates[:0], e.nsGPUs[j])
			for i := range s.candidates {
				c := &s.candidates[i]
				if parts == nil {
					parts = make([]selPart, 0, len(s.candidates))
				}
				if len(parts) == cap(parts) { // a report of many namespaces: rare
					parts = make([]selPart, 0, len(s.candidates))
				}
				only := c.views
				if c.all {
					only = nil
				}
				parts = parts[:len(parts)+1]
				if p := &parts[len(parts)-1]; e.part(p, j, c.sel.selector, only) {
					c.sel.parts.set(node, p)
					e.selections = append(e.selections, c.sel)
				} else {
					parts = parts[:len(parts)-1]
				}
			}
			for i := range s.candidates {
				s.candidates[i].sel = nil // keep no dropped selection alive
			}
		}
	}
	if old == nil {
		return
	}
	node := old.report.GetNode()
	for _, sel := range old.selections {
		if e == nil || !slices.Contains(e.selections, sel) {
			sel.parts.drop(node)
		}
	}
}

// dropIdleSelections forgets the selections no trigger read since before cutoff. s.mu
// must be held.
func (s *State) dropIdleSelections(cutoff time.Time) {
	for key, sel := range s.selections {
		if sel.lastRead.Load() >= cutoff.UnixNano() {
			continue
		}
		delete(s.selections, key)
		if idx := s.selIndex[key.namespace]; idx != nil {
			if idx.remove(sel); len(idx.all) == 0 {
				delete(s.selIndex, key.namespace)
			}
		}
		for _, slot := range sel.parts.load() {
			if p := slot.v.Load(); p != nil {
				p.e.selections = slices.DeleteFunc(p.e.selections, func(o *selection) bool { return o == sel })
			}
		}
	}
}

// podLabels are a pod's labels as the state keeps them: sorted by key, in one small
// slice. Pods carry a handful of labels, for which a slice takes a third of a map's
// memory and is searched faster. It implements labels.Labels for selectors.
type podLabels []labelPair

func newPodLabels(m map[string]string) podLabels {
	if len(m) == 0 {
		return nil
	}
	l := make(podLabels, 0, len(m))
	for k, v := range m { // copied: the state keeps nothing of a report (State.applyNode)
		l = append(l, labelPair{strings.Clone(k), strings.Clone(v)})
	}
	slices.SortFunc(l, func(a, b labelPair) int { return strings.Compare(a.key, b.key) })
	return l
}

// Lookup returns the label's value and whether the pod has it.
func (l podLabels) Lookup(key string) (string, bool) {
	for i := range l {
		if l[i].key == key {
			return l[i].value, true
		}
	}
	return "", false
}

// Has reports whether the pod has the label.
func (l podLabels) Has(key string) bool { _, ok := l.Lookup(key); return ok }

// Get returns the label's value, "" when the pod has none.
func (l podLabels) Get(key string) string { v, _ := l.Lookup(key); return v }

// equal reports whether l holds exactly the labels of m.
func (l podLabels) equal(m map[string]string) bool {
	if len(l) != len(m) {
		return false
	}
	for _, p := range l {
		if v, ok := m[p.key]; !ok || v != p.value {
			return false
		}
	}
	return true
}

// A nodePool is the nodes a capacityAware trigger's nodeSelector matches (every node for
// none), kept up to date as nodes report, so that counting free GPUs walks its nodes
// without the state's lock. Its values are the nodes' entries, which never change once
// applied.
type nodePool struct {
	selector labels.Selector // nil: every node
	nodes    nodeList[nodeEntry]
	lastRead atomic.Int64 // as selection.lastRead
}

func (p *nodePool) matches(e *nodeEntry) bool {
	return p.selector == nil || p.selector.Matches(labels.Set(e.report.GetNodeLabels()))
}

// poolFor returns the pool of nodeSelector sel (nil: every node), key its String, built
// from the nodes known when no trigger read it before.
func (s *State) poolFor(key string, sel labels.Selector) *nodePool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if found := s.pools[key]; found != nil {
		return found
	}
	p := &nodePool{selector: sel}
	nodes := make(map[string]*nodeEntry)
	for name, e := range s.nodes {
		if p.matches(e) {
			nodes[name] = e
		}
	}
	p.nodes.build(nodes)
	s.pools[key] = p
	return p
}

// updatePools puts e in the pools whose nodeSelector matches its node, and takes its node
// out of the others; e nil takes node out of every pool. s.mu must be held.
func (s *State) updatePools(node string, e *nodeEntry) {
	for _, p := range s.pools {
		if e != nil && p.matches(e) {
			p.nodes.set(node, e)
		} else {
			p.nodes.drop(node)
		}
	}
}

// dropIdlePools forgets the pools no trigger read since before cutoff. s.mu must be held.
func (s *State) dropIdlePools(cutoff time.Time) {
	for key, p := range s.pools {
		if p.lastRead.Load() < cutoff.UnixNano() {
			delete(s.pools, key)
		}
	}
}

// Aggregates reports how many selections and node pools the state keeps up to date.
func (s *State) Aggregates() (selections, pools int) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return len(s.selections), len(s.pools)
}
