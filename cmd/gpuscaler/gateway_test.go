package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/gpuscaler/gpuscaler/internal/natstest"
	gpuscalerv1 "github.com/gpuscaler/gpuscaler/proto/gpuscaler/v1"
	"github.com/gpuscaler/gpuscaler/test/testkit"
)

// TestGatewayCommand runs gpuscaler gateway end to end: embedded NATS, a url route to a
// backend, one request through, and the queue's reports read from NATS.
func TestGatewayCommand(t *testing.T) {
	ns := natstest.Start(t, "", "")
	nc := natstest.Connect(t, ns.ClientURL())
	reports := natstest.Subscribe(t, nc.Conn, "gpuscaler.v1.queue.ml.>")

	b := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/health" {
			fmt.Fprintf(w, "served %s", r.URL.Path)
		}
	}))
	t.Cleanup(b.Close)
	routes := testkit.WriteFile(t, t.TempDir(), "routes.yaml",
		[]byte("routes:\n- {name: dev, url: "+b.URL+", pathPrefix: /v1, queue: dev, holdTimeout: 1m}\n"))
	listen := testkit.FreeAddr(t)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	log := &testkit.SyncBuffer{}
	exited := make(chan int, 1)
	go func() {
		exited <- run(ctx, []string{"gateway", "--routes", routes, "--listen", listen, "--http-addr", "127.0.0.1:0",
			"--namespace", "ml", "--kubeconfig", "none", "--nats-url", ns.ClientURL(), "--report-interval", "50ms", "--producer-id", "gw-1"}, mapEnv(nil), io.Discard, log)
	}()

	// Ready once the routes are in force.
	addr, ok := "", false
	testkit.Eventually(t, 10*time.Second, func() bool {
		addr, ok = logValue(log.String(), "serving metrics and probes", "httpAddr")
		return ok
	})
	testkit.Eventually(t, 10*time.Second, func() bool {
		resp, err := http.Get("http://" + addr + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	})

	var body string
	testkit.Eventually(t, 10*time.Second, func() bool {
		resp, err := http.Get("http://" + listen + "/v1/models")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		body = string(b)
		return resp.StatusCode == 200
	})
	if body != "served /v1/models" {
		t.Fatalf("got %q, want the backend's answer", body)
	}

	// The arrival reaches NATS, on this producer's subject; then the queue reads empty
	// again; on stop, the last report says it stopped.
	var arrivals uint64
	next := func() *gpuscalerv1.QueueReport {
		t.Helper()
		select {
		case m := <-reports:
			if m.Subject != "gpuscaler.v1.queue.ml.dev.gw-1" {
				t.Fatalf("got a report on %s, want gpuscaler.v1.queue.ml.dev.gw-1", m.Subject)
			}
			ev, err := gpuscalerv1.Decode(m.Subject, m.Data)
			if err != nil {
				t.Fatalf("decode %s: %v", m.Subject, err)
			}
			arrivals += ev.Queue.GetArrivals()
			return ev.Queue
		case <-time.After(10 * time.Second):
			t.Fatalf("no report within 10s (arrivals %d); log:\n%s", arrivals, log)
		}
		return nil
	}
	for q := next(); arrivals != 1 || q.GetWaiting() != 0 || q.GetInFlight() != 0; q = next() {
	}
	cancel()
	select {
	case code := <-exited:
		if code != 0 {
			t.Fatalf("exit %d, want 0; log:\n%s", code, log)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("still running 10s after its context ended; log:\n%s", log)
	}
	for q := next(); !q.GetStopped(); q = next() {
	}
	if arrivals != 1 {
		t.Errorf("got %d arrivals, want 1", arrivals)
	}
}

// TestGatewayCommandRefuses checks the command's usage errors.
func TestGatewayCommandRefuses(t *testing.T) {
	dir := t.TempDir()
	svc := testkit.WriteFile(t, dir, "svc.yaml", []byte("routes:\n- {name: llm, service: {name: s, port: 80}, queue: q, holdTimeout: 1m}\n"))
	bad := testkit.WriteFile(t, dir, "bad.yaml", []byte("routes:\n- {name: llm, url: 'http://x', queue: q, holdTimeout: 5x}\n"))
	tests := map[string]struct {
		args []string
		env  map[string]string
		code int
		want string
	}{
		"no routes":           {[]string{"gateway"}, nil, 2, "--routes is required"},
		"no namespace":        {[]string{"gateway", "--routes", svc, "--kubeconfig", "none"}, nil, 2, "--namespace"},
		"bad max held":        {[]string{"gateway", "--routes", svc, "--max-held", "0"}, nil, 2, "--max-held 0"},
		"service no kube":     {[]string{"gateway", "--routes", svc, "--kubeconfig", "none", "--nats-url", "nats://" + testkit.FreeAddr(t)}, map[string]string{"POD_NAMESPACE": "ml"}, 1, "needs the Kubernetes API"},
		"bad service address": {[]string{"gateway", "--routes", svc, "--service-address", "s:80"}, nil, 2, `"s:80": want NAME:PORT=HOST:PORT`},
		"broken routes":       {[]string{"gateway", "--routes", bad, "--kubeconfig", "none", "--namespace", "ml", "--nats-url", "nats://" + testkit.FreeAddr(t)}, nil, 1, `holdTimeout "5x"`},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if name == "no namespace" && serviceAccountNamespace() != "" {
				t.Skip("this machine has a service account namespace file")
			}
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			defer cancel()
			r := runCLI(ctx, tc.env, tc.args...)
			if r.code != tc.code || !strings.Contains(r.stderr, tc.want) {
				t.Errorf("got %v, want exit %d and %q on stderr", r, tc.code, tc.want)
			}
		})
	}
}

// TestServiceAddresses checks --service-address: what it accepts, what it refuses, and
// where the gateway then sends a Service's traffic.
func TestServiceAddresses(t *testing.T) {
	tests := map[string]struct {
		values []string
		want   map[string]string // "name:port" → address looked up
		err    string
	}{
		"none": {nil, map[string]string{"llm:8000": "llm.ml.svc:8000"}, ""},
		"one": {[]string{"llm:8000=127.0.0.1:18000"},
			map[string]string{"llm:8000": "127.0.0.1:18000", "llm:9000": "llm.ml.svc:9000", "other:8000": "other.ml.svc:8000"}, ""},
		"repeated": {[]string{"llm:8000=127.0.0.1:18000", "emb:80=localhost:18080"},
			map[string]string{"llm:8000": "127.0.0.1:18000", "emb:80": "localhost:18080"}, ""},
		"comma-separated, as the environment gives it": {[]string{"llm:8000=127.0.0.1:18000, emb:80=[::1]:18080"},
			map[string]string{"llm:8000": "127.0.0.1:18000", "emb:80": "[::1]:18080"}, ""},
		"leading zero in port": {[]string{"llm:08000=127.0.0.1:18000"}, map[string]string{"llm:8000": "127.0.0.1:18000"}, ""},
		"no '='":               {[]string{"llm:8000"}, nil, "want NAME:PORT=HOST:PORT"},
		"no port":              {[]string{"llm=127.0.0.1:1"}, nil, "NAME:PORT before '='"},
		"port 0":               {[]string{"llm:0=127.0.0.1:1"}, nil, "NAME:PORT before '='"},
		"no name":              {[]string{":80=127.0.0.1:1"}, nil, "NAME:PORT before '='"},
		"no target port":       {[]string{"llm:80=127.0.0.1"}, nil, "HOST:PORT after '='"},
		"target port too big":  {[]string{"llm:80=127.0.0.1:70000"}, nil, "HOST:PORT after '='"},
		"twice":                {[]string{"llm:80=127.0.0.1:1", "llm:80=127.0.0.1:2"}, nil, "mapped twice"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			s := serviceAddresses{}
			var err error
			for _, v := range tc.values {
				if err = s.Set(v); err != nil {
					break
				}
			}
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("got error %v, want one saying %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			for svc, want := range tc.want {
				n, p, _ := strings.Cut(svc, ":")
				if got := s.lookup(n, "ml", parsePort(p)); got != want {
					t.Errorf("%s: got %s, want %s", svc, got, want)
				}
			}
		})
	}
}
