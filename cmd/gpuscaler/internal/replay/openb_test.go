package replay

import (
	"bytes"
	"context"
	"errors"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gpuscaler/gpuscaler/cmd/gpuscaler/internal/inference"
	"github.com/gpuscaler/gpuscaler/cmd/gpuscaler/internal/traces"
	"github.com/gpuscaler/gpuscaler/scaler"
)

// tracesDir is shared/testdata/traces, beside the repository.
const tracesDir = "../../../../../shared/testdata/traces"

var (
	openBOnce  sync.Once
	openBPods  []traces.OpenBPod
	openBNodes []traces.OpenBNode
	openBErr   error
)

// openBTrace reads the real openb files once per test binary.
func openBTrace(t testing.TB) ([]traces.OpenBPod, []traces.OpenBNode) {
	t.Helper()
	openBOnce.Do(func() {
		var data []byte
		if data, openBErr = os.ReadFile(filepath.Join(tracesDir, "openb-pods-default.csv")); openBErr != nil {
			return
		}
		if openBPods, openBErr = traces.ReadOpenBPods(bytes.NewReader(data)); openBErr != nil {
			return
		}
		if data, openBErr = os.ReadFile(filepath.Join(tracesDir, "openb-gpu-nodes.csv")); openBErr != nil {
			return
		}
		openBNodes, openBErr = traces.ReadOpenBNodes(bytes.NewReader(data))
	})
	if openBErr != nil {
		t.Fatalf("the openb trace is part of the shared test data: %v", openBErr)
	}
	return openBPods, openBNodes
}

func sec(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

// handCase is a cluster of three nodes and four tasks small enough to follow by hand,
// with every ScaledJob polled at 0 s, 30 s, 60 s… (phase 0). What happens:
//
//	 0 s  A (4 GPUs, runs 100 s) arrives; gpu4 polls: 1 Job → on n0 (4 × T4). A waits 0.
//	 5 s  B (4 GPUs, 50 s) arrives.       10 s  C (1 GPU, 20 s) arrives.
//	30 s  gpu1 polls: 1 Job → n0 is full, so on n1 (2 × T4). C waits 20 s.
//	      gpu4 polls: backlog 2 (B waiting, A in flight), 1 Job not finished.
//	        plain: KEDA creates 1 Job; no node has 4 free GPUs: Pending.
//	        capacityAware: no node can take a 4-GPU Job, so the backlog is capped at the
//	        1 item running: no Job.
//	35 s  D (2 GPUs, P100 only, 10 s) arrives.   50 s  C ends.
//	60 s  gpu2-p100 polls: 1 Job → n1 has 2 free T4s, but D needs a P100: on n2. D waits 25 s.
//	100 s A ends, freeing n0.
//	        plain: the Pending Pod starts at once: B waits 95 s, Pending 70 s × 4 GPUs.
//	120 s   capacityAware: gpu4 polls, n0 can take it: 1 Job, B waits 115 s.
func handCase() ([]traces.OpenBPod, []traces.OpenBNode) {
	task := func(name string, created float64, gpus int, spec string, run float64) traces.OpenBPod {
		return traces.OpenBPod{Name: name, NumGPU: gpus, GPUMilli: 1000, GPUSpec: spec, Phase: "Succeeded",
			Created: sec(created), Scheduled: sec(created), Deleted: sec(created + run), HasScheduled: true}
	}
	pods := []traces.OpenBPod{
		task("A", 0, 4, "", 100),
		task("B", 5, 4, "", 50),
		task("C", 10, 1, "", 20),
		{Name: "cpu", Phase: "Running", Created: sec(12), Scheduled: sec(12), Deleted: sec(20), HasScheduled: true},
		{Name: "never", NumGPU: 1, GPUMilli: 1000, Phase: "Pending", Created: sec(13), Deleted: sec(14)},
		{Name: "huge", NumGPU: 8, GPUMilli: 1000, Phase: "Running", Created: sec(14), Scheduled: sec(14), Deleted: sec(15), HasScheduled: true},
		task("D", 35, 2, "P100", 10),
	}
	nodes := []traces.OpenBNode{{Name: "n0", GPUs: 4, Model: "T4"}, {Name: "n1", GPUs: 2, Model: "T4"}, {Name: "n2", GPUs: 2, Model: "P100"}}
	return pods, nodes
}

// replayHand replays the hand case with every phase 0.
func replayHand(t *testing.T, pollAlways bool) (*OpenBResult, []*openBRecord) {
	t.Helper()
	pods, nodes := handCase()
	in, err := newOpenBInput(pods, nodes, OpenBConfig{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range in.phases {
		in.phases[i] = 0
	}
	in.pollAlways = pollAlways
	res, recs, err := in.replay(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	return res, recs
}

func TestOpenBHandComputed(t *testing.T) {
	res, recs := replayHand(t, false)
	if res.Jobs != 4 || res.Nodes != 3 || res.GPUs != 8 {
		t.Errorf("replayed %d tasks on %d nodes, %d GPUs; want 4, 3, 8", res.Jobs, res.Nodes, res.GPUs)
	}
	if want := map[string]int{"cpu_only": 1, "never_scheduled": 1, "no_node_fits": 1}; !reflect.DeepEqual(res.Skipped, want) {
		t.Errorf("skipped %v, want %v", res.Skipped, want)
	}
	if res.Span != 170*time.Second { // capacityAware's B ends last: 120 s + 50 s
		t.Errorf("span %s, want 170s", res.Span)
	}
	const gpuHours = (4*100 + 4*50 + 1*20 + 2*10) / 3600.0
	want := []OpenBPolicy{{
		Name: "gpuscaler-backlog", Jobs: 4,
		// Waits 0, 20, 25, 95: rank 2 of 4 is 20, rank 4 is 95.
		JobWaitP50: 20, JobWaitP99: 95, JobWaitMean: 35,
		PendingJobsMax: 1, PendingGPUHours: 70 * 4 / 3600.0,
		GPUHours: gpuHours, GPUAllocation: gpuHours * 3600 / (8 * 170),
	}, {
		Name: "gpuscaler", CapacityAware: true, Jobs: 4,
		JobWaitP50: 20, JobWaitP99: 115, JobWaitMean: 40,
		GPUHours: gpuHours, GPUAllocation: gpuHours * 3600 / (8 * 170),
	}}
	for i, p := range res.Policies {
		p.Timeline = nil
		if !approxPolicy(p, want[i]) {
			t.Errorf("got  %+v\nwant %+v", p, want[i])
		}
	}
	// Where each task ran: task → node.
	for i, rec := range recs {
		ran := map[string]string{}
		for _, j := range rec.jobs {
			ran[res.taskName(t, j.task)] = []string{"n0", "n1", "n2"}[j.node]
		}
		if want := map[string]string{"A": "n0", "B": "n0", "C": "n1", "D": "n2"}; !reflect.DeepEqual(ran, want) {
			t.Errorf("%s: tasks ran on %v, want %v", res.Policies[i].Name, ran, want)
		}
	}
	// The plain policy's timeline: B's Pod is Pending from 30 s to 100 s.
	var pendingAt []time.Duration
	for _, p := range res.Policies[0].Timeline {
		if p.Pending > 0 {
			pendingAt = append(pendingAt, p.At)
		}
	}
	if len(pendingAt) == 0 || pendingAt[0] != 30*time.Second || pendingAt[len(pendingAt)-1] >= 100*time.Second {
		t.Errorf("plain: Pending at %v, want from 30s until before 100s", pendingAt)
	}
}

// taskName names a replayed task of the hand case by its index, in creation order.
func (res *OpenBResult) taskName(t *testing.T, i int) string {
	t.Helper()
	names := []string{"A", "B", "C", "D"}
	if i < 0 || i >= len(names) {
		t.Fatalf("task %d", i)
	}
	return names[i]
}

func approxPolicy(got, want OpenBPolicy) bool {
	near := func(a, b float64) bool { return math.Abs(a-b) <= 1e-9*max(1, math.Abs(b)) }
	return got.Name == want.Name && got.CapacityAware == want.CapacityAware && got.Jobs == want.Jobs &&
		got.EmptyJobs == want.EmptyJobs && got.PendingJobsMax == want.PendingJobsMax &&
		near(got.JobWaitP50, want.JobWaitP50) && near(got.JobWaitP99, want.JobWaitP99) &&
		near(got.JobWaitMean, want.JobWaitMean) && near(got.PendingGPUHours, want.PendingGPUHours) &&
		near(got.GPUHours, want.GPUHours) && near(got.GPUAllocation, want.GPUAllocation)
}

// TestOpenBSkippedPollsChangeNothing replays the hand case polling also when nothing
// waits: OpenB skips those polls because KEDA's rule can create no Job then, and the
// result must be the same.
func TestOpenBSkippedPollsChangeNothing(t *testing.T) {
	skipping, _ := replayHand(t, false)
	always, _ := replayHand(t, true)
	if !reflect.DeepEqual(skipping, always) {
		t.Errorf("skipping polls:\n%+v\npolling always:\n%+v", skipping, always)
	}
}

// TestOpenBSkippedPollsChangeNothingReal does the same on real tasks: those of the
// trace created in a busy stretch of 100,000 s (day 127 to 128) that ran under two
// hours, so that polling every 30 s until all are done stays short, on two nodes of
// 2 GPUs, where they queue and the plain ScaledJob leaves Pods Pending.
func TestOpenBSkippedPollsChangeNothingReal(t *testing.T) {
	pods, nodes := openBTrace(t)
	var busy []traces.OpenBPod
	for _, p := range pods {
		if run, ok := p.RunTime(); ok && run < 2*time.Hour && p.Created >= 11_000_000*time.Second && p.Created < 11_100_000*time.Second {
			busy = append(busy, p)
		}
	}
	in, err := newOpenBInput(busy, nodes, OpenBConfig{Nodes: 2, Seed: 7})
	if err != nil {
		t.Fatal(err)
	}
	skipping, _, err := in.replay(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	in.pollAlways = true
	always, _, err := in.replay(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if skipping.Policies[0].PendingJobsMax == 0 {
		t.Errorf("plain ScaledJob left no Pod Pending on %d GPUs: the case tests too little", skipping.GPUs)
	}
	if !reflect.DeepEqual(skipping, always) {
		t.Errorf("skipping polls:\n%+v\npolling always:\n%+v", skipping, always)
	}
}

// TestOpenBTriggers checks the ScaledJobs' trigger metadata, which the scaler must accept.
func TestOpenBTriggers(t *testing.T) {
	spec := openBGroupSpec{name: openBGroupName(2, []string{"V100M16", "V100M32"}), gpus: 2, models: []string{"V100M16", "V100M32"}}
	if spec.name != "openb-gpu2-v100m16-v100m32" {
		t.Errorf("group name %q", spec.name)
	}
	for _, capacityAware := range []bool{false, true} {
		md := spec.trigger(capacityAware)
		tr, err := scaler.ParseTrigger(openBNamespace, md, 0)
		if err != nil {
			t.Fatalf("capacityAware %v: %v", capacityAware, err)
		}
		if tr.CapacityAware != capacityAware || tr.QueueTarget != 1 || tr.StaleAfter != scaler.DefaultStreamMaxAge {
			t.Errorf("capacityAware %v: parsed %+v", capacityAware, tr)
		}
		if capacityAware && (tr.GPUsPerReplica != 2 || tr.NodeSelector.String() != "gpu-model in (V100M16,V100M32)") {
			t.Errorf("capacityAware: gpusPerReplica %d, nodeSelector %v", tr.GPUsPerReplica, tr.NodeSelector)
		}
	}
}

// openBSlice is the first 1,000 replayable tasks of the real trace on the default 12
// nodes: at their peak they ask for more GPUs than the 56 there.
var openBSlice = OpenBConfig{Limit: 1000, Seed: 7}

// TestOpenBInvariants replays a real slice and checks what must hold of any replay.
func TestOpenBInvariants(t *testing.T) {
	pods, nodes := openBTrace(t)
	in, err := newOpenBInput(pods, nodes, openBSlice)
	if err != nil {
		t.Fatal(err)
	}
	res, recs, err := in.replay(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if res.Jobs != 1000 || res.Nodes != DefaultOpenBNodes || res.GPUs != 56 {
		t.Fatalf("replayed %d tasks on %d nodes, %d GPUs; want 1000, %d, 56", res.Jobs, res.Nodes, res.GPUs, DefaultOpenBNodes)
	}
	for i, rec := range recs {
		p := res.Policies[i]
		t.Run(p.Name, func(t *testing.T) {
			checkRecord(t, in, rec, p)
		})
	}
	plain, capAware := res.Policies[0], res.Policies[1]
	if capAware.PendingJobsMax > plain.PendingJobsMax {
		t.Errorf("capacityAware left %d Pods Pending at once, more than the plain ScaledJob's %d", capAware.PendingJobsMax, plain.PendingJobsMax)
	}
	// GPUs are scarce in this slice: the plain ScaledJob creates Jobs that cannot be
	// placed, capacityAware creates only those free GPUs can take.
	if plain.PendingJobsMax == 0 || plain.PendingGPUHours == 0 {
		t.Errorf("plain ScaledJob: %d Pods Pending at most, %.1f GPU-hours; want some on a scarce slice", plain.PendingJobsMax, plain.PendingGPUHours)
	}
	if capAware.PendingJobsMax != 0 || capAware.PendingGPUHours != 0 {
		t.Errorf("capacityAware: %d Pods Pending at most, %.1f GPU-hours; want none", capAware.PendingJobsMax, capAware.PendingGPUHours)
	}
	t.Logf("plain: %+v", summaryLine(plain))
	t.Logf("capacityAware: %+v", summaryLine(capAware))
}

func summaryLine(p OpenBPolicy) OpenBPolicy {
	p.Timeline = nil
	return p
}

// checkRecord checks one policy's replay: every task ran once, for its run time, on one
// node, on GPUs no other Pod held then; and the figures agree with the record.
func checkRecord(t *testing.T, in *openBInput, rec *openBRecord, p OpenBPolicy) {
	t.Helper()
	ran := make([]int, len(in.tasks))
	type hold struct {
		start, end time.Duration
		job        string
	}
	holds := map[[2]int][]hold{} // (node, device) → holds
	var gpuSeconds float64
	var waits []float64
	for _, j := range rec.jobs {
		g := in.groups[j.group]
		if !j.placed {
			t.Errorf("Job %s was never placed", j.name)
			continue
		}
		if j.task < 0 {
			t.Errorf("Job %s found its queue empty", j.name)
			continue
		}
		task := in.tasks[j.task]
		ran[j.task]++
		if task.group != j.group || task.gpus != g.gpus {
			t.Errorf("Job %s of %s ran task %s of %d GPUs, group %d", j.name, g.name, task.name, task.gpus, task.group)
		}
		if j.start < task.created || j.start < j.created || j.end != j.start+task.run {
			t.Errorf("Job %s: created %s, started %s, ended %s; task created %s, runs %s", j.name, j.created, j.start, j.end, task.created, task.run)
		}
		if len(j.devices) != g.gpus {
			t.Errorf("Job %s holds %d GPUs, wants %d", j.name, len(j.devices), g.gpus)
		}
		node := in.nodes[j.node]
		if g.models != nil && !slices.Contains(g.models, node.Model) {
			t.Errorf("Job %s ran on %s (%s), allowed %v", j.name, node.Name, node.Model, g.models)
		}
		for _, d := range j.devices { // one node by construction: the devices are its
			if d < 0 || d >= node.GPUs {
				t.Errorf("Job %s holds GPU %d of %s, which has %d", j.name, d, node.Name, node.GPUs)
			}
			holds[[2]int{j.node, d}] = append(holds[[2]int{j.node, d}], hold{j.start, j.end, j.name})
		}
		gpuSeconds += float64(len(j.devices)) * (j.end - j.start).Seconds()
		waits = append(waits, (j.start - task.created).Seconds())
	}
	for i, n := range ran {
		if n != 1 {
			t.Errorf("task %s ran %d times, want once", in.tasks[i].name, n)
		}
	}
	for k, hs := range holds {
		sort.Slice(hs, func(a, b int) bool { return hs[a].start < hs[b].start })
		for i := 1; i < len(hs); i++ {
			if hs[i].start < hs[i-1].end {
				t.Errorf("GPU %d of node %d held by %s until %s and by %s from %s", k[1], k[0], hs[i-1].job, hs[i-1].end, hs[i].job, hs[i].start)
			}
		}
	}
	// The figures: GPU-hours from the Jobs, and as the integral of the GPUs the nodes held.
	if !near(p.GPUHours*3600, gpuSeconds) || !near(p.GPUHours*3600, rec.heldGPUSeconds) {
		t.Errorf("GPU-hours %f; from the Jobs %f, integral of GPUs held %f", p.GPUHours, gpuSeconds/3600, rec.heldGPUSeconds/3600)
	}
	slices.Sort(waits)
	if p.JobWaitP50 != inference.Quantile(waits, 0.5) || p.JobWaitP99 != inference.Quantile(waits, 0.99) || len(waits) != len(in.tasks) || waits[0] < 0 {
		t.Errorf("waits p50 %v, p99 %v over %d tasks; want %v, %v over %d, none negative", p.JobWaitP50, p.JobWaitP99, len(waits),
			inference.Quantile(waits, 0.5), inference.Quantile(waits, 0.99), len(in.tasks))
	}
	if p.Jobs != len(rec.jobs) || p.EmptyJobs != 0 {
		t.Errorf("%d Jobs, %d empty; record %d Jobs, want none empty with queueTarget 1", p.Jobs, p.EmptyJobs, len(rec.jobs))
	}
	if len(p.Timeline) == 0 || len(p.Timeline) > openBTimelinePoints {
		t.Errorf("timeline of %d points, want 1 to %d", len(p.Timeline), openBTimelinePoints)
	}
	mostPending := 0
	for _, pt := range p.Timeline {
		mostPending = max(mostPending, pt.Pending)
	}
	if mostPending != p.PendingJobsMax {
		t.Errorf("timeline shows %d Pods Pending at most, PendingJobsMax %d", mostPending, p.PendingJobsMax)
	}
}

func near(a, b float64) bool { return math.Abs(a-b) <= 1e-6*max(1, math.Abs(b)) }

// TestOpenBDeterministic replays the slice twice with one seed, and once with another:
// the same seed gives the same result, and the seed is used (it sets the polls' phases).
func TestOpenBDeterministic(t *testing.T) {
	pods, nodes := openBTrace(t)
	cfg := openBSlice
	cfg.Limit = 300
	a, err := OpenB(t.Context(), pods, nodes, cfg)
	if err != nil {
		t.Fatal(err)
	}
	b, err := OpenB(t.Context(), pods, nodes, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(a, b) {
		t.Errorf("same seed, different results:\n%+v\n%+v", a, b)
	}
	cfg.Seed++
	c, err := OpenB(t.Context(), pods, nodes, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if reflect.DeepEqual(a.Policies[0].JobWaitMean, c.Policies[0].JobWaitMean) {
		t.Errorf("seeds %d and %d gave the same mean wait %v: the seed draws the polls' phases", cfg.Seed-1, cfg.Seed, a.Policies[0].JobWaitMean)
	}
}

// TestOpenBProgress checks that Progress hears a growing count that ends at the total.
func TestOpenBProgress(t *testing.T) {
	pods, nodes := handCase()
	var calls [][2]int
	_, err := OpenB(t.Context(), pods, nodes, OpenBConfig{Progress: func(done, total int) {
		calls = append(calls, [2]int{done, total}) // calls never overlap
	}})
	if err != nil {
		t.Fatal(err)
	}
	if len(calls) == 0 || calls[len(calls)-1] != [2]int{8, 8} {
		t.Fatalf("progress calls %v, want the last (8, 8): 4 tasks × 2 policies", calls)
	}
	for i := 1; i < len(calls); i++ {
		if calls[i][0] <= calls[i-1][0] {
			t.Errorf("progress went from %v to %v", calls[i-1], calls[i])
		}
	}
}

func TestOpenBErrors(t *testing.T) {
	pods, nodes := handCase()
	for name, tc := range map[string]struct {
		pods    []traces.OpenBPod
		nodes   []traces.OpenBNode
		cfg     OpenBConfig
		wantErr string
	}{
		"negative interval": {pods, nodes, OpenBConfig{PollingInterval: -time.Second}, "polling interval -1s"},
		"negative max":      {pods, nodes, OpenBConfig{MaxReplicaCount: -1}, "maxReplicaCount -1"},
		"negative limit":    {pods, nodes, OpenBConfig{Limit: -1}, "limit -1"},
		"negative nodes":    {pods, nodes, OpenBConfig{Nodes: -1}, "nodes -1"},
		"no GPU node":       {pods, []traces.OpenBNode{{Name: "cpu"}}, OpenBConfig{}, "no node with GPUs"},
		"no GPU task":       {pods[3:6], nodes, OpenBConfig{}, "no GPU task to replay among 3 tasks"},
		"bad node name":     {pods, []traces.OpenBNode{{Name: "Node_0", GPUs: 8, Model: "T4"}}, OpenBConfig{}, "Node_0"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := OpenB(t.Context(), tc.pods, tc.nodes, tc.cfg)
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("got error %v, want one containing %q", err, tc.wantErr)
			}
		})
	}
}

func TestOpenBCanceled(t *testing.T) {
	pods, nodes := handCase()
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, err := OpenB(ctx, pods, nodes, OpenBConfig{}); !errors.Is(err, context.Canceled) {
		t.Errorf("got error %v, want context.Canceled", err)
	}
}

// TestOpenBNodeSample checks the evenly spaced sample of nodes.
func TestOpenBNodeSample(t *testing.T) {
	_, nodes := openBTrace(t)
	pods, _ := handCase()
	for _, tc := range []struct {
		nodes, want int
		first       []string
	}{
		{0, DefaultOpenBNodes, []string{"openb-node-0000", "openb-node-0101", "openb-node-0202"}},
		{2, 2, []string{"openb-node-0000", "openb-node-0606"}},
		{5000, 1213, []string{"openb-node-0000", "openb-node-0001", "openb-node-0002"}},
	} {
		in, err := newOpenBInput(pods, nodes, OpenBConfig{Nodes: tc.nodes})
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, n := range in.nodes[:min(3, len(in.nodes))] {
			names = append(names, n.Name)
		}
		if len(in.nodes) != tc.want || !slices.Equal(names, tc.first) {
			t.Errorf("Nodes %d: %d nodes beginning %v; want %d beginning %v", tc.nodes, len(in.nodes), names, tc.want, tc.first)
		}
	}
}

func TestThin(t *testing.T) {
	var points []OpenBPoint
	for i := range 10_000 {
		points = append(points, OpenBPoint{At: time.Duration(i) * time.Second, Waiting: i % 7, Running: i % 100, Pending: i / 1000})
	}
	points[5000].Pending = 99 // a spike a chart must show
	got := thin(points, 2000)
	if len(got) > 2000 || len(got) < 1900 {
		t.Fatalf("%d points, want at most 2000 and not far below", len(got))
	}
	most := OpenBPoint{}
	for i, p := range got {
		if i > 0 && p.At <= got[i-1].At {
			t.Fatalf("point %d at %s after %s", i, p.At, got[i-1].At)
		}
		most.Waiting, most.Running, most.Pending = max(most.Waiting, p.Waiting), max(most.Running, p.Running), max(most.Pending, p.Pending)
	}
	if most != (OpenBPoint{Waiting: 6, Running: 99, Pending: 99}) {
		t.Errorf("most of each count %+v, want 6, 99, 99", most)
	}
	if short := points[:10]; !slices.Equal(thin(short, 2000), short) {
		t.Error("thin changed a short timeline")
	}
}

// BenchmarkOpenB replays the whole trace on the default nodes, both policies.
func BenchmarkOpenB(b *testing.B) {
	pods, nodes := openBTrace(b)
	for _, bc := range []struct {
		name  string
		nodes int
	}{{"default", 0}, {"all-nodes", len(nodes)}} {
		b.Run(bc.name, func(b *testing.B) {
			var res *OpenBResult
			for b.Loop() {
				var err error
				if res, err = OpenB(b.Context(), pods, nodes, OpenBConfig{Nodes: bc.nodes}); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(res.Jobs), "tasks")
		})
	}
}
