package e2e

import (
	"context"
	"errors"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/gpuscaler/gpuscaler/test/e2e/cluster"
	"github.com/gpuscaler/gpuscaler/test/testkit"
)

// TestTenantJetStream runs a tenant's JetStream work queue on the bus as the chart
// installs it with nats.auth.kubernetes.jetStreamNamespaces: team-a's workload, with
// its projected ServiceAccount token, keeps stream TRAINING and consumer trainers in its
// namespace's own account; the real `gpuscaler scaler`, on the same bus with its own
// token, answers team-a's stream+consumer trigger with the consumer's backlog through the
// consumer info it imports from that account. Team b (also listed) and team c (not)
// name the same stream and get no data, as for a stream that does not exist; team b's
// workload does not see it. Team a's queue reports still reach the scaler from its
// account, and are acked.
func TestTenantJetStream(t *testing.T) {
	ctx := t.Context()
	b := startCalloutBusWith(t, true)
	g := cluster.NewGpuscaler(env.Procs, env.G.Bin, b.NATS.URL, b.dir)
	s, err := g.StartScaler(ctx, "--nats-token-file="+b.scalerToken, "--jetstream-namespaces="+strings.Join(b.jetStreamNamespaces, ","))
	if err != nil {
		t.Fatalf("the scaler cannot run on the callout bus: %v", err)
	}
	t.Cleanup(s.Stop)

	// Team a's setup and workers, as examples/training-queue's Job and trainers do.
	nc, _ := connect(t, b.NATS.URL, nats.Token(tokenFor(t, b.teamA, "inference", natsAudience, b.producerPod)))
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	stream, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "TRAINING", Subjects: []string{"training.jobs"}, Retention: jetstream.WorkQueuePolicy})
	if err != nil {
		t.Fatalf("team-a cannot create its work queue in its own account: %v", err)
	}
	cons, err := stream.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "trainers", AckPolicy: jetstream.AckExplicitPolicy, FilterSubject: "training.jobs"})
	if err != nil {
		t.Fatal(err)
	}
	for range 4 {
		if _, err := js.Publish(ctx, "training.jobs", []byte(`{"run":"x"}`)); err != nil {
			t.Fatal(err)
		}
	}
	trigger := map[string]string{"stream": "TRAINING", "consumer": "trainers"}
	backlog := func(t *testing.T, want float64) {
		t.Helper()
		testkit.Eventually(t, 15*time.Second, func(ctx context.Context) error {
			v, err := s.Metric(ctx, b.teamA, "trainer", trigger, "queue-backlog")
			return testkit.Check(err == nil && v == want, "team-a's backlog: %v %v, want %v", v, err, want)
		})
	}

	t.Run("the scaler answers the tenant's trigger with its backlog", func(t *testing.T) {
		backlog(t, 4)
		// A trainer takes one and acks it: the backlog follows.
		batch, err := cons.Fetch(1, jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		for m := range batch.Messages() {
			if err := m.Ack(); err != nil {
				t.Fatal(err)
			}
		}
		backlog(t, 3)
	})
	t.Run("its queue reports still reach the scaler", func(t *testing.T) {
		// gpuscaler publish waits for the stream's ack: the report crosses to the
		// scaler's account through the namespace's import, and the ack comes back.
		out, err := exec.CommandContext(ctx, env.G.Bin, "publish", "queue", "--nats-url="+b.NATS.URL, "--nats-token-file="+b.teamAToken,
			"--namespace="+b.teamA, "--queue=jobs", "--waiting=2", "--timeout=5s").CombinedOutput()
		if err != nil {
			t.Fatalf("gpuscaler publish from team-a's account: %v\n%s", err, out)
		}
		testkit.Eventually(t, 10*time.Second, func(ctx context.Context) error {
			v, err := s.Metric(ctx, b.teamA, "app", map[string]string{"queue": "jobs"}, "queue-backlog")
			return testkit.Check(err == nil && v == 2, "team-a's queue: %v %v, want 2", v, err)
		})
	})
	t.Run("another namespace naming the same stream gets no data", func(t *testing.T) {
		for _, ns := range []string{b.teamB, b.teamC} {
			v, err := s.Metric(ctx, ns, "trainer", trigger, "queue-backlog")
			if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), `JetStream stream "TRAINING" not found`) {
				t.Errorf("%s's trigger for TRAINING: %v %v, want Unavailable, stream not found", ns, v, err)
			}
		}
	})
	t.Run("another tenant's workload does not see it", func(t *testing.T) {
		other, _ := connect(t, b.NATS.URL, nats.Token(tokenFor(t, b.teamB, "inference", natsAudience, nil)))
		ojs, err := jetstream.New(other)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := ojs.Stream(ctx, "TRAINING"); !errors.Is(err, jetstream.ErrStreamNotFound) {
			t.Fatalf("team-b looked up team-a's stream: %v, want not found", err)
		}
		if err := ojs.DeleteStream(ctx, "TRAINING"); !errors.Is(err, jetstream.ErrStreamNotFound) {
			t.Fatalf("team-b deleted team-a's stream: %v, want not found", err)
		}
		// Its own queue subjects go to the scaler; team-a's do not leave its account.
		if err := other.Publish("gpuscaler.v1.queue."+b.teamA+".forged.p", []byte("forged")); err != nil {
			t.Fatal(err)
		}
		other.Flush()
		backlog(t, 3)
		consistently(t, 2*time.Second, "team-a's queue forged stays unknown", func(ctx context.Context) error {
			_, err := s.Metric(ctx, b.teamA, "app", map[string]string{"queue": "forged"}, "queue-backlog")
			return testkit.Check(err != nil, "%v", err)
		})
	})
}
