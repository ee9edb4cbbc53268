package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gpuscaler/gpuscaler/internal/natstest"
	pb "github.com/gpuscaler/gpuscaler/proto/externalscaler"
	"github.com/gpuscaler/gpuscaler/scaler/scalertest"
	"github.com/gpuscaler/gpuscaler/test/testkit"
)

// TestTwoGatewaysOneQueue runs two gpuscaler gateway replicas in front of one backend
// that is down, each a producer of the same queue, against a real scaler over NATS. The
// scaler reads the queue as the sum of their held requests and is active; when one
// replica stops, the queue reads the other's share at once, never 0 while it holds
// work; when the backend comes up every held request is answered.
func TestTwoGatewaysOneQueue(t *testing.T) {
	ns := natstest.Start(t, "", "")
	_, keda := scalertest.Start(t, ns.ClientURL())

	var up atomic.Bool
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !up.Load() {
			http.Error(w, "loading", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintf(w, "served %s", r.URL.Path)
	}))
	t.Cleanup(backend.Close)
	routes := testkit.WriteFile(t, t.TempDir(), "routes.yaml",
		[]byte("routes:\n- {name: llm, url: "+backend.URL+", pathPrefix: /v1, queue: llm-requests, holdTimeout: 1m}\n"))

	type gateway struct {
		listen string
		cancel context.CancelFunc
		exited chan int
		log    *testkit.SyncBuffer
	}
	start := func(id string) *gateway {
		ctx, cancel := context.WithCancel(t.Context())
		g := &gateway{listen: testkit.FreeAddr(t), cancel: cancel, exited: make(chan int, 1), log: &testkit.SyncBuffer{}}
		go func() {
			g.exited <- run(ctx, []string{"gateway", "--routes", routes, "--listen", g.listen, "--http-addr", "-",
				"--namespace", "ml", "--kubeconfig", "none", "--nats-url", ns.ClientURL(),
				"--report-interval", "100ms", "--producer-id", id, "--shutdown-grace", "200ms"}, mapEnv(nil), io.Discard, g.log)
		}()
		t.Cleanup(func() {
			cancel()
			select {
			case <-g.exited:
			case <-time.After(10 * time.Second):
				t.Errorf("gateway %s still running 10s after its context ended", id)
			}
		})
		return g
	}
	a, b := start("gw-a"), start("gw-b")

	type answer struct {
		code int
		body string
	}
	answers := make(chan answer, 8)
	var sent sync.WaitGroup
	send := func(g *gateway, n int) {
		for i := range n {
			sent.Add(1)
			go func() {
				defer sent.Done()
				resp, err := http.Post("http://"+g.listen+fmt.Sprintf("/v1/completions/%d", i), "application/json", nil)
				if err != nil {
					answers <- answer{code: -1, body: err.Error()}
					return
				}
				defer resp.Body.Close()
				body, _ := io.ReadAll(resp.Body)
				answers <- answer{resp.StatusCode, string(body)}
			}()
		}
	}
	ref := &pb.ScaledObjectRef{Name: "llm", Namespace: "ml", ScalerMetadata: map[string]string{"queue": "llm-requests"}}
	backlog := func() (float64, error) {
		resp, err := keda.GetMetrics(t.Context(), &pb.GetMetricsRequest{ScaledObjectRef: ref, MetricName: "queue-backlog"})
		if err != nil {
			return 0, err
		}
		return resp.GetMetricValues()[0].GetMetricValueFloat(), nil
	}
	waitBacklog := func(want float64) {
		t.Helper()
		var got float64
		var err error
		testkit.Eventually(t, 10*time.Second, func() bool {
			got, err = backlog()
			return err == nil && got == want
		})
		if err != nil || got != want {
			t.Fatalf("queue-backlog = %g, %v; want %g", got, err, want)
		}
	}

	// Both listen before anything is sent: each refuses connections until then.
	for _, g := range []*gateway{a, b} {
		testkit.Eventually(t, 10*time.Second, func() bool {
			resp, err := http.Get("http://" + g.listen + "/no-route")
			if err == nil {
				resp.Body.Close()
			}
			return err == nil
		})
	}
	send(a, 3)
	send(b, 2)
	waitBacklog(5) // 3 held by gw-a, 2 by gw-b
	if resp, err := keda.IsActive(t.Context(), ref); err != nil || !resp.GetResult() {
		t.Fatalf("IsActive = %v, %v; want active", resp, err)
	}

	// gw-b stops: its grace passes with the backend still down, its two get 503, and its
	// last report says it stopped. The queue reads gw-a's 3 from then on, never less.
	b.cancel()
	for range 2 {
		if got := <-answers; got.code != http.StatusServiceUnavailable {
			t.Fatalf("a request held by the stopped gateway got %d %q, want 503", got.code, got.body)
		}
	}
	select {
	case code := <-b.exited:
		if code != 0 {
			t.Fatalf("gw-b exited %d, want 0; log:\n%s", code, b.log)
		}
		b.exited <- code // for the cleanup
	case <-time.After(10 * time.Second):
		t.Fatal("gw-b did not stop")
	}
	waitBacklog(3)
	tick := time.NewTicker(50 * time.Millisecond) // ten reads across gw-a's heartbeats
	defer tick.Stop()
	for range 10 {
		<-tick.C
		if got, err := backlog(); err != nil || got != 3 {
			t.Fatalf("queue-backlog while gw-a holds 3 = %g, %v; want 3", got, err)
		}
	}

	// The backend comes up: gw-a's held requests are answered, and the queue empties.
	up.Store(true)
	for range 3 {
		if got := <-answers; got.code != http.StatusOK {
			t.Fatalf("a held request got %d %q once the backend was up, want 200", got.code, got.body)
		}
	}
	sent.Wait()
	waitBacklog(0)
}

// BenchmarkGatewayWake measures what the front door exists for: from a request arriving
// at a gateway whose backend has no ready replica to KEDA's StreamIsActive stream
// saying active. Each round sends one request to an empty queue, waits for the push,
// then cancels the request (a drop) and waits until the scaler has seen the queue empty
// again, so the next round starts from an inactive trigger. Reported: the p50 and p99
// over the rounds, in milliseconds (the target is a p99 of 5 ms).
func BenchmarkGatewayWake(b *testing.B) {
	ns := natstest.Start(b, "", "")
	_, keda := scalertest.Start(b, ns.ClientURL())
	down := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "loading", http.StatusServiceUnavailable)
	}))
	b.Cleanup(down.Close)
	routes := testkit.WriteFile(b, b.TempDir(), "routes.yaml",
		[]byte("routes:\n- {name: llm, url: "+down.URL+", pathPrefix: /v1, queue: llm-requests, holdTimeout: 1m}\n"))
	listen := testkit.FreeAddr(b)
	ctx, cancel := context.WithCancel(context.Background())
	exited := make(chan int, 1)
	go func() {
		exited <- run(ctx, []string{"gateway", "--routes", routes, "--listen", listen, "--http-addr", "-",
			"--namespace", "ml", "--kubeconfig", "none", "--nats-url", ns.ClientURL(),
			"--report-interval", "50ms", "--producer-id", "gw-bench", "--shutdown-grace", "100ms"}, mapEnv(nil), io.Discard, io.Discard)
	}()
	b.Cleanup(func() { cancel(); <-exited })

	// pushInterval 0s: the wakes follow each other by milliseconds, with no KEDA to scale
	// to zero between them; in a cluster a wake from zero comes a cooldownPeriod after
	// the last push at least, which the default pushInterval never holds back.
	ref := &pb.ScaledObjectRef{Name: "llm", Namespace: "ml", ScalerMetadata: map[string]string{"queue": "llm-requests", "pushInterval": "0s"}}
	inactive := func() bool {
		resp, err := keda.IsActive(context.Background(), ref)
		return err == nil && !resp.GetResult()
	}
	testkit.Eventually(b, 10*time.Second, inactive) // the gateway reported its empty share
	streamCtx, stopStream := context.WithCancel(context.Background())
	defer stopStream()
	stream, err := keda.StreamIsActive(streamCtx, ref)
	if err != nil {
		b.Fatal(err)
	}
	pushes := make(chan time.Time, 16)
	go func() {
		for {
			resp, err := stream.Recv()
			if err != nil {
				return
			}
			if resp.GetResult() {
				pushes <- time.Now()
			}
		}
	}()
	client := &http.Client{}
	var lat []time.Duration
	for b.Loop() {
		reqCtx, drop := context.WithCancel(context.Background())
		req, _ := http.NewRequestWithContext(reqCtx, http.MethodPost, "http://"+listen+"/v1/completions", nil)
		sent := time.Now()
		go func() {
			if resp, err := client.Do(req); err == nil {
				resp.Body.Close()
			}
		}()
		select {
		case at := <-pushes:
			lat = append(lat, at.Sub(sent))
		case <-time.After(10 * time.Second):
			b.Fatal("no push within 10s of a request at an empty queue")
		}
		drop()
		testkit.Eventually(b, 10*time.Second, inactive)
	}
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99-ms")
}
