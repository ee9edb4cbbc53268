package scaler

import (
	"errors"
	"math"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	gpuscalerv1 "github.com/gpuscaler/gpuscaler/proto/gpuscaler/v1"
)

// fakeClock is a clock tests move by hand. Safe for concurrent use.
type fakeClock struct{ ns atomic.Int64 }

func newFakeClock(t time.Time) *fakeClock {
	c := &fakeClock{}
	c.ns.Store(t.UnixNano())
	return c
}

func (c *fakeClock) Now() time.Time          { return time.Unix(0, c.ns.Load()) }
func (c *fakeClock) Advance(d time.Duration) { c.ns.Add(int64(d)) }

var t0 = time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)

// gpu builds a GPU sample held by pod ns/name with labels, util percent and framebuffer
// used/total in GiB. A pod name "" means a free GPU.
func gpu(uuid, ns, pod string, lbls map[string]string, util float64, usedGiB, totalGiB uint64) *gpuscalerv1.GPUSample {
	g := &gpuscalerv1.GPUSample{
		Uuid:         uuid,
		GpuUtil:      proto.Float64(util),
		FbUsedBytes:  proto.Uint64(usedGiB << 30),
		FbTotalBytes: proto.Uint64(totalGiB << 30),
	}
	if pod != "" {
		g.Pod = &gpuscalerv1.PodRef{Namespace: ns, Name: pod, Labels: lbls}
	}
	return g
}

func nodeEvent(name string, gpus ...*gpuscalerv1.GPUSample) gpuscalerv1.Event {
	return gpuscalerv1.Event{
		Subject: gpuscalerv1.Subject{Kind: gpuscalerv1.KindNode, Node: name},
		Node:    &gpuscalerv1.NodeReport{Node: name, Source: "sim", Gpus: gpus},
	}
}

func queueEvent(ns, q string, waiting, inFlight uint64) gpuscalerv1.Event {
	return gpuscalerv1.Event{
		Subject: gpuscalerv1.Subject{Kind: gpuscalerv1.KindQueue, Namespace: ns, Queue: q, Producer: "p"},
		Queue:   &gpuscalerv1.QueueReport{Namespace: ns, Queue: q, ProducerId: "p", Waiting: waiting, InFlight: inFlight},
	}
}

func mustTrigger(t *testing.T, ns string, md map[string]string) *Trigger {
	t.Helper()
	tr, err := ParseTrigger(ns, md, 0)
	if err != nil {
		t.Fatalf("ParseTrigger(%q, %v): %v", ns, md, err)
	}
	return tr
}

func read(t *testing.T, s *State, tr *Trigger) Reading {
	t.Helper()
	return s.Read(tr)
}

func wantMetric(t *testing.T, r Reading, name string, want float64) {
	t.Helper()
	got, err := r.Metric(name)
	if err != nil {
		t.Fatalf("Metric(%q) error %v, want %v", name, err, want)
	}
	if math.Abs(got-want) > 1e-9 {
		t.Fatalf("Metric(%q) = %v, want %v", name, got, want)
	}
}

func wantUnavailable(t *testing.T, err error, contains ...string) {
	t.Helper()
	if !errors.Is(err, ErrUnavailable) {
		t.Fatalf("error %v, want ErrUnavailable", err)
	}
	for _, c := range contains {
		if !strings.Contains(err.Error(), c) {
			t.Fatalf("error %q does not mention %q", err, c)
		}
	}
}

func TestQueueBacklogAndActivation(t *testing.T) {
	tests := map[string]struct {
		md                map[string]string
		waiting, inFlight uint64
		wantBacklog       float64
		wantActive        bool
	}{
		"empty queue is inactive":             {md: map[string]string{"queue": "jobs"}, wantBacklog: 0, wantActive: false},
		"one waiting wakes it":                {md: map[string]string{"queue": "jobs"}, waiting: 1, wantBacklog: 1, wantActive: true},
		"in flight counts in the backlog":     {md: map[string]string{"queue": "jobs"}, waiting: 2, inFlight: 3, wantBacklog: 5, wantActive: true},
		"at the activation depth is inactive": {md: map[string]string{"queue": "jobs", "activationQueueDepth": "5"}, waiting: 5, wantBacklog: 5, wantActive: false},
		"above the activation depth":          {md: map[string]string{"queue": "jobs", "activationQueueDepth": "5"}, waiting: 6, wantBacklog: 6, wantActive: true},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			clock := newFakeClock(t0)
			s := NewState(clock.Now)
			s.Apply(queueEvent("ml", "jobs", tc.waiting, tc.inFlight), t0)
			r := read(t, s, mustTrigger(t, "ml", tc.md))
			wantMetric(t, r, MetricQueueBacklog, tc.wantBacklog)
			if active, err := r.Active(); err != nil || active != tc.wantActive {
				t.Fatalf("Active() = %v, %v; want %v", active, err, tc.wantActive)
			}
		})
	}
}

func TestQueueUnavailable(t *testing.T) {
	clock := newFakeClock(t0)
	s := NewState(clock.Now)
	tr := mustTrigger(t, "ml", map[string]string{"queue": "jobs", "staleAfter": "30s"})

	r := read(t, s, tr)
	_, err := r.Metric(MetricQueueBacklog)
	wantUnavailable(t, err, "no report for queue ml/jobs", "since this scaler started at 2026-11-22T10:00:00Z")
	if _, err := r.Active(); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("Active() error %v, want ErrUnavailable", err)
	}

	s.Apply(queueEvent("ml", "jobs", 4, 0), t0)
	clock.Advance(30 * time.Second) // exactly staleAfter old: still fresh
	wantMetric(t, read(t, s, tr), MetricQueueBacklog, 4)

	clock.Advance(15 * time.Second)
	r = read(t, s, tr)
	_, err = r.Metric(MetricQueueBacklog)
	wantUnavailable(t, err, "queue ml/jobs last reported at 2026-11-22T10:00:00Z, 45s ago", "staleAfter 30s")
	if active, err := r.Active(); active || !errors.Is(err, ErrUnavailable) {
		t.Fatalf("stale Active() = %v, %v; want false, ErrUnavailable (never a silent inactive)", active, err)
	}
}

func TestNamespaceIsolation(t *testing.T) {
	s := NewState(newFakeClock(t0).Now)
	s.Apply(queueEvent("team-a", "jobs", 9, 0), t0)
	s.Apply(nodeEvent("n1",
		gpu("GPU-a", "team-a", "llm-0", map[string]string{"app": "llm"}, 90, 10, 80),
	), t0)

	r := read(t, s, mustTrigger(t, "team-b", map[string]string{"queue": "jobs"}))
	if _, err := r.Metric(MetricQueueBacklog); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("team-b read team-a's queue: error %v, want ErrUnavailable", err)
	}
	r = read(t, s, mustTrigger(t, "team-b", map[string]string{"podSelector": "app=llm", "gpuUtilTarget": "50"}))
	wantMetric(t, r, MetricGPUUtil, 0)
	if r.gpuActive || r.gpuActiveErr != nil {
		t.Fatalf("team-b saw team-a's GPUs: GPU part active %v, %v; want false, nil", r.gpuActive, r.gpuActiveErr)
	}
}

func TestGPUMetrics(t *testing.T) {
	llm := map[string]string{"app": "llm", "tier": "gpu"}
	other := map[string]string{"app": "other"}
	// Two nodes: llm-0 holds two GPUs on n1, llm-1 one GPU on n2; other pods and free
	// GPUs are there to be left out.
	events := []gpuscalerv1.Event{
		nodeEvent("n1",
			gpu("GPU-1", "ml", "llm-0", llm, 90, 40, 80),
			gpu("GPU-2", "ml", "llm-0", llm, 70, 20, 80),
			gpu("GPU-3", "ml", "other-0", other, 100, 80, 80),
			gpu("GPU-4", "", "", nil, 0, 0, 80),
		),
		nodeEvent("n2",
			gpu("GPU-5", "ml", "llm-1", llm, 50, 60, 80),
			gpu("GPU-6", "prod", "llm-0", llm, 100, 80, 80), // same labels, other namespace
		),
	}
	tests := map[string]struct {
		md               map[string]string
		wantUtil, wantMB float64
		wantActive       bool
	}{
		// Observed: 3 GPUs over 2 pods = 1.5 per replica. Util sum 210 → 140; memory
		// 50%+25%+75% = 150 → 100.
		"observed GPUs per replica": {
			md:       map[string]string{"podSelector": "app=llm", "gpuUtilTarget": "60", "gpuMemoryTarget": "80"},
			wantUtil: 140, wantMB: 100, wantActive: true,
		},
		"explicit GPUs per replica": {
			md:       map[string]string{"podSelector": "app=llm", "gpuUtilTarget": "60", "gpuMemoryTarget": "80", "gpusPerReplica": "1"},
			wantUtil: 210, wantMB: 150, wantActive: true,
		},
		"set-based selector": {
			md:       map[string]string{"podSelector": "tier in (gpu),app!=other", "gpuUtilTarget": "60", "gpuMemoryTarget": "80", "gpusPerReplica": "3"},
			wantUtil: 70, wantMB: 50, wantActive: true,
		},
		// With a queue, idle here, the GPU part's own activity decides: above
		// activationGpuUtil. A trigger with only podSelector is always active.
		"activation above the average": {
			md:       map[string]string{"queue": "idle", "podSelector": "app=llm", "gpuUtilTarget": "60", "gpuMemoryTarget": "80", "activationGpuUtil": "69"},
			wantUtil: 140, wantMB: 100, wantActive: true,
		},
		"activation at the average is inactive": {
			md:       map[string]string{"queue": "idle", "podSelector": "app=llm", "gpuUtilTarget": "60", "gpuMemoryTarget": "80", "activationGpuUtil": "70"},
			wantUtil: 140, wantMB: 100, wantActive: false,
		},
		"selector matching nothing, with a queue": {
			md:       map[string]string{"queue": "idle", "podSelector": "app=absent", "gpuUtilTarget": "60", "gpuMemoryTarget": "80"},
			wantUtil: 0, wantMB: 0, wantActive: false,
		},
		"selector matching nothing, only podSelector: active": {
			md:       map[string]string{"podSelector": "app=absent", "gpuUtilTarget": "60", "gpuMemoryTarget": "80"},
			wantUtil: 0, wantMB: 0, wantActive: true,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			s := NewState(newFakeClock(t0).Now)
			for _, ev := range events {
				s.Apply(ev, t0)
			}
			s.Apply(queueEvent("ml", "idle", 0, 0), t0)
			r := read(t, s, mustTrigger(t, "ml", tc.md))
			wantMetric(t, r, MetricGPUUtil, tc.wantUtil)
			wantMetric(t, r, MetricGPUMemory, tc.wantMB)
			if active, err := r.Active(); err != nil || active != tc.wantActive {
				t.Fatalf("Active() = %v, %v; want %v", active, err, tc.wantActive)
			}
		})
	}
}

// TestGPUMetricsFollowReports checks a node's new report replaces its old one whole,
// including pods that left it, and that the index follows.
func TestGPUMetricsFollowReports(t *testing.T) {
	s := NewState(newFakeClock(t0).Now)
	tr := mustTrigger(t, "ml", map[string]string{"podSelector": "app=llm", "gpuUtilTarget": "60"})
	llm := map[string]string{"app": "llm"}

	s.Apply(nodeEvent("n1", gpu("GPU-1", "ml", "llm-0", llm, 80, 1, 80)), t0)
	wantMetric(t, read(t, s, tr), MetricGPUUtil, 80)

	s.Apply(nodeEvent("n1", gpu("GPU-1", "ml", "llm-0", llm, 30, 1, 80)), t0)
	wantMetric(t, read(t, s, tr), MetricGPUUtil, 30)

	// The pod moves from n1 to n2.
	s.Apply(nodeEvent("n1", gpu("GPU-1", "", "", nil, 0, 0, 80)), t0)
	s.Apply(nodeEvent("n2", gpu("GPU-9", "ml", "llm-0", llm, 55, 1, 80)), t0)
	wantMetric(t, read(t, s, tr), MetricGPUUtil, 55)
	if nodes, gpus, _ := s.Size(); nodes != 2 || gpus != 2 {
		t.Fatalf("Size() = %d nodes, %d gpus; want 2, 2", nodes, gpus)
	}
	s.mu.RLock()
	_, stillIndexed := s.byNamespace["ml"]["n1"]
	s.mu.RUnlock()
	if stillIndexed {
		t.Fatal("n1 is still indexed under namespace ml after its pod left")
	}
}

func TestGPUUnavailable(t *testing.T) {
	llm := map[string]string{"app": "llm"}
	tr := func(t *testing.T) *Trigger {
		return mustTrigger(t, "ml", map[string]string{"podSelector": "app=llm", "gpuUtilTarget": "60", "gpuMemoryTarget": "80", "staleAfter": "30s"})
	}

	t.Run("no node report yet", func(t *testing.T) {
		s := NewState(newFakeClock(t0).Now)
		r := read(t, s, tr(t))
		_, err := r.Metric(MetricGPUUtil)
		wantUnavailable(t, err, "no node report since this scaler started")
		_, err = r.Active()
		wantUnavailable(t, err, "no node report")
	})
	t.Run("every node silent", func(t *testing.T) {
		clock := newFakeClock(t0)
		s := NewState(clock.Now)
		s.Apply(nodeEvent("n1", gpu("GPU-1", "", "", nil, 0, 0, 80)), t0)
		clock.Advance(time.Minute)
		_, err := read(t, s, tr(t)).Metric(MetricGPUMemory)
		wantUnavailable(t, err, "no node has reported since 2026-11-22T10:00:00Z, 1m0s ago")
	})
	t.Run("the node holding the workload is silent", func(t *testing.T) {
		clock := newFakeClock(t0)
		s := NewState(clock.Now)
		s.Apply(nodeEvent("n1", gpu("GPU-1", "ml", "llm-0", llm, 90, 1, 80)), t0)
		clock.Advance(40 * time.Second)
		s.Apply(nodeEvent("n2", gpu("GPU-2", "", "", nil, 0, 0, 80)), clock.Now())
		r := read(t, s, tr(t))
		_, err := r.Metric(MetricGPUUtil)
		wantUnavailable(t, err, "node n1 last reported at 2026-11-22T10:00:00Z, 40s ago", "GPU-1 of pod ml/llm-0")
		if active, err := r.Active(); active || !errors.Is(err, ErrUnavailable) {
			t.Fatalf("Active() = %v, %v; want false, ErrUnavailable", active, err)
		}
	})
	t.Run("a silent node holding other pods does not matter", func(t *testing.T) {
		clock := newFakeClock(t0)
		s := NewState(clock.Now)
		s.Apply(nodeEvent("n1", gpu("GPU-1", "ml", "batch-0", map[string]string{"app": "batch"}, 90, 1, 80)), t0)
		clock.Advance(40 * time.Second)
		s.Apply(nodeEvent("n2", gpu("GPU-2", "ml", "llm-0", llm, 20, 8, 80)), clock.Now())
		wantMetric(t, read(t, s, tr(t)), MetricGPUUtil, 20)
	})
	t.Run("a GPU without utilisation", func(t *testing.T) {
		s := NewState(newFakeClock(t0).Now)
		g := gpu("GPU-1", "ml", "llm-0", llm, 0, 40, 80)
		g.GpuUtil = nil
		s.Apply(nodeEvent("n1", g), t0)
		r := read(t, s, tr(t))
		_, err := r.Metric(MetricGPUUtil)
		wantUnavailable(t, err, "GPU GPU-1 on node n1 (pod ml/llm-0) reports no utilisation")
		wantMetric(t, r, MetricGPUMemory, 50) // memory is still known
		// A trigger with only podSelector is active while its pods can be judged: it
		// needs no utilisation figure for that.
		if active, err := r.Active(); !active || err != nil {
			t.Fatalf("Active() = %v, %v; want true, nil", active, err)
		}
	})
	t.Run("a GPU without framebuffer figures", func(t *testing.T) {
		s := NewState(newFakeClock(t0).Now)
		g := gpu("GPU-1", "ml", "llm-0", llm, 30, 0, 0)
		g.FbTotalBytes = nil
		s.Apply(nodeEvent("n1", g), t0)
		r := read(t, s, tr(t))
		_, err := r.Metric(MetricGPUMemory)
		wantUnavailable(t, err, "reports no framebuffer use and size")
		wantMetric(t, r, MetricGPUUtil, 30)
	})
}

func TestActiveCombinesParts(t *testing.T) {
	llm := map[string]string{"app": "llm"}
	md := map[string]string{"queue": "jobs", "podSelector": "app=llm", "gpuUtilTarget": "60", "staleAfter": "30s"}

	t.Run("an active queue wins over unknown GPUs", func(t *testing.T) {
		s := NewState(newFakeClock(t0).Now)
		s.Apply(queueEvent("ml", "jobs", 1, 0), t0)
		if active, err := read(t, s, mustTrigger(t, "ml", md)).Active(); !active || err != nil {
			t.Fatalf("Active() = %v, %v; want true, nil", active, err)
		}
	})
	t.Run("busy GPUs win over an unknown queue", func(t *testing.T) {
		s := NewState(newFakeClock(t0).Now)
		s.Apply(nodeEvent("n1", gpu("GPU-1", "ml", "llm-0", llm, 10, 1, 80)), t0)
		if active, err := read(t, s, mustTrigger(t, "ml", md)).Active(); !active || err != nil {
			t.Fatalf("Active() = %v, %v; want true, nil", active, err)
		}
	})
	t.Run("idle queue and unknown GPUs is an error, not false", func(t *testing.T) {
		s := NewState(newFakeClock(t0).Now)
		s.Apply(queueEvent("ml", "jobs", 0, 0), t0)
		active, err := read(t, s, mustTrigger(t, "ml", md)).Active()
		if active {
			t.Fatal("Active() = true, want false")
		}
		wantUnavailable(t, err, "no node report")
	})
	t.Run("all idle is false", func(t *testing.T) {
		s := NewState(newFakeClock(t0).Now)
		s.Apply(queueEvent("ml", "jobs", 0, 0), t0)
		s.Apply(nodeEvent("n1", gpu("GPU-1", "ml", "llm-0", llm, 0, 1, 80)), t0)
		if active, err := read(t, s, mustTrigger(t, "ml", md)).Active(); active || err != nil {
			t.Fatalf("Active() = %v, %v; want false, nil", active, err)
		}
	})
}

func TestUnknownMetric(t *testing.T) {
	s := NewState(newFakeClock(t0).Now)
	r := read(t, s, mustTrigger(t, "ml", map[string]string{"queue": "jobs"}))
	if _, err := r.Metric(MetricGPUUtil); !errors.Is(err, ErrUnknownMetric) {
		t.Fatalf("Metric(gpu-util) on a queue trigger: %v, want ErrUnknownMetric", err)
	}
}

func TestForget(t *testing.T) {
	s := NewState(newFakeClock(t0).Now)
	s.Apply(queueEvent("ml", "old", 1, 0), t0)
	s.Apply(queueEvent("ml", "new", 1, 0), t0.Add(10*time.Minute))
	s.Apply(nodeEvent("n-old", gpu("GPU-1", "ml", "p", nil, 1, 1, 2)), t0)
	s.Apply(nodeEvent("n-new", gpu("GPU-2", "ml", "q", nil, 1, 1, 2)), t0.Add(10*time.Minute))
	if n := s.Forget(t0.Add(time.Minute)); n != 2 {
		t.Fatalf("Forget dropped %d entries, want 2", n)
	}
	if nodes, gpus, queues := s.Size(); nodes != 1 || gpus != 1 || queues != 1 {
		t.Fatalf("Size() = %d, %d, %d; want 1, 1, 1", nodes, gpus, queues)
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	if len(s.byNamespace["ml"]) != 1 {
		t.Fatalf("namespace index holds %d nodes after Forget, want 1", len(s.byNamespace["ml"]))
	}
}

// TestQueueLimitPerNamespace: a namespace at its limit of queues gets no new one, and a
// trigger on a refused queue says why; its queues tracked keep updating, other
// namespaces are unaffected, and queues forgotten after the stream's max age free their
// places.
func TestQueueLimitPerNamespace(t *testing.T) {
	clock := newFakeClock(t0)
	s := NewState(clock.Now)
	if s.maxQueuesPerNS != DefaultMaxQueuesPerNamespace {
		t.Fatalf("default limit = %d, want %d", s.maxQueuesPerNS, DefaultMaxQueuesPerNamespace)
	}
	s.SetMaxQueuesPerNamespace(3)
	apply := func(ns, q string, waiting uint64, stored time.Time) error {
		t.Helper()
		return s.Apply(queueEvent(ns, q, waiting, 0), stored)
	}
	for _, q := range []string{"q1", "q2", "q3"} {
		if err := apply("evil", q, 1, t0); err != nil {
			t.Fatalf("queue %s under the limit: %v", q, err)
		}
	}
	err := apply("evil", "q4", 1, t0)
	if !errors.Is(err, ErrQueueLimit) || !strings.Contains(err.Error(), "evil/q4") || !strings.Contains(err.Error(), "--max-queues-per-namespace") {
		t.Fatalf("fourth queue: error %v, want ErrQueueLimit naming evil/q4 and the flag", err)
	}
	if n := s.NamespacesAtQueueLimit(); n != 1 {
		t.Fatalf("NamespacesAtQueueLimit() = %d, want 1", n)
	}
	_, err = read(t, s, mustTrigger(t, "evil", map[string]string{"queue": "q4"})).Metric(MetricQueueBacklog)
	wantUnavailable(t, err, "no report for queue evil/q4", "namespace evil has 3 queues", "--max-queues-per-namespace")

	// Tracked queues keep updating; another namespace is not limited by this one.
	if err := apply("evil", "q1", 7, t0.Add(10*time.Minute)); err != nil {
		t.Fatalf("update of a tracked queue: %v", err)
	}
	clock.Advance(10 * time.Minute)
	wantMetric(t, read(t, s, mustTrigger(t, "evil", map[string]string{"queue": "q1"})), MetricQueueBacklog, 7)
	for _, q := range []string{"jobs", "a", "b"} {
		if err := apply("ml", q, 2, t0.Add(10*time.Minute)); err != nil {
			t.Fatalf("queue ml/%s: %v", q, err)
		}
	}
	wantMetric(t, read(t, s, mustTrigger(t, "ml", map[string]string{"queue": "jobs"})), MetricQueueBacklog, 2)
	if n := s.NamespacesAtQueueLimit(); n != 2 {
		t.Fatalf("NamespacesAtQueueLimit() = %d, want 2 (evil and ml, each at 3)", n)
	}

	// q2 and q3 fall silent past the max age: their places go to new queues, two of them.
	if n := s.Forget(t0.Add(5 * time.Minute)); n != 2 {
		t.Fatalf("Forget dropped %d queues, want 2", n)
	}
	for _, q := range []string{"q5", "q6"} {
		if err := apply("evil", q, 1, t0.Add(10*time.Minute)); err != nil {
			t.Fatalf("queue %s after Forget freed places: %v", q, err)
		}
	}
	if err := apply("evil", "q7", 1, t0.Add(10*time.Minute)); !errors.Is(err, ErrQueueLimit) {
		t.Fatalf("queue q7 past the limit again: error %v, want ErrQueueLimit", err)
	}
	// Everything forgotten, the namespace is gone from the count.
	s.Forget(t0.Add(time.Hour))
	if _, _, queues := s.Size(); queues != 0 || len(s.queuesPerNS) != 0 || s.NamespacesAtQueueLimit() != 0 {
		t.Fatalf("after forgetting everything: %d queues, per-namespace counts %v; want none", queues, s.queuesPerNS)
	}

	// No limit: zero or less.
	s.SetMaxQueuesPerNamespace(0)
	for i := range 10 {
		if err := apply("evil", "n"+itoa(i), 1, t0.Add(time.Hour)); err != nil {
			t.Fatalf("without a limit: %v", err)
		}
	}
}

func TestWatchWakesOnlyConcernedWatchers(t *testing.T) {
	s := NewState(newFakeClock(t0).Now)
	jobs := s.Watch(mustTrigger(t, "ml", map[string]string{"queue": "jobs"}))
	defer jobs.Stop()
	other := s.Watch(mustTrigger(t, "ml", map[string]string{"queue": "other"}))
	defer other.Stop()
	gpus := s.Watch(mustTrigger(t, "ml", map[string]string{"podSelector": "app=llm", "gpuUtilTarget": "50"}))
	defer gpus.Stop()

	signalled := func(w *Watch) bool {
		select {
		case <-w.C:
			return true
		default:
			return false
		}
	}
	s.Apply(queueEvent("ml", "jobs", 1, 0), t0)
	s.Apply(queueEvent("ml", "jobs", 2, 0), t0) // merges into the pending signal
	if !signalled(jobs) || signalled(jobs) || signalled(other) || signalled(gpus) {
		t.Fatal("a queue report woke the wrong watchers, or one watcher twice")
	}
	// Node reports wake no one: GPU activity cannot wake a workload at zero replicas,
	// which holds no GPUs, and waking every GPU watcher on every report costs the writer.
	s.Apply(nodeEvent("n1", gpu("GPU-1", "ml", "llm-0", map[string]string{"app": "llm"}, 90, 1, 2)), t0)
	if signalled(gpus) || signalled(jobs) {
		t.Fatal("a node report woke a watcher")
	}
	jobs.Stop()
	jobs.Stop() // twice is fine
	s.Apply(queueEvent("ml", "jobs", 3, 0), t0)
	if signalled(jobs) {
		t.Fatal("a stopped watcher was woken")
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	if _, ok := s.queueWatch[queueKey{"ml", "jobs"}]; ok {
		t.Fatal("Stop left an empty watcher set behind")
	}
}

// TestWatchRemembersABriefDip: reports merge into one wake-up, but a report showing the
// queue at or below the activation depth is remembered, however soon it was superseded.
func TestWatchRemembersABriefDip(t *testing.T) {
	s := NewState(newFakeClock(t0).Now)
	w := s.Watch(mustTrigger(t, "ml", map[string]string{"queue": "jobs", "activationQueueDepth": "2"}))
	defer w.Stop()
	s.Apply(queueEvent("ml", "jobs", 5, 0), t0)
	s.Apply(queueEvent("ml", "jobs", 3, 0), t0)
	if w.SawInactive() {
		t.Fatal("SawInactive after backlogs 5 and 3 (depth 2), want false")
	}
	s.Apply(queueEvent("ml", "jobs", 1, 1), t0) // backlog 2: at the depth, inactive
	s.Apply(queueEvent("ml", "jobs", 9, 0), t0)
	if !w.SawInactive() {
		t.Fatal("SawInactive after a dip to 2 (depth 2), want true")
	}
	if w.SawInactive() {
		t.Fatal("SawInactive twice for one dip, want it reset by the first call")
	}
}

// TestMemoryTriggerActivity: a trigger scaling on framebuffer use alone, with no
// utilisation threshold, is active while the workload holds GPUs, and needs no
// utilisation figure (a source may have none, as NVML on MIG slices).
func TestMemoryTriggerActivity(t *testing.T) {
	s := NewState(newFakeClock(t0).Now)
	g := gpu("GPU-1", "ml", "llm-0", map[string]string{"app": "llm"}, 0, 70, 80)
	g.GpuUtil = nil
	s.Apply(nodeEvent("n1", g), t0)
	s.Apply(nodeEvent("n2", gpu("GPU-2", "", "", nil, 0, 0, 80)), t0)

	r := read(t, s, mustTrigger(t, "ml", map[string]string{"podSelector": "app=llm", "gpuMemoryTarget": "80"}))
	wantMetric(t, r, MetricGPUMemory, 87.5)
	if active, err := r.Active(); !active || err != nil {
		t.Fatalf("Active() = %v, %v; want true, nil while the workload holds a GPU", active, err)
	}
	r = read(t, s, mustTrigger(t, "ml", map[string]string{"podSelector": "app=gone", "gpuMemoryTarget": "80"}))
	if r.gpuActive || r.gpuActiveErr != nil {
		t.Fatalf("GPU part active %v, %v; want false, nil for a workload holding no GPU", r.gpuActive, r.gpuActiveErr)
	}
	// Given a utilisation threshold (with a queue: a trigger with only podSelector takes
	// none), the GPU part is judged on utilisation, which this GPU lacks.
	s.Apply(queueEvent("ml", "idle", 0, 0), t0)
	r = read(t, s, mustTrigger(t, "ml", map[string]string{"queue": "idle", "podSelector": "app=llm", "gpuMemoryTarget": "80", "activationGpuUtil": "5"}))
	if _, err := r.Active(); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("Active() error %v, want ErrUnavailable", err)
	}
}
