package scaler

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"k8s.io/apimachinery/pkg/labels"

	gpuscalerv1 "github.com/gpuscaler/gpuscaler/proto/gpuscaler/v1"
)

// fullScan reads t's GPUs the way the scaler did before selections: every GPU of the
// namespace, every node, matched on each read. It is the oracle selections must agree
// with.
func (s *State) fullScan(t *Trigger) Reading {
	now := s.now()
	var r Reading
	r.hasGPU = true
	r.gpuUtil.defined = t.GPUUtilTarget > 0
	r.gpuMemory.defined = t.GPUMemoryTarget > 0
	s.mu.RLock()
	err := s.nodesFresh(t, now, "")
	var sum gpuSums
	for _, e := range s.byNamespace[t.Namespace] {
		var nodePods []string
		for _, v := range e.gpusOf(t.Namespace) {
			if !v.labelsUnknown && !t.PodSelector.Matches(&v.labels) {
				continue
			}
			if now.Sub(e.stored) > t.StaleAfter {
				sum.stale.consider(e, v)
				break
			}
			if v.labelsUnknown || v.unattributed {
				sum.unknown.consider(e, v)
				continue
			}
			sum.gpus += v.share
			if !slices.Contains(nodePods, v.pod) {
				nodePods = append(nodePods, v.pod)
				sum.pods++
			}
			if v.hasUtil {
				sum.util += v.util
			} else {
				sum.noUtil.consider(e, v)
			}
			if v.hasMem {
				sum.mem += v.memPct
			} else {
				sum.noMem.consider(e, v)
			}
		}
	}
	s.mu.RUnlock()
	if err != nil {
		r.failGPU(err)
		return r
	}
	s.judgeGPUs(t, now, sum, &r)
	return r
}

// randomReport builds a report of node with pods of namespaces a and b, labels drawn
// from a few apps and tiers, and every kind of trouble: shared devices, pods whose own
// use is measured, labels unknown, devices unattributed, figures missing.
func randomReport(rng *rand.Rand, node string) *gpuscalerv1.NodeReport {
	r := &gpuscalerv1.NodeReport{Node: node, Source: "sim"}
	pod := func(g int) *gpuscalerv1.PodRef {
		p := &gpuscalerv1.PodRef{
			Namespace: []string{"a", "b"}[rng.IntN(2)],
			Name:      fmt.Sprintf("%s-p%d", node, rng.IntN(4)+g%2),
			Labels:    map[string]string{"app": []string{"x", "y", "z"}[rng.IntN(3)]},
		}
		if rng.IntN(2) == 0 {
			p.Labels["tier"] = []string{"gpu", "cpu"}[rng.IntN(2)]
		}
		if rng.IntN(25) == 0 {
			p.Labels, p.LabelsUnknown = nil, true
		}
		return p
	}
	for g := range rng.IntN(5) {
		smp := &gpuscalerv1.GPUSample{Uuid: fmt.Sprintf("GPU-%s-%d", node, g), Index: uint32(g)}
		if rng.IntN(12) != 0 {
			smp.GpuUtil = proto.Float64(float64(rng.IntN(101)))
		}
		if rng.IntN(12) != 0 {
			smp.FbUsedBytes, smp.FbTotalBytes = proto.Uint64(uint64(rng.IntN(80))<<30), proto.Uint64(80<<30)
		}
		switch rng.IntN(4) {
		case 0: // free
		case 1: // shared by two or three pods
			smp.Shared = true
			smp.Pod = pod(g)
			for range 1 + rng.IntN(2) {
				smp.OtherPods = append(smp.OtherPods, pod(g+1))
			}
			if rng.IntN(2) == 0 {
				for _, p := range append([]*gpuscalerv1.PodRef{smp.Pod}, smp.OtherPods...) {
					p.GpuUtil = proto.Float64(float64(rng.IntN(50)))
				}
			}
		default:
			smp.Pod = pod(g)
		}
		r.Gpus = append(r.Gpus, smp)
	}
	if rng.IntN(15) == 0 {
		r.Unattributed = append(r.Unattributed, &gpuscalerv1.UnattributedDevice{Id: "MIG-" + node, Pod: pod(0), Reason: "test"})
	}
	return r
}

// TestSelectionsAgreeWithFullScan applies random reports, reads random selectors, moves
// the clock, forgets nodes and reports again, and checks after every step that each
// trigger's reading, errors included, is what a full scan of the namespace gives.
func TestSelectionsAgreeWithFullScan(t *testing.T) {
	selectors := []string{"app=x", "app in (x,y)", "app!=x", "tier", "!tier", "app=x,tier=gpu", "app notin (y)", "tier=gpu", "app=none"}
	for seed := range uint64(40) {
		rng := rand.New(rand.NewPCG(seed, 7))
		clock := newFakeClock(t0)
		s := NewState(clock.Now)
		s.SetNodeTombstoneTTL(time.Hour)
		nodes := make([]string, 3+rng.IntN(10))
		for i := range nodes {
			nodes[i] = fmt.Sprintf("n%02d", i)
		}
		var triggers []*Trigger
		for _, ns := range []string{"a", "b"} {
			for _, sel := range selectors {
				triggers = append(triggers, mustTrigger(t, ns, map[string]string{"podSelector": sel, "gpuUtilTarget": "50", "gpuMemoryTarget": "60"}))
			}
		}
		for step := range 60 {
			switch k := rng.IntN(10); {
			case k < 6: // a node reports, stored up to 40 s ago
				node := nodes[rng.IntN(len(nodes))]
				stored := clock.Now().Add(-time.Duration(rng.IntN(40)) * time.Second)
				s.Apply(gpuscalerv1.Event{Node: randomReport(rng, node)}, stored)
			case k < 8:
				clock.Advance(time.Duration(rng.IntN(20)) * time.Second)
			case k < 9:
				s.Forget(clock.Now().Add(-time.Duration(20+rng.IntN(40)) * time.Second))
			default: // a selection no one reads for long enough is dropped, then built anew
				clock.Advance(selectionIdleAfter + time.Second)
				s.Forget(clock.Now().Add(-2 * time.Hour))
			}
			for _, tr := range triggers {
				if rng.IntN(3) == 0 {
					continue // not every trigger is read every time: the others' selections go on
				}
				compareReadings(t, fmt.Sprintf("seed %d step %d: %s %q", seed, step, tr.Namespace, tr.PodSelector), s.Read(tr), s.fullScan(tr))
			}
		}
	}
}

func compareReadings(t *testing.T, what string, got, want Reading) {
	t.Helper()
	for _, m := range []string{MetricGPUUtil, MetricGPUMemory} {
		gv, gerr := got.Metric(m)
		wv, werr := want.Metric(m)
		if fmt.Sprint(gerr) != fmt.Sprint(werr) || math.Abs(gv-wv) > 1e-9*max(1, math.Abs(wv)) {
			t.Fatalf("%s: %s = %v, %v; the full scan gives %v, %v", what, m, gv, gerr, wv, werr)
		}
	}
	ga, gerr := got.Active()
	wa, werr := want.Active()
	if ga != wa || fmt.Sprint(gerr) != fmt.Sprint(werr) {
		t.Fatalf("%s: Active() = %v, %v; the full scan gives %v, %v", what, ga, gerr, wa, werr)
	}
	// A trigger with only podSelector is always active when it can be judged: compare the
	// GPU part's own activity too.
	if got.gpuActive != want.gpuActive || fmt.Sprint(got.gpuActiveErr) != fmt.Sprint(want.gpuActiveErr) {
		t.Fatalf("%s: GPU part active %v, %v; the full scan gives %v, %v", what, got.gpuActive, got.gpuActiveErr, want.gpuActive, want.gpuActiveErr)
	}
}

// TestReadDoesNotHoldUpTheApplier stops a read in the middle of summing a selection and
// applies a report of a node the read is summing: the apply must finish while the read
// waits. Before selections, a read held the state's read lock for its whole walk of the
// namespace, and the apply waited for it.
func TestReadDoesNotHoldUpTheApplier(t *testing.T) {
	s := NewState(nil)
	report := func(util float64) gpuscalerv1.Event {
		return nodeEvent("n1", gpu("GPU-1", "ml", "llm-0", map[string]string{"app": "llm"}, util, 10, 80))
	}
	s.Apply(report(10), time.Now())
	tr := mustTrigger(t, "ml", map[string]string{"podSelector": "app=llm", "gpuUtilTarget": "50"})
	wantMetric(t, s.Read(tr), MetricGPUUtil, 10)

	reading, applied := make(chan struct{}), make(chan struct{})
	testHookReading = func() {
		close(reading)
		select {
		case <-applied:
		case <-time.After(10 * time.Second): // a deadlock detector, not a timing assertion
		}
	}
	defer func() { testHookReading = nil }()
	got := make(chan Reading)
	go func() { got <- s.Read(tr) }()
	<-reading
	testHookReading = nil
	done := make(chan struct{})
	go func() { s.Apply(report(90), time.Now()); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Apply waited for a read in progress")
	}
	close(applied)
	<-got // the read in flight may give either report: each is whole
	wantMetric(t, s.Read(tr), MetricGPUUtil, 90)
}

// TestIdleSelectionsAreDropped checks that a selection no trigger reads stops costing the
// applier: Forget drops it, and its nodes forget it.
func TestIdleSelectionsAreDropped(t *testing.T) {
	clock := newFakeClock(t0)
	s := NewState(clock.Now)
	s.Apply(nodeEvent("n1", gpu("GPU-1", "ml", "llm-0", map[string]string{"app": "llm"}, 40, 10, 80)), t0)
	tr := mustTrigger(t, "ml", map[string]string{"podSelector": "app=llm", "gpuUtilTarget": "50"})
	wantMetric(t, s.Read(tr), MetricGPUUtil, 40)
	clock.Advance(selectionIdleAfter / 2)
	s.Apply(nodeEvent("n1", gpu("GPU-1", "ml", "llm-0", map[string]string{"app": "llm"}, 60, 10, 80)), clock.Now())
	s.Forget(t0.Add(-time.Hour))
	wantMetric(t, s.Read(tr), MetricGPUUtil, 60) // read again: kept
	clock.Advance(selectionIdleAfter + time.Second)
	s.Apply(nodeEvent("n1", gpu("GPU-1", "ml", "llm-0", map[string]string{"app": "llm"}, 70, 10, 80)), clock.Now())
	s.Forget(t0.Add(-time.Hour))
	s.mu.RLock()
	selections, idx, held := len(s.selections), len(s.selIndex), len(s.nodes["n1"].selections)
	s.mu.RUnlock()
	if selections != 0 || idx != 0 || held != 0 {
		t.Fatalf("after %s unread: %d selections, %d namespace indexes, node n1 in %d selections; want none", selectionIdleAfter, selections, idx, held)
	}
	wantMetric(t, s.Read(tr), MetricGPUUtil, 70) // built anew on the next read
}

// capacityFullScan counts free slots the way the scaler did before pools: every node,
// its labels matched on each read. It is the oracle pools must agree with.
func (s *State) capacityFullScan(t *Trigger) (int, error) {
	now := s.now()
	s.mu.RLock()
	defer s.mu.RUnlock()
	if err := s.nodesFresh(t, now, "capacity unknown: "); err != nil {
		return 0, err
	}
	slots := 0
	for _, e := range s.nodes {
		if now.Sub(e.stored) > t.StaleAfter || t.NodeSelector != nil && !t.NodeSelector.Matches(labels.Set(e.report.GetNodeLabels())) {
			continue
		}
		if t.GPUProfile != "" {
			slots += e.free[t.GPUProfile]
		} else {
			slots += e.free[""] / max(t.GPUsPerReplica, 1)
		}
	}
	return slots, nil
}

// TestPoolsAgreeWithFullScan applies random reports of labelled nodes with free, taken,
// unhealthy and MIG devices, moves the clock and forgets nodes, and checks every
// capacityAware trigger's count against a full scan after every step.
func TestPoolsAgreeWithFullScan(t *testing.T) {
	var triggers []*Trigger
	for _, sel := range []string{"", "pool=a", "pool in (a,b)", "!pool", "pool!=b"} {
		for _, per := range []string{"1", "2", "4", "1g.10gb"} {
			md := map[string]string{"queue": "jobs", "capacityAware": "true", "gpusPerReplica": per}
			if sel != "" {
				md["nodeSelector"] = sel
			}
			triggers = append(triggers, mustTrigger(t, "ml", md))
		}
	}
	for seed := range uint64(20) {
		rng := rand.New(rand.NewPCG(seed, 11))
		clock := newFakeClock(t0)
		s := NewState(clock.Now)
		for step := range 80 {
			switch k := rng.IntN(10); {
			case k < 7:
				node := fmt.Sprintf("n%02d", rng.IntN(12))
				r := &gpuscalerv1.NodeReport{Node: node, Source: "sim"}
				if l := rng.IntN(4); l < 3 {
					r.NodeLabels = map[string]string{"pool": []string{"a", "b", "c"}[l]}
				}
				for d := range rng.IntN(9) {
					dev := &gpuscalerv1.Device{Id: fmt.Sprintf("GPU-%s-%d", node, d), Resource: "nvidia.com/gpu"}
					if rng.IntN(3) == 0 {
						dev.Id, dev.Resource = fmt.Sprintf("MIG-%s-%d", node, d), "nvidia.com/mig-1g.10gb"
					}
					dev.Unhealthy = rng.IntN(10) == 0
					r.Allocatable = append(r.Allocatable, dev)
					if rng.IntN(3) == 0 {
						r.Allocated = append(r.Allocated, &gpuscalerv1.Device{Id: dev.Id, Resource: dev.Resource})
					}
				}
				s.Apply(gpuscalerv1.Event{Node: r}, clock.Now().Add(-time.Duration(rng.IntN(40))*time.Second))
			case k < 8:
				clock.Advance(time.Duration(rng.IntN(20)) * time.Second)
			case k < 9:
				s.Forget(clock.Now().Add(-time.Duration(20+rng.IntN(40)) * time.Second))
			default:
				clock.Advance(selectionIdleAfter + time.Second)
				s.Forget(clock.Now().Add(-2 * time.Hour))
			}
			for _, tr := range triggers {
				if rng.IntN(3) == 0 {
					continue
				}
				got, gerr := s.capacity(tr)
				want, werr := s.capacityFullScan(tr)
				if got != want || fmt.Sprint(gerr) != fmt.Sprint(werr) {
					t.Fatalf("seed %d step %d: nodeSelector %v, gpusPerReplica %d, profile %q: capacity %d, %v; the full scan gives %d, %v",
						seed, step, tr.NodeSelector, tr.GPUsPerReplica, tr.GPUProfile, got, gerr, want, werr)
				}
			}
		}
	}
}

// TestSelectionsBuiltWhileReportsArrive builds selections while reports are applied
// concurrently, dropping them as idle and building them again, then checks every reading
// against the full scan once the reports stop: a report applied while a selection was
// being built must not be lost or overwritten by the older entry the building read.
func TestSelectionsBuiltWhileReportsArrive(t *testing.T) {
	selectors := []string{"app=x", "app in (x,y)", "app!=x", "tier=gpu"}
	clock := newFakeClock(t0)
	s := NewState(clock.Now)
	rng := rand.New(rand.NewPCG(3, 3))
	reports := make([]*gpuscalerv1.NodeReport, 400)
	for i := range reports {
		reports[i] = randomReport(rng, fmt.Sprintf("n%02d", i%16))
	}
	for _, r := range reports[:16] {
		s.Apply(gpuscalerv1.Event{Node: r}, t0)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for _, r := range reports[16:] {
			s.Apply(gpuscalerv1.Event{Node: r}, t0)
		}
	}()
	for round := 0; ; round++ {
		for _, sel := range selectors {
			s.Read(mustTrigger(t, "a", map[string]string{"podSelector": sel, "gpuUtilTarget": "50"}))
		}
		select {
		case <-done:
			for _, sel := range selectors {
				tr := mustTrigger(t, "a", map[string]string{"podSelector": sel, "gpuUtilTarget": "50"})
				compareReadings(t, fmt.Sprintf("after %d rounds: %q", round, sel), s.Read(tr), s.fullScan(tr))
			}
			return
		default:
		}
		if round%3 == 2 { // every selection idle: dropped, built again next round
			s.mu.Lock()
			s.dropIdleSelections(clock.Now().Add(time.Hour))
			s.mu.Unlock()
		}
	}
}

// TestReportDuringSelectionBuild applies reports while a selection is being built: one
// that changes a node's pods, one of a node new to the namespace, and a forgotten node.
// The built selection must hold what they say, not what the nodes held when the
// building began.
func TestReportDuringSelectionBuild(t *testing.T) {
	clock := newFakeClock(t0)
	s := NewState(clock.Now)
	llm := map[string]string{"app": "llm"}
	s.Apply(nodeEvent("n1", gpu("GPU-1", "ml", "llm-0", llm, 10, 10, 80)), t0)
	s.Apply(nodeEvent("n2", gpu("GPU-2", "ml", "llm-1", llm, 20, 10, 80)), t0)
	s.Apply(nodeEvent("n3", gpu("GPU-3", "ml", "llm-2", llm, 30, 10, 80)), t0.Add(-time.Minute))
	testHookBuilding = func() {
		testHookBuilding = nil
		s.Apply(nodeEvent("n1", gpu("GPU-1", "ml", "llm-0", llm, 70, 10, 80)), t0) // changed
		s.Apply(nodeEvent("n4", gpu("GPU-4", "ml", "llm-3", llm, 40, 10, 80)), t0) // new
		s.Forget(t0.Add(-30 * time.Second))                                        // n3 forgotten
		s.Apply(nodeEvent("n2", gpu("GPU-2", "ml", "other", nil, 20, 10, 80)), t0) // no longer selected
	}
	defer func() { testHookBuilding = nil }()
	tr := mustTrigger(t, "ml", map[string]string{"podSelector": "app=llm", "gpuUtilTarget": "50"})
	got := s.Read(tr)
	compareReadings(t, "built during reports", got, s.fullScan(tr))
	wantMetric(t, got, MetricGPUUtil, 110) // n1 at 70 and n4 at 40
}
