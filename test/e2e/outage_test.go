package e2e

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	kedav1alpha1 "github.com/kedacore/keda/v2/apis/keda/v1alpha1"

	"github.com/gpuscaler/gpuscaler/test/e2e/cluster"
)

// TestWakeAfterProducerOutage measures what a producer outage does to push activation.
// While a trigger's data is missing, gpuscaler answers Unavailable (it must: KEDA would
// otherwise scale to zero), and KEDA, on any trigger error, drops the ScaledObject's
// scalers and with them its share of the pooled gRPC connection to the scaler address.
// When no other trigger shares that connection it is closed under the open
// StreamIsActive stream, and KEDA reopens the stream only after a back-off that doubles
// on each such break (2 s, 4 s, … 1 min) and is reset only by a stream ending cleanly.
// So after an outage spanning a few polls, the next activation may come from KEDA's poll
// rather than from the push. The test asserts the bound KEDA guarantees (one
// pollingInterval) and logs the latencies before and after the outage.
func TestWakeAfterProducerOutage(t *testing.T) {
	const polling = 5 // s
	ns := newNamespace(t, "outage")
	createDeployment(t, ns, "inference", 0)
	// A scaler address of its own ("localhost" rather than 127.0.0.1), so that no other
	// test's ScaledObject shares KEDA's pooled connection.
	trigger := pushTrigger("queue", "requests", "staleAfter", "2s")
	_, port := splitAddr(t, env.Scaler.GRPCAddr)
	trigger.Metadata["scalerAddress"] = "localhost:" + port
	// The producer first: a trigger with no data yet at KEDA's first poll starts with
	// the same broken stream.
	p := startProducer(t, ns, "requests", cluster.Report{})
	createScaledObject(t, scaledObject(ns, "inference", "inference", 0, 4, polling, 1, trigger))
	waitCondition(t, ns, "inference", kedav1alpha1.ConditionReady, metav1.ConditionTrue, "", 30*time.Second)

	wake := func(label string) time.Duration {
		t.Helper()
		dw := watchDeployments(t, ns, "inference")
		start := time.Now()
		p.Set(cluster.Report{Waiting: 1})
		at := dw.waitFor(t, "inference", 1, time.Duration(polling)*time.Second+10*time.Second)
		d := at.Sub(start)
		t.Logf("%s: 0 → 1 replica %s after the publish command started", label, d.Round(time.Millisecond))
		p.Set(cluster.Report{})
		waitInactive(t, ns, "inference", trigger.Metadata)
		setReplicas(t, ns, "inference", 0)
		dw.waitFor(t, "inference", 0, 10*time.Second)
		return d
	}
	before := wake("before the outage")

	t.Logf("the producer stops for %d polls", 3)
	p.Stop()
	waitCondition(t, ns, "inference", kedav1alpha1.ConditionReady, metav1.ConditionFalse, "TriggerError", 30*time.Second)
	outage := time.Now()
	for time.Since(outage) < 3*polling*time.Second {
		consistently(t, time.Second, "at 0 replicas during the outage", replicasAre(ns, "inference", 0))
	}
	t.Log("the producer is back, queue empty")
	p = startProducer(t, ns, "requests", cluster.Report{})
	waitCondition(t, ns, "inference", kedav1alpha1.ConditionReady, metav1.ConditionTrue, "", 30*time.Second)
	after := wake("after the outage")
	if after > 20*before && after > 500*time.Millisecond {
		t.Logf("the first activation after the outage took %s against %s before: KEDA's push stream was still re-connecting, its poll woke the workload", after.Round(time.Millisecond), before.Round(time.Millisecond))
	}
}
