package replay

import (
	"context"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/gpuscaler/gpuscaler/cmd/gpuscaler/internal/traces"
)

// loadLatencies reads GenTD26's real model-load latencies.
func loadLatencies(t testing.TB) *traces.Durations {
	t.Helper()
	f, err := os.Open(filepath.Join(tracesDir, "gentd26-basemodel-load-latency-ms.csv"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	ds, err := traces.ReadLoadLatency(f)
	if err != nil {
		t.Fatal(err)
	}
	d, err := traces.NewDurations(ds)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func readFile[T any](t testing.TB, name string, read func(f *os.File) ([]T, error)) []T {
	t.Helper()
	f, err := os.Open(filepath.Join(tracesDir, name))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	v, err := read(f)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// slices of the real traces: the first 1,500 GenTD26 requests (about a day and a
// half, tens of checkpoints) and the first 2,000 Azure LLM requests (six minutes).
func gentd26Slice(t testing.TB) *Scenario {
	reqs := readFile(t, "gentd26-lora-requests-2024-11-15_27.csv", func(f *os.File) ([]traces.GenTD26Request, error) { return traces.ReadGenTD26(f) })
	sc, err := GenTD26(reqs[:300], loadLatencies(t), 1)
	if err != nil {
		t.Fatal(err)
	}
	return sc
}

func azureSlice(t testing.TB) *Scenario {
	reqs := readFile(t, "azure-llm-2023-conv.csv", func(f *os.File) ([]traces.AzureLLMRequest, error) { return traces.ReadAzureLLM(f) })
	sc, err := AzureLLM(reqs[:1000], DefaultLLMServiceModel, 1, loadLatencies(t), 1)
	if err != nil {
		t.Fatal(err)
	}
	return sc
}

// TestInferenceInvariants replays slices of both inference traces under every policy and
// setting and checks what must hold whatever the policy: every request is served exactly
// once, never before it arrives, and its wait is its start less its arrival; the
// GPU-hours summed over time equal the replicas' lifetimes summed apart; always-on never
// makes anyone wait.
func TestInferenceInvariants(t *testing.T) {
	for _, sc := range []*Scenario{gentd26Slice(t), azureSlice(t)} {
		var last time.Duration
		for _, s := range sc.Services {
			last = max(last, s.Requests[len(s.Requests)-1].At)
		}
		end, paidTo := last+sc.Tail, sc.Config.paidTo(last)
		// Every policy, and every other setting swept: the settings only move knobs.
		policies := sc.Policies
		for i, p := range sc.Sweeps {
			if i%2 == 0 {
				policies = append(policies, p)
			}
		}
		for _, p := range policies {
			for _, svc := range sc.Services {
				run, err := newSim(sc.Config, p, svc, end, paidTo, newTimeline(end)).play(t.Context())
				if err != nil {
					t.Fatalf("%s %s %s/%s: %v", sc.Trace, svc.Name, p.Name, p.Setting, err)
				}
				where := sc.Trace + " " + svc.Name + " " + p.Name + " " + p.Setting
				if run.restarted != 0 {
					t.Errorf("%s: %d requests started twice", where, run.restarted)
				}
				for i, r := range svc.Requests {
					switch start := run.starts[i]; {
					case start < 0:
						t.Fatalf("%s: request %d (arrived %s) never served", where, i, r.At)
					case start < r.At:
						t.Fatalf("%s: request %d served at %s, before it arrived at %s", where, i, start, r.At)
					case math.Abs(run.waits[i]-(start-r.At).Seconds()) > 1e-9:
						t.Fatalf("%s: request %d waited %g s, started %s after arriving", where, i, run.waits[i], start-r.At)
					}
				}
				if d := math.Abs(run.gpuSeconds - run.lifetimes); d > 1e-6*max(run.gpuSeconds, 1) {
					t.Errorf("%s: %g GPU-seconds summed over time, %g over the replicas' lives", where, run.gpuSeconds, run.lifetimes)
				}
				if p.Kind == KindAlwaysOn && (run.cold != 0 || slicesMax(run.waits) != 0) {
					t.Errorf("%s: always-on made requests wait (%d cold, longest %g s)", where, run.cold, slicesMax(run.waits))
				}
			}
		}
	}
}

func slicesMax(v []float64) float64 {
	m := 0.0
	for _, x := range v {
		m = max(m, x)
	}
	return m
}

// TestReplayIsDeterministic: the same seed gives the same result, timelines included;
// another seed draws other model loads.
func TestReplayIsDeterministic(t *testing.T) {
	sc := azureSlice(t)
	run := func(seed uint64) *InferenceResult {
		cfg := sc.Config
		cfg.Seed, cfg.WarmUp = seed, time.Minute // the slice is three minutes long
		res, err := RunInference(t.Context(), sc.Services, cfg, sc.Policies, sc.Sweeps, sc.Tail, nil)
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	a, b, c := run(1), run(1), run(2)
	if !reflect.DeepEqual(a, b) {
		t.Error("two replays with seed 1 differ")
	}
	if reflect.DeepEqual(a.Policies, c.Policies) {
		t.Error("seeds 1 and 2 gave the same result: the seed draws nothing")
	}
}

// TestPushWakesAtOnce: one request after a long idle. Pushed, the replica is asked for
// the moment the producer reports it and serves after its model load; polled, only at
// KEDA's next poll. Loads take 10s, polls come every 30s from 0.
func TestPushWakesAtOnce(t *testing.T) {
	cfg := Inference{Concurrency: 1, MaxReplicas: 4, PollingInterval: 30 * time.Second, Cooldown: 300 * time.Second,
		HPASync: 15 * time.Second, ScaleDownWindow: 300 * time.Second, ReportInterval: time.Second,
		Load: func(*rand.Rand) time.Duration { return 10 * time.Second }}
	svc := Service{Name: "s", Requests: []Request{{At: 100 * time.Second, Service: 5 * time.Second}}}
	for _, tc := range []struct {
		p    Policy
		wait float64
	}{
		{backlogPolicy(PolicyBacklog, 1, true), 10},   // pushed at 100s, ready at 110s
		{backlogPolicy(PolicyKEDAPoll, 1, false), 30}, // polled at 120s, ready at 130s
	} {
		run, err := newSim(cfg, tc.p, svc, time.Hour, math.MaxInt64, newTimeline(time.Hour)).play(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if run.waits[0] != tc.wait || run.cold != 1 {
			t.Errorf("%s: waited %g s (cold %d), want %g s after a cold start", tc.p.Name, run.waits[0], run.cold, tc.wait)
		}
		// The replica lives from the activation to cooldownPeriod after the queue
		// empties, rounded up to the poll that sees it: from 100s (or 120s) to the
		// first poll at least 300s after the last active poll.
		if run.gpuSeconds < 300 || run.gpuSeconds > 400 {
			t.Errorf("%s: %g GPU-seconds, want a cooldown's worth, 300 to 400", tc.p.Name, run.gpuSeconds)
		}
	}
}

// TestPeakReplicas: always-on holds the most requests in service at once if each
// started on arrival, concurrency to a replica, at most the maximum.
func TestPeakReplicas(t *testing.T) {
	reqs := []Request{{0, 10 * time.Second}, {time.Second, 10 * time.Second}, {2 * time.Second, time.Second}, {20 * time.Second, time.Second}}
	for _, tc := range []struct{ c, max, want int }{{1, 8, 3}, {2, 8, 2}, {1, 2, 2}, {8, 8, 1}} {
		if got := peakReplicas(reqs, tc.c, tc.max); got != tc.want {
			t.Errorf("peakReplicas(concurrency %d, max %d) = %d, want %d", tc.c, tc.max, got, tc.want)
		}
	}
}

// TestTargetWaitSweep: the sweep runs from 10 ms to 10 min, twelve settings a decade
// from 100 ms, each the last times 1.1 to 1.25 (E12's steps), written as the trigger
// key takes them.
func TestTargetWaitSweep(t *testing.T) {
	ws := TargetWaitSweep()
	if ws[0] != 10*time.Millisecond || ws[1] != 100*time.Millisecond || ws[len(ws)-1] != 10*time.Minute {
		t.Fatalf("sweep %v: want 10ms, 100ms … 10m0s", ws)
	}
	for i := 2; i < len(ws)-1; i++ {
		if r := float64(ws[i]) / float64(ws[i-1]); r < 1.09 || r > 1.25 {
			t.Errorf("%s after %s: a step of %.3f, want E12's 1.1 to 1.22", ws[i], ws[i-1], r)
		}
	}
	for _, want := range []time.Duration{1200 * time.Millisecond, 4700 * time.Millisecond, 82 * time.Second, 560 * time.Second} {
		if !slices.Contains(ws, want) {
			t.Errorf("sweep %v lacks %s", ws, want)
		}
	}
}

// TestCutEndPaysToTheLastArrival: requests at 60 s and 200 s, the first 30 s a warm-up.
// Cut at both ends, always-on (one replica) pays from 30 s to 200 s, and the pushed
// backlog's replica, asked for at 60 s, from 60 s to 200 s, though both run on to
// serve the last request and scale down. Not cut at the end, they pay for that too.
func TestCutEndPaysToTheLastArrival(t *testing.T) {
	cfg := Inference{Concurrency: 1, MaxReplicas: 4, PollingInterval: 30 * time.Second, Cooldown: 300 * time.Second,
		HPASync: 15 * time.Second, ScaleDownWindow: 300 * time.Second, ReportInterval: time.Second,
		Load: func(*rand.Rand) time.Duration { return 10 * time.Second }, WarmUp: 30 * time.Second, CutEnd: true}
	svc := Service{Name: "s", Requests: []Request{{At: time.Minute, Service: 5 * time.Second}, {At: 200 * time.Second, Service: 5 * time.Second}}}
	policies := []Policy{{Name: PolicyAlwaysOn, Kind: KindAlwaysOn}, backlogPolicy(PolicyBacklog, 1, true)}
	for _, tc := range []struct {
		cut        bool
		on, scaled float64 // GPU-seconds
	}{
		{true, 170, 140},
		// Always-on to the end of the 10-minute tail; the scaled replica until KEDA's
		// cooldown takes it to zero at 360 s, 300 s after it last saw work (the push at
		// 60 s: the second request came and went between polls).
		{false, 770, 300},
	} {
		cfg.CutEnd = tc.cut
		res, err := RunInference(t.Context(), []Service{svc}, cfg, policies, nil, 10*time.Minute, nil)
		if err != nil {
			t.Fatal(err)
		}
		on, scaled := res.Policies[0].GPUHours*3600, res.Policies[1].GPUHours*3600
		if math.Abs(on-tc.on) > 1e-6 {
			t.Errorf("CutEnd %t: always-on paid %g GPU-seconds, want %g", tc.cut, on, tc.on)
		}
		if math.Abs(scaled-tc.scaled) > 1e-6 {
			t.Errorf("CutEnd %t: the pushed backlog paid %g GPU-seconds, want %g", tc.cut, scaled, tc.scaled)
		}
	}
}
