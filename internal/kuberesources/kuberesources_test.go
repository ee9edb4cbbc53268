package kuberesources

import (
	"testing"

	testpods "github.com/gpuscaler/gpuscaler/internal/kuberesources/kuberesourcestest"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// TestPodRequestsOf holds PodRequests to what the scheduler counts of a pod on its
// node: k8s.io/component-helpers v0.36.4 resource/helpers.go, PodRequests and
// AggregateContainerRequests, as kubernetes v1.36.4 pkg/scheduler/framework/types.go
// (attribution.PodInfo.calculateResource) calls them: the app containers' sum plus the restartable
// init containers' (sidecars, KEP 753), or the largest of each init container's request
// plus the sidecars started before it, whichever is larger; spec.resources' requests
// in place of the containers' where given (PodLevelResources, on by default since
// v1.34); plus spec.overhead.
func TestPodRequestsOf(t *testing.T) {
	tests := map[string]struct {
		pod       *unstructured.Unstructured
		cpu, mem  int64
		wantError bool
	}{
		"app containers add up": {
			pod: testpods.Pod("p", "n", "Running", []map[string]any{testpods.Container("a", "500m", "1Gi", false), testpods.Container("b", "1", "2Gi", false)}, nil, nil),
			cpu: 1500, mem: 3 << 30,
		},
		"no requests": {
			pod: testpods.Pod("p", "n", "Running", []map[string]any{testpods.Container("a", "", "", false)}, nil, nil),
		},
		"an init container larger than the app": {
			pod: testpods.Pod("p", "n", "Pending", []map[string]any{testpods.Container("a", "1", "1Gi", false)}, []map[string]any{testpods.Container("init", "4", "512Mi", false)}, nil),
			cpu: 4000, mem: 1 << 30,
		},
		// KEP 753's example, with init2 at 2: sidecar1 1, init1 2 + 1, sidecar2 3 (4 so
		// far), init2 2 + 4 = 6; the app 1 with both sidecars is 5; the pod asks 6.
		"sidecars": {
			pod: testpods.Pod("p", "n", "Running", []map[string]any{testpods.Container("app", "1", "1Gi", false)}, []map[string]any{
				testpods.Container("sidecar1", "1", "1Gi", true), testpods.Container("init1", "2", "1Gi", false),
				testpods.Container("sidecar2", "3", "1Gi", true), testpods.Container("init2", "2", "1Gi", false),
			}, nil),
			cpu: 6000, mem: 3 << 30, // memory: app 1 + sidecars 2 = 3; init2 1 + 2 = 3
		},
		"overhead": {
			pod: testpods.Pod("p", "n", "Running", []map[string]any{testpods.Container("a", "1", "1Gi", false)}, nil,
				map[string]any{"overhead": map[string]any{"cpu": "250m", "memory": "120Mi"}}),
			cpu: 1250, mem: 1<<30 + 120<<20,
		},
		"pod-level requests": {
			pod: testpods.Pod("p", "n", "Running", []map[string]any{testpods.Container("a", "1", "1Gi", false)}, nil,
				map[string]any{"resources": map[string]any{"requests": map[string]any{"cpu": "8"}}, "overhead": map[string]any{"cpu": "100m"}}),
			cpu: 8100, mem: 1 << 30,
		},
		"a millicore fraction rounds up": {
			pod: testpods.Pod("p", "n", "Running", []map[string]any{testpods.Container("a", "100u", "1.5", false)}, nil, nil),
			cpu: 1, mem: 2,
		},
		"a quantity that does not parse": {
			pod:       testpods.Pod("p", "n", "Running", []map[string]any{testpods.Container("a", "lots", "1Gi", false)}, nil, nil),
			wantError: true,
		},
		"containers not a list": {
			pod:       &unstructured.Unstructured{Object: map[string]any{"spec": map[string]any{"containers": "x"}}},
			wantError: true,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			cpu, mem, err := PodRequests(tc.pod)
			if tc.wantError {
				if err == nil {
					t.Fatalf("PodRequests = %d, %d; want an error", cpu, mem)
				}
				return
			}
			if err != nil || cpu != tc.cpu || mem != tc.mem {
				t.Fatalf("PodRequests = %dm, %d bytes, %v; want %dm, %d bytes", cpu, mem, err, tc.cpu, tc.mem)
			}
		})
	}
}

// TestNodeAllocatable: a Node's allocatable cpu and memory, known only when both are
// quantities within a report's bounds.
func TestNodeAllocatable(t *testing.T) {
	node := func(alloc map[string]any) *unstructured.Unstructured {
		return &unstructured.Unstructured{Object: map[string]any{"status": map[string]any{"allocatable": alloc}}}
	}
	if c, m, ok := NodeAllocatable(node(map[string]any{"cpu": "7500m", "memory": "64Gi", "nvidia.com/gpu": "8"})); !ok || c != 7500 || m != 64<<30 {
		t.Fatalf("NodeAllocatable = %d, %d, %v; want 7500, 64Gi, true", c, m, ok)
	}
	for name, alloc := range map[string]map[string]any{
		"no memory":     {"cpu": "8"},
		"no quantity":   {"cpu": "lots", "memory": "1Gi"},
		"out of bounds": {"cpu": "8", "memory": "2Ei"},
	} {
		if _, _, ok := NodeAllocatable(node(alloc)); ok {
			t.Errorf("%s: known, want unknown", name)
		}
	}
}
