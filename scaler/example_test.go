package scaler_test

import (
	"context"
	"log/slog"
	"os"
	"os/signal"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpuscaler/gpuscaler/scaler"
)

// A program of its own builds a scaler from a NATS connection it opens, a logger and a
// Prometheus registry, then serves KEDA until its context ends. The connection should
// reconnect forever: the scaler keeps answering from what it has while NATS is away.
func Example() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	log := slog.Default()

	nc, err := nats.Connect("nats://127.0.0.1:4222", nats.Name("my-scaler"), nats.MaxReconnects(-1))
	if err != nil {
		log.Error("connect to NATS", "err", err)
		return
	}
	defer nc.Close()

	s, err := scaler.New(scaler.Config{GRPCAddr: ":9090", HTTPAddr: ":8080"}, nc, log, prometheus.NewRegistry())
	if err != nil {
		log.Error("build the scaler", "err", err)
		return
	}
	if err := s.Run(ctx); err != nil {
		log.Error("scaler stopped", "err", err)
	}
}
