package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/gpuscaler/gpuscaler/internal/demo"
)

const demoAbout = `
Runs gpuscaler end to end on this machine, with no cluster and no GPU, and prints a live
timeline. It starts an embedded NATS server, simulated GPU nodes whose collectors publish
real NodeReports, the real scaler, and queue producers using the real producer API. A
model of the cluster asks the scaler over gRPC what KEDA would ask, and moves replicas by
KEDA's and the HPA's rules (activation, pollingInterval, cooldownPeriod, ceil(value /
target) with the HPA's 10% tolerance and scale-down window):
  - an inference service that sits at zero replicas and wakes on its first queued
    request (pushed over StreamIsActive), then follows its backlog and GPU utilisation
    through a load of idle → burst → sustained → idle, and goes back to zero;
  - a training ScaledJob with capacityAware: Jobs only as fast as free GPUs allow.
At the end it prints the activation latency, GPU-seconds used against an always-on
service, and the time spent at zero. While it runs, its scaler serves KEDA's gRPC at
--grpc-addr: a real KEDA can be pointed at it. Ctrl-C stops it cleanly.`

func runDemo(ctx context.Context, args []string, env envFunc, stdout, stderr io.Writer) error {
	var (
		cfg      demo.Config
		chart    string
		jsonPath string
	)
	fs := newFlagSet("demo", "demo [flags]", demoAbout, stdout)
	fs.DurationVar(&cfg.Duration, "duration", time.Minute, "how long the demo runs; the load profile stretches to fit")
	fs.IntVar(&cfg.Nodes, "nodes", 4, "simulated GPU nodes, half for inference and half for training")
	fs.IntVar(&cfg.GPUsPerNode, "gpus-per-node", 8, "GPUs per simulated node")
	fs.Uint64Var(&cfg.Seed, "seed", 1, "seed of the simulated arrivals, service times and GPU noise")
	fs.StringVar(&cfg.GRPCAddr, "grpc-addr", "127.0.0.1:9090", "where the scaler serves KEDA's ExternalScaler gRPC while the demo runs")
	fs.StringVar(&cfg.HTTPAddr, "http-addr", "127.0.0.1:8080", `where the scaler serves /metrics, /healthz and /readyz; "-" turns HTTP off`)
	fs.StringVar(&cfg.NATSAddr, "nats-addr", "127.0.0.1:4222", "where the embedded NATS server listens")
	fs.DurationVar(&cfg.Timing.PollingInterval, "polling-interval", 5*time.Second, "the ScaledObject's and ScaledJob's pollingInterval")
	fs.DurationVar(&cfg.Timing.Cooldown, "cooldown", 15*time.Second, "the ScaledObject's cooldownPeriod")
	fs.DurationVar(&cfg.Timing.HPASync, "hpa-sync", 5*time.Second, "the HPA's sync period (kube-controller-manager's --horizontal-pod-autoscaler-sync-period, 15s by default there)")
	fs.StringVar(&chart, "chart", "", "write the timeline as an SVG chart to this file (backlog, GPU utilisation, replicas and Jobs over time)")
	fs.StringVar(&jsonPath, "json", "", "write the summary and timeline as JSON to this file")
	newLogger := logFlags(fs, stderr, "warn") // the timeline is the output; logs only say what went wrong
	if err := parseFlags(fs, args, env); err != nil {
		return err
	}
	log, err := newLogger()
	if err != nil {
		return err
	}
	if err := cfg.Validate(); err != nil {
		return usageError{err}
	}
	cfg.Out, cfg.Log = stdout, log.With("component", "demo")
	sum, err := demo.Run(ctx, cfg)
	if err != nil {
		return err
	}
	if chart != "" {
		f, err := os.Create(chart)
		if err != nil {
			return err
		}
		if err := demo.WriteChart(f, sum); err != nil {
			f.Close()
			return fmt.Errorf("write %s: %w", chart, err)
		}
		if err := f.Close(); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "wrote %s\n", chart)
	}
	if jsonPath != "" {
		data, _ := json.MarshalIndent(sum, "", "  ")
		if err := os.WriteFile(jsonPath, append(data, '\n'), 0o644); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "wrote %s\n", jsonPath)
	}
	return nil
}
