package kube

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynamicfake "k8s.io/client-go/dynamic/fake"

	gpuscalerv1 "github.com/gpuscaler/gpuscaler/proto/gpuscaler/v1"
	"github.com/gpuscaler/gpuscaler/test/testkit"
)

// reqContainer is a container of a test pod requesting cpu and memory (either may be
// empty: not requested); always makes it a restartable init container (a sidecar).
func reqContainer(name, cpu, memory string, always bool) map[string]any {
	req := map[string]any{}
	if cpu != "" {
		req["cpu"] = cpu
	}
	if memory != "" {
		req["memory"] = memory
	}
	c := map[string]any{"name": name, "image": "x", "resources": map[string]any{"requests": req, "limits": map[string]any{"nvidia.com/gpu": "1"}}}
	if always {
		c["restartPolicy"] = "Always"
	}
	return c
}

// reqPod is a pod as the API server serves it, bound to node, in phase.
func reqPod(name, node, phase string, containers, inits []map[string]any, spec map[string]any) *unstructured.Unstructured {
	list := func(cs []map[string]any) []any {
		out := make([]any, len(cs))
		for i, c := range cs {
			out[i] = c
		}
		return out
	}
	s := map[string]any{"nodeName": node, "containers": list(containers)}
	if len(inits) > 0 {
		s["initContainers"] = list(inits)
	}
	for k, v := range spec {
		s[k] = v
	}
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "v1", "kind": "Pod",
		"metadata": map[string]any{"name": name, "namespace": "ml"},
		"spec":     s,
		"status":   map[string]any{"phase": phase},
	}}
}

// TestPodRequestsOf holds podRequestsOf to what the scheduler counts of a pod on its
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
			pod: reqPod("p", "n", "Running", []map[string]any{reqContainer("a", "500m", "1Gi", false), reqContainer("b", "1", "2Gi", false)}, nil, nil),
			cpu: 1500, mem: 3 << 30,
		},
		"no requests": {
			pod: reqPod("p", "n", "Running", []map[string]any{reqContainer("a", "", "", false)}, nil, nil),
		},
		"an init container larger than the app": {
			pod: reqPod("p", "n", "Pending", []map[string]any{reqContainer("a", "1", "1Gi", false)}, []map[string]any{reqContainer("init", "4", "512Mi", false)}, nil),
			cpu: 4000, mem: 1 << 30,
		},
		// KEP 753's example, with init2 at 2: sidecar1 1, init1 2 + 1, sidecar2 3 (4 so
		// far), init2 2 + 4 = 6; the app 1 with both sidecars is 5; the pod asks 6.
		"sidecars": {
			pod: reqPod("p", "n", "Running", []map[string]any{reqContainer("app", "1", "1Gi", false)}, []map[string]any{
				reqContainer("sidecar1", "1", "1Gi", true), reqContainer("init1", "2", "1Gi", false),
				reqContainer("sidecar2", "3", "1Gi", true), reqContainer("init2", "2", "1Gi", false),
			}, nil),
			cpu: 6000, mem: 3 << 30, // memory: app 1 + sidecars 2 = 3; init2 1 + 2 = 3
		},
		"overhead": {
			pod: reqPod("p", "n", "Running", []map[string]any{reqContainer("a", "1", "1Gi", false)}, nil,
				map[string]any{"overhead": map[string]any{"cpu": "250m", "memory": "120Mi"}}),
			cpu: 1250, mem: 1<<30 + 120<<20,
		},
		"pod-level requests": {
			pod: reqPod("p", "n", "Running", []map[string]any{reqContainer("a", "1", "1Gi", false)}, nil,
				map[string]any{"resources": map[string]any{"requests": map[string]any{"cpu": "8"}}, "overhead": map[string]any{"cpu": "100m"}}),
			cpu: 8100, mem: 1 << 30,
		},
		"a millicore fraction rounds up": {
			pod: reqPod("p", "n", "Running", []map[string]any{reqContainer("a", "100u", "1.5", false)}, nil, nil),
			cpu: 1, mem: 2,
		},
		"a quantity that does not parse": {
			pod:       reqPod("p", "n", "Running", []map[string]any{reqContainer("a", "lots", "1Gi", false)}, nil, nil),
			wantError: true,
		},
		"containers not a list": {
			pod:       &unstructured.Unstructured{Object: map[string]any{"spec": map[string]any{"containers": "x"}}},
			wantError: true,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			cpu, mem, err := podRequestsOf(tc.pod)
			if tc.wantError {
				if err == nil {
					t.Fatalf("podRequestsOf = %d, %d; want an error", cpu, mem)
				}
				return
			}
			if err != nil || cpu != tc.cpu || mem != tc.mem {
				t.Fatalf("podRequestsOf = %dm, %d bytes, %v; want %dm, %d bytes", cpu, mem, err, tc.cpu, tc.mem)
			}
		})
	}
}

func newFakePodClient(objs ...runtime.Object) *dynamicfake.FakeDynamicClient {
	return dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{PodsResource: "PodList"}, objs...)
}

// TestPodRequestsWatch: the requests of the pods bound to the node that have not
// finished add up, as the scheduler's own pod informer leaves Succeeded and Failed pods
// out (kubernetes v1.36.4 pkg/scheduler/scheduler.go, newPodInformer); a pod whose
// requests cannot be read makes the sum unknown, never a smaller one.
func TestPodRequestsWatch(t *testing.T) {
	app := func(cpu, mem string) []map[string]any { return []map[string]any{reqContainer("a", cpu, mem, false)} }
	client := newFakePodClient(
		reqPod("train-0", "gpu-1", "Running", app("8", "64Gi"), nil, nil),
		reqPod("train-1", "gpu-1", "Pending", app("8", "64Gi"), nil, nil),
		reqPod("done", "gpu-1", "Succeeded", app("8", "64Gi"), nil, nil),
		reqPod("failed", "gpu-1", "Failed", app("8", "64Gi"), nil, nil),
		reqPod("elsewhere", "gpu-2", "Running", app("8", "64Gi"), nil, nil),
	)
	w := NewPodRequests(client, "gpu-1", testkit.Logger(t))
	if _, _, ok := w.Requested(); ok {
		t.Fatal("before Run: requests known, want unknown")
	}
	defer testkit.Start(t, "pod requests", 0, nil, w.Run)()
	want := func(cpu, mem int64, ok bool) func() bool {
		return func() bool {
			c, m, known := w.Requested()
			return c == cpu && m == mem && known == ok
		}
	}
	testkit.Eventually(t, 5*time.Second, want(16_000, 128<<30, true))

	pods := client.Resource(PodsResource).Namespace("ml")
	if _, err := pods.Create(t.Context(), reqPod("sidecar", "gpu-1", "Running", app("1", "1Gi"), []map[string]any{reqContainer("s", "500m", "", true)}, nil), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 5*time.Second, want(17_500, 129<<30, true))
	if _, err := pods.Update(t.Context(), reqPod("train-0", "gpu-1", "Succeeded", app("8", "64Gi"), nil, nil), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 5*time.Second, want(9_500, 65<<30, true))
	if err := pods.Delete(t.Context(), "train-1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 5*time.Second, want(1_500, 1<<30, true))
	if _, err := pods.Create(t.Context(), reqPod("odd", "gpu-1", "Running", app("lots", "1Gi"), nil, nil), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 5*time.Second, want(0, 0, false))
}

func TestPodRequestsForbidden(t *testing.T) {
	client := newFakePodClient()
	forbid(client, "pods")
	log, out := testkit.BufferLogger()
	w := NewPodRequests(client, "gpu-1", log)
	stop := testkit.Start(t, "pod requests", 0, nil, w.Run)
	testkit.Eventually(t, 5*time.Second, func() bool {
		return testkit.CountLines(out.String(), "cannot read this node's pods' requests") >= 1
	})
	stop()
	if _, _, ok := w.Requested(); ok {
		t.Fatal("without access: requests known, want unknown")
	}
}

// TestNodeResourcesOf: a report carries the node's CPU and memory only when both the
// Node's allocatable and its pods' requests are known, and within a report's bounds;
// otherwise none, which the scaler reads as unknown, never as 0.
func TestNodeResourcesOf(t *testing.T) {
	known := func(c, m int64) func() (int64, int64, bool) { return func() (int64, int64, bool) { return c, m, true } }
	unknown := func() (int64, int64, bool) { return 0, 0, false }
	if got := NodeResourcesOf(known(8000, 1<<30), known(500, 1<<20))(); got.GetCpuAllocatableMillis() != 8000 || got.GetCpuRequestedMillis() != 500 ||
		got.GetMemoryAllocatableBytes() != 1<<30 || got.GetMemoryRequestedBytes() != 1<<20 {
		t.Fatalf("both known: %v", got)
	}
	for name, f := range map[string]func() *gpuscalerv1.NodeResources{
		"allocatable unknown": NodeResourcesOf(unknown, known(0, 0)),
		"requests unknown":    NodeResourcesOf(known(8000, 1<<30), unknown),
		"requests too large":  NodeResourcesOf(known(8000, 1<<30), known(gpuscalerv1.MaxNodeCPUMillis+1, 0)),
	} {
		if got := f(); got != nil {
			t.Errorf("%s: %v, want nil (unknown)", name, got)
		}
	}
}
