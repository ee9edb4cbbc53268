package keda

import (
	"context"

	"cmp"
	"fmt"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/gpuscaler/gpuscaler/test/testkit"
)

// TestErrors checks that bad metadata (InvalidArgument) and missing data (Unavailable)
// reach KEDA as errors from GetMetricsAndActivity, the call behind both the HPA's
// metrics and KEDA's activation: a trigger that errors is never scaled to zero. KEDA's
// GetMetricSpecForScaling swallows the error and gives the HPA no metric for bad
// metadata.
func TestErrors(t *testing.T) {
	s := startScaler(t, "--stream-max-age", "10m")
	s.publishQueue(t, "shop", "orders", 4, 0)
	waitMetric(t, s, trigger{namespace: "shop", metadata: map[string]string{"queue": "orders"}}, "s0-queue-backlog", 4000)

	tests := map[string]struct {
		namespace string
		metadata  map[string]string
		metric    string
		wantCode  codes.Code
		wantMsg   string // part of the error message
	}{
		"negative queueTarget": {
			metadata: map[string]string{"queue": "orders", "queueTarget": "-3"},
			metric:   "s0-queue-backlog",
			wantCode: codes.InvalidArgument, wantMsg: `queueTarget="-3"`,
		},
		"queueTarget not a number": {
			metadata: map[string]string{"queue": "orders", "queueTarget": "four"},
			metric:   "s0-queue-backlog",
			wantCode: codes.InvalidArgument, wantMsg: `queueTarget="four"`,
		},
		"no queue, stream or podSelector": {
			metadata: map[string]string{"queueTarget": "3"},
			metric:   "s0-queue-backlog",
			wantCode: codes.InvalidArgument, wantMsg: "podSelector",
		},
		"misspelt key": {
			metadata: map[string]string{"queue": "orders", "queueTraget": "3"},
			metric:   "s0-queue-backlog",
			wantCode: codes.InvalidArgument, wantMsg: "queueTraget",
		},
		"unparsable podSelector": {
			metadata: map[string]string{"podSelector": "app in (", "gpuUtilTarget": "70"},
			metric:   "s0-gpu-util",
			wantCode: codes.InvalidArgument, wantMsg: "podSelector",
		},
		"capacityAware with podSelector and gpuUtilTarget": {
			metadata: map[string]string{"queue": "orders", "capacityAware": "true", "podSelector": "app=llm", "gpuUtilTarget": "70"},
			metric:   "s0-queue-backlog",
			wantCode: codes.InvalidArgument, wantMsg: "capacityAware",
		},
		"scaleUpTolerance beyond one": {
			metadata: map[string]string{"queue": "orders", "targetWait": "10s", "scaleUpTolerance": "1500m"},
			metric:   "s0-queue-demand",
			wantCode: codes.InvalidArgument, wantMsg: `scaleUpTolerance="1500m"`,
		},
		"staleAfter beyond --stream-max-age": {
			metadata: map[string]string{"queue": "orders", "staleAfter": "1h"},
			metric:   "s0-queue-backlog",
			wantCode: codes.InvalidArgument, wantMsg: "staleAfter",
		},
		"queue never reported": {
			metadata: map[string]string{"queue": "absent"},
			metric:   "s0-queue-backlog",
			wantCode: codes.Unavailable, wantMsg: "no report for queue shop/absent",
		},
		"another namespace's queue is not this ScaledObject's": {
			namespace: "other",
			metadata:  map[string]string{"queue": "orders"},
			metric:    "s0-queue-backlog",
			wantCode:  codes.Unavailable, wantMsg: "no report for queue other/orders",
		},
		"GPU metrics before any node reported": {
			metadata: map[string]string{"podSelector": "app=llm", "gpuUtilTarget": "70"},
			metric:   "s0-gpu-util",
			wantCode: codes.Unavailable, wantMsg: "no node report",
		},
		"capacityAware without gpusPerReplica": {
			metadata: map[string]string{"queue": "orders", "capacityAware": "true"},
			metric:   "s0-queue-backlog",
			wantCode: codes.InvalidArgument, wantMsg: "gpusPerReplica set too",
		},
		"queueTarget on a podSelector-only trigger": {
			metadata: map[string]string{"podSelector": "app=llm", "gpuUtilTarget": "70", "queueTarget": "4"},
			metric:   "s0-gpu-util",
			wantCode: codes.InvalidArgument, wantMsg: `queueTarget="4"`,
		},
		"gpusPerReplica on a queue-only trigger": {
			metadata: map[string]string{"queue": "orders", "gpusPerReplica": "8"},
			metric:   "s0-queue-backlog",
			wantCode: codes.InvalidArgument, wantMsg: `gpusPerReplica="8"`,
		},
		"capacity before any node reported": {
			metadata: map[string]string{"queue": "orders", "capacityAware": "true", "gpusPerReplica": "1"},
			metric:   "s0-queue-backlog",
			wantCode: codes.Unavailable, wantMsg: "capacity unknown",
		},
		"a metric the trigger does not give": {
			metadata: map[string]string{"queue": "orders"},
			metric:   "s0-gpu-util",
			wantCode: codes.NotFound, wantMsg: "gpu-util",
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			sc := s.external(t, trigger{namespace: cmp.Or(tc.namespace, "shop"), metadata: tc.metadata})
			specs := sc.GetMetricSpecForScaling(t.Context())
			if tc.wantCode == codes.InvalidArgument && len(specs) != 0 {
				t.Errorf("GetMetricSpecForScaling: got %d specs %v, want none for bad metadata", len(specs), specs)
			}
			if tc.wantCode != codes.InvalidArgument && len(specs) == 0 {
				t.Errorf("GetMetricSpecForScaling: got no specs, want them: the metadata is good and specs need no data")
			}
			values, active, err := sc.GetMetricsAndActivity(t.Context(), tc.metric)
			if err := checkStatus(err, tc.wantCode, tc.wantMsg); err != nil {
				t.Errorf("GetMetricsAndActivity(%q) gave %v, active %t: %v", tc.metric, values, active, err)
			}
		})
	}
}

// TestPartlyUnknownTrigger checks a trigger with a queue and a podSelector while no GPU
// node has reported, as KEDA's scale loop sees it (GetMetricsAndActivity per metric,
// each calling IsActive): an active queue keeps the trigger active and its backlog
// readable, the GPU metric errors, and an empty queue gives an error instead of
// inactive, so KEDA does not scale to zero on what it cannot see.
func TestPartlyUnknownTrigger(t *testing.T) {
	s := startScaler(t)
	s.publishQueue(t, "ml", "busy", 4, 0)
	s.publishQueue(t, "ml", "idle", 0, 0)
	waitMetric(t, s, trigger{namespace: "ml", metadata: map[string]string{"queue": "busy"}}, "s0-queue-backlog", 4000)
	waitMetric(t, s, trigger{namespace: "ml", metadata: map[string]string{"queue": "idle"}}, "s0-queue-backlog", 0)

	tests := map[string]struct {
		queue      string
		metric     string
		wantMilli  int64
		wantActive bool
		wantMsg    string // when Unavailable
	}{
		"backlog of an active queue": {queue: "busy", metric: "s0-queue-backlog", wantMilli: 4000, wantActive: true},
		"GPU utilisation":            {queue: "busy", metric: "s0-gpu-util", wantMsg: "no node report"},
		"backlog of an empty queue":  {queue: "idle", metric: "s0-queue-backlog", wantMsg: "no node report"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			sc := s.external(t, trigger{namespace: "ml", metadata: map[string]string{
				"queue": tc.queue, "podSelector": "app=llm", "gpuUtilTarget": "70"}})
			got, active, err := metric(t, sc, tc.metric)
			if tc.wantMsg != "" {
				if err := checkStatus(err, codes.Unavailable, tc.wantMsg); err != nil {
					t.Errorf("GetMetricsAndActivity(%q) gave %dm, active %t: %v", tc.metric, got, active, err)
				}
				return
			}
			if err != nil || got != tc.wantMilli || active != tc.wantActive {
				t.Errorf("got %s %dm active %t error %v, want %dm active %t and no error",
					tc.metric, got, active, err, tc.wantMilli, tc.wantActive)
			}
		})
	}
}

// TestStaleQueue checks that a queue whose producer went silent for longer than the
// trigger's staleAfter is Unavailable to KEDA, not a zero, and fresh again on the next
// report.
func TestStaleQueue(t *testing.T) {
	s := startScaler(t)
	tr := trigger{namespace: "shop", metadata: map[string]string{"queue": "orders", "staleAfter": "1s"}}
	s.publishQueue(t, "shop", "orders", 2, 1)
	sc := s.external(t, tr)
	testkit.Eventually(t, dataTimeout, func(context.Context) error {
		_, _, err := metric(t, sc, "s0-queue-backlog")
		return checkStatus(err, codes.Unavailable, "longer than staleAfter 1s")
	})
	// A new report makes it fresh again. Each try publishes one: on a slow machine a
	// report can go stale again before it is read.
	testkit.Eventually(t, dataTimeout, func(context.Context) error {
		s.publishQueue(t, "shop", "orders", 2, 1)
		got, active, err := metric(t, sc, "s0-queue-backlog")
		if err != nil {
			return err
		}
		if got != 3000 || !active {
			t.Fatalf("after a fresh report: got %dm active %t, want 3000m active true", got, active)
		}
		return nil
	})
}

// checkStatus reports how err differs from a gRPC status with code whose message holds
// msg.
func checkStatus(err error, code codes.Code, msg string) error {
	if err == nil {
		return fmt.Errorf("got no error, want %s", code)
	}
	st, ok := status.FromError(err)
	if !ok || st.Code() != code || !strings.Contains(st.Message(), msg) {
		return fmt.Errorf("got error %v, want %s saying %q", err, code, msg)
	}
	return nil
}
