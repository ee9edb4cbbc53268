package apipods

import (
	"maps"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	ktypes "k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/gpuscaler/gpuscaler/scaler"
	"github.com/gpuscaler/gpuscaler/test/testkit"
)

// newFakeClient is client-go's fake dynamic client serving objs.
func newFakeClient(objs ...runtime.Object) *dynamicfake.FakeDynamicClient {
	return dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{PodsResource: "PodList", NodesResource: "NodeList"}, objs...)
}

// apiPod is a pod as the API server serves it, with a spec the directory must not keep.
func apiPod(ns, name, uid, node string, labels map[string]string) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "v1", "kind": "Pod",
		"spec": map[string]any{"nodeName": node, "containers": []any{map[string]any{
			"name": "app", "image": "x", "env": []any{map[string]any{"name": "TOKEN", "value": "secret"}},
		}}},
	}}
	u.SetNamespace(ns)
	u.SetName(name)
	u.SetUID(ktypes.UID(uid))
	u.SetLabels(labels)
	return u
}

// TestDirectory: the directory places each pod on its node with its uid and labels,
// follows moves, relabels and deletions, and keeps nothing of a pod's spec but its node.
func TestDirectory(t *testing.T) {
	client := newFakeClient(
		apiPod("a", "train-0", "u1", "gpu-1", map[string]string{"app": "train"}),
		apiPod("b", "serve-0", "u2", "gpu-2", map[string]string{"app": "serve"}),
	)
	d := New(client, testkit.Logger(t))
	if d.Synced() {
		t.Fatal("synced before Run")
	}
	defer testkit.Start(t, "pod directory", 0, nil, d.Run)()
	testkit.Eventually(t, 5*time.Second, d.Synced)
	want := func(ns, name string, want scaler.APIPod, found bool) func() bool {
		return func() bool {
			got, ok := d.Pod(ns, name)
			return ok == found && got.UID == want.UID && got.Node == want.Node && maps.Equal(got.Labels, want.Labels)
		}
	}
	testkit.Eventually(t, 5*time.Second, want("a", "train-0", scaler.APIPod{UID: "u1", Node: "gpu-1", Labels: map[string]string{"app": "train"}}, true))
	testkit.Eventually(t, 5*time.Second, want("b", "serve-0", scaler.APIPod{UID: "u2", Node: "gpu-2", Labels: map[string]string{"app": "serve"}}, true))
	if _, ok := d.Pod("a", "serve-0"); ok {
		t.Fatal("a/serve-0 found: the namespace is part of the key")
	}
	if obj, _, _ := d.informer.GetIndexer().GetByKey("a/train-0"); obj.(*pod).Annotations != nil || obj.(*pod).ManagedFields != nil {
		t.Fatalf("kept %+v, want name, namespace, uid, labels and node only", obj)
	}

	pods := client.Resource(PodsResource)
	if _, err := pods.Namespace("b").Update(t.Context(), apiPod("b", "serve-0", "u2", "gpu-2", map[string]string{"app": "serve", "tier": "gold"}), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 5*time.Second, want("b", "serve-0", scaler.APIPod{UID: "u2", Node: "gpu-2", Labels: map[string]string{"app": "serve", "tier": "gold"}}, true))
	if err := pods.Namespace("a").Delete(t.Context(), "train-0", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 5*time.Second, want("a", "train-0", scaler.APIPod{}, false))
	if _, err := pods.Namespace("a").Create(t.Context(), apiPod("a", "train-0", "u3", "gpu-3", nil), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 5*time.Second, want("a", "train-0", scaler.APIPod{UID: "u3", Node: "gpu-3"}, true))
}

// TestDirectoryForbidden: without RBAC the directory never syncs, knows no pod, and says
// why once.
func TestDirectoryForbidden(t *testing.T) {
	client := newFakeClient()
	forbidden := apierrors.NewForbidden(schema.GroupResource{Resource: "pods"}, "", nil)
	client.PrependReactor("list", "pods", func(k8stesting.Action) (bool, runtime.Object, error) { return true, nil, forbidden })
	client.PrependWatchReactor("pods", func(k8stesting.Action) (bool, watch.Interface, error) { return true, nil, forbidden })
	log, out := testkit.BufferLogger()
	d := New(client, log)
	stop := testkit.Start(t, "pod directory", 0, nil, d.Run)
	testkit.Eventually(t, 5*time.Second, func() bool {
		return testkit.CountLines(out.String(), "cannot list or watch pods") >= 1
	})
	stop()
	if d.Synced() {
		t.Fatal("synced without access")
	}
	if n := testkit.CountLines(out.String(), "cannot list or watch pods"); n != 1 {
		t.Fatalf("said so %d times, want once", n)
	}
}

// withRequests gives a test pod a container requesting cpu and memory, and a phase.
func withRequests(u *unstructured.Unstructured, cpu, memory, phase string) *unstructured.Unstructured {
	_ = unstructured.SetNestedSlice(u.Object, []any{map[string]any{"name": "app", "image": "x",
		"resources": map[string]any{"requests": map[string]any{"cpu": cpu, "memory": memory}}}}, "spec", "containers")
	_ = unstructured.SetNestedField(u.Object, phase, "status", "phase")
	return u
}

func apiNode(name, cpu, memory string) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "Node",
		"status": map[string]any{"allocatable": map[string]any{"cpu": cpu, "memory": memory, "nvidia.com/gpu": "8"}}}}
	u.SetName(name)
	return u
}

// TestDirectoryNodeResources: a node's CPU and memory are its Node's allocatable and the
// requests of its pods that have not finished, as the scheduler counts them; unknown
// while a pod's requests cannot be read, or without the Node.
func TestDirectoryNodeResources(t *testing.T) {
	client := newFakeClient(
		apiNode("gpu-1", "64", "512Gi"),
		withRequests(apiPod("a", "train-0", "u1", "gpu-1", nil), "8", "64Gi", "Running"),
		withRequests(apiPod("a", "train-1", "u2", "gpu-1", nil), "500m", "1Gi", "Pending"),
		withRequests(apiPod("a", "done", "u3", "gpu-1", nil), "8", "64Gi", "Succeeded"),
		withRequests(apiPod("b", "elsewhere", "u4", "gpu-2", nil), "8", "64Gi", "Running"),
	)
	d := New(client, testkit.Logger(t))
	defer testkit.Start(t, "pod directory", 0, nil, d.Run)()
	want := func(node string, cpu, mem uint64, known bool) func() bool {
		return func() bool {
			r, ok := d.NodeResources(node)
			if !known {
				return !ok
			}
			return ok && r.GetCpuAllocatableMillis() == 64000 && r.GetMemoryAllocatableBytes() == 512<<30 &&
				r.GetCpuRequestedMillis() == cpu && r.GetMemoryRequestedBytes() == mem
		}
	}
	testkit.Eventually(t, 5*time.Second, want("gpu-1", 8500, 65<<30, true))
	testkit.Eventually(t, 5*time.Second, want("gpu-2", 0, 0, false)) // no Node gpu-2
	if obj, _, _ := d.informer.GetIndexer().GetByKey("a/train-0"); obj.(*pod).Annotations != nil {
		t.Fatalf("kept %+v", obj)
	}
	if _, err := client.Resource(PodsResource).Namespace("a").Create(t.Context(),
		withRequests(apiPod("a", "odd", "u5", "gpu-1", nil), "lots", "1Gi", "Running"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 5*time.Second, want("gpu-1", 0, 0, false))
}
