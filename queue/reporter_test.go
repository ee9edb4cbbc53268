package queue

import (
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gpuscaler/gpuscaler/internal/natstest"

	"github.com/nats-io/nats.go"
	"google.golang.org/protobuf/types/known/timestamppb"

	pb "github.com/gpuscaler/gpuscaler/proto/externalscaler"
	gpuscalerv1 "github.com/gpuscaler/gpuscaler/proto/gpuscaler/v1"
	"github.com/gpuscaler/gpuscaler/scaler/scalertest"
	"github.com/gpuscaler/gpuscaler/test/testkit"
)

// TestEnqueuedActivatesStream runs the path that wakes a workload at zero: a producer's
// first item reaches a real scaler, which pushes true on an open StreamIsActive. The
// interval is an hour, so only the report on the empty-to-non-empty change can do it.
func TestEnqueuedActivatesStream(t *testing.T) {
	ns := natstest.Start(t, "", "")
	_, client := scalertest.Start(t, ns.ClientURL())
	r := newReporter(t, natstest.Connect(t, ns.ClientURL()).Conn, "ml", "jobs", Config{Interval: time.Hour})
	ref := &pb.ScaledObjectRef{Name: "llm", Namespace: "ml", ScalerMetadata: map[string]string{"queue": "jobs"}}

	// The first report, at start, tells the scaler the queue exists and is empty.
	testkit.Eventually(t, 5*time.Second, func() bool {
		resp, err := client.IsActive(t.Context(), ref)
		return err == nil && !resp.GetResult()
	})
	stream, err := client.StreamIsActive(t.Context(), ref)
	if err != nil {
		t.Fatal(err)
	}
	msgs := make(chan bool, 4)
	go func() {
		for {
			resp, err := stream.Recv()
			if err != nil {
				close(msgs)
				return
			}
			msgs <- resp.GetResult()
		}
	}()
	expect := func(want bool) {
		t.Helper()
		select {
		case got, ok := <-msgs:
			if !ok || got != want {
				t.Fatalf("stream sent %v (open %v), want %v", got, ok, want)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("no stream message within 5s, want %v", want)
		}
	}
	expect(false)
	r.Enqueued(1)
	expect(true)

	resp, err := client.GetMetrics(t.Context(), &pb.GetMetricsRequest{ScaledObjectRef: ref, MetricName: "queue-backlog"})
	if err != nil {
		t.Fatal(err)
	}
	if got := resp.GetMetricValues()[0].GetMetricValueFloat(); got != 1 {
		t.Errorf("queue-backlog = %v, want 1", got)
	}
}

// TestHeartbeats checks reports keep coming every interval, idle or not, numbered 1, 2,
// 3…, with the counts the calls made and each arrival counted once.
func TestHeartbeats(t *testing.T) {
	ns := natstest.Start(t, "", "")
	sub := subscribe(t, ns.ClientURL(), "ml", "jobs")
	r := newReporter(t, natstest.Connect(t, ns.ClientURL()).Conn, "ml", "jobs", Config{Interval: 50 * time.Millisecond, ProducerID: "p1"})

	first := sub.next()
	if first.GetSequence() != 1 || first.GetWaiting() != 0 || first.GetInFlight() != 0 || first.GetArrivals() != 0 {
		t.Fatalf("first report %v, want sequence 1 of an empty queue", first)
	}
	r.Enqueued(3)
	r.Started(2)
	r.Finished(1)
	got := append([]*gpuscalerv1.QueueReport{first}, sub.until(func(q *gpuscalerv1.QueueReport) bool {
		return q.GetWaiting() == 1 && q.GetInFlight() == 1
	})...)
	// Idle now: heartbeats go on, with no new arrivals.
	for range 3 {
		q := sub.next()
		if q.GetWaiting() != 1 || q.GetInFlight() != 1 || q.GetArrivals() != 0 {
			t.Errorf("idle heartbeat %v, want waiting 1, in flight 1, no arrivals", q)
		}
		got = append(got, q)
	}
	var arrivals uint64
	for i, q := range got {
		arrivals += q.GetArrivals()
		if q.GetSequence() != uint64(i+1) {
			t.Errorf("report %d has sequence %d, want %d", i, q.GetSequence(), i+1)
		}
		if q.GetProducerId() != "p1" || q.GetNamespace() != "ml" || q.GetQueue() != "jobs" {
			t.Errorf("report %d: %v, want producer p1, queue ml/jobs", i, q)
		}
		if q.GetObservedAt() == nil || (i > 0 && q.GetObservedAt().AsTime().Before(got[i-1].GetObservedAt().AsTime())) {
			t.Errorf("report %d observed at %v, want a time not before the previous, %v", i, q.GetObservedAt(), got[max(i-1, 0)].GetObservedAt())
		}
	}
	if arrivals != 3 {
		t.Errorf("arrivals over all reports = %d, want 3", arrivals)
	}
}

// TestConsistentUnderConcurrency has many goroutines move items through the queue while
// reports go out every millisecond, until 100 reports have been checked: no report may
// show a state that never existed, no arrival may be lost or counted twice, and the last
// report has the final counts.
func TestConsistentUnderConcurrency(t *testing.T) {
	const (
		base       = 10 // items that wait throughout
		goroutines = 8
		reports    = 100
	)
	ns := natstest.Start(t, "", "")
	sub := subscribe(t, ns.ClientURL(), "ml", "jobs")
	r := newReporter(t, natstest.Connect(t, ns.ClientURL()).Conn, "ml", "jobs", Config{Interval: time.Millisecond})
	r.Enqueued(base)
	var (
		wg       sync.WaitGroup
		stop     atomic.Bool
		enqueued atomic.Uint64
	)
	for range goroutines {
		wg.Go(func() {
			for !stop.Load() {
				r.Enqueued(1)
				r.Started(1)
				r.Finished(1)
				enqueued.Add(1)
				runtime.Gosched() // let the Reporter's goroutine run on a machine of few cores
			}
		})
	}
	var (
		arrivals uint64
		seq      uint64
	)
	check := func(q *gpuscalerv1.QueueReport) {
		t.Helper()
		before := arrivals
		arrivals += q.GetArrivals()
		seq++
		// Each goroutine holds at most one item of its own, waiting or in flight, on top
		// of the base. Only a report from before Enqueued(base) is empty: no report
		// before it counted an arrival. (Its own arrivals may be ahead of its counts.)
		b := q.Backlog()
		if (b < base && !(b == 0 && before == 0)) || b > base+goroutines || q.GetInFlight() > goroutines {
			t.Errorf("report %d: waiting %d, in flight %d; want a backlog from %d to %d, at most %d in flight",
				q.GetSequence(), q.GetWaiting(), q.GetInFlight(), base, base+goroutines, goroutines)
		}
		if q.GetSequence() != seq {
			t.Errorf("report has sequence %d, want %d", q.GetSequence(), seq)
		}
	}
	for range reports {
		check(sub.next())
	}
	stop.Store(true)
	wg.Wait()
	if err := r.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	total := base + enqueued.Load()
	for {
		q := sub.next()
		check(q)
		if arrivals > total {
			t.Fatalf("arrivals reach %d by report %d, more than the %d enqueued", arrivals, q.GetSequence(), total)
		}
		if arrivals == total && q.GetWaiting() == base && q.GetInFlight() == 0 {
			break
		}
	}
	t.Logf("%d reports during %d updates", seq, 3*(total-base))
}

// TestStoppedNATS stops the NATS server under a Reporter: its methods still return at
// once, no report piles up in the connection's reconnect buffer, and when NATS is back
// on the same address the current counts are published.
func TestStoppedNATS(t *testing.T) {
	addr, dir := testkit.FreeAddr(t), t.TempDir()
	ns := natstest.Start(t, addr, dir)
	nc := natstest.Connect(t, ns.ClientURL())
	r := newReporter(t, nc.Conn, "ml", "jobs", Config{Interval: 50 * time.Millisecond})

	ns.Shutdown()
	testkit.Eventually(t, 10*time.Second, func() bool { return !nc.IsConnected() })
	const goroutines, iterations = 4, 25_000
	done := make(chan struct{})
	go func() {
		defer close(done)
		var wg sync.WaitGroup
		for range goroutines {
			wg.Go(func() {
				for range iterations {
					r.Enqueued(2)
					r.Started(1)
					r.Finished(1)
				}
			})
		}
		wg.Wait()
	}()
	testkit.Eventually(t, time.Minute, func() bool {
		select {
		case <-done:
			return true
		default:
			return false
		}
	})
	// Reports came due and were held back, not written into the reconnect buffer. One
	// may have slipped in as the connection dropped, between looking and publishing.
	held := r.heldReports.Load()
	testkit.Eventually(t, 10*time.Second, func() bool { return r.heldReports.Load() >= held+3 })
	size := (&gpuscalerv1.QueueReport{Namespace: "ml", Queue: "jobs", Waiting: MaxCount, InFlight: MaxCount, Arrivals: 1 << 40,
		ObservedAt: timestamppb.Now(), ProducerId: r.cfg.ProducerID, Sequence: 1 << 20,
		Traffic: &gpuscalerv1.QueueTraffic{ArrivalsTotal: 1 << 40, CompletionsTotal: 1 << 40, DroppedTotal: 1 << 40,
			BusySecondsTotal: 1, ArrivalRate: 1, CompletionRate: 1, DropRate: 1, ServiceSeconds: 1, ArrivalDispersion: 1, ArrivalTrend: 1,
			ArrivalLevel: 1, LevelWindowSeconds: 1}}).SizeVT()
	onePub := len(fmt.Sprintf("PUB gpuscaler.v1.queue.ml.jobs %d\r\n", size)) + size + 2
	if n, err := nc.Buffered(); err != nil || n > onePub {
		t.Errorf("reconnect buffer holds %d bytes (%v), want at most one report (%d bytes): reports must wait for NATS, not queue for it", n, err, onePub)
	}

	ns = natstest.Start(t, addr, dir)
	sub := subscribe(t, ns.ClientURL(), "ml", "jobs")
	got := sub.until(func(q *gpuscalerv1.QueueReport) bool {
		return q.GetWaiting() == goroutines*iterations && q.GetInFlight() == 0
	})
	// What was counted while NATS was away is in the traffic's totals all the same.
	if tr := got[len(got)-1].GetTraffic(); tr.GetArrivalsTotal() != 2*goroutines*iterations || tr.GetCompletionsTotal() != goroutines*iterations {
		t.Errorf("traffic after NATS came back: %d arrivals, %d completions; want %d, %d",
			tr.GetArrivalsTotal(), tr.GetCompletionsTotal(), 2*goroutines*iterations, goroutines*iterations)
	}
	if err := r.Close(); err != nil {
		t.Errorf("Close after NATS came back: %v", err)
	}
}

// TestCloseFlushes checks Close publishes the current counts and waits for NATS to have
// them, and that a closed Reporter stays harmless.
func TestCloseFlushes(t *testing.T) {
	ns := natstest.Start(t, "", "")
	sub := subscribe(t, ns.ClientURL(), "ml", "jobs")
	r := newReporter(t, natstest.Connect(t, ns.ClientURL()).Conn, "ml", "jobs", Config{Interval: time.Hour})
	if q := sub.next(); q.GetSequence() != 1 || q.Backlog() != 0 {
		t.Fatalf("first report %v, want sequence 1 of an empty queue", q)
	}
	r.Enqueued(1) // empty to non-empty: reported at once
	if q := sub.next(); q.GetSequence() != 2 || q.GetWaiting() != 1 || q.GetArrivals() != 1 {
		t.Fatalf("report after Enqueued(1): %v, want sequence 2, waiting 1, 1 arrival", q)
	}
	r.Started(1) // no change of emptiness: nothing until the next heartbeat, an hour away
	if err := r.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if q := sub.next(); q.GetSequence() != 3 || q.GetWaiting() != 0 || q.GetInFlight() != 1 || q.GetArrivals() != 0 {
		t.Fatalf("final report %v, want sequence 3, waiting 0, in flight 1, no arrivals", q)
	}
	if err := r.Close(); err != nil {
		t.Errorf("second Close: %v, want nil", err)
	}
	r.Enqueued(1)
	r.Started(1)
	r.Finished(1)
	r.Set(1, 1)
}

// TestSet checks Set replaces both counts, wakes an empty queue, and adds no arrivals.
func TestSet(t *testing.T) {
	ns := natstest.Start(t, "", "")
	sub := subscribe(t, ns.ClientURL(), "ml", "jobs")
	r := newReporter(t, natstest.Connect(t, ns.ClientURL()).Conn, "ml", "jobs", Config{Interval: time.Hour})
	sub.next()
	r.Set(5, 2)
	if q := sub.next(); q.GetWaiting() != 5 || q.GetInFlight() != 2 || q.GetArrivals() != 0 {
		t.Fatalf("report after Set(5, 2): %v, want waiting 5, in flight 2, no arrivals", q)
	}
	r.Set(-1, 3)
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if q := sub.next(); q.GetWaiting() != 0 || q.GetInFlight() != 3 {
		t.Fatalf("final report after Set(-1, 3): %v, want waiting 0, in flight 3", q)
	}
}

// TestCloseWithoutNATS checks Close returns, with an error that says so, when NATS is
// down.
func TestCloseWithoutNATS(t *testing.T) {
	ns := natstest.Start(t, "", "")
	nc := natstest.Connect(t, ns.ClientURL())
	r := newReporter(t, nc.Conn, "ml", "jobs", Config{})
	ns.Shutdown()
	testkit.Eventually(t, 10*time.Second, func() bool { return !nc.IsConnected() })
	r.Enqueued(1)
	if err := r.Close(); !errors.Is(err, nats.ErrDisconnected) {
		t.Fatalf("Close with NATS down: %v, want an error wrapping nats.ErrDisconnected", err)
	}
}

func TestNewReporterErrors(t *testing.T) {
	ns := natstest.Start(t, "", "")
	nc := natstest.Connect(t, ns.ClientURL()).Conn
	for name, tc := range map[string]struct {
		nc        *nats.Conn
		namespace string
		queue     string
		cfg       Config
		want      string
		wantIs    error
	}{
		"nil connection":        {nil, "ml", "jobs", Config{}, "connection is nil", nil},
		"empty namespace":       {nc, "", "jobs", Config{}, "namespace is empty", gpuscalerv1.ErrInvalidName},
		"upper-case namespace":  {nc, "ML", "jobs", Config{}, `namespace "ML" is not a DNS-1123 label`, gpuscalerv1.ErrInvalidName},
		"empty queue":           {nc, "ml", "", Config{}, "queue name is empty", gpuscalerv1.ErrInvalidName},
		"dot in queue":          {nc, "ml", "a.b", Config{}, `queue name "a.b" holds '.'`, gpuscalerv1.ErrInvalidName},
		"wildcard queue":        {nc, "ml", ">", Config{}, `queue name ">" holds '>'`, gpuscalerv1.ErrInvalidName},
		"negative interval":     {nc, "ml", "jobs", Config{Interval: -time.Second}, "interval -1s: want a positive duration", nil},
		"negative flushTimeout": {nc, "ml", "jobs", Config{FlushTimeout: -1}, "flush timeout -1ns: want a positive duration", nil},
	} {
		t.Run(name, func(t *testing.T) {
			r, err := NewReporter(tc.nc, tc.namespace, tc.queue, tc.cfg)
			if err == nil {
				r.Close()
				t.Fatalf("got no error, want one containing %q", tc.want)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got error %q, want one containing %q", err, tc.want)
			}
			if tc.wantIs != nil && !errors.Is(err, tc.wantIs) {
				t.Errorf("got error %v, want one wrapping %v", err, tc.wantIs)
			}
		})
	}
}

func TestDefaults(t *testing.T) {
	ns := natstest.Start(t, "", "")
	sub := subscribe(t, ns.ClientURL(), "ml", "jobs")
	r := newReporter(t, natstest.Connect(t, ns.ClientURL()).Conn, "ml", "jobs", Config{})
	if r.cfg.Interval != DefaultInterval || r.cfg.FlushTimeout != DefaultFlushTimeout {
		t.Errorf("interval %s, flush timeout %s; want %s, %s", r.cfg.Interval, r.cfg.FlushTimeout, DefaultInterval, DefaultFlushTimeout)
	}
	q := sub.next()
	if !strings.Contains(q.GetProducerId(), "-") || len(q.GetProducerId()) < 8 {
		t.Errorf("producer id %q, want the host name and a random suffix", q.GetProducerId())
	}
	other := newReporter(t, natstest.Connect(t, ns.ClientURL()).Conn, "ml", "other", Config{})
	if other.cfg.ProducerID == r.cfg.ProducerID {
		t.Errorf("two Reporters share producer id %q, want each its own", r.cfg.ProducerID)
	}
}

// TestFlappingQueueIsNotReportedPerFlap empties and fills a queue ten thousand times within
// one interval: the first filling is reported at once, and the rest wait for the next
// heartbeat, so a busy queue that keeps draining does not flood NATS.
func TestFlappingQueueIsNotReportedPerFlap(t *testing.T) {
	const flaps = 10_000
	ns := natstest.Start(t, "", "")
	sub := subscribe(t, ns.ClientURL(), "ml", "jobs")
	r := newReporter(t, natstest.Connect(t, ns.ClientURL()).Conn, "ml", "jobs", Config{Interval: time.Hour})
	sub.next() // the first report, at start, of the empty queue
	for range flaps {
		r.Enqueued(1)
		runtime.Gosched() // let the Reporter's goroutine see the queue full
		r.Started(1)
		r.Finished(1)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	var arrivals uint64
	got := sub.until(func(q *gpuscalerv1.QueueReport) bool {
		arrivals += q.GetArrivals()
		return arrivals == flaps && q.Backlog() == 0
	})
	// The first report at start, at most one at once for the queue filling, Close's.
	if last := got[len(got)-1]; last.GetSequence() > 3 {
		t.Errorf("%d reports for %d flaps within one interval, want at most 3", last.GetSequence(), flaps)
	}
}

// TestColdStartCarriedInEveryReport checks the measured cold start is in every report
// after ColdStart, the final one included, until replaced or cleared, and that recording
// it allocates nothing (it is called from a gateway's watch of endpoints).
func TestColdStartCarriedInEveryReport(t *testing.T) {
	ns := natstest.Start(t, "", "")
	sub := subscribe(t, ns.ClientURL(), "ml", "jobs")
	r := newReporter(t, natstest.Connect(t, ns.ClientURL()).Conn, "ml", "jobs", Config{Interval: time.Hour})
	if q := sub.next(); q.GetColdStartSeconds() != 0 {
		t.Fatalf("first report: cold start %g, want 0 (not measured)", q.GetColdStartSeconds())
	}
	r.ColdStart(45500 * time.Millisecond)
	r.Enqueued(1) // an empty queue gets work: a report at once
	if q := sub.next(); q.GetColdStartSeconds() != 45.5 {
		t.Fatalf("report after ColdStart(45.5s): cold start %g, want 45.5", q.GetColdStartSeconds())
	}
	r.Dropped(1)
	r.Enqueued(1) // the last report showed work: no report until the heartbeat
	r.ColdStart(-time.Second)
	r.ColdStart(31 * time.Second)
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if q := sub.next(); !q.GetStopped() || q.GetColdStartSeconds() != 31 {
		t.Fatalf("final report: %v, want stopped, cold start 31", q)
	}
	if n := testing.AllocsPerRun(100, func() { r.ColdStart(time.Minute) }); n != 0 {
		t.Errorf("ColdStart allocates %g times, want 0", n)
	}
}

// TestColdStartCleared checks a figure of 0 or less clears the one recorded.
func TestColdStartCleared(t *testing.T) {
	ns := natstest.Start(t, "", "")
	sub := subscribe(t, ns.ClientURL(), "ml", "jobs")
	r := newReporter(t, natstest.Connect(t, ns.ClientURL()).Conn, "ml", "jobs", Config{Interval: time.Hour})
	sub.next()
	r.ColdStart(20 * time.Second)
	r.ColdStart(-time.Second)
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if q := sub.next(); q.GetColdStartSeconds() != 0 {
		t.Fatalf("final report: cold start %g, want 0 once cleared", q.GetColdStartSeconds())
	}
}

// TestOldestWait: a report tells how long the oldest waiting item has waited, within a
// report interval of the time since it was enqueued (demand.Waits), and 0 once none
// waits.
func TestOldestWait(t *testing.T) {
	const interval = 100 * time.Millisecond
	ns := natstest.Start(t, "", "")
	sub := subscribe(t, ns.ClientURL(), "ml", "jobs")
	r := newReporter(t, natstest.Connect(t, ns.ClientURL()).Conn, "ml", "jobs", Config{Interval: interval})
	if q := sub.next(); q.GetTraffic().GetOldestWaitSeconds() != 0 {
		t.Fatalf("first report, nothing waiting: oldest wait %g s", q.GetTraffic().GetOldestWaitSeconds())
	}
	enqueued := time.Now()
	r.Enqueued(2)
	check := func(q *gpuscalerv1.QueueReport) {
		t.Helper()
		waited := q.GetObservedAt().AsTime().Sub(enqueued).Seconds()
		// Within a report interval, and half a second of slack below for a wake-up
		// report the scheduler held back (the items are then taken as arriving later).
		if got := q.GetTraffic().GetOldestWaitSeconds(); got < waited-interval.Seconds()-0.5 || got > waited+interval.Seconds() {
			t.Fatalf("report %d, %.3f s after the items were enqueued: oldest wait %.3f s", q.GetSequence(), waited, got)
		}
	}
	reports := sub.until(func(q *gpuscalerv1.QueueReport) bool {
		return q.GetObservedAt().AsTime().Sub(enqueued) > 10*interval
	})
	for _, q := range reports {
		check(q)
	}
	r.Started(1) // the other, enqueued with it, is the oldest now
	one := sub.until(func(q *gpuscalerv1.QueueReport) bool { return q.GetWaiting() == 1 })
	check(one[len(one)-1])
	r.Started(1)
	if q := sub.until(func(q *gpuscalerv1.QueueReport) bool { return q.GetWaiting() == 0 }); q[len(q)-1].GetTraffic().GetOldestWaitSeconds() != 0 {
		t.Fatalf("none waits: oldest wait %g s", q[len(q)-1].GetTraffic().GetOldestWaitSeconds())
	}
}
