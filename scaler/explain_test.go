package scaler

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/gpuscaler/gpuscaler/internal/natstest"
	pb "github.com/gpuscaler/gpuscaler/proto/externalscaler"
	gpuscalerv1 "github.com/gpuscaler/gpuscaler/proto/gpuscaler/v1"
	"github.com/gpuscaler/gpuscaler/test/testkit"
)

// TestExplainAgreesWithKEDAsCalls asks a running scaler, over gRPC, what KEDA's own calls
// answer for a set of triggers and what Explain says they answer: the two must agree,
// value for value and error code for error code, as Explain claims to read through the
// same code. It then checks what Explain says the answers came from.
func TestExplainAgreesWithKEDAsCalls(t *testing.T) {
	ns := natstest.Start(t, "", "")
	s := startScaler(t, ns.ClientURL(), Config{})
	pub := newPublisher(t, ns.ClientURL())
	other := map[string]string{"app": "other"}
	pub.node(&gpuscalerv1.NodeReport{Node: "n2", Source: "sim", Gpus: []*gpuscalerv1.GPUSample{
		gpu("GPU-A", "ml", "llm-0", llm, 80, 40, 80),
		sharedGPU("GPU-B", 60, podRef("ml", "llm-1", llm), podRef("ml", "other-0", other)),
		gpu("GPU-C", "", "", nil, 0, 0, 80), // free
	}})
	pub.node(&gpuscalerv1.NodeReport{Node: "n1", Source: "sim", Gpus: []*gpuscalerv1.GPUSample{gpu("GPU-D", "ml", "llm-2", llm, 90, 60, 80)}})
	pub.node(&gpuscalerv1.NodeReport{Node: "n3", Source: "sim", Gpus: []*gpuscalerv1.GPUSample{gpu("GPU-E", "web", "llm-0", llm, 10, 10, 80)}})
	pub.queue("ml", "jobs", 7, 2)
	explainer := gpuscalerv1.NewExplainerClient(s.conn)
	testkit.Eventually(t, 5*time.Second, func() bool { return s.State().Applied() == 4 })

	triggers := map[string]map[string]string{
		"queue":                 {"queue": "jobs", "queueTarget": "4"},
		"queue demand":          {"queue": "jobs", "targetWait": "30s", "concurrency": "2"},
		"gpus":                  {"podSelector": "app=llm", "gpuUtilTarget": "70", "gpuMemoryTarget": "50"},
		"queue and gpus":        {"queue": "jobs", "podSelector": "app=llm", "gpuUtilTarget": "70"},
		"queue never reported":  {"queue": "nothing"},
		"selector matches none": {"podSelector": "app=nothing", "gpuUtilTarget": "70"},
		"invalid metadata":      {"queue": "jobs", "gpusPerReplica": "2"},
	}
	explained := map[string]*gpuscalerv1.Explanation{}
	for name, md := range triggers {
		t.Run(name, func(t *testing.T) {
			r := ref("ml", "svc", md)
			ex, err := explainer.Explain(t.Context(), &gpuscalerv1.ExplainRequest{Namespace: r.Namespace, Name: r.Name, Metadata: r.ScalerMetadata})
			if err != nil {
				t.Fatalf("Explain: %v; want an explanation, whatever the trigger", err)
			}
			explained[name] = ex
			active, err := s.client.IsActive(t.Context(), r)
			if got, want := ex.GetAnswer().GetErrorCode(), codeName(err); got != want || ex.GetAnswer().GetActive() != active.GetResult() {
				t.Fatalf("Explain says active=%v code=%s; IsActive says %v, %v", ex.GetAnswer().GetActive(), got, active.GetResult(), err)
			}
			if err != nil && ex.GetAnswer().GetError() != status.Convert(err).Message() {
				t.Fatalf("Explain's error %q, IsActive's %q", ex.GetAnswer().GetError(), status.Convert(err).Message())
			}
			spec, err := s.client.GetMetricSpec(t.Context(), r)
			if len(ex.GetAnswer().GetMetrics()) != len(spec.GetMetricSpecs()) {
				t.Fatalf("Explain gives %d metrics, GetMetricSpec %d (%v)", len(ex.GetAnswer().GetMetrics()), len(spec.GetMetricSpecs()), err)
			}
			for i, m := range spec.GetMetricSpecs() {
				got := ex.GetAnswer().GetMetrics()[i]
				resp, err := s.client.GetMetrics(t.Context(), &pb.GetMetricsRequest{ScaledObjectRef: r, MetricName: m.GetMetricName()})
				var value float64
				if err == nil {
					value = resp.GetMetricValues()[0].GetMetricValueFloat()
				}
				if got.GetName() != m.GetMetricName() || got.GetTarget() != m.GetTargetSizeFloat() ||
					got.GetErrorCode() != codeName(err) || got.GetValue() != value {
					t.Fatalf("Explain's metric %v; GetMetricSpec %v, GetMetrics %v, %v", got, m, resp, err)
				}
			}
		})
	}

	// The queue: its report, and why it activates.
	q := explained["queue"]
	if got := q.GetQueue(); got.GetWaiting() != 7 || got.GetInFlight() != 2 || got.GetBacklog() != 9 || got.GetStale() || got.GetStored() == nil {
		t.Errorf("queue = %v, want 7 waiting, 2 in flight, fresh", got)
	}
	wantReason(t, q, "backlog 9 is above activationQueueDepth 0", "queue-backlog is 9 against a target of 4 per replica: on its own it asks the HPA for 3 replicas")
	if q.GetEffective()[KeyQueueTarget] != "4" || q.GetEffective()[KeyStaleAfter] != "30s" {
		t.Errorf("effective = %v, want queueTarget 4 and the default staleAfter 30s", q.GetEffective())
	}

	// queue-demand: one report, so no item seen to finish: the backlog over the
	// concurrency, and the activation still on the backlog.
	qd := explained["queue demand"]
	wantReason(t, qd, "backlog 9 is above activationQueueDepth 0", "queue-demand 4.5: no item has been seen to finish", "queue-demand is 4.5 against a target of 1 per replica")
	if e := qd.GetEffective(); e[KeyTargetWait] != "30s" || e[KeyConcurrency] != "2" || e[KeyQueueTarget] != "" {
		t.Errorf("effective = %v, want targetWait 30s, concurrency 2 and no queueTarget", e)
	}

	// The GPUs: the nodes holding the selected pods, by name, each with those GPUs only.
	g := explained["gpus"]
	var got []string
	for _, n := range g.GetNodes() {
		if n.GetStale() || n.GetAge() == nil || n.GetSource() != "sim" {
			t.Errorf("node %s: stale %v, age %v, source %q; want fresh, aged, sim", n.GetNode(), n.GetStale(), n.GetAge(), n.GetSource())
		}
		for _, d := range n.GetGpus() {
			for _, h := range d.GetHolds() {
				got = append(got, n.GetNode()+"/"+d.GetDevice()+"/"+h.GetPod()+"/"+num(h.GetShare())+"/"+num(h.GetUtil()))
			}
		}
	}
	// GPU-B is shared with a pod of another workload: the explanation shows this
	// workload's half, at half the device's 60%, as the sum counts it.
	want := []string{"n1/GPU-D/llm-2/1/90", "n2/GPU-A/llm-0/1/80", "n2/GPU-B/llm-1/0.5/30"}
	if !slices.Equal(got, want) {
		t.Errorf("holds = %v, want %v (GPU-C free, other-0 not selected, n3 another namespace)", got, want)
	}
	if n := g.GetNamespaceGpuPods(); n != 4 {
		t.Errorf("namespace GPU pods = %d, want 4 (llm-0, llm-1, llm-2, other-0)", n)
	}

	wantReason(t, explained["selector matches none"], `podSelector "app=nothing" selects none of the 4 pods holding GPUs in namespace ml`)
	if n := explained["selector matches none"].GetNodes(); len(n) != 0 {
		t.Errorf("nodes = %v, want none", n)
	}
	inv := explained["invalid metadata"]
	if inv.GetAnswer().GetErrorCode() != codes.InvalidArgument.String() || !strings.Contains(inv.GetAnswer().GetError(), "gpusPerReplica") || len(inv.GetEffective()) != 0 {
		t.Errorf("invalid metadata: answer %v, effective %v; want InvalidArgument naming gpusPerReplica, nothing effective", inv.GetAnswer(), inv.GetEffective())
	}
	if q := explained["queue never reported"]; q.GetAnswer().GetErrorCode() != codes.Unavailable.String() || q.GetQueue().GetStored() != nil {
		t.Errorf("queue never reported: answer %v, queue %v; want Unavailable and no report", q.GetAnswer(), q.GetQueue())
	}
}

func codeName(err error) string {
	if err == nil {
		return ""
	}
	return status.Code(err).String()
}

func wantReason(t *testing.T, ex *gpuscalerv1.Explanation, parts ...string) {
	t.Helper()
	all := strings.Join(ex.GetReasons(), "\n")
	for _, p := range parts {
		if !strings.Contains(all, p) {
			t.Errorf("reasons do not say %q:\n%s", p, all)
		}
	}
}

// TestExplainCapacity checks what Explain says a capacityAware trigger counts, node by
// node, against what the trigger's read answers.
func TestExplainCapacity(t *testing.T) {
	clock := newFakeClock(t0)
	s := NewState(clock.Now)
	a100 := map[string]string{"pool": "a100"}
	s.Apply(capacityNode("a1", a100, 8, 3, nil, false), t0)                              // 5 free: 2 replicas of 2
	s.Apply(capacityNode("a2", a100, 8, 7, nil, false), t0)                              // 1 free: none
	s.Apply(capacityNode("h1", map[string]string{"pool": "h100"}, 8, 0, nil, false), t0) // another pool
	s.Apply(capacityNode("a3", a100, 8, 0, nil, false), t0.Add(-time.Minute))            // silent: full
	s.Apply(queueEvent("ml", "train", 50, 2), t0)
	srv := readyServer(s)
	md := map[string]string{"queue": "train", "capacityAware": "true", "gpusPerReplica": "2", "nodeSelector": "pool=a100", "queueTarget": "1"}
	ex, err := srv.Explain(t.Context(), &gpuscalerv1.ExplainRequest{Namespace: "ml", Name: "train", Metadata: md})
	if err != nil {
		t.Fatal(err)
	}
	c := ex.GetCapacity()
	var nodes []string
	for _, n := range c.GetNodes() {
		nodes = append(nodes, n.GetNode()+":"+itoa(int(n.GetFree()))+"/"+itoa(int(n.GetSlots())))
		if n.GetStale() != (n.GetNode() == "a3") {
			t.Errorf("node %s stale = %v", n.GetNode(), n.GetStale())
		}
	}
	if want := []string{"a1:5/2", "a2:1/0", "a3:8/0"}; !slices.Equal(nodes, want) {
		t.Errorf("capacity nodes (free/slots) = %v, want %v", nodes, want)
	}
	v, err := srv.read(mustTrigger(t, "ml", md)).Metric(MetricQueueBacklog)
	if err != nil {
		t.Fatal(err)
	}
	// 2 running plus 2 replicas' worth: 4 items of the 52.
	if c.GetSlots() != 2 || c.GetBacklog() != 52 || c.GetCapped() != v || v != 4 || ex.GetAnswer().GetMetrics()[0].GetValue() != v {
		t.Errorf("capacity = %v, answer %v; want 2 slots, backlog 52 capped at the read's %v (4)", c, ex.GetAnswer(), v)
	}
	wantReason(t, ex, "capacityAware capped the backlog from 52 to 4 items: 2 Jobs running (the 2 items in flight over queueTarget 1, rounded up), plus the 2 more")
	wantReason(t, ex, "Without podSelector, a Job that holds its GPUs without an item")
	wantReason(t, ex, "minReplicaCount 0 must be the ScaledJob's spec.minReplicaCount")
	if c.GetRunningJobs() != 2 || c.GetJobsFromPods() || c.GetMinReplicaCount() != 0 {
		t.Errorf("capacity = %v, want 2 running Jobs counted from the items in flight, minReplicaCount 0", c)
	}

	// Every node silent: capacity is unknown, so KEDA gets Unavailable, and the
	// explanation shows no cap at 0 items, which would read as a silent zero.
	clock.Advance(time.Minute)
	s.Apply(queueEvent("ml", "train", 50, 2), t0.Add(time.Minute))
	ex, _ = srv.Explain(t.Context(), &gpuscalerv1.ExplainRequest{Namespace: "ml", Metadata: md})
	if m := ex.GetAnswer().GetMetrics()[0]; m.GetErrorCode() != codes.Unavailable.String() || !strings.Contains(m.GetError(), "capacity unknown") {
		t.Errorf("capacity unknown: metric %v, want Unavailable saying so", m)
	}
	if c := ex.GetCapacity(); c.GetBacklog() != 0 || c.GetCapped() != 0 || strings.Contains(strings.Join(ex.GetReasons(), "\n"), "capped the backlog") {
		t.Errorf("capacity unknown: capacity %v, reasons %q; want no cap shown", c, ex.GetReasons())
	}

	// Not ready: what KEDA gets then, and nothing read.
	srv.ready = make(chan struct{})
	ex, _ = srv.Explain(t.Context(), &gpuscalerv1.ExplainRequest{Namespace: "ml", Metadata: md})
	if ex.GetReady() || ex.GetAnswer().GetErrorCode() != codes.Unavailable.String() || ex.GetAnswer().GetMetrics()[0].GetErrorCode() != codes.Unavailable.String() {
		t.Errorf("not ready: %v, want Unavailable throughout", ex)
	}
	if sel, pools := s.Aggregates(); sel != 0 || pools != 1 {
		t.Errorf("aggregates = %d selections, %d pools; want the one pool a KEDA read of this trigger makes", sel, pools)
	}
}

// TestExplainCapacityJobsFromPods: with podSelector, Explain says the running Jobs are
// the selected pods holding devices, and does not suggest podSelector.
func TestExplainCapacityJobsFromPods(t *testing.T) {
	s := NewState(newFakeClock(t0).Now)
	// 3 Jobs hold GPUs on a1 (one item in flight), others 3, 2 free; a2 has 1 free.
	a1 := jobsNode("a1", []string{"trainer-0", "trainer-1", "trainer-2"}, 3)
	a1.Node.NodeLabels = map[string]string{"pool": "a100"}
	s.Apply(a1, t0)
	s.Apply(capacityNode("a2", map[string]string{"pool": "a100"}, 8, 7, nil, false), t0)
	s.Apply(queueEvent("ml", "train", 50, 1), t0)
	md := map[string]string{"queue": "train", "capacityAware": "true", "gpusPerReplica": "1", "podSelector": "scaledjob.keda.sh/name=trainer",
		"minReplicaCount": "1", "nodeSelector": "pool=a100"}
	ex, err := readyServer(s).Explain(t.Context(), &gpuscalerv1.ExplainRequest{Namespace: "ml", Name: "trainer", Metadata: md})
	if err != nil {
		t.Fatal(err)
	}
	// 3 running + 3 free - 1 standby = 5 Jobs of 1 item; 51 - 1 standby item capped at 5.
	if c := ex.GetCapacity(); c.GetRunningJobs() != 3 || !c.GetJobsFromPods() || c.GetMinReplicaCount() != 1 || c.GetSlots() != 3 || c.GetCapped() != 5 {
		t.Errorf("capacity = %v, want 3 running Jobs from pods, 3 slots, minReplicaCount 1, capped at 5", c)
	}
	wantReason(t, ex, `capped the backlog from 51 to 5 items: 3 Jobs running (the pods podSelector "scaledjob.keda.sh/name=trainer" selects that hold devices), plus the 3 more`)
	wantReason(t, ex, "minReplicaCount 1 must be the ScaledJob's")
	if strings.Contains(strings.Join(ex.GetReasons(), "\n"), "Without podSelector") {
		t.Errorf("reasons %q: the Jobs are counted from their pods", ex.GetReasons())
	}
	if ex.GetEffective()[KeyMinReplicaCount] != "1" {
		t.Errorf("effective = %v, want minReplicaCount 1", ex.GetEffective())
	}
}

// TestExplainUnplaceable: explain names the nodes whose free GPUs capacity left out, and
// why (see TestCapacitySchedulable), and those whose collector did not say.
func TestExplainUnplaceable(t *testing.T) {
	s := NewState(newFakeClock(t0).Now)
	s.Apply(scheduled(capacityNode("gpu-a", nil, 4, 1, nil, false), false), t0)
	s.Apply(scheduled(capacityNode("gpu-b", nil, 8, 0, nil, false), true), t0)
	s.Apply(scheduled(capacityNode("gpu-c", nil, 8, 2, nil, false), false, "ToBeDeletedByClusterAutoscaler=1732700000:NoSchedule"), t0)
	s.Apply(scheduled(capacityNode("gpu-d", nil, 8, 8, nil, false), true), t0) // cordoned, but nothing free to leave out
	s.Apply(capacityNode("gpu-e", nil, 2, 0, nil, false), t0)                  // a collector that did not say
	s.Apply(queueEvent("ml", "train", 50, 0), t0)
	md := map[string]string{"queue": "train", "capacityAware": "true", "gpusPerReplica": "1", "tolerations": "dedicated=ml:NoSchedule"}
	ex, err := readyServer(s).Explain(t.Context(), &gpuscalerv1.ExplainRequest{Namespace: "ml", Metadata: md})
	if err != nil {
		t.Fatal(err)
	}
	var nodes []string
	for _, n := range ex.GetCapacity().GetNodes() {
		nodes = append(nodes, fmt.Sprintf("%s:%d/%d %q unknown=%v", n.GetNode(), n.GetFree(), n.GetSlots(), n.GetUnplaceable(), n.GetSchedulingUnknown()))
	}
	want := []string{
		`gpu-a:3/3 "" unknown=false`,
		`gpu-b:8/0 "cordoned" unknown=false`,
		`gpu-c:6/0 "tainted ToBeDeletedByClusterAutoscaler=1732700000:NoSchedule" unknown=false`,
		`gpu-d:0/0 "cordoned" unknown=false`,
		`gpu-e:2/2 "" unknown=true`,
	}
	if !slices.Equal(nodes, want) {
		t.Errorf("capacity nodes:\ngot  %q\nwant %q", nodes, want)
	}
	if got := ex.GetEffective()[KeyTolerations]; got != "dedicated=ml:NoSchedule" {
		t.Errorf("metadata tolerations = %q, want the trigger's", got)
	}
	wantReason(t, ex,
		"gpu-b: cordoned, 8 free GPUs not counted; gpu-c: tainted ToBeDeletedByClusterAutoscaler=1732700000:NoSchedule, 6 free GPUs not counted.",
		"the collector did not report whether the node is cordoned or tainted (no API access to its Node, or a collector older than this scaler): gpu-e: 2 free GPUs counted.",
		"capacityAware capped the backlog from 50 to 5 items")
	if all := strings.Join(ex.GetReasons(), "\n"); strings.Contains(all, "gpu-d") {
		t.Errorf("reasons name gpu-d, which has no free GPU to leave out:\n%s", all)
	}
}

// TestStateNodesAndQueues checks the whole picture the status page renders.
func TestStateNodesAndQueues(t *testing.T) {
	clock := newFakeClock(t0)
	s := NewState(clock.Now)
	report := &gpuscalerv1.NodeReport{Node: "n1", Source: "dcgm", NodeLabels: map[string]string{"pool": "h100"}, Gpus: []*gpuscalerv1.GPUSample{
		gpu("GPU-1", "ml", "llm-0", llm, 50, 40, 80),
		gpu("GPU-2", "", "", nil, 0, 0, 80),
		sharedGPU("GPU-3", 40, podRef("web", "b", nil), podRef("ml", "a", llm)),
	}, Unattributed: []*gpuscalerv1.UnattributedDevice{{Id: "MIG-9", Reason: "no such MIG device", Pod: podRef("ml", "x", nil)}}}
	report.Gpus[1].Unhealthy = "XID 79"
	s.Apply(gpuscalerv1.Event{Subject: gpuscalerv1.Subject{Kind: gpuscalerv1.KindNode, Node: "n1"}, Node: report}, t0)
	s.Apply(queueEvent("ml", "b", 1, 0), t0)
	s.Apply(queueEvent("ml", "a", 3, 1), t0.Add(-time.Second))
	clock.Advance(2 * time.Second)

	nodes := s.Nodes()
	if len(nodes) != 1 || len(nodes[0].GetGpus()) != 3 || nodes[0].GetGpuCount() != 3 || nodes[0].GetAge().AsDuration() != 2*time.Second ||
		nodes[0].GetLabels()["pool"] != "h100" {
		t.Fatalf("nodes = %v, want n1 with its 3 GPUs and its labels, 2s old", nodes)
	}
	g := nodes[0].GetGpus()
	if len(g[1].GetHolds()) != 0 || g[1].GetUnhealthy() != "XID 79" {
		t.Errorf("GPU-2 = %v, want free and unhealthy", g[1])
	}
	if h := g[2].GetHolds(); len(h) != 2 || h[0].GetNamespace() != "ml" || h[1].GetNamespace() != "web" || h[0].GetShare() != 0.5 {
		t.Errorf("GPU-3 holds = %v, want ml/a then web/b, half each", h)
	}
	if u := nodes[0].GetUnattributed(); len(u) != 1 || u[0].GetReason() != "no such MIG device" || u[0].GetPod() != "x" {
		t.Errorf("unattributed = %v", u)
	}
	queues := s.Queues(time.Minute)
	if len(queues) != 2 || queues[0].GetQueue() != "a" || queues[0].GetBacklog() != 4 || queues[0].GetAge().AsDuration() != 3*time.Second {
		t.Errorf("queues = %v, want ml/a (backlog 4, 3s old) then ml/b", queues)
	}
}

// TestExplainSeveralMetrics: the HPA takes the metric asking for the most replicas, and
// scales only up while one fails.
func TestExplainSeveralMetrics(t *testing.T) {
	clock := newFakeClock(t0)
	s := NewState(clock.Now)
	s.Apply(nodeEvent("n1", gpu("GPU-1", "ml", "llm-0", llm, 90, 40, 80), gpu("GPU-2", "ml", "llm-1", llm, 80, 40, 80)), t0)
	s.Apply(queueEvent("ml", "q", 3, 0), t0)
	srv := readyServer(s)
	md := map[string]string{"queue": "q", "queueTarget": "4", "podSelector": "app=llm", "gpuUtilTarget": "70"}
	ex, _ := srv.Explain(t.Context(), &gpuscalerv1.ExplainRequest{Namespace: "ml", Metadata: md})
	// 3/4 asks for 1 replica, 170/70 for 3.
	wantReason(t, ex, "With 2 metrics, the HPA of a ScaledObject takes the one that asks for the most replicas: 3.")

	clock.Advance(time.Minute) // both stale
	s.Apply(queueEvent("ml", "q", 3, 0), t0.Add(time.Minute))
	ex, _ = srv.Explain(t.Context(), &gpuscalerv1.ExplainRequest{Namespace: "ml", Metadata: md})
	wantReason(t, ex, "1 of 2 metrics fail: the HPA may still scale up on the others (to 1 here), but does not scale down while any fails")
}

// TestFirstNodes: a reason names at most 10 nodes, and counts the rest, so a cluster
// drained for an upgrade does not make a page of it.
func TestFirstNodes(t *testing.T) {
	var items []string
	for i := range 12 {
		items = append(items, fmt.Sprintf("gpu-%d: cordoned", i))
	}
	if got, want := firstNodes(items[:2]), "gpu-0: cordoned; gpu-1: cordoned"; got != want {
		t.Errorf("two nodes: got %q, want %q", got, want)
	}
	if got := firstNodes(items); !strings.HasSuffix(got, "gpu-9: cordoned; and 2 nodes more") || strings.Contains(got, "gpu-10") {
		t.Errorf("twelve nodes: got %q, want the first 10 and a count of the rest", got)
	}
}

// TestExplainCPUAndMemory: explain names the nodes whose free CPU or memory takes fewer
// Jobs than their free GPUs (see TestCapacityCPUAndMemory), and those counted on their
// GPUs alone because their collector did not report CPU and memory.
func TestExplainCPUAndMemory(t *testing.T) {
	s := NewState(newFakeClock(t0).Now)
	s.Apply(withResources(capacityNode("gpu-a", nil, 2, 0, nil, false), "64", "512Gi", "0", "0"), t0)
	s.Apply(withResources(capacityNode("gpu-b", nil, 4, 1, nil, false), "24", "512Gi", "8", "0"), t0)    // CPU for 1 of 3
	s.Apply(withResources(capacityNode("gpu-c", nil, 4, 0, nil, false), "24", "100Gi", "0", "50Gi"), t0) // CPU for 1, memory for 1, of 4
	s.Apply(withResources(capacityNode("gpu-d", nil, 4, 4, nil, false), "1", "1Gi", "1", "1Gi"), t0)     // no free GPU: nothing to say
	s.Apply(capacityNode("gpu-e", nil, 2, 0, nil, false), t0)                                            // a collector that did not say
	s.Apply(queueEvent("ml", "train", 50, 0), t0)
	md := map[string]string{"queue": "train", "capacityAware": "true", "gpusPerReplica": "1", "cpuPerReplica": "16", "memoryPerReplica": "40Gi"}
	ex, err := readyServer(s).Explain(t.Context(), &gpuscalerv1.ExplainRequest{Namespace: "ml", Metadata: md})
	if err != nil {
		t.Fatal(err)
	}
	var nodes []string
	for _, n := range ex.GetCapacity().GetNodes() {
		nodes = append(nodes, fmt.Sprintf("%s:%d/%d/%d %q unknown=%v", n.GetNode(), n.GetFree(), n.GetGpuSlots(), n.GetSlots(), n.GetLimitedBy(), n.GetResourcesUnknown()))
	}
	want := []string{
		`gpu-a:2/2/2 "" unknown=false`,
		`gpu-b:3/3/1 "CPU" unknown=false`,
		`gpu-c:4/4/1 "CPU and memory" unknown=false`,
		`gpu-d:0/0/0 "" unknown=false`,
		`gpu-e:2/2/2 "" unknown=true`,
	}
	if !slices.Equal(nodes, want) {
		t.Errorf("capacity nodes:\ngot  %q\nwant %q", nodes, want)
	}
	if got := ex.GetEffective()[KeyCPUPerReplica]; got != "16" {
		t.Errorf("metadata cpuPerReplica = %q, want the trigger's", got)
	}
	wantReason(t, ex,
		"gpu-b: CPU for 1 of 3 Jobs its free GPUs take; gpu-c: CPU and memory for 1 of 4 Jobs its free GPUs take.",
		"gpu-e: 2 free GPUs counted.",
		"capacityAware capped the backlog from 50 to 6 items")
	if all := strings.Join(ex.GetReasons(), "\n"); strings.Contains(all, "gpu-d") {
		t.Errorf("reasons name gpu-d, which has no free GPU to leave out:\n%s", all)
	}
}
