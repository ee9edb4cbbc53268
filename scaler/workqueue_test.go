package scaler

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gpuscaler/gpuscaler/internal/natstest"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/grpc/codes"

	"github.com/gpuscaler/gpuscaler/internal/testkit"
	pb "github.com/gpuscaler/gpuscaler/proto/externalscaler"
)

// makeWorkQueue makes a JetStream work queue WORK on work.> with a durable pull consumer
// "workers", as a training platform would.
func makeWorkQueue(t *testing.T, js jetstream.JetStream) jetstream.Consumer {
	t.Helper()
	if _, err := js.CreateStream(t.Context(), jetstream.StreamConfig{
		Name: "WORK", Subjects: []string{"work.>"}, Retention: jetstream.WorkQueuePolicy,
	}); err != nil {
		t.Fatal(err)
	}
	cons, err := js.CreateConsumer(t.Context(), "WORK", jetstream.ConsumerConfig{
		Durable: "workers", AckPolicy: jetstream.AckExplicitPolicy, AckWait: time.Minute,
	})
	if err != nil {
		t.Fatal(err)
	}
	return cons
}

func publishWork(t *testing.T, js jetstream.JetStream, n int) {
	t.Helper()
	for i := range n {
		if _, err := js.Publish(t.Context(), "work.train", []byte("job-"+itoa(i))); err != nil {
			t.Fatal(err)
		}
	}
}

func backlogOf(t *testing.T, s *testScaler, r *pb.ScaledObjectRef) (float64, error) {
	t.Helper()
	resp, err := s.client.GetMetrics(t.Context(), &pb.GetMetricsRequest{ScaledObjectRef: r, MetricName: MetricQueueBacklog})
	if err != nil {
		return 0, err
	}
	return resp.GetMetricValues()[0].GetMetricValueFloat(), nil
}

// TestWorkQueueBacklog: N messages give a backlog of N; fetched but unacknowledged ones
// still count (ack pending), acknowledged ones do not, as KEDA's nats-jetstream scaler counts.
func TestWorkQueueBacklog(t *testing.T) {
	ns := natstest.Start(t, "", "")
	s := startScaler(t, ns.ClientURL(), Config{ConsumerRefresh: 50 * time.Millisecond})
	pub := newPublisher(t, ns.ClientURL())
	cons := makeWorkQueue(t, pub.js)
	r := ref("ml", "trainer", map[string]string{"stream": "WORK", "consumer": "workers", "queueTarget": "2"})
	want := func(n float64) {
		t.Helper()
		testkit.Eventually(t, 5*time.Second, func() bool { v, err := backlogOf(t, s, r); return err == nil && v == n })
	}

	want(0)
	publishWork(t, pub.js, 5)
	want(5)

	batch, err := cons.Fetch(2)
	if err != nil {
		t.Fatal(err)
	}
	var msgs []jetstream.Msg
	for m := range batch.Messages() {
		msgs = append(msgs, m)
	}
	if len(msgs) != 2 {
		t.Fatalf("fetched %d messages, want 2", len(msgs))
	}
	want(5) // 3 pending + 2 ack pending: being worked on is still backlog
	for _, m := range msgs {
		if err := m.DoubleAck(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	want(3)

	spec, err := s.client.GetMetricSpec(t.Context(), r)
	if err != nil || spec.GetMetricSpecs()[0].GetMetricName() != MetricQueueBacklog || spec.GetMetricSpecs()[0].GetTargetSizeFloat() != 2 {
		t.Fatalf("GetMetricSpec = %v, %v; want queue-backlog with target 2", spec, err)
	}
}

// TestWorkQueueFirstMessageWakes: a trigger idle on an empty consumer becomes active on
// the first message at once, through a subscription, not at the next consumer refresh
// (an hour away here).
func TestWorkQueueFirstMessageWakes(t *testing.T) {
	ns := natstest.Start(t, "", "")
	s := startScaler(t, ns.ClientURL(), Config{ConsumerRefresh: time.Hour})
	pub := newPublisher(t, ns.ClientURL())
	makeWorkQueue(t, pub.js)
	r := ref("ml", "inference", map[string]string{"stream": "WORK", "consumer": "workers"})

	stream, err := s.client.StreamIsActive(t.Context(), r)
	if err != nil {
		t.Fatal(err)
	}
	msgs, _ := recvAll(stream)
	expectMsg(t, msgs, false)
	publishWork(t, pub.js, 1)
	expectMsg(t, msgs, true)
	if v, err := backlogOf(t, s, r); err != nil || v != 1 {
		t.Fatalf("backlog = %v, %v; want 1 from the message seen", v, err)
	}
}

func TestWorkQueueMissing(t *testing.T) {
	ns := natstest.Start(t, "", "")
	s := startScaler(t, ns.ClientURL(), Config{ConsumerRefresh: 50 * time.Millisecond})
	pub := newPublisher(t, ns.ClientURL())

	_, err := s.client.IsActive(t.Context(), ref("ml", "x", map[string]string{"stream": "NOPE", "consumer": "workers"}))
	wantCode(t, err, codes.Unavailable, `JetStream stream "NOPE" not found`)

	makeWorkQueue(t, pub.js)
	r := ref("ml", "x", map[string]string{"stream": "WORK", "consumer": "absent"})
	_, err = backlogOf(t, s, r)
	wantCode(t, err, codes.Unavailable, `JetStream consumer "absent" not found on stream "WORK"`)

	// A consumer deleted while followed is reported at once, not after staleAfter.
	r = ref("ml", "x", map[string]string{"stream": "WORK", "consumer": "workers"})
	if _, err := backlogOf(t, s, r); err != nil {
		t.Fatal(err)
	}
	if err := pub.js.DeleteConsumer(t.Context(), "WORK", "workers"); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 5*time.Second, func() bool {
		_, err := backlogOf(t, s, r)
		return err != nil && strings.Contains(err.Error(), `consumer "workers" not found`)
	})
}

// TestWorkQueueInfoFetchedOncePerRefresh: however many triggers share a consumer and
// however often KEDA asks, its info is fetched at most once per refresh.
func TestWorkQueueInfoFetchedOncePerRefresh(t *testing.T) {
	const refresh = 200 * time.Millisecond
	ns := natstest.Start(t, "", "")
	s := startScaler(t, ns.ClientURL(), Config{ConsumerRefresh: refresh})
	pub := newPublisher(t, ns.ClientURL())
	makeWorkQueue(t, pub.js)
	publishWork(t, pub.js, 3)

	var requests atomic.Int64
	spy := natstest.Connect(t, ns.ClientURL())
	sub, err := spy.Subscribe("$JS.API.CONSUMER.INFO.WORK.workers", func(*nats.Msg) { requests.Add(1) })
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := spy.Flush(); err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
	defer cancel()
	start, calls := time.Now(), 0
	for ctx.Err() == nil {
		for i := range 20 { // 20 ScaledObjects on one consumer
			if _, err := backlogOf(t, s, ref("ml", "so-"+itoa(i), map[string]string{"stream": "WORK", "consumer": "workers"})); err != nil {
				t.Fatal(err)
			}
			calls++
		}
	}
	elapsed := time.Since(start)
	allowed := int64(elapsed/refresh) + 2 // the first fetch, and one tick of slack
	if got := requests.Load(); got > allowed || got == 0 {
		t.Fatalf("%d consumer info requests in %s for %d GetMetrics calls, want between 1 and %d (one per %s)",
			got, elapsed.Round(time.Millisecond), calls, allowed, refresh)
	}
}

// TestWorkQueueCapacity: capacity caps a stream backlog with its ack-pending part as
// what is running.
func TestWorkQueueCapacity(t *testing.T) {
	ns := natstest.Start(t, "", "")
	s := startScaler(t, ns.ClientURL(), Config{ConsumerRefresh: 50 * time.Millisecond})
	pub := newPublisher(t, ns.ClientURL())
	cons := makeWorkQueue(t, pub.js)
	publishWork(t, pub.js, 10)
	if _, err := cons.Fetch(1); err != nil { // one job running: 9 pending + 1 ack pending
		t.Fatal(err)
	}
	pub.node(capacityNode("a1", nil, 8, 5, nil, false).Node) // 3 GPUs free

	r := ref("ml", "trainer", map[string]string{"stream": "WORK", "consumer": "workers", "capacityAware": "true"})
	testkit.Eventually(t, 5*time.Second, func() bool { v, err := backlogOf(t, s, r); return err == nil && v == 1+3 })
}
