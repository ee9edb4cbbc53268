package e2e

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	autoscalingv2 "k8s.io/api/autoscaling/v2"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	kedav1alpha1 "github.com/kedacore/keda/v2/apis/keda/v1alpha1"

	"github.com/gpuscaler/gpuscaler/test/e2e/cluster"

	"github.com/gpuscaler/gpuscaler/test/testkit"
)

// TestQueueDemandThroughTheHPA: queue-demand, the metric docs/triggers.md recommends
// for an inference service (targetWait, not queueTarget), through KEDA and the real HPA.
// A gateway holds the requests that come while the Deployment is at zero and reports the
// traffic it measures; KEDA wakes the Deployment on the first one (pushed); its HPA reads
// s0-queue-demand through KEDA's metrics adapter, an AverageValue target of 1 (the metric
// is a replica count), and takes it up; with the requests served it goes back to 0.
//
// The ScaledObject gives its HPA a scale-up tolerance of its own, 50%
// (advanced.horizontalPodAutoscalerConfig.behavior.scaleUp.tolerance: Kubernetes 1.33
// on, on by default from 1.35), and the trigger repeats it as scaleUpTolerance, as
// docs/triggers.md asks: KEDA hands it to the HPA. Nothing here makes a wait be missed
// (once a replica is ready the gateway forwards every request), so the tolerance changes
// no decision in this test: the missed-wait rule and its tolerance are tested against the
// HPA's published rule (kedarules' TestMissedWaitAddsAReplica).
func TestQueueDemandThroughTheHPA(t *testing.T) {
	const (
		name        = "llm-demand"
		queue       = "demand-requests"
		modelLoad   = 1500 * time.Millisecond
		tokenEvery  = 100 * time.Millisecond
		concurrency = 2
		maxReplicas = 4
		tolerance   = "500m"
	)
	ns := newNamespace(t, "demand")
	pool := newGPUPool(t, "dm-"+ns, 8)
	createGPUDeployment(t, ns, name, pool.name, 0, 1, modelLoad)
	createService(t, ns, name, 8000)
	servers := startModelServers(t, ns, "app="+name, tokenEvery)
	proxy := startKubeProxy(t, servers)
	gw, err := env.G.StartGateway(t.Context(), cluster.GatewayOptions{
		Namespace: ns, Kubeconfig: env.CP.Kubeconfig, ProducerID: "gw", ReportInterval: 500 * time.Millisecond,
		Routes: fmt.Sprintf(`routes:
- name: llm
  pathPrefix: /v1
  service: {name: %s, port: 8000}
  queue: %s
  holdTimeout: 1m
`, name, queue),
		ServiceAddresses: []string{fmt.Sprintf("%s:8000=%s", name, proxy.addr)},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(gw.Stop)

	trigger := pushTrigger("queue", queue, "targetWait", "2s", "concurrency", fmt.Sprint(concurrency),
		"scaleUpTolerance", tolerance, "staleAfter", "3s")
	testkit.Eventually(t, 20*time.Second, producersAre(ns, trigger.Metadata, map[string]share{"gw": {}}))
	so := fastScaleDown(scaledObject(ns, name, name, 0, maxReplicas, testPolling, testCooldown, trigger))
	up := resource.MustParse(tolerance)
	so.Spec.Advanced.HorizontalPodAutoscalerConfig.Behavior.ScaleUp = &autoscalingv2.HPAScalingRules{Tolerance: &up}
	so = createScaledObject(t, so)
	waitCondition(t, ns, name, kedav1alpha1.ConditionReady, metav1.ConditionTrue, "", 30*time.Second)

	// KEDA's HPA: one external metric, queue-demand with a target of 1 replica, and the
	// ScaledObject's scale-up tolerance.
	hpa := kedaHPA(t, so, "s0-queue-demand", "1")
	if b := hpa.Spec.Behavior; b == nil || b.ScaleUp == nil || b.ScaleUp.Tolerance == nil || b.ScaleUp.Tolerance.Cmp(up) != 0 {
		t.Errorf("KEDA's HPA behavior %+v, want scaleUp.tolerance %s", b, tolerance)
	}

	// 16 requests of 20 tokens (2 s each once forwarded) at 0 replicas.
	dw := watchDeployments(t, ns, name)
	const n, tokens = 16, 20
	answers := make([]answer, n)
	var wg sync.WaitGroup
	sent := time.Now()
	for i := range n {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
			defer cancel()
			answers[i] = requestCompletion(ctx, gw.Addr, "/v1/completions", tokens, i%2 == 0)
		})
	}
	woke := dw.waitFor(t, name, 1, 30*time.Second)
	// Before any request has been served the service time is unknown and queue-demand
	// is the backlog over concurrency, 16/2 = 8 replicas: the HPA, reading it through
	// KEDA, goes to maxReplicaCount.
	testkit.Eventually(t, 10*time.Second, func(ctx context.Context) error {
		v, err := env.Scaler.Metric(ctx, ns, name, trigger.Metadata, "queue-demand")
		if err != nil {
			return err
		}
		return testkit.Check(v == n/concurrency, "queue-demand %g", v)
	})
	scaled := dw.waitFor(t, name, maxReplicas, 30*time.Second)
	testkit.Eventually(t, 10*time.Second, func(ctx context.Context) error {
		v, conds, err := hpaMetric(ctx, ns, so.Status.HpaName, "s0-queue-demand")
		if err != nil {
			return err
		}
		return testkit.Check(v > 0, "the HPA shows s0-queue-demand %g (%s)", v, conds)
	})
	wg.Wait()
	last := time.Now()
	for i, a := range answers {
		if why := a.whole(tokens, i%2 == 0); why != "" {
			t.Errorf("request %d: %s", i, why)
		}
	}
	if t.Failed() {
		t.FailNow()
	}
	// Served, the gateway has measured a service time: queue-demand is the traffic's
	// demand now, below the 8 the backlog asked for, and the trigger, with nothing
	// waiting or in flight, is inactive: KEDA takes the Deployment to 0.
	testkit.Eventually(t, 30*time.Second, func(ctx context.Context) error {
		v, err := env.Scaler.Metric(ctx, ns, name, trigger.Metadata, "queue-demand")
		if err != nil {
			return err
		}
		return testkit.Check(v < n/concurrency, "queue-demand %g", v)
	})
	zero := dw.waitFor(t, name, 0, 90*time.Second)
	recordFigure(t, "queue-demand through the gateway, %d requests at 0 replicas: → 1 replica (KEDA, pushed) %s; → %d (HPA on s0-queue-demand) %s; last answer → 0 %s",
		n, woke.Sub(sent).Round(time.Millisecond), maxReplicas, scaled.Sub(sent).Round(time.Millisecond), zero.Sub(last).Round(time.Millisecond))
}
