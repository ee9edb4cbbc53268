package demo

import (
	"fmt"
	"math"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gpuscaler/gpuscaler/cmd/gpuscaler/internal/inference"
)

// baselinePolicies are the rows the summary compares, in order: always on at the peak
// need and at the burst's mean rate, the seeds' GPU-utilisation HPA, KEDA's polled
// backlog, gpuscaler's pushed backlog (the demo's former trigger) and its queue-demand
// (the demo's trigger now).
var baselinePolicies = []string{inference.PolicyAlwaysOn, inference.PolicyAlwaysOn, inference.PolicySeeds,
	inference.PolicyKEDAPoll, inference.PolicyBacklog, inference.PolicyRecommends}

// checkBaselines checks a completed run's comparison: every policy replayed, on exactly
// the requests the run served, printed in the summary's table beside the live figures.
func checkBaselines(t *testing.T, sum *Summary, text string) {
	t.Helper()
	var got []string
	for _, b := range sum.Baselines {
		got = append(got, b.Policy)
	}
	if !slices.Equal(got, baselinePolicies) {
		t.Fatalf("baselines %q, want %q", got, baselinePolicies)
	}
	if sum.ReplayedRequests != sum.RequestsServed || sum.ReplayedRequests == 0 {
		t.Errorf("replayed %d requests, want the %d the run served", sum.ReplayedRequests, sum.RequestsServed)
	}
	if want := fmt.Sprintf("the run's %d requests replayed", sum.ReplayedRequests); !strings.Contains(text, want) {
		t.Errorf("summary lacks %q", want)
	}
	table := map[string]bool{}
	for _, line := range strings.Split(text, "\n") {
		table[strings.Join(strings.Fields(line), " ")] = true
	}
	rowOf := func(policy, setting string) string {
		for line := range table {
			if strings.HasPrefix(line, policy+" "+setting+" ") {
				return line
			}
		}
		return ""
	}
	if rowOf("live run", "gpuscaler's keys") == "" {
		t.Error("summary's table lacks the live run's row")
	}
	for _, b := range sum.Baselines {
		if rowOf(b.Policy, b.Setting) == "" {
			t.Errorf("summary's table lacks %s (%s)", b.Policy, b.Setting)
		}
	}
	if s := sum.Baselines[5].Setting; !strings.Contains(s, "targetWait="+inference.RecommendedTargetWait.String()) {
		t.Errorf("gpuscaler's setting %q: want the recommended targetWait %s", s, inference.RecommendedTargetWait)
	}
	if s := sum.Baselines[4].Setting; !strings.Contains(s, fmt.Sprintf("queueTarget=%d", backlogQueueTarget)) {
		t.Errorf("gpuscaler-backlog's setting %q: want the demo's former queueTarget %d", s, backlogQueueTarget)
	}
	// Always on at the peak need: warm for the whole run, so nothing waits, and its
	// GPU-seconds span exactly the run's time, as the live figure does. When the run's
	// arrivals bunched (a loaded machine ticks late) the need can pass the inference
	// pool's GPUs: always-on then holds them all, says so, and requests may wait.
	peak := sum.Baselines[0]
	switch {
	case peak.PeakNeed < 1:
		t.Errorf("always-on: peak need %d, want at least 1", peak.PeakNeed)
	case peak.PeakNeed <= peak.PeakReplicas:
		if peak.WaitP99 != 0 || peak.ColdStartFraction != 0 || peak.PeakNeed != peak.PeakReplicas {
			t.Errorf("always-on at the peak need of %d: %d replicas, wait p99 %v, cold starts %v; want as many replicas and no wait", peak.PeakNeed, peak.PeakReplicas, peak.WaitP99, peak.ColdStartFraction)
		}
	default:
		if peak.ColdStartFraction != 0 || !strings.Contains(peak.Setting, fmt.Sprintf("all GPUs; need %d", peak.PeakNeed)) {
			t.Errorf("always-on short of the peak need (%d for %d): setting %q, cold starts %v; want the setting to say so and no cold start", peak.PeakReplicas, peak.PeakNeed, peak.Setting, peak.ColdStartFraction)
		}
	}
	if want := float64(peak.PeakReplicas) * sum.Seconds; peak.PeakReplicas < 1 || math.Abs(peak.GPUSeconds-want) > 1e-6*want {
		t.Errorf("always-on: %d replicas, %v GPU-seconds; want at least 1 replica held for the run's %v s", peak.PeakReplicas, peak.GPUSeconds, sum.Seconds)
	}
	if b := sum.Baselines[1]; b.PeakReplicas > burstReplicas() {
		t.Errorf("always-on at the burst's rate holds %d replicas, want at most %d", b.PeakReplicas, burstReplicas())
	}
}

// TestReplayBaselines replays a minute of the demo's load profile, drawn as the demo
// draws it (Poisson arrivals, service times of 0.8 to 1.2 s), with no live run.
func TestReplayBaselines(t *testing.T) {
	cfg := Config{Seed: 1}.withDefaults()
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	rng := rand.New(rand.NewPCG(1, 2))
	var reqs []request
	for step := time.Duration(0); step < cfg.Duration; step += cfg.Timing.Step {
		at := start.Add(step)
		for range poisson(rng, phaseAt(float64(step)/float64(cfg.Duration)).rate*cfg.Timing.Step.Seconds()) {
			reqs = append(reqs, request{arrived: at, started: at, service: time.Duration(float64(serviceTime) * (0.8 + 0.4*rng.Float64()))})
		}
	}
	got, n, err := replayBaselines(t.Context(), cfg, 16, reqs, start, cfg.Duration)
	if err != nil {
		t.Fatal(err)
	}
	if n != len(reqs) || n < 300 {
		t.Fatalf("replayed %d requests, want the %d drawn (300 or more at 20/s and 8/s)", n, len(reqs))
	}
	sum := &Summary{Seconds: cfg.Duration.Seconds(), StartupSeconds: cfg.Timing.Startup.Seconds(), Baselines: got, ReplayedRequests: n, RequestsServed: n}
	var out strings.Builder
	printBaselines(&out, sum)
	t.Logf("\n%s", out.String())
	checkBaselines(t, sum, out.String())

	again, _, err := replayBaselines(t.Context(), cfg, 16, reqs, start, cfg.Duration)
	if err != nil || !reflect.DeepEqual(again, got) {
		t.Errorf("a second replay of the same requests: %+v, %v; want %+v", again, err, got)
	}
	// With fewer GPUs than the peak needs, always-on holds them all, says so, and
	// requests wait.
	short, _, err := replayBaselines(t.Context(), cfg, 3, reqs, start, cfg.Duration)
	if err != nil {
		t.Fatal(err)
	}
	if a := short[0]; a.PeakReplicas != 3 || a.PeakNeed <= 3 || a.WaitP99 == 0 {
		t.Errorf("always-on on 3 GPUs: %d replicas for a need of %d, wait p99 %v; want 3, more than 3 and waits", a.PeakReplicas, a.PeakNeed, a.WaitP99)
	}
	shortSum := *sum
	shortSum.Baselines = short
	out.Reset()
	printBaselines(&out, &shortSum)
	checkBaselines(t, &shortSum, out.String())
	// The demo's clocks reach the replay: the seeds' path holds its one warm replica, a
	// GPU, for the whole minute at least.
	if seeds := got[2]; seeds.GPUSeconds < cfg.Duration.Seconds() {
		t.Errorf("seeds-hpa-gpu-util: %v GPU-seconds, want at least one replica's %v", seeds.GPUSeconds, cfg.Duration.Seconds())
	}
	if none, n, err := replayBaselines(t.Context(), cfg, 16, nil, start, cfg.Duration); none != nil || n != 0 || err != nil {
		t.Errorf("replay of no request: %v, %d, %v; want nothing and no error", none, n, err)
	}
}

// TestQuantileNearestRank: the live waits are counted as replay counts the baselines'.
func TestQuantileNearestRank(t *testing.T) {
	ds := []time.Duration{4 * time.Second, time.Second, 3 * time.Second, 2 * time.Second}
	for _, tc := range []struct {
		q    float64
		want float64
	}{{0.5, 2}, {0.99, 4}, {0.25, 1}, {0, 1}, {1, 4}} {
		if got := quantile(ds, tc.q); got != tc.want {
			t.Errorf("quantile(1..4 s, %v) = %v, want %v", tc.q, got, tc.want)
		}
	}
	if got := quantile(nil, 0.5); got != 0 {
		t.Errorf("quantile(none) = %v, want 0", got)
	}
}
