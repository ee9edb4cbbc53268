package gateway

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/gpuscaler/gpuscaler/test/testkit"
)

// send sends a request in the background; the channel gets its outcome, body read.
func send(ctx context.Context, method, url, body string, header map[string]string) <-chan outcome {
	out := make(chan outcome, 1)
	go func() {
		req, err := http.NewRequestWithContext(ctx, method, url, strings.NewReader(body))
		if err != nil {
			out <- outcome{err: err}
			return
		}
		for k, v := range header {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			out <- outcome{err: err}
			return
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		out <- outcome{resp: resp, body: string(b), err: err}
	}()
	return out
}

func wait(t *testing.T, c <-chan outcome) outcome {
	t.Helper()
	select {
	case o := <-c:
		if o.err != nil {
			t.Fatalf("request: %v", o.err)
		}
		return o
	case <-time.After(10 * time.Second):
		t.Fatal("no answer within 10s")
	}
	return outcome{}
}

// echo is a backend that answers "<method> <path> <body>" and is healthy while ready
// holds true.
func echo(t *testing.T, ready *atomic.Bool) *httptest.Server {
	t.Helper()
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/health" {
			if ready != nil && !ready.Load() {
				w.WriteHeader(http.StatusServiceUnavailable)
			}
			return
		}
		b, _ := io.ReadAll(r.Body)
		fmt.Fprintf(w, "%s %s %s", r.Method, r.URL.Path, b)
	}))
	t.Cleanup(s.Close)
	return s
}

// backend serves h, and answers its /health probes 200.
func backend(t *testing.T, h http.HandlerFunc) *httptest.Server {
	t.Helper()
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/health" {
			return
		}
		h(w, r)
	}))
	t.Cleanup(s.Close)
	return s
}

func urlRoute(name, url, extra string) string {
	return fmt.Sprintf("- {name: %s, url: %q, queue: %s-q, holdTimeout: 1m%s}\n", name, url, name, extra)
}

// wantError checks a gateway answer: status, reason header, and the JSON error body.
func wantError(t *testing.T, o outcome, status int, reason string, retryAfter bool, msg string) {
	t.Helper()
	if o.resp.StatusCode != status {
		t.Errorf("got status %d, want %d (body %q)", o.resp.StatusCode, status, o.body)
	}
	if got := o.resp.Header.Get(ReasonHeader); got != reason {
		t.Errorf("got %s %q, want %q", ReasonHeader, got, reason)
	}
	if got := o.resp.Header.Get("Retry-After"); (got != "") != retryAfter {
		t.Errorf("got Retry-After %q, want one: %v", got, retryAfter)
	}
	if ct := o.resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("got Content-Type %q, want application/json", ct)
	}
	var e apiError
	if err := json.Unmarshal([]byte(o.body), &e); err != nil {
		t.Fatalf("body %q: %v", o.body, err)
	}
	wantCode := "gpuscaler_" + strings.ReplaceAll(reason, "-", "_")
	if e.Error.Code != wantCode || e.Error.Type == "" || !strings.Contains(e.Error.Message, msg) {
		t.Errorf("got error %+v, want code %s and a message containing %q", e.Error, wantCode, msg)
	}
}

func TestForwardsAndCounts(t *testing.T) {
	b := echo(t, nil)
	tg := startGateway(t, "routes:\n"+urlRoute("dev", b.URL, ", pathPrefix: /v1"), Config{})
	o := wait(t, send(t.Context(), "POST", tg.URL+"/v1/chat", "hello", nil))
	if o.resp.StatusCode != 200 || o.body != "POST /v1/chat hello" {
		t.Fatalf("got %d %q, want 200 \"POST /v1/chat hello\"", o.resp.StatusCode, o.body)
	}
	c := tg.counter("dev-q")
	testkit.Eventually(t, 2*time.Second, func() bool { return c.counts() == [4]int64{1, 1, 1, 0} })
	// The metrics are counted once the response went out: a client may read it first.
	testkit.Eventually(t, 2*time.Second, func() bool { return tg.requests("dev", 200) == 1 })
}

func TestNoRouteBodyTooLargeHeaderTooLarge(t *testing.T) {
	b := echo(t, nil)
	tg := startGateway(t, "routes:\n"+urlRoute("dev", b.URL, ", pathPrefix: /v1"), Config{MaxBodyBytes: 10, MaxHeaderBytes: 1024})
	wantError(t, wait(t, send(t.Context(), "GET", tg.URL+"/other", "", nil)), 404, ReasonNoRoute, false, `path "/other"`)
	wantError(t, wait(t, send(t.Context(), "POST", tg.URL+"/v1/x", strings.Repeat("x", 11), nil)), 413, ReasonBodyTooLarge, false, "over 10 bytes")
	o := wait(t, send(t.Context(), "GET", tg.URL+"/v1/x", "", map[string]string{"X-Big": strings.Repeat("x", 16<<10)}))
	if o.resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
		t.Errorf("big header: got %d, want 431", o.resp.StatusCode)
	}
	testkit.Eventually(t, 2*time.Second, func() bool { return tg.requests(noRoute, 404) == 1 })
	if c := tg.counter("dev-q"); c.enqueued.Load() != 0 {
		t.Errorf("counted %s, want nothing: the 413 was never queued", c)
	}
}

func TestHoldsUntilURLBackendIsHealthy(t *testing.T) {
	var ready atomic.Bool
	b := echo(t, &ready)
	tg := startGateway(t, "routes:\n"+urlRoute("dev", b.URL, ""), Config{})
	res := send(t.Context(), "POST", tg.URL+"/x", "body kept", nil)
	testkit.Eventually(t, 5*time.Second, func() bool { return tg.held("dev") == 1 })
	ready.Store(true)
	o := wait(t, res)
	if o.resp.StatusCode != 200 || o.body != "POST /x body kept" {
		t.Fatalf("got %d %q, want 200 with the body sent", o.resp.StatusCode, o.body)
	}
	testkit.Eventually(t, 2*time.Second, func() bool { return tg.held("dev") == 0 })
}

func TestHoldTimeout(t *testing.T) {
	var ready atomic.Bool
	b := echo(t, &ready)
	tg := startGateway(t, "routes:\n- {name: dev, url: "+b.URL+", queue: q, holdTimeout: 50ms}\n", Config{})
	wantError(t, wait(t, send(t.Context(), "GET", tg.URL+"/x", "", nil)), 503, ReasonHoldTimeout, true, "no ready replica within 50ms")
	c := tg.counter("q")
	testkit.Eventually(t, 2*time.Second, func() bool { return c.counts() == [4]int64{1, 0, 0, 1} })
}

func TestOverflow(t *testing.T) {
	var ready atomic.Bool
	b := echo(t, &ready)
	tg := startGateway(t, "routes:\n"+urlRoute("dev", b.URL, ""), Config{MaxHeld: 1})
	first := send(t.Context(), "GET", tg.URL+"/x", "", nil)
	testkit.Eventually(t, 5*time.Second, func() bool { return tg.held("dev") == 1 })
	wantError(t, wait(t, send(t.Context(), "GET", tg.URL+"/x", "", nil)), 503, ReasonOverflow, true, "holds as many requests")
	c := tg.counter("dev-q")
	if got := c.counts(); got != [4]int64{2, 0, 0, 1} {
		t.Errorf("got %s, want 2 enqueued and 1 dropped", c)
	}
	ready.Store(true)
	if o := wait(t, first); o.resp.StatusCode != 200 {
		t.Errorf("held request: got %d, want 200", o.resp.StatusCode)
	}
}

func TestOverflowOfHeldBytes(t *testing.T) {
	var ready atomic.Bool
	b := echo(t, &ready)
	tg := startGateway(t, "routes:\n"+urlRoute("dev", b.URL, ""), Config{MaxHeldBytes: 10})
	first := send(t.Context(), "POST", tg.URL+"/x", "123456", nil)
	testkit.Eventually(t, 5*time.Second, func() bool { return tg.held("dev") == 1 })
	wantError(t, wait(t, send(t.Context(), "POST", tg.URL+"/x", "123456", nil)), 503, ReasonOverflow, true, "10 bytes")
	ready.Store(true)
	if o := wait(t, first); o.resp.StatusCode != 200 {
		t.Errorf("held request: got %d, want 200", o.resp.StatusCode)
	}
}

func TestNotReadyBeforeRun(t *testing.T) {
	file := testkit.WriteFile(t, t.TempDir(), "routes.yaml", []byte("routes: []\n"))
	g, err := New(Config{RoutesFile: file, Namespace: "ml", Kube: newFakeKube(t)})
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Ready(); err == nil {
		t.Error("Ready before Run: got nil, want an error")
	}
}

func TestNewRefuses(t *testing.T) {
	dir := t.TempDir()
	svc := testkit.WriteFile(t, dir, "svc.yaml", []byte("routes:\n- {name: llm, service: {name: s, port: 80}, queue: q, holdTimeout: 1m}\n"))
	if _, err := New(Config{RoutesFile: svc}); err == nil || !strings.Contains(err.Error(), "needs the Kubernetes API") {
		t.Errorf("service route without Kubernetes: got %v", err)
	}
	if _, err := New(Config{RoutesFile: dir + "/missing.yaml"}); err == nil {
		t.Error("missing file: got no error")
	}
}

func TestClientCancelWhileHeldIsDropped(t *testing.T) {
	var ready atomic.Bool
	b := echo(t, &ready)
	tg := startGateway(t, "routes:\n"+urlRoute("dev", b.URL, ""), Config{})
	ctx, cancel := context.WithCancel(t.Context())
	res := send(ctx, "GET", tg.URL+"/x", "", nil)
	testkit.Eventually(t, 5*time.Second, func() bool { return tg.held("dev") == 1 })
	cancel()
	<-res
	c := tg.counter("dev-q")
	testkit.Eventually(t, 2*time.Second, func() bool { return c.counts() == [4]int64{1, 0, 0, 1} && tg.requests("dev", StatusClientClosed) == 1 })
}

// TestStreamsFlushedPerWrite checks each event or chunk reaches the client before the
// backend writes the next: the backend waits for the client to have read one before
// writing another. SSE, and a chunked stream of another type (NDJSON).
func TestStreamsFlushedPerWrite(t *testing.T) {
	for _, ct := range []string{"text/event-stream", "application/x-ndjson"} {
		t.Run(ct, func(t *testing.T) {
			next := make(chan struct{})
			b := backend(t, func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", ct)
				for i := range 3 {
					fmt.Fprintf(w, "data: %d\n", i)
					w.(http.Flusher).Flush()
					select {
					case <-next:
					case <-r.Context().Done():
						return
					}
				}
			})
			tg := startGateway(t, "routes:\n"+urlRoute("dev", b.URL, ""), Config{})
			resp, err := http.Get(tg.URL + "/v1/chat")
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			rd := bufio.NewReader(resp.Body)
			for i := range 3 {
				line, err := rd.ReadString('\n')
				if err != nil || line != fmt.Sprintf("data: %d\n", i) {
					t.Fatalf("write %d: got %q, %v", i, line, err)
				}
				next <- struct{}{}
			}
		})
	}
}

// TestClientCancelMidStreamCancelsUpstream: the backend must see its request's context
// end, so an engine frees the KV cache of a client that left.
func TestClientCancelMidStreamCancelsUpstream(t *testing.T) {
	upstreamDone := make(chan struct{})
	b := backend(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: first\n\n")
		w.(http.Flusher).Flush()
		<-r.Context().Done()
		close(upstreamDone)
	})
	tg := startGateway(t, "routes:\n"+urlRoute("dev", b.URL, ""), Config{})
	ctx, cancel := context.WithCancel(t.Context())
	req, _ := http.NewRequestWithContext(ctx, "GET", tg.URL+"/stream", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	line, _ := bufio.NewReader(resp.Body).ReadString('\n')
	if line != "data: first\n" {
		t.Fatalf("got %q, want the first event", line)
	}
	cancel()
	resp.Body.Close()
	select {
	case <-upstreamDone:
	case <-time.After(10 * time.Second):
		t.Fatal("the backend's request context did not end within 10s of the client leaving")
	}
	c := tg.counter("dev-q")
	testkit.Eventually(t, 5*time.Second, func() bool {
		return c.counts() == [4]int64{1, 1, 1, 0} && tg.requests("dev", StatusClientClosed) == 1
	})
}

func TestIdleTimeoutCutsASilentStream(t *testing.T) {
	b := backend(t, func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, "data: first\n\n")
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	})
	tg := startGateway(t, "routes:\n"+urlRoute("dev", b.URL, ""), Config{IdleTimeout: 50 * time.Millisecond})
	o := <-send(t.Context(), "GET", tg.URL+"/stream", "", nil)
	if o.err == nil && o.body != "data: first\n\n" {
		t.Errorf("got %q, want the first event and then the stream cut", o.body)
	}
	testkit.Eventually(t, 5*time.Second, func() bool { return tg.counter("dev-q").finished.Load() == 1 })
}

func TestFirstByteTimeout(t *testing.T) {
	b := backend(t, func(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() })
	tg := startGateway(t, "routes:\n"+urlRoute("dev", b.URL, ""), Config{FirstByteTimeout: 50 * time.Millisecond})
	wantError(t, wait(t, send(t.Context(), "GET", tg.URL+"/slow", "", nil)), 504, ReasonFirstByte, false, "no response header within 50ms")
}

// TestServiceHeldUntilEndpointReady runs a Service route on the fake clientset's
// EndpointSlices: held while the only endpoint is not ready, released when it is.
func TestServiceHeldUntilEndpointReady(t *testing.T) {
	b := echo(t, nil)
	addr := strings.TrimPrefix(b.URL, "http://")
	cfg := Config{ServiceAddr: func(name, ns string, port int) string {
		if name != "llm-server" || ns != "ml" || port != 8000 {
			t.Errorf("ServiceAddr(%s, %s, %d), want llm-server, ml, 8000", name, ns, port)
		}
		return addr
	}}
	tg := startGateway(t, "routes:\n- {name: llm, service: {name: llm-server, port: 8000}, queue: llm, holdTimeout: 1m}\n", cfg)
	tg.setSlice(t, "llm-server", addr, false)
	res := send(t.Context(), "POST", tg.URL+"/v1/chat", "hi", nil)
	testkit.Eventually(t, 5*time.Second, func() bool { return tg.held("llm") == 1 })
	tg.setSlice(t, "llm-server", addr, true)
	if o := wait(t, res); o.resp.StatusCode != 200 || o.body != "POST /v1/chat hi" {
		t.Fatalf("got %d %q, want 200", o.resp.StatusCode, o.body)
	}
}

func TestServiceWithoutSlicesTimesOutNamingIt(t *testing.T) {
	tg := startGateway(t, "routes:\n- {name: llm, service: {name: llm-server, port: 8000}, queue: llm, holdTimeout: 20ms}\n", Config{})
	for range 2 {
		wantError(t, wait(t, send(t.Context(), "GET", tg.URL+"/", "", nil)), 503, ReasonHoldTimeout, true, "service llm-server has no endpoints in namespace ml")
	}
	if n := testkit.CountLines(tg.log.String(), "has no EndpointSlice"); n != 1 {
		t.Errorf("logged %d times, want once:\n%s", n, tg.log)
	}
}

// TestConcurrencyHoldsWhatExceedsIt: with concurrency 1 and one endpoint, the second
// request waits at the gateway until the first finishes.
func TestConcurrencyHoldsWhatExceedsIt(t *testing.T) {
	release := make(chan struct{})
	var inFlight, most atomic.Int32
	b := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := inFlight.Add(1)
		defer inFlight.Add(-1)
		if n > most.Load() {
			most.Store(n)
		}
		<-release
		fmt.Fprint(w, r.URL.Path)
	}))
	t.Cleanup(b.Close)
	addr := strings.TrimPrefix(b.URL, "http://")
	tg := startGateway(t, "routes:\n- {name: llm, service: {name: llm-server, port: 8000}, queue: llm, holdTimeout: 1m, concurrency: 1}\n",
		Config{ServiceAddr: func(string, string, int) string { return "service.invalid:1" }})
	tg.setSlice(t, "llm-server", addr, true)
	first := send(t.Context(), "GET", tg.URL+"/1", "", nil)
	testkit.Eventually(t, 5*time.Second, func() bool { return inFlight.Load() == 1 })
	second := send(t.Context(), "GET", tg.URL+"/2", "", nil)
	testkit.Eventually(t, 5*time.Second, func() bool { return tg.held("llm") == 1 })
	release <- struct{}{}
	if o := wait(t, first); o.body != "/1" {
		t.Errorf("first: got %q", o.body)
	}
	release <- struct{}{}
	if o := wait(t, second); o.body != "/2" {
		t.Errorf("second: got %q", o.body)
	}
	if most.Load() != 1 {
		t.Errorf("the endpoint had %d requests at once, want at most 1", most.Load())
	}
}

// sendToRefusingEndpoint starts a gateway with route llm, its Service's one ready
// endpoint at a free port nothing listens on (route holds the route's other fields,
// such as "holdTimeout: 1m, concurrency: 2"), and POSTs body to it; it returns once the
// gateway has been refused and dials again. It returns the gateway, the endpoint's
// address and the request's outcome to come.
func sendToRefusingEndpoint(t *testing.T, route, body string) (*testGateway, string, <-chan outcome) {
	t.Helper()
	addr := testkit.FreeAddr(t)
	tg := startGateway(t, "routes:\n- {name: llm, service: {name: llm-server, port: 8000}, queue: llm, "+route+"}\n", Config{})
	tg.setSlice(t, "llm-server", addr, true)
	res := send(t.Context(), "POST", tg.URL+"/v1/chat", body, nil)
	testkit.Eventually(t, 5*time.Second, func() bool { return strings.Contains(tg.log.String(), "connection refused; dialling again") })
	return tg, addr, res
}

// TestDialRefusedIsRetried: an endpoint reported ready whose server does not listen
// yet; the request goes through once it does, within the hold timeout.
func TestDialRefusedIsRetried(t *testing.T) {
	_, addr, res := sendToRefusingEndpoint(t, "holdTimeout: 1m, concurrency: 2", "resent")
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		t.Skipf("port %s taken meanwhile: %v", addr, err)
	}
	b := httptest.NewUnstartedServer(echo(t, nil).Config.Handler)
	b.Listener = lis
	b.Start()
	t.Cleanup(b.Close)
	if o := wait(t, res); o.resp.StatusCode != 200 || o.body != "POST /v1/chat resent" {
		t.Fatalf("got %d %q, want 200 with the body sent again", o.resp.StatusCode, o.body)
	}
}

func TestReload(t *testing.T) {
	b := echo(t, nil)
	tg := startGateway(t, "routes:\n"+urlRoute("a", b.URL, ", pathPrefix: /a"), Config{})
	if o := wait(t, send(t.Context(), "GET", tg.URL+"/b", "", nil)); o.resp.StatusCode != 404 {
		t.Fatalf("before the reload: got %d, want 404", o.resp.StatusCode)
	}
	tg.writeRoutes(t, "routes:\n"+urlRoute("a", b.URL, ", pathPrefix: /a")+urlRoute("b", b.URL, ", pathPrefix: /b"))
	testkit.Eventually(t, 5*time.Second, func() bool {
		o := <-send(t.Context(), "GET", tg.URL+"/b", "", nil)
		return o.err == nil && o.resp.StatusCode == 200
	})
	tg.writeRoutes(t, "routes:\n- {name: a, url: "+b.URL+", queue: q, holdTimeout: 5x}\n")
	testkit.Eventually(t, 5*time.Second, func() bool { return testutil.ToFloat64(tg.m.reloads.WithLabelValues("error")) == 1 })
	for _, p := range []string{"/a", "/b"} {
		if o := wait(t, send(t.Context(), "GET", tg.URL+p, "", nil)); o.resp.StatusCode != 200 {
			t.Errorf("%s after a broken file: got %d, want 200 from the last good routes", p, o.resp.StatusCode)
		}
	}
	// The reload is counted just before it is logged.
	testkit.Eventually(t, 5*time.Second, func(context.Context) error {
		return testkit.Check(strings.Contains(tg.log.String(), `holdTimeout \"5x\"`), "the log does not say what is wrong:\n%s", tg.log)
	})
	// Route b goes: its queue's counter is closed.
	tg.writeRoutes(t, "routes:\n"+urlRoute("a", b.URL, ", pathPrefix: /a"))
	testkit.Eventually(t, 5*time.Second, func() bool { return tg.counter("b-q").closed.Load() == 1 })
	// Counted once the new routes are in force, just after the counter closed.
	testkit.Eventually(t, 5*time.Second, func() bool { return testutil.ToFloat64(tg.m.reloads.WithLabelValues("ok")) == 2 })
}

func TestReadyAndMetrics(t *testing.T) {
	b := echo(t, nil)
	tg := startGateway(t, "routes:\n"+urlRoute("dev", b.URL, ""), Config{})
	wait(t, send(t.Context(), "GET", tg.URL+"/x", "", nil))
	testkit.Eventually(t, 2*time.Second, func() bool { return tg.requests("dev", 200) == 1 })
	want := `
# HELP gpuscaler_gateway_requests_total Requests answered, by route (- when none matched) and status code (499: the client went away first).
# TYPE gpuscaler_gateway_requests_total counter
gpuscaler_gateway_requests_total{code="200",route="dev"} 1
`
	if err := testutil.CollectAndCompare(tg.m.requests, strings.NewReader(want)); err != nil {
		t.Error(err)
	}
	if n := testutil.CollectAndCount(tg.reg, "gpuscaler_gateway_upstream_seconds", "gpuscaler_gateway_hold_seconds"); n != 2 {
		t.Errorf("got %d histogram series, want 2", n)
	}
}

// TestReloadKeepsHeldRequests: a reload that leaves a route as it was keeps its held
// requests waiting; one that removes a route answers its held requests 503.
func TestReloadKeepsHeldRequests(t *testing.T) {
	var ready atomic.Bool
	b := echo(t, &ready)
	a := urlRoute("a", b.URL, ", pathPrefix: /a")
	tg := startGateway(t, "routes:\n"+a+urlRoute("gone", b.URL, ", pathPrefix: /gone"), Config{})
	kept := send(t.Context(), "GET", tg.URL+"/a", "", nil)
	removed := send(t.Context(), "GET", tg.URL+"/gone", "", nil)
	testkit.Eventually(t, 5*time.Second, func() bool { return tg.held("a") == 1 && tg.held("gone") == 1 })
	tg.writeRoutes(t, "routes:\n"+a)
	wantError(t, wait(t, removed), 503, ReasonRouteRemoved, true, "route gone was removed")
	ready.Store(true)
	if o := wait(t, kept); o.resp.StatusCode != 200 {
		t.Errorf("kept route: got %d %q, want 200", o.resp.StatusCode, o.body)
	}
	if c := tg.counter("a-q"); c.closed.Load() != 0 {
		t.Errorf("the kept route's counter: %s, want it open", c)
	}
}

func TestServiceNotReadyTimesOutNamingIt(t *testing.T) {
	tg := startGateway(t, "routes:\n- {name: llm, service: {name: llm-server, port: 8000}, queue: llm, holdTimeout: 20ms}\n", Config{})
	tg.setSlice(t, "llm-server", "10.0.0.1:8000", false)
	testkit.Eventually(t, 5*time.Second, func() bool {
		st := tg.routing.Load().states["llm"]
		st.mu.Lock()
		defer st.mu.Unlock()
		return !st.noSlices
	})
	wantError(t, wait(t, send(t.Context(), "GET", tg.URL+"/", "", nil)), 503, ReasonHoldTimeout, true, "service llm-server had no ready replica within 20ms")
}
