package replay

import (
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestLoad reads a slice of each real trace as `gpuscaler replay` does: the window
// counts from the trace's first request (or task), --limit takes the first of what it
// keeps, and the second file defaults to the one beside the trace.
func TestLoad(t *testing.T) {
	gentd26 := filepath.Join(tracesDir, "gentd26-lora-requests-2024-11-15_27.csv")
	azure := filepath.Join(tracesDir, "azure-llm-2023-conv.csv")
	openb := filepath.Join(tracesDir, "openb-pods-default.csv")
	requests := func(tr *Trace) int {
		n := 0
		for _, s := range tr.Scenario.Services {
			n += len(s.Requests)
		}
		return n
	}
	t.Run("gentd26 limit", func(t *testing.T) {
		tr, err := Load(FormatGenTD26, gentd26, LoadOptions{Limit: 150, Seed: 1})
		if err != nil {
			t.Fatal(err)
		}
		if got := requests(tr); got != 150 || tr.Scenario.Trace != "gentd26" {
			t.Errorf("%s trace with %d requests, want gentd26 with the 150 of --limit", tr.Scenario.Trace, got)
		}
	})
	t.Run("azure-llm window", func(t *testing.T) {
		tr, err := Load(FormatAzureLLM, azure, LoadOptions{From: time.Minute, To: 2 * time.Minute, Speed: 1, Seed: 1})
		if err != nil {
			t.Fatal(err)
		}
		reqs := tr.Scenario.Services[0].Requests
		// The scenario's times count from the first request kept.
		if last := reqs[len(reqs)-1].At; len(reqs) == 0 || reqs[0].At != 0 || last >= time.Minute {
			t.Errorf("%d requests from %s to %s, want a minute's from 0", len(reqs), reqs[0].At, last)
		}
	})
	t.Run("openb", func(t *testing.T) {
		tr, err := Load(FormatOpenB, openb, LoadOptions{From: 24 * time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		if tr.Scenario != nil || len(tr.Pods) == 0 || len(tr.Nodes) == 0 || tr.Pods[0].Created < 24*time.Hour {
			t.Errorf("openb: %d pods (first created %s), %d nodes; want tasks from the second day and the nodes beside the trace",
				len(tr.Pods), tr.Pods[0].Created, len(tr.Nodes))
		}
	})
	for name, tc := range map[string]struct {
		format, path string
		opt          LoadOptions
		want         string
	}{
		"unknown format":  {"csv", azure, LoadOptions{}, `--format "csv"`},
		"empty window":    {FormatAzureLLM, azure, LoadOptions{From: 1000 * time.Hour, Speed: 1}, "no request arrived within --from 1000h0m0s"},
		"no task":         {FormatOpenB, openb, LoadOptions{From: 10000 * time.Hour}, "no task created within"},
		"no nodes file":   {FormatOpenB, openb, LoadOptions{Nodes: "/none.csv"}, "--nodes: open /none.csv"},
		"no load beside":  {FormatGenTD26, filepath.Join(t.TempDir(), "x.csv"), LoadOptions{}, "x.csv"},
		"no load file":    {FormatGenTD26, gentd26, LoadOptions{LoadLatency: "/none.csv"}, "--load-latency: open /none.csv"},
		"wrong columns":   {FormatGenTD26, azure, LoadOptions{}, "lacks column"},
		"bad speed":       {FormatAzureLLM, azure, LoadOptions{Limit: 10}, "--service-speed 0"},
		"trace file gone": {FormatOpenB, "/none/pods.csv", LoadOptions{}, "/none/pods.csv"},
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := Load(tc.format, tc.path, tc.opt); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Load: %v, want an error with %q", err, tc.want)
			}
		})
	}
}
