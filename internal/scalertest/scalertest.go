// Package scalertest runs a real gpuscaler scaler inside a test, for the tests of the
// parts that talk to one (producers, the command line). The scaler's own tests build
// theirs in package scaler.
package scalertest

import (
	"context"
	"testing"
	"time"

	"github.com/gpuscaler/gpuscaler/internal/natstest"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	pb "github.com/gpuscaler/gpuscaler/proto/externalscaler"
	"github.com/gpuscaler/gpuscaler/scaler"
	"github.com/gpuscaler/gpuscaler/test/testkit"
)

// Start runs a scaler against the NATS at url, with gRPC on a loopback port and no HTTP,
// waits until it is ready (it has created the GPUSCALER stream and restored its state),
// and returns it with a gRPC client. At cleanup it stops the scaler and fails the test
// unless Run returned nil.
func Start(t testing.TB, url string) (*scaler.Scaler, pb.ExternalScalerClient) {
	t.Helper()
	nc := natstest.Connect(t, url)
	s, err := scaler.New(scaler.Config{GRPCAddr: "127.0.0.1:0", HTTPAddr: "-", NATSHealth: nc}, nc.Conn, testkit.Logger(t), prometheus.NewRegistry())
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
	case err := <-done:
		t.Fatalf("scaler stopped before it was ready: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("scaler not ready within 10s")
	}
	conn, err := grpc.NewClient(s.GRPCAddr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatalf("dial the scaler: %v", err)
	}
	t.Cleanup(func() { conn.Close() })
	return s, pb.NewExternalScalerClient(conn)
}
