package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime/pprof"
	"strconv"
	"strings"

	"github.com/gpuscaler/gpuscaler/internal/bench"
)

const benchAbout = `
Measures a whole scaler in this one process: an embedded NATS server, the scaler with its
gRPC server on loopback, simulated nodes publishing NodeReports in the background, queue
producers and a gRPC client. It reports:
  - activation latency: QueueReport published → StreamIsActive true at the client
    (p50/p99 over --activations queues, with the background node load running)
  - GetMetrics latency over --triggers triggers, queue and podSelector GPU triggers
  - the highest NodeReport rate absorbed without falling behind (--rates, rising)
  - heap and resident memory per tracked GPU
It prints a table, writes JSON to --out, and takes about a minute with the defaults.`

func runBench(ctx context.Context, args []string, env envFunc, stdout, stderr io.Writer) error {
	var (
		cfg   bench.Config
		out   string
		rates string
		check bool
		prof  string
	)
	fs := newFlagSet("bench", "bench [flags]", benchAbout, stdout)
	fs.IntVar(&cfg.Nodes, "nodes", 1000, "simulated nodes publishing NodeReports in the background")
	fs.IntVar(&cfg.GPUsPerNode, "gpus-per-node", 8, "GPUs per simulated node")
	fs.DurationVar(&cfg.NodeInterval, "node-interval", 1e9, "each simulated node's report interval")
	fs.IntVar(&cfg.Activations, "activations", 1000, "activations measured, one queue and stream each")
	fs.IntVar(&cfg.Triggers, "triggers", 1000, "triggers asked GetMetrics")
	fs.IntVar(&cfg.Calls, "calls", 20000, "GetMetrics calls measured")
	fs.StringVar(&rates, "rates", "10000,20000,30000,40000,60000,80000", "NodeReport rates per second tried for absorption, rising; stops at the first not absorbed")
	fs.DurationVar(&cfg.StepDuration, "step", 3e9, "how long each absorption rate runs")
	fs.IntVar(&cfg.MemoryNodes, "memory-nodes", 10000, "nodes decoded into a fresh state to weigh a GPU")
	fs.StringVar(&out, "out", "bench.json", `where to write the result as JSON; "" writes none`)
	fs.BoolVar(&check, "check", false, "exit with status 1 when a target is missed")
	fs.StringVar(&prof, "cpu-profile", "", "write a CPU profile of the whole run to this file (go tool pprof)")
	fs.BoolVar(&cfg.StreamMemory, "stream-memory", false, "keep the GPUSCALER stream in memory rather than on disk")
	fs.StringVar(&cfg.Auth, "nats-auth", "open", "how the bus admits the scaler and the queue producer: open, or callout (gpuscaler's auth callout and its per-role permissions, as the chart installs it)")
	newLogger := logFlags(fs, stderr, "info")
	if err := parseFlags(fs, args, env); err != nil {
		return err
	}
	log, err := newLogger()
	if err != nil {
		return err
	}
	cfg.Log = log // the scaler's and NATS's logs interleave with the progress lines
	for r := range strings.SplitSeq(rates, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(r))
		if err != nil || n <= 0 {
			return usageError{fmt.Errorf("--rates %q: want rising positive whole numbers separated by commas", rates)}
		}
		cfg.Rates = append(cfg.Rates, n)
	}
	if prof != "" {
		f, err := os.Create(prof)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	res, err := bench.Run(ctx, cfg, stderr)
	if err != nil {
		return err
	}
	res.Table(stdout)
	if out != "" {
		data, _ := json.MarshalIndent(res, "", "  ")
		if err := os.WriteFile(out, append(data, '\n'), 0o644); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "wrote %s\n", out)
	}
	if check && !res.Met() {
		return errors.New("a target was missed")
	}
	return nil
}
