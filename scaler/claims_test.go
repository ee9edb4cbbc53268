package scaler

// A node is believed only of the pods the Kubernetes API places on it (claims.go): a
// compromised node can neither speak for another node's pods nor relabel them.

import (
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/protobuf/proto"

	"github.com/gpuscaler/gpuscaler/internal/natstest"
	gpuscalerv1 "github.com/gpuscaler/gpuscaler/proto/gpuscaler/v1"
	"github.com/gpuscaler/gpuscaler/test/testkit"
)

// apiPods is a PodDirectory of fixed pods, as the Kubernetes API would serve them
// (scaler/apipods keeps one from a real watch; its own tests hold it to client-go's
// fake clientset).
type apiPods struct {
	synced atomic.Bool
	mu     sync.Mutex
	pods   map[string]APIPod // by namespace/name
	// resources are the nodes' CPU and memory, by node name.
	resources map[string]*gpuscalerv1.NodeResources
}

func newAPIPods(synced bool) *apiPods {
	d := &apiPods{pods: map[string]APIPod{}}
	d.synced.Store(synced)
	return d
}

func (d *apiPods) put(ns, name, uid, node string, labels map[string]string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.pods[ns+"/"+name] = APIPod{UID: uid, Node: node, Labels: labels}
}

func (d *apiPods) Synced() bool { return d.synced.Load() }

func (d *apiPods) NodeResources(node string) (*gpuscalerv1.NodeResources, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	r, ok := d.resources[node]
	return r, ok
}

func (d *apiPods) Pod(ns, name string) (APIPod, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	p, ok := d.pods[ns+"/"+name]
	return p, ok
}

var serveLabels = map[string]string{"app": "serve"}

// clusterPods: namespace a's llm-0 runs on n1, namespace b's serve-0 and serve-1 on n2.
func clusterPods(synced bool) *apiPods {
	d := newAPIPods(synced)
	d.put("a", "llm-0", "uid-a0", "n1", llm)
	d.put("b", "serve-0", "uid-b0", "n2", serveLabels)
	d.put("b", "serve-1", "uid-b1", "n2", serveLabels)
	return d
}

// attack is what a compromised n1 reports: its own pod, then namespace b's pods (which
// run on n2) and a made-up one at 100%, and b's pods with their labels unknown. n2
// reports b's pods honestly at 30%.
func attack(s *State) {
	unknown := func(p *gpuscalerv1.PodRef) *gpuscalerv1.PodRef { p.Labels, p.LabelsUnknown = nil, true; return p }
	s.Apply(nodeEvent("n1",
		gpu("GPU-1", "a", "llm-0", llm, 10, 10, 80),
		gpu("GPU-2", "b", "serve-0", serveLabels, 100, 80, 80),
		gpu("GPU-3", "b", "ghost", serveLabels, 100, 80, 80),
		sharedGPU("GPU-4", 100, podRef("a", "llm-0", llm), unknown(podRef("b", "serve-1", nil))),
	), t0)
	s.Apply(nodeEvent("n2",
		gpu("GPU-5", "b", "serve-0", serveLabels, 30, 20, 80),
		gpu("GPU-6", "b", "serve-1", serveLabels, 30, 20, 80),
	), t0)
}

var serveTrigger = map[string]string{"podSelector": "app=serve", "gpuUtilTarget": "50"}

func TestNodeClaimsCheckedAgainstTheAPI(t *testing.T) {
	s := NewState(newFakeClock(t0).Now)
	var dropped []DroppedClaim
	s.SetPodDirectory(clusterPods(true), func(d DroppedClaim) { dropped = append(dropped, d) })
	attack(s)

	// b reads its two pods on n2 at 30% (gpu-util sums them: 60), as if n1 had said
	// nothing of b.
	r := read(t, s, mustTrigger(t, "b", serveTrigger))
	wantMetric(t, r, MetricGPUUtil, 60)
	if active, err := r.Active(); err != nil || !active {
		t.Fatalf("b: Active() = %v, %v; want true, nil", active, err)
	}
	// a's pod holds GPU-1 (10%) and all of GPU-4 (100%), whose other claimed pod was
	// dropped: 110 over its 2 GPUs. Split with the made-up pod it would read 60 over 1.5.
	wantMetric(t, read(t, s, mustTrigger(t, "a", map[string]string{"podSelector": "app=llm", "gpuUtilTarget": "50"})), MetricGPUUtil, 55)

	got := make([]string, len(dropped))
	for i, d := range dropped {
		got[i] = d.Node + " " + d.Namespace + "/" + d.Pod + " " + d.Reason + " " + d.APINode
	}
	slices.Sort(got)
	want := []string{"n1 b/ghost unknown_pod ", "n1 b/serve-0 other_node n2", "n1 b/serve-1 other_node n2"}
	if !slices.Equal(got, want) {
		t.Fatalf("dropped %q, want %q", got, want)
	}
}

// TestNodeClaimsBelievedWithoutTheAPI is the attack above on a scaler without API
// access: it works, which is why the chart gives the scaler the API.
func TestNodeClaimsBelievedWithoutTheAPI(t *testing.T) {
	s := NewState(newFakeClock(t0).Now)
	attack(s)
	_, err := read(t, s, mustTrigger(t, "b", serveTrigger)).Metric(MetricGPUUtil)
	wantUnavailable(t, err, "labels")
}

// TestNodeLabelsComeFromTheAPI: a node that relabels its own pod, or says its labels are
// unknown, changes nothing: podSelector matches the API's labels.
func TestNodeLabelsComeFromTheAPI(t *testing.T) {
	s := NewState(newFakeClock(t0).Now)
	s.SetPodDirectory(clusterPods(true), nil)
	unknown := gpu("GPU-6", "b", "serve-1", nil, 50, 20, 80)
	unknown.Pod.LabelsUnknown = true
	s.Apply(nodeEvent("n2", gpu("GPU-5", "b", "serve-0", map[string]string{"app": "other"}, 30, 20, 80), unknown), t0)
	wantMetric(t, read(t, s, mustTrigger(t, "b", serveTrigger)), MetricGPUUtil, 30+50)
}

// TestNodeClaimOfAnotherUID: a pod of the right name and node but another uid (deleted
// and made again) is not the pod the node names.
func TestNodeClaimOfAnotherUID(t *testing.T) {
	s := NewState(newFakeClock(t0).Now)
	var dropped []DroppedClaim
	s.SetPodDirectory(clusterPods(true), func(d DroppedClaim) { dropped = append(dropped, d) })
	g := gpu("GPU-5", "b", "serve-0", serveLabels, 30, 20, 80)
	g.Pod.Uid = "uid-old"
	s.Apply(nodeEvent("n2", g, gpu("GPU-6", "b", "serve-1", serveLabels, 50, 20, 80)), t0)
	wantMetric(t, read(t, s, mustTrigger(t, "b", serveTrigger)), MetricGPUUtil, 50)
	if len(dropped) != 1 || dropped[0].Reason != ClaimOtherUID {
		t.Fatalf("dropped %+v, want serve-0 for other_uid", dropped)
	}
}

// TestNodeClaimsBeforeTheAPISynced: until the scaler has listed the pods, triggers that
// read pods are Unavailable, and what nodes reported meanwhile stands as pods of unknown
// labels until each node reports again.
func TestNodeClaimsBeforeTheAPISynced(t *testing.T) {
	s := NewState(newFakeClock(t0).Now)
	pods := clusterPods(false)
	s.SetPodDirectory(pods, nil)
	attack(s)
	tr := mustTrigger(t, "b", serveTrigger)
	_, err := read(t, s, tr).Metric(MetricGPUUtil)
	wantUnavailable(t, err, "not yet listed the cluster's pods")
	jobs := mustTrigger(t, "b", map[string]string{"queue": "q", "capacityAware": "true", "podSelector": "app=serve", "gpusPerReplica": "1"})
	if _, err := s.jobsHoldingDevices(jobs); err == nil || !strings.Contains(err.Error(), "not yet listed") {
		t.Fatalf("capacityAware before the sync: %v, want Unavailable", err)
	}

	pods.synced.Store(true)
	_, err = read(t, s, tr).Metric(MetricGPUUtil)
	wantUnavailable(t, err, "labels") // n1's claims, applied before the sync
	attack(s)
	wantMetric(t, read(t, s, tr), MetricGPUUtil, 60)
}

// TestNodeClaimsDroppedCountedAndLogged runs the attack through NATS into a scaler: the
// dropped pods are counted by reason and logged once a minute per node.
func TestNodeClaimsDroppedCountedAndLogged(t *testing.T) {
	url := natstest.Start(t, "", "").ClientURL()
	ts, logs := startScalerLogging(t, url, Config{Pods: clusterPods(true)})
	pub := newPublisher(t, url)
	// The stream keeps one report per node, so the second is published only once the
	// first was read: published back to back, the second may replace the first unread.
	for i := range 2 {
		pub.node(&gpuscalerv1.NodeReport{Node: "n1", Source: "sim", Gpus: []*gpuscalerv1.GPUSample{
			gpu("GPU-1", "a", "llm-0", llm, 10, 10, 80),
			gpu("GPU-2", "b", "serve-0", serveLabels, 100, 80, 80),
			gpu("GPU-3", "b", "ghost", serveLabels, 100, 80, 80),
		}})
		want := float64(i + 1)
		testkit.Eventually(t, 5*time.Second, func() bool {
			return testutil.ToFloat64(ts.metrics.claimsDropped.WithLabelValues(ClaimOtherNode)) == want &&
				testutil.ToFloat64(ts.metrics.claimsDropped.WithLabelValues(ClaimUnknownPod)) == want
		})
	}
	if n := testkit.CountLines(logs.String(), "dropped a pod from a node's report"); n != 1 {
		t.Fatalf("logged %d times, want once a minute for the node:\n%s", n, logs)
	}
	if checks, synced := ts.state.ChecksPodClaims(); !checks || !synced {
		t.Fatalf("ChecksPodClaims() = %v, %v; want true, true", checks, synced)
	}
}

// TestNodeClaimOfAnUnattributedDevice: a node saying another node's pod holds a device it
// cannot match to a GPU would make that pod's triggers Unavailable; the claim is dropped,
// and the device stays unattributed, held by no pod.
func TestNodeClaimOfAnUnattributedDevice(t *testing.T) {
	for _, checked := range []bool{false, true} {
		s := NewState(newFakeClock(t0).Now)
		if checked {
			s.SetPodDirectory(clusterPods(true), nil)
		}
		evil := nodeEvent("n1", gpu("GPU-1", "a", "llm-0", llm, 10, 10, 80))
		evil.Node.Unattributed = []*gpuscalerv1.UnattributedDevice{{Id: "MIG-x", Resource: "nvidia.com/mig-1g.10gb", Pod: podRef("b", "serve-0", serveLabels), Reason: "unknown id"}}
		s.Apply(evil, t0)
		s.Apply(nodeEvent("n2", gpu("GPU-5", "b", "serve-0", serveLabels, 30, 20, 80), gpu("GPU-6", "b", "serve-1", serveLabels, 30, 20, 80)), t0)
		v, err := read(t, s, mustTrigger(t, "b", serveTrigger)).Metric(MetricGPUUtil)
		if !checked {
			wantUnavailable(t, err, "MIG-x")
			continue
		}
		if err != nil || v != 60 {
			t.Fatalf("checked: gpu-util = %v, %v; want 60", v, err)
		}
		if u := s.nodes["n1"].report.GetUnattributed(); len(u) != 1 || u[0].GetPod() != nil {
			t.Fatalf("checked: n1 keeps unattributed %v, want MIG-x held by no pod", u)
		}
	}
}

// TestExplainSaysWhomItBelieves: explain tells an operator, for a podSelector trigger,
// whether the pods nodes report are checked against the API, and the attack's effect.
func TestExplainSaysWhomItBelieves(t *testing.T) {
	md := map[string]string{"podSelector": "app=serve", "gpuUtilTarget": "50"}
	for name, tc := range map[string]struct {
		dir  PodDirectory
		want []string
	}{
		"no API":     {nil, []string{"--kubeconfig none", "IsActive fails"}},
		"not synced": {clusterPods(false), []string{"has not yet listed them", "IsActive fails"}},
		"checked":    {clusterPods(true), []string{"believed only of the pods the API places on it", "gpu-util is 60"}},
	} {
		t.Run(name, func(t *testing.T) {
			s := NewState(newFakeClock(t0).Now)
			if tc.dir != nil {
				s.SetPodDirectory(tc.dir, nil)
			}
			attack(s)
			ex, err := readyServer(s).Explain(t.Context(), &gpuscalerv1.ExplainRequest{Namespace: "b", Metadata: md})
			if err != nil {
				t.Fatal(err)
			}
			wantReason(t, ex, tc.want...)
		})
	}
}

// TestNodeResourcesFromTheAPI: where the API knows a node's CPU and memory, they count
// rather than what the node reports; where it does not, the node's report stands.
func TestNodeResourcesFromTheAPI(t *testing.T) {
	s := NewState(newFakeClock(t0).Now)
	pods := clusterPods(true)
	api := &gpuscalerv1.NodeResources{CpuAllocatableMillis: 8000, MemoryAllocatableBytes: 64 << 30, CpuRequestedMillis: 6000, MemoryRequestedBytes: 48 << 30}
	pods.resources = map[string]*gpuscalerv1.NodeResources{"n1": api}
	s.SetPodDirectory(pods, nil)
	claimed := &gpuscalerv1.NodeResources{CpuAllocatableMillis: 64000, MemoryAllocatableBytes: 512 << 30}
	for _, node := range []string{"n1", "n2"} {
		ev := nodeEvent(node)
		ev.Node.Resources = claimed
		s.Apply(ev, t0)
	}
	if got := s.nodes["n1"].report.GetResources(); !proto.Equal(got, api) {
		t.Errorf("n1: resources %v, want the API's %v", got, api)
	}
	if got := s.nodes["n2"].report.GetResources(); !proto.Equal(got, claimed) {
		t.Errorf("n2, unknown to the API: resources %v, want the node's %v", got, claimed)
	}
}
