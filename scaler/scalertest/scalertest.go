// Package scalertest runs a real gpuscaler scaler inside a test, for the tests of the
// parts that talk to one (producers, the collector, the command line, the auth
// callout). The scaler's own tests build theirs in package scaler.
package scalertest

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/gpuscaler/gpuscaler/internal/natsconn"
	"github.com/gpuscaler/gpuscaler/internal/natstest"
	pb "github.com/gpuscaler/gpuscaler/proto/externalscaler"
	"github.com/gpuscaler/gpuscaler/scaler"
	"github.com/gpuscaler/gpuscaler/test/testkit"
)

// ReadyTimeout is how long Run waits for a scaler to be ready: to have created its
// streams, GPUSCALER and GPUSCALER_QUEUES, and restored its state.
const ReadyTimeout = 15 * time.Second

// Start runs a scaler against the NATS at url, with gRPC on a loopback port and no HTTP,
// waits until it is ready, and returns it with a gRPC client. At cleanup it stops the
// scaler and fails the test unless Run returned nil.
func Start(t testing.TB, url string) (*scaler.Scaler, pb.ExternalScalerClient) {
	t.Helper()
	s := Run(t, scaler.Config{}, natstest.Connect(t, url))
	return s, Client(t, s)
}

// Run builds a scaler with cfg on nc (gRPC on a loopback port and no HTTP where cfg names
// none; nc's health as the scaler's NATS health) and runs it with testkit.Start: until it
// is ready, then until cleanup, failing the test unless it stops cleanly.
func Run(t testing.TB, cfg scaler.Config, nc *natsconn.Conn) *scaler.Scaler {
	t.Helper()
	if cfg.GRPCAddr == "" {
		cfg.GRPCAddr = "127.0.0.1:0"
	}
	if cfg.HTTPAddr == "" {
		cfg.HTTPAddr = "-"
	}
	if cfg.NATSHealth == nil {
		cfg.NATSHealth = nc
	}
	s, err := scaler.New(cfg, nc.Conn, testkit.Logger(t), prometheus.NewRegistry())
	if err != nil {
		t.Fatalf("scaler.New: %v", err)
	}
	testkit.Start(t, "scaler", ReadyTimeout, s.Ready(), s.Run)
	return s
}

// Client is a plain-text gRPC client of s, closed at cleanup.
func Client(t testing.TB, s *scaler.Scaler) pb.ExternalScalerClient {
	t.Helper()
	conn, err := grpc.NewClient(s.GRPCAddr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatalf("dial the scaler: %v", err)
	}
	t.Cleanup(func() { conn.Close() })
	return pb.NewExternalScalerClient(conn)
}
