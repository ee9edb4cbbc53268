package scaler

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/protobuf/proto"

	"github.com/gpuscaler/gpuscaler/internal/natstest"
	"github.com/gpuscaler/gpuscaler/internal/testkit"
	gpuscalerv1 "github.com/gpuscaler/gpuscaler/proto/gpuscaler/v1"
)

// producerReport is a QueueReport of ml/jobs from producer, with its sequence number and
// waiting count.
func producerReport(producer string, seq, waiting uint64) *gpuscalerv1.QueueReport {
	return &gpuscalerv1.QueueReport{Namespace: "ml", Queue: "jobs", ProducerId: producer, Sequence: seq, Waiting: waiting}
}

// TestProducerConflicts applies reports of one queue, one a second, through a State, and
// counts the ProducerConflicts it reports. A restarted producer takes a new id
// (collectors/queue, defaultProducerID) and its old id never reports again: that must
// never be a conflict. Two or more producers reporting by turns are.
func TestProducerConflicts(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	type report struct {
		producer string
		after    time.Duration // since the previous report; a second when zero
	}
	seq := func(ids ...string) []report {
		rs := make([]report, len(ids))
		for i, id := range ids {
			rs[i] = report{producer: id}
		}
		return rs
	}
	cases := map[string]struct {
		reports []report
		want    int // conflicts
		active  int // QueuesWithProducerConflict after the last report
	}{
		"one producer":                 {reports: seq("a", "a", "a", "a"), want: 0},
		"restart with a new id":        {reports: seq("a", "a", "b", "b", "b"), want: 0},
		"restarts, each with a new id": {reports: seq("a", "b", "c", "d", "e", "f", "g", "h"), want: 0},
		"two producers by turns":       {reports: seq("a", "b", "a", "b", "a"), want: 3, active: 1},
		"three producers by turns":     {reports: seq("a", "b", "c", "a", "b", "c"), want: 3, active: 1},
		"nine producers by turns": {
			reports: seq("p1", "p2", "p3", "p4", "p5", "p6", "p7", "p8", "p9", "p1"), want: 2, active: 1},
		// A rolling update runs the old producer beside the new one until the old stops:
		// while both run, the backlog does flap.
		"overlap while replaced": {reports: seq("a", "b", "a", "b", "b", "b"), want: 2, active: 1},
		// A standby that took over, then the first producer back after the window: one
		// producer at a time.
		"failover and back after the window": {
			reports: []report{{producer: "a"}, {producer: "b"}, {producer: "b", after: 45 * time.Second}, {producer: "a", after: 30 * time.Second}},
			want:    0},
		"a restart every 10s": {
			reports: []report{{producer: "a"}, {producer: "b", after: 10 * time.Second}, {producer: "c", after: 10 * time.Second},
				{producer: "d", after: 10 * time.Second}, {producer: "e", after: 10 * time.Second}, {producer: "f", after: 10 * time.Second},
				{producer: "g", after: 10 * time.Second}, {producer: "h", after: 10 * time.Second}, {producer: "i", after: 10 * time.Second},
				{producer: "j", after: 10 * time.Second}, {producer: "k", after: 10 * time.Second}},
			want: 0},
		"conflict a minute ago no longer active": {
			reports: []report{{producer: "a"}, {producer: "b"}, {producer: "a"}, {producer: "a", after: 61 * time.Second}},
			want:    1, active: 0},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			clock := newFakeClock(t0)
			s := NewState(clock.Now)
			var got []ProducerConflict
			s.SetProducerConflictHook(func(c ProducerConflict) { got = append(got, c) })
			for i, r := range tc.reports {
				if i > 0 {
					clock.Advance(max(r.after, time.Second))
				}
				ev := gpuscalerv1.Event{
					Subject: gpuscalerv1.Subject{Kind: gpuscalerv1.KindQueue, Namespace: "ml", Queue: "jobs"},
					Queue:   producerReport(r.producer, 1, uint64(i)),
				}
				if err := s.Apply(ev, clock.Now()); err != nil {
					t.Fatal(err)
				}
			}
			if len(got) != tc.want {
				t.Fatalf("%d conflicts %+v, want %d", len(got), got, tc.want)
			}
			if n := s.QueuesWithProducerConflict(); n != tc.active {
				t.Fatalf("QueuesWithProducerConflict() = %d, want %d", n, tc.active)
			}
		})
	}

	// The conflict names the queue, both producers and both backlogs.
	clock := newFakeClock(t0)
	s := NewState(clock.Now)
	var got []ProducerConflict
	s.SetProducerConflictHook(func(c ProducerConflict) { got = append(got, c) })
	for _, r := range []*gpuscalerv1.QueueReport{producerReport("a", 1, 5), producerReport("b", 1, 0), producerReport("a", 2, 6)} {
		clock.Advance(time.Second)
		s.Apply(gpuscalerv1.Event{Subject: gpuscalerv1.Subject{Kind: gpuscalerv1.KindQueue, Namespace: "ml", Queue: "jobs"}, Queue: r}, clock.Now())
	}
	want := ProducerConflict{Namespace: "ml", Queue: "jobs", Producer: "a", Other: "b", Backlog: 6, OtherBacklog: 0}
	if len(got) != 1 || got[0] != want {
		t.Fatalf("conflicts %+v, want [%+v]", got, want)
	}
}

// TestProducerConflictOverNATS: two producers publishing one queue's reports by turns
// through NATS are counted, with no namespace or queue label, shown as one queue in
// conflict, and logged once a minute naming the queue and both producers.
func TestProducerConflictOverNATS(t *testing.T) {
	ns := natstest.Start(t, "", "")
	s, logs := startScalerLogging(t, ns.ClientURL(), Config{})
	pub := newPublisher(t, ns.ClientURL())
	subject, err := gpuscalerv1.QueueSubject("ml", "jobs")
	if err != nil {
		t.Fatal(err)
	}
	// The stream keeps one message per subject: a report replaced before the scaler
	// fetched it is never seen. So each is published once the one before is applied.
	publish := func(r *gpuscalerv1.QueueReport) {
		t.Helper()
		data, err := proto.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		n := s.State().Applied()
		pub.raw(subject, data)
		testkit.Eventually(t, 10*time.Second, func() bool { return s.State().Applied() == n+1 })
	}
	for i := range uint64(3) {
		publish(producerReport("api-7f9c-a1b2c3", i+1, 40))
		publish(producerReport("api-7f9c-d4e5f6", i+1, 0))
	}

	if n := testkit.CountLines(logs.String(), "two producers report one queue"); n != 1 {
		t.Fatalf("%d log lines for the conflicts, want 1 (once a minute per queue):\n%s", n, logs.String())
	}
	for _, want := range []string{"namespace=ml", "queue=jobs", "producer=api-7f9c-a1b2c3", "otherProducer=api-7f9c-d4e5f6", "otherBacklog=0"} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("the log line does not say %s:\n%s", want, logs.String())
		}
	}
	want := `
# HELP gpuscaler_scaler_queue_producer_conflicts_total Queue reports that replaced another producer's report while the two reported the queue by turns (within a minute): its backlog flaps between their figures. One queue must have one producer; the queues are logged.
# TYPE gpuscaler_scaler_queue_producer_conflicts_total counter
gpuscaler_scaler_queue_producer_conflicts_total 4
# HELP gpuscaler_scaler_queues_with_producer_conflict Queues reported by more than one producer by turns within the last minute (see gpuscaler_scaler_queue_producer_conflicts_total).
# TYPE gpuscaler_scaler_queues_with_producer_conflict gauge
gpuscaler_scaler_queues_with_producer_conflict 1
`
	if err := testutil.CollectAndCompare(s.reg, strings.NewReader(want),
		"gpuscaler_scaler_queue_producer_conflicts_total", "gpuscaler_scaler_queues_with_producer_conflict"); err != nil {
		t.Fatal(err)
	}
}
