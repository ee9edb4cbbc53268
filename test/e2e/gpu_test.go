package e2e

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	kedav1alpha1 "github.com/kedacore/keda/v2/apis/keda/v1alpha1"

	"github.com/gpuscaler/gpuscaler/test/e2e/cluster"

	"github.com/gpuscaler/gpuscaler/test/testkit"
)

// (d) A podSelector GPU-utilisation trigger: sim collectors on two nodes report the GPUs
// the workload's pods hold, and KEDA's metrics path (the operator's metrics service, which
// KEDA's metrics API server forwards every HPA query to) serves the sum of their
// utilisation per gpusPerReplica; KEDA's HPA carries the trigger's target. A trigger with
// only podSelector is always active, so KEDA brings the workload from zero to one replica
// and, once its GPUs idle, the HPA takes it down to one and KEDA never to zero: at zero
// it would hold no GPUs, and nothing could wake it.
func TestGPUUtilisationThroughKEDA(t *testing.T) {
	t.Parallel() // no latency measured: see "Tests in parallel" in main_test.go
	ns := newNamespace(t, "gpu")
	busy := func(u1, u2 float64) (cluster.SimNode, cluster.SimNode) {
		a := cluster.SimNode{GPUs: 4, Jitter: 0, Pods: []cluster.SimPod{
			{Namespace: ns, Name: "llm-0", Labels: map[string]string{"app": "llm"}, OwnerKind: "Deployment", OwnerName: "llm", GPUs: []string{"0", "1"}, Util: f64p(u1)},
			// Another workload's pod on the same node: not counted.
			{Namespace: ns, Name: "embed-0", Labels: map[string]string{"app": "embed"}, GPUs: []string{"2"}, Util: f64p(99)},
		}}
		b := cluster.SimNode{GPUs: 2, Jitter: 0, Pods: []cluster.SimPod{
			{Namespace: ns, Name: "llm-1", Labels: map[string]string{"app": "llm"}, OwnerKind: "Deployment", OwnerName: "llm", GPUs: []string{"0"}, Util: f64p(u2)},
		}}
		return a, b
	}
	simA, simB := busy(80, 70)
	colA := startCollector(t, "gpu-a-"+ns, simA)
	colB := startCollector(t, "gpu-b-"+ns, simB)

	createDeployment(t, ns, "llm", 0)
	dw := watchDeployments(t, ns, "llm")
	so := createScaledObject(t, fastScaleDown(scaledObject(ns, "llm", "llm", 0, 10, testPolling, testCooldown,
		pushTrigger("podSelector", "app=llm", "gpuUtilTarget", "50", "gpusPerReplica", "1"))))
	kedaHPA(t, so, "s0-gpu-util", "50")

	// The trigger is active: KEDA activates the workload from zero on IsActive, and then
	// the HPA, reading 230 through KEDA's metrics adapter, asks for ⌈230/50⌉ = 5.
	dw.waitFor(t, "llm", 1, 30*time.Second)
	waitCondition(t, ns, "llm", kedav1alpha1.ConditionActive, metav1.ConditionTrue, "", 10*time.Second)
	dw.waitFor(t, "llm", 5, 30*time.Second)

	mc, err := env.KEDA.NewMetricsClient()
	if err != nil {
		t.Fatal(err)
	}
	defer mc.Close()
	// 80 + 80 + 70 over three GPUs, one GPU per replica: 230.
	// KEDA serves s0-gpu-util = 230.
	testkit.Eventually(t, 20*time.Second, metricIs(mc, ns, "llm", "s0-gpu-util", 230))

	t.Log("load changes on both nodes")
	simA, simB = busy(40, 10)
	if err := colA.SetSim(t.Context(), simA); err != nil {
		t.Fatal(err)
	}
	if err := colB.SetSim(t.Context(), simB); err != nil {
		t.Fatal(err)
	}
	// KEDA serves s0-gpu-util = 90.
	testkit.Eventually(t, 20*time.Second, metricIs(mc, ns, "llm", "s0-gpu-util", 90))

	t.Log("the GPUs idle")
	simA, simB = busy(2, 1)
	if err := colA.SetSim(t.Context(), simA); err != nil {
		t.Fatal(err)
	}
	if err := colB.SetSim(t.Context(), simB); err != nil {
		t.Fatal(err)
	}
	// KEDA serves s0-gpu-util = 5.
	testkit.Eventually(t, 20*time.Second, metricIs(mc, ns, "llm", "s0-gpu-util", 5))
	// The HPA's ⌈5/50⌉ = 1; KEDA, with minReplicaCount 0, would scale an inactive trigger
	// to zero after cooldownPeriod (scaleToZeroOrIdle). This one stays active.
	waitReplicas(t, ns, "llm", 1, 30*time.Second)
	consistently(t, time.Duration(2*testCooldown+testPolling)*time.Second, "at 1 replica, never 0, with the GPUs idle", replicasAre(ns, "llm", 1))
	waitCondition(t, ns, "llm", kedav1alpha1.ConditionActive, metav1.ConditionTrue, "", 10*time.Second)
}
