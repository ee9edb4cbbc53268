package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	kedav1alpha1 "github.com/kedacore/keda/v2/apis/keda/v1alpha1"

	"github.com/gpuscaler/gpuscaler/test/e2e/cluster"
)

// Short KEDA periods keep each scenario to seconds. Activation from zero never waits
// for pollingInterval (it is pushed); scale-in to zero does, plus cooldownPeriod.
const (
	testPolling  = 1 // s
	testCooldown = 3 // s
)

// (a) A ScaledObject with an external-push trigger on a producer's queue sits at 0
// replicas while the queue has never reported and while it is empty; the first report
// with work wakes it to 1 replica; once the backlog is gone KEDA scales it to 0 again,
// after cooldownPeriod and not before. It runs against the scaler on a NATS server and
// against one with its embedded NATS server, the default of `gpuscaler scaler`.
func TestQueueScalesFromAndToZero(t *testing.T) {
	for _, b := range backends() {
		t.Run(b.name, func(t *testing.T) { queueScalesFromAndToZero(t, b) })
	}
}

func queueScalesFromAndToZero(t *testing.T, b backend) {
	ns := newNamespace(t, "queue")
	createDeployment(t, ns, "inference", 0)
	so := createScaledObject(t, scaledObject(ns, "inference", "inference", 0, 4, testPolling, testCooldown,
		b.pushTrigger("queue", "requests", "queueTarget", "2")))
	if got, want := fmt.Sprint(so.Status.ExternalMetricNames), "[s0-queue-backlog]"; got != want {
		t.Errorf("status.externalMetricNames %s, want %s", got, want)
	}
	kedaHPA(t, so, "s0-queue-backlog", "2")

	// No report yet: missing data is an error, never a reason to scale.
	consistently(t, 2*time.Second, "at 0 replicas before any report", replicasAre(ns, "inference", 0))

	dw := watchDeployments(t, ns, "inference")
	// 2 waiting at queueTarget 2: the HPA, now running, keeps ⌈2/2⌉ = 1 replica, so
	// what this test sees between 0 and 1 is KEDA's own doing.
	t.Log("first QueueReport: 2 waiting")
	sent := time.Now()
	p := startProducerOn(t, b.g, ns, "requests", cluster.Report{Waiting: 2, Arrivals: 2})
	woke := dw.waitFor(t, "inference", 1, 30*time.Second)
	// Until this report every KEDA poll got Unavailable, which breaks KEDA's push stream
	// (see TestWakeAfterProducerOutage): this wake-up comes from the next poll.
	t.Logf("0 → 1 replica %s after the publish command started", woke.Sub(sent).Round(time.Millisecond))
	waitCondition(t, ns, "inference", kedav1alpha1.ConditionActive, metav1.ConditionTrue, "", 10*time.Second)

	// Beyond 1 replica it is the HPA's job (TestLoopQueueZeroToNToZero); KEDA leaves 1
	// as it is while active, and the HPA's ⌈2/2⌉ is 1.
	consistently(t, 2*time.Second, "held at 1 replica while the backlog lasts", replicasAre(ns, "inference", 1))

	t.Log("backlog gone: 0 waiting, 0 in flight")
	p.Set(cluster.Report{})
	drained := time.Now()
	// KEDA scales to zero only once cooldownPeriod has passed since the trigger was last
	// active; the last active poll was at most one pollingInterval before the drain.
	hold := time.Duration(testCooldown-testPolling)*time.Second - 500*time.Millisecond
	consistently(t, hold, "held at 1 replica during cooldownPeriod", replicasAre(ns, "inference", 1))
	zero := dw.waitFor(t, "inference", 0, time.Duration(testCooldown+testPolling)*time.Second+20*time.Second)
	t.Logf("1 → 0 replicas %s after the backlog was reported gone (cooldownPeriod %ds, pollingInterval %ds)",
		zero.Sub(drained).Round(time.Millisecond), testCooldown, testPolling)
	waitCondition(t, ns, "inference", kedav1alpha1.ConditionActive, metav1.ConditionFalse, "", 10*time.Second)
	waitCondition(t, ns, "inference", kedav1alpha1.ConditionReady, metav1.ConditionTrue, "", 10*time.Second)
}

// (b) The same with a JetStream work queue: the trigger names a stream and a consumer, the
// scaler follows the consumer itself, and publishing one message to the stream wakes the
// workload; acknowledging it lets KEDA scale back to zero.
func TestJetStreamQueueScalesFromAndToZero(t *testing.T) {
	ns := newNamespace(t, "jetstream")
	js, stream, cons := newWorkQueue(t, ns)
	createDeployment(t, ns, "trainer", 0)
	createScaledObject(t, scaledObject(ns, "trainer", "trainer", 0, 4, testPolling, testCooldown,
		pushTrigger("stream", stream, "consumer", cons)))

	consistently(t, 2*time.Second, "at 0 replicas while the work queue is empty", replicasAre(ns, "trainer", 0))
	waitCondition(t, ns, "trainer", kedav1alpha1.ConditionReady, metav1.ConditionTrue, "", 10*time.Second)

	dw := watchDeployments(t, ns, "trainer")
	ack, err := js.Publish(t.Context(), subjectOf(ns), []byte("job-1"))
	if err != nil {
		t.Fatal(err)
	}
	stored := time.Now()
	woke := dw.waitFor(t, "trainer", 1, 30*time.Second)
	t.Logf("0 → 1 replica %s after the message was stored (stream seq %d)", woke.Sub(stored).Round(time.Millisecond), ack.Sequence)

	consistently(t, 2*time.Second, "held at 1 replica while the message waits", replicasAre(ns, "trainer", 1))

	// A worker takes the message and acknowledges it: the backlog (pending + ack pending)
	// is 0.
	drain(t, js, stream, cons, 1)
	drained := time.Now()
	zero := dw.waitFor(t, "trainer", 0, time.Duration(testCooldown+testPolling)*time.Second+20*time.Second)
	if d := zero.Sub(drained); d < time.Duration(testCooldown-testPolling)*time.Second {
		t.Errorf("scaled to 0 %s after the drain, before cooldownPeriod %ds", d, testCooldown)
	}
	t.Logf("1 → 0 replicas %s after the message was acknowledged", zero.Sub(drained).Round(time.Millisecond))
}

// newWorkQueue creates a JetStream work-queue stream on jobs.<ns> and a durable pull
// consumer, and returns a JetStream handle with their names.
func newWorkQueue(t *testing.T, ns string) (jetstream.JetStream, string, string) {
	t.Helper()
	nc, err := nats.Connect(env.NATS.URL, nats.Name("gpuscaler-e2e"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	stream := "JOBS_" + sanitize(ns)
	s, err := js.CreateStream(t.Context(), jetstream.StreamConfig{
		Name:      stream,
		Subjects:  []string{subjectOf(ns)},
		Retention: jetstream.WorkQueuePolicy,
		Storage:   jetstream.MemoryStorage,
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.CreateOrUpdateConsumer(t.Context(), jetstream.ConsumerConfig{
		Durable:   "workers",
		AckPolicy: jetstream.AckExplicitPolicy,
		AckWait:   time.Minute,
	}); err != nil {
		t.Fatal(err)
	}
	return js, stream, "workers"
}

func subjectOf(ns string) string { return "jobs." + ns }

func sanitize(s string) string {
	b := []byte(s)
	for i, c := range b {
		if c == '-' || c == '.' {
			b[i] = '_'
		}
	}
	return string(b)
}

// drain fetches n messages from the consumer and acknowledges each, as a worker would.
func drain(t *testing.T, js jetstream.JetStream, stream, cons string, n int) {
	t.Helper()
	c, err := js.Consumer(t.Context(), stream, cons)
	if err != nil {
		t.Fatal(err)
	}
	for got := 0; got < n; {
		batch, err := c.Fetch(n-got, jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		for m := range batch.Messages() {
			ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
			err := m.DoubleAck(ctx)
			cancel()
			if err != nil {
				t.Fatal(err)
			}
			got++
		}
		if err := batch.Error(); err != nil {
			t.Fatal(err)
		}
	}
}
