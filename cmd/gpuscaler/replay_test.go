package main

import (
	"bytes"
	"encoding/json"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpuscaler/gpuscaler/cmd/gpuscaler/internal/replay"
)

const tracesDir = "../../../shared/testdata/traces"

// TestReplayCommand runs gpuscaler replay on a slice of each real trace and checks the
// table, the JSON the issue names (trace, requests or jobs, policies with their fields,
// frontiers) and that the chart is an SVG.
func TestReplayCommand(t *testing.T) {
	for _, tc := range []struct {
		format, trace, limit string
		policies             []string
		fields               []string
	}{
		{"gentd26", "gentd26-lora-requests-2024-11-15_27.csv", "150",
			[]string{"always-on", "seeds-hpa-gpu-util", "keda-poll-backlog", "gpuscaler-backlog", "gpuscaler"},
			[]string{"name", "gpu_hours", "wait_p50_s", "wait_p99_s", "wait_mean_s", "cold_start_fraction"}},
		{"azure-llm", "azure-llm-2023-conv.csv", "2000", // six minutes: the first five are warm-up
			[]string{"always-on", "seeds-hpa-gpu-util", "keda-poll-backlog", "gpuscaler-backlog", "gpuscaler"},
			[]string{"name", "gpu_hours", "wait_p50_s", "wait_p99_s", "wait_mean_s", "cold_start_fraction"}},
		{"mooncake", "mooncake-conversation.jsonl", "1500", // seven minutes: the first five are warm-up
			[]string{"always-on", "seeds-hpa-gpu-util", "keda-poll-backlog", "gpuscaler-backlog", "gpuscaler"},
			[]string{"name", "gpu_hours", "wait_p50_s", "wait_p99_s", "wait_mean_s", "cold_start_fraction"}},
		{"openb", "openb-pods-default.csv", "150",
			[]string{"gpuscaler-backlog", "gpuscaler"},
			[]string{"name", "job_wait_p50_s", "job_wait_p99_s", "pending_jobs_max", "pending_gpu_hours"}},
	} {
		t.Run(tc.format, func(t *testing.T) {
			dir := t.TempDir()
			jsonPath, chartPath := filepath.Join(dir, "r.json"), filepath.Join(dir, "r.svg")
			var stdout, stderr bytes.Buffer
			code := run(t.Context(), []string{"replay", "--format", tc.format, "--trace", filepath.Join(tracesDir, tc.trace),
				"--limit", tc.limit, "--json", jsonPath, "--chart", chartPath}, mapEnv(nil), &stdout, &stderr)
			if code != 0 {
				t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout.String(), stderr.String())
			}
			for _, want := range append([]string{"targets:", replay.Attribution[tc.format], "wrote " + jsonPath, "wrote " + chartPath}, tc.policies...) {
				if !strings.Contains(stdout.String(), want) {
					t.Errorf("stdout lacks %q:\n%s", want, stdout.String())
				}
			}
			if !strings.Contains(stderr.String(), "replay: 100%") {
				t.Errorf("stderr shows no progress:\n%s", stderr.String())
			}
			got := readJSONObject(t, jsonPath)
			count := "requests"
			if tc.format == "openb" {
				count = "jobs"
			}
			for _, k := range []string{"trace", count, "policies", "frontiers", "targets"} {
				if _, ok := got[k]; !ok {
					t.Errorf("JSON lacks %q: %v", k, got)
				}
			}
			policies, _ := got["policies"].([]any)
			var names []string
			for _, p := range policies {
				m := p.(map[string]any)
				names = append(names, m["name"].(string))
				for _, f := range tc.fields {
					if _, ok := m[f]; !ok {
						t.Errorf("policy %v lacks %q", m["name"], f)
					}
				}
			}
			if strings.Join(names, ",") != strings.Join(tc.policies, ",") {
				t.Errorf("policies %q, want %q", names, tc.policies)
			}
			svg, err := os.ReadFile(chartPath)
			if err != nil {
				t.Fatal(err)
			}
			dec := xml.NewDecoder(bytes.NewReader(svg))
			for {
				if _, err := dec.Token(); errors.Is(err, io.EOF) {
					break
				} else if err != nil {
					t.Fatalf("chart is not well-formed XML: %v", err)
				}
			}
		})
	}
}

// TestReplayFlagErrors: what cannot be replayed is refused before anything runs, naming
// the flag and what is wanted.
func TestReplayFlagErrors(t *testing.T) {
	trace := filepath.Join(tracesDir, "azure-llm-2023-conv.csv")
	for name, tc := range map[string]struct {
		args []string
		code int
		want string
	}{
		"no format":      {[]string{"--trace", trace}, 2, `--format "": want gentd26, azure-llm, mooncake or openb`},
		"unknown format": {[]string{"--format", "csv", "--trace", trace}, 2, `--format "csv"`},
		"no trace":       {[]string{"--format", "gentd26"}, 2, "--trace: required"},
		"zero speed":     {[]string{"--format", "azure-llm", "--trace", trace, "--service-speed", "0"}, 2, "--service-speed 0: want a factor above 0"},
		"negative limit": {[]string{"--format", "azure-llm", "--trace", trace, "--limit", "-1"}, 2, "--limit -1"},
		"missing file":   {[]string{"--format", "azure-llm", "--trace", "/nonexistent.csv"}, 1, "/nonexistent.csv"},
		"wrong format":   {[]string{"--format", "gentd26", "--trace", trace}, 1, "lacks column"},
		"no load file":   {[]string{"--format", "azure-llm", "--trace", trace, "--load-latency", "/none.csv"}, 1, "--load-latency: open /none.csv"},
		"all warm-up":    {[]string{"--format", "azure-llm", "--trace", trace, "--limit", "100"}, 1, "no request arrives after the first 5m0s"},
		"json dir gone":  {[]string{"--format", "azure-llm", "--trace", trace, "--json", "/nonexistent/r.json"}, 1, `--json "/nonexistent/r.json": no such file or directory`},
		"openb reversed": {[]string{"--format", "openb", "--trace", trace, "--reverse"}, 2, "--reverse: only for the request traces"},
		"tolerance 2":    {[]string{"--format", "azure-llm", "--trace", trace, "--hpa-tolerance", "2"}, 2, "--hpa-tolerance 2: want a share from 0 to 1"},
		"tolerance NaN":  {[]string{"--format", "azure-llm", "--trace", trace, "--hpa-tolerance", "NaN"}, 2, "--hpa-tolerance NaN"},
		"openb tolerance": {[]string{"--format", "openb", "--trace", trace, "--hpa-tolerance", "0.2"}, 2,
			"--hpa-tolerance: only for the request traces"},
	} {
		t.Run(name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := run(t.Context(), append([]string{"replay", "--quiet"}, tc.args...), mapEnv(nil), &stdout, &stderr)
			if code != tc.code || !strings.Contains(stderr.String(), tc.want) {
				t.Errorf("exit %d, stderr %q; want exit %d and %q", code, stderr.String(), tc.code, tc.want)
			}
		})
	}
}

// TestReplayFailedRunLeavesNoOutputs: the outputs are opened before the replay, and a
// replay that then fails removes the files it created.
func TestReplayFailedRunLeavesNoOutputs(t *testing.T) {
	dir := t.TempDir()
	jsonPath, chartPath := filepath.Join(dir, "r.json"), filepath.Join(dir, "r.svg")
	var stdout, stderr bytes.Buffer
	code := run(t.Context(), []string{"replay", "--quiet", "--format", "gentd26", "--trace", filepath.Join(tracesDir, "azure-llm-2023-conv.csv"),
		"--json", jsonPath, "--chart", chartPath}, mapEnv(nil), &stdout, &stderr)
	if code != 1 || !strings.Contains(stderr.String(), "lacks column") {
		t.Fatalf("exit %d, stderr %q; want 1 and the trace's error", code, stderr.String())
	}
	for _, p := range []string{jsonPath, chartPath} {
		if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s: %v; want it removed with the failed run", p, err)
		}
	}
}

// TestReplayReverse: --reverse plays the trace backwards, says so, and records it in
// the JSON; the same requests are replayed, in another order.
func TestReplayReverse(t *testing.T) {
	trace := filepath.Join(tracesDir, "mooncake-conversation.jsonl")
	outputs := map[bool]map[string]any{}
	for _, reverse := range []bool{false, true} {
		jsonPath := filepath.Join(t.TempDir(), "r.json")
		args := []string{"replay", "--quiet", "--format", "mooncake", "--trace", trace, "--limit", "1500", "--json", jsonPath}
		if reverse {
			args = append(args, "--reverse")
		}
		var stdout, stderr bytes.Buffer
		if code := run(t.Context(), args, mapEnv(nil), &stdout, &stderr); code != 0 {
			t.Fatalf("--reverse=%v: exit %d\n%s", reverse, code, stderr.String())
		}
		if got := strings.Contains(stdout.String(), "(played backwards)"); got != reverse {
			t.Errorf("--reverse=%v: says it played backwards: %v\n%s", reverse, got, stdout.String())
		}
		got := readJSONObject(t, jsonPath)
		if r, _ := got["reversed"].(bool); r != reverse {
			t.Errorf("--reverse=%v: JSON reversed is %v", reverse, got["reversed"])
		}
		outputs[reverse] = got
	}
	if outputs[false]["requests"] != outputs[true]["requests"] {
		t.Errorf("forwards %v requests, backwards %v: want the same", outputs[false]["requests"], outputs[true]["requests"])
	}
	if fmt.Sprint(outputs[false]["policies"]) == fmt.Sprint(outputs[true]["policies"]) {
		t.Error("backwards gave the same policies' results as forwards: was it reversed?")
	}
}

// readJSONObject reads the JSON object in the file at path.
func readJSONObject(t *testing.T, path string) map[string]any {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	if err := json.Unmarshal(data, &got); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return got
}

// TestReplayHPATolerance: --hpa-tolerance says what it modelled, in the text and the
// JSON, and changes what the HPA does; the default writes no field.
func TestReplayHPATolerance(t *testing.T) {
	trace := filepath.Join(tracesDir, "mooncake-conversation.jsonl")
	outputs := map[string]map[string]any{}
	for _, tol := range []string{"", "0.07", "0.5"} {
		jsonPath := filepath.Join(t.TempDir(), "r.json")
		args := []string{"replay", "--quiet", "--format", "mooncake", "--trace", trace, "--limit", "3000", "--json", jsonPath}
		if tol != "" {
			args = append(args, "--hpa-tolerance", tol)
		}
		var stdout, stderr bytes.Buffer
		if code := run(t.Context(), args, mapEnv(nil), &stdout, &stderr); code != 0 {
			t.Fatalf("--hpa-tolerance %q: exit %d\n%s", tol, code, stderr.String())
		}
		got := readJSONObject(t, jsonPath)
		said := strings.Contains(stdout.String(), "HPAs that tolerate")
		switch tol {
		case "":
			if said || got["hpa_tolerance"] != nil {
				t.Errorf("default: says %v, JSON hpa_tolerance %v; want neither", said, got["hpa_tolerance"])
			}
		case "0.07":
			if !strings.Contains(stdout.String(), "HPAs that tolerate 7% both ways") || got["hpa_tolerance"] != 0.07 {
				t.Errorf("0.07: JSON hpa_tolerance %v, text:\n%s", got["hpa_tolerance"], stdout.String())
			}
		}
		outputs[tol] = got
	}
	if fmt.Sprint(outputs[""]["policies"]) == fmt.Sprint(outputs["0.5"]["policies"]) {
		t.Error("HPAs tolerating 50% gave the same results as the default 10%: was the tolerance modelled?")
	}
}
