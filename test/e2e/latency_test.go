package e2e

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	kedav1alpha1 "github.com/kedacore/keda/v2/apis/keda/v1alpha1"

	"github.com/gpuscaler/gpuscaler/test/e2e/cluster"

	"github.com/gpuscaler/gpuscaler/test/testkit"
)

// TestWakeLatency measures the time from an event to KEDA setting the Deployment's
// spec.replicas to 1, as the API server's watch delivers it, for three ScaledObjects at
// KEDA's default pollingInterval (30 s) in the same run:
//
//   - gpuscaler external-push on a producer's queue: the event is the QueueReport going
//     from 0 to 1 waiting, timed when NATS delivers it to a subscriber beside the scaler;
//   - gpuscaler external-push on a JetStream stream and consumer: the event is a message
//     stored in the stream (its publish acknowledged);
//   - KEDA's built-in nats-jetstream trigger on the same stream and consumer, which reads
//     the NATS server's /jsz every pollingInterval.
//
// Between runs the backlog is drained and the Deployment set back to 0 by hand; scale-in
// to zero is covered by the scenario tests. The push runs take well under a second each;
// a polled run takes 30 s on average, so it runs fewer times (GPUSCALER_E2E_POLL_RUNS,
// default 4), each after a random pause of up to one pollingInterval so that the events
// fall at random points of KEDA's polling cycle, as real ones do.
func TestWakeLatency(t *testing.T) {
	pushRuns := envInt(t, "GPUSCALER_E2E_PUSH_RUNS", 12)
	pollRuns := envInt(t, "GPUSCALER_E2E_POLL_RUNS", 4)
	ns := newNamespace(t, "latency")
	js, stream, cons := newWorkQueue(t, ns)
	// The producer is up and its queue empty before KEDA first polls it: a trigger with no
	// data at KEDA's first poll starts with its push stream broken (see
	// TestWakeAfterProducerOutage).
	p := startProducer(t, ns, "bench", cluster.Report{})
	for _, d := range []string{"push-queue", "push-stream", "keda-jetstream"} {
		createDeployment(t, ns, d, 0)
	}
	// pollingInterval left at KEDA's default, 30 s, for all three. pushInterval 0s: each
	// run starts from a scale to zero by hand, outside KEDA, seconds after the last push.
	createScaledObject(t, scaledObject(ns, "push-queue", "push-queue", 0, 4, 0, 1, pushTrigger("queue", "bench", "pushInterval", "0s")))
	createScaledObject(t, scaledObject(ns, "push-stream", "push-stream", 0, 4, 0, 1, pushTrigger("stream", stream, "consumer", cons, "pushInterval", "0s")))
	createScaledObject(t, scaledObject(ns, "keda-jetstream", "keda-jetstream", 0, 4, 0, 1, kedav1alpha1.ScaleTriggers{
		Type: "nats-jetstream",
		Metadata: map[string]string{
			"natsServerMonitoringEndpoint": env.NATS.MonitorAddr,
			"account":                      "$G",
			"stream":                       stream,
			"consumer":                     cons,
			"lagThreshold":                 "1",
			"activationLagThreshold":       "0",
		},
	}))

	queueMeta := scalerMetadata("queue", "bench", "pushInterval", "0s")
	streamMeta := scalerMetadata("stream", stream, "consumer", cons, "pushInterval", "0s")
	waitInactive(t, ns, "push-queue", queueMeta)
	waitInactive(t, ns, "push-stream", streamMeta)

	nc, err := nats.Connect(env.NATS.URL, nats.Name("gpuscaler-e2e-latency"))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	reports, err := nc.SubscribeSync(fmt.Sprintf("gpuscaler.v1.queue.%s.bench.*", ns))
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}

	var queueLat, streamLat, kedaLat []time.Duration
	dw := watchDeployments(t, ns, "push-queue", "push-stream", "keda-jetstream")

	t.Logf("push, producer queue: %d runs", pushRuns)
	for i := range pushRuns {
		spaceRuns(t)
		// The event is the first report with work that NATS delivers after the change.
		dropPending(t, reports)
		published := make(chan error, 1)
		go func() { published <- p.SetErr(cluster.Report{Waiting: 1, Arrivals: 1}) }()
		event := nextReportWithWork(t, reports)
		if err := <-published; err != nil {
			t.Fatal(err)
		}
		woke := dw.waitFor(t, "push-queue", 1, 30*time.Second)
		queueLat = append(queueLat, woke.Sub(event))
		t.Logf("  run %2d: %s", i+1, woke.Sub(event).Round(100*time.Microsecond))
		p.Set(cluster.Report{})
		waitInactive(t, ns, "push-queue", queueMeta)
		setReplicas(t, ns, "push-queue", 0)
		dw.waitFor(t, "push-queue", 0, 10*time.Second)
	}

	t.Logf("push, JetStream stream+consumer: %d runs", pushRuns)
	for i := range pushRuns {
		spaceRuns(t)
		if _, err := js.Publish(t.Context(), subjectOf(ns), []byte("job")); err != nil {
			t.Fatal(err)
		}
		event := time.Now()
		woke := dw.waitFor(t, "push-stream", 1, 30*time.Second)
		streamLat = append(streamLat, woke.Sub(event))
		t.Logf("  run %2d: %s", i+1, woke.Sub(event).Round(100*time.Microsecond))
		drain(t, js, stream, cons, 1)
		waitInactive(t, ns, "push-stream", streamMeta)
		setReplicas(t, ns, "push-stream", 0)
		dw.waitFor(t, "push-stream", 0, 10*time.Second)
		// KEDA's own trigger saw at most a few of these short-lived messages; put it back.
		if n, _ := replicas(t.Context(), ns, "keda-jetstream"); n != 0 {
			setReplicas(t, ns, "keda-jetstream", 0)
			dw.waitFor(t, "keda-jetstream", 0, 10*time.Second)
		}
	}

	t.Logf("KEDA nats-jetstream (pollingInterval 30 s) beside gpuscaler push on the same stream: %d runs", pollRuns)
	for i := range pollRuns {
		pause := rand.N(30 * time.Second)
		t.Logf("  run %d: publishing after a random %s", i+1, pause.Round(time.Millisecond))
		select {
		case <-time.After(pause): // de-phase from KEDA's polling cycle; waits for no state
		case <-t.Context().Done():
			t.Fatal(t.Context().Err())
		}
		// Both at 0 and nothing stale in the watch: the next changes are this run's.
		for _, d := range []string{"push-stream", "keda-jetstream"} {
			if n, err := replicas(t.Context(), ns, d); err != nil {
				t.Fatal(err)
			} else if n != 0 {
				// KEDA's poll caught a message of an earlier run: put it back.
				setReplicas(t, ns, d, 0)
				waitReplicas(t, ns, d, 0, 10*time.Second)
			}
		}
		dw.discard()
		if _, err := js.Publish(t.Context(), subjectOf(ns), []byte("job")); err != nil {
			t.Fatal(err)
		}
		event := time.Now()
		var pushAt, kedaAt time.Time
		for pushAt.IsZero() || kedaAt.IsZero() {
			select {
			case ev, ok := <-dw.events:
				if !ok {
					t.Fatal("Deployment watch ended")
				}
				switch {
				case ev.replicas != 1:
				case ev.name == "push-stream":
					pushAt = ev.at
				case ev.name == "keda-jetstream":
					kedaAt = ev.at
				}
			case <-time.After(90 * time.Second):
				t.Fatalf("no wake-up within 90 s (push %v, nats-jetstream %v)", !pushAt.IsZero(), !kedaAt.IsZero())
			}
		}
		streamLat = append(streamLat, pushAt.Sub(event))
		kedaLat = append(kedaLat, kedaAt.Sub(event))
		t.Logf("  run %d: gpuscaler push %s, KEDA nats-jetstream %s", i+1,
			pushAt.Sub(event).Round(100*time.Microsecond), kedaAt.Sub(event).Round(time.Millisecond))
		drain(t, js, stream, cons, 1)
		waitInactive(t, ns, "push-stream", streamMeta)
		setReplicas(t, ns, "push-stream", 0)
		setReplicas(t, ns, "keda-jetstream", 0)
		dw.waitFor(t, "push-stream", 0, 10*time.Second)
		if n, _ := replicas(t.Context(), ns, "keda-jetstream"); n != 0 {
			dw.waitFor(t, "keda-jetstream", 0, 10*time.Second)
		}
	}

	var b strings.Builder
	fmt.Fprintf(&b, "\nwake-up latency: event → Deployment spec.replicas 1 (API watch), KEDA v2.21.0 pollingInterval 30 s for all:\n")
	fmt.Fprintf(&b, "  %-58s %s\n", "gpuscaler external-push, producer queue (QueueReport)", summary(queueLat))
	fmt.Fprintf(&b, "  %-58s %s\n", "gpuscaler external-push, JetStream stream+consumer", summary(streamLat))
	fmt.Fprintf(&b, "  %-58s %s\n", "KEDA nats-jetstream, same stream+consumer", summary(kedaLat))
	t.Log(b.String())
	fmt.Fprint(os.Stderr, b.String())
}

// waitInactive waits until gpuscaler answers IsActive false for the trigger: the scaler
// has applied the drained backlog, so a KEDA poll cannot wake the workload again.
func waitInactive(t *testing.T, ns, so string, meta map[string]string) {
	t.Helper()
	waitActivity(t, ns, so, meta, false)
}

// waitActivity waits for the scaler to answer IsActive for ns/so with want.
func waitActivity(t *testing.T, ns, so string, meta map[string]string, want bool) {
	t.Helper()
	testkit.Eventually(t, 20*time.Second, func(ctx context.Context) error {
		active, err := scalerFor(meta).IsActive(ctx, ns, so, meta)
		if err != nil {
			return err
		}
		return testkit.Check(active == want, "gpuscaler says %s/%s is active: %v, want %v", ns, so, active, want)
	})
}

func summary(ds []time.Duration) string {
	if len(ds) == 0 {
		return "n=0"
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	round := func(d time.Duration) time.Duration {
		if d > time.Second {
			return d.Round(10 * time.Millisecond)
		}
		return d.Round(100 * time.Microsecond)
	}
	return fmt.Sprintf("n=%-3d p50 %-10s max %s", len(s), round(s[(len(s)-1)/2]), round(s[len(s)-1]))
}

func envInt(t *testing.T, name string, def int) int {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 {
		t.Fatalf("%s=%q: want a count", name, v)
	}
	return n
}

// scalerFor returns the scaler a trigger's scalerAddress names.
func scalerFor(meta map[string]string) *cluster.Scaler {
	if env.Embedded != nil && meta["scalerAddress"] == env.Embedded.GRPCAddr {
		return env.Embedded
	}
	return env.Scaler
}

// spaceRuns pauses 0.5 to 1.5 s between push runs. Back to back, each run's API calls
// (KEDA reads and writes the scale subresource, patches the ScaledObject's status and
// records an event) come faster than the operator's client-side rate limit (--kube-api-qps
// 20, burst 30) refills, and after a few runs the measure would be that limit's queue
// rather than the wake-up; real wake-ups are not that frequent.
func spaceRuns(t *testing.T) {
	t.Helper()
	select {
	case <-time.After(500*time.Millisecond + rand.N(time.Second)): // waits for no state
	case <-t.Context().Done():
		t.Fatal(t.Context().Err())
	}
}
