package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"

	"github.com/gpuscaler/gpuscaler/cmd/gpuscaler/internal/bench"
)

const benchAbout = `
Measures a whole scaler in this one process: an embedded NATS server, the scaler with its
gRPC server on loopback, simulated nodes publishing NodeReports in the background, queue
producers and a gRPC client. It reports, each beside its target:
  - activation latency: QueueReport published → StreamIsActive true at the client
    (p50/p99 over --activations queues, with the background node load running)
  - GetMetrics latency over --triggers triggers, queue and podSelector GPU triggers, one
    call at a time; with --big-namespace-gpus, half the podSelector triggers select apps
    of a namespace whose pods hold that many GPUs
  - NodeReports applied at the scaler's apply path (decoded and applied to its state as
    the NATS follower does, no NATS), with no reads, while KEDA reads every trigger at its
    rate (a GetMetrics and an IsActive every --polling-interval, and again every
    --hpa-sync-period: 2,000 reads/s for 10,000 triggers at the defaults), and while
    readers, as many as CPUs, read as fast as they can
  - the highest NodeReport rate absorbed end to end, through NATS, without falling
    behind (--rates, rising), with no reads and while KEDA reads at its rate; a rate R
    comes from R × --node-interval nodes (more nodes join as rates rise), so each node
    reports at its interval as collectors do
  - heap and resident memory per tracked GPU, and the resident memory of a scaler
    process of its own (this binary) following --nodes nodes
It prints a table, writes JSON to --out, and takes about a minute with the defaults.
--scale large sets the sizes the targets are set at: --nodes 10000 --triggers 10000
--big-namespace-gpus 7000 (a flag or its variable, when given, wins); it takes a few
minutes, more while reads slow the scaler down.`

func runBench(ctx context.Context, args []string, env envFunc, stdout, stderr io.Writer) error {
	var (
		cfg       bench.Config
		out       string
		rates     string
		check     bool
		prof      string
		scale     string
		scalerRSS bool
	)
	fs := newFlagSet("bench", "bench [flags]", benchAbout, stdout)
	fs.StringVar(&scale, "scale", "default", "sizes: default, or large: the sizes the targets are set at (see above)")
	fs.IntVar(&cfg.Nodes, "nodes", 1000, "simulated nodes publishing NodeReports in the background")
	fs.IntVar(&cfg.GPUsPerNode, "gpus-per-node", 8, "GPUs per simulated node")
	fs.DurationVar(&cfg.NodeInterval, "node-interval", 1e9, "each simulated node's report interval")
	fs.IntVar(&cfg.BigNamespaceGPUs, "big-namespace-gpus", 0, "GPUs held by the pods of one namespace, "+bench.BigNamespace+", whose apps half the podSelector triggers select; 0: no such namespace")
	fs.IntVar(&cfg.Activations, "activations", 1000, "activations measured, one queue and stream each")
	fs.IntVar(&cfg.Triggers, "triggers", 1000, "triggers asked GetMetrics and read at KEDA's rate, half queue and half podSelector")
	fs.IntVar(&cfg.Calls, "calls", 20000, "GetMetrics calls measured")
	fs.DurationVar(&cfg.PollingInterval, "polling-interval", 30e9, "KEDA's pollingInterval: how often its scale loop reads each trigger")
	fs.DurationVar(&cfg.HPASyncPeriod, "hpa-sync-period", 15e9, "how often the HPA reads each trigger through KEDA's metrics adapter (--horizontal-pod-autoscaler-sync-period)")
	fs.StringVar(&rates, "rates", "10000,20000,30000,40000,50000,60000,80000", "NodeReport rates per second tried for absorption through NATS, rising; stops at the first not absorbed")
	fs.BoolVar(&cfg.FixedAbsorbNodes, "absorb-fixed-nodes", false, "absorption: publish every rate from the --nodes nodes alone, each reporting faster as the rate rises, rather than from rate × --node-interval nodes (the stream keeps one report per node, so one replaced before the scaler reads it is never applied and the rate counts as not absorbed)")
	fs.DurationVar(&cfg.StepDuration, "step", 3e9, "how long each absorption rate, and each measurement at the apply path, runs")
	fs.IntVar(&cfg.MemoryNodes, "memory-nodes", 10000, "nodes decoded into a fresh state to weigh a GPU")
	fs.BoolVar(&scalerRSS, "scaler-rss", true, "measure the resident memory of a scaler process of its own, this binary, following --nodes nodes")
	fs.StringVar(&out, "out", "bench.json", `where to write the result as JSON; "" writes none`)
	fs.BoolVar(&check, "check", false, "exit with status 1 when a target is missed")
	fs.StringVar(&prof, "cpu-profile", "", "write a CPU profile of the whole run to this file (go tool pprof)")
	fs.BoolVar(&cfg.StreamMemory, "stream-memory", false, "keep the GPUSCALER stream in memory rather than on disk")
	fs.StringVar(&cfg.Auth, "nats-auth", "open", "how the bus admits the scaler and the queue producer: open, or callout (gpuscaler's auth callout and its per-role permissions, as the chart installs it)")
	newLogger := logFlags(fs, stderr, "info")
	if err := parseFlags(fs, args, env); err != nil {
		return err
	}
	if err := applyScale(fs, scale, env); err != nil {
		return err
	}
	if err := firstErr(
		positive("nodes", cfg.Nodes, "a number of nodes, 1 or more"),
		positive("gpus-per-node", cfg.GPUsPerNode, "a number of GPUs, 1 or more"),
		positive("activations", cfg.Activations, "a number of activations, 1 or more"),
		positive("triggers", cfg.Triggers, "a number of triggers, 1 or more"),
		positive("calls", cfg.Calls, "a number of calls, 1 or more"),
		positive("memory-nodes", cfg.MemoryNodes, "a number of nodes, 1 or more"),
		positive("node-interval", cfg.NodeInterval, "a positive duration"),
		positive("polling-interval", cfg.PollingInterval, "a positive duration"),
		positive("hpa-sync-period", cfg.HPASyncPeriod, "a positive duration"),
		positive("step", cfg.StepDuration, "a positive duration"),
	); err != nil {
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
	if held := cfg.Nodes * max(cfg.GPUsPerNode-1, 0); cfg.BigNamespaceGPUs < 0 || cfg.BigNamespaceGPUs > held {
		return usageError{fmt.Errorf("--big-namespace-gpus %d: want 0 to %d, the GPUs the pods of --nodes %d nodes hold (one GPU of each stays free)",
			cfg.BigNamespaceGPUs, held, cfg.Nodes)}
	}
	if scalerRSS {
		if cfg.ScalerBinary, err = os.Executable(); err != nil {
			return fmt.Errorf("--scaler-rss: finding this binary: %w", err)
		}
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

// scales are the sizes --scale names, as flag values; a flag given on the command line
// or in its environment variable keeps its value.
var scales = map[string]map[string]string{
	"default": {},
	// The sizes of issue 12's scale targets (bench.Targets).
	"large": {"nodes": "10000", "triggers": "10000", "big-namespace-gpus": "7000"},
}

// applyScale sets the flags of the named scale that were not given.
func applyScale(fs *flag.FlagSet, name string, env envFunc) error {
	sizes, ok := scales[name]
	if !ok {
		return usageError{fmt.Errorf("--scale %q: want default or large", name)}
	}
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	for _, f := range slices.Sorted(maps.Keys(sizes)) {
		if _, inEnv := env(envName(f)); given[f] || inEnv {
			continue
		}
		if err := fs.Set(f, sizes[f]); err != nil {
			return err // the table above is wrong
		}
	}
	return nil
}
