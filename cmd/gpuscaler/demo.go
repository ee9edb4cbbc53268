package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/gpuscaler/gpuscaler/cmd/gpuscaler/internal/demo"
)

const demoAbout = `
Runs gpuscaler end to end on this machine, with no cluster and no GPU, and prints a live
timeline. It starts an embedded NATS server, simulated GPU nodes whose collectors publish
real NodeReports, the real scaler, and queue producers using the real producer API. A
model of the cluster asks the scaler over gRPC what KEDA would ask, and moves replicas by
KEDA's and the HPA's rules (activation, pollingInterval, cooldownPeriod, ceil(value /
target) with the HPA's 10% tolerance and scale-down window):
  - an inference service that sits at zero replicas and wakes on its first queued
    request (pushed over StreamIsActive), then follows its queue's demand (the
    recommended trigger: targetWait and concurrency) and GPU utilisation through a load
    of idle → burst → sustained → idle, and goes back to zero;
  - a training ScaledJob with capacityAware: Jobs only as fast as free GPUs allow.
At the end it prints the activation latency, the GPU-seconds used, the requests' waits
and the time spent at zero, then replays the same requests (as gpuscaler replay does)
on a model of the demo's cluster under always-on, the seeds' GPU-utilisation HPA, KEDA's
polled queue scaler, gpuscaler's queue-backlog and its queue-demand, and prints each
beside the live run. While it runs, its scaler serves KEDA's gRPC at --grpc-addr: a real
KEDA can be pointed at it. Ctrl-C stops it cleanly.`

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
	fs.StringVar(&cfg.GRPCAddr, "grpc-addr", demo.DefaultGRPCAddr, "where the scaler serves KEDA's ExternalScaler gRPC while the demo runs; left unset and taken by another program, a free port, which the demo prints")
	fs.StringVar(&cfg.HTTPAddr, "http-addr", demo.DefaultHTTPAddr, `where the scaler serves /metrics, /healthz and /readyz; "-" turns HTTP off; left unset and taken, a free port`)
	fs.StringVar(&cfg.NATSAddr, "nats-addr", demo.DefaultNATSAddr, "where the embedded NATS server listens; left unset and taken (a local nats-server), a free port, which the demo prints")
	fs.DurationVar(&cfg.Timing.PollingInterval, "polling-interval", 5*time.Second, "the ScaledObject's and ScaledJob's pollingInterval")
	fs.DurationVar(&cfg.Timing.Cooldown, "cooldown", 15*time.Second, "the ScaledObject's cooldownPeriod; 0, as in KEDA, goes back to zero at the first inactive answer")
	fs.DurationVar(&cfg.Timing.HPASync, "hpa-sync", 5*time.Second, "the HPA's sync period (kube-controller-manager's --horizontal-pod-autoscaler-sync-period, 15s by default there)")
	fs.StringVar(&chart, "chart", "", "write the timeline as an SVG chart to this file (the load's phases, arrivals, backlog, GPU utilisation, replicas and Jobs over time), also when stopped early")
	fs.StringVar(&jsonPath, "json", "", "write the summary and timeline as JSON to this file, also when stopped early")
	newLogger := logFlags(fs, stderr, "warn") // the timeline is the output; logs only say what went wrong
	if err := parseFlags(fs, args, env); err != nil {
		return err
	}
	log, err := newLogger()
	if err != nil {
		return err
	}
	// The flags hold their defaults already, so Validate sees what the user gave: a zero
	// that means nothing (--duration 0) is an error, not the default.
	if err := cfg.Validate(); err != nil {
		return usageError{err}
	}
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	for _, a := range []struct {
		flag, hint string
		addr       *string
	}{{"grpc-addr", "", &cfg.GRPCAddr}, {"http-addr", `, or "-" to turn HTTP off`, &cfg.HTTPAddr}, {"nats-addr", "", &cfg.NATSAddr}} {
		if _, fromEnv := env(envName(a.flag)); given[a.flag] || fromEnv {
			if *a.addr == "" {
				return usageError{fmt.Errorf("--%s \"\": want host:port, such as 127.0.0.1:0 (port 0 picks a free one)%s", a.flag, a.hint)}
			}
		} else {
			*a.addr = "" // the default, which the demo moves when another program holds it
		}
	}
	// A minute's run must not end in an error about a file: open the outputs first.
	outs, err := openOutputs(map[string]string{"chart": chart, "json": jsonPath})
	if err != nil {
		return usageError{err}
	}
	cfg.Out, cfg.Log = stdout, log.With("component", "demo")
	sum, err := demo.Run(ctx, cfg)
	if err != nil {
		return errors.Join(err, outs.abandon())
	}
	// A run stopped early (Ctrl-C) returns its summary too: write it all the same.
	if f := outs["chart"]; f != nil {
		if err := f.write(func(w io.Writer) error { return demo.WriteChart(w, sum) }); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "wrote %s\n", f.path)
	}
	if f := outs["json"]; f != nil {
		data, _ := json.MarshalIndent(sum, "", "  ")
		if err := f.write(func(w io.Writer) error { _, err := w.Write(append(data, '\n')); return err }); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "wrote %s\n", f.path)
	}
	return nil
}
