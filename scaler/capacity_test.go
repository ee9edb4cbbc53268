package scaler

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"strconv"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"

	gpuscalerv1 "github.com/gpuscaler/gpuscaler/proto/gpuscaler/v1"
)

// capacityNode builds a node report with labels, whole GPUs (total, of which used are
// allocated) and MIG devices given as profile → (total, used). mixed offers MIG devices
// as nvidia.com/mig-<profile> without MigProfile, as the mixed strategy does.
func capacityNode(name string, labels map[string]string, whole, wholeUsed int, mig map[string][2]int, mixed bool) gpuscalerv1.Event {
	r := &gpuscalerv1.NodeReport{Node: name, NodeLabels: labels}
	add := func(id, resource, profile string, used bool) {
		d := &gpuscalerv1.Device{Id: id, Resource: resource, MigProfile: profile}
		r.Allocatable = append(r.Allocatable, d)
		if used {
			r.Allocated = append(r.Allocated, d)
		}
	}
	for i := range whole {
		add(fmt.Sprintf("GPU-%s-%d", name, i), "nvidia.com/gpu", "", i < wholeUsed)
	}
	for profile, n := range mig {
		for i := range n[0] {
			resource, p := "nvidia.com/gpu", profile // the single strategy names the profile only in MigProfile
			if mixed {
				resource, p = "nvidia.com/mig-"+profile, ""
			}
			add(fmt.Sprintf("MIG-%s-%s-%d", name, profile, i), resource, p, i < n[1])
		}
	}
	return gpuscalerv1.Event{Subject: gpuscalerv1.Subject{Kind: gpuscalerv1.KindNode, Node: name}, Node: r}
}

// readyServer is a Server over s, ready, as the gRPC handlers use it.
func readyServer(s *State) *Server {
	ready := make(chan struct{})
	close(ready)
	return &Server{state: s, ready: ready, done: make(chan struct{}), stale: DefaultStaleAfter, maxStale: DefaultStreamMaxAge}
}

func TestCapacityCap(t *testing.T) {
	clock := newFakeClock(t0)
	s := NewState(clock.Now)
	a100, h100 := map[string]string{"pool": "a100"}, map[string]string{"pool": "h100"}
	s.Apply(capacityNode("a1", a100, 8, 6, nil, false), t0)                                    // 2 whole GPUs free
	s.Apply(capacityNode("h1", h100, 8, 1, nil, false), t0)                                    // 7 free
	s.Apply(capacityNode("mig1", a100, 0, 0, map[string][2]int{"1g.10gb": {7, 3}}, false), t0) // 4 slices free
	s.Apply(capacityNode("mig2", h100, 0, 0, map[string][2]int{"3g.40gb": {2, 0}}, true), t0)  // 2 free, mixed strategy
	s.Apply(capacityNode("stale", a100, 8, 0, nil, false), t0.Add(-time.Minute))               // silent: counts as full
	s.Apply(queueEvent("ml", "train", 50, 3), t0)                                              // 50 waiting, 3 running
	s.Apply(queueEvent("ml", "small", 1, 0), t0)

	tests := map[string]struct {
		md   map[string]string
		want float64
	}{
		"every node, one GPU each":        {map[string]string{"queue": "train"}, 3 + 2 + 7},
		"a100 nodes only":                 {map[string]string{"queue": "train", "nodeSelector": "pool=a100"}, 3 + 2},
		"two GPUs each, rounded per node": {map[string]string{"queue": "train", "gpusPerReplica": "2"}, 3 + 1 + 3},
		// 9 free GPUs would take two 4-GPU replicas if pooled, but a replica cannot span
		// nodes: a1's 2 take none, h1's 7 take one.
		"four GPUs each, rounded per node": {map[string]string{"queue": "train", "gpusPerReplica": "4"}, 3 + 0 + 1},
		"MIG 1g.10gb slices":               {map[string]string{"queue": "train", "gpusPerReplica": "1g.10gb"}, 3 + 4},
		"MIG 3g.40gb, mixed strategy":      {map[string]string{"queue": "train", "gpusPerReplica": "3g.40gb"}, 3 + 2},
		"a profile nobody offers":          {map[string]string{"queue": "train", "gpusPerReplica": "7g.80gb"}, 3},
		"no matching node, headroom 2":     {map[string]string{"queue": "train", "nodeSelector": "pool=b200", "capacityHeadroom": "2"}, 3 + 0 + 2},
		"headroom adds to free GPUs":       {map[string]string{"queue": "train", "capacityHeadroom": "5"}, 3 + 9 + 5},
		"backlog below capacity":           {map[string]string{"queue": "small"}, 1},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			md := map[string]string{"capacityAware": "true", "gpusPerReplica": "1"}
			for k, v := range tc.md {
				md[k] = v
			}
			r := readyServer(s).read(mustTrigger(t, "ml", md))
			wantMetric(t, r, MetricQueueBacklog, tc.want)
			if active, err := r.Active(); !active || err != nil {
				t.Fatalf("Active() = %v, %v; want true: the queue has work whatever the capacity", active, err)
			}
		})
	}

	t.Run("without capacityAware the backlog is whole", func(t *testing.T) {
		wantMetric(t, readyServer(s).read(mustTrigger(t, "ml", map[string]string{"queue": "train"})), MetricQueueBacklog, 53)
	})
}

// TestCapacityUnknown: with no fresh node the cap cannot be made, so the backlog and the
// activation decision both fail with Unavailable, not the uncapped backlog (Jobs left
// Pending) nor 0 (work stopped in silence). KEDA asks a ScaledJob trigger's metric first
// and drops a trigger that errors without asking IsActive (GetMetricsAndActivity,
// pkg/scalers/external_scaler.go; getScaledJobMetrics, pkg/scaling/scale_handler.go):
// it creates no Job, the running ones go on, and the ScaledJob's Ready condition says so
// (RequestJobScale, pkg/scaling/executor/scale_jobs.go; test/keda TestScaledJobCapacityUnknown).
func TestCapacityUnknown(t *testing.T) {
	clock := newFakeClock(t0)
	s := NewState(clock.Now)
	tr := mustTrigger(t, "ml", map[string]string{"queue": "train", "capacityAware": "true", "gpusPerReplica": "1"})
	s.Apply(queueEvent("ml", "train", 5, 0), t0)

	r := readyServer(s).read(tr)
	_, err := r.Metric(MetricQueueBacklog)
	wantUnavailable(t, err, "capacity unknown: no node report since this scaler started")
	if active, err := r.Active(); active || !errors.Is(err, ErrUnavailable) {
		t.Fatalf("Active() = %v, %v; want false, ErrUnavailable: the cap, and so the answer, is unknown", active, err)
	}

	s.Apply(capacityNode("a1", nil, 8, 0, nil, false), t0)
	clock.Advance(time.Minute)
	s.Apply(queueEvent("ml", "train", 5, 0), clock.Now())
	_, err = readyServer(s).read(tr).Metric(MetricQueueBacklog)
	wantUnavailable(t, err, "capacity unknown: no node has reported since 2026-11-22T10:00:00Z, 1m0s ago")
}

// kedaJobsToCreate is what KEDA v2.21 does with a capacityAware ScaledJob trigger's value:
// the value and the target reach it as quantities printed to three decimals
// (pkg/scalers/scaler.go, quantityFromFloat64), it divides the value by the target
// (pkg/scaling/scaledjob/metrics.go, CalculateQueueLengthAndMaxValue), rounds up
// (IsScaledJobActive), and under the default scaling strategy creates that many Jobs less
// those not finished yet beyond the ScaledJob's minReplicaCount; with fewer unfinished
// than minReplicaCount it creates the difference whatever the value
// (pkg/scaling/executor/scale_jobs.go, getScalingDecision, defaultScalingStrategy).
func kedaJobsToCreate(value, target float64, unfinished, minReplicas int) int {
	if unfinished < minReplicas {
		return minReplicas - unfinished
	}
	quantity := func(v float64) float64 {
		q := resource.MustParse(fmt.Sprintf("%.3f", v))
		return q.AsApproximateFloat64()
	}
	jobs := int(math.Ceil(quantity(value) / quantity(target)))
	return max(0, jobs-(unfinished-minReplicas))
}

// TestCapacityCapInJobs: a capacityAware trigger's value, divided by queueTarget as KEDA
// divides it, is the Jobs running (one per queueTarget items in flight, rounded up, as
// KEDA made them) plus those free GPUs can take, plus the headroom: KEDA then creates
// exactly as many Jobs as the free GPUs (and headroom) take, whatever the target.
func TestCapacityCapInJobs(t *testing.T) {
	tests := map[string]struct {
		target            string
		waiting, inFlight uint64
		running           int // the Jobs KEDA counts as not finished
		headroom          string
		minReplicas       int // the ScaledJob's minReplicaCount, repeated in the trigger
		want              int // Jobs KEDA creates
	}{
		// The case the issue names: 2 Jobs of 4 items each running, 8 GPUs free.
		"queueTarget 4":                {target: "4", waiting: 100, inFlight: 8, running: 2, want: 8},
		"queueTarget 4, part batch":    {target: "4", waiting: 100, inFlight: 7, running: 2, want: 8},
		"queueTarget 4, headroom 2":    {target: "4", waiting: 100, inFlight: 8, running: 2, headroom: "2", want: 10},
		"queueTarget 1":                {target: "1", waiting: 100, inFlight: 3, running: 3, want: 8},
		"queueTarget 2.5":              {target: "2.5", waiting: 100, inFlight: 5, running: 2, want: 8},
		"queueTarget 3":                {target: "3", waiting: 100, inFlight: 4, running: 2, want: 8},
		"queueTarget 7":                {target: "7", waiting: 1000, inFlight: 14, running: 2, want: 8},
		"queueTarget 0.5":              {target: "0.5", waiting: 100, inFlight: 3, running: 6, want: 8},
		"queueTarget 0.1":              {target: "0.1", waiting: 100, inFlight: 1, running: 10, want: 8},
		"queueTarget 0.3":              {target: "0.3", waiting: 100, inFlight: 1, running: 4, want: 8},
		"queueTarget 0.003":            {target: "0.003", waiting: 100, inFlight: 1, running: 334, want: 8},
		"queueTarget 12345.678":        {target: "12345.678", waiting: 1_000_000, inFlight: 20000, running: 2, want: 8},
		"nothing running":              {target: "4", waiting: 100, want: 8},
		"backlog below capacity":       {target: "4", waiting: 10, inFlight: 8, running: 2, want: 3},
		"backlog below capacity, 0.5":  {target: "0.5", waiting: 1, inFlight: 1, running: 2, want: 2},
		"queueTarget 4, nothing waits": {target: "4", inFlight: 8, running: 2, want: 0},
		// minReplicaCount 2: KEDA leaves 2 unfinished Jobs out of what it subtracts, so
		// the cap must leave them out of the running Jobs too. The case: both
		// standby Jobs busy and the 8 GPUs taken by others, so none may be created.
		"minReplicaCount 2, standby busy, 8 free":     {target: "1", waiting: 50, inFlight: 2, running: 2, minReplicas: 2, want: 8},
		"minReplicaCount 2, 4 busy, 8 free":           {target: "1", waiting: 50, inFlight: 4, running: 4, minReplicas: 2, want: 8},
		"minReplicaCount 2, queueTarget 4, 8 free":    {target: "4", waiting: 100, inFlight: 16, running: 4, minReplicas: 2, want: 8},
		"minReplicaCount 2, queueTarget 0.5, 8 free":  {target: "0.5", waiting: 100, inFlight: 2, running: 4, minReplicas: 2, want: 8},
		"minReplicaCount 2, headroom 1, 8 free":       {target: "1", waiting: 50, inFlight: 3, running: 3, minReplicas: 2, headroom: "1", want: 9},
		"minReplicaCount 2, small backlog":            {target: "1", waiting: 3, inFlight: 2, running: 2, minReplicas: 2, want: 3},
		"minReplicaCount 3, one standby Job finished": {target: "1", waiting: 50, inFlight: 2, running: 2, minReplicas: 3, want: 1},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			s := NewState(newFakeClock(t0).Now)
			s.Apply(capacityNode("a1", nil, 8, 0, nil, false), t0) // 8 GPUs free
			s.Apply(queueEvent("ml", "train", tc.waiting, tc.inFlight), t0)
			md := map[string]string{"queue": "train", "capacityAware": "true", "gpusPerReplica": "1", "queueTarget": tc.target}
			if tc.headroom != "" {
				md["capacityHeadroom"] = tc.headroom
			}
			if tc.minReplicas > 0 {
				md["minReplicaCount"] = strconv.Itoa(tc.minReplicas)
			}
			tr := mustTrigger(t, "ml", md)
			v, err := readyServer(s).read(tr).Metric(MetricQueueBacklog)
			if err != nil {
				t.Fatal(err)
			}
			if got := kedaJobsToCreate(v, tr.QueueTarget, tc.running, tc.minReplicas); got != tc.want {
				t.Fatalf("value %v with queueTarget %v, %d Jobs running and minReplicaCount %d: KEDA creates %d Jobs, want %d",
					v, tr.QueueTarget, tc.running, tc.minReplicas, got, tc.want)
			}
		})
	}
}

// TestCapBacklogMatchesKEDA: for targets across their range, whole and fractional, KEDA's
// arithmetic turns the cap for n Jobs into exactly n Jobs, never n+1 (a Job Pending for
// want of GPUs) nor n-1.
func TestCapBacklogMatchesKEDA(t *testing.T) {
	var targets []float64
	for m := 1; m <= 5000; m += 7 {
		targets = append(targets, float64(m)/1000)
	}
	targets = append(targets, 0.002, 0.003, 1, 2, 7, 10, 64, 12345.678, 1e6)
	for _, target := range targets {
		for n := 1; n <= 100; n++ {
			v := capBacklog(target, n)
			if got := kedaJobsToCreate(v, target, 0, 0); got != n {
				t.Fatalf("queueTarget %v, %d Jobs: cap %v makes KEDA create %d", target, n, v, got)
			}
		}
	}
}

// jobsNode is an 8-GPU node on which the pods of ScaledJob ml/trainer's Jobs named in
// jobs hold one GPU each, labelled as KEDA labels them (generateJobs,
// pkg/scaling/executor/scale_jobs.go), another namespace's pods hold others more, and
// the rest are free.
func jobsNode(name string, jobs []string, others int) gpuscalerv1.Event {
	var gpus []*gpuscalerv1.GPUSample
	r := &gpuscalerv1.NodeReport{Node: name, Source: "sim"}
	for i := range 8 {
		id := fmt.Sprintf("GPU-%s-%d", name, i)
		d := &gpuscalerv1.Device{Id: id, Resource: "nvidia.com/gpu"}
		r.Allocatable = append(r.Allocatable, d)
		switch {
		case i < len(jobs):
			gpus = append(gpus, gpu(id, "ml", jobs[i], map[string]string{"scaledjob.keda.sh/name": "trainer"}, 90, 10, 80))
		case i < len(jobs)+others:
			gpus = append(gpus, gpu(id, "web", fmt.Sprintf("llm-%d", i), map[string]string{"app": "llm"}, 40, 10, 80))
		default:
			continue
		}
		r.Allocated = append(r.Allocated, d)
	}
	r.Gpus = gpus
	return gpuscalerv1.Event{Subject: gpuscalerv1.Subject{Kind: gpuscalerv1.KindNode, Node: name}, Node: r}
}

// TestCapacityCountsJobsHoldingGPUs: a Job that holds its GPUs without an item (loading
// its model, or finishing after acking it) is not free capacity, and KEDA counts it as
// unfinished (getRunningJobCount, pkg/scaling/executor/scale_jobs.go). Counted from the
// items in flight, it would be missing from the running Jobs and so subtracted twice:
// a node's free GPUs would go unused until it took an item. With podSelector selecting
// the Jobs' pods, the cap counts the pods holding devices as the running Jobs.
func TestCapacityCountsJobsHoldingGPUs(t *testing.T) {
	const jobsSelector = "scaledjob.keda.sh/name=trainer"
	tests := map[string]struct {
		jobs        []string // the trainer Jobs' pods holding a GPU on node a1
		inFlight    uint64   // of the queue's items (50 more wait)
		md          map[string]string
		unfinished  int // the Jobs KEDA counts as not finished
		minReplicas int
		want        int // Jobs KEDA creates
	}{
		// 3 Jobs hold GPUs, one of them with an item; 5 GPUs free.
		"two Jobs loading, counted from their pods": {
			jobs: []string{"trainer-0", "trainer-1", "trainer-2"}, inFlight: 1,
			md: map[string]string{"podSelector": jobsSelector}, unfinished: 3, want: 5},
		"two Jobs loading, minReplicaCount 2": {
			jobs: []string{"trainer-0", "trainer-1", "trainer-2"}, inFlight: 1,
			md: map[string]string{"podSelector": jobsSelector, "minReplicaCount": "2"}, unfinished: 3, minReplicas: 2, want: 5},
		// A Job created and not yet scheduled holds no GPU: KEDA subtracts it, and it
		// will take one of the free GPUs.
		"one Job Pending": {
			jobs: []string{"trainer-0", "trainer-1"}, inFlight: 2,
			md: map[string]string{"podSelector": jobsSelector}, unfinished: 3, want: 5},
		"every Job with an item": {
			jobs: []string{"trainer-0", "trainer-1", "trainer-2"}, inFlight: 3,
			md: map[string]string{"podSelector": jobsSelector}, unfinished: 3, want: 5},
		// Without podSelector the Jobs are counted from the items in flight: 2 of the 5
		// free GPUs stay unused until the loading Jobs take items.
		"two Jobs loading, without podSelector": {
			jobs: []string{"trainer-0", "trainer-1", "trainer-2"}, inFlight: 1, unfinished: 3, want: 3},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			s := NewState(newFakeClock(t0).Now)
			s.Apply(jobsNode("a1", tc.jobs, 0), t0)
			s.Apply(queueEvent("ml", "train", 50, tc.inFlight), t0)
			md := map[string]string{"queue": "train", "capacityAware": "true", "gpusPerReplica": "1"}
			maps.Copy(md, tc.md)
			tr := mustTrigger(t, "ml", md)
			r := readyServer(s).read(tr)
			v, err := r.Metric(MetricQueueBacklog)
			if err != nil {
				t.Fatal(err)
			}
			if got := kedaJobsToCreate(v, tr.QueueTarget, tc.unfinished, tc.minReplicas); got != tc.want {
				t.Errorf("value %v: KEDA creates %d Jobs, want %d", v, got, tc.want)
			}
			if active, err := r.Active(); !active || err != nil {
				t.Errorf("Active() = %v, %v; want true, on the backlog", active, err)
			}
		})
	}

	// The Jobs' pods give no GPU metric or activity: an empty queue is inactive however
	// many Jobs hold GPUs, or KEDA would create Jobs because Jobs run.
	t.Run("empty queue, Jobs holding GPUs", func(t *testing.T) {
		s := NewState(newFakeClock(t0).Now)
		s.Apply(jobsNode("a1", []string{"trainer-0"}, 0), t0)
		s.Apply(queueEvent("ml", "train", 0, 0), t0)
		tr := mustTrigger(t, "ml", map[string]string{"queue": "train", "capacityAware": "true", "gpusPerReplica": "1", "podSelector": jobsSelector})
		r := readyServer(s).read(tr)
		wantMetric(t, r, MetricQueueBacklog, 0)
		if active, err := r.Active(); active || err != nil {
			t.Errorf("Active() = %v, %v; want false, nil", active, err)
		}
		if _, err := r.Metric(MetricGPUUtil); !errors.Is(err, ErrUnknownMetric) {
			t.Errorf("gpu-util: got %v, want ErrUnknownMetric", err)
		}
	})

	// A node holding a Job's pod that falls silent: whether the Job still holds its
	// GPUs is unknown, so the cap is Unavailable, as a GPU metric would be.
	t.Run("a node holding a Job's pod silent", func(t *testing.T) {
		clock := newFakeClock(t0)
		s := NewState(clock.Now)
		s.Apply(jobsNode("a1", []string{"trainer-0"}, 0), t0)
		clock.Advance(time.Minute)
		s.Apply(jobsNode("b1", nil, 0), clock.Now())
		s.Apply(queueEvent("ml", "train", 5, 1), clock.Now())
		tr := mustTrigger(t, "ml", map[string]string{"queue": "train", "capacityAware": "true", "gpusPerReplica": "1", "podSelector": jobsSelector})
		r := readyServer(s).read(tr)
		_, err := r.Metric(MetricQueueBacklog)
		wantUnavailable(t, err, "node a1 last reported", "trainer-0")
		if _, err := r.Active(); !errors.Is(err, ErrUnavailable) {
			t.Errorf("Active() error %v, want ErrUnavailable", err)
		}
	})
}

// scheduled sets what ev's collector read of its Node: cordoned, and its taints as
// "key=value:Effect" or "key:Effect".
func scheduled(ev gpuscalerv1.Event, cordoned bool, taints ...string) gpuscalerv1.Event {
	s := &gpuscalerv1.NodeScheduling{Unschedulable: cordoned}
	for _, t := range taints {
		kv, effect, _ := strings.Cut(t, ":")
		k, v, _ := strings.Cut(kv, "=")
		s.Taints = append(s.Taints, &gpuscalerv1.Taint{Key: k, Value: v, Effect: effect})
	}
	ev.Node.Scheduling = s
	return ev
}

// TestCapacitySchedulable: free GPUs on a node the scheduler will not place a Job on are
// not capacity. Free is allocatable less allocated whatever the node's state, so before,
// draining an 8-GPU node made 8 Jobs that stayed Pending. The scheduler's filters:
//   - NodeUnschedulable (kubernetes v1.36.4 pkg/scheduler/framework/plugins/
//     nodeunschedulable/node_unschedulable.go): a cordoned node (spec.unschedulable) takes
//     no pod unless it tolerates the taint node.kubernetes.io/unschedulable:NoSchedule;
//   - TaintToleration (plugins/tainttoleration/taint_toleration.go, Filter): a pod must
//     tolerate every NoSchedule and NoExecute taint (helper.DoNotScheduleTaintsFilterFunc).
//     The cluster autoscaler taints a node it is removing ToBeDeletedByClusterAutoscaler,
//     NoSchedule (cluster-autoscaler utils/taints; named in kubernetes
//     pkg/proxy/healthcheck/proxy_health.go, ToBeDeletedTaint).
//
// A pod asking for an extended resource is given a toleration of the taint of that
// resource's name, NoSchedule, by the ExtendedResourceToleration admission plugin
// (plugin/pkg/admission/extendedresourcetoleration/admission.go: Operator Exists,
// Effect NoSchedule), which GKE enables, and which GPU Jobs carry by hand elsewhere, since
// no pod runs on a pool tainted so without it: such a taint is tolerated for the
// resource the trigger's Jobs ask for, and only for it.
func TestCapacitySchedulable(t *testing.T) {
	s := NewState(newFakeClock(t0).Now)
	s.Apply(capacityNode("a-free", nil, 4, 1, nil, false), t0)                                                                                 // 3 free, untainted
	s.Apply(scheduled(capacityNode("b-drained", nil, 8, 0, nil, false), true), t0)                                                             // cordoned: 8 free, none placed
	s.Apply(scheduled(capacityNode("c-autoscaled", nil, 8, 0, nil, false), false, "ToBeDeletedByClusterAutoscaler=1732700000:NoSchedule"), t0) // being removed
	s.Apply(scheduled(capacityNode("d-unreachable", nil, 2, 0, nil, false), false, "node.kubernetes.io/unreachable:NoExecute"), t0)
	s.Apply(scheduled(capacityNode("e-gpu-pool", nil, 5, 0, nil, false), false, "nvidia.com/gpu=present:NoSchedule"), t0) // GKE's GPU taint
	s.Apply(scheduled(capacityNode("f-dedicated", nil, 6, 0, nil, false), false, "dedicated=ml:NoSchedule"), t0)
	s.Apply(scheduled(capacityNode("g-gpu-noexecute", nil, 7, 0, nil, false), false, "nvidia.com/gpu:NoExecute"), t0) // not what the plugin adds
	s.Apply(capacityNode("h-old-collector", nil, 1, 0, nil, false), t0)                                               // no scheduling reported: counted, as before
	s.Apply(scheduled(capacityNode("i-mig-mixed", nil, 0, 0, map[string][2]int{"1g.10gb": {7, 0}}, true), false, "nvidia.com/mig-1g.10gb:NoSchedule"), t0)
	s.Apply(scheduled(capacityNode("j-mig-gpu-taint", nil, 0, 0, map[string][2]int{"1g.10gb": {2, 0}}, true), false, "nvidia.com/gpu=present:NoSchedule"), t0)
	s.Apply(scheduled(capacityNode("k-prefer", nil, 1, 0, nil, false), false), t0) // PreferNoSchedule is never reported: placeable
	s.Apply(queueEvent("ml", "train", 100, 0), t0)

	tests := map[string]struct {
		md   map[string]string
		want float64
	}{
		// a-free 3, e-gpu-pool 5, h-old-collector 1, k-prefer 1.
		"untolerated nodes left out": {nil, 3 + 5 + 1 + 1},
		"a dedicated pool tolerated": {map[string]string{"tolerations": "dedicated=ml:NoSchedule"}, 3 + 5 + 1 + 1 + 6},
		"another dedicated value":    {map[string]string{"tolerations": "dedicated=web:NoSchedule"}, 3 + 5 + 1 + 1},
		"dedicated, any value":       {map[string]string{"tolerations": "dedicated"}, 3 + 5 + 1 + 1 + 6},
		"cordoned nodes tolerated":   {map[string]string{"tolerations": "node.kubernetes.io/unschedulable:NoSchedule"}, 3 + 5 + 1 + 1 + 8},
		"every taint tolerated":      {map[string]string{"tolerations": "*"}, 3 + 8 + 8 + 2 + 5 + 6 + 7 + 1 + 1},
		"NoSchedule only":            {map[string]string{"tolerations": "*:NoSchedule"}, 3 + 8 + 8 + 5 + 6 + 1 + 1},
		// The mixed strategy's slices are nvidia.com/mig-1g.10gb: a Job asking for one
		// tolerates that taint, not nvidia.com/gpu's.
		"MIG slices": {map[string]string{"gpusPerReplica": "1g.10gb"}, 7},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			md := map[string]string{"queue": "train", "capacityAware": "true", "gpusPerReplica": "1"}
			for k, v := range tc.md {
				md[k] = v
			}
			wantMetric(t, readyServer(s).read(mustTrigger(t, "ml", md)), MetricQueueBacklog, tc.want)
		})
	}
}

// withResources sets what ev's collector read of its node's CPU and memory: allocatable
// and requested by its pods, as Kubernetes quantities.
func withResources(ev gpuscalerv1.Event, cpu, memory, cpuRequested, memoryRequested string) gpuscalerv1.Event {
	q := func(s string) resource.Quantity { return resource.MustParse(s) }
	cpuQ, memQ, cpuReqQ, memReqQ := q(cpu), q(memory), q(cpuRequested), q(memoryRequested)
	ev.Node.Resources = &gpuscalerv1.NodeResources{
		CpuAllocatableMillis: uint64(cpuQ.MilliValue()), MemoryAllocatableBytes: uint64(memQ.Value()),
		CpuRequestedMillis: uint64(cpuReqQ.MilliValue()), MemoryRequestedBytes: uint64(memReqQ.Value()),
	}
	return ev
}

// TestCapacityCPUAndMemory: free GPUs on a node out of CPU or memory for a Job's
// requests are not capacity. The scheduler's NodeResourcesFit filter (kubernetes v1.36.4
// pkg/scheduler/framework/plugins/noderesources/fit.go, fitsRequest) places a pod only
// where allocatable less the requests of the pods bound there covers its own requests,
// for CPU and memory as for nvidia.com/gpu. So a node takes
// min(⌊free GPUs / gpusPerReplica⌋, ⌊free CPU / cpuPerReplica⌋, ⌊free memory /
// memoryPerReplica⌋) Jobs, the last two where the trigger gives them and the node
// reports its CPU and memory; a node that does not is counted on its GPUs, as before.
func TestCapacityCPUAndMemory(t *testing.T) {
	s := NewState(newFakeClock(t0).Now)
	// 8 free GPUs each.
	s.Apply(withResources(capacityNode("a-roomy", nil, 8, 0, nil, false), "192", "2Ti", "10", "100Gi"), t0)          // room for 8 Jobs of 16 CPUs, 200Gi
	s.Apply(withResources(capacityNode("b-cpu", nil, 8, 0, nil, false), "96", "2Ti", "40", "100Gi"), t0)             // 56 CPUs free: 3 Jobs of 16
	s.Apply(withResources(capacityNode("c-memory", nil, 8, 0, nil, false), "192", "1Ti", "10", "500Gi"), t0)         // 524Gi free: 2 Jobs of 200Gi
	s.Apply(withResources(capacityNode("d-both", nil, 8, 0, nil, false), "32", "256Gi", "31500m", "250Gi"), t0)      // 500m and 6Gi free: none
	s.Apply(withResources(capacityNode("e-overcommitted", nil, 8, 0, nil, false), "64", "512Gi", "70", "100Gi"), t0) // requests beyond allocatable: none
	s.Apply(capacityNode("f-unknown", nil, 8, 0, nil, false), t0)                                                    // no resources reported: GPUs alone
	s.Apply(withResources(capacityNode("g-full-gpus", nil, 8, 8, nil, false), "192", "2Ti", "0", "0"), t0)           // CPU and memory, but no GPU
	s.Apply(queueEvent("ml", "train", 100, 0), t0)

	tests := map[string]struct {
		md   map[string]string
		want float64
	}{
		"GPUs alone, as before": {nil, 8 + 8 + 8 + 8 + 8 + 8},
		// a 8, b 3, c 8, d 0 (500m), e 0, f 8.
		"CPU": {map[string]string{"cpuPerReplica": "16"}, 8 + 3 + 8 + 0 + 0 + 8},
		// a 8, b 8, c 2, d 0 (6Gi), e 2 (412Gi: its memory is not overcommitted), f 8.
		"memory":         {map[string]string{"memoryPerReplica": "200Gi"}, 8 + 8 + 2 + 0 + 2 + 8},
		"CPU and memory": {map[string]string{"cpuPerReplica": "16", "memoryPerReplica": "200Gi"}, 8 + 3 + 2 + 0 + 0 + 8},
		// d-both's 500m take one Job of 500m, and its 6Gi three of 2Gi.
		"small Jobs": {map[string]string{"cpuPerReplica": "500m", "memoryPerReplica": "2Gi"}, 8 + 8 + 8 + 1 + 0 + 8},
		// Two GPUs a Job: 4 a node, b-cpu 3 by CPU.
		"two GPUs a Job": {map[string]string{"gpusPerReplica": "2", "cpuPerReplica": "16"}, 4 + 3 + 4 + 0 + 0 + 4},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			md := map[string]string{"queue": "train", "capacityAware": "true", "gpusPerReplica": "1"}
			maps.Copy(md, tc.md)
			wantMetric(t, readyServer(s).read(mustTrigger(t, "ml", md)), MetricQueueBacklog, tc.want)
		})
	}
}
