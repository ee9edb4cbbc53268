package gateway

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gpuscaler/gpuscaler/gateway/routes"
	"github.com/gpuscaler/gpuscaler/test/testkit"
)

// benchBody is a small chat completion request, as a held request would carry.
var benchBody = `{"model":"llama","messages":[{"role":"user","content":"` + strings.Repeat("hello ", 30) + `"}],"stream":false}`

// benchGet sends GET url with benchBody b.N times over one client's kept-alive
// connections, reading each answer whole.
func benchGet(b *testing.B, url string) {
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	defer client.CloseIdleConnections()
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		resp, err := client.Post(url, "application/json", strings.NewReader(benchBody))
		if err != nil {
			b.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			b.Fatalf("got %d", resp.StatusCode)
		}
	}
}

func benchBackend(b *testing.B) *httptest.Server {
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"id":"x","choices":[{"message":{"role":"assistant","content":"hi"}}]}`))
	}))
	b.Cleanup(s.Close)
	return s
}

// BenchmarkDirect is a request to a loopback backend without the gateway: the baseline
// of BenchmarkProxy.
func BenchmarkDirect(b *testing.B) {
	benchGet(b, benchBackend(b).URL+"/v1/chat/completions")
}

// BenchmarkProxy is the same request through the gateway: matched, counted, forwarded.
func BenchmarkProxy(b *testing.B) {
	be := benchBackend(b)
	_, addr := startGatewayB(b, "routes:\n- {name: llm, url: "+be.URL+", pathPrefix: /v1, queue: llm, holdTimeout: 1m}\n", Config{}, true)
	benchGet(b, "http://"+addr+"/v1/chat/completions")
}

// startGatewayB serves a gateway with no Kubernetes and the routes in routes until the
// benchmark ends, and returns it and its address once it is ready and its URL backends
// have been probed once (when wantReady).
func startGatewayB(b *testing.B, routes string, cfg Config, wantReady bool) (*Gateway, string) {
	cfg.RoutesFile = testkit.WriteFile(b, b.TempDir(), "routes.yaml", []byte(routes))
	cfg.Namespace = "ml"
	g, err := New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- g.Run(ctx, lis) }()
	b.Cleanup(func() { cancel(); <-done })
	testkit.Eventually(b, 5*time.Second, func() bool {
		if g.Ready() != nil {
			return false
		}
		for _, s := range g.routing.Load().states {
			s.mu.Lock()
			ready := s.ready
			s.mu.Unlock()
			if wantReady && !ready {
				return false
			}
		}
		return true
	})
	return g, lis.Addr().String()
}

// BenchmarkRelease measures the release of held requests when the backend becomes
// ready: the time from the first ready endpoint until every held request has its
// target, per held request.
func BenchmarkRelease(b *testing.B) {
	for _, n := range []int{1, 100, 1000} {
		b.Run(fmt.Sprintf("held=%d", n), func(b *testing.B) {
			r := &routes.Route{Name: "llm", ServiceName: "llm-server", ServicePort: 8000, Queue: "llm", HoldTimeout: time.Minute}
			lim := holdLimits{maxHeld: n, maxHeldBytes: 1 << 30}
			for b.Loop() {
				b.StopTimer()
				s := newRouteState(context.Background(), r, nopCounter{}, "llm-server.ml.svc:8000", newMetrics(nil))
				var wg sync.WaitGroup
				for range n {
					wg.Go(func() {
						if _, err := s.acquire(context.Background(), 100, time.Now().Add(time.Minute), lim, func(int) {}); err != nil {
							b.Error(err)
						}
					})
				}
				for s.heldNow() < n {
					runtime.Gosched()
				}
				b.StartTimer()
				s.setEndpoints([]string{"10.0.0.1:8000"}, false)
				wg.Wait()
				b.StopTimer()
				s.cancel()
				b.StartTimer()
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/released")
		})
	}
}

// BenchmarkHeldMemory holds requests at a route whose backend is never ready and
// reports the memory each one costs (heap and goroutine stacks, runtime.MemStats):
// "handler" calls the gateway's handler directly, 10,000 times, so it is the gateway's
// own cost; "http" holds requests sent over real loopback connections, the net/http
// server's per-connection buffers included (5,000: client and server ends of each
// connection share this process's file descriptors).
func BenchmarkHeldMemory(b *testing.B) {
	routes := "routes:\n- {name: llm, url: 'http://127.0.0.1:1', queue: llm, holdTimeout: 1h}\n"
	cfg := Config{MaxHeld: 10000, MaxHeldBytes: 1 << 30, IdleProbeInterval: time.Hour, HeldProbeInterval: time.Hour}
	b.Run("handler", func(b *testing.B) {
		const n = 10000
		g, _ := startGatewayB(b, routes, cfg, false)
		st := g.routing.Load().states["llm"]
		for b.Loop() {
			reqs := make([]*http.Request, n)
			for i := range reqs {
				reqs[i] = httptest.NewRequest("POST", "http://gw/v1/chat/completions", strings.NewReader(benchBody))
			}
			before := heapAndStacks()
			ctx, stop := context.WithCancel(context.Background())
			var wg sync.WaitGroup
			for _, r := range reqs {
				wg.Go(func() { g.ServeHTTP(httptest.NewRecorder(), r.WithContext(ctx)) })
			}
			for st.heldNow() < n {
				runtime.Gosched()
			}
			b.ReportMetric(float64(heapAndStacks()-before)/n, "bytes/held")
			stop()
			wg.Wait()
		}
	})
	b.Run("http", func(b *testing.B) {
		const n = 5000
		g, addr := startGatewayB(b, routes, cfg, false)
		st := g.routing.Load().states["llm"]
		req := fmt.Sprintf("POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(benchBody), benchBody)
		for b.Loop() {
			before := heapAndStacks()
			conns := make([]net.Conn, 0, n)
			for range n {
				c, err := net.Dial("tcp", addr)
				if err != nil {
					b.Fatal(err)
				}
				if _, err := io.WriteString(c, req); err != nil {
					b.Fatal(err)
				}
				conns = append(conns, c)
			}
			testkit.Eventually(b, 30*time.Second, func() bool { return st.heldNow() == n })
			b.ReportMetric(float64(heapAndStacks()-before)/n, "bytes/held")
			for _, c := range conns {
				c.Close()
			}
			testkit.Eventually(b, 30*time.Second, func() bool { return st.heldNow() == 0 })
		}
	})
}

// heapAndStacks returns the bytes of heap in use and of goroutine stacks, after a GC.
func heapAndStacks() int64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapInuse + m.StackInuse)
}
