package keda

import (
	"testing"

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
