package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpuscaler/gpuscaler/test/e2e/cluster"
	"github.com/gpuscaler/gpuscaler/test/testkit"
)

// TestAttackNodeClaim (issue 28, item 4): a compromised GPU node cannot reach past
// itself. Namespace b's two pods run on an honest node, whose collector reports them at
// 30%. Another node, compromised (here a NATS client publishing that node's subject, as
// its collector could), first claims b's pods, and a made-up one, at 100% on its own
// GPUs; then marks b's pods "labels unknown". A scaler given the Kubernetes API
// (--kubeconfig) believes a node only of the pods the API binds to it: KEDA keeps
// reading 60 (2 × 30) for b's podSelector trigger throughout, and the trigger answers.
// The same reports on a scaler without the API (--kubeconfig none) move KEDA's metric to
// 360 and then make the trigger Unavailable: the attack is real, and the check is what
// stops it.
//
// Last, the honest node's collector stops reading pods (--read-pods=false, as the chart
// runs collectors beside a scaler on the API, granting them no pod): the checked scaler
// still reads b's pods, with the API's labels.
//
// The test runs on a NATS server of its own, so its attacker's reports reach no other
// test's scaler.
func TestAttackNodeClaim(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	ns := newNamespace(t, "claim")
	dir := filepath.Join(env.Dir, "attack-"+ns)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	bus, err := cluster.StartNATS(ctx, env.Procs, natsBin(t), dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(bus.Server.Stop)
	g := cluster.NewGpuscaler(env.Procs, env.G.Bin, bus.URL, dir)
	checked, err := g.StartScaler(ctx, "--kubeconfig="+env.CP.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(checked.Stop)
	trusting, err := g.StartScaler(ctx, "--kubeconfig=none")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(trusting.Stop)

	// b's workload: two pods of one GPU each, which the scheduler places on the honest
	// node, the only node of the pool.
	pool := ns
	honest := pool + "-honest"
	if err := env.Kwok.AddNode(ctx, cluster.GPUNode{Name: honest, GPUs: 2, Labels: map[string]string{poolLabel: pool}}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Kube.CoreV1().Nodes().Delete(context.Background(), honest, metav1.DeleteOptions{}) })
	col, err := g.StartClusterCollector(ctx, honest, env.CP.Kubeconfig, cluster.SimNode{GPUs: 2, Util: 30, Jitter: 0}, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(col.Stop)
	createGPUDeployment(t, ns, "serve", pool, 2, 1, 0)
	var pods []string
	testkit.Eventually(t, time.Minute, func(ctx context.Context) error {
		pods, err = podsOn(ctx, ns, "app=serve", honest)
		if err != nil {
			return err
		}
		return testkit.Check(len(pods) == 2, "b's pods ready on %s: %v", honest, pods)
	})

	// What KEDA sees: a ScaledObject per scaler, on a workload of its own (no GPUs), with
	// b's podSelector trigger. One GPU per replica: b's two pods at 30% read 60.
	trigger := func(s *cluster.Scaler) map[string]string {
		return map[string]string{"scalerAddress": s.GRPCAddr, "podSelector": "app=serve", "gpuUtilTarget": "50", "gpusPerReplica": "1"}
	}
	for _, w := range []struct {
		name string
		s    *cluster.Scaler
	}{{"checked", checked}, {"trusting", trusting}} {
		createDeployment(t, ns, w.name, 1)
		tr := pushTrigger()
		tr.Metadata = trigger(w.s)
		createScaledObject(t, scaledObject(ns, w.name, w.name, 1, 10, testPolling, testCooldown, tr))
	}
	mc, err := env.KEDA.NewMetricsClient()
	if err != nil {
		t.Fatal(err)
	}
	defer mc.Close()
	testkit.Eventually(t, 30*time.Second, metricIs(mc, ns, "checked", "s0-gpu-util", 60))
	testkit.Eventually(t, 30*time.Second, metricIs(mc, ns, "trusting", "s0-gpu-util", 60))

	t.Log("a compromised node claims b's pods, and a made-up one, at 100%")
	evil := pool + "-evil"
	claim := func(name string) evilPod {
		return evilPod{Namespace: ns, Name: name, Labels: map[string]string{"app": "serve"}}
	}
	attacker := startEvilNode(t, g, evil, []evilPod{claim(pods[0]), claim(pods[1]), claim("ghost")})
	// The trusting scaler adds the three claimed GPUs at 100%: 60 + 300.
	testkit.Eventually(t, 30*time.Second, metricIs(mc, ns, "trusting", "s0-gpu-util", 360))
	consistently(t, 5*time.Second, "KEDA reads b's own pods only from the checked scaler", metricIs(mc, ns, "checked", "s0-gpu-util", 60))

	t.Log("the compromised node marks b's pods labels-unknown")
	unknown := func(name string) evilPod { return evilPod{Namespace: ns, Name: name, LabelsUnknown: true} }
	attacker.set([]evilPod{unknown(pods[0]), unknown(pods[1])})
	testkit.Eventually(t, 30*time.Second, func(ctx context.Context) error {
		v, err := trusting.Metric(ctx, ns, "trusting", trigger(trusting), "gpu-util")
		if err == nil {
			return fmt.Errorf("the trusting scaler answers %g, want Unavailable: labels unknown", v)
		}
		return testkit.Check(strings.Contains(err.Error(), "Unavailable") && strings.Contains(err.Error(), "labels"), "error %v", err)
	})
	consistently(t, 5*time.Second, "the checked scaler answers for b, through KEDA and directly", func(ctx context.Context) error {
		if err := metricIs(mc, ns, "checked", "s0-gpu-util", 60)(ctx); err != nil {
			return err
		}
		v, err := checked.Metric(ctx, ns, "checked", trigger(checked), "gpu-util")
		if err != nil {
			return err
		}
		return testkit.Check(v == 60, "gpu-util %g", v)
	})
	if log := checked.Tail(400); !strings.Contains(log, "dropped a pod from a node's report") || !strings.Contains(log, evil) {
		t.Errorf("the checked scaler's log does not name the node whose claims it dropped:\n%s", log)
	}

	t.Log("the honest node's collector reads no pod (--read-pods=false), as the chart runs it beside a checked scaler")
	col.Stop()
	col, err = g.StartCollector(ctx, honest, cluster.SimNode{GPUs: 2, Util: 30, Jitter: 0}, time.Second,
		"--sim-from-cluster", "--kubeconfig="+env.CP.Kubeconfig,
		"--pod-resources-socket="+filepath.Join(dir, "kubelet-"+honest, "kubelet.sock"), "--read-pods=false")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(col.Stop)
	// Its reports name b's pods without labels: the checked scaler matches the API's. Its
	// first reports may hold no pod yet, while it learns the node's pods from the API as
	// the kubelet would.
	checkedReads60 := func(ctx context.Context) error {
		v, err := checked.Metric(ctx, ns, "checked", trigger(checked), "gpu-util")
		if err != nil {
			return err
		}
		return testkit.Check(v == 60, "gpu-util %g", v)
	}
	testkit.Eventually(t, 30*time.Second, checkedReads60)
	consistently(t, 5*time.Second, "the checked scaler reads b's pods with the API's labels", checkedReads60)
	testkit.Eventually(t, 30*time.Second, metricIs(mc, ns, "checked", "s0-gpu-util", 60))
}

// podsOn returns the names of the Ready pods of ns that selector selects, bound to node.
func podsOn(ctx context.Context, ns, selector, node string) ([]string, error) {
	list, err := env.Kube.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		return nil, err
	}
	var names []string
	for _, p := range list.Items {
		if p.DeletionTimestamp != nil || p.Spec.NodeName != node {
			continue
		}
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
				names = append(names, p.Name)
			}
		}
	}
	return names, nil
}

// evilPod is a pod a compromised node claims, in a NodeReport's protobuf JSON.
type evilPod struct {
	Namespace     string            `json:"namespace"`
	Name          string            `json:"name"`
	Labels        map[string]string `json:"labels,omitempty"`
	LabelsUnknown bool              `json:"labelsUnknown,omitempty"`
}

// evilNode publishes node's reports, as its compromised collector could, every second
// until the test ends: one GPU at 100% per pod it claims.
type evilNode struct {
	mu   sync.Mutex // guards pods
	pods []evilPod
}

func (e *evilNode) set(pods []evilPod) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.pods = pods
}

// report is the node's NodeReport as protobuf JSON.
func (e *evilNode) report(node string) ([]byte, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	type gpu struct {
		UUID    string  `json:"uuid"`
		GPUUtil float64 `json:"gpuUtil"`
		Pod     evilPod `json:"pod"`
	}
	r := struct {
		Node   string `json:"node"`
		Source string `json:"source"`
		GPUs   []gpu  `json:"gpus"`
	}{Node: node, Source: "sim"}
	for i, p := range e.pods {
		r.GPUs = append(r.GPUs, gpu{UUID: fmt.Sprintf("GPU-%s-%d", node, i), GPUUtil: 100, Pod: p})
	}
	return json.Marshal(r)
}

// startEvilNode publishes node's reports claiming pods, with `gpuscaler publish node`
// (which waits until the stream has stored each), every second until the test ends.
func startEvilNode(t *testing.T, g *cluster.Gpuscaler, node string, pods []evilPod) *evilNode {
	t.Helper()
	e := &evilNode{pods: pods}
	publish := func(ctx context.Context) error {
		data, err := e.report(node)
		if err != nil {
			return err
		}
		cmd := exec.CommandContext(ctx, g.Bin, "publish", "node", "--file=-", "--nats-url="+g.NATSURL, "--timeout=5s")
		var out bytes.Buffer
		cmd.Stdin, cmd.Stdout, cmd.Stderr = bytes.NewReader(data), &out, &out
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("gpuscaler publish node %s: %w: %s", node, err, strings.TrimSpace(out.String()))
		}
		return nil
	}
	if err := publish(t.Context()); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				if err := publish(ctx); err != nil && ctx.Err() == nil {
					t.Logf("evil node: %v", err)
				}
			}
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
	return e
}
