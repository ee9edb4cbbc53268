package demo

import (
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/gpuscaler/gpuscaler/cmd/gpuscaler/internal/inference"
)

// timeline prints one row per interval: the load, what the scaler says, what KEDA did
// and why. Only the world goroutine writes it.
type timeline struct {
	out         io.Writer
	start       time.Time
	rows        []row
	notes       []string        // since the last row
	seen        map[string]bool // notes printed once
	activations []activation
}

type activation struct {
	at      time.Time
	latency time.Duration
	via     string
	push    time.Duration // the push's latency, 0 until it comes
}

type row struct {
	at                       time.Duration
	phase                    string
	rate                     float64
	backlog                  int     // waiting + in flight, as the producer counts them
	demand                   float64 // replicas the trigger's queue metric asks for; -1 when it answered none
	util                     float64 // the scaler's, over every GPU the service holds; -1 when it holds none
	utilServing              float64 // over the serving replicas' GPUs; -1 when none serves
	active, activeErr        bool
	replicas, ready          int
	jobsRunning, jobsPending int
	jobQueue                 int
	freeInf, freeTrain       int
	why                      string
}

// Row is one timeline row, as the summary's JSON and the chart carry it.
type Row struct {
	Seconds float64 `json:"t"`
	Phase   string  `json:"phase"`
	Rate    float64 `json:"requests_per_s"`
	// Backlog is the request queue's waiting and in-flight requests, as its producer
	// counts them.
	Backlog int `json:"backlog"`
	// Demand is the replicas the trigger's queue metric (queue-demand) asks for: its
	// value over its target. Absent when the scaler answered none.
	Demand *float64 `json:"queue_demand,omitempty"`
	// Util is the scaler's gpu-util over every GPU the service holds, replicas still
	// loading their model included: what the HPA weighs. UtilServing averages only the
	// replicas that serve. Each is absent when there is nothing to average.
	Util        *float64 `json:"gpu_util,omitempty"`
	UtilServing *float64 `json:"gpu_util_serving,omitempty"`
	Active      bool     `json:"active"`
	Replicas    int      `json:"replicas"`
	Ready       int      `json:"ready"`
	JobsRunning int      `json:"jobs_running"`
	JobsPending int      `json:"jobs_pending"`
	JobQueue    int      `json:"job_queue"`
	Why         string   `json:"why,omitempty"`
}

func (r row) export() Row {
	out := Row{Seconds: r.at.Seconds(), Phase: r.phase, Rate: r.rate, Backlog: r.backlog, Active: r.active,
		Replicas: r.replicas, Ready: r.ready, JobsRunning: r.jobsRunning, JobsPending: r.jobsPending, JobQueue: r.jobQueue, Why: r.why}
	if r.demand >= 0 {
		out.Demand = ptr(r.demand)
	}
	if r.util >= 0 {
		out.Util = ptr(r.util)
	}
	if r.utilServing >= 0 {
		out.UtilServing = ptr(r.utilServing)
	}
	return out
}

// note records why something happened, for the next row.
func (t *timeline) note(format string, args ...any) {
	t.notes = append(t.notes, fmt.Sprintf(format, args...))
}

// noteOnce records a note only the first time it is seen (a trigger error repeats at
// every poll).
func (t *timeline) noteOnce(s string) {
	if t.seen == nil {
		t.seen = map[string]bool{}
	}
	if !t.seen[s] {
		t.seen[s] = true
		t.notes = append(t.notes, s)
	}
}

const rowFormat = "%6s  %-9s %5s %8s %8s %7s  %-6s %9s  %6s %5s  %9s  %s\n"

func (t *timeline) printHeader() {
	fmt.Fprintf(t.out, rowFormat, "time", "load", "req/s", "backlog", "demand", "util %", "active", "replicas", "jobs", "queue", "free GPUs", "why")
	fmt.Fprintf(t.out, rowFormat, "", "", "", "", "replicas", "srv/all", "", "ready/all", "run", "jobs", "inf/train", "")
}

func (t *timeline) add(r row) {
	r.why = strings.Join(t.notes, "; ")
	t.notes = t.notes[:0]
	t.rows = append(t.rows, r)
	// Serving replicas, then every GPU held: they part while new replicas load.
	util := "-"
	if r.util >= 0 || r.utilServing >= 0 {
		util = fmtPercent(r.utilServing) + "/" + fmtPercent(r.util)
	}
	active := "no"
	switch {
	case r.activeErr:
		active = "error"
	case r.active:
		active = "yes"
	}
	jobs := fmt.Sprint(r.jobsRunning)
	if r.jobsPending > 0 {
		jobs += fmt.Sprintf("+%dp", r.jobsPending)
	}
	demand := "-"
	if r.demand >= 0 {
		demand = fmt.Sprintf("%.1f", r.demand)
	}
	fmt.Fprintf(t.out, rowFormat, fmtClock(r.at), r.phase, fmt.Sprintf("%.0f", r.rate), fmt.Sprint(r.backlog), demand, util, active,
		fmt.Sprintf("%d/%d", r.ready, r.replicas), jobs, fmt.Sprint(r.jobQueue), fmt.Sprintf("%d/%d", r.freeInf, r.freeTrain), r.why)
}

func printSummary(out io.Writer, s *Summary) {
	fmt.Fprintln(out)
	state := "summary"
	if !s.Completed {
		state = "summary (stopped early)"
	}
	fmt.Fprintf(out, "%s after %s\n", state, s.Duration.Round(100*time.Millisecond))
	if len(s.Activations) == 0 {
		fmt.Fprintln(out, "  activation      none: the service was never woken from zero")
	}
	for i, a := range s.Activations {
		fmt.Fprintf(out, "  activation %d    first request queued at zero replicas → active (%s): %s", i+1, a.Via, fmtLatency(msDuration(a.Milliseconds)))
		if a.Via != "push" && a.PushMilliseconds > 0 {
			fmt.Fprintf(out, "; the push came %s after the request", fmtLatency(msDuration(a.PushMilliseconds)))
		}
		fmt.Fprintln(out)
	}
	fmt.Fprintf(out, "  inference       %d requests served; queue wait p50 %.2fs, p99 %.2fs; peak %d replicas\n",
		s.RequestsServed, s.RequestWaitP50, s.RequestWaitP99, s.PeakReplicas)
	fmt.Fprintf(out, "  GPU-seconds     %.0f used; %.0f%% of requests waited for a model load\n", s.GPUSeconds, 100*s.ColdStartFraction)
	fmt.Fprintf(out, "  at zero         %.0fs of %.0fs (%.0f%%): no GPU held while there was nothing to do\n",
		s.SecondsAtZero, s.Seconds, 100*s.SecondsAtZero/max(s.Seconds, 1e-9))
	fmt.Fprintf(out, "  training        %d jobs queued, %d Jobs created, %d finished; at most %d running on %d GPUs (%d per Job), %d pending at most\n",
		s.TrainingSubmitted, s.TrainingCreated, s.TrainingFinished, s.TrainingPeakRun, s.TrainingPoolGPUs, gpusPerJob, s.TrainingPeakPend)
	if s.TrainingNoWork > 0 {
		fmt.Fprintf(out, "                  %d Job(s) found the queue empty and exited: KEDA counted work that had just finished (reports are up to one interval old)\n", s.TrainingNoWork)
	}
	printBaselines(out, s)
}

// printBaselines prints the live run's figures above the same requests replayed under
// each baseline, one row each.
func printBaselines(out io.Writer, s *Summary) {
	if len(s.Baselines) == 0 {
		fmt.Fprintln(out, "  compared        nothing: no request was served, so there is nothing to replay")
		return
	}
	fmt.Fprintf(out, "  compared        the run's %d requests replayed as gpuscaler replay does, on a model of this cluster, the same requests under each policy:\n", s.ReplayedRequests)
	const format = "                  %-19s %-35s %4s %6s %8s %7s %5s\n"
	fmt.Fprintf(out, format, "policy", "setting", "peak", "GPU-s", "wait p50", "p99", "cold")
	row := func(policy, setting string, peak int, gpuSecs, p50, p99, cold float64) {
		fmt.Fprintf(out, format, policy, setting, fmt.Sprint(peak), fmt.Sprintf("%.0f", gpuSecs),
			fmt.Sprintf("%.2fs", p50), fmt.Sprintf("%.2fs", p99), fmt.Sprintf("%.0f%%", 100*cold))
	}
	row("live run", "gpuscaler's keys + gpu-util "+strconv.Itoa(gpuUtilTarget)+"%", s.PeakReplicas, s.GPUSeconds, s.RequestWaitP50, s.RequestWaitP99, s.ColdStartFraction)
	for _, b := range s.Baselines {
		row(b.Policy, b.Setting, b.PeakReplicas, b.GPUSeconds, b.WaitP50, b.WaitP99, b.ColdStartFraction)
	}
	fmt.Fprintf(out, "                  the replay is a model of this cluster (queue metric alone, no gpu-util; loads of exactly %s; the seeds' Prometheus lag as in production), so its gpuscaler row and the live run differ\n",
		time.Duration(s.StartupSeconds*float64(time.Second)))
}

// quantile returns the q-quantile of ds in seconds by the nearest-rank method the
// replayed baselines use (inference.Quantile), so the live run and they count waits
// alike; 0 when there are none.
func quantile(ds []time.Duration, q float64) float64 {
	if len(ds) == 0 {
		return 0
	}
	s := make([]float64, len(ds))
	for i, d := range ds {
		s[i] = d.Seconds()
	}
	slices.Sort(s)
	return inference.Quantile(s, q)
}

// fmtPercent prints a percentage without its sign, "-" when there is none (negative).
func fmtPercent(v float64) string {
	if v < 0 {
		return "-"
	}
	return fmt.Sprintf("%.0f", v)
}

func msDuration(ms float64) time.Duration { return time.Duration(ms * float64(time.Millisecond)) }

func fmtClock(d time.Duration) string {
	s := int(d.Round(time.Second).Seconds())
	return fmt.Sprintf("%d:%02d", s/60, s%60)
}

func fmtLatency(d time.Duration) string {
	if d < time.Second {
		return fmt.Sprintf("%.1f ms", float64(d.Microseconds())/1000)
	}
	return d.Round(10 * time.Millisecond).String()
}
