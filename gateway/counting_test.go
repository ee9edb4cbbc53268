package gateway

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gpuscaler/gpuscaler/internal/natstest"
	gpuscalerv1 "github.com/gpuscaler/gpuscaler/proto/gpuscaler/v1"
	"github.com/gpuscaler/gpuscaler/queue"
	"github.com/gpuscaler/gpuscaler/test/testkit"
)

// TestCountsReachNATS counts through the real Reporter on an embedded NATS and reads
// the QueueReports: a hold timeout and an overflow are arrivals and drops, never
// completions, and Run's end sends a last report that says the producer stopped.
func TestCountsReachNATS(t *testing.T) {
	ns := natstest.Start(t, "", "")
	nc := natstest.Connect(t, ns.ClientURL())
	reports := natstest.Subscribe(t, nc.Conn, "gpuscaler.v1.queue.ml.llm.gw")
	cfg := Config{MaxHeld: 1, NewCounter: func(q string) (Counter, error) {
		return queue.NewReporter(nc.Conn, "ml", q, queue.Config{Interval: 20 * time.Millisecond, ProducerID: "gw"})
	}}
	tg := startGateway(t, "routes:\n- {name: llm, service: {name: llm-server, port: 8000}, queue: llm, holdTimeout: 200ms}\n", cfg)

	first := send(t.Context(), "GET", tg.URL+"/", "", nil)
	testkit.Eventually(t, 5*time.Second, func() bool { return tg.held("llm") == 1 })
	if o := wait(t, send(t.Context(), "GET", tg.URL+"/", "", nil)); o.resp.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("overflow: got %d, want 503", o.resp.StatusCode)
	}
	if o := wait(t, first); o.resp.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("hold timeout: got %d, want 503", o.resp.StatusCode)
	}

	var arrivals, dropped uint64
	next := func() *gpuscalerv1.QueueReport {
		t.Helper()
		select {
		case m := <-reports:
			ev, err := gpuscalerv1.Decode(m.Subject, m.Data)
			if err != nil {
				t.Fatalf("decode %s: %v", m.Subject, err)
			}
			arrivals += ev.Queue.GetArrivals()
			dropped += ev.Queue.GetDropped()
			return ev.Queue
		case <-time.After(5 * time.Second):
			t.Fatalf("no report within 5s (arrivals %d, dropped %d)", arrivals, dropped)
		}
		return nil
	}
	for q := next(); dropped < 2 || q.GetWaiting() != 0; q = next() {
		if q.GetInFlight() != 0 {
			t.Fatalf("got %v, want nothing in flight: no request was forwarded", q)
		}
	}
	tg.stop()
	for q := next(); !q.GetStopped(); q = next() {
	}
	if arrivals != 2 || dropped != 2 {
		t.Errorf("got %d arrivals and %d dropped, want 2 and 2", arrivals, dropped)
	}
}

// TestShutdownLetsInFlightFinish: once Run's context ends, a request in flight still
// gets its whole response, and Run returns after it.
func TestShutdownLetsInFlightFinish(t *testing.T) {
	release := make(chan struct{})
	b := backend(t, func(w http.ResponseWriter, r *http.Request) {
		<-release
		w.Write([]byte("done"))
	})
	tg := startGateway(t, "routes:\n"+urlRoute("dev", b.URL, ""), Config{})
	res := send(t.Context(), "GET", tg.URL+"/x", "", nil)
	c := tg.counter("dev-q")
	testkit.Eventually(t, 5*time.Second, func() bool { return c.started.Load() == 1 })
	stopped := make(chan struct{})
	go func() { tg.stop(); close(stopped) }()
	testkit.Eventually(t, 5*time.Second, func() bool { return testkit.CountLines(tg.log.String(), "stopping") == 1 })
	select {
	case <-stopped:
		t.Fatal("Run returned with a request in flight")
	default:
	}
	close(release)
	if o := wait(t, res); o.resp.StatusCode != 200 || o.body != "done" {
		t.Errorf("got %d %q, want 200 done", o.resp.StatusCode, o.body)
	}
	<-stopped
	if c.closed.Load() != 1 || c.finished.Load() != 1 {
		t.Errorf("got %s, want the request finished and the counter closed", c)
	}
}

// TestShutdownAnswersHeld: held requests still waiting when the grace is over get a 503
// they can retry on, not a cut connection.
func TestShutdownAnswersHeld(t *testing.T) {
	var ready atomic.Bool
	b := echo(t, &ready)
	tg := startGateway(t, "routes:\n"+urlRoute("dev", b.URL, ""), Config{ShutdownGrace: 20 * time.Millisecond})
	res := send(t.Context(), "GET", tg.URL+"/x", "", nil)
	testkit.Eventually(t, 5*time.Second, func() bool { return tg.held("dev") == 1 })
	tg.stop()
	wantError(t, wait(t, res), 503, ReasonShuttingDown, true, "stopping")
	if c := tg.counter("dev-q"); c.counts() != [4]int64{1, 0, 0, 1} {
		t.Errorf("got %s, want 1 enqueued, 1 dropped", c)
	}
}

// TestTimeoutsAreNotCompletions wakes a route from zero as the queue-demand metric
// sees it, through the real Reporter: requests held while no replica is ready time out,
// or their clients go away, and then one request is served. The drops must not count as
// completions: if they did, each would add an item served in no time, and the service
// time, the busy seconds over the completions, would fall to a seventh of the one
// request's (issue 26, defect 1: about 1e-4 s on a wake from zero). The producer's busy
// seconds lie between what the backend spent on the request and what the client waited
// for it; its service time, a ratio of averages over a minute, within 1% of that.
func TestTimeoutsAreNotCompletions(t *testing.T) {
	ns := natstest.Start(t, "", "")
	nc := natstest.Connect(t, ns.ClientURL())
	reports := natstest.Subscribe(t, nc.Conn, "gpuscaler.v1.queue.ml.llm.gw")
	var ready atomic.Bool
	var served atomic.Int64 // nanoseconds the backend spent on the request
	b := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/health" {
			if !ready.Load() {
				w.WriteHeader(http.StatusServiceUnavailable)
			}
			return
		}
		start := time.Now()
		time.Sleep(50 * time.Millisecond) // the work
		served.Store(int64(time.Since(start)))
		w.Write([]byte("done"))
	}))
	t.Cleanup(b.Close)
	cfg := Config{NewCounter: func(q string) (Counter, error) {
		return queue.NewReporter(nc.Conn, "ml", q, queue.Config{Interval: 20 * time.Millisecond, ProducerID: "gw"})
	}}
	tg := startGateway(t, "routes:\n- {name: llm, url: "+b.URL+", queue: llm, holdTimeout: 100ms}\n", cfg)

	const timeouts = 5
	for range timeouts {
		wantError(t, wait(t, send(t.Context(), "GET", tg.URL+"/x", "", nil)), 503, ReasonHoldTimeout, true, "within 100ms")
	}
	ctx, cancel := context.WithCancel(t.Context())
	gone := send(ctx, "GET", tg.URL+"/x", "", nil)
	testkit.Eventually(t, 5*time.Second, func() bool { return tg.held("llm") == 1 })
	cancel()
	<-gone
	ready.Store(true)
	sent := time.Now()
	if o := wait(t, send(t.Context(), "GET", tg.URL+"/x", "", nil)); o.resp.StatusCode != 200 {
		t.Fatalf("after the backend is ready: got %d %q, want 200", o.resp.StatusCode, o.body)
	}
	lo, hi := time.Duration(served.Load()).Seconds(), time.Since(sent).Seconds()
	tg.stop()
	var last *gpuscalerv1.QueueReport
	for last == nil || !last.GetStopped() {
		select {
		case m := <-reports:
			ev, err := gpuscalerv1.Decode(m.Subject, m.Data)
			if err != nil {
				t.Fatalf("decode %s: %v", m.Subject, err)
			}
			last = ev.Queue
		case <-time.After(5 * time.Second):
			t.Fatalf("no stopped report within 5s; the last was %v", last)
		}
	}
	tr := last.GetTraffic()
	if tr.GetArrivalsTotal() != timeouts+2 || tr.GetDroppedTotal() != timeouts+1 || tr.GetCompletionsTotal() != 1 {
		t.Errorf("totals: %d arrivals, %d dropped, %d completed; want %d, %d, 1", tr.GetArrivalsTotal(), tr.GetDroppedTotal(), tr.GetCompletionsTotal(), timeouts+2, timeouts+1)
	}
	if busy := tr.GetBusySecondsTotal(); busy < lo || busy > hi {
		t.Errorf("busy %g item-seconds, want from %g to %g", busy, lo, hi)
	}
	if s := tr.GetServiceSeconds(); s < 0.99*lo || s > hi {
		t.Errorf("service %g s, want from %g to %g: the one request served", s, lo, hi)
	}
}
