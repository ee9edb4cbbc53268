package scaler

import (
	"math"
	"net/http"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/gpuscaler/gpuscaler/internal/natstest"
	pb "github.com/gpuscaler/gpuscaler/proto/externalscaler"
	gpuscalerv1 "github.com/gpuscaler/gpuscaler/proto/gpuscaler/v1"
	"github.com/gpuscaler/gpuscaler/test/testkit"
)

// coldReport is producer p's report of queue ml/q with a measured cold start.
func coldReport(p string, seq uint64, coldStart float64) *gpuscalerv1.QueueReport {
	r := report(p, seq, 1, 0, 1)
	r.ColdStartSeconds = coldStart
	return r
}

// coldPod is a GPU of node report held by pod name of ml, labelled app=llm, whose
// collector measured its cold start (none when coldStart < 0).
func coldPod(uuid, name string, coldStart float64) *gpuscalerv1.GPUSample {
	g := gpu(uuid, "ml", name, map[string]string{"app": "llm"}, 50, 10, 80)
	if coldStart >= 0 {
		g.Pod.ColdStartSeconds = proto.Float64(coldStart)
	}
	return g
}

// TestColdStartPrecedence checks which cold start queue-demand reads: the trigger's
// coldStart, else the largest its live producers measured, else the largest the
// collectors measured of the selected pods, else none; and that explain says which.
func TestColdStartPrecedence(t *testing.T) {
	demandMD := map[string]string{"queue": "q", "targetWait": "10s"}
	withPods := map[string]string{"queue": "q", "targetWait": "10s", "podSelector": "app=llm", "gpuUtilTarget": "80"}
	withKey := map[string]string{"queue": "q", "targetWait": "10s", "coldStart": "45s", "podSelector": "app=llm", "gpuUtilTarget": "80"}
	tests := map[string]struct {
		md        map[string]string
		producers map[string]float64 // producer → its cold start
		stale     map[string]float64 // producers whose last report is older than staleAfter
		pods      map[string]float64 // pod → its measured cold start (-1: none)
		want      *gpuscalerv1.ColdStart
		reason    string
	}{
		"unknown": {
			md: demandMD, producers: map[string]float64{"gw-1": 0},
			reason: "Cold start (how long a new replica takes to serve) unknown: the trigger gives no coldStart, no producer of the queue measured one",
		},
		"unknown, and no pod measured": {
			md: withPods, producers: map[string]float64{"gw-1": 0}, pods: map[string]float64{"llm-0": -1},
			reason: "nor did a collector of a pod podSelector selects",
		},
		"the largest of the live producers": {
			md: demandMD, producers: map[string]float64{"gw-1": 31, "gw-2": 40, "gw-3": 0}, stale: map[string]float64{"gw-old": 90},
			want:   &gpuscalerv1.ColdStart{Seconds: 40, Source: "producer", ProducerId: "gw-2"},
			reason: `Cold start (how long a new replica takes to serve): 40s, measured by producer "gw-2"`,
		},
		"a tie goes to the first producer by id": {
			md: demandMD, producers: map[string]float64{"gw-b": 30, "gw-a": 30},
			want: &gpuscalerv1.ColdStart{Seconds: 30, Source: "producer", ProducerId: "gw-a"},
		},
		"a figure that makes no sense is none": {
			md: demandMD, producers: map[string]float64{"a": math.NaN(), "b": -1, "c": math.Inf(1), "d": 1e9},
		},
		"the trigger's key wins": {
			md: withKey, producers: map[string]float64{"gw-1": 90}, pods: map[string]float64{"llm-0": 120},
			want:   &gpuscalerv1.ColdStart{Seconds: 45, Source: "trigger"},
			reason: "45s, the trigger's coldStart key",
		},
		"a producer before the collector": {
			md: withPods, producers: map[string]float64{"gw-1": 31}, pods: map[string]float64{"llm-0": 120},
			want: &gpuscalerv1.ColdStart{Seconds: 31, Source: "producer", ProducerId: "gw-1"},
		},
		"the collector's largest of the selected pods": {
			md: withPods, producers: map[string]float64{"gw-1": 0}, pods: map[string]float64{"llm-0": 28, "llm-1": 35, "llm-2": -1},
			want:   &gpuscalerv1.ColdStart{Seconds: 35, Source: "collector", Pod: "ml/llm-1", Node: "n1"},
			reason: "35s, measured by the collector of node n1 on pod ml/llm-1",
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			clock := newFakeClock(t0)
			s := NewState(clock.Now)
			for p, c := range tc.stale {
				if err := s.Apply(gpuscalerv1.Event{Queue: coldReport(p, 1, c)}, clock.Now()); err != nil {
					t.Fatal(err)
				}
			}
			clock.Advance(time.Minute)
			for p, c := range tc.producers {
				if err := s.Apply(gpuscalerv1.Event{Queue: coldReport(p, 1, c)}, clock.Now()); err != nil {
					t.Fatal(err)
				}
			}
			var gpus []*gpuscalerv1.GPUSample
			for pod, c := range tc.pods {
				gpus = append(gpus, coldPod("GPU-"+pod, pod, c))
			}
			if err := s.Apply(nodeEvent("n1", gpus...), clock.Now()); err != nil {
				t.Fatal(err)
			}
			tr := mustTrigger(t, "ml", tc.md)
			r := read(t, s, tr)
			if !proto.Equal(r.queue.coldStart.proto(), tc.want) {
				t.Errorf("cold start %v, want %v", r.queue.coldStart.proto(), tc.want)
			}
			if got, want := r.queue.demandIn.ColdStart, time.Duration(tc.want.GetSeconds()*float64(time.Second)); got != want {
				t.Errorf("queue-demand's inputs: cold start %s, want %s", got, want)
			}
			ex, err := NewLocalServer(s).Explain(t.Context(), &gpuscalerv1.ExplainRequest{Namespace: "ml", Name: "svc", Metadata: tc.md})
			if err != nil {
				t.Fatal(err)
			}
			if !proto.Equal(ex.GetQueue().GetColdStart(), tc.want) {
				t.Errorf("explain: cold start %v, want %v", ex.GetQueue().GetColdStart(), tc.want)
			}
			if tc.reason != "" {
				wantReason(t, ex, tc.reason)
			}
		})
	}
}

// TestCollectorColdStartRemembered: the collectors' figure outlives the pods (a workload
// at zero has none, and waking it is when the figure matters), a larger one replaces it
// at once, and a smaller one only once reads have seen smaller ones alone, pods running,
// for coldStartMemory.
func TestCollectorColdStartRemembered(t *testing.T) {
	clock := newFakeClock(t0)
	s := NewState(clock.Now)
	tr := mustTrigger(t, "ml", map[string]string{"queue": "q", "targetWait": "10s", "podSelector": "app=llm", "gpuUtilTarget": "80"})
	seq := uint64(0)
	step := func(d time.Duration, gpus ...*gpuscalerv1.GPUSample) *gpuscalerv1.ColdStart {
		t.Helper()
		clock.Advance(d)
		seq++
		if err := s.Apply(gpuscalerv1.Event{Queue: coldReport("gw-1", seq, 0)}, clock.Now()); err != nil {
			t.Fatal(err)
		}
		if err := s.Apply(nodeEvent("n1", gpus...), clock.Now()); err != nil {
			t.Fatal(err)
		}
		return read(t, s, tr).queue.coldStart.proto()
	}
	want := func(got *gpuscalerv1.ColdStart, seconds float64, pod string) {
		t.Helper()
		if got.GetSeconds() != seconds || got.GetPod() != pod || (seconds > 0) != (got.GetSource() == "collector") {
			t.Fatalf("at %s: cold start %v, want %g s of pod %q", clock.Now().Sub(t0), got, seconds, pod)
		}
	}
	want(step(0, coldPod("GPU-0", "llm-0", -1)), 0, "")
	want(step(time.Second, coldPod("GPU-0", "llm-0", 50)), 50, "ml/llm-0")
	want(step(time.Second), 50, "ml/llm-0") // scaled to zero
	want(step(24*time.Hour), 50, "ml/llm-0")
	want(step(time.Second, coldPod("GPU-0", "llm-1", 20)), 50, "ml/llm-0")
	want(step(time.Second, coldPod("GPU-0", "llm-1", 20), coldPod("GPU-1", "llm-2", 60)), 60, "ml/llm-2")
	want(step(time.Second, coldPod("GPU-0", "llm-1", 20)), 60, "ml/llm-2")
	want(step(coldStartMemory, coldPod("GPU-0", "llm-1", 20)), 60, "ml/llm-2")
	want(step(time.Second, coldPod("GPU-0", "llm-1", 20)), 20, "ml/llm-1") // an hour and a second of smaller ones alone
}

// TestProducerColdStartOverNATS: a producer's measured cold start reaches the scaler
// through NATS, and its status page lists it with the queue and the producer.
func TestProducerColdStartOverNATS(t *testing.T) {
	ns := natstest.Start(t, "", "")
	s := startScaler(t, ns.ClientURL(), Config{})
	pub := newPublisher(t, ns.ClientURL())
	subject, _ := gpuscalerv1.QueueSubject("ml", "q", "gw-1")
	pub.raw(subject, mustMarshal(t, coldReport("gw-1", 1, 31.5)))
	var queues []*gpuscalerv1.QueueStatus
	testkit.Eventually(t, 5*time.Second, func() bool {
		queues = s.state.Queues(time.Minute)
		return len(queues) == 1 && queues[0].GetQueue() == "q"
	})
	q := queues[0]
	if want := (&gpuscalerv1.ColdStart{Seconds: 31.5, Source: "producer", ProducerId: "gw-1"}); !proto.Equal(q.GetColdStart(), want) {
		t.Errorf("queue's cold start %v, want %v", q.GetColdStart(), want)
	}
	if p := q.GetProducers(); len(p) != 1 || p[0].GetColdStartSeconds() != 31.5 {
		t.Errorf("producers %v, want gw-1 with cold start 31.5", p)
	}
	ex, err := gpuscalerv1.NewExplainerClient(s.conn).Explain(t.Context(), &gpuscalerv1.ExplainRequest{Namespace: "ml", Name: "svc", Metadata: map[string]string{"queue": "q", "targetWait": "10s"}})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(ex.GetQueue().GetColdStart().Describe(), `31.5s, measured by producer "gw-1"`) {
		t.Errorf("explain's cold start %v", ex.GetQueue().GetColdStart())
	}

	// A collector's figure reaches it through NATS too, decoded by the follower's
	// NodeDecoder, for a trigger whose producers measured none.
	pub.raw(gpuscalerv1.QueueSubjectPrefix+"ml.q2.gw-2", mustMarshal(t, &gpuscalerv1.QueueReport{Namespace: "ml", Queue: "q2", ProducerId: "gw-2", Sequence: 1, Waiting: 1}))
	pub.node(&gpuscalerv1.NodeReport{Node: "n1", Source: "sim", Gpus: []*gpuscalerv1.GPUSample{coldPod("GPU-0", "llm-0", 28)}})
	explainer := gpuscalerv1.NewExplainerClient(s.conn)
	want := &gpuscalerv1.ColdStart{Seconds: 28, Source: "collector", Pod: "ml/llm-0", Node: "n1"}
	testkit.Eventually(t, 5*time.Second, func() bool {
		ex, err := explainer.Explain(t.Context(), &gpuscalerv1.ExplainRequest{Namespace: "ml", Name: "svc2",
			Metadata: map[string]string{"queue": "q2", "targetWait": "10s", "podSelector": "app=llm", "gpuUtilTarget": "80"}})
		return err == nil && proto.Equal(ex.GetQueue().GetColdStart(), want)
	})

	// The status page: the queue's figure and the producer's, and on the page of a
	// trigger KEDA asked about, the figure its queue-demand used.
	keyed := ref("ml", "svc", map[string]string{"queue": "q", "targetWait": "10s", "coldStart": "1m"})
	if _, err := s.client.GetMetrics(t.Context(), &pb.GetMetricsRequest{ScaledObjectRef: keyed, MetricName: MetricQueueDemand}); err != nil {
		t.Fatal(err)
	}
	_, body := get(t, s, http.MethodGet, "/status")
	wantContains(t, "GET /status", body, "31.5s, measured by producer &#34;gw-1&#34;", "cold start 31.5 s")
	_, body = get(t, s, http.MethodGet, "/status/trigger?id=1")
	wantContains(t, "GET /status/trigger?id=1", body, `<td class="small" id="cold-start" title="what queue-demand plans for">1m0s, the trigger&#39;s coldStart key</td>`)
}
