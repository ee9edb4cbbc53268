package sim

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/gpuscaler/gpuscaler/collector/internal/collectortest"
	"github.com/gpuscaler/gpuscaler/collector/kube"
	"github.com/gpuscaler/gpuscaler/collector/kubelet"
	"github.com/gpuscaler/gpuscaler/test/testkit"
)

// clusterPodObj is a pod as the API serves it: bound to node, its containers asking for
// GPU resources in their limits (container name → resource → count).
func clusterPodObj(ns, name, node string, created time.Time, ready bool, containers map[string]map[string]int64) *unstructured.Unstructured {
	var cs []any
	for _, c := range slices.Sorted(maps.Keys(containers)) {
		limits := map[string]any{"cpu": "1"}
		for r, n := range containers[c] {
			limits[r] = fmt.Sprint(n)
		}
		cs = append(cs, map[string]any{"name": c, "image": "model-server", "resources": map[string]any{"limits": limits}})
	}
	status := "False"
	if ready {
		status = "True"
	}
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "v1", "kind": "Pod",
		"spec":   map[string]any{"nodeName": node, "containers": cs},
		"status": map[string]any{"phase": "Running", "conditions": []any{map[string]any{"type": "Ready", "status": status}}},
	}}
	u.SetNamespace(ns)
	u.SetName(name)
	u.SetUID(types.UID("uid-" + ns + "-" + name))
	u.SetCreationTimestamp(metav1.NewTime(created))
	return u
}

// newTestPodResources asks the kubelet at cfg.Socket, until the test ends.
func newTestPodResources(t *testing.T, cfg kubelet.PodResourcesConfig) *kubelet.PodResources {
	t.Helper()
	p, err := kubelet.NewPodResources(cfg)
	if err != nil {
		t.Fatalf("NewPodResources: %v", err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// runSimCluster starts a Cluster for node over a fake API holding objs, serving its
// pod-resources API on a socket, and returns its simulated node and fake API with the
// collector's own client of that socket and a bare gRPC client of it.
func runSimCluster(t *testing.T, node string, cfg Config, objs ...runtime.Object) (*Node, *dynamicfake.FakeDynamicClient, *kubelet.PodResources, podresourcesv1.PodResourcesListerClient) {
	t.Helper()
	sim, err := New(node, cfg)
	if err != nil {
		t.Fatal(err)
	}
	scheme := runtime.NewScheme()
	client := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(scheme,
		map[schema.GroupVersionResource]string{kube.PodsResource: "PodList"}, objs...)
	socket := collectortest.SocketPath(t)
	sc, err := NewCluster(sim, ClusterConfig{Node: node, Socket: socket, Client: client, Log: testkit.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	testkit.Start(t, "simulated kubelet", 0, nil, sc.Run)
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return sim, client, newTestPodResources(t, kubelet.PodResourcesConfig{Socket: socket}), podresourcesv1.NewPodResourcesListerClient(conn)
}

// holdersOf reads the allocation through the pod-resources socket, as the collector does,
// and returns who holds each device: "namespace/pod/container".
func holdersOf(t *testing.T, pr *kubelet.PodResources) (map[string]string, int) {
	t.Helper()
	a, err := pr.Allocation(t.Context())
	if err != nil {
		return nil, 0
	}
	out := map[string]string{}
	for id, hs := range a.Holders {
		for _, h := range hs {
			out[id] = h.Namespace + "/" + h.Pod + "/" + h.Container
		}
	}
	return out, len(a.Allocatable)
}

func waitHolders(t *testing.T, pr *kubelet.PodResources, want map[string]string) {
	t.Helper()
	testkit.Eventually(t, 10*time.Second, func(context.Context) error {
		got, _ := holdersOf(t, pr)
		return testkit.Check(maps.Equal(got, want), "holders through the pod-resources socket:\n got %v\nwant %v", got, want)
	})
}

func TestClusterHandsOutDevicesAsTheKubelet(t *testing.T) {
	const node = "kwok-gpu-1"
	t0 := time.Date(2026, 11, 26, 10, 0, 0, 0, time.UTC)
	sim0, err := New(node, Config{GPUs: 4})
	if err != nil {
		t.Fatal(err)
	}
	gpu := func(i int) string { return sim0.devices[i].id }

	older := clusterPodObj("ml", "llm-a", node, t0, true, map[string]map[string]int64{"server": {"nvidia.com/gpu": 2}})
	newer := clusterPodObj("ml", "llm-b", node, t0.Add(time.Second), false, map[string]map[string]int64{"server": {"nvidia.com/gpu": 1}, "sidecar": {}})
	elsewhere := clusterPodObj("ml", "llm-c", "another-node", t0, true, map[string]map[string]int64{"server": {"nvidia.com/gpu": 1}})
	sim, client, pr, lister := runSimCluster(t, node, Config{GPUs: 4, Util: 70}, newer, older, elsewhere)

	// The older pod is admitted first and gets the lowest GPUs; a pod on another node
	// holds nothing here.
	waitHolders(t, pr, map[string]string{gpu(0): "ml/llm-a/server", gpu(1): "ml/llm-a/server", gpu(2): "ml/llm-b/server"})
	if _, n := holdersOf(t, pr); n != 4 {
		t.Errorf("allocatable devices: got %d, want 4", n)
	}
	// Get answers for one pod, and says NotFound for another.
	resp, err := lister.Get(t.Context(), &podresourcesv1.GetPodResourcesRequest{PodNamespace: "ml", PodName: "llm-b"})
	if err != nil || len(resp.GetPodResources().GetContainers()) != 2 {
		t.Errorf("Get ml/llm-b: %v, %v: want its two containers", resp, err)
	}
	if _, err := lister.Get(t.Context(), &podresourcesv1.GetPodResourcesRequest{PodNamespace: "ml", PodName: "llm-c"}); err == nil {
		t.Error("Get of a pod on another node: no error")
	}

	// A Ready pod's GPUs run at the node's utilisation; a loading one's idle.
	samples, err := sim.Collect(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []float64{70, 70, 0, 0} {
		if got := samples[i].GetGpuUtil(); got < want-5 || got > want+5 {
			t.Errorf("GPU %d: utilisation %.1f, want %.0f ± the jitter", i, got, want)
		}
	}

	// The first pod ends: its GPUs are free, and a new pod takes the lowest of them; the
	// second keeps its GPU.
	older.Object["status"].(map[string]any)["phase"] = "Succeeded"
	if _, err := client.Resource(kube.PodsResource).Namespace("ml").UpdateStatus(t.Context(), older, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitHolders(t, pr, map[string]string{gpu(2): "ml/llm-b/server"})
	third := clusterPodObj("ml", "llm-d", node, t0.Add(2*time.Second), true, map[string]map[string]int64{"server": {"nvidia.com/gpu": 3}})
	if _, err := client.Resource(kube.PodsResource).Namespace("ml").Create(t.Context(), third, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitHolders(t, pr, map[string]string{gpu(0): "ml/llm-d/server", gpu(1): "ml/llm-d/server", gpu(2): "ml/llm-b/server", gpu(3): "ml/llm-d/server"})

	// A pod that does not fit is refused and holds nothing, as the kubelet refuses it;
	// deleting a pod frees its GPU.
	big := clusterPodObj("ml", "too-big", node, t0.Add(3*time.Second), true, map[string]map[string]int64{"server": {"nvidia.com/gpu": 2}})
	if _, err := client.Resource(kube.PodsResource).Namespace("ml").Create(t.Context(), big, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := client.Resource(kube.PodsResource).Namespace("ml").Delete(t.Context(), "llm-b", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitHolders(t, pr, map[string]string{gpu(0): "ml/llm-d/server", gpu(1): "ml/llm-d/server", gpu(3): "ml/llm-d/server"})
}

func TestClusterSharedAndMIG(t *testing.T) {
	const node = "kwok-gpu-2"
	t0 := time.Date(2026, 11, 26, 10, 0, 0, 0, time.UTC)
	cfg := Config{GPUs: 3, Replicas: 2, MIG: map[int][]string{2: {"1g.10gb", "3g.40gb"}}}
	sim0, err := New(node, cfg)
	if err != nil {
		t.Fatal(err)
	}
	// Time-slicing spreads replicas over the GPUs, as NVIDIA's plugin does by default;
	// a MIG resource gets a slice of its profile.
	var objs []runtime.Object
	for i := range 3 {
		objs = append(objs, clusterPodObj("ml", fmt.Sprintf("small-%d", i), node, t0.Add(time.Duration(i)*time.Second), true,
			map[string]map[string]int64{"main": {"nvidia.com/gpu": 1}}))
	}
	objs = append(objs, clusterPodObj("ml", "slice", node, t0.Add(5*time.Second), true, map[string]map[string]int64{"main": {"nvidia.com/mig-3g.40gb": 1}}))
	_, _, pr, _ := runSimCluster(t, node, cfg, objs...)
	waitHolders(t, pr, map[string]string{
		sim0.devices[0].id + "::0": "ml/small-0/main",
		sim0.devices[1].id + "::0": "ml/small-1/main",
		sim0.devices[0].id + "::1": "ml/small-2/main",
		sim0.devices[3].id:         "ml/slice/main",
	})
}

func TestClusterConfig(t *testing.T) {
	sim, err := New("n", Config{GPUs: 2})
	if err != nil {
		t.Fatal(err)
	}
	client := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), map[schema.GroupVersionResource]string{kube.PodsResource: "PodList"})
	for _, tt := range []struct {
		cfg  ClusterConfig
		want string
	}{
		{ClusterConfig{Socket: "/tmp/s", Client: client}, "no node name"},
		{ClusterConfig{Node: "n", Client: client}, "no pod-resources socket"},
		{ClusterConfig{Node: "n", Socket: "/tmp/s"}, "no Kubernetes client"},
	} {
		if _, err := NewCluster(sim, tt.cfg); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("NewCluster(%+v): %v, want %q", tt.cfg, err, tt.want)
		}
	}
	withPods, err := New("n", Config{GPUs: 2, Pods: []Pod{{Namespace: "a", Name: "b", GPUs: []string{"0"}}}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := NewCluster(withPods, ClusterConfig{Node: "n", Socket: "/tmp/s", Client: client}); err == nil || !strings.Contains(err.Error(), "pods of its own") {
		t.Errorf("a simulation with pods of its own: %v", err)
	}

	// Once its pods come from the cluster, PUT /sim may change the load, not the pods
	// or the devices they hold.
	if _, err := NewCluster(sim, ClusterConfig{Node: "n", Socket: "/tmp/s", Client: client}); err != nil {
		t.Fatal(err)
	}
	if err := sim.SetConfig(Config{GPUs: 2, Util: 90}); err != nil {
		t.Errorf("changing the utilisation: %v", err)
	}
	if got := sim.Config().Util; got != 90 {
		t.Errorf("utilisation after SetConfig: %v, want 90", got)
	}
	for name, cfg := range map[string]Config{
		"pods":     {GPUs: 2, Pods: []Pod{{Namespace: "a", Name: "b", GPUs: []string{"0"}}}},
		"gpus":     {GPUs: 4},
		"replicas": {GPUs: 2, Replicas: 2},
		"mig":      {GPUs: 2, MIG: map[int][]string{1: {"7g.80gb"}}},
	} {
		if err := sim.SetConfig(cfg); err == nil || !strings.Contains(err.Error(), "--sim-from-cluster") {
			t.Errorf("SetConfig changing %s: %v, want an error naming --sim-from-cluster", name, err)
		}
	}
}
