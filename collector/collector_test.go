package collector

import (
	"context"
	"errors"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/gpuscaler/gpuscaler/collector/dcgm"
	"github.com/gpuscaler/gpuscaler/collector/exporter"
	"github.com/gpuscaler/gpuscaler/collector/kube"
	"github.com/gpuscaler/gpuscaler/collector/kubelet"
	"github.com/gpuscaler/gpuscaler/collector/nvml"
	"github.com/gpuscaler/gpuscaler/collector/sim"
	"github.com/gpuscaler/gpuscaler/internal/natstest"
	pb "github.com/gpuscaler/gpuscaler/proto/externalscaler"
	gpuscalerv1 "github.com/gpuscaler/gpuscaler/proto/gpuscaler/v1"
	"github.com/gpuscaler/gpuscaler/scaler/scalertest"
	"github.com/gpuscaler/gpuscaler/test/testkit"
)

// The sources, the attributors and the pod directories keep the collector's contracts
// without importing it.
var (
	_ Source         = (*dcgm.Source)(nil)
	_ PodUsageSource = (*nvml.Source)(nil)
	_ Source         = (*exporter.Source)(nil)
	_ PodUsageSource = (*sim.Node)(nil)
	_ Attributor     = (*kubelet.PodResources)(nil)
	_ Attributor     = (*sim.Node)(nil)
	_ PodDirectory   = (*kube.PodDirectory)(nil)
	_ PodDirectory   = (*sim.Node)(nil)
)

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

// simNode is a simulated node: two llm pods in ml on GPUs 0–2, a pod of another
// namespace with the same labels on GPU 3, GPU 7 in MIG mode with one of its three
// slices held, GPUs 4–6 free.
func simNode() sim.Config {
	return sim.Config{
		GPUs: 8,
		MIG:  map[int][]string{7: {"1g.10gb", "1g.10gb", "3g.40gb"}},
		Pods: []sim.Pod{
			{Namespace: "ml", Name: "llm-0", Labels: map[string]string{"app": "llm"}, OwnerKind: "Deployment", OwnerName: "llm", GPUs: []string{"0", "1"}, Util: new(80.0)},
			{Namespace: "ml", Name: "llm-1", Labels: map[string]string{"app": "llm"}, OwnerKind: "Deployment", OwnerName: "llm", GPUs: []string{"2"}, Util: new(40.0)},
			{Namespace: "other", Name: "llm-0", Labels: map[string]string{"app": "llm"}, GPUs: []string{"3"}, Util: new(100.0)},
			{Namespace: "ml", Name: "tiny-0", Labels: map[string]string{"app": "tiny"}, GPUs: []string{"7/0"}, Util: new(30.0)},
		},
		Seed: 1,
	}
}

// runCollector starts a collector for node on nc and stops it at cleanup.
func runCollector(t *testing.T, cfg Config, src Source, attrib Attributor, pods PodDirectory, nc *nats.Conn) (*Collector, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	c, err := New(cfg, src, attrib, pods, nc, testkit.Logger(t), reg)
	if err != nil {
		t.Fatal(err)
	}
	testkit.Start(t, "collector", 0, nil, c.Run)
	return c, reg
}

// TestSimThroughScaler runs a simulated node's collector into a real scaler: the
// podSelector trigger of namespace ml sees exactly its pods' GPUs, and a capacity trigger
// counts the devices the node leaves free.
func TestSimThroughScaler(t *testing.T) {
	ns := natstest.Start(t, "", "")
	_, client := scalertest.Start(t, ns.ClientURL())
	simulated, err := sim.New("gpu-node-1", simNode())
	if err != nil {
		t.Fatal(err)
	}
	runCollector(t, Config{Node: "gpu-node-1", Interval: 50 * time.Millisecond, CollectorID: "test"},
		simulated, simulated, simulated, natstest.Connect(t, ns.ClientURL()).Conn)

	metric := func(md map[string]string, name string) (float64, error) {
		md["scalerAddress"] = "gpuscaler:9090"
		resp, err := client.GetMetrics(t.Context(), &pb.GetMetricsRequest{
			ScaledObjectRef: &pb.ScaledObjectRef{Name: "so", Namespace: "ml", ScalerMetadata: md}, MetricName: name})
		if err != nil {
			return 0, err
		}
		return resp.GetMetricValues()[0].GetMetricValueFloat(), nil
	}
	// llm-0 holds GPUs 0 and 1 at 80%, llm-1 GPU 2 at 40%; other/llm-0 is not ml's. Three
	// GPUs over two pods is 1.5 per replica: (80+80+40)/1.5.
	testkit.Eventually(t, 5*time.Second, func() bool {
		v, err := metric(map[string]string{"podSelector": "app=llm", "gpuUtilTarget": "60"}, "gpu-util")
		return err == nil && math.Abs(v-200/1.5) < 1e-9
	})
	// Free: whole GPUs 4, 5 and 6, and one 1g.10gb slice (7/1); 7/2 is a 3g.40gb.
	if _, err := client.GetMetrics(t.Context(), &pb.GetMetricsRequest{}); err == nil {
		t.Fatal("GetMetrics without a ref succeeded")
	}
	pubQueue(t, ns.ClientURL(), "ml", "train", 50)
	for profile, want := range map[string]float64{"1": 3, "2": 1, "1g.10gb": 1, "3g.40gb": 1, "7g.80gb": 0} {
		testkit.Eventually(t, 5*time.Second, func() bool {
			v, err := metric(map[string]string{"queue": "train", "capacityAware": "true", "gpusPerReplica": profile}, "queue-backlog")
			return err == nil && v == want
		})
	}
}

// TestDrainedNodeLeavesCapacity runs a simulated node's collector into a real scaler:
// the node is drained (kubectl drain cordons it, k8s.io/kubectl pkg/drain/cordon.go,
// then evicts its pods, freeing its GPUs), and its 8 free GPUs, which the scheduler will
// place no Job on, leave the capacity a ScaledJob counts, rather than make 8 Jobs that
// stay Pending. A Job that tolerates the cordon still counts them.
func TestDrainedNodeLeavesCapacity(t *testing.T) {
	ns := natstest.Start(t, "", "")
	_, client := scalertest.Start(t, ns.ClientURL())
	simulated, err := sim.New("gpu-a", sim.Config{GPUs: 8, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	runCollector(t, Config{Node: "gpu-a", Interval: 20 * time.Millisecond, CollectorID: "test", NodeScheduling: simulated.Scheduling},
		simulated, simulated, simulated, natstest.Connect(t, ns.ClientURL()).Conn)
	pubQueue(t, ns.ClientURL(), "ml", "train", 50)
	backlog := func(md map[string]string) float64 {
		md["queue"], md["capacityAware"], md["gpusPerReplica"], md["scalerAddress"] = "train", "true", "1", "gpuscaler:9090"
		resp, err := client.GetMetrics(t.Context(), &pb.GetMetricsRequest{
			ScaledObjectRef: &pb.ScaledObjectRef{Name: "train", Namespace: "ml", ScalerMetadata: md}, MetricName: "queue-backlog"})
		if err != nil {
			return -1
		}
		return resp.GetMetricValues()[0].GetMetricValueFloat()
	}
	testkit.Eventually(t, 5*time.Second, func() bool { return backlog(map[string]string{}) == 8 })

	if err := simulated.SetConfig(sim.Config{GPUs: 8, Seed: 1, Unschedulable: true}); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 5*time.Second, func() bool { return backlog(map[string]string{}) == 0 })
	if got := backlog(map[string]string{"tolerations": "node.kubernetes.io/unschedulable:NoSchedule"}); got != 8 {
		t.Fatalf("a Job tolerating the cordon: backlog capped at %v, want 8", got)
	}

	// Uncordoned, but the cluster autoscaler is removing it.
	if err := simulated.SetConfig(sim.Config{GPUs: 8, Seed: 1, Taints: []sim.Taint{{Key: "ToBeDeletedByClusterAutoscaler", Value: "1732700000", Effect: "NoSchedule"}}}); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 5*time.Second, func() bool {
		return backlog(map[string]string{}) == 0 && backlog(map[string]string{"tolerations": "node.kubernetes.io/unschedulable:NoSchedule"}) == 0
	})
}

// TestCPUAndMemoryLimitCapacity runs a simulated node's collector into a real scaler:
// the node has 8 free GPUs, but its pods leave CPU for 2 Jobs of 16 CPUs and memory for 3
// of 200Gi, so a ScaledJob whose Jobs ask that counts 2 (then 3 once the CPU frees), where
// counting GPUs alone would make 8 Jobs, 6 of them Pending (Insufficient cpu). A trigger
// without the keys counts the GPUs, as before; so does every trigger while the node does
// not report its CPU and memory.
func TestCPUAndMemoryLimitCapacity(t *testing.T) {
	ns := natstest.Start(t, "", "")
	_, client := scalertest.Start(t, ns.ClientURL())
	res := &sim.Resources{CPU: "96", Memory: "1Ti", CPURequested: "60", MemoryRequested: "400Gi"}
	simulated, err := sim.New("gpu-a", sim.Config{GPUs: 8, Seed: 1, Resources: res})
	if err != nil {
		t.Fatal(err)
	}
	runCollector(t, Config{Node: "gpu-a", Interval: 20 * time.Millisecond, CollectorID: "test", NodeScheduling: simulated.Scheduling, NodeResources: simulated.Resources},
		simulated, simulated, simulated, natstest.Connect(t, ns.ClientURL()).Conn)
	pubQueue(t, ns.ClientURL(), "ml", "train", 50)
	backlog := func(md map[string]string) float64 {
		md["queue"], md["capacityAware"], md["gpusPerReplica"], md["scalerAddress"] = "train", "true", "1", "gpuscaler:9090"
		resp, err := client.GetMetrics(t.Context(), &pb.GetMetricsRequest{
			ScaledObjectRef: &pb.ScaledObjectRef{Name: "train", Namespace: "ml", ScalerMetadata: md}, MetricName: "queue-backlog"})
		if err != nil {
			return -1
		}
		return resp.GetMetricValues()[0].GetMetricValueFloat()
	}
	job := func() map[string]string { return map[string]string{"cpuPerReplica": "16", "memoryPerReplica": "200Gi"} }
	testkit.Eventually(t, 5*time.Second, func() bool { return backlog(job()) == 2 })
	if got := backlog(map[string]string{}); got != 8 {
		t.Fatalf("without cpuPerReplica and memoryPerReplica: backlog capped at %v, want 8 (GPUs alone)", got)
	}
	if got := backlog(map[string]string{"memoryPerReplica": "200Gi"}); got != 3 {
		t.Fatalf("memoryPerReplica alone: backlog capped at %v, want 3", got)
	}

	res = &sim.Resources{CPU: "96", Memory: "1Ti", CPURequested: "10", MemoryRequested: "400Gi"}
	if err := simulated.SetConfig(sim.Config{GPUs: 8, Seed: 1, Resources: res}); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 5*time.Second, func() bool { return backlog(job()) == 3 })

	// A node that does not report its CPU and memory counts on its GPUs alone.
	if err := simulated.SetConfig(sim.Config{GPUs: 8, Seed: 1}); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 5*time.Second, func() bool { return backlog(job()) == 8 })
}

func pubQueue(t *testing.T, url, ns, q string, waiting uint64) {
	t.Helper()
	nc := natstest.Connect(t, url)
	subject, _ := gpuscalerv1.QueueSubject(ns, q, "p")
	data, _ := (&gpuscalerv1.QueueReport{Namespace: ns, Queue: q, ProducerId: "p", Waiting: waiting}).MarshalVT()
	if err := nc.Publish(subject, data); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
}

// subscribeReports collects the NodeReports published for node.
func subscribeReports(t *testing.T, url, node string) func() []*gpuscalerv1.NodeReport {
	t.Helper()
	var (
		mu   sync.Mutex
		seen []*gpuscalerv1.NodeReport
	)
	subject, _ := gpuscalerv1.NodeSubject(node)
	nc := natstest.Connect(t, url)
	sub, err := nc.Subscribe(subject, func(m *nats.Msg) {
		ev, err := gpuscalerv1.Decode(m.Subject, m.Data)
		if err != nil {
			t.Errorf("collector published a malformed report: %v", err)
			return
		}
		mu.Lock()
		seen = append(seen, ev.Node)
		mu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return func() []*gpuscalerv1.NodeReport {
		mu.Lock()
		defer mu.Unlock()
		return append([]*gpuscalerv1.NodeReport(nil), seen...)
	}
}

// TestCollectorKeepsOnlyTheNewestWhileDisconnected: reports made while NATS is down are
// not queued up; the newest is published when it is back.
func TestCollectorKeepsOnlyTheNewestWhileDisconnected(t *testing.T) {
	addr, dir := testkit.FreeAddr(t), t.TempDir()
	ns := natstest.Start(t, addr, dir)
	simulated, _ := sim.New("n1", sim.Config{GPUs: 1})
	c, _ := runCollector(t, Config{Node: "n1", Interval: 20 * time.Millisecond}, simulated, simulated, simulated, natstest.Connect(t, ns.ClientURL()).Conn)
	reports := subscribeReports(t, ns.ClientURL(), "n1")
	testkit.Eventually(t, 5*time.Second, func() bool { return len(reports()) > 0 })

	ns.Shutdown()
	testkit.Eventually(t, 5*time.Second, func() bool { return c.Ready() != nil })
	ns = natstest.Start(t, addr, dir)
	reports = subscribeReports(t, ns.ClientURL(), "n1")
	testkit.Eventually(t, 10*time.Second, func() bool { return len(reports()) >= 3 })
	got := reports()
	for i := 1; i < len(got); i++ {
		if got[i].GetSequence() <= got[i-1].GetSequence() {
			t.Fatalf("reports out of order after the reconnect: %d then %d", got[i-1].GetSequence(), got[i].GetSequence())
		}
	}
	// At 20 ms a report, the outage left dozens behind; only the newest of them may arrive.
	if gap := got[1].GetSequence() - got[0].GetSequence(); gap != 1 {
		t.Fatalf("after the reconnect, sequences %d then %d: want consecutive, one report held, not a replayed backlog", got[0].GetSequence(), got[1].GetSequence())
	}
	testkit.Eventually(t, 5*time.Second, func() bool { return c.Ready() == nil })
}

// brokenAttributor fails, as a kubelet without the pod-resources socket would.
type brokenAttributor struct{}

func (brokenAttributor) Allocation(context.Context) (*Allocation, error) {
	return nil, errors.New("pod-resources socket missing")
}

// podsOf is a PodDirectory over a fixed set of pods.
type podsOf map[string]PodInfo

func (p podsOf) Pod(ns, name string) (PodInfo, bool) { i, ok := p[ns+"/"+name]; return i, ok }

// exporterLike is a Source that knows its pods' names, as dcgm-exporter does.
type exporterLike struct{}

func (exporterLike) Name() string { return "exporter" }
func (exporterLike) Close() error { return nil }
func (exporterLike) Collect(context.Context) ([]*gpuscalerv1.GPUSample, error) {
	return []*gpuscalerv1.GPUSample{
		{Uuid: "GPU-1", Pod: &gpuscalerv1.PodRef{Namespace: "ml", Name: "llm-0", Container: "main"}},
		{Uuid: "GPU-2"},
	}, nil
}

// TestAttributionFallsBackToTheSource: without the kubelet, the source's own pod names
// stand, labels and owners still come from the pod directory, and the problem is logged
// and counted.
func TestAttributionFallsBackToTheSource(t *testing.T) {
	ns := natstest.Start(t, "", "")
	pods := podsOf{"ml/llm-0": {UID: "u-1", Labels: map[string]string{"app": "llm"}, OwnerKind: "Deployment", OwnerName: "llm"}}
	reg := prometheus.NewRegistry()
	c, err := New(Config{Node: "n1"}, exporterLike{}, brokenAttributor{}, pods, natstest.Connect(t, ns.ClientURL()).Conn, testkit.Logger(t), reg)
	if err != nil {
		t.Fatal(err)
	}
	r, err := c.Report(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	p := r.GetGpus()[0].GetPod()
	if p.GetName() != "llm-0" || p.GetLabels()["app"] != "llm" || p.GetOwnerKind() != "Deployment" || p.GetUid() != "u-1" {
		t.Fatalf("pod of GPU-1: %v", p)
	}
	if r.GetGpus()[1].GetPod() != nil || len(r.GetAllocatable()) != 0 {
		t.Fatalf("report: %v", r)
	}
	want := `
# HELP gpuscaler_collector_errors_total Failures by source and stage (source, attribution, invalid, publish).
# TYPE gpuscaler_collector_errors_total counter
gpuscaler_collector_errors_total{source="exporter",stage="attribution"} 1
gpuscaler_collector_errors_total{source="exporter",stage="invalid"} 0
gpuscaler_collector_errors_total{source="exporter",stage="publish"} 0
gpuscaler_collector_errors_total{source="exporter",stage="source"} 0
`
	if err := testutil.CollectAndCompare(reg, strings.NewReader(want), "gpuscaler_collector_errors_total"); err != nil {
		t.Fatal(err)
	}
}

func TestNewRejectsBadNode(t *testing.T) {
	ns := natstest.Start(t, "", "")
	simulated, _ := sim.New("n", sim.Config{GPUs: 1})
	if _, err := New(Config{Node: "Bad_Node"}, simulated, nil, nil, natstest.Connect(t, ns.ClientURL()).Conn, nil, prometheus.NewRegistry()); err == nil {
		t.Fatal("New with node Bad_Node succeeded")
	}
}

// partialKubelet knows GPU-2 only, and says pod ml/other holds it.
type partialKubelet struct{}

func (partialKubelet) Allocation(context.Context) (*Allocation, error) {
	d := &gpuscalerv1.Device{Id: "GPU-2", Resource: "nvidia.com/gpu"}
	return &Allocation{
		Allocatable: []*gpuscalerv1.Device{d},
		Allocated:   []*gpuscalerv1.Device{d},
		Holders:     map[string][]Holder{"GPU-2": {{Namespace: "ml", Pod: "other", Container: "c"}}},
	}, nil
}

// TestKubeletWinsForTheDevicesItKnows: the kubelet's holder replaces the source's for a
// device it knows; a device it does not know keeps the source's pod.
func TestKubeletWinsForTheDevicesItKnows(t *testing.T) {
	ns := natstest.Start(t, "", "")
	c, err := New(Config{Node: "n1"}, exporterLike{}, partialKubelet{}, nil, natstest.Connect(t, ns.ClientURL()).Conn, nil, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	r, err := c.Report(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if p := r.GetGpus()[0].GetPod(); p.GetName() != "llm-0" {
		t.Errorf("GPU-1, unknown to the kubelet: pod %v, want the source's llm-0", p)
	}
	if p := r.GetGpus()[1].GetPod(); p.GetName() != "other" || p.GetContainer() != "c" {
		t.Errorf("GPU-2, held per the kubelet: pod %v, want ml/other", p)
	}
}
