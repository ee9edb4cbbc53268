package scaler

import (
	"math"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	"github.com/gpuscaler/gpuscaler/internal/natstest"
	"github.com/gpuscaler/gpuscaler/internal/testkit"
	pb "github.com/gpuscaler/gpuscaler/proto/externalscaler"
	gpuscalerv1 "github.com/gpuscaler/gpuscaler/proto/gpuscaler/v1"
)

// Erlang C by hand, for one and two slots per replica. With a = 0.5 busy slots of
// S = 1 s each:
//   - m = 1: C = a = 0.5; P(wait > w) = 0.5·e^(−0.5w): 0.0034 for w = 10s, 0.30 for 1s.
//   - m = 2: B = 1/13, C = 0.1; P(wait > 1s) = 0.1·e^(−1.5) = 0.022.
//   - m = 3: C = 0.01515; P(wait > 1s) = 0.01515·e^(−2.5) = 0.0012.
//   - m = 4 for two-slot replicas: m = 2 misses the 1% as above.
func TestServingReplicasByHand(t *testing.T) {
	for _, tc := range []struct {
		a, service, wait float64
		c                int
		want             float64
	}{
		{0.5, 1, 10, 1, 1},
		{0.5, 1, 1, 1, 3},
		{0.5, 1, 1, 2, 2},
		{0, 1, 1, 1, 0},      // no arrivals: no replica serves them
		{7.9, 1, 3600, 8, 1}, // a wait an hour long: the slots just above the load
		{8, 1, 3600, 8, 2},   // m must exceed a: 8 slots at a load of 8 never catch up
	} {
		if got := servingReplicas(tc.a, tc.service, tc.wait, tc.c); got != tc.want {
			t.Errorf("servingReplicas(a=%g, S=%g, wait=%g, c=%d) = %g, want %g", tc.a, tc.service, tc.wait, tc.c, got, tc.want)
		}
	}
}

// TestServingReplicasMonotonic: more load or a shorter wait never asks for fewer
// replicas, and the replicas always hold more slots than the load keeps busy.
func TestServingReplicasMonotonic(t *testing.T) {
	waits := []float64{0.01, 0.1, 1, 5, 30, 120, 3600}
	for _, c := range []int{1, 4, 8} {
		for _, s := range []float64{0.5, 5, 30} {
			prevLoad := 0.0
			for a := 0.05; a < 3000; a *= 1.7 {
				prevWait := math.Inf(1)
				for _, w := range waits {
					n := servingReplicas(a, s, w, c)
					if n*float64(c) <= a {
						t.Fatalf("servingReplicas(a=%g, S=%g, wait=%g, c=%d) = %g: %g slots for a load of %g", a, s, w, c, n, n*float64(c), a)
					}
					if n > prevWait {
						t.Fatalf("a longer wait asked for more: servingReplicas(a=%g, S=%g, wait=%g, c=%d) = %g, %g for a shorter one", a, s, w, c, n, prevWait)
					}
					prevWait = n
				}
				n := servingReplicas(a, s, 30, c)
				if n < prevLoad {
					t.Fatalf("more load asked for fewer: servingReplicas(a=%g, S=%g, 30, c=%d) = %g, below %g", a, s, c, n, prevLoad)
				}
				prevLoad = n
			}
		}
	}
}

// TestServingReplicasLargeLoads: square-root staffing takes over above erlangSlots
// within a few percent of the exact answer, so the metric has no step there.
func TestServingReplicasLargeLoads(t *testing.T) {
	exact := servingReplicas(erlangSlots-1, 5, 1, 1)
	approx := servingReplicas(erlangSlots+1, 5, 1, 1)
	if d := math.Abs(approx-exact) / exact; d > 0.03 {
		t.Errorf("at %d slots: exact %g, square-root staffing %g: %.1f%% apart, want within 3%%", erlangSlots, exact, approx, 100*d)
	}
}

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
	d := s.queues[queueKey{"ml", "q"}].demand
	if math.Abs(d.service-5) > 1e-9 {
		t.Errorf("service time = %g s, want 5", d.service)
	}
	// The EWMAs start from nothing: after 29 folds of a 60s window, 1 − e^(−29/60) of
	// the rate.
	if want := 2 * -math.Expm1(-29.0/60); math.Abs(d.arrivals-want) > 1e-9 {
		t.Errorf("arrival rate = %g/s, want %g", d.arrivals, want)
	}
}

// TestDemandSkipsGaps: completions are only counted between consecutive reports of one
// producer; a lost report or another producer's would make them up.
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
			if d := s.queues[queueKey{"ml", "q"}].demand; d.completions != 0 || d.service != 0 {
				t.Errorf("demand = %+v, want no completions counted", d)
			}
		})
	}
}

// TestQueueDemand: until an item is seen to finish, the metric is the backlog over the
// concurrency; then serving plus draining.
func TestQueueDemand(t *testing.T) {
	tr := &Trigger{Concurrency: 4, TargetWait: 10 * time.Second}
	if got := queueDemand(tr, demand{arrivals: 3}, 6, 2); got != 2 {
		t.Errorf("no service time yet: queueDemand = %g, want (6+2)/4 = 2", got)
	}
	d := demand{arrivals: 0.5, service: 1}
	want := servingReplicas(0.5, 1, 10, 4) + 20*1/(4*10.0)
	if got := queueDemand(tr, d, 20, 3); got != want {
		t.Errorf("queueDemand = %g, want %g", got, want)
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

	subject, _ := gpuscalerv1.QueueSubject("ml", "q")
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

// FuzzDemand folds any sequence of reports and checks the metric stays a finite,
// non-negative number of replicas: the reports are outside input.
func FuzzDemand(f *testing.F) {
	f.Add(uint64(2), uint64(10), uint64(2), uint16(1000), uint8(1), uint16(30))
	f.Add(uint64(0), uint64(0), uint64(0), uint16(0), uint8(0), uint16(1))
	f.Add(uint64(math.MaxUint64), uint64(math.MaxUint64), uint64(math.MaxUint64), uint16(1), uint8(2), uint16(65535))
	f.Fuzz(func(t *testing.T, waiting, inFlight, arrivals uint64, gapMillis uint16, seqStep uint8, waitSeconds uint16) {
		t0 := time.Unix(1_700_000_000, 0)
		s := NewState(func() time.Time { return t0 })
		at, seq := t0, uint64(1)
		for i := range uint64(6) {
			w, fl, a := waiting>>i, inFlight>>(5-i), arrivals^i
			if err := s.Apply(gpuscalerv1.Event{Queue: report("p", seq, w, fl, a)}, at); err != nil {
				t.Fatal(err)
			}
			at = at.Add(time.Duration(gapMillis) * time.Millisecond)
			seq += uint64(seqStep)
		}
		e := s.queues[queueKey{"ml", "q"}]
		tr := &Trigger{Concurrency: 1 + int(seqStep), TargetWait: time.Duration(waitSeconds%3600+1) * time.Second}
		v := queueDemand(tr, e.demand, float64(e.report.GetWaiting()), float64(e.report.GetInFlight()))
		if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
			t.Fatalf("queueDemand = %g from demand %+v", v, e.demand)
		}
	})
}
