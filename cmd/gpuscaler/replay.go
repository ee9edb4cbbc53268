package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/gpuscaler/gpuscaler/cmd/gpuscaler/internal/inference"
	"github.com/gpuscaler/gpuscaler/cmd/gpuscaler/internal/replay"
	"github.com/gpuscaler/gpuscaler/scaler/demand"
)

const replayAbout = `
Replays a real production trace through gpuscaler's own decision code on a virtual clock,
and measures what each scaling policy costs (GPU-hours) and how long it makes requests
wait. Requests become queue reports as the producer API builds them, the scaler's own
state, metadata parser and metrics answer what KEDA asks, and KEDA's and the HPA's
published rules move the replicas of a modelled cluster, whose new replicas load their
model for a time drawn from real load latencies. Nothing waits on the wall clock: 13 days
of GenTD26 replay in well under a minute, and the same seed gives the same output.

Formats (--format), from shared/testdata/traces:
  gentd26    one Deployment per model checkpoint, scale to zero, KEDA's defaults
             (pollingInterval 30s, cooldownPeriod 300s, max 8 replicas), one request at
             a time per replica; the recommended policy's cooldownPeriod is swept
  azure-llm  one LLM service (Llama 3.1 8B, vLLM, one A100, 8 requests at once; see
             --service-speed); queueTarget 1..64 and targetWait (10ms, then 100ms to
             10m, twelve settings a decade) are swept
  mooncake   the same service model and sweeps on Mooncake's conversation hour (JSON
             lines: timestamp in ms, input_length, output_length)
  openb      GPU tasks as Jobs from a queue run by ScaledJobs on the trace's nodes:
             a plain ScaledJob against capacityAware
Policies: always-on (fixed at the peak the trace needs), seeds-hpa-gpu-util (the HPA on
GPU utilisation through dcgm-exporter, Prometheus and prometheus-adapter, 30-60s late),
keda-poll-backlog (KEDA's polled queue scalers), gpuscaler-backlog (queue-backlog,
pushed activation) and gpuscaler (the configuration docs/triggers.md recommends).

It prints a table, the frontiers of the swept knobs and the targets of issues 14 and 26, met or
missed; --json and --chart write the same for tools and people. The traces are CC BY 4.0
(Mooncake's Apache 2.0): keep the attribution line wherever you show results.`

func runReplay(ctx context.Context, args []string, env envFunc, stdout, stderr io.Writer) (err error) {
	var (
		format, trace, nodesPath, loadPath, jsonPath, chartPath string
		speed, loadScale, hpaTolerance                          float64
		seed                                                    uint64
		limit, openbNodes                                       int
		quiet, reverse                                          bool
		from, to                                                time.Duration
	)
	fs := newFlagSet("replay", "replay --format gentd26|azure-llm|mooncake|openb --trace FILE [flags]", replayAbout, stdout)
	fs.StringVar(&format, "format", "", "the trace's format: gentd26, azure-llm, mooncake or openb")
	fs.StringVar(&trace, "trace", "", "the trace file: GenTD26's request trace, Azure's or Mooncake's LLM trace, or openb's pod list")
	fs.StringVar(&nodesPath, "nodes", "", "openb's node list (openb_node_list_gpu_node.csv); default: openb-gpu-nodes.csv beside --trace")
	fs.StringVar(&loadPath, "load-latency", "", "model load latencies in ms, one per row (GenTD26's basemodel load latency); default: gentd26-basemodel-load-latency-ms.csv beside --trace")
	fs.Float64Var(&speed, "service-speed", 1, "azure-llm, mooncake: times the service model's speed (0.5 halves it, 2 doubles it)")
	fs.Float64Var(&loadScale, "load-scale", 1, "gentd26, azure-llm, mooncake: times every model load drawn (3: loads of about 70-160 s rather than 23-52 s), to see what a slower cold start does to the same traffic")
	fs.Float64Var(&hpaTolerance, "hpa-tolerance", demand.HPATolerance, "gentd26, azure-llm, mooncake: the HPA's tolerance, both ways, for a cluster or HPAs that set another; the recommended triggers repeat it (scaleUpTolerance)")
	fs.BoolVar(&reverse, "reverse", false, "gentd26, azure-llm, mooncake: play the requests backwards in time (rises become falls and falls rises; the same traffic in an order nothing was tuned on)")
	fs.Uint64Var(&seed, "seed", 1, "seed of the model loads and the clocks' phases; the same seed gives the same output")
	fs.IntVar(&limit, "limit", 0, "replay only the first N requests (or GPU tasks), for a quick look; 0: all")
	fs.DurationVar(&from, "from", 0, "replay only what arrived this long after the trace's first request or task, or later (168h: from the eighth day); with --to, to tune on some days and check on others")
	fs.DurationVar(&to, "to", 0, "replay only what arrived before this long after the trace's start; 0: to the end")
	fs.IntVar(&openbNodes, "openb-nodes", replay.DefaultOpenBNodes, "openb: replay on an evenly spaced sample of this many of the trace's nodes (the whole cluster never runs short of GPUs); 0 or more than there are: all")
	fs.StringVar(&jsonPath, "json", "", "write the result as JSON to this file")
	fs.StringVar(&chartPath, "chart", "", "write replicas, backlog and waits over time, every policy on the same axes, as an SVG chart to this file")
	fs.BoolVar(&quiet, "quiet", false, "print no progress on stderr")
	if err := parseFlags(fs, args, env); err != nil {
		return err
	}
	switch {
	case format != replay.FormatGenTD26 && format != replay.FormatAzureLLM && format != replay.FormatMooncake && format != replay.FormatOpenB:
		return usageError{fmt.Errorf("--format %q: want gentd26, azure-llm, mooncake or openb", format)}
	case trace == "":
		return usageError{fmt.Errorf("--trace: required, the %s trace file", format)}
	case !(speed > 0 && speed <= 100): // NaN too
		return usageError{fmt.Errorf("--service-speed %g: want a factor above 0, such as 0.5 or 2", speed)}
	case !(loadScale > 0 && loadScale <= 100):
		return usageError{fmt.Errorf("--load-scale %g: want a factor above 0, such as 3", loadScale)}
	case !(hpaTolerance >= 0 && hpaTolerance <= 1):
		return usageError{fmt.Errorf("--hpa-tolerance %g: want a share from 0 to 1, such as 0.05", hpaTolerance)}
	case hpaTolerance != demand.HPATolerance && format == replay.FormatOpenB:
		return usageError{fmt.Errorf("--hpa-tolerance: only for the request traces (gentd26, azure-llm, mooncake); openb's ScaledJobs have no HPA")}
	case limit < 0:
		return usageError{fmt.Errorf("--limit %d: want 0 (all) or more", limit)}
	case openbNodes < 0:
		return usageError{fmt.Errorf("--openb-nodes %d: want 0 (all) or more", openbNodes)}
	case from < 0 || to < 0:
		return usageError{fmt.Errorf("--from %s --to %s: want durations since the trace's start, 0 or more", from, to)}
	case to != 0 && to <= from:
		return usageError{fmt.Errorf("--to %s: want after --from %s", to, from)}
	case reverse && format == replay.FormatOpenB:
		return usageError{fmt.Errorf("--reverse: only for the request traces (gentd26, azure-llm, mooncake), not openb")}
	}
	// Open the outputs before the replay: a typo should not cost the run. A replay that
	// fails leaves no file it created.
	outs, err := openOutputs(map[string]string{"json": jsonPath, "chart": chartPath})
	if err != nil {
		return err
	}
	writing := false
	defer func() {
		if err != nil && !writing {
			err = errors.Join(err, outs.abandon())
		}
	}()
	progress := func(done, total int) {}
	if !quiet {
		progress = progressPrinter(stderr)
	}

	start := time.Now()
	var report replayReport
	opt := replay.LoadOptions{Nodes: nodesPath, LoadLatency: loadPath,
		From: from, To: to, Limit: limit, Speed: speed, Seed: seed, LoadScale: loadScale, Reverse: reverse}
	if hpaTolerance != demand.HPATolerance {
		opt.HPATolerance = &hpaTolerance
		report.HPATolerance = &hpaTolerance
	}
	tr, err := replay.Load(format, trace, opt)
	if err != nil {
		return err
	}
	report.Trace, report.Attribution, report.Seed = format, replay.Attribution[format], seed
	var writeChart func(io.Writer) error
	if format == replay.FormatOpenB {
		writeChart, err = replayOpenB(ctx, tr, replay.OpenBConfig{Seed: seed, Limit: limit, Nodes: openbNodes, Progress: progress}, &report, stdout)
	} else {
		if format == replay.FormatAzureLLM || format == replay.FormatMooncake {
			report.ServiceSpeed = speed
		}
		if loadScale != 1 {
			report.LoadScale = loadScale
		}
		report.Reversed = reverse
		writeChart, err = replayInference(ctx, tr.Scenario, progress, &report, stdout)
	}
	if err != nil {
		return err
	}
	report.Seconds = time.Since(start).Seconds()
	fmt.Fprintf(stdout, "\n%s\nreplayed in %.1f s (seed %d)\n", report.Attribution, report.Seconds, seed)
	writing = true
	if f := outs["json"]; f != nil {
		data, err := json.MarshalIndent(report, "", "  ")
		if err != nil {
			return err
		}
		if err := f.write(func(w io.Writer) error { _, err := w.Write(append(data, '\n')); return err }); err != nil {
			return fmt.Errorf("--json: %w", err)
		}
		fmt.Fprintf(stdout, "wrote %s\n", f.path)
	}
	if f := outs["chart"]; f != nil {
		if err := f.write(writeChart); err != nil {
			return fmt.Errorf("--chart: %w", err)
		}
		fmt.Fprintf(stdout, "wrote %s\n", f.path)
	}
	return nil
}

// replayOpenB replays openb's tasks as Jobs, fills report, prints the table and returns
// the chart's writer.
func replayOpenB(ctx context.Context, tr *replay.Trace, cfg replay.OpenBConfig, report *replayReport, stdout io.Writer) (func(io.Writer) error, error) {
	res, err := replay.OpenB(ctx, tr.Pods, tr.Nodes, cfg)
	if err != nil {
		return nil, err
	}
	report.Jobs, report.Nodes, report.GPUs, report.Policies = res.Jobs, res.Nodes, res.GPUs, res.Policies
	report.Targets = replay.OpenBTargets(res)
	if err := replay.WriteOpenBTable(stdout, res, report.Targets); err != nil {
		return nil, err
	}
	title := fmt.Sprintf("openb: %d GPU tasks as Jobs on %d nodes (%d GPUs)", res.Jobs, res.Nodes, res.GPUs)
	return func(w io.Writer) error { return replay.WriteOpenBChart(w, title, report.Attribution, res) }, nil
}

// replayInference replays an inference scenario under every policy, fills report,
// prints what was replayed and the table, and returns the chart's writer.
func replayInference(ctx context.Context, sc *replay.Scenario, progress inference.Progress, report *replayReport, stdout io.Writer) (func(io.Writer) error, error) {
	res, err := inference.Run(ctx, sc.Services, sc.Config, sc.Policies, sc.Sweeps, sc.Tail, progress)
	if err != nil {
		return nil, err
	}
	format := report.Trace
	report.Requests, report.Services, report.Policies, report.Frontiers = res.Requests, res.Services, res.Policies, res.Frontiers
	report.Recommends = sc.Recommends
	report.Targets = replay.InferenceTargets(format, res)
	backwards := ""
	if report.Reversed {
		backwards = " (played backwards)"
	}
	if report.HPATolerance != nil {
		backwards += fmt.Sprintf(" with HPAs that tolerate %.3g%% both ways, repeated by queue-demand triggers as scaleUpTolerance", 100**report.HPATolerance)
	}
	fmt.Fprintf(stdout, "%s: %d requests to %s, %s replayed%s; gpuscaler is %s\n", format, res.Requests, services(res.Services), res.Span.Round(time.Minute), backwards, sc.Recommends)
	switch {
	case res.WarmUp > 0 && res.CutEnd:
		fmt.Fprintf(stdout, "the trace is cut from a running service: its first %s are run but not measured, and GPU-hours end at its last arrival; %d requests measured\n", res.WarmUp, res.Measured)
	case res.WarmUp > 0:
		fmt.Fprintf(stdout, "the first %s are run but not measured (the trace is cut from a running service): %d requests measured\n", res.WarmUp, res.Measured)
	}
	fmt.Fprintln(stdout)
	if err := replay.WriteInferenceTable(stdout, res, report.Targets); err != nil {
		return nil, err
	}
	title := fmt.Sprintf("%s: %d requests to %s", format, res.Requests, services(res.Services))
	if report.ServiceSpeed != 0 {
		title += fmt.Sprintf(", service model ×%g", report.ServiceSpeed)
	}
	if report.LoadScale != 0 {
		title += fmt.Sprintf(", model loads ×%g", report.LoadScale)
	}
	if report.Reversed {
		title += ", played backwards"
	}
	if report.HPATolerance != nil {
		title += fmt.Sprintf(", HPA tolerance %.3g%%", 100**report.HPATolerance)
	}
	return func(w io.Writer) error { return replay.WriteInferenceChart(w, title, report.Attribution, res) }, nil
}

// replayReport is what --json writes: the object, with trace, requests (or
// jobs), policies and frontiers, and the targets judged.
type replayReport struct {
	Trace        string  `json:"trace"`
	Attribution  string  `json:"attribution"`
	Seed         uint64  `json:"seed"`
	ServiceSpeed float64 `json:"service_speed,omitempty"`
	// LoadScale is --load-scale when not 1.
	LoadScale float64 `json:"load_scale,omitempty"`
	// Reversed is --reverse.
	Reversed bool `json:"reversed,omitempty"`
	// HPATolerance is --hpa-tolerance when not the default.
	HPATolerance *float64 `json:"hpa_tolerance,omitempty"`
	// Recommends says what the policy "gpuscaler" is for this trace.
	Recommends string                               `json:"gpuscaler_is,omitempty"`
	Requests   int                                  `json:"requests,omitempty"`
	Services   int                                  `json:"services,omitempty"`
	Jobs       int                                  `json:"jobs,omitempty"`
	Nodes      int                                  `json:"nodes,omitempty"`
	GPUs       int                                  `json:"gpus,omitempty"`
	Policies   any                                  `json:"policies"`
	Frontiers  map[string][]inference.FrontierPoint `json:"frontiers"`
	Targets    []replay.Target                      `json:"targets"`
	Seconds    float64                              `json:"replay_seconds"`
}

func services(n int) string {
	if n == 1 {
		return "1 service"
	}
	return fmt.Sprintf("%d services", n)
}

// progressPrinter prints "replay: 40% (120/300 runs)" as the replay passes each tenth.
func progressPrinter(w io.Writer) func(done, total int) {
	last := -1
	return func(done, total int) {
		if total == 0 {
			return
		}
		if tenth := 10 * done / total; tenth != last {
			last = tenth
			fmt.Fprintf(w, "replay: %d%% (%d of %d)\n", 10*tenth, done, total)
		}
	}
}
