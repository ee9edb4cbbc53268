package scaler

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gpuscaler/gpuscaler/internal/natstest"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/gpuscaler/gpuscaler/proto/externalscaler"
	gpuscalerv1 "github.com/gpuscaler/gpuscaler/proto/gpuscaler/v1"
	"github.com/gpuscaler/gpuscaler/test/testkit"
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

// TestWorkQueueCombinedTriggerPushesOnce: a stream+consumer trigger with a podSelector
// whose pods are busy stays active while the consumer is empty, so the consumer's
// fetches, empty each time, push nothing. Once the pods are idle too, an empty fetch is a
// dip of the whole trigger, and the first new message is pushed.
func TestWorkQueueCombinedTriggerPushesOnce(t *testing.T) {
	ns := natstest.Start(t, "", "")
	s := startScaler(t, ns.ClientURL(), Config{ConsumerRefresh: 10 * time.Millisecond})
	pub := newPublisher(t, ns.ClientURL())
	makeWorkQueue(t, pub.js)
	llm := map[string]string{"app": "llm"}
	busy := &gpuscalerv1.NodeReport{Node: "n1", Source: "sim", Gpus: []*gpuscalerv1.GPUSample{gpu("GPU-1", "ml", "llm-0", llm, 90, 60, 80)}}
	idle := &gpuscalerv1.NodeReport{Node: "n1", Source: "sim", Gpus: []*gpuscalerv1.GPUSample{gpu("GPU-1", "ml", "llm-0", llm, 0, 60, 80)}}
	applied := func(r *gpuscalerv1.NodeReport) {
		t.Helper()
		before := s.State().Applied()
		pub.node(r)
		testkit.Eventually(t, 5*time.Second, func() bool { return s.State().Applied() > before })
	}
	applied(busy)

	var fetches atomic.Int64
	spy := natstest.Connect(t, ns.ClientURL())
	sub, err := spy.Subscribe("$JS.API.CONSUMER.INFO.WORK.workers", func(*nats.Msg) { fetches.Add(1) })
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := spy.Flush(); err != nil {
		t.Fatal(err)
	}
	// waitFetches waits until n more fetches have begun: the one before the last has then
	// been recorded and its watchers woken.
	waitFetches := func(n int64) {
		t.Helper()
		from := fetches.Load()
		testkit.Eventually(t, 5*time.Second, func() bool { return fetches.Load() >= from+n })
	}

	stream, err := s.client.StreamIsActive(t.Context(), ref("ml", "inference", map[string]string{
		"stream": "WORK", "consumer": "workers", "podSelector": "app=llm", "gpuUtilTarget": "60", "activationGpuUtil": "10", "pushInterval": "0s"}))
	if err != nil {
		t.Fatal(err)
	}
	msgs, _ := recvAll(stream)
	expectMsg(t, msgs, true) // the pods are busy: active when opened
	waitFetches(30)          // fetches of an empty consumer
	applied(idle)
	waitFetches(2) // a fetch since the pods went idle: the whole trigger is inactive
	publishWork(t, pub.js, 1)
	expectOnePush(t, s, msgs, "the message after the pods went idle")
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

	r := ref("ml", "trainer", map[string]string{"stream": "WORK", "consumer": "workers", "capacityAware": "true", "gpusPerReplica": "1"})
	testkit.Eventually(t, 5*time.Second, func() bool { v, err := backlogOf(t, s, r); return err == nil && v == 1+3 })
}

// TestWorkQueueFollowLimit: a flood of triggers naming made-up streams and consumers
// starts at most --max-followed-consumers followers; the rest are refused with
// ResourceExhausted naming the stream, the consumer, the limit and the flag, while a
// consumer already followed keeps answering. A consumer no trigger reads any more falls
// idle and frees its place.
func TestWorkQueueFollowLimit(t *testing.T) {
	const limit, flood = 10, 300
	var offset atomic.Int64
	now := func() time.Time { return time.Now().Add(time.Duration(offset.Load())) }
	ns := natstest.Start(t, "", "")
	s, logs := startScalerLogging(t, ns.ClientURL(), Config{
		MaxFollowedConsumers: limit, ConsumerRefresh: 50 * time.Millisecond, consumerIdleAfter: time.Minute,
		// The watchdog would measure the clock's offset as skew and correct it away.
		Now: now, streamCheckEvery: time.Hour,
	})
	pub := newPublisher(t, ns.ClientURL())
	makeWorkQueue(t, pub.js)
	publishWork(t, pub.js, 2)

	// Every consumer info request the scaler makes: one subject per consumer it polls.
	var mu sync.Mutex
	polled := map[string]bool{}
	spy := natstest.Connect(t, ns.ClientURL())
	sub, err := spy.Subscribe("$JS.API.CONSUMER.INFO.>", func(m *nats.Msg) { mu.Lock(); polled[m.Subject] = true; mu.Unlock() })
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := spy.Flush(); err != nil {
		t.Fatal(err)
	}

	// The legitimate trigger is followed first, and watched over StreamIsActive.
	legit := ref("ml", "trainer", map[string]string{"stream": "WORK", "consumer": "workers"})
	stream, err := s.client.StreamIsActive(t.Context(), legit)
	if err != nil {
		t.Fatal(err)
	}
	msgs, _ := recvAll(stream)
	expectMsg(t, msgs, true)

	// The flood, all at once.
	got := make([]error, flood)
	var wg sync.WaitGroup
	for i := range flood {
		wg.Go(func() {
			_, got[i] = s.client.IsActive(t.Context(), ref("evil", "so-"+itoa(i), map[string]string{"stream": "BOGUS-" + itoa(i), "consumer": "c-" + itoa(i)}))
		})
	}
	wg.Wait()
	byCode := map[codes.Code]int{}
	var refused error
	for _, err := range got {
		c := status.Code(err)
		byCode[c]++
		if c == codes.ResourceExhausted {
			refused = err
		}
	}
	if byCode[codes.Unavailable] != limit-1 || byCode[codes.ResourceExhausted] != flood-limit+1 {
		t.Fatalf("flood answered with codes %v, want %d Unavailable (followed, no such stream) and %d ResourceExhausted",
			byCode, limit-1, flood-limit+1)
	}
	wantCode(t, refused, codes.ResourceExhausted, `JetStream stream "BOGUS-`, `consumer "c-`, "--max-followed-consumers=10", "follows 10 consumers")
	if got := testutil.ToFloat64(s.metrics.consumersFollowed); got != limit {
		t.Errorf("gpuscaler_scaler_consumers_followed = %v, want %d", got, limit)
	}
	if got := testutil.ToFloat64(s.metrics.consumersRefused); got != flood-limit+1 {
		t.Errorf("gpuscaler_scaler_consumers_refused_total = %v, want %d", got, flood-limit+1)
	}
	if n := testkit.CountLines(logs.String(), "refused to follow another JetStream consumer"); n != 1 {
		t.Errorf("%d refusal log lines, want 1 (one a minute):\n%s", n, logs.String())
	}
	if !strings.Contains(logs.String(), "namespace=evil") || !strings.Contains(logs.String(), "limit=10") {
		t.Errorf("refusal log does not name the namespace and the limit:\n%s", logs.String())
	}

	// Already followed, the legitimate consumer keeps answering, and a stream on a
	// consumer not followed is refused as a poll is.
	publishWork(t, pub.js, 1)
	testkit.Eventually(t, 5*time.Second, func() bool { v, err := backlogOf(t, s, legit); return err == nil && v == 3 })
	more, err := s.client.StreamIsActive(t.Context(), ref("evil", "more", map[string]string{"stream": "BOGUS-more", "consumer": "c"}))
	if err == nil {
		_, err = more.Recv()
	}
	wantCode(t, err, codes.ResourceExhausted, `"BOGUS-more"`)

	// Some refreshes on, only the followed consumers were ever polled.
	if err := spy.Flush(); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 5*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return polled["$JS.API.CONSUMER.INFO.WORK.workers"]
	})
	mu.Lock()
	if len(polled) > limit {
		t.Errorf("%d consumers polled, want at most %d: %v", len(polled), limit, polled)
	}
	mu.Unlock()

	// Past idleAfter the flood's consumers are dropped; the watched one stays, and a new
	// consumer finds a place.
	offset.Store(int64(2 * time.Minute))
	testkit.Eventually(t, 5*time.Second, func() bool { return testutil.ToFloat64(s.metrics.consumersFollowed) == 1 })
	_, err = s.client.IsActive(t.Context(), ref("ml", "other", map[string]string{"stream": "OTHER", "consumer": "c"}))
	wantCode(t, err, codes.Unavailable, `JetStream stream "OTHER" not found`)
	// (Its counts are stale until the first fetch after the clock's jump.)
	testkit.Eventually(t, 5*time.Second, func() bool { v, err := backlogOf(t, s, legit); return err == nil && v == 3 })
}

// TestWorkQueueFollowNone: with a negative limit (--max-followed-consumers 0) every
// stream+consumer trigger is refused, and nothing is polled.
func TestWorkQueueFollowNone(t *testing.T) {
	ns := natstest.Start(t, "", "")
	s := startScaler(t, ns.ClientURL(), Config{MaxFollowedConsumers: -1})
	makeWorkQueue(t, newPublisher(t, ns.ClientURL()).js)
	_, err := backlogOf(t, s, ref("ml", "trainer", map[string]string{"stream": "WORK", "consumer": "workers"}))
	wantCode(t, err, codes.ResourceExhausted, `JetStream stream "WORK", consumer "workers"`, "--max-followed-consumers=0")
	if got := testutil.ToFloat64(s.metrics.consumersFollowed); got != 0 {
		t.Errorf("gpuscaler_scaler_consumers_followed = %v, want 0", got)
	}
}

// TestWorkQueueInNamespaceAccount: a namespace with JetStream of its own keeps its work
// queue in its own NATS account, which exports its consumer info to the scaler's; the
// scaler imports it under gpuscalerv1.TenantJetStreamAPI (authcallout.NATSConfig writes
// the same accounts) and answers that namespace's triggers from it. Another namespace's
// trigger naming the same stream reads the scaler's own account, which has none.
func TestWorkQueueInNamespaceAccount(t *testing.T) {
	api, err := gpuscalerv1.TenantJetStreamAPI("ml")
	if err != nil {
		t.Fatal(err)
	}
	ns := natstest.StartConfig(t, `accounts {
  SCALER {
    jetstream: enabled
    users: [ { user: scaler, password: s } ]
    imports: [ { service: { account: ML, subject: "$JS.API.CONSUMER.INFO.>" }, to: "`+api+`.CONSUMER.INFO.>" } ]
  }
  ML {
    jetstream: enabled
    users: [ { user: ml, password: m } ]
    exports: [ { service: "$JS.API.CONSUMER.INFO.>", accounts: [ SCALER ] } ]
  }
}
`)
	url := func(user, password string) string {
		return strings.Replace(ns.ClientURL(), "nats://", "nats://"+user+":"+password+"@", 1)
	}
	s := startScaler(t, url("scaler", "s"), Config{ConsumerRefresh: 50 * time.Millisecond, JetStreamNamespaces: []string{"ml"}})
	tenant := newPublisher(t, url("ml", "m"))
	cons := makeWorkQueue(t, tenant.js)
	publishWork(t, tenant.js, 3)

	r := ref("ml", "trainer", map[string]string{"stream": "WORK", "consumer": "workers"})
	testkit.Eventually(t, 5*time.Second, func() bool { v, err := backlogOf(t, s, r); return err == nil && v == 3 })
	// It wakes at the next fetch, not on the message: nothing else of the account
	// reaches the scaler's.
	publishWork(t, tenant.js, 2)
	testkit.Eventually(t, 5*time.Second, func() bool { v, err := backlogOf(t, s, r); return err == nil && v == 5 })
	if _, err := cons.Fetch(5); err != nil {
		t.Fatal(err)
	}

	_, err = backlogOf(t, s, ref("other", "trainer", map[string]string{"stream": "WORK", "consumer": "workers"}))
	wantCode(t, err, codes.Unavailable, `JetStream stream "WORK" not found`)
	_, err = backlogOf(t, s, ref("ml", "trainer", map[string]string{"stream": "WORK", "consumer": "absent"}))
	wantCode(t, err, codes.Unavailable, `JetStream consumer "absent" not found on stream "WORK" in namespace ml's NATS account`)
}
