package queue

import (
	"math"
	"runtime"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/gpuscaler/gpuscaler/internal/natstest"
	gpuscalerv1 "github.com/gpuscaler/gpuscaler/proto/gpuscaler/v1"
	"github.com/gpuscaler/gpuscaler/scaler"
	"github.com/gpuscaler/gpuscaler/scaler/scalertest"
)

// TestBusyIntegral: the items in flight, changed at known times, integrate exactly: one
// item from 10 to 40 and two from 20 to 30 are 50 item-nanoseconds, whatever the reads
// in between, and the integral goes on growing with the items still in flight.
func TestBusyIntegral(t *testing.T) {
	var b busy
	at := func(t int64) func() int64 { return func() int64 { return t } }
	b.change(1, 0, 10)
	if got, _, _ := b.read(at(15)); got != 5 {
		t.Errorf("at 15: integral %d, want 5", got)
	}
	b.change(2, 0, 20)
	b.change(-2, 2, 30)
	if got, c, _ := b.read(at(35)); got != 25+20 || c != 2 {
		t.Errorf("at 35: integral %d, %d completions; want 45, 2", got, c)
	}
	b.change(-1, 1, 40)
	if got, c, _ := b.read(at(1000)); got != 50 || c != 3 {
		t.Errorf("at 1000: integral %d, %d completions; want 50, 3", got, c)
	}
	// Times that wrap the sums around: the integral is still exact.
	b.change(3, 0, math.MaxInt64-5)
	if got, _, _ := b.read(at(math.MaxInt64)); got != 50+15 {
		t.Errorf("near the end of int64: integral %d, want 65", got)
	}
}

// TestBusyReadsWholeChanges: writers change the items in flight at times far from 0,
// each item starting and finishing at the same instant, while the reader reads. A read
// that saw a change's time without its count, or the other way round, would be off by
// about 2⁴⁰; a whole one is at most the items in flight times the 1,000 ns the times
// span.
func TestBusyReadsWholeChanges(t *testing.T) {
	const (
		base       = int64(1) << 40
		goroutines = 8
		items      = 20_000
	)
	var (
		b  busy
		wg sync.WaitGroup
	)
	for g := range goroutines {
		wg.Go(func() {
			for i := range items {
				at := base + int64((g*items+i)%1000)
				b.change(1, 0, at)
				b.change(-1, 1, at)
				if i%64 == 0 {
					runtime.Gosched()
				}
			}
		})
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	end := func() int64 { return base + 1000 }
	for reads := 0; ; reads++ {
		select {
		case <-done:
			got, c, _ := b.read(end)
			if got != 0 || c != goroutines*items {
				t.Fatalf("after every change: integral %d, %d completions; want 0, %d", got, c, goroutines*items)
			}
			t.Logf("%d reads", reads)
			return
		default:
		}
		if got, _, _ := b.read(end); got < 0 || got > goroutines*1000 {
			t.Fatalf("read %d: integral %d, want 0 to %d: a change read in part", reads, got, goroutines*1000)
		}
	}
}

// TestTrafficMeasured: the traffic in the final report counts every arrival, completion
// and drop, and its busy item-seconds lie between what the test saw from outside the
// calls: at least the time between returning from Started and calling Finished, at most
// the time between calling Started and returning from Finished, per item. Its service
// time is the busy seconds over the completions.
func TestTrafficMeasured(t *testing.T) {
	ns := natstest.Start(t, "", "")
	sub := subscribe(t, ns.ClientURL(), "ml", "jobs")
	r := newReporter(t, natstest.Connect(t, ns.ClientURL()).Conn, "ml", "jobs", Config{Interval: 10 * time.Millisecond})
	const workers, items = 4, 50
	var (
		mu     sync.Mutex
		lo, hi time.Duration
		wg     sync.WaitGroup
	)
	for range workers {
		wg.Go(func() {
			for i := range items {
				r.Enqueued(2)
				r.Dropped(1) // one of two times out before it starts
				before := time.Now()
				r.Started(1)
				started := time.Now()
				for j := 0; j < 1000*(i%5); j++ { // some work, of varied length
					runtime.Gosched()
				}
				finishing := time.Now()
				r.Finished(1)
				after := time.Now()
				mu.Lock()
				lo += finishing.Sub(started)
				hi += after.Sub(before)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	reports := sub.until(func(q *gpuscalerv1.QueueReport) bool { return q.GetStopped() })
	last := reports[len(reports)-1].GetTraffic()
	if last.GetArrivalsTotal() != 2*workers*items || last.GetCompletionsTotal() != workers*items || last.GetDroppedTotal() != workers*items {
		t.Errorf("totals: %d arrivals, %d completions, %d dropped; want %d, %d, %d",
			last.GetArrivalsTotal(), last.GetCompletionsTotal(), last.GetDroppedTotal(), 2*workers*items, workers*items, workers*items)
	}
	if busy := last.GetBusySecondsTotal(); busy < lo.Seconds() || busy > hi.Seconds() {
		t.Errorf("busy %g item-seconds, want from %g to %g", busy, lo.Seconds(), hi.Seconds())
	}
	for _, q := range reports {
		tr := q.GetTraffic()
		if tr == nil {
			t.Fatalf("report %d carries no traffic", q.GetSequence())
		}
		if tr.GetServiceSeconds() < 0 || tr.GetServiceSeconds() > hi.Seconds() {
			t.Errorf("report %d: service %g s, want from 0 to %g (every item's time together)", q.GetSequence(), tr.GetServiceSeconds(), hi.Seconds())
		}
	}
}

// TestTrafficAcrossFailedPublish: a report that fails to publish loses nothing. Its
// sequence number goes to the next report, which counts its arrivals and drops, and
// the traffic's totals include everything counted. The publish fails for real, on a
// closed connection; the test calls publish itself, after Close, once the Reporter's
// goroutine has returned.
func TestTrafficAcrossFailedPublish(t *testing.T) {
	ns := natstest.Start(t, "", "")
	sub := subscribe(t, ns.ClientURL(), "ml", "jobs")
	nc := natstest.Connect(t, ns.ClientURL())
	r := newReporter(t, nc.Conn, "ml", "jobs", Config{Interval: time.Hour})
	r.Enqueued(3)
	r.Started(1)
	r.Finished(1)
	r.Dropped(1)
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	final := sub.until(func(q *gpuscalerv1.QueueReport) bool { return q.GetStopped() })
	seq := final[len(final)-1].GetSequence()

	r.Enqueued(2)
	r.Dropped(1)
	nc.Close()
	if err := r.publish(counts(r.counts.Load())); err == nil {
		t.Fatal("publish on a closed connection succeeded")
	}
	r.Enqueued(3)
	r.Started(1)
	r.Finished(1)
	r.nc = natstest.Connect(t, ns.ClientURL()).Conn
	if err := r.publish(counts(r.counts.Load())); err != nil {
		t.Fatal(err)
	}
	q := sub.next()
	if q.GetSequence() != seq+1 || q.GetArrivals() != 5 || q.GetDropped() != 1 {
		t.Errorf("report after the failed one: sequence %d, %d arrivals, %d dropped; want %d, 5, 1", q.GetSequence(), q.GetArrivals(), q.GetDropped(), seq+1)
	}
	if tr := q.GetTraffic(); tr.GetArrivalsTotal() != 8 || tr.GetCompletionsTotal() != 2 || tr.GetDroppedTotal() != 2 {
		t.Errorf("totals: %d arrivals, %d completions, %d dropped; want 8, 2, 2", tr.GetArrivalsTotal(), tr.GetCompletionsTotal(), tr.GetDroppedTotal())
	}
}

// TestSetReportsNoTraffic: a Reporter fed by Set knows no completions, so once Set is
// called its reports carry no traffic and the scaler estimates from their differences.
func TestSetReportsNoTraffic(t *testing.T) {
	ns := natstest.Start(t, "", "")
	sub := subscribe(t, ns.ClientURL(), "ml", "jobs")
	r := newReporter(t, natstest.Connect(t, ns.ClientURL()).Conn, "ml", "jobs", Config{Interval: time.Hour})
	if q := sub.next(); q.GetTraffic() == nil {
		t.Fatalf("first report %v carries no traffic", q)
	}
	r.Set(4, 1)
	if q := sub.next(); q.GetTraffic() != nil || q.GetWaiting() != 4 {
		t.Fatalf("report after Set(4, 1): %v, want waiting 4 and no traffic", q)
	}
}

// TestScalerReplicasAgree runs the restart the issue is about with real parts: a
// Reporter measures a queue's traffic while one scaler reads its reports, then a second
// scaler starts and reads only the stream's last report. Both read the producer's
// service time, the same to the last bit, and about the same arrival rate (it falls a
// little with each idle report). A scaler that estimated from the differences between
// reports would know no service time from one report, and a rate of 0.
func TestScalerReplicasAgree(t *testing.T) {
	ns := natstest.Start(t, "", "")
	sub := subscribe(t, ns.ClientURL(), "ml", "jobs")
	first, _ := scalertest.Start(t, ns.ClientURL())
	r := newReporter(t, natstest.Connect(t, ns.ClientURL()).Conn, "ml", "jobs", Config{Interval: 20 * time.Millisecond})
	const workers, items = 4, 20
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for range items {
				r.Enqueued(1)
				r.Started(1)
				time.Sleep(5 * time.Millisecond) // the work
				r.Finished(1)
			}
		})
	}
	wg.Wait()
	sub.until(func(q *gpuscalerv1.QueueReport) bool {
		return q.GetTraffic().GetCompletionsTotal() == workers*items && q.Backlog() == 0
	})
	second, _ := scalertest.Start(t, ns.ClientURL())

	explain := func(s *scaler.Scaler) *gpuscalerv1.QueueStatus {
		t.Helper()
		conn, err := grpc.NewClient(s.GRPCAddr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		ex, err := gpuscalerv1.NewExplainerClient(conn).Explain(t.Context(), &gpuscalerv1.ExplainRequest{Namespace: "ml", Name: "llm",
			Metadata: map[string]string{"queue": "jobs", "targetWait": "1s"}})
		if err != nil {
			t.Fatalf("Explain: %v", err)
		}
		return ex.GetQueue()
	}
	b, a := explain(second), explain(first)
	if a.GetServiceSeconds() == 0 || b.GetServiceSeconds() != a.GetServiceSeconds() {
		t.Errorf("service time: %g s on the replica started after the reports, %g s on the one that read them all; want the same, above 0",
			b.GetServiceSeconds(), a.GetServiceSeconds())
	}
	if ra, rb := a.GetArrivalRate(), b.GetArrivalRate(); ra == 0 || rb < ra/2 || rb > 2*ra {
		t.Errorf("arrival rate: %g/s on the replica started after the reports, %g/s on the one that read them all; want about the same", rb, ra)
	}
	if a.GetMeasuringProducers() != 1 || b.GetMeasuringProducers() != 1 {
		t.Errorf("measuring producers: %d and %d, want 1 and 1", a.GetMeasuringProducers(), b.GetMeasuringProducers())
	}
}
