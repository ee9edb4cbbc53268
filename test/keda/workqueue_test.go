package keda

import (
	"context"

	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/gpuscaler/gpuscaler/test/testkit"
)

// TestJetStreamWorkQueue checks a stream+consumer trigger through KEDA's scalers: the
// scaler follows a JetStream consumer itself, the backlog KEDA reads is pending + ack
// pending, and the first message on an idle queue is pushed to KEDA's Run as true.
func TestJetStreamWorkQueue(t *testing.T) {
	s := startScaler(t, "--consumer-refresh", "100ms")
	nc, err := nats.Connect(s.natsURL, nats.Name("keda-conformance-producer"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateStream(t.Context(), jetstream.StreamConfig{
		Name: "JOBS", Subjects: []string{"jobs.>"}, Retention: jetstream.WorkQueuePolicy, Storage: jetstream.MemoryStorage,
	}); err != nil {
		t.Fatal(err)
	}
	cons, err := js.CreateOrUpdateConsumer(t.Context(), "JOBS", jetstream.ConsumerConfig{
		Durable: "workers", AckPolicy: jetstream.AckExplicitPolicy, AckWait: time.Minute,
	})
	if err != nil {
		t.Fatal(err)
	}

	tr := trigger{namespace: "ml", name: "trainer", metadata: map[string]string{"stream": "JOBS", "consumer": "workers", "queueTarget": "2"}}
	sc := s.external(t, tr)
	waitBacklog := func(want int64, wantActive bool) {
		t.Helper()
		testkit.Eventually(t, dataTimeout, func(context.Context) error {
			got, active, err := metric(t, sc, "s0-queue-backlog")
			if err != nil {
				return err
			}
			if got != want*1000 || active != wantActive {
				return fmt.Errorf("got backlog %dm active %t, want %dm active %t", got, active, want*1000, wantActive)
			}
			return nil
		})
	}
	waitBacklog(0, false)
	active := s.push(t, tr)
	if got := receive(t, active); got {
		t.Fatalf("first message on an empty work queue: got %t, want false", got)
	}

	published := time.Now()
	if _, err := js.Publish(t.Context(), "jobs.a", []byte("1")); err != nil {
		t.Fatal(err)
	}
	if got := receive(t, active); !got {
		t.Fatalf("after the first message: got %t pushed, want true", got)
	}
	t.Logf("first message published → true from KEDA's Run: %v", time.Since(published))
	waitBacklog(1, true)

	for _, subject := range []string{"jobs.b", "jobs.c"} {
		if _, err := js.Publish(t.Context(), subject, []byte("1")); err != nil {
			t.Fatal(err)
		}
	}
	waitBacklog(3, true) // pending 3
	batch, err := cons.Fetch(1)
	if err != nil {
		t.Fatal(err)
	}
	var taken jetstream.Msg
	for m := range batch.Messages() {
		taken = m
	}
	if taken == nil {
		t.Fatalf("fetched no message: %v", batch.Error())
	}
	// A message taken and not yet acknowledged still counts (ack pending), as in KEDA's
	// nats-jetstream scaler: with one more published, pending 3 + ack pending 1.
	if _, err := js.Publish(t.Context(), "jobs.d", []byte("1")); err != nil {
		t.Fatal(err)
	}
	waitBacklog(4, true)
	if err := taken.Ack(); err != nil {
		t.Fatal(err)
	}
	waitBacklog(3, true)
}
