package replay

import (
	"math"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpuscaler/gpuscaler/cmd/gpuscaler/internal/inference"
)

// TestDenseTracesHonourTargetWait replays both dense hours at the service model's own
// speed, seed 1, and wants queue-demand's targets that the design promises wherever it
// runs: every backlog point matched (frontier), and every targetWait from 5 s to 60 s
// met within 1.2× at the p99 (honoured). Before issue 26's metric, the Azure hour at ×2
// gave 18.1 s for 15 s, and `make replay`'s runs (hack/replay-matrix.py) hold the rest
// of the targets over seeds and speeds. A few seconds.
func TestDenseTracesHonourTargetWait(t *testing.T) {
	for _, tc := range []struct {
		format, file string
		speed        float64
	}{
		{FormatAzureLLM, "azure-llm-2023-conv.csv", 1},
		{FormatAzureLLM, "azure-llm-2023-conv.csv", 2},
		{FormatMooncake, "mooncake-conversation.jsonl", 1},
	} {
		t.Run(tc.format, func(t *testing.T) {
			tr, err := Load(tc.format, filepath.Join(tracesDir, tc.file), LoadOptions{Speed: tc.speed, Seed: 1})
			if err != nil {
				t.Fatal(err)
			}
			sc := tr.Scenario
			res, err := inference.Run(t.Context(), sc.Services, sc.Config, sc.Policies, sc.Sweeps, sc.Tail, nil)
			if err != nil {
				t.Fatal(err)
			}
			judged := 0
			for _, target := range DenseTargets(res) {
				name, _, _ := strings.Cut(target.Name, ":")
				if name != "frontier" && name != "honoured" {
					continue
				}
				judged++
				if !target.Met {
					t.Errorf("×%g: %s missed: %s", tc.speed, target.Name, target.Measured)
				}
			}
			if judged != 2 {
				t.Errorf("judged %d of the frontier and honoured targets, want 2", judged)
			}
		})
	}
}

// TestDenseTargets judges made-up frontiers: each target met and missed where the
// issue's bounds say.
func TestDenseTargets(t *testing.T) {
	res := &inference.Result{
		Policies: []inference.PolicyResult{{Name: inference.PolicyAlwaysOn, WaitP99: 0}},
		Frontiers: map[string][]inference.FrontierPoint{
			inference.PolicyBacklog: {
				{Setting: "queueTarget=8", GPUHours: 10, WaitP99: 1},
				{Setting: "queueTarget=16", GPUHours: 8, WaitP99: 20},
			},
			inference.PolicyRecommends: {
				{Setting: "targetWait=1s", GPUHours: 10.1, WaitP99: 1.4}, // +1%, +0.4 s: matches q8
				{Setting: "targetWait=5s", GPUHours: 9, WaitP99: 6.1},    // over 1.2 × 5 s
				{Setting: "targetWait=10s", GPUHours: 7.5, WaitP99: 9},   // cheapest within 10 s
				{Setting: "targetWait=15s", GPUHours: 8, WaitP99: 12},    // 6.7% above 10 s: neither efficient nor monotonic
				{Setting: "targetWait=20s", GPUHours: 6, WaitP99: 19},    // beats q16 by 25%
			},
		},
	}
	got := map[string]Target{}
	for _, target := range DenseTargets(res) {
		name, _, _ := strings.Cut(target.Name, ":")
		got[name] = target
	}
	for name, met := range map[string]bool{"frontier": true, "beaten": true, "honoured": false, "efficient": false, "monotonic": false} {
		if g, ok := got[name]; !ok || g.Met != met {
			t.Errorf("%s: got %+v, want met %t", name, g, met)
		}
	}
	for name, want := range map[string]string{
		"beaten":    "25% fewer (targetWait=20s against queueTarget=16)",
		"honoured":  "targetWait=5s (p99 6.1 s)",
		"efficient": "dearer: targetWait=15s (+6.7% GPU-hours)",
		"monotonic": "targetWait=15s over targetWait=10s (+6.7% GPU-hours)",
	} {
		if !strings.Contains(got[name].Measured, want) {
			t.Errorf("%s: measured %q, want it to say %q", name, got[name].Measured, want)
		}
	}
	// How far beyond each bound: 6.1/5 − 1.2; 8/7.5 − 1.05; 8/7.5 − 1.02, once although
	// 15 s costs more than 10 s only; none where met.
	for name, want := range map[string]float64{"frontier": 0, "beaten": 0, "honoured": 0.02, "efficient": 8/7.5 - 1.05, "monotonic": 8/7.5 - 1.02} {
		if g := got[name].Excess; math.Abs(g-want) > 1e-9 {
			t.Errorf("%s: excess %g, want %g", name, g, want)
		}
	}
}

// TestDenseTargetsExcessSumsSettings checks that each setting that misses adds its own
// distance from the bound, once: two backlog points matched only 4% and 7% dearer (where 2% is
// allowed), and a setting 4% and 5% dearer than two shorter ones, which adds its 5% once.
func TestDenseTargetsExcessSumsSettings(t *testing.T) {
	res := &inference.Result{
		Policies: []inference.PolicyResult{{Name: inference.PolicyAlwaysOn, WaitP99: 0}},
		Frontiers: map[string][]inference.FrontierPoint{
			inference.PolicyBacklog: {
				{Setting: "queueTarget=8", GPUHours: 10, WaitP99: 1},
				{Setting: "queueTarget=16", GPUHours: 8, WaitP99: 2},
			},
			inference.PolicyRecommends: {
				{Setting: "targetWait=100ms", GPUHours: 10.5, WaitP99: 1},
				{Setting: "targetWait=200ms", GPUHours: 10.4, WaitP99: 1},  // 4% above queueTarget 8
				{Setting: "targetWait=300ms", GPUHours: 10.92, WaitP99: 1}, // 4% above 100 ms, 5% above 200 ms
				{Setting: "targetWait=1s", GPUHours: 8.56, WaitP99: 2},     // 7% above queueTarget 16
			},
		},
	}
	got := map[string]float64{}
	for _, target := range DenseTargets(res) {
		name, _, _ := strings.Cut(target.Name, ":")
		got[name] = target.Excess
	}
	for name, want := range map[string]float64{"frontier": (10.4/10 - 1.02) + (8.56/8 - 1.02), "monotonic": 10.92/10.4 - 1.02} {
		if math.Abs(got[name]-want) > 1e-9 {
			t.Errorf("%s: excess %g, want %g", name, got[name], want)
		}
	}
}
