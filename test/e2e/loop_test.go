package e2e

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	kedav1alpha1 "github.com/kedacore/keda/v2/apis/keda/v1alpha1"

	"github.com/gpuscaler/gpuscaler/test/e2e/cluster"

	"github.com/gpuscaler/gpuscaler/test/testkit"
)

// loopFigures collects the measured figures of the loop's scenarios, printed once at the
// end of the run (TestMain) for the README.
var loopFigures struct {
	mu    sync.Mutex
	lines []string
}

func recordFigure(t *testing.T, format string, args ...any) {
	t.Helper()
	line := fmt.Sprintf(format, args...)
	t.Log(line)
	loopFigures.mu.Lock()
	loopFigures.lines = append(loopFigures.lines, line)
	loopFigures.mu.Unlock()
}

// (1) Queue, 0 → N → 0. An external-push ScaledObject on a producer's queue goes 0 → 1 on
// the first report (KEDA, pushed), then the real HPA, reading queue-backlog through KEDA's
// metrics adapter, takes it to ⌈backlog / queueTarget⌉, capped by maxReplicaCount. The
// scheduler places its pods on fake GPU nodes, they become Ready after their model loads,
// and the collectors attribute their GPUs. With the backlog gone it goes back to 0.
func TestLoopQueueZeroToNToZero(t *testing.T) {
	t.Parallel()
	ns := newNamespace(t, "loop-queue")
	pool := newGPUPool(t, "q-"+ns, 8, 8)
	const target, load = 4, 3 * time.Second
	createGPUDeployment(t, ns, "inference", pool.name, 0, 1, load)
	// The producer reports its empty queue first, as one does from its start: the trigger
	// has data when KEDA first asks (KEDA's polls of a queue never reported fail, and
	// break its push stream for a while; see TestWakeAfterProducerOutage).
	p := startProducerOn(t, env.GCluster, ns, "requests", cluster.Report{})
	so := createScaledObject(t, fastScaleDown(scaledObject(ns, "inference", "inference", 0, 6, loopPolling, 5,
		loopTrigger("external-push", "queue", "requests", "queueTarget", fmt.Sprint(target)))))
	waitCondition(t, ns, "inference", kedav1alpha1.ConditionReady, metav1.ConditionTrue, "", 30*time.Second)
	consistently(t, 2*time.Second, "at 0 with an empty queue", replicasAre(ns, "inference", 0))

	dw := watchDeployments(t, ns, "inference")
	pw := watchPods(t, ns)
	t.Log("20 items arrive")
	sent := time.Now()
	p.Set(cluster.Report{Waiting: 20, Arrivals: 20})
	woke := dw.waitFor(t, "inference", 1, 30*time.Second)
	// ⌈20 / 4⌉ = 5: the HPA's arithmetic on gpuscaler's value, through KEDA's adapter.
	scaled := dw.waitFor(t, "inference", 5, 60*time.Second)
	recordFigure(t, "queue 0 → N: report stored → 1 replica (KEDA, pushed) %s; → 5 replicas (HPA, ⌈20/4⌉) %s",
		woke.Sub(sent).Round(time.Millisecond), scaled.Sub(sent).Round(time.Millisecond))

	// 5 pods Ready on the pool's nodes.

	testkit.Eventually(t, 60*time.Second, func(ctx context.Context) error {
		n, nodes, err := readyPods(ctx, ns, "app=inference")
		if err != nil {
			return err
		}
		for _, node := range nodes {
			if !strings.HasPrefix(node, pool.name) {
				return errors.New("a pod on " + node + ", outside the pool")
			}
		}
		return testkit.Check(n == 5, "%d Ready, on %v", n, nodes)
	})
	if first := pw.earliestReady(); !first.IsZero() {
		recordFigure(t, "queue 0 → N: report stored → first pod Ready %s (model load %s)", first.Sub(sent).Round(time.Millisecond), load)
	}
	v, conds, err := hpaMetric(t.Context(), ns, so.Status.HpaName, "s0-queue-backlog")
	if err != nil {
		t.Fatal(err)
	}
	if v != 4 {
		t.Errorf("the HPA shows s0-queue-backlog %g per pod, want 20 / 5 = 4 (%s)", v, conds)
	}

	// The collectors attribute the pods' GPUs: the scaler, asked as KEDA would about a
	// podSelector over them, sees exactly the five pods, one GPU each, on the pool's
	// nodes.
	// The scaler sees the 5 pods' GPUs.
	testkit.Eventually(t, 30*time.Second, func(ctx context.Context) error {
		holders, err := env.GCluster.GPUHolders(ctx, env.Scalers.Replica(0).GRPCAddr, ns, map[string]string{"podSelector": "app=inference", "gpuUtilTarget": "80"})
		if err != nil {
			return err
		}
		var pods []string
		for node, hs := range holders {
			if !strings.HasPrefix(node, pool.name) {
				return errors.New("GPUs held on " + node)
			}
			pods = append(pods, hs...)
		}
		slices.Sort(pods)
		return testkit.Check(len(pods) == 5 && len(slices.Compact(slices.Clone(pods))) == 5, "holders %v", holders)
	})

	t.Log("40 items: ⌈40/4⌉ = 10, capped at maxReplicaCount 6")
	p.Set(cluster.Report{Waiting: 40, Arrivals: 20})
	dw.waitFor(t, "inference", 6, 60*time.Second)
	consistently(t, 3*time.Second, "held at maxReplicaCount 6", replicasAre(ns, "inference", 6))

	t.Log("the backlog is gone")
	emptied := time.Now()
	p.Set(cluster.Report{})
	atZero := dw.waitFor(t, "inference", 0, 90*time.Second)
	recordFigure(t, "queue N → 0: backlog gone → 0 replicas %s (HPA scale-down window 3 s, cooldownPeriod 5 s)", atZero.Sub(emptied).Round(time.Millisecond))
	// The pods are gone.
	testkit.Eventually(t, 30*time.Second, func(ctx context.Context) error {
		pods, err := env.Kube.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app=inference"})
		if err != nil {
			return err
		}
		return testkit.Check(len(pods.Items) == 0, "%d pods", len(pods.Items))
	})
}

// (2) GPU utilisation, 1 → N and back. A podSelector trigger over the Deployment's own
// pods scales it on the utilisation their GPUs report. The test sets the load, in GPUs'
// worth of work, and each Ready pod's GPU runs at load / Ready pods (a pod still loading
// its model idles): the HPA follows ⌈load / target⌉ (outside its 10% tolerance), and
// its status shows gpuscaler's metric.
func TestLoopGPUUtilisationOneToNAndBack(t *testing.T) {
	t.Parallel()
	ns := newNamespace(t, "loop-util")
	pool := newGPUPool(t, "u-"+ns, 8, 8)
	createGPUDeployment(t, ns, "llm", pool.name, 1, 1, 2*time.Second)
	so := createScaledObject(t, fastScaleDown(scaledObject(ns, "llm", "llm", 1, 6, loopPolling, 5,
		loopTrigger("external", "podSelector", "app=llm", "gpuUtilTarget", "50", "gpusPerReplica", "1"))))

	var mu sync.Mutex
	load := 50.0 // percent of one GPU
	setLoad := func(l float64) {
		mu.Lock()
		load = l
		mu.Unlock()
	}
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		last := -1.0
		for {
			select {
			case <-stop:
				return
			case <-time.After(250 * time.Millisecond):
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			n, _, err := readyPods(ctx, ns, "app=llm")
			if err == nil && n > 0 {
				mu.Lock()
				u := math.Min(100, load/float64(n))
				mu.Unlock()
				if u != last && pool.setUtil(ctx, u) == nil {
					last = u
				}
			}
			cancel()
		}
	}()
	t.Cleanup(func() {
		close(stop)
		<-done
	})

	dw := watchDeployments(t, ns, "llm")
	consistently(t, 5*time.Second, "1 replica at 50% of a GPU against a target of 50", replicasAre(ns, "llm", 1))

	t.Log("the load rises to 2.5 GPUs' worth")
	rose := time.Now()
	setLoad(250)
	// ⌈250 / 50⌉ = 5, reached in steps: a pod loading its model adds no utilisation, and
	// once Ready the same work spreads over one more pod.
	at := dw.waitFor(t, "llm", 5, 60*time.Second)
	recordFigure(t, "GPU utilisation 1 → N: load 50%% → 250%% of a GPU → 5 replicas (HPA, ⌈250/50⌉) %s", at.Sub(rose).Round(time.Millisecond))
	// 5 pods Ready and the HPA showing 250/5 = 50 per pod.
	testkit.Eventually(t, 60*time.Second, func(ctx context.Context) error {
		n, _, err := readyPods(ctx, ns, "app=llm")
		if err != nil {
			return err
		}
		v, conds, err := hpaMetric(ctx, ns, so.Status.HpaName, "s0-gpu-util")
		if err != nil {
			return err
		}
		return testkit.Check(n == 5 && v == 50, "%d Ready; HPA s0-gpu-util %g per pod (%s)", n, v, conds)
	})
	consistently(t, 5*time.Second, "steady at 5 replicas", replicasAre(ns, "llm", 5))

	t.Log("the load falls to 0.4 GPUs' worth")
	fell := time.Now()
	setLoad(40)
	at = dw.waitFor(t, "llm", 1, 60*time.Second)
	recordFigure(t, "GPU utilisation N → 1: load 250%% → 40%% of a GPU → 1 replica %s (HPA scale-down window 3 s)", at.Sub(fell).Round(time.Millisecond))
}

// (3) Capacity-aware ScaledJob against the real scheduler. Ten items wait, 3 GPUs are
// free: a capacityAware ScaledJob's Jobs all find GPUs, poll after poll, where the same
// setup without capacityAware leaves Pods Pending. A node joins: Jobs follow within a poll
// of its first report. Four-GPU Jobs are never created for GPUs spread over nodes.
func TestLoopCapacityAwareScaledJob(t *testing.T) {
	t.Parallel()
	ns := newNamespace(t, "loop-cap")
	capped := newGPUPool(t, "c-"+ns, 8)
	plain := newGPUPool(t, "p-"+ns, 8)
	pw := watchPods(t, ns)
	// Another workload holds 5 of each node's 8 GPUs: 3 free.
	createGPUDeployment(t, ns, "filler-c", capped.name, 1, 5, 0)
	createGPUDeployment(t, ns, "filler-p", plain.name, 1, 5, 0)
	cappedTrigger := loopTrigger("external", "queue", "train", "capacityAware", "true", "gpusPerReplica", "1", "nodeSelector", poolLabel+"="+capped.name, "tolerations", kwokTolerated)
	startWorkQueue(t, ns, "train", "capped", 10)
	startWorkQueue(t, ns, "train-plain", "plain", 10)
	// The scaler caps the backlog at the 3 free GPUs.
	testkit.Eventually(t, 60*time.Second, backlogOn(ns, "capped", cappedTrigger.Metadata, 3))

	createGPUScaledJob(t, ns, "capped", capped.name, 1, cappedTrigger)
	createGPUScaledJob(t, ns, "plain", plain.name, 1, loopTrigger("external", "queue", "train-plain"))

	// The plain ScaledJob creates 10 Jobs.

	testkit.Eventually(t, 60*time.Second, jobsAre(ns, "plain", 10))
	// The capped ScaledJob creates 3 Jobs.
	testkit.Eventually(t, 60*time.Second, jobsAre(ns, "capped", 3))
	// Ten polls of each: the capped Jobs all run, the plain ones wait for GPUs.
	consistently(t, 10*loopPolling*time.Second, "3 capped Jobs, none Pending", func(ctx context.Context) error {
		n, err := jobsOf(ctx, ns, "capped")
		if err != nil {
			return err
		}
		if p := pw.pending("capped-"); len(p) > 0 || n > 3 {
			return fmt.Errorf("%d Jobs; Pending for GPUs: %v", n, p)
		}
		return nil
	})
	plainPending, err := pendingNow(t.Context(), ns, "plain-")
	if err != nil {
		t.Fatal(err)
	}
	if plainPending != 7 {
		t.Errorf("without capacityAware: %d Pods Pending for lack of nvidia.com/gpu, want 10 - 3 = 7", plainPending)
	}
	cappedJobs, err := jobsOf(t.Context(), ns, "capped")
	if err != nil {
		t.Fatal(err)
	}
	plainJobs, err := jobsOf(t.Context(), ns, "plain")
	if err != nil {
		t.Fatal(err)
	}
	recordFigure(t, "capacityAware, 10 items, 3 free GPUs: %d Jobs, %d Pods ever Pending; without it: %d Jobs, %d Pods Pending",
		cappedJobs, len(pw.pending("capped-")), plainJobs, plainPending)

	t.Log("a node of 8 GPUs joins the capped pool")
	nc, err := nats.Connect(env.NATSCluster.URLs)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	node := fmt.Sprintf("%s-%d", capped.name, 1)
	firstReport := make(chan time.Time, 1)
	sub, err := nc.Subscribe("gpuscaler.v1.node."+node, func(*nats.Msg) {
		select {
		case firstReport <- time.Now():
		default:
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	if got := capped.addNode(t, 8); got != node {
		t.Fatalf("node %s, want %s", got, node)
	}
	reported := <-firstReport
	var followed time.Time
	// The capped ScaledJob creates the 7 more Jobs the new node fits.
	testkit.Eventually(t, 60*time.Second, func(ctx context.Context) error {
		err := jobsAre(ns, "capped", 10)(ctx)
		if err == nil && followed.IsZero() {
			followed = time.Now()
		}
		return err
	})
	recordFigure(t, "capacityAware: a node joins → 7 more Jobs %s after its first NodeReport (pollingInterval %d s)", followed.Sub(reported).Round(time.Millisecond), loopPolling)
	// All 10 capped Jobs Ready.
	testkit.Eventually(t, 60*time.Second, func(ctx context.Context) error {
		n, _, err := readyPods(ctx, ns, "scaledjob=capped")
		return testkit.Check(err == nil && n == 10, "%d Ready (%v)", n, err)
	})
	if p := pw.pending("capped-"); len(p) > 0 {
		t.Errorf("capacityAware Jobs left Pending: %v", p)
	}

	t.Log("four-GPU Jobs: two nodes with 3 free GPUs each")
	big := newGPUPool(t, "b-"+ns, 8, 8)
	createGPUDeployment(t, ns, "filler-b", big.name, 2, 5, 0)
	bigTrigger := loopTrigger("external", "queue", "train-big", "capacityAware", "true", "gpusPerReplica", "4", "nodeSelector", poolLabel+"="+big.name, "tolerations", kwokTolerated)
	startWorkQueue(t, ns, "train-big", "big", 10)
	// 6 GPUs are free, but no node has 4 of them: no Job fits.
	// The scaler caps four-GPU Jobs at 0.
	testkit.Eventually(t, 60*time.Second, backlogOn(ns, "big", bigTrigger.Metadata, 0))
	createGPUScaledJob(t, ns, "big", big.name, 4, bigTrigger)
	consistently(t, 5*loopPolling*time.Second, "no four-GPU Job for GPUs spread over nodes", jobsAtMost(ns, "big", 0))

	t.Log("one node's filler goes: 8 GPUs free on it")
	setReplicas(t, ns, "filler-b", 1)
	// Two four-GPU Jobs, Ready on the freed node.
	testkit.Eventually(t, 60*time.Second, func(ctx context.Context) error {
		n, nodes, err := readyPods(ctx, ns, "scaledjob=big")
		if err != nil {
			return err
		}
		jobs, err := jobsOf(ctx, ns, "big")
		if err != nil {
			return err
		}
		return testkit.Check(jobs == 2 && n == 2 && len(nodes) == 1, "%d Jobs, %d Ready on %v", jobs, n, nodes)
	})
	consistently(t, 5*loopPolling*time.Second, "no third four-GPU Job", jobsAtMost(ns, "big", 2))
	if p := pw.pending("big-"); len(p) > 0 {
		t.Errorf("four-GPU Jobs left Pending: %v", p)
	}
}

// backlogOn polls the queue-backlog gpuscaler's replicas answer for a trigger, as KEDA
// reads it, until both give want.
func backlogOn(ns, name string, meta map[string]string, want float64) func(ctx context.Context) error {
	return func(ctx context.Context) error {
		var got []string
		ok := true
		for i := range env.Scalers.Len() {
			s := env.Scalers.Replica(i)
			if s == nil {
				continue
			}
			v, err := s.Metric(ctx, ns, name, meta, "queue-backlog")
			if err != nil {
				return err
			}
			ok = ok && v == want
			got = append(got, fmt.Sprint(v))
		}
		return testkit.Check(ok, "%s", "queue-backlog "+strings.Join(got, ", "))
	}
}
