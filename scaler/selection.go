package scaler

import (
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
	namespace string
	selector  labels.Selector
	key       selKey
	slots     atomic.Pointer[[]*selSlot]
	// lastRead is when a trigger last read the selection (State's clock, Unix
	// nanoseconds): Forget drops selections no trigger has read for selectionIdleAfter.
	lastRead atomic.Int64
}

type selKey struct{ namespace, selector string }

// selSlot holds one node's part of a selection.
type selSlot struct {
	node string
	part atomic.Pointer[selPart]
}

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
}

func (p *selPart) view(i int32) gpuView { return p.e.nsGPUs[p.ns][i] }

// part computes what e gives a selection of namespace e.namespaces[j], or nil when the
// selector selects none of its pods (and can tell).
func (e *nodeEntry) part(j int, sel labels.Selector) *selPart {
	p := &selPart{e: e, ns: int32(j), first: -1, unknown: -1, noUtil: -1, noMem: -1}
	var seen [16]string // the node's selected pods: a pod never spans nodes
	pods := seen[:0]
	views := e.nsGPUs[j]
	for i := range views {
		v := &views[i]
		if !v.labelsUnknown && !sel.Matches(v.labels) {
			continue
		}
		at := int32(i)
		if p.first < 0 {
			p.first = at
		}
		if v.labelsUnknown || v.unattributed {
			p.unknown = firstOf(views, p.unknown, at)
			continue
		}
		p.gpus += v.share
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
	if p.first < 0 {
		return nil
	}
	return p
}

// firstOf returns whichever of views[cur] and views[at] an error names first: measured
// devices before unattributed ones, then by place in the report, then by pod.
func firstOf(views []gpuView, cur, at int32) int32 {
	if cur < 0 {
		return at
	}
	a, b := &views[at], &views[cur]
	switch {
	case a.unattributed != b.unattributed:
		if !a.unattributed {
			return at
		}
		return cur
	case a.index != b.index:
		if a.index < b.index {
			return at
		}
		return cur
	case a.pod < b.pod:
		return at
	}
	return cur
}

func (sel *selection) load() []*selSlot {
	if p := sel.slots.Load(); p != nil {
		return *p
	}
	return nil
}

func compareSlot(s *selSlot, node string) int { return strings.Compare(s.node, node) }

// set makes p the node's part. The applier alone calls it, under State.mu.
func (sel *selection) set(node string, p *selPart) {
	cur := sel.load()
	i, found := slices.BinarySearchFunc(cur, node, compareSlot)
	if found {
		cur[i].part.Store(p)
		return
	}
	slot := &selSlot{node: node}
	slot.part.Store(p)
	next := make([]*selSlot, 0, len(cur)+1)
	next = append(append(append(next, cur[:i]...), slot), cur[i:]...)
	sel.slots.Store(&next)
}

// drop removes the node's part. The applier alone calls it, under State.mu.
func (sel *selection) drop(node string) {
	cur := sel.load()
	i, found := slices.BinarySearchFunc(cur, node, compareSlot)
	if !found {
		return
	}
	next := make([]*selSlot, 0, len(cur)-1)
	next = append(append(next, cur[:i]...), cur[i+1:]...)
	sel.slots.Store(&next)
}

// selectionIndex finds the selections of one namespace that may select a pod, without
// matching every selector against every pod of every report: a selection whose selector
// requires a label value (app=x, app in (x,y)) is found through that label; the others
// (only !=, notin, exists) are tried on every pod of the namespace.
type selectionIndex struct {
	all       []*selection
	byLabel   map[labelPair][]*selection
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
		x.byLabel[p] = append(x.byLabel[p], sel)
	}
}

func (x *selectionIndex) remove(sel *selection) {
	del := func(s []*selection) []*selection {
		return slices.DeleteFunc(s, func(o *selection) bool { return o == sel })
	}
	x.all = del(x.all)
	x.unindexed = del(x.unindexed)
	for _, p := range indexPairs(sel.selector) {
		if x.byLabel[p] = del(x.byLabel[p]); len(x.byLabel[p]) == 0 {
			delete(x.byLabel, p)
		}
	}
}

// candidates appends to dst the selections that may select one of views' pods.
func (x *selectionIndex) candidates(dst []*selection, views []gpuView) []*selection {
	add := func(sels []*selection) {
		for _, sel := range sels {
			if !slices.Contains(dst, sel) {
				dst = append(dst, sel)
			}
		}
	}
	for i := range views {
		if views[i].labelsUnknown { // any selector may select it
			add(x.all)
			return dst
		}
	}
	add(x.unindexed)
	for i := range views {
		for k, v := range views[i].labels {
			add(x.byLabel[labelPair{k, v}])
		}
	}
	return dst
}

// selectionIdleAfter is how long a selection no trigger reads is still kept up to date.
// KEDA reads every trigger at least every pollingInterval (30 s by default) and the HPA
// every 15 s; a selection silent this long belongs to a trigger that is gone.
const selectionIdleAfter = 10 * time.Minute

// selectionFor returns the selection of namespace ns and selector sel, building it from
// the nodes of the namespace when no trigger read it before.
func (s *State) selectionFor(ns string, sel labels.Selector, key selKey) *selection {
	s.mu.Lock()
	defer s.mu.Unlock()
	if found := s.selections[key]; found != nil {
		return found
	}
	x := &selection{namespace: ns, selector: sel, key: key}
	var slots []*selSlot
	for e := range s.byNamespace[ns] {
		j := slices.Index(e.namespaces, ns)
		if p := e.part(j, sel); p != nil {
			slot := &selSlot{node: e.report.GetNode()}
			slot.part.Store(p)
			slots = append(slots, slot)
			e.selections = append(e.selections, x)
		}
	}
	slices.SortFunc(slots, func(a, b *selSlot) int { return strings.Compare(a.node, b.node) })
	x.slots.Store(&slots)
	s.selections[key] = x
	idx := s.selIndex[ns]
	if idx == nil {
		idx = &selectionIndex{byLabel: make(map[labelPair][]*selection)}
		s.selIndex[ns] = idx
	}
	idx.add(x)
	return x
}

// updateSelections gives e's parts to the selections that select its pods, and takes
// old's away from those that no longer do. old may be nil (a new node) and so may e (a
// node forgotten). s.mu must be held.
func (s *State) updateSelections(old, e *nodeEntry) {
	var node string
	if e != nil {
		node = e.report.GetNode()
		cands := s.candidates[:0]
		for j, ns := range e.namespaces {
			idx := s.selIndex[ns]
			if idx == nil {
				continue
			}
			from := len(cands)
			cands = idx.candidates(cands, e.nsGPUs[j])
			for _, sel := range cands[from:] {
				if p := e.part(j, sel.selector); p != nil {
					sel.set(node, p)
					e.selections = append(e.selections, sel)
				}
			}
		}
		clear(cands)
		s.candidates = cands[:0]
	}
	if old == nil {
		return
	}
	node = old.report.GetNode()
	for _, sel := range old.selections {
		if e == nil || !slices.Contains(e.selections, sel) {
			sel.drop(node)
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
		for _, slot := range sel.load() {
			if p := slot.part.Load(); p != nil {
				p.e.selections = slices.DeleteFunc(p.e.selections, func(o *selection) bool { return o == sel })
			}
		}
	}
}
