package scaler

import (
	"math"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	"github.com/gpuscaler/gpuscaler/internal/natstest"
	pb "github.com/gpuscaler/gpuscaler/proto/externalscaler"
	gpuscalerv1 "github.com/gpuscaler/gpuscaler/proto/gpuscaler/v1"
	"github.com/gpuscaler/gpuscaler/test/testkit"
)

// report is a QueueReport of producer p numbered seq.
func report(p string, seq, waiting, inFlight, arrivals uint64) *gpuscalerv1.QueueReport {
	return &gpuscalerv1.QueueReport{Namespace: "ml", Queue: "q", Waiting: waiting, InFlight: inFlight,
		Arrivals: arrivals, ProducerId: p, Sequence: seq}
}

// TestDemandByLittlesLaw: two arrivals a second and ten items always in flight mean two
// finish a second, each in five seconds.
func TestDemandByLittlesLaw(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	s := NewState(func() time.Time { return t0 })
	for i := range uint64(30) {
		if err := s.Apply(gpuscalerv1.Event{Queue: report("a", i+1, 0, 10, 2)}, t0.Add(time.Duration(i)*time.Second)); err != nil {
			t.Fatal(err)
		}
	}
	d := s.queues[queueKey{"ml", "q"}].producers["a"].demand
	if math.Abs(d.Service-5) > 1e-9 {
		t.Errorf("service time = %g s, want 5", d.Service)
	}
	// The EWMAs start from nothing: after 29 folds of a 60s window, 1 − e^(−29/60) of
	// the rate.
	if want := 2 * -math.Expm1(-29.0/60); math.Abs(d.Arrivals-want) > 1e-9 {
		t.Errorf("arrival rate = %g/s, want %g", d.Arrivals, want)
	}
}

// TestDemandSkipsGaps: completions are only counted between consecutive reports of one
// producer; a lost report would make them up, and another producer's report is another
// share of the queue, not a sequel.
func TestDemandSkipsGaps(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	for name, second := range map[string]*gpuscalerv1.QueueReport{
		"sequence gap":   report("a", 3, 0, 0, 0),
		"other producer": report("b", 2, 0, 0, 0),
	} {
		t.Run(name, func(t *testing.T) {
			s := NewState(func() time.Time { return t0 })
			s.Apply(gpuscalerv1.Event{Queue: report("a", 1, 0, 10, 0)}, t0)
			s.Apply(gpuscalerv1.Event{Queue: second}, t0.Add(time.Second)) // ten items gone
			for id, p := range s.queues[queueKey{"ml", "q"}].producers {
				if d := p.demand; d.Completions != 0 || d.Service != 0 {
					t.Errorf("producer %s's demand = %+v, want no completions counted", id, d)
				}
			}
		})
	}
}

// TestDemandLeavesDropsOut: items dropped while waiting (timeouts, cancels) are not
// completions. Ten items in flight, two arrivals a second, of which one is dropped: one
// completes a second, each in ten seconds. Counting the drop as a completion would halve
// the service time.
func TestDemandLeavesDropsOut(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	s := NewState(func() time.Time { return t0 })
	for i := range uint64(30) {
		r := report("a", i+1, 0, 10, 2)
		if i > 0 {
			r.Dropped = 1
		}
		if err := s.Apply(gpuscalerv1.Event{Queue: r}, t0.Add(time.Duration(i)*time.Second)); err != nil {
			t.Fatal(err)
		}
	}
	if d := s.queues[queueKey{"ml", "q"}].producers["a"].demand; math.Abs(d.Service-10) > 1e-9 {
		t.Errorf("service time = %g s, want 10", d.Service)
	}
}

// TestQueueDemandOverGRPC: a targetWait trigger gives queue-demand, target 1, and no
// queue-backlog; its activation stays on the backlog.
func TestQueueDemandOverGRPC(t *testing.T) {
	ns := natstest.Start(t, "", "")
	s := startScaler(t, ns.ClientURL(), Config{})
	pub := newPublisher(t, ns.ClientURL())
	r := ref("ml", "llm", map[string]string{"queue": "q", "targetWait": "30s", "concurrency": "4"})

	spec, err := s.client.GetMetricSpec(t.Context(), r)
	if err != nil {
		t.Fatal(err)
	}
	wantSpec := &pb.MetricSpec{MetricName: MetricQueueDemand, TargetSize: 1, TargetSizeFloat: 1}
	if len(spec.GetMetricSpecs()) != 1 || !proto.Equal(spec.GetMetricSpecs()[0], wantSpec) {
		t.Fatalf("GetMetricSpec = %v, want [%v]", spec, wantSpec)
	}

	subject, _ := gpuscalerv1.QueueSubject("ml", "q", "p")
	data, _ := proto.Marshal(report("p", 1, 6, 2, 8))
	pub.raw(subject, data)
	testkit.Eventually(t, 5*time.Second, func() bool {
		resp, err := s.client.IsActive(t.Context(), r)
		return err == nil && resp.GetResult()
	})
	resp, err := s.client.GetMetrics(t.Context(), &pb.GetMetricsRequest{ScaledObjectRef: r, MetricName: MetricQueueDemand})
	if err != nil {
		t.Fatal(err)
	}
	if got := resp.GetMetricValues()[0].GetMetricValueFloat(); got != 2 {
		t.Errorf("queue-demand before any item finished = %g, want the backlog over the concurrency, 8/4 = 2", got)
	}
	_, err = s.client.GetMetrics(t.Context(), &pb.GetMetricsRequest{ScaledObjectRef: r, MetricName: MetricQueueBacklog})
	wantCode(t, err, codes.NotFound, "gives no metric")
}

// TestExplainQueueDemand: once an item is seen to finish, Explain gives the queue's
// arrival rate and service time, and says how the metric came from them.
func TestExplainQueueDemand(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	now := t0
	s := NewState(func() time.Time { return now })
	now = seenToFinish(s, "p", t0)
	ex, err := NewLocalServer(s).Explain(t.Context(), &gpuscalerv1.ExplainRequest{Namespace: "ml", Name: "svc",
		Metadata: map[string]string{"queue": "q", "targetWait": "500ms"}})
	if err != nil {
		t.Fatal(err)
	}
	if q := ex.GetQueue(); q.GetServiceSeconds() != 1 || q.GetArrivalRate() <= 0 {
		t.Errorf("queue status: service %g s, arrivals %g/s; want 1 s and a positive rate", q.GetServiceSeconds(), q.GetArrivalRate())
	}
	wantReason(t, ex, "to start within targetWait 500ms, looking 1m0s ahead (a minute, at least)")
	wantReason(t, ex, "arrivals a second of 1 s each, 0.0331 start the 2 waiting")
}

// TestExplainTargetWaitBelowTheColdStart: a targetWait shorter than the cold start is
// explained as a promise that holds only while replicas are up, and the horizon is the
// cold start and the sync.
func TestExplainTargetWaitBelowTheColdStart(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	now := t0
	s := NewState(func() time.Time { return now })
	now = seenToFinish(s, "p", t0)
	for wait, below := range map[string]bool{"10s": true, "2m": false} {
		ex, err := NewLocalServer(s).Explain(t.Context(), &gpuscalerv1.ExplainRequest{Namespace: "ml", Name: "svc",
			Metadata: map[string]string{"queue": "q", "targetWait": wait, "coldStart": "90s"}})
		if err != nil {
			t.Fatal(err)
		}
		wantReason(t, ex, "looking 1m45s ahead (the cold start and the HPA's 15s sync)")
		said := strings.Contains(strings.Join(ex.GetReasons(), "\n"), "is shorter than the cold start 1m30s")
		if said != below {
			t.Errorf("targetWait %s, cold start 90s: says it is shorter: %t, want %t:\n%s", wait, said, below, strings.Join(ex.GetReasons(), "\n"))
		}
	}
}

// seenToFinish applies two reports of producer id of ml/q to s, stored at t0 and a
// second later, which it returns: four items finish between them with four in flight,
// so the service time is 1 s, and two wait.
func seenToFinish(s *State, id string, t0 time.Time) time.Time {
	s.Apply(gpuscalerv1.Event{Queue: report(id, 1, 4, 4, 8)}, t0)
	at := t0.Add(time.Second)
	s.Apply(gpuscalerv1.Event{Queue: report(id, 2, 2, 4, 2)}, at)
	return at
}
