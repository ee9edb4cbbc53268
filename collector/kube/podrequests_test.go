package kube

import (
	"testing"
	"time"

	testpods "github.com/gpuscaler/gpuscaler/internal/kuberesources/kuberesourcestest"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynamicfake "k8s.io/client-go/dynamic/fake"

	gpuscalerv1 "github.com/gpuscaler/gpuscaler/proto/gpuscaler/v1"
	"github.com/gpuscaler/gpuscaler/test/testkit"
)

func newFakePodClient(objs ...runtime.Object) *dynamicfake.FakeDynamicClient {
	return dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{PodsResource: "PodList"}, objs...)
}

// TestPodRequestsWatch: the requests of the pods bound to the node that have not
// finished add up, as the scheduler's own pod informer leaves Succeeded and Failed pods
// out (kubernetes v1.36.4 pkg/scheduler/scheduler.go, newPodInformer); a pod whose
// requests cannot be read makes the sum unknown, never a smaller one.
func TestPodRequestsWatch(t *testing.T) {
	app := func(cpu, mem string) []map[string]any {
		return []map[string]any{testpods.Container("a", cpu, mem, false)}
	}
	client := newFakePodClient(
		testpods.Pod("train-0", "gpu-1", "Running", app("8", "64Gi"), nil, nil),
		testpods.Pod("train-1", "gpu-1", "Pending", app("8", "64Gi"), nil, nil),
		testpods.Pod("done", "gpu-1", "Succeeded", app("8", "64Gi"), nil, nil),
		testpods.Pod("failed", "gpu-1", "Failed", app("8", "64Gi"), nil, nil),
		testpods.Pod("elsewhere", "gpu-2", "Running", app("8", "64Gi"), nil, nil),
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
	if _, err := pods.Create(t.Context(), testpods.Pod("sidecar", "gpu-1", "Running", app("1", "1Gi"), []map[string]any{testpods.Container("s", "500m", "", true)}, nil), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 5*time.Second, want(17_500, 129<<30, true))
	if _, err := pods.Update(t.Context(), testpods.Pod("train-0", "gpu-1", "Succeeded", app("8", "64Gi"), nil, nil), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 5*time.Second, want(9_500, 65<<30, true))
	if err := pods.Delete(t.Context(), "train-1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 5*time.Second, want(1_500, 1<<30, true))
	if _, err := pods.Create(t.Context(), testpods.Pod("odd", "gpu-1", "Running", app("lots", "1Gi"), nil, nil), metav1.CreateOptions{}); err != nil {
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
