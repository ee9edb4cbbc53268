package inference_test

// The model on slices of the real traces, as replay's scenarios build them: an external
// test, so it may import replay, which imports this package.

import (
	"math"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/gpuscaler/gpuscaler/cmd/gpuscaler/internal/inference"
	"github.com/gpuscaler/gpuscaler/cmd/gpuscaler/internal/replay"
	"github.com/gpuscaler/gpuscaler/cmd/gpuscaler/internal/traces"
)

// tracesDir is shared/testdata/traces, beside the repository.
const tracesDir = "../../../../../shared/testdata/traces"

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
func gentd26Slice(t testing.TB) *replay.Scenario {
	reqs := readFile(t, "gentd26-lora-requests-2024-11-15_27.csv", func(f *os.File) ([]traces.GenTD26Request, error) { return traces.ReadGenTD26(f) })
	sc, err := replay.GenTD26(reqs[:300], loadLatencies(t), 1)
	if err != nil {
		t.Fatal(err)
	}
	return sc
}

func azureSlice(t testing.TB) *replay.Scenario {
	reqs := readFile(t, "azure-llm-2023-conv.csv", func(f *os.File) ([]traces.AzureLLMRequest, error) { return traces.ReadAzureLLM(f) })
	sc, err := replay.AzureLLM(reqs[:1000], replay.DefaultLLMServiceModel, 1, loadLatencies(t), 1)
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
	for _, sc := range []*replay.Scenario{gentd26Slice(t), azureSlice(t)} {
		var last time.Duration
		for _, s := range sc.Services {
			last = max(last, s.Requests[len(s.Requests)-1].At)
		}
		end := last + sc.Tail
		// Every policy, and every other setting swept: the settings only move knobs.
		policies := sc.Policies
		for i, p := range sc.Sweeps {
			if i%2 == 0 {
				policies = append(policies, p)
			}
		}
		for _, p := range policies {
			for _, svc := range sc.Services {
				run, err := inference.Play(t.Context(), sc.Config, p, svc, end, last)
				if err != nil {
					t.Fatalf("%s %s %s/%s: %v", sc.Trace, svc.Name, p.Name, p.Setting, err)
				}
				where := sc.Trace + " " + svc.Name + " " + p.Name + " " + p.Setting
				if run.Restarted != 0 {
					t.Errorf("%s: %d requests started twice", where, run.Restarted)
				}
				for i, r := range svc.Requests {
					switch start := run.Starts[i]; {
					case start < 0:
						t.Fatalf("%s: request %d (arrived %s) never served", where, i, r.At)
					case start < r.At:
						t.Fatalf("%s: request %d served at %s, before it arrived at %s", where, i, start, r.At)
					case math.Abs(run.Waits[i]-(start-r.At).Seconds()) > 1e-9:
						t.Fatalf("%s: request %d waited %g s, started %s after arriving", where, i, run.Waits[i], start-r.At)
					}
				}
				if d := math.Abs(run.GPUSeconds - run.Lifetimes); d > 1e-6*max(run.GPUSeconds, 1) {
					t.Errorf("%s: %g GPU-seconds summed over time, %g over the replicas' lives", where, run.GPUSeconds, run.Lifetimes)
				}
				if p.Kind == inference.KindAlwaysOn && (run.Cold != 0 || slicesMax(run.Waits) != 0) {
					t.Errorf("%s: always-on made requests wait (%d cold, longest %g s)", where, run.Cold, slicesMax(run.Waits))
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
	run := func(seed uint64) *inference.Result {
		cfg := sc.Config
		cfg.Seed, cfg.WarmUp = seed, time.Minute // the slice is three minutes long
		res, err := inference.Run(t.Context(), sc.Services, cfg, sc.Policies, sc.Sweeps, sc.Tail, nil)
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
