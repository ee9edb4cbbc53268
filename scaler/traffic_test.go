package scaler

import (
	"math"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/gpuscaler/gpuscaler/internal/natstest"
	pb "github.com/gpuscaler/gpuscaler/proto/externalscaler"
	gpuscalerv1 "github.com/gpuscaler/gpuscaler/proto/gpuscaler/v1"
	"github.com/gpuscaler/gpuscaler/test/testkit"
)

// measuredReport is report seq of producer p of ml/q, a producer that measures its
// traffic: a steady 2 arrivals a second, of which 0.5 a second are dropped, the other
// 1.5 served, each 5 s in flight.
func measuredReport(p string, seq uint64) *gpuscalerv1.QueueReport {
	r := report(p, seq, 4, 8, 2)
	r.Traffic = &gpuscalerv1.QueueTraffic{
		ArrivalsTotal: 2 * seq, CompletionsTotal: 3 * seq / 2, DroppedTotal: seq / 2, BusySecondsTotal: 7.5 * float64(seq),
		ArrivalRate: 2, CompletionRate: 1.5, DropRate: 0.5, ServiceSeconds: 5,
	}
	return r
}

// TestReplicasAgreeAfterRestart: one scaler replica reads a measuring producer's reports
// all along; a second starts after them and reads only the last, which the stream keeps.
// Both read the producer's own figures, the same, at once: before, each replica
// estimated them from the differences between the reports it had seen, and one that
// had seen a single report read a rate of 0, then 5% of it a second later.
func TestReplicasAgreeAfterRestart(t *testing.T) {
	ns := natstest.Start(t, "", "")
	first := startScaler(t, ns.ClientURL(), Config{})
	pub := newPublisher(t, ns.ClientURL())
	subject, _ := gpuscalerv1.QueueSubject("ml", "q", "gw")
	const reports = 30
	for seq := uint64(1); seq <= reports; seq++ {
		data, _ := proto.Marshal(measuredReport("gw", seq))
		pub.raw(subject, data)
	}
	testkit.Eventually(t, 5*time.Second, func() bool { return lastSequence(first.State(), "gw") == reports })
	second := startScaler(t, ns.ClientURL(), Config{})
	testkit.Eventually(t, 5*time.Second, func() bool { return lastSequence(second.State(), "gw") == reports })

	md := map[string]string{"queue": "q", "targetWait": "2s", "concurrency": "4"}
	r := ref("ml", "llm", md)
	var values []float64
	for name, s := range map[string]*testScaler{"running all along": first, "just started": second} {
		ex, err := gpuscalerv1.NewExplainerClient(s.conn).Explain(t.Context(), &gpuscalerv1.ExplainRequest{Namespace: "ml", Name: "llm", Metadata: md})
		if err != nil {
			t.Fatalf("%s: Explain: %v", name, err)
		}
		q := ex.GetQueue()
		if q.GetArrivalRate() != 2 || q.GetServiceSeconds() != 5 || q.GetMeasuringProducers() != 1 {
			t.Errorf("%s: arrivals %g/s, service %g s, %d measuring producers; want the producer's 2/s, 5 s, 1",
				name, q.GetArrivalRate(), q.GetServiceSeconds(), q.GetMeasuringProducers())
		}
		wantReason(t, ex, "measured by its producers: every scaler replica reads the same")
		resp, err := s.client.GetMetrics(t.Context(), &pb.GetMetricsRequest{ScaledObjectRef: r, MetricName: MetricQueueDemand})
		if err != nil {
			t.Fatalf("%s: GetMetrics: %v", name, err)
		}
		values = append(values, resp.GetMetricValues()[0].GetMetricValueFloat())
	}
	if values[0] != values[1] {
		t.Errorf("queue-demand: %g on one replica, %g on the other; want the same", values[0], values[1])
	}
}

// lastSequence is the sequence number of producer p's last report of ml/q that s holds.
func lastSequence(s *State, p string) uint64 {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if e := s.queues[queueKey{"ml", "q"}]; e != nil && e.producers[p] != nil {
		return e.producers[p].report.GetSequence()
	}
	return 0
}

// TestMeasuredProducersAdd: two producers of one queue, one measuring, one not. The
// rates add, and the explanation says which figures were measured.
func TestMeasuredProducersAdd(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	now := t0
	s := NewState(func() time.Time { return now })
	s.Apply(gpuscalerv1.Event{Queue: measuredReport("a", 1)}, t0)
	now = seenToFinish(s, "b", t0) // b: S = 1 s
	ex, err := NewLocalServer(s).Explain(t.Context(), &gpuscalerv1.ExplainRequest{Namespace: "ml", Name: "svc",
		Metadata: map[string]string{"queue": "q", "targetWait": "500ms"}})
	if err != nil {
		t.Fatal(err)
	}
	q := ex.GetQueue()
	b := s.queues[queueKey{"ml", "q"}].producers["b"].demand
	if want := 2 + b.Arrivals; q.GetArrivalRate() != want {
		t.Errorf("arrival rate %g/s, want a's 2 + b's %g", q.GetArrivalRate(), b.Arrivals)
	}
	// By Little's law over both: a's 1.5 completions a second of 5 s, b's of 1 s.
	if want := (1.5*5 + b.InFlight) / (1.5 + b.Completions); q.GetServiceSeconds() != want {
		t.Errorf("service %g s, want %g", q.GetServiceSeconds(), want)
	}
	wantReason(t, ex, "measured by 1 of its 2 live producers")
}

// demandOf returns the queue-demand metric (targetWait 100ms, concurrency 2) and the
// explanation of a queue whose one measuring producer reported measuredReport's traffic
// with edit made to it.
func demandOf(t *testing.T, edit func(*gpuscalerv1.QueueTraffic)) (float64, *gpuscalerv1.Explanation) {
	t.Helper()
	md := map[string]string{"queue": "q", "targetWait": "100ms", "concurrency": "2"}
	t0 := time.Unix(1_700_000_000, 0)
	s := NewState(func() time.Time { return t0 })
	r := measuredReport("gw", 1)
	edit(r.Traffic)
	s.Apply(gpuscalerv1.Event{Queue: r}, t0)
	return demandAndExplanation(t, NewLocalServer(s), md)
}

// demandAndExplanation asks srv for the queue-demand metric of ml/llm's trigger with
// metadata md, and for its explanation.
func demandAndExplanation(t *testing.T, srv *Server, md map[string]string) (float64, *gpuscalerv1.Explanation) {
	t.Helper()
	resp, err := srv.GetMetrics(t.Context(), &pb.GetMetricsRequest{ScaledObjectRef: ref("ml", "llm", md), MetricName: MetricQueueDemand})
	if err != nil {
		t.Fatal(err)
	}
	ex, err := srv.Explain(t.Context(), &gpuscalerv1.ExplainRequest{Namespace: "ml", Name: "llm", Metadata: md})
	if err != nil {
		t.Fatal(err)
	}
	return resp.GetMetricValues()[0].GetMetricValueFloat(), ex
}

// TestBatchedArrivals: a measuring producer whose items arrive in batches (dispersion
// 9) gets, at a targetWait too short for the slots to start the batch-mates in turn,
// the slots the batch-mates ahead of each item need beyond what the same traffic
// arriving at random gets; the explanation shows the dispersion and says why.
func TestBatchedArrivals(t *testing.T) {
	value := func(dispersion float64) (float64, *gpuscalerv1.Explanation) {
		return demandOf(t, func(q *gpuscalerv1.QueueTraffic) { q.ArrivalDispersion = dispersion })
	}
	random, _ := value(1)
	batched, ex := value(9)
	// Batches of about 9 put 4 batch-mates ahead of an item. Erlang's 19 slots for 2
	// arrivals a second of 5 s each start 19·0.1/5 = 0.38 of them within 100 ms: 3.62
	// slots more, 1.81 replicas of 2 slots.
	if d := batched - random; math.Abs(d-1.81) > 1e-9 {
		t.Errorf("queue-demand %g in batches, %g at random: %g more, want 1.81", batched, random, d)
	}
	if got := ex.GetQueue().GetArrivalDispersion(); got != 9 {
		t.Errorf("explanation's dispersion %g, want the producer's 9", got)
	}
	wantReason(t, ex, "1.81 are for items that arrive together (dispersion 9, ")
}

// TestRisingArrivals: a producer's trend reaches the metric and the explanation. 2
// arrivals a second rising by 0.05 a second per second, of which twice the noise of 2
// a second at random, 2·√(2/360)/120, is left out, over the minute the average lags and
// the minute's horizon: 5.851 a second more. The metric is what 7.851 a second steady
// asks for.
func TestRisingArrivals(t *testing.T) {
	value := func(rate, trend float64) (float64, *gpuscalerv1.Explanation) {
		return demandOf(t, func(q *gpuscalerv1.QueueTraffic) { q.ArrivalRate, q.ArrivalTrend = rate, trend })
	}
	rise := (0.05 - 2*math.Sqrt(2.0/360)/120) * 120
	rising, ex := value(2, 0.05)
	if steady, _ := value(2+rise, 0); math.Abs(rising-steady) > 1e-9 || math.Abs(rise-5.851) > 1e-3 {
		t.Errorf("queue-demand %g rising, want %g, that of %g a second steady", rising, steady, 2+rise)
	}
	falling, _ := value(2, -0.05)
	if steady, _ := value(2, 0); falling != steady {
		t.Errorf("queue-demand %g falling, want %g, that of 2 a second steady: a fall counts as none", falling, steady)
	}
	if got := ex.GetQueue().GetArrivalTrend(); got != 0.05 {
		t.Errorf("explanation's trend %g, want the producer's 0.05", got)
	}
	wantReason(t, ex, "The arrivals are rising, 3 a second more each minute: the serving replicas are for 7.85 a second")
}

// TestSteadyLevel: a measuring producer whose minute's rate, 2 a second, is above the
// level its traffic fluctuates about, 1.5 over four minutes, is served for the level,
// as the same traffic at a steady 1.5 a second is; below the level, or while the level
// is unknown, for the minute's rate. The explanation says why.
func TestSteadyLevel(t *testing.T) {
	value := func(rate, level, window float64) (float64, *gpuscalerv1.Explanation) {
		return demandOf(t, func(q *gpuscalerv1.QueueTraffic) {
			q.ArrivalRate, q.ArrivalLevel, q.LevelWindowSeconds = rate, level, window
		})
	}
	above, ex := value(2, 1.5, 240)
	if steady, _ := value(1.5, 0, 0); above != steady {
		t.Errorf("queue-demand %g with the minute's rate above the level, want %g, that of the level 1.5 a second", above, steady)
	}
	minute, _ := value(2, 0, 0)
	if below, _ := value(2, 2.5, 240); below != minute || !(minute > above) {
		t.Errorf("queue-demand %g with the minute's rate below the level, want %g, that of the minute's 2 a second (and above %g)", below, minute, above)
	}
	if q := ex.GetQueue(); q.GetArrivalLevel() != 1.5 || q.GetLevelWindowSeconds() != 240 {
		t.Errorf("explanation's level %g over %g s, want the producer's 1.5 over 240 s", q.GetArrivalLevel(), q.GetLevelWindowSeconds())
	}
	wantReason(t, ex, "The arrivals fluctuate about a steady level, 1.5 a second over the last 4m0s")
	wantReason(t, ex, "serve 1.5 arrivals a second")
	// Over a minute's window the level is the minute's rate but for its history: no
	// sentence for the rounding between two averages alike.
	if _, ex := value(2, 1.99, 60); strings.Contains(strings.Join(ex.GetReasons(), "\n"), "steady level") {
		t.Errorf("a level over a minute explained as a steady one:\n%s", strings.Join(ex.GetReasons(), "\n"))
	}
}

// TestMissedWait: two measuring producers of one queue, each with items waiting, all
// its slots busy, and the queue-demand metric within the HPA's tolerance of the
// replicas serving. While neither's oldest item has waited targetWait the metric is as
// it is; once one's has, counting the time since its report, the metric goes just past
// the tolerance, the explanation shows the oldest wait, the longest of the two, and
// says why. A producer with nothing waiting does not count, whatever it reports.
func TestMissedWait(t *testing.T) {
	md := map[string]string{"queue": "q", "targetWait": "10s", "concurrency": "2"}
	t0 := time.Unix(1_700_000_000, 0)
	now := t0
	s := NewState(func() time.Time { return now })
	srv := NewLocalServer(s)
	apply := func(p string, seq, waiting uint64, oldest float64) {
		t.Helper()
		r := measuredReport(p, seq)
		r.Waiting, r.InFlight, r.Traffic.OldestWaitSeconds = waiting, 10, oldest
		if err := s.Apply(gpuscalerv1.Event{Queue: r}, t0); err != nil {
			t.Fatal(err)
		}
	}
	read := func() (float64, *gpuscalerv1.Explanation) { t.Helper(); return demandAndExplanation(t, srv, md) }
	// 4 a second of 5 s each (the two producers' sums), a load of 20 slots; 20 in
	// flight on 2-slot replicas: ten serving.
	apply("a", 1, 1, 8)
	apply("b", 1, 0, 30)
	plain, ex := read()
	if plain <= 10 || plain > 10*1.1 {
		t.Fatalf("queue-demand %g: the case wants it within the tolerance above the ten replicas serving", plain)
	}
	if got := ex.GetQueue().GetOldestWaitSeconds(); got != 8 {
		t.Errorf("oldest wait %g s, want a's 8 (b has nothing waiting)", got)
	}
	now = t0.Add(2 * time.Second)
	missed, ex := read()
	if want := 10*1.1 + 0.01; math.Abs(missed-want) > 1e-9 {
		t.Errorf("queue-demand %g once a's oldest has waited 8 s and 2 s more, want %g, past the tolerance of ten", missed, want)
	}
	wantReason(t, ex, "The oldest waiting item has waited 10s, targetWait or longer, with every slot busy: the metric is raised to 11, past the HPA's 10% tolerance of the 10 replicas serving")
	now = t0
	apply("b", 2, 1, 12)
	if v, ex := read(); math.Abs(v-missed) > 1e-9 || ex.GetQueue().GetOldestWaitSeconds() != 12 {
		t.Errorf("queue-demand %g with b's oldest at 12 s, want %g; oldest wait %g s, want 12", v, missed, ex.GetQueue().GetOldestWaitSeconds())
	}
	// An HPA that tolerates 20% (the trigger repeats it): past that.
	md["scaleUpTolerance"] = "200m"
	v, ex := read()
	if want := 10*1.2 + 0.01; math.Abs(v-want) > 1e-9 {
		t.Errorf("queue-demand %g with scaleUpTolerance 20%%, want %g", v, want)
	}
	wantReason(t, ex, "the metric is raised to 12, past the HPA's 20% tolerance of the 10 replicas serving")
}
