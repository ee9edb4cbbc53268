package queue

import (
	"context"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/gpuscaler/gpuscaler/internal/embedded"
	"github.com/gpuscaler/gpuscaler/internal/natsconn"
	pb "github.com/gpuscaler/gpuscaler/proto/externalscaler"
	gpuscalerv1 "github.com/gpuscaler/gpuscaler/proto/gpuscaler/v1"
	"github.com/gpuscaler/gpuscaler/scaler"
)

// testLogger logs to the test's output when -v is given, else discards.
func testLogger(t testing.TB) *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug})).With("test", t.Name())
	}
	return slog.New(slog.DiscardHandler)
}

// startNATS starts an embedded NATS server with JetStream on a random loopback port (or
// addr), storing in dir (a fresh t.TempDir() when empty). It shuts down at cleanup.
func startNATS(t testing.TB, addr, dir string) *embedded.Server {
	t.Helper()
	if dir == "" {
		dir = t.TempDir()
	}
	ns, err := embedded.Start(embedded.Options{Addr: addr, StoreDir: dir, Log: testLogger(t)})
	if err != nil {
		t.Fatalf("start NATS: %v", err)
	}
	t.Cleanup(ns.Shutdown)
	return ns
}

// connectNATS connects as a long-running producer would: reconnecting forever.
func connectNATS(t testing.TB, url string) *natsconn.Conn {
	t.Helper()
	nc, err := natsconn.Connect(t.Context(), natsconn.Options{URLs: url, RetryInitialConnect: true, Log: testLogger(t)})
	if err != nil {
		t.Fatalf("connect NATS: %v", err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// newReporter starts a Reporter for ns/q on nc and closes it at cleanup.
func newReporter(t testing.TB, nc *nats.Conn, ns, q string, cfg Config) *Reporter {
	t.Helper()
	if cfg.Log == nil {
		cfg.Log = testLogger(t)
	}
	r, err := NewReporter(nc, ns, q, cfg)
	if err != nil {
		t.Fatalf("NewReporter: %v", err)
	}
	t.Cleanup(func() { _ = r.Close() })
	return r
}

// reportStream is a core NATS subscription to one queue's reports.
type reportStream struct {
	t    *testing.T
	msgs chan *nats.Msg
}

// subscribe subscribes to ns/q's subject on its own connection to url, and returns once
// the server has the subscription, so no report published afterwards is missed.
func subscribe(t *testing.T, url, ns, q string) *reportStream {
	t.Helper()
	subject, err := gpuscalerv1.QueueSubject(ns, q)
	if err != nil {
		t.Fatal(err)
	}
	nc := connectNATS(t, url)
	s := &reportStream{t: t, msgs: make(chan *nats.Msg, 1<<16)}
	sub, err := nc.ChanSubscribe(subject, s.msgs)
	if err != nil {
		t.Fatalf("subscribe %s: %v", subject, err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	if err := nc.FlushTimeout(5 * time.Second); err != nil {
		t.Fatalf("flush subscription: %v", err)
	}
	return s
}

// next returns the next report, failing the test if none comes within 10s.
func (s *reportStream) next() *gpuscalerv1.QueueReport {
	s.t.Helper()
	select {
	case m := <-s.msgs:
		ev, err := gpuscalerv1.Decode(m.Subject, m.Data)
		if err != nil {
			s.t.Fatalf("report on %s: %v", m.Subject, err)
		}
		return ev.Queue
	case <-time.After(10 * time.Second):
		s.t.Fatal("no report within 10s")
		return nil
	}
}

// until reads reports until one satisfies cond, and returns them all, that one last. It
// fails the test if none does within 20s.
func (s *reportStream) until(cond func(*gpuscalerv1.QueueReport) bool) []*gpuscalerv1.QueueReport {
	s.t.Helper()
	var got []*gpuscalerv1.QueueReport
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		r := s.next()
		got = append(got, r)
		if cond(r) {
			return got
		}
	}
	s.t.Fatalf("no wanted report within 20s; the last of %d was %v", len(got), got[len(got)-1])
	return nil
}

// startScaler runs a real scaler against the NATS at url, on a loopback gRPC port with
// no HTTP, waits until it is ready and returns a client to it. It stops at cleanup.
func startScaler(t *testing.T, url string) pb.ExternalScalerClient {
	t.Helper()
	s, err := scaler.New(scaler.Config{GRPCAddr: "127.0.0.1:0", HTTPAddr: "-"}, connectNATS(t, url), testLogger(t), prometheus.NewRegistry())
	if err != nil {
		t.Fatalf("scaler.New: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("scaler Run returned %v, want nil on a clean stop", err)
			}
		case <-time.After(10 * time.Second):
			t.Error("scaler did not stop within 10s")
		}
	})
	select {
	case <-s.Ready():
	case <-time.After(10 * time.Second):
		t.Fatal("scaler not ready within 10s")
	}
	conn, err := grpc.NewClient(s.GRPCAddr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatalf("dial scaler: %v", err)
	}
	t.Cleanup(func() { conn.Close() })
	return pb.NewExternalScalerClient(conn)
}
