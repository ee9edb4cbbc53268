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
// scalers and with them their share of the pooled gRPC connection to the scaler address.
// When no other trigger shares that connection it is closed under the open
// StreamIsActive stream, and KEDA reopens the stream only after a back-off that doubles
// on each failure (2 s, 4 s, … 1 min) and is reset only by a stream ending cleanly. So
// after an outage spanning a few polls, the next activation comes from KEDA's poll, not
// from the push. With another ScaledObject on the same scaler address the connection
// stays open and push survives.
func TestWakeAfterProducerOutage(t *testing.T) {
	const polling = 5 // s
	for _, tc := range []struct {
		name   string
		shared bool
	}{
		{name: "alone on its connection"},
		{name: "sharing its connection", shared: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ns := newNamespace(t, "outage")
			// A scaler address of its own ("localhost" rather than 127.0.0.1), so that
			// only this test's ScaledObjects share KEDA's pooled connection to it.
			_, port := splitAddr(t, env.Scaler.GRPCAddr)
			addr := "localhost:" + port
			if tc.shared {
				other := pushTrigger("queue", "other")
				other.Metadata["scalerAddress"] = addr
				createDeployment(t, ns, "other", 0)
				startProducer(t, ns, "other", cluster.Report{})
				createScaledObject(t, scaledObject(ns, "other", "other", 0, 4, polling, 1, other))
			}
			// pushInterval 0s: each wake here follows a scale to zero by hand, outside KEDA,
			// so no lastActiveTime and cooldownPeriod stand between the pushes.
			trigger := pushTrigger("queue", "requests", "staleAfter", "2s", "pushInterval", "0s")
			trigger.Metadata["scalerAddress"] = addr
			createDeployment(t, ns, "inference", 0)
			// The producer first: a trigger with no data at KEDA's first poll starts with
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
			wake("before the outage")

			t.Logf("the producer stops for 3 polls")
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
			if tc.shared && after > time.Duration(polling)*time.Second/2 {
				t.Errorf("with the connection shared, the first activation after the outage took %s: push did not survive", after)
			}
		})
	}
}
