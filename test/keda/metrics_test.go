package keda

import (
	"context"

	"fmt"
	"testing"
	"time"

	"github.com/gpuscaler/gpuscaler/test/testkit"
)

// dataTimeout bounds how long a published report may take to reach the scaler's answers.
const dataTimeout = 10 * time.Second

// waitMetric waits until KEDA's scaler gets wantMilli for metricName: published reports
// are applied by the scaler shortly after the stream stores them.
func waitMetric(t *testing.T, s *scalerProc, tr trigger, metricName string, wantMilli int64) {
	t.Helper()
	sc := s.external(t, tr)
	testkit.Eventually(t, dataTimeout, func(context.Context) error {
		got, _, err := metric(t, sc, metricName)
		if err != nil {
			return err
		}
		if got != wantMilli {
			return fmt.Errorf("got %s %dm, want %dm", metricName, got, wantMilli)
		}
		return nil
	})
}

// TestQueueMetrics checks what KEDA reads for a queue trigger: queue-backlog is waiting +
// in flight, and the activity is the backlog above activationQueueDepth (IsActive, which
// GetMetricsAndActivity calls).
func TestQueueMetrics(t *testing.T) {
	s := startScaler(t)
	s.publishQueue(t, "shop", "orders", 5, 2)
	s.publishQueue(t, "shop", "idle", 0, 0)
	waitMetric(t, s, trigger{namespace: "shop", metadata: map[string]string{"queue": "orders"}}, "s0-queue-backlog", 7000)
	waitMetric(t, s, trigger{namespace: "shop", metadata: map[string]string{"queue": "idle"}}, "s0-queue-backlog", 0)

	tests := map[string]struct {
		trigger    trigger
		metric     string
		wantMilli  int64
		wantActive bool
	}{
		"backlog is waiting plus in flight": {
			trigger:   trigger{namespace: "shop", metadata: map[string]string{"queue": "orders"}},
			metric:    "s0-queue-backlog",
			wantMilli: 7000, wantActive: true,
		},
		"queueTarget does not change the value": {
			trigger:   trigger{namespace: "shop", metadata: map[string]string{"queue": "orders", "queueTarget": "2.5"}},
			metric:    "s0-queue-backlog",
			wantMilli: 7000, wantActive: true,
		},
		"fourth trigger": {
			trigger:   trigger{namespace: "shop", index: 3, metadata: map[string]string{"queue": "orders"}},
			metric:    "s3-queue-backlog",
			wantMilli: 7000, wantActive: true,
		},
		"backlog at activationQueueDepth is inactive": {
			trigger:   trigger{namespace: "shop", metadata: map[string]string{"queue": "orders", "activationQueueDepth": "7"}},
			metric:    "s0-queue-backlog",
			wantMilli: 7000, wantActive: false,
		},
		"backlog above activationQueueDepth is active": {
			trigger:   trigger{namespace: "shop", metadata: map[string]string{"queue": "orders", "activationQueueDepth": "6.5"}},
			metric:    "s0-queue-backlog",
			wantMilli: 7000, wantActive: true,
		},
		"activationQueueDepth from the workload's environment": {
			trigger: trigger{namespace: "shop",
				metadata: map[string]string{"queue": "orders", "activationQueueDepthFromEnv": "DEPTH"},
				env:      map[string]string{"DEPTH": "10"}},
			metric:    "s0-queue-backlog",
			wantMilli: 7000, wantActive: false,
		},
		"empty queue is zero and inactive": {
			trigger:   trigger{namespace: "shop", metadata: map[string]string{"queue": "idle"}},
			metric:    "s0-queue-backlog",
			wantMilli: 0, wantActive: false,
		},
		"ScaledJob reads the same backlog": {
			trigger:   trigger{kind: "ScaledJob", namespace: "shop", name: "worker", metadata: map[string]string{"queue": "orders"}},
			metric:    "s0-queue-backlog",
			wantMilli: 7000, wantActive: true,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, active, err := metric(t, s.external(t, tc.trigger), tc.metric)
			if err != nil {
				t.Fatalf("GetMetricsAndActivity(%q): %v", tc.metric, err)
			}
			if got != tc.wantMilli || active != tc.wantActive {
				t.Errorf("got %s %dm active %t, want %dm active %t", tc.metric, got, active, tc.wantMilli, tc.wantActive)
			}
		})
	}
}

// gpuNodes are two simulated GPU nodes. In namespace ml, pods labelled app=llm hold four
// GPUs across both nodes (two per pod) at 80, 80, 60 and 60 % utilisation: a sum of 280,
// an average of 70. A batch pod holds one more GPU at 90 %, and a pod of another
// namespace with the same labels holds one at 10 %, which ml's triggers must not see.
var gpuNodes = map[string]simNode{
	"gpu-a": {GPUs: 8, Pods: []simPod{
		{Namespace: "ml", Name: "llm-0", Labels: map[string]string{"app": "llm"}, GPUs: []string{"0", "1"}, Util: 80},
		{Namespace: "ml", Name: "batch-0", Labels: map[string]string{"app": "batch"}, GPUs: []string{"2"}, Util: 90},
		{Namespace: "research", Name: "llm-0", Labels: map[string]string{"app": "llm"}, GPUs: []string{"3"}, Util: 10},
	}},
	"gpu-b": {GPUs: 8, Pods: []simPod{
		{Namespace: "ml", Name: "llm-1", Labels: map[string]string{"app": "llm"}, GPUs: []string{"0", "1"}, Util: 60},
	}},
}

// TestGPUMetrics checks what KEDA reads for podSelector triggers, from two simulated GPU
// nodes running the real collector: gpu-util is the sum of the utilisation of the
// workload's GPUs over gpusPerReplica (observed GPUs per pod when not given); a trigger
// with only podSelector is always active (at zero replicas it has no GPUs to wake on, so
// inactive would let KEDA scale it to zero for good), and with a queue the GPU part's
// activity is their average utilisation above activationGpuUtil.
func TestGPUMetrics(t *testing.T) {
	s := startScaler(t)
	s.startCollectors(t, gpuNodes)
	s.publishQueue(t, "ml", "prompts", 3, 0)
	s.publishQueue(t, "ml", "idle", 0, 0)
	waitMetric(t, s, trigger{namespace: "ml", metadata: map[string]string{"podSelector": "app=llm", "gpuUtilTarget": "70"}}, "s0-gpu-util", 140000)
	waitMetric(t, s, trigger{namespace: "ml", metadata: map[string]string{"queue": "idle"}}, "s0-queue-backlog", 0)
	waitMetric(t, s, trigger{namespace: "ml", metadata: map[string]string{"queue": "prompts"}}, "s0-queue-backlog", 3000)

	tests := map[string]struct {
		metadata map[string]string
		metric   string
		// The value in milli-units, within ± tolerance (framebuffer readings are noisy).
		wantMilli, tolerance int64
		wantActive           bool
	}{
		"observed GPUs per replica: 280 / (4 GPUs / 2 pods)": {
			metadata:  map[string]string{"podSelector": "app=llm", "gpuUtilTarget": "70"},
			metric:    "s0-gpu-util",
			wantMilli: 140000, wantActive: true,
		},
		"gpusPerReplica 4": {
			metadata:  map[string]string{"podSelector": "app=llm", "gpuUtilTarget": "70", "gpusPerReplica": "4"},
			metric:    "s0-gpu-util",
			wantMilli: 70000, wantActive: true,
		},
		"gpusPerReplica 1": {
			metadata:  map[string]string{"podSelector": "app=llm", "gpuUtilTarget": "70", "gpusPerReplica": "1"},
			metric:    "s0-gpu-util",
			wantMilli: 280000, wantActive: true,
		},
		"average at or below activationGpuUtil is inactive": {
			metadata:  map[string]string{"queue": "idle", "podSelector": "app=llm", "gpuUtilTarget": "70", "activationGpuUtil": "70"},
			metric:    "s0-gpu-util",
			wantMilli: 140000, wantActive: false,
		},
		"average above activationGpuUtil is active": {
			metadata:  map[string]string{"queue": "idle", "podSelector": "app=llm", "gpuUtilTarget": "70", "activationGpuUtil": "69.5"},
			metric:    "s0-gpu-util",
			wantMilli: 140000, wantActive: true,
		},
		"set-based selector: 370 / (5 GPUs / 3 pods)": {
			metadata:  map[string]string{"podSelector": "app in (llm, batch)", "gpuUtilTarget": "70"},
			metric:    "s0-gpu-util",
			wantMilli: 222000, wantActive: true,
		},
		"selector matching no pod: zero, and still active (only podSelector)": {
			metadata:  map[string]string{"podSelector": "app=absent", "gpuUtilTarget": "70"},
			metric:    "s0-gpu-util",
			wantMilli: 0, wantActive: true,
		},
		// Framebuffer use of a held sim GPU is 30 % + 0.6 × its utilisation, ± 2 % noise:
		// (78 + 78 + 66 + 66) / 2 = 144 ± 4.
		"gpu-memory: framebuffer use over gpusPerReplica": {
			metadata:  map[string]string{"podSelector": "app=llm", "gpuMemoryTarget": "80"},
			metric:    "s0-gpu-memory",
			wantMilli: 144000, tolerance: 4000, wantActive: true,
		},
		"second metric of a combined trigger": {
			metadata:  map[string]string{"queue": "prompts", "podSelector": "app=llm", "gpuUtilTarget": "70"},
			metric:    "s0-gpu-util",
			wantMilli: 140000, wantActive: true,
		},
		"combined: a backlog makes it active though the GPUs are not": {
			metadata:  map[string]string{"queue": "prompts", "podSelector": "app=llm", "gpuUtilTarget": "70", "activationGpuUtil": "90"},
			metric:    "s0-queue-backlog",
			wantMilli: 3000, wantActive: true,
		},
		"combined: busy GPUs make it active though the queue is empty": {
			metadata:  map[string]string{"queue": "idle", "podSelector": "app=llm", "gpuUtilTarget": "70", "activationGpuUtil": "50"},
			metric:    "s0-gpu-util",
			wantMilli: 140000, wantActive: true,
		},
		"combined: neither part active": {
			metadata:  map[string]string{"queue": "idle", "podSelector": "app=llm", "gpuUtilTarget": "70", "activationGpuUtil": "90"},
			metric:    "s0-queue-backlog",
			wantMilli: 0, wantActive: false,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			sc := s.external(t, trigger{namespace: "ml", name: "llm", metadata: tc.metadata})
			got, active, err := metric(t, sc, tc.metric)
			if err != nil {
				t.Fatalf("GetMetricsAndActivity(%q): %v", tc.metric, err)
			}
			if got < tc.wantMilli-tc.tolerance || got > tc.wantMilli+tc.tolerance || active != tc.wantActive {
				t.Errorf("got %s %dm active %t, want %dm ± %dm active %t", tc.metric, got, active, tc.wantMilli, tc.tolerance, tc.wantActive)
			}
		})
	}
}
