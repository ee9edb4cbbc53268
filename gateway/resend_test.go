package gateway

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gpuscaler/gpuscaler/test/testkit"
)

// closingBackend is an HTTP/1.1 server on a raw listener that answers the first
// request of each connection and keeps it open, then closes it as the next request
// on it arrives, unanswered and unread: what a model server does to its idle
// keep-alive connections when its pod is deleted (uvicorn, Go's Shutdown), in the
// instant before the gateway learns the endpoint is gone. got lists the bodies it
// answered, in order.
type closingBackend struct {
	addr string
	mu   sync.Mutex
	got  []string
	cut  int // requests it closed the connection on
}

func newClosingBackend(t *testing.T) *closingBackend {
	t.Helper()
	b := &closingBackend{}
	b.addr = serveRaw(t, b.serve)
	return b
}

// serveRaw listens on a loopback port until the test ends, has serve handle each
// connection in a goroutine of its own (and close it), and returns the address: a
// backend whose every byte on the wire the test writes.
func serveRaw(t *testing.T, serve func(net.Conn)) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lis.Close() })
	go func() {
		for {
			conn, err := lis.Accept()
			if err != nil {
				return
			}
			go func() {
				defer conn.Close()
				serve(conn)
			}()
		}
	}()
	return lis.Addr().String()
}

func (b *closingBackend) serve(conn net.Conn) {
	br := bufio.NewReader(conn)
	req, err := http.ReadRequest(br)
	if err != nil {
		return
	}
	body, _ := io.ReadAll(req.Body)
	b.mu.Lock()
	b.got = append(b.got, string(body))
	b.mu.Unlock()
	fmt.Fprintf(conn, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	if _, err := br.Peek(1); err != nil { // the next request's first byte
		return
	}
	b.mu.Lock()
	b.cut++
	b.mu.Unlock()
	// Closed with the request unread: the kernel answers with a reset.
}

func (b *closingBackend) answered() ([]string, int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]string(nil), b.got...), b.cut
}

// TestIdleConnectionClosedByTheServerIsResent: the second request goes out on the
// connection the first left idle, and the server closes it as the request arrives.
// Nothing came back, so the request never ran: the gateway sends it again on a new
// connection rather than answer 502 (Go's transport resends only idempotent methods;
// an inference request is a POST).
func TestIdleConnectionClosedByTheServerIsResent(t *testing.T) {
	for _, tc := range []struct{ name, route string }{
		{"service", ""},                   // to the Service's address, as kube-proxy balances
		{"endpoints", ", concurrency: 4"}, // to the endpoint itself
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := newClosingBackend(t)
			tg := startGateway(t, "routes:\n- {name: llm, service: {name: llm-server, port: 8000}, queue: llm, holdTimeout: 1m"+tc.route+"}\n",
				Config{ServiceAddr: func(string, string, int) string { return b.addr }})
			tg.setSlice(t, "llm-server", b.addr, true)
			for _, body := range []string{"first", "second", "third"} {
				if o := wait(t, send(t.Context(), "POST", tg.URL+"/v1/completions", body, nil)); o.resp.StatusCode != 200 || o.body != body {
					t.Fatalf("%s: got %d %q, want 200 %q", body, o.resp.StatusCode, o.body, body)
				}
			}
			got, cut := b.answered()
			if strings.Join(got, " ") != "first second third" || cut != 2 {
				t.Errorf("the backend answered %q and closed %d connections under a request, want first, second, third and 2", got, cut)
			}
			if c := tg.counter("llm").counts(); c != [4]int64{3, 3, 3, 0} {
				t.Errorf("counted (enqueued, started, finished, dropped) %v, want 3 started and finished", c)
			}
			if n := testkit.CountLines(tg.log.String(), "the server closed an idle connection; sending again"); n != 2 {
				t.Errorf("logged the resend %d times, want 2:\n%s", n, tg.log)
			}
		})
	}
}

// TestGoneEndpointGivesTheRequestBackToTheHold: the endpoint a request was given
// refuses connections and then leaves the Service's endpoints (its pod was deleted);
// the request goes back to the hold and on to the replica that is ready now, rather
// than dial the gone one until its hold timeout.
func TestGoneEndpointGivesTheRequestBackToTheHold(t *testing.T) {
	b := echo(t, nil)
	tg, _, res := sendToRefusingEndpoint(t, "holdTimeout: 1m, concurrency: 2", "moved")
	tg.setSlice(t, "llm-server", strings.TrimPrefix(b.URL, "http://"), true)
	if o := wait(t, res); o.resp.StatusCode != 200 || o.body != "POST /v1/chat moved" {
		t.Fatalf("got %d %q, want 200 from the ready endpoint", o.resp.StatusCode, o.body)
	}
	if !strings.Contains(tg.log.String(), "endpoint gone; holding the request for another") {
		t.Errorf("the move was not logged:\n%s", tg.log)
	}
	// The slot it took at the ready endpoint is given back when it ends (after the
	// answer is written), and the gone endpoint's was given back when it moved.
	st := tg.routing.Load().states["llm"]
	testkit.Eventually(t, 5*time.Second, func() bool {
		st.mu.Lock()
		defer st.mu.Unlock()
		return len(st.inFlight) == 0
	})
	if c := tg.counter("llm").counts(); c != [4]int64{1, 1, 1, 0} {
		t.Errorf("counted (enqueued, started, finished, dropped) %v, want 1 started and finished", c)
	}
}

// TestGoneEndpointAndNoneReadyTimesOut: given back to the hold with no replica ready,
// the request ends at its hold timeout as any held request does: 503 hold-timeout, not
// 502, and the endpoint it held is released.
func TestGoneEndpointAndNoneReadyTimesOut(t *testing.T) {
	tg, gone, res := sendToRefusingEndpoint(t, "holdTimeout: 300ms, concurrency: 1", "late")
	tg.setSlice(t, "llm-server", gone, false)
	wantError(t, wait(t, res), 503, ReasonHoldTimeout, true, "had no ready replica within 300ms")
	if st := tg.routing.Load().states["llm"]; st != nil {
		st.mu.Lock()
		inFlight := len(st.inFlight)
		st.mu.Unlock()
		if inFlight != 0 {
			t.Errorf("%d endpoints still count a request in flight, want none", inFlight)
		}
	}
}

// breakingBackend answers requests on kept-alive connections, except those whose body
// is "break": it reads one, then, as a server that the request crashes would, closes
// the connection without an answer, or after the first bytes of one when partial is
// set. got counts the "break" requests it read.
type breakingBackend struct {
	addr    string
	partial bool
	got     atomic.Int64
}

func newBreakingBackend(t *testing.T, partial bool) *breakingBackend {
	t.Helper()
	b := &breakingBackend{partial: partial}
	b.addr = serveRaw(t, b.serve)
	return b
}

func (b *breakingBackend) serve(conn net.Conn) {
	br := bufio.NewReader(conn)
	for {
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		body, _ := io.ReadAll(req.Body)
		if string(body) == "break" {
			b.got.Add(1)
			if b.partial {
				fmt.Fprint(conn, "HTTP/1.1 200 OK\r\nContent-Le")
			}
			return
		}
		fmt.Fprintf(conn, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	}
}

// TestARequestThatBreaksItsServerIsSentTwiceAtMost: a request that closes its
// server's connection every time is not sent again once per idle connection in the
// pool (8 here) but once, on a new connection, and then answered 502; one that got
// the first bytes of an answer is not sent again at all.
func TestARequestThatBreaksItsServerIsSentTwiceAtMost(t *testing.T) {
	for _, tc := range []struct {
		name    string
		partial bool
		want    int64
	}{{"unanswered", false, 2}, {"answered in part", true, 1}} {
		t.Run(tc.name, func(t *testing.T) {
			b := newBreakingBackend(t, tc.partial)
			tg := startGateway(t, "routes:\n- {name: llm, service: {name: llm-server, port: 8000}, queue: llm, holdTimeout: 1m, concurrency: 16}\n",
				Config{ServiceAddr: func(string, string, int) string { return b.addr }})
			tg.setSlice(t, "llm-server", b.addr, true)
			// Eight requests at once leave eight idle connections in the pool.
			var warm []<-chan outcome
			for range 8 {
				warm = append(warm, send(t.Context(), "POST", tg.URL+"/v1/completions", "ok", nil))
			}
			for _, w := range warm {
				if o := wait(t, w); o.resp.StatusCode != 200 {
					t.Fatalf("warm-up: got %d %q", o.resp.StatusCode, o.body)
				}
			}
			wantError(t, wait(t, send(t.Context(), "POST", tg.URL+"/v1/completions", "break", nil)), 502, ReasonUpstreamError, false, "upstream")
			if got := b.got.Load(); got != tc.want {
				t.Errorf("the backend read the request %d times, want %d", got, tc.want)
			}
		})
	}
}
