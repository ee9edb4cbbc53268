package scaler

import (
	"errors"
	"io"
	"log/slog"
	"strconv"
	"testing"
	"time"

	"github.com/gpuscaler/gpuscaler/internal/natstest"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"

	pb "github.com/gpuscaler/gpuscaler/proto/externalscaler"
	gpuscalerv1 "github.com/gpuscaler/gpuscaler/proto/gpuscaler/v1"
	"github.com/gpuscaler/gpuscaler/test/testkit"
)

// testScaler is a scaler running in the test, with a gRPC client to it.
type testScaler struct {
	*Scaler
	reg    *prometheus.Registry
	client pb.ExternalScalerClient
	conn   *grpc.ClientConn
	stop   func() // stops the scaler and fails the test unless Run returns nil
}

// startScaler runs a scaler against the NATS at url, on loopback ports, and waits until
// it is ready. It stops at cleanup if the test has not stopped it.
func startScaler(t *testing.T, url string, cfg Config) *testScaler {
	t.Helper()
	return runScaler(t, url, cfg, testkit.Logger(t), true)
}

// startScalerLogging is startScaler with the scaler's log lines kept in the returned buffer.
func startScalerLogging(t *testing.T, url string, cfg Config) (*testScaler, *testkit.SyncBuffer) {
	t.Helper()
	log, buf := testkit.BufferLogger()
	return runScaler(t, url, cfg, log, true), buf
}

// newScaler is startScaler without waiting for readiness.
func newScaler(t *testing.T, url string, cfg Config) *testScaler {
	t.Helper()
	return runScaler(t, url, cfg, testkit.Logger(t), false)
}

// runScaler builds a scaler with cfg (loopback ports where it names none) on a
// connection to url, and runs it with testkit.Start, until ready when waitReady.
func runScaler(t *testing.T, url string, cfg Config, log *slog.Logger, waitReady bool) *testScaler {
	t.Helper()
	if cfg.GRPCAddr == "" {
		cfg.GRPCAddr = "127.0.0.1:0"
	}
	if cfg.HTTPAddr == "" {
		cfg.HTTPAddr = "127.0.0.1:0"
	}
	nc := natstest.Connect(t, url)
	if cfg.NATSHealth == nil {
		cfg.NATSHealth = nc
	}
	reg := prometheus.NewRegistry()
	s, err := New(cfg, nc.Conn, log, reg)
	if err != nil {
		t.Fatalf("scaler.New: %v", err)
	}
	var ready <-chan struct{}
	if waitReady {
		ready = s.Ready()
	}
	ts := &testScaler{Scaler: s, reg: reg}
	ts.stop = testkit.Start(t, "scaler", 10*time.Second, ready, s.Run)
	ts.conn = dial(t, s.GRPCAddr().String())
	ts.client = pb.NewExternalScalerClient(ts.conn)
	return ts
}

func dial(t *testing.T, addr string, opts ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	if len(opts) == 0 {
		opts = []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	}
	conn, err := grpc.NewClient(addr, opts...)
	if err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// publisher publishes reports through JetStream, waiting for the stream to store each.
type publisher struct {
	t  *testing.T
	js jetstream.JetStream
}

func newPublisher(t *testing.T, url string) *publisher {
	t.Helper()
	js, err := jetstream.New(natstest.Connect(t, url).Conn)
	if err != nil {
		t.Fatal(err)
	}
	return &publisher{t: t, js: js}
}

func (p *publisher) raw(subject string, data []byte) {
	p.t.Helper()
	if _, err := p.js.Publish(p.t.Context(), subject, data); err != nil {
		p.t.Fatalf("publish %s: %v", subject, err)
	}
}

func (p *publisher) queue(ns, q string, waiting, inFlight uint64) {
	p.t.Helper()
	subject, err := gpuscalerv1.QueueSubject(ns, q, "p")
	if err != nil {
		p.t.Fatal(err)
	}
	data, _ := proto.Marshal(&gpuscalerv1.QueueReport{Namespace: ns, Queue: q, ProducerId: "p", Waiting: waiting, InFlight: inFlight})
	p.raw(subject, data)
}

func (p *publisher) node(r *gpuscalerv1.NodeReport) {
	p.t.Helper()
	subject, err := gpuscalerv1.NodeSubject(r.GetNode())
	if err != nil {
		p.t.Fatal(err)
	}
	data, _ := proto.Marshal(r)
	p.raw(subject, data)
}

// ref builds a ScaledObjectRef the way KEDA does: the trigger's whole metadata, with
// scalerAddress in it.
func ref(ns, name string, md map[string]string) *pb.ScaledObjectRef {
	m := map[string]string{"scalerAddress": "gpuscaler:9090"}
	for k, v := range md {
		m[k] = v
	}
	return &pb.ScaledObjectRef{Name: name, Namespace: ns, ScalerMetadata: m}
}

// recvAll reads a stream into a channel until it ends; the final error (io.EOF on a clean
// end) is sent on errc.
func recvAll(stream pb.ExternalScaler_StreamIsActiveClient) (<-chan bool, <-chan error) {
	msgs := make(chan bool, 16)
	errc := make(chan error, 1)
	go func() {
		for {
			resp, err := stream.Recv()
			if err != nil {
				errc <- err
				close(msgs)
				return
			}
			msgs <- resp.GetResult()
		}
	}()
	return msgs, errc
}

func expectMsg(t *testing.T, msgs <-chan bool, want bool) {
	t.Helper()
	select {
	case got, ok := <-msgs:
		if !ok {
			t.Fatalf("stream ended, want message %v", want)
		}
		if got != want {
			t.Fatalf("stream sent %v, want %v", got, want)
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("no stream message within 5s, want %v", want)
	}
}

// pushedAtLeast waits for the scaler to have counted at least n pushed activations and
// returns the count: a stream counts a push once it has sent it, so a test that has
// received the message can read the count just before it moves.
func pushedAtLeast(t *testing.T, s *testScaler, n float64) float64 {
	t.Helper()
	testkit.Eventually(t, 5*time.Second, func() bool { return testutil.ToFloat64(s.metrics.activationsPushed) >= n })
	return testutil.ToFloat64(s.metrics.activationsPushed)
}

// expectOnePush checks that the stream pushed true, that it was the scaler's one push
// since the stream opened, and that nothing followed it; why says what made it.
func expectOnePush(t *testing.T, s *testScaler, msgs <-chan bool, why string) {
	t.Helper()
	expectMsg(t, msgs, true)
	if got := pushedAtLeast(t, s, 1); got != 1 {
		t.Fatalf("activations pushed = %v, want 1: only %s", got, why)
	}
	select {
	case m := <-msgs:
		t.Fatalf("stream sent %v after the activation, want nothing more", m)
	default:
	}
}

func expectEOF(t *testing.T, errc <-chan error) {
	t.Helper()
	select {
	case err := <-errc:
		if !errors.Is(err, io.EOF) {
			t.Fatalf("stream ended with %v, want io.EOF (a nil error from the server)", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("stream did not end within 10s")
	}
}

func itoa(i int) string { return strconv.Itoa(i) }
