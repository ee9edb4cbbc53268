// Package inference models inference services scaled by a policy on a virtual clock:
// requests arrive, replicas load their model for a drawn time and then serve FIFO at
// the concurrency the workload allows, while the scaler's own state, metadata parsing,
// policies and metrics answer what KEDA asks, and KEDA's and the HPA's published rules
// (kedarules) act on the answers. Run plays services under each policy on the same
// requests and returns what each cost in GPU-hours and how long it made requests wait;
// the same seed gives the same result.
//
// replay feeds it real production traces, and demo its own run's requests, to compare
// gpuscaler with the baselines (always-on, the HPA on GPU utilisation, KEDA's polled
// queue scalers) on the same arrivals.
package inference

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"time"

	"golang.org/x/sync/errgroup"
)

// PolicyResult is what one policy cost and made requests wait, over every service of
// the replay.
type PolicyResult struct {
	Name    string `json:"name"`
	Setting string `json:"setting,omitempty"`
	// GPUHours is the GPU time the replicas held, loading or serving, from the start
	// of the replay to its end (or the last request served, if later); where the trace
	// is cut from a running service, from the end of the warm-up to the last request's
	// arrival (Config.WarmUp and CutEnd).
	GPUHours float64 `json:"gpu_hours"`
	// Waits are from a request's arrival to the start of its service, cold starts
	// included, in seconds.
	WaitP50  float64 `json:"wait_p50_s"`
	WaitP99  float64 `json:"wait_p99_s"`
	WaitMean float64 `json:"wait_mean_s"`
	// ColdStartFraction is the share of requests served by a replica that was still
	// loading its model when they arrived: requests that waited for a cold start.
	ColdStartFraction float64 `json:"cold_start_fraction"`
	// MaxReplicas is the most replicas any one service held at once.
	MaxReplicas int `json:"max_replicas"`

	Timeline Timeline `json:"-"`
}

// FrontierPoint is one setting of a policy's knob, swept.
type FrontierPoint struct {
	Setting           string  `json:"setting"`
	GPUHours          float64 `json:"gpu_hours"`
	WaitP99           float64 `json:"wait_p99_s"`
	WaitMean          float64 `json:"wait_mean_s"`
	ColdStartFraction float64 `json:"cold_start_fraction"`
}

// Result is one replay of inference services.
type Result struct {
	Requests int `json:"requests"`
	// Measured is the requests that arrived after the warm-up (Config.WarmUp), whose
	// waits the results count.
	Measured int           `json:"measured_requests"`
	WarmUp   time.Duration `json:"-"`
	CutEnd   bool          `json:"-"` // GPU-hours end at the last arrival (Config.CutEnd)
	// LastArrival is when the replay's last request arrived, from its first.
	LastArrival time.Duration `json:"-"`
	Services    int           `json:"services"`
	// Span is the replay's length: from the first request to the last, plus the
	// tail in which the policies scale down.
	Span      time.Duration              `json:"-"`
	Policies  []PolicyResult             `json:"policies"`
	Frontiers map[string][]FrontierPoint `json:"frontiers"`
}

// Progress reports how many of the replay's runs (one per service and policy setting)
// are done.
type Progress func(done, total int)

// Run replays services under each of policies, then under each setting of
// sweeps (policies of one name with the settings of their knob), and returns each
// policy's results and each swept policy's frontier. A setting in both runs once. tail
// is how long the replay goes on after the last request arrives, for the policies to
// scale down: the same for all, so GPU-hours compare.
func Run(ctx context.Context, services []Service, cfg Config, policies, sweeps []Policy, tail time.Duration, progress Progress) (*Result, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	var last time.Duration
	requests := 0
	for _, s := range services {
		if n := len(s.Requests); n > 0 {
			last = max(last, s.Requests[n-1].At)
			requests += n
		}
	}
	if requests == 0 {
		return nil, fmt.Errorf("replay: no requests to replay")
	}
	if last < cfg.WarmUp {
		return nil, fmt.Errorf("replay: no request arrives after the first %s, which are run but not measured; replay a longer part of the trace", cfg.WarmUp)
	}
	end, paidTo := last+tail, cfg.paidTo(last)

	type key struct{ name, setting string }
	var runs []Policy
	index := map[key]int{}
	for _, p := range slices.Concat(policies, sweeps) {
		k := key{p.Name, p.Setting}
		if _, ok := index[k]; !ok {
			index[k] = len(runs)
			runs = append(runs, p)
		}
	}

	// Each service under each policy is a replay of its own: run them on every core.
	results := make([][]serviceRun, len(runs))
	for i := range results {
		results[i] = make([]serviceRun, len(services))
	}
	total, done := len(runs)*len(services), 0
	progressCh := make(chan struct{}, total)
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(runtime.GOMAXPROCS(0))
	progressDone := make(chan struct{})
	go func() {
		defer close(progressDone)
		for range progressCh {
			done++
			if progress != nil {
				progress(done, total)
			}
		}
	}()
	for pi, p := range runs {
		for si, svc := range services {
			g.Go(func() error {
				run, err := newSim(cfg, p, svc, end, paidTo, newTimeline(end)).play(gctx)
				if err != nil {
					return fmt.Errorf("service %s: %w", svc.Name, err)
				}
				results[pi][si] = run
				progressCh <- struct{}{}
				return nil
			})
		}
	}
	err := g.Wait()
	close(progressCh)
	<-progressDone // the last progress is told before Run returns
	if err != nil {
		return nil, err
	}

	out := &Result{Requests: requests, Services: len(services), Span: end, WarmUp: cfg.WarmUp, CutEnd: cfg.CutEnd, LastArrival: last, Frontiers: map[string][]FrontierPoint{}}
	for _, run := range results[0] {
		out.Measured += run.measured
	}
	summary := make([]PolicyResult, len(runs))
	for i, p := range runs {
		summary[i] = summarize(p, results[i], end)
	}
	for _, p := range policies {
		out.Policies = append(out.Policies, summary[index[key{p.Name, p.Setting}]])
	}
	for _, p := range sweeps {
		r := summary[index[key{p.Name, p.Setting}]]
		out.Frontiers[p.Name] = append(out.Frontiers[p.Name], FrontierPoint{Setting: p.Setting, GPUHours: r.GPUHours,
			WaitP99: r.WaitP99, WaitMean: r.WaitMean, ColdStartFraction: r.ColdStartFraction})
	}
	return out, nil
}

func summarize(p Policy, runs []serviceRun, end time.Duration) PolicyResult {
	r := PolicyResult{Name: p.Name, Setting: p.Setting}
	var waits []float64
	cold := 0
	tl := newTimeline(end)
	for _, run := range runs {
		r.GPUHours += run.gpuSeconds / 3600
		waits = append(waits, run.waits[len(run.waits)-run.measured:]...)
		cold += run.cold
		r.MaxReplicas = max(r.MaxReplicas, run.maxReplica)
		tl.add(run.timeline)
	}
	slices.Sort(waits)
	r.WaitP50, r.WaitP99, r.WaitMean = Quantile(waits, 0.5), Quantile(waits, 0.99), Mean(waits)
	if len(waits) > 0 {
		r.ColdStartFraction = float64(cold) / float64(len(waits))
	}
	r.Timeline = tl.export()
	return r
}

func (c Config) validate() error {
	switch {
	case c.Concurrency < 1:
		return fmt.Errorf("replay: concurrency %d: want at least 1", c.Concurrency)
	case c.MaxReplicas < max(c.MinReplicas, 1):
		return fmt.Errorf("replay: maxReplicaCount %d below minReplicaCount %d (or 1)", c.MaxReplicas, c.MinReplicas)
	case c.PollingInterval <= 0 || c.HPASync <= 0 || c.ReportInterval <= 0:
		return fmt.Errorf("replay: pollingInterval, HPA sync and report interval must be above 0")
	case c.Load == nil:
		return fmt.Errorf("replay: no model-load distribution")
	}
	return nil
}
