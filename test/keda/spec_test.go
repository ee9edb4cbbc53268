package keda

import (
	"testing"

	v2 "k8s.io/api/autoscaling/v2"
)

// TestMetricSpec checks the metric specs KEDA builds for the HPA from GetMetricSpec: the
// names, prefixed s<trigger index>-, and the targets, whole or fractional, in the
// metricType the trigger asks for. GetMetricSpec needs no data, so no report is
// published.
func TestMetricSpec(t *testing.T) {
	s := startScaler(t)
	type spec struct {
		name  string
		milli int64 // the target, in milli-units
	}
	tests := map[string]struct {
		trigger  trigger
		wantType v2.MetricTargetType // AverageValue when empty
		want     []spec
	}{
		"queue, default target": {
			trigger: trigger{metadata: map[string]string{"queue": "jobs"}},
			want:    []spec{{"s0-queue-backlog", 1000}},
		},
		"queue, whole target": {
			trigger: trigger{metadata: map[string]string{"queue": "jobs", "queueTarget": "4"}},
			want:    []spec{{"s0-queue-backlog", 4000}},
		},
		"queue, fractional target, third trigger": {
			trigger: trigger{index: 2, metadata: map[string]string{"queue": "jobs", "queueTarget": "0.5"}},
			want:    []spec{{"s2-queue-backlog", 500}},
		},
		"queue and GPUs, in the documented order": {
			trigger: trigger{index: 1, metadata: map[string]string{
				"queue": "jobs", "queueTarget": "3", "podSelector": "app=llm", "gpuUtilTarget": "70", "gpuMemoryTarget": "85.5"}},
			want: []spec{{"s1-queue-backlog", 3000}, {"s1-gpu-util", 70000}, {"s1-gpu-memory", 85500}},
		},
		"GPU utilisation only": {
			trigger: trigger{metadata: map[string]string{"podSelector": "app=llm", "gpuUtilTarget": "60"}},
			want:    []spec{{"s0-gpu-util", 60000}},
		},
		"GPU memory only": {
			trigger: trigger{metadata: map[string]string{"podSelector": "app in (llm, embed)", "gpuMemoryTarget": "90"}},
			want:    []spec{{"s0-gpu-memory", 90000}},
		},
		"target from the workload's environment (queueTargetFromEnv)": {
			trigger: trigger{
				metadata: map[string]string{"queue": "jobs", "queueTargetFromEnv": "QUEUE_TARGET"},
				env:      map[string]string{"QUEUE_TARGET": "8"},
			},
			want: []spec{{"s0-queue-backlog", 8000}},
		},
		"metricType Value": {
			trigger:  trigger{metricType: v2.ValueMetricType, metadata: map[string]string{"queue": "jobs", "queueTarget": "4"}},
			wantType: v2.ValueMetricType,
			want:     []spec{{"s0-queue-backlog", 4000}},
		},
		"ScaledJob, capacity-aware": {
			trigger: trigger{kind: "ScaledJob", metadata: map[string]string{
				"queue": "train", "queueTarget": "1", "capacityAware": "true", "gpusPerReplica": "2"}},
			want: []spec{{"s0-queue-backlog", 1000}},
		},
		"KEDA's own keys are ignored": {
			trigger: trigger{metadata: map[string]string{"queue": "jobs", "enableTLS": "false", "unsafeSsl": "false"}},
			want:    []spec{{"s0-queue-backlog", 1000}},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			wantType := tc.wantType
			if wantType == "" {
				wantType = v2.AverageValueMetricType
			}
			got := s.external(t, tc.trigger).GetMetricSpecForScaling(t.Context())
			if len(got) != len(tc.want) {
				t.Fatalf("got %d metric specs %v, want %d: %v", len(got), got, len(tc.want), tc.want)
			}
			for i, w := range tc.want {
				g := got[i]
				if g.Type != v2.ExternalMetricSourceType || g.External == nil {
					t.Fatalf("spec %d: got type %q, external %v, want an External metric", i, g.Type, g.External)
				}
				if g.External.Metric.Name != w.name {
					t.Errorf("spec %d: got name %q, want %q", i, g.External.Metric.Name, w.name)
				}
				target := g.External.Target
				if target.Type != wantType {
					t.Errorf("spec %d: got target type %q, want %q", i, target.Type, wantType)
				}
				q := target.AverageValue
				if wantType == v2.ValueMetricType {
					q = target.Value
				}
				if q == nil {
					t.Fatalf("spec %d: got target %+v, want a %s quantity", i, target, wantType)
				}
				if q.MilliValue() != w.milli {
					t.Errorf("spec %d (%s): got target %s (%dm), want %dm", i, w.name, q, q.MilliValue(), w.milli)
				}
			}
		})
	}
}
