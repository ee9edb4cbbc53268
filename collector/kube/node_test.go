package kube

import (
	"encoding/json"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	k8stesting "k8s.io/client-go/testing"

	gpuscalerv1 "github.com/gpuscaler/gpuscaler/proto/gpuscaler/v1"
	"github.com/gpuscaler/gpuscaler/test/testkit"
)

// testNode is a Node as the API server serves it, with a status the collector does not
// keep.
func testNodeObject(name string, labels map[string]string, unschedulable bool, taints ...map[string]any) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "v1", "kind": "Node",
		"metadata": map[string]any{"name": name},
		"spec":     map[string]any{},
		"status":   map[string]any{"images": []any{map[string]any{"names": []any{"registry/x"}, "sizeBytes": int64(1 << 30)}}},
	}}
	u.SetLabels(labels)
	if unschedulable {
		u.Object["spec"].(map[string]any)["unschedulable"] = true
	}
	if len(taints) > 0 {
		list := make([]any, len(taints))
		for i, t := range taints {
			list[i] = t
		}
		u.Object["spec"].(map[string]any)["taints"] = list
	}
	return u
}

func taint(key, value, effect string) map[string]any {
	t := map[string]any{"key": key, "effect": effect}
	if value != "" {
		t["value"] = value
	}
	return t
}

func newFakeNodeClient(objs ...runtime.Object) *dynamicfake.FakeDynamicClient {
	return dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{nodesResource: "NodeList"}, objs...)
}

// TestNodeWatch: the collector follows its own Node, its labels and what decides whether
// the scheduler places pods there: kubectl cordon (and drain, which cordons first) sets
// spec.unschedulable (k8s.io/kubectl pkg/drain/cordon.go); the cluster autoscaler taints
// a node it removes ToBeDeletedByClusterAutoscaler:NoSchedule. PreferNoSchedule taints
// keep no pod off (the scheduler's TaintToleration filter counts NoSchedule and NoExecute
// only), so they are not reported.
func TestNodeWatch(t *testing.T) {
	client := newFakeNodeClient(
		testNodeObject("gpu-1", map[string]string{"pool": "a100"}, false, taint("nvidia.com/gpu", "present", "NoSchedule"), taint("spot", "", "PreferNoSchedule")),
		testNodeObject("gpu-2", map[string]string{"pool": "other"}, true),
	)
	n := NewNodeWatch(client, "gpu-1", testkit.Logger(t))
	if n.Scheduling() != nil || n.Labels() != nil {
		t.Fatalf("before Run: scheduling %v, labels %v; want none: unknown, not schedulable", n.Scheduling(), n.Labels())
	}
	defer testkit.Start(t, "node watch", 0, nil, n.Run)()

	want := &gpuscalerv1.NodeScheduling{Taints: []*gpuscalerv1.Taint{{Key: "nvidia.com/gpu", Value: "present", Effect: "NoSchedule"}}}
	testkit.Eventually(t, 5*time.Second, func() bool { return proto.Equal(n.Scheduling(), want) })
	if got := n.Labels(); got["pool"] != "a100" {
		t.Fatalf("labels %v, want gpu-1's pool=a100", got)
	}

	drained := testNodeObject("gpu-1", map[string]string{"pool": "a100"}, true,
		taint("nvidia.com/gpu", "present", "NoSchedule"), taint("ToBeDeletedByClusterAutoscaler", "1732700000", "NoSchedule"))
	if _, err := client.Resource(nodesResource).Update(t.Context(), drained, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	want = &gpuscalerv1.NodeScheduling{Unschedulable: true, Taints: []*gpuscalerv1.Taint{
		{Key: "nvidia.com/gpu", Value: "present", Effect: "NoSchedule"},
		{Key: "ToBeDeletedByClusterAutoscaler", Value: "1732700000", Effect: "NoSchedule"},
	}}
	testkit.Eventually(t, 5*time.Second, func() bool { return proto.Equal(n.Scheduling(), want) })

	// Deleted (the autoscaler removes it while its collector still runs): it takes no
	// Job, so it is reported cordoned, never unknown (which capacity would count).
	if err := client.Resource(nodesResource).Delete(t.Context(), "gpu-1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	want = &gpuscalerv1.NodeScheduling{Unschedulable: true}
	testkit.Eventually(t, 5*time.Second, func() bool { return proto.Equal(n.Scheduling(), want) })
}

func TestNodeWatchForbidden(t *testing.T) {
	client := newFakeNodeClient()
	forbid(client, "nodes")
	log, out := testkit.BufferLogger()
	n := NewNodeWatch(client, "gpu-1", log)
	stop := testkit.Start(t, "node watch", 0, nil, n.Run)
	testkit.Eventually(t, 5*time.Second, func() bool {
		return testkit.CountLines(out.String(), "cannot read this node from the Kubernetes API") >= 1
	})
	stop()
	if n.Labels() != nil || n.Scheduling() != nil {
		t.Fatalf("without access: labels %v, scheduling %v; want none (unknown)", n.Labels(), n.Scheduling())
	}
	if got := testkit.CountLines(out.String(), "cannot read this node from the Kubernetes API"); got != 1 {
		t.Fatalf("logged the missing access %d times, want once:\n%s", got, out.String())
	}
}

func TestParseNodeScheduling(t *testing.T) {
	tests := map[string]struct {
		node *unstructured.Unstructured
		want *gpuscalerv1.NodeScheduling // nil: unknown
	}{
		"schedulable, untainted": {testNodeObject("n", nil, false), &gpuscalerv1.NodeScheduling{}},
		"cordoned":               {testNodeObject("n", nil, true), &gpuscalerv1.NodeScheduling{Unschedulable: true}},
		"NoExecute kept, PreferNoSchedule left out": {
			testNodeObject("n", nil, false, taint("node.kubernetes.io/unreachable", "", "NoExecute"), taint("a", "b", "PreferNoSchedule")),
			&gpuscalerv1.NodeScheduling{Taints: []*gpuscalerv1.Taint{{Key: "node.kubernetes.io/unreachable", Effect: "NoExecute"}}},
		},
		// Kubernetes validates a Node's taints; one that fails ours anyway makes the
		// node's state unknown, never a node without that taint.
		"a taint without key": {testNodeObject("n", nil, false, taint("", "", "NoSchedule")), nil},
		"an effect unknown":   {testNodeObject("n", nil, false, taint("a", "", "Sometimes")), nil},
		"unschedulable a string": {func() *unstructured.Unstructured {
			u := testNodeObject("n", nil, false)
			u.Object["spec"].(map[string]any)["unschedulable"] = "yes"
			return u
		}(), nil},
		"taints not a list": {func() *unstructured.Unstructured {
			u := testNodeObject("n", nil, false)
			u.Object["spec"].(map[string]any)["taints"] = "x"
			return u
		}(), nil},
		"no spec": {&unstructured.Unstructured{Object: map[string]any{"metadata": map[string]any{"name": "n"}}}, &gpuscalerv1.NodeScheduling{}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := parseNodeScheduling(tc.node)
			if tc.want == nil {
				if err == nil {
					t.Fatalf("got %v, want an error", got)
				}
				return
			}
			if err != nil || !proto.Equal(got, tc.want) {
				t.Fatalf("got %v, %v; want %v", got, err, tc.want)
			}
		})
	}
}

// FuzzParseNodeScheduling: whatever Node the API serves, what is parsed passes the
// NodeReport's own validation, so it never costs the node its report.
func FuzzParseNodeScheduling(f *testing.F) {
	for _, u := range []*unstructured.Unstructured{
		testNodeObject("n", nil, true, taint("nvidia.com/gpu", "present", "NoSchedule"), taint("x", "", "PreferNoSchedule")),
		testNodeObject("n", nil, false, taint("a", "b", "NoExecute"), taint("a", "c", "NoExecute")),
	} {
		b, _ := json.Marshal(u.Object)
		f.Add(b)
	}
	f.Add([]byte(`{"spec":{"taints":[{"key":"a b","effect":"NoSchedule"}]}}`))
	f.Add([]byte(`{"spec":{"unschedulable":1}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		var obj map[string]any
		if json.Unmarshal(data, &obj) != nil {
			return
		}
		s, err := parseNodeScheduling(&unstructured.Unstructured{Object: obj})
		if err != nil {
			return
		}
		if err := (&gpuscalerv1.NodeReport{Node: "n", Scheduling: s}).Validate(); err != nil {
			t.Fatalf("parsed %v from %s, which the report refuses: %v", s, data, err)
		}
	})
}

// TestNodeWatchAllocatable: the Node's status.allocatable cpu and memory (what the
// kubelet offers pods: capacity less its reservations and eviction threshold) are what
// the scheduler's NodeResourcesFit filter weighs requests against. A Node that gives
// neither, or one that does not parse, leaves them unknown.
func TestNodeWatchAllocatable(t *testing.T) {
	node := testNodeObject("gpu-1", nil, false)
	node.Object["status"].(map[string]any)["allocatable"] = map[string]any{"cpu": "191500m", "memory": "2113455012Ki", "nvidia.com/gpu": "8", "pods": "110"}
	client := newFakeNodeClient(node)
	n := NewNodeWatch(client, "gpu-1", testkit.Logger(t))
	if _, _, ok := n.Allocatable(); ok {
		t.Fatal("before Run: allocatable known, want unknown")
	}
	defer testkit.Start(t, "node watch", 0, nil, n.Run)()
	testkit.Eventually(t, 5*time.Second, func() bool {
		cpu, mem, ok := n.Allocatable()
		return ok && cpu == 191_500 && mem == 2113455012*1024
	})

	for name, alloc := range map[string]map[string]any{
		"no memory":      {"cpu": "8"},
		"not parsed":     {"cpu": "8", "memory": "lots"},
		"too large":      {"cpu": "2000000", "memory": "1Gi"},
		"no allocatable": nil,
	} {
		t.Run(name, func(t *testing.T) {
			node := testNodeObject("gpu-1", nil, false)
			if alloc != nil {
				node.Object["status"].(map[string]any)["allocatable"] = alloc
			}
			if _, err := client.Resource(nodesResource).Update(t.Context(), node, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
			testkit.Eventually(t, 5*time.Second, func() bool { _, _, ok := n.Allocatable(); return !ok })
			// Back to known, so the next case starts from it.
			good := testNodeObject("gpu-1", nil, false)
			good.Object["status"].(map[string]any)["allocatable"] = map[string]any{"cpu": "4", "memory": "1Gi"}
			if _, err := client.Resource(nodesResource).Update(t.Context(), good, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
			testkit.Eventually(t, 5*time.Second, func() bool { c, _, ok := n.Allocatable(); return ok && c == 4000 })
		})
	}
}

// forbid makes client refuse every list and watch of resource, as an API server refuses
// a ServiceAccount without the RBAC to read it.
func forbid(client *dynamicfake.FakeDynamicClient, resource string) {
	forbidden := apierrors.NewForbidden(schema.GroupResource{Resource: resource}, "", nil)
	client.PrependReactor("list", resource, func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, forbidden
	})
	client.PrependWatchReactor(resource, func(k8stesting.Action) (bool, watch.Interface, error) {
		return true, nil, forbidden
	})
}
