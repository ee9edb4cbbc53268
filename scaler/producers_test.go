package scaler

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	"github.com/gpuscaler/gpuscaler/internal/natstest"
	pb "github.com/gpuscaler/gpuscaler/proto/externalscaler"
	gpuscalerv1 "github.com/gpuscaler/gpuscaler/proto/gpuscaler/v1"
	"github.com/gpuscaler/gpuscaler/test/testkit"
)

// producerReport is a QueueReport of ml/jobs from producer, with its sequence number and
// its share: waiting and in flight.
func producerReport(producer string, seq, waiting, inFlight uint64) *gpuscalerv1.QueueReport {
	return &gpuscalerv1.QueueReport{Namespace: "ml", Queue: "jobs", ProducerId: producer, Sequence: seq, Waiting: waiting, InFlight: inFlight}
}

// readJobs reads ml/jobs as a trigger with staleAfter 10s does.
func readJobs(t *testing.T, s *State) metricReading {
	t.Helper()
	tr := mustTrigger(t, "ml", map[string]string{"queue": "jobs", "staleAfter": "10s"})
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.readQueue(tr, s.now())
}

// TestQueueSumsItsLiveProducers: a queue reads the sum of its producers' shares; one
// that falls silent past staleAfter leaves the sum, one that stops leaves it at once, and
// with none left the queue is Unavailable, naming why, never 0.
func TestQueueSumsItsLiveProducers(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	now := t0
	s := NewState(func() time.Time { return now })
	apply := func(r *gpuscalerv1.QueueReport) {
		t.Helper()
		if err := s.Apply(gpuscalerv1.Event{Queue: r}, now); err != nil {
			t.Fatal(err)
		}
	}
	wantBacklog := func(want, running float64) {
		t.Helper()
		m := readJobs(t, s)
		if m.err != nil || m.value != want || m.running != running || !m.active {
			t.Fatalf("queue at %s = backlog %g, in flight %g, active %v, %v; want %g, %g, active",
				now.Sub(t0), m.value, m.running, m.active, m.err, want, running)
		}
	}
	wantUnavailable := func(why string) {
		t.Helper()
		m := readJobs(t, s)
		if !errors.Is(m.err, ErrUnavailable) || !strings.Contains(m.err.Error(), why) {
			t.Fatalf("queue at %s = %g, %v; want Unavailable saying %q", now.Sub(t0), m.value, m.err, why)
		}
	}

	apply(producerReport("gw-a", 1, 5, 2))
	apply(producerReport("gw-b", 1, 3, 1))
	wantBacklog(11, 3)

	now = t0.Add(6 * time.Second)
	apply(producerReport("gw-b", 2, 4, 1)) // b's share replaces b's, not a's
	wantBacklog(12, 3)

	now = t0.Add(12 * time.Second) // a silent 12 s, past staleAfter 10s
	wantBacklog(5, 1)

	r := producerReport("gw-b", 3, 4, 1)
	r.Stopped = true
	apply(r)
	wantUnavailable(`its last, "gw-b", stopped at`)

	now = t0.Add(30 * time.Second)
	apply(producerReport("gw-c", 1, 0, 0)) // a new replica, empty: 0, and known to be
	m := readJobs(t, s)
	if m.err != nil || m.value != 0 || m.active {
		t.Fatalf("queue with one live, empty producer = %g, active %v, %v; want 0, inactive", m.value, m.active, m.err)
	}
	now = t0.Add(45 * time.Second)
	wantUnavailable(`last reported at 2023-11-14T22:13:50Z, 15s ago, longer than staleAfter 10s (producer "gw-c", the newest of 2)`)
}

// TestProducerLimit: a queue tracks at most --max-producers-per-queue producers; one
// more is refused with ErrProducerLimit until one stops. Those it tracks keep reporting.
func TestProducerLimit(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	s := NewState(func() time.Time { return t0 })
	s.SetMaxProducersPerQueue(2)
	apply := func(r *gpuscalerv1.QueueReport) error { return s.Apply(gpuscalerv1.Event{Queue: r}, t0) }
	for _, id := range []string{"a", "b"} {
		if err := apply(producerReport(id, 1, 1, 0)); err != nil {
			t.Fatal(err)
		}
	}
	if err := apply(producerReport("c", 1, 1, 0)); !errors.Is(err, ErrProducerLimit) {
		t.Fatalf("third producer: %v, want ErrProducerLimit", err)
	}
	if err := apply(producerReport("a", 2, 7, 0)); err != nil {
		t.Fatalf("a tracked producer reporting again: %v", err)
	}
	stop := producerReport("b", 2, 0, 0)
	stop.Stopped = true
	if err := apply(stop); err != nil {
		t.Fatal(err)
	}
	if err := apply(producerReport("c", 1, 1, 0)); err != nil {
		t.Fatalf("third producer once one stopped: %v", err)
	}
	if st := s.Queues(time.Minute)[0]; len(st.GetProducers()) != 3 || !st.GetProducers()[1].GetStopped() {
		t.Fatalf("producers %v, want a, b stopped, c", st.GetProducers())
	}
	if err := apply(producerReport("b", 1, 0, 0)); !errors.Is(err, ErrProducerLimit) {
		t.Fatalf("b again past the limit: %v, want ErrProducerLimit", err)
	}
	s.SetMaxProducersPerQueue(3)
	if err := apply(producerReport("b", 1, 0, 0)); err != nil {
		t.Fatal(err)
	}
	if st := s.Queues(time.Minute)[0]; len(st.GetProducers()) != 3 || st.GetProducers()[1].GetStopped() {
		t.Fatalf("producers %v, want a, b live again, c: b no longer listed as stopped", st.GetProducers())
	}
	if m := readJobs(t, s); m.value != 8 {
		t.Fatalf("backlog = %g, want 7 + 1 + 0", m.value)
	}
}

// TestProducersLeaveOnce: the ProducerLeft hook hears of a producer that stops when its
// stop is applied, and of one that falls silent once, on the first MarkSilentProducers
// past its report; one that reports again counts again. A stopped report of a producer
// this state never saw live (a replay after a restart) is no news.
func TestProducersLeaveOnce(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	s := NewState(func() time.Time { return t0 })
	var left []ProducerLeft
	s.SetProducerLeftHook(func(l ProducerLeft) { left = append(left, l) })
	stopped := producerReport("old", 9, 0, 0)
	stopped.Stopped = true
	s.Apply(gpuscalerv1.Event{Queue: stopped}, t0)
	s.Apply(gpuscalerv1.Event{Queue: producerReport("a", 1, 2, 1)}, t0)
	s.Apply(gpuscalerv1.Event{Queue: producerReport("b", 1, 0, 0)}, t0.Add(time.Second))
	if len(left) != 0 {
		t.Fatalf("left = %+v before anyone left", left)
	}
	if n := s.MarkSilentProducers(t0.Add(500 * time.Millisecond)); n != 1 {
		t.Fatalf("MarkSilentProducers = %d, want 1 (a)", n)
	}
	if n := s.MarkSilentProducers(t0.Add(500 * time.Millisecond)); n != 0 {
		t.Fatalf("MarkSilentProducers again = %d, want 0", n)
	}
	s.Apply(gpuscalerv1.Event{Queue: producerReport("a", 2, 2, 1)}, t0.Add(2*time.Second))
	stop := producerReport("b", 2, 0, 0)
	stop.Stopped = true
	s.Apply(gpuscalerv1.Event{Queue: stop}, t0.Add(2*time.Second))
	s.MarkSilentProducers(t0.Add(3 * time.Second))
	want := []ProducerLeft{
		{Namespace: "ml", Queue: "jobs", Producer: "a", Stored: t0, Backlog: 3},
		{Namespace: "ml", Queue: "jobs", Producer: "b", Stopped: true, Stored: t0.Add(2 * time.Second)},
		{Namespace: "ml", Queue: "jobs", Producer: "a", Stored: t0.Add(2 * time.Second), Backlog: 3},
	}
	if len(left) != len(want) {
		t.Fatalf("left = %+v, want %+v", left, want)
	}
	for i := range want {
		if left[i] != want[i] {
			t.Errorf("left[%d] = %+v, want %+v", i, left[i], want[i])
		}
	}
}

// TestQueueDemandAddsProducers: the demand of a queue with two producers is their
// traffic together. Each sees two arrivals a second and ten in flight (S = 5 s): the
// queue sees four a second, S still 5 s.
func TestQueueDemandAddsProducers(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	now := t0
	s := NewState(func() time.Time { return now })
	for i := range uint64(30) {
		now = t0.Add(time.Duration(i) * time.Second)
		for _, p := range []string{"a", "b"} {
			r := producerReport(p, i+1, 0, 10)
			r.Arrivals = 2
			if err := s.Apply(gpuscalerv1.Event{Queue: r}, now); err != nil {
				t.Fatal(err)
			}
		}
	}
	s.mu.RLock()
	q := s.queues[queueKey{"ml", "jobs"}].sum(now, 10*time.Second)
	one := s.queues[queueKey{"ml", "jobs"}].producers["a"].demand
	s.mu.RUnlock()
	if q.live != 2 || q.inFlight != 20 {
		t.Fatalf("sum = %+v, want 2 live producers, 20 in flight", q)
	}
	if diff := q.demand.Service - 5; diff > 1e-9 || diff < -1e-9 {
		t.Errorf("service = %g s, want 5", q.demand.Service)
	}
	if diff := q.demand.Arrivals - 2*one.Arrivals; diff > 1e-9 || diff < -1e-9 {
		t.Errorf("arrival rate = %g/s, want twice one producer's %g", q.demand.Arrivals, one.Arrivals)
	}
}

// TestProducersOverNATS: two producers of one queue, publishing through NATS to a real
// scaler, are summed; the one that stops leaves the sum at once, counted and logged; the
// other's share stays, and when it stops too, KEDA's GetMetrics is Unavailable.
func TestProducersOverNATS(t *testing.T) {
	ns := natstest.Start(t, "", "")
	s, logs := startScalerLogging(t, ns.ClientURL(), Config{})
	pub := newPublisher(t, ns.ClientURL())
	publish := func(r *gpuscalerv1.QueueReport) {
		t.Helper()
		subject, err := gpuscalerv1.QueueSubject(r.GetNamespace(), r.GetQueue(), r.GetProducerId())
		if err != nil {
			t.Fatal(err)
		}
		data, err := proto.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		n := s.State().Applied()
		pub.raw(subject, data)
		testkit.Eventually(t, 10*time.Second, func() bool { return s.State().Applied() > n })
	}
	backlog := func() (float64, error) {
		resp, err := s.client.GetMetrics(t.Context(), &pb.GetMetricsRequest{
			ScaledObjectRef: ref("ml", "llm", map[string]string{"queue": "jobs"}), MetricName: MetricQueueBacklog})
		if err != nil {
			return 0, err
		}
		return resp.GetMetricValues()[0].GetMetricValueFloat(), nil
	}

	publish(producerReport("gateway-7f9c-a1b2c", 1, 30, 10))
	publish(producerReport("gateway-7f9c-d4e5f", 1, 2, 0))
	if got, err := backlog(); err != nil || got != 42 {
		t.Fatalf("backlog = %g, %v; want 40 + 2", got, err)
	}
	stop := producerReport("gateway-7f9c-a1b2c", 2, 0, 0)
	stop.Stopped = true
	publish(stop)
	if got, err := backlog(); err != nil || got != 2 {
		t.Fatalf("backlog once a producer stopped = %g, %v; want the other's 2", got, err)
	}
	stop = producerReport("gateway-7f9c-d4e5f", 2, 0, 0)
	stop.Stopped = true
	publish(stop)
	_, err := backlog()
	wantCode(t, err, codes.Unavailable, "stopped at")

	if n := testkit.CountLines(logs.String(), "a queue producer stopped"); n != 2 {
		t.Errorf("%d log lines for the stops, want 2:\n%s", n, logs.String())
	}
	want := `
# HELP gpuscaler_scaler_queue_producers_left_total Queue producers whose share left their queue's reading, by reason: stopped (its last report said so) or silent (no report for --stale-after). Each is logged.
# TYPE gpuscaler_scaler_queue_producers_left_total counter
gpuscaler_scaler_queue_producers_left_total{reason="stopped"} 2
`
	if err := testutil.CollectAndCompare(s.reg, strings.NewReader(want), "gpuscaler_scaler_queue_producers_left_total"); err != nil {
		t.Error(err)
	}
}
