package keda

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	kedav1alpha1 "github.com/kedacore/keda/v2/apis/keda/v1alpha1"
	"github.com/kedacore/keda/v2/pkg/scalers"
	"github.com/kedacore/keda/v2/pkg/scaling/executor"
	"github.com/kedacore/keda/v2/pkg/scaling/scaledjob"
)

// capacityNodes are two simulated GPU nodes of 8 GPUs: gpu-a has 4 free, gpu-b 3. Two-GPU
// Jobs fit 2 + 1 = 3 more (a Job cannot span nodes), one-GPU Jobs 7, four-GPU Jobs 1.
var capacityNodes = map[string]simNode{
	"gpu-a": {GPUs: 8, Pods: []simPod{
		{Namespace: "ml", Name: "train-0", GPUs: []string{"0", "1"}, Util: 95},
		{Namespace: "web", Name: "llm-0", GPUs: []string{"2", "3"}, Util: 40},
	}},
	"gpu-b": {GPUs: 8, Pods: []simPod{
		{Namespace: "web", Name: "llm-1", GPUs: []string{"0", "1", "2", "3", "4"}, Util: 40},
	}},
}

// TestScaledJobCapacity runs a ScaledJob's trigger through KEDA's scaler and then KEDA's
// own ScaledJob maths (pkg/scaling/scaledjob, as its scale handler does): a
// capacityAware queue's backlog of 10 waiting + 1 running is capped, in items, at what
// makes KEDA want the Jobs running plus those free GPUs can place now, plus
// capacityHeadroom, whatever the queueTarget.
func TestScaledJobCapacity(t *testing.T) {
	s := startScaler(t)
	s.startCollectors(t, capacityNodes)
	s.publishQueue(t, "ml", "train", 10, 1)
	s.publishQueue(t, "ml", "small", 2, 0)
	waitMetric(t, s, trigger{kind: "ScaledJob", namespace: "ml", metadata: map[string]string{"queue": "train"}}, "s0-queue-backlog", 11000)
	waitMetric(t, s, trigger{kind: "ScaledJob", namespace: "ml", metadata: map[string]string{"queue": "small"}}, "s0-queue-backlog", 2000)
	// Both nodes counted: one-GPU Jobs fit 7, so the cap is 1 + 7 = 8.
	waitMetric(t, s, trigger{kind: "ScaledJob", namespace: "ml", metadata: map[string]string{
		"queue": "train", "capacityAware": "true", "gpusPerReplica": "1"}}, "s0-queue-backlog", 8000)

	const maxReplicaCount = 20 // the ScaledJob's spec.maxReplicaCount
	tests := map[string]struct {
		metadata    map[string]string
		wantValue   float64 // what KEDA reads: the queue length
		wantMaxJobs int64   // KEDA's maxValue: how many Jobs it wants running
	}{
		"not capacity-aware: the whole backlog": {
			metadata:  map[string]string{"queue": "train"},
			wantValue: 11, wantMaxJobs: 11,
		},
		"two-GPU Jobs: 1 running + 3 placeable": {
			metadata:  map[string]string{"queue": "train", "capacityAware": "true", "gpusPerReplica": "2"},
			wantValue: 4, wantMaxJobs: 4,
		},
		"two-GPU Jobs, headroom 2": {
			metadata:  map[string]string{"queue": "train", "capacityAware": "true", "gpusPerReplica": "2", "capacityHeadroom": "2"},
			wantValue: 6, wantMaxJobs: 6,
		},
		"four-GPU Jobs: 1 running + 1 placeable": {
			metadata:  map[string]string{"queue": "train", "capacityAware": "true", "gpusPerReplica": "4"},
			wantValue: 2, wantMaxJobs: 2,
		},
		"one-GPU Jobs: 1 running + 7 placeable": {
			metadata:  map[string]string{"queue": "train", "capacityAware": "true", "gpusPerReplica": "1"},
			wantValue: 8, wantMaxJobs: 8,
		},
		// The cap is in items: queueTarget × (⌈running / queueTarget⌉ + what fits), so that
		// KEDA's ⌈value / queueTarget⌉ is the Jobs running plus those that fit.
		"queueTarget 3: the backlog is below the cap": {
			metadata:  map[string]string{"queue": "train", "capacityAware": "true", "gpusPerReplica": "2", "queueTarget": "3"},
			wantValue: 11, wantMaxJobs: 4, // cap 3 × (1 + 3) = 12; ⌈11 / 3⌉
		},
		"queueTarget 2: capped at 2 × (1 running + 3 placeable)": {
			metadata:  map[string]string{"queue": "train", "capacityAware": "true", "gpusPerReplica": "2", "queueTarget": "2"},
			wantValue: 8, wantMaxJobs: 4,
		},
		"queueTarget 0.5: one item is 2 Jobs, never more than fit": {
			metadata:  map[string]string{"queue": "train", "capacityAware": "true", "gpusPerReplica": "2", "queueTarget": "0.5"},
			wantValue: 2.499, wantMaxJobs: 5, // 2 running + 3 placeable; 2.5 less a thousandth, see capBacklog
		},
		"backlog below capacity is not capped": {
			metadata:  map[string]string{"queue": "small", "capacityAware": "true", "gpusPerReplica": "2"},
			wantValue: 2, wantMaxJobs: 2,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			sc := s.external(t, trigger{kind: "ScaledJob", namespace: "ml", name: "trainer", metadata: tc.metadata})
			// As KEDA's getScaledJobMetrics: the specs, the first one's metric, then its maths.
			specs := sc.GetMetricSpecForScaling(t.Context())
			if len(specs) != 1 || specs[0].External == nil {
				t.Fatalf("got metric specs %v, want exactly one external metric (a ScaledJob uses the first)", specs)
			}
			name := specs[0].External.Metric.Name
			metrics, active, err := sc.GetMetricsAndActivity(t.Context(), name)
			if err != nil {
				t.Fatalf("GetMetricsAndActivity(%q): %v", name, err)
			}
			value, maxValue, _ := scaledjob.CalculateQueueLengthAndMaxValue(metrics, specs, maxReplicaCount)
			isActive, _, maxJobs, _ := scaledjob.IsScaledJobActive(
				[]scaledjob.ScalerMetrics{{QueueLength: value, MaxValue: maxValue, IsActive: active}}, "max", 0, maxReplicaCount)
			if value != tc.wantValue || maxJobs != tc.wantMaxJobs || !isActive {
				t.Errorf("got %s %g, %d Jobs, active %t; want %g, %d Jobs, active true",
					name, value, maxJobs, isActive, tc.wantValue, tc.wantMaxJobs)
			}
		})
	}
}

// standbyJob is a Job of ScaledJob "trainer" that KEDA counts as not finished, with its
// pod Running (or, pending, not yet running). KEDA lists them by the label its executor
// gives every Job it creates (pkg/scaling/executor/scale_jobs.go, generateJobs).
type standbyJob struct {
	name    string
	pending bool
}

// kedaCreates runs a ScaledJob's one trigger through KEDA's own poll of a ScaledJob
// (pkg/scaling/scale_handler.go: getScaledJobMetrics, getScaledJobState) and then its
// executor, RequestJobScale (pkg/scaling/executor/scale_jobs.go), which counts the
// ScaledJob's unfinished and pending Jobs, takes its scaling decision
// (getScalingDecision and the ScaledJob's scaling strategy) and creates the Jobs, all
// against controller-runtime's fake API client holding jobs. It returns the Jobs KEDA
// created and the executor's result.
func kedaCreates(t *testing.T, sc scalers.Scaler, sj *kedav1alpha1.ScaledJob, jobs []standbyJob) (int, executor.ScaleResult) {
	t.Helper()
	ctx := t.Context()
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	if err := kedav1alpha1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	objs := []client.Object{sj}
	for _, j := range jobs {
		objs = append(objs, &batchv1.Job{ObjectMeta: metav1.ObjectMeta{
			Name: j.name, Namespace: sj.Namespace, Labels: map[string]string{"scaledjob.keda.sh/name": sj.Name}}})
		phase := corev1.PodRunning
		if j.pending {
			phase = corev1.PodPending
		}
		objs = append(objs, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: j.name + "-pod", Namespace: sj.Namespace, Labels: map[string]string{"job-name": j.name}},
			Status:     corev1.PodStatus{Phase: phase},
		})
	}
	api := fake.NewClientBuilder().WithScheme(scheme).WithObjects(objs...).Build()

	// getScaledJobMetrics: the first metric spec, its value and activity; a trigger that
	// errors is left out and marks the poll as in error.
	var (
		metrics []scaledjob.ScalerMetrics
		isError bool
	)
	specs := sc.GetMetricSpecForScaling(ctx)
	if len(specs) != 1 || specs[0].External == nil {
		t.Fatalf("got metric specs %v, want exactly one external metric", specs)
	}
	values, active, err := sc.GetMetricsAndActivity(ctx, specs[0].External.Metric.Name)
	if err != nil {
		isError = true
	} else {
		queueLength, maxValue, _ := scaledjob.CalculateQueueLengthAndMaxValue(values, specs, sj.MaxReplicaCount())
		metrics = append(metrics, scaledjob.ScalerMetrics{QueueLength: queueLength, MaxValue: maxValue, IsActive: active})
	}
	// getScaledJobState, then checkScalers hands the decision to the executor.
	isActive, scaleTo, maxScale, _ := scaledjob.IsScaledJobActive(metrics,
		sj.Spec.ScalingStrategy.MultipleScalersCalculation, sj.MinReplicaCount(), sj.MaxReplicaCount())
	exec := executor.NewScaleExecutor(api, nil, scheme, 5*time.Second, events.NewFakeRecorder(100))
	result := exec.RequestJobScale(ctx, sj, isActive, isError, scaleTo, maxScale, executor.ScaleExecutorOptions{})
	if result.Error != nil {
		t.Fatalf("RequestJobScale: %v", result.Error)
	}
	var list batchv1.JobList
	if err := api.List(ctx, &list, client.InNamespace(sj.Namespace)); err != nil {
		t.Fatal(err)
	}
	return len(list.Items) - len(jobs), result
}

// scaledJob is ScaledJob ml/trainer with the given replica counts and scaling strategy.
func scaledJob(minReplicas, maxReplicas int32, strategy string) *kedav1alpha1.ScaledJob {
	return &kedav1alpha1.ScaledJob{
		ObjectMeta: metav1.ObjectMeta{Name: "trainer", Namespace: "ml", UID: "trainer-uid"},
		Spec: kedav1alpha1.ScaledJobSpec{
			JobTargetRef:    &batchv1.JobSpec{},
			MinReplicaCount: &minReplicas,
			MaxReplicaCount: &maxReplicas,
			ScalingStrategy: kedav1alpha1.ScalingStrategy{Strategy: strategy},
		},
	}
}

// trainerPods are n pods of ScaledJob ml/trainer's Jobs, one GPU each from GPU first on,
// labelled as KEDA labels the pods of the Jobs it creates (generateJobs).
func trainerPods(first, n int) []simPod {
	var pods []simPod
	for i := range n {
		pods = append(pods, simPod{Namespace: "ml", Name: fmt.Sprintf("trainer-%d", first+i),
			Labels: map[string]string{"scaledjob.keda.sh/name": "trainer"},
			GPUs:   []string{strconv.Itoa(first + i)}, Util: 90})
	}
	return pods
}

// busyNode is an 8-GPU node of which another namespace's pods hold all but free.
func busyNode(free int) simNode {
	n := simNode{GPUs: 8}
	for i := range 8 - free {
		n.Pods = append(n.Pods, simPod{Namespace: "web", Name: fmt.Sprintf("llm-%d", i), GPUs: []string{strconv.Itoa(i)}, Util: 40})
	}
	return n
}

// runningJobs are n unfinished Jobs of ml/trainer with their pods Running.
func runningJobs(n int) []standbyJob {
	var jobs []standbyJob
	for i := range n {
		jobs = append(jobs, standbyJob{name: fmt.Sprintf("trainer-%d", i)})
	}
	return jobs
}

// TestScaledJobMinReplicaCount: KEDA hands its scaling strategy the unfinished Jobs less
// the ScaledJob's minReplicaCount (getScalingDecision, pkg/scaling/executor/
// scale_jobs.go), so busy standby Jobs are not subtracted from what the trigger asks
// for. A capacityAware trigger that counted them as running Jobs anyway would make KEDA
// create one Job per busy standby Job beyond what the free GPUs take, to sit Pending.
// Told the ScaledJob's minReplicaCount, the cap leaves them out, and KEDA's executor,
// run on a fake API server, creates exactly what fits.
func TestScaledJobMinReplicaCount(t *testing.T) {
	standbyBusy := map[string]simNode{"gpu-a": {GPUs: 2, Pods: trainerPods(0, 2)}}
	threeFree := map[string]simNode{"gpu-a": {GPUs: 2, Pods: trainerPods(0, 2)}, "gpu-b": busyNode(3)}
	fourRunning := map[string]simNode{"gpu-a": {GPUs: 4, Pods: trainerPods(0, 4)}, "gpu-b": busyNode(3)}
	tests := map[string]struct {
		nodes           map[string]simNode
		inFlight        uint64 // of 50 waiting
		minReplicaCount string // the trigger's; the ScaledJob's is 2
		strategy        string
		jobs            int // running, their pods Running
		wantValue       int64
		wantCreated     int
	}{
		// The case: both standby Jobs busy, no GPU free, 50 waiting.
		"both standby Jobs busy, no GPU free": {
			nodes: standbyBusy, inFlight: 2, minReplicaCount: "2", jobs: 2, wantValue: 0, wantCreated: 0},
		"both standby Jobs busy, no GPU free, accurate": {
			nodes: standbyBusy, inFlight: 2, minReplicaCount: "2", strategy: "accurate", jobs: 2, wantValue: 0, wantCreated: 0},
		"both standby Jobs busy, no GPU free, eager": {
			nodes: standbyBusy, inFlight: 2, minReplicaCount: "2", strategy: "eager", jobs: 2, wantValue: 0, wantCreated: 0},
		// Without the key the cap counts the standby Jobs as running ones: 2 Jobs that
		// cannot start. This is what the key is for.
		"trigger not told minReplicaCount": {
			nodes: standbyBusy, inFlight: 2, jobs: 2, wantValue: 2000, wantCreated: 2},
		"both standby Jobs busy, 3 GPUs free": {
			nodes: threeFree, inFlight: 2, minReplicaCount: "2", jobs: 2, wantValue: 3000, wantCreated: 3},
		"both standby Jobs busy, 3 GPUs free, accurate": {
			nodes: threeFree, inFlight: 2, minReplicaCount: "2", strategy: "accurate", jobs: 2, wantValue: 3000, wantCreated: 3},
		"both standby Jobs busy, 3 GPUs free, eager": {
			nodes: threeFree, inFlight: 2, minReplicaCount: "2", strategy: "eager", jobs: 2, wantValue: 3000, wantCreated: 3},
		// 2 standby and 2 more Jobs busy: default subtracts the 2 more; accurate and eager
		// do not subtract running Jobs at all (they expect a queue length without the
		// items in flight), so they create 2 Jobs too many. capacityAware asks for default.
		"4 Jobs busy, 3 GPUs free": {
			nodes: fourRunning, inFlight: 4, minReplicaCount: "2", jobs: 4, wantValue: 5000, wantCreated: 3},
		"4 Jobs busy, 3 GPUs free, accurate: 2 too many": {
			nodes: fourRunning, inFlight: 4, minReplicaCount: "2", strategy: "accurate", jobs: 4, wantValue: 5000, wantCreated: 5},
		"4 Jobs busy, 3 GPUs free, eager: 2 too many": {
			nodes: fourRunning, inFlight: 4, minReplicaCount: "2", strategy: "eager", jobs: 4, wantValue: 5000, wantCreated: 5},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			s := startScaler(t)
			s.startCollectors(t, tc.nodes)
			s.publishQueue(t, "ml", "train", 50, tc.inFlight)
			md := map[string]string{"queue": "train", "capacityAware": "true", "gpusPerReplica": "1"}
			if tc.minReplicaCount != "" {
				md["minReplicaCount"] = tc.minReplicaCount
			}
			tr := trigger{kind: "ScaledJob", namespace: "ml", name: "trainer", metadata: md}
			waitMetric(t, s, tr, "s0-queue-backlog", tc.wantValue)
			created, _ := kedaCreates(t, s.external(t, tr), scaledJob(2, 20, tc.strategy), runningJobs(tc.jobs))
			if created != tc.wantCreated {
				t.Errorf("KEDA created %d Jobs, want %d", created, tc.wantCreated)
			}
		})
	}
}

// TestScaledJobCapacityUnknown: with no GPU node reporting, a capacityAware trigger's
// metric and activity are Unavailable, and KEDA's own poll and executor then create no
// Job (neither the uncapped backlog's, to sit Pending, nor none in silence): the running
// Jobs go on and the ScaledJob's Ready condition is False with TriggerError
// (RequestJobScale, pkg/scaling/executor/scale_jobs.go). With minReplicaCount KEDA is
// active whatever the triggers say (IsScaledJobActive), and still creates only the
// standby Jobs missing.
func TestScaledJobCapacityUnknown(t *testing.T) {
	s := startScaler(t)
	s.publishQueue(t, "ml", "train", 50, 2)
	waitMetric(t, s, trigger{kind: "ScaledJob", namespace: "ml", metadata: map[string]string{"queue": "train"}}, "s0-queue-backlog", 52000)
	tests := map[string]struct {
		minReplicaCount int32
		jobs            int
		wantCreated     int
		wantReady       metav1.ConditionStatus
	}{
		"no standby":                      {jobs: 2, wantCreated: 0, wantReady: metav1.ConditionFalse},
		"minReplicaCount 2, both there":   {minReplicaCount: 2, jobs: 2, wantCreated: 0, wantReady: metav1.ConditionUnknown},
		"minReplicaCount 2, one finished": {minReplicaCount: 2, jobs: 1, wantCreated: 1, wantReady: metav1.ConditionUnknown},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			md := map[string]string{"queue": "train", "capacityAware": "true", "gpusPerReplica": "1"}
			if tc.minReplicaCount > 0 {
				md["minReplicaCount"] = strconv.Itoa(int(tc.minReplicaCount))
			}
			sc := s.external(t, trigger{kind: "ScaledJob", namespace: "ml", name: "trainer", metadata: md})
			if _, _, err := metric(t, sc, "s0-queue-backlog"); status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "capacity unknown") {
				t.Fatalf("got error %v, want Unavailable: capacity unknown", err)
			}
			created, result := kedaCreates(t, sc, scaledJob(tc.minReplicaCount, 20, ""), runningJobs(tc.jobs))
			ready := result.Conditions.GetReadyCondition()
			if created != tc.wantCreated || ready.Status != tc.wantReady {
				t.Errorf("KEDA created %d Jobs, Ready %s (%s); want %d, Ready %s", created, ready.Status, ready.Reason, tc.wantCreated, tc.wantReady)
			}
		})
	}
}

// TestScaledJobJobsHoldingGPUs: Jobs that hold GPUs without an item (loading their
// model, or finishing after acking theirs) are unfinished to KEDA (getRunningJobCount,
// pkg/scaling/executor/scale_jobs.go) and their GPUs are not free. Counted from the items
// in flight they are subtracted twice, and free GPUs go unused; with podSelector on the
// Jobs' pods, the cap counts them, and KEDA's executor fills the free GPUs.
func TestScaledJobJobsHoldingGPUs(t *testing.T) {
	// 3 trainer Jobs hold a GPU each, one of them with an item; 3 GPUs are another
	// namespace's; 2 are free.
	node := simNode{GPUs: 8, Pods: trainerPods(0, 3)}
	for i := 3; i < 6; i++ {
		node.Pods = append(node.Pods, simPod{Namespace: "web", Name: fmt.Sprintf("llm-%d", i), GPUs: []string{strconv.Itoa(i)}, Util: 40})
	}
	s := startScaler(t)
	s.startCollectors(t, map[string]simNode{"gpu-a": node})
	s.publishQueue(t, "ml", "train", 50, 1)
	tests := map[string]struct {
		podSelector string
		wantValue   int64
		wantCreated int
	}{
		"Jobs counted from their pods": {podSelector: "scaledjob.keda.sh/name=trainer", wantValue: 5000, wantCreated: 2},
		// ⌈1 in flight⌉ + 2 free = 3, and KEDA subtracts all 3 Jobs: the free GPUs wait.
		"Jobs counted from the items in flight": {wantValue: 3000, wantCreated: 0},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			md := map[string]string{"queue": "train", "capacityAware": "true", "gpusPerReplica": "1"}
			if tc.podSelector != "" {
				md["podSelector"] = tc.podSelector
			}
			tr := trigger{kind: "ScaledJob", namespace: "ml", name: "trainer", metadata: md}
			waitMetric(t, s, tr, "s0-queue-backlog", tc.wantValue)
			created, _ := kedaCreates(t, s.external(t, tr), scaledJob(0, 20, ""), runningJobs(3))
			if created != tc.wantCreated {
				t.Errorf("KEDA created %d Jobs, want %d", created, tc.wantCreated)
			}
		})
	}
}
