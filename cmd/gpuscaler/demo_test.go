package main

import (
	"context"
	"encoding/json"
	"errors"
	"maps"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpuscaler/gpuscaler/test/testkit"
)

// TestDemoFlagErrors checks every demo flag whose value cannot mean anything is refused
// before the run starts, naming the flag, the value and what is wanted, where it once ran
// a minute with the default instead. The listeners point at free ports, so a mistake that
// slipped through would run; the deadline keeps such a run short.
func TestDemoFlagErrors(t *testing.T) {
	dir := t.TempDir()
	base := map[string]string{
		"GPUSCALER_GRPC_ADDR": "127.0.0.1:0",
		"GPUSCALER_HTTP_ADDR": "-",
		"GPUSCALER_NATS_ADDR": "127.0.0.1:0",
	}
	tests := map[string]struct {
		args []string
		env  map[string]string
		want []string
	}{
		"zero duration":             {args: []string{"--duration", "0"}, want: []string{"--duration 0s", "want at least 5s"}},
		"negative duration":         {args: []string{"--duration", "-1m"}, want: []string{"--duration -1m0s", "want at least 5s"}},
		"zero nodes":                {args: []string{"--nodes", "0"}, want: []string{"--nodes 0", "want 2 to 64"}},
		"negative nodes":            {args: []string{"--nodes", "-2"}, want: []string{"--nodes -2", "want 2 to 64"}},
		"zero GPUs per node":        {args: []string{"--gpus-per-node", "0"}, want: []string{"--gpus-per-node 0", "want 4 to 16"}},
		"negative GPUs per node":    {args: []string{"--gpus-per-node", "-8"}, want: []string{"--gpus-per-node -8", "want 4 to 16"}},
		"zero polling interval":     {args: []string{"--polling-interval", "0"}, want: []string{"--polling-interval 0s", "want more than 0"}},
		"negative polling interval": {args: []string{"--polling-interval", "-5s"}, want: []string{"--polling-interval -5s", "want more than 0"}},
		"zero HPA sync":             {args: []string{"--hpa-sync", "0"}, want: []string{"--hpa-sync 0s", "want more than 0"}},
		"negative cooldown":         {args: []string{"--cooldown", "-1s"}, want: []string{"--cooldown -1s", "want 0 or more"}},
		"negative cooldown from env": {
			env:  map[string]string{"GPUSCALER_COOLDOWN": "-1s"},
			want: []string{"--cooldown -1s", "want 0 or more"},
		},
		"empty gRPC address":       {args: []string{"--grpc-addr", ""}, want: []string{`--grpc-addr ""`, "want host:port"}},
		"gRPC address, no port":    {args: []string{"--grpc-addr", "localhost"}, want: []string{`--grpc-addr "localhost"`, "want host:port"}},
		"empty HTTP address":       {args: []string{"--http-addr", ""}, want: []string{`--http-addr ""`, `"-" to turn HTTP off`}},
		"NATS port out of range":   {args: []string{"--nats-addr", "127.0.0.1:70000"}, want: []string{`--nats-addr "127.0.0.1:70000"`, "want host:port"}},
		"chart in a missing dir":   {args: []string{"--chart", "/no/such/dir/x.svg"}, want: []string{`--chart "/no/such/dir/x.svg"`, "no such file or directory"}},
		"JSON in a missing dir":    {args: []string{"--json", "/no/such/dir/x.json"}, want: []string{`--json "/no/such/dir/x.json"`, "no such file or directory"}},
		"chart is a directory":     {args: []string{"--chart", dir}, want: []string{"--chart " + `"` + dir + `"`, "is a directory"}},
		"chart and JSON, one file": {args: []string{"--chart", filepath.Join(dir, "out"), "--json", filepath.Join(dir, ".", "out")}, want: []string{"--chart and --json", "two files"}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			env := maps.Clone(base)
			maps.Copy(env, tc.env)
			ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
			defer cancel()
			r := runCLI(ctx, env, append([]string{"demo"}, tc.args...)...)
			if r.code != 2 {
				t.Fatalf("got %v, want exit 2", r)
			}
			for _, w := range tc.want {
				if !strings.Contains(r.stderr, w) {
					t.Errorf("got stderr %q, want it to contain %q", r.stderr, w)
				}
			}
			if r.stdout != "" {
				t.Errorf("got stdout %q, want nothing: the run must not start", r.stdout)
			}
		})
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("%s holds %v after refused runs, want nothing left behind", dir, entries)
	}
}

// TestDemoRunsWhenItsDefaultPortsAreTaken runs `gpuscaler demo` as `make run` does, with
// no address flags, while real listeners hold NATS's 4222 and the scaler's 9090 and 8080
// (a local nats-server, another scaler). The demo must start on free ports, say so, and,
// stopped as by Ctrl-C, still write its chart and JSON.
func TestDemoRunsWhenItsDefaultPortsAreTaken(t *testing.T) {
	var held []string
	for _, addr := range []string{"127.0.0.1:4222", "127.0.0.1:9090", "127.0.0.1:8080"} {
		if holdPort(t, addr) {
			held = append(held, addr)
		}
	}
	dir := t.TempDir()
	chart, jsonPath := filepath.Join(dir, "demo.svg"), filepath.Join(dir, "demo.json")
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var stdout, stderr testkit.SyncBuffer
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"demo", "--duration", "5s", "--chart", chart, "--json", jsonPath}, mapEnv(nil), &stdout, &stderr)
	}()
	testkit.Eventually(t, 20*time.Second, func() bool {
		select {
		case code := <-done:
			t.Fatalf("demo exited with %d before its timeline began; stdout:\n%s\nstderr:\n%s", code, stdout.String(), stderr.String())
		default:
		}
		return strings.Contains(stdout.String(), "backlog") // the timeline's header
	})
	cancel() // Ctrl-C
	select {
	case code := <-done:
		if code != 0 {
			t.Fatalf("demo stopped early exited with %d, want 0; stderr:\n%s", code, stderr.String())
		}
	case <-time.After(15 * time.Second):
		t.Fatal("demo did not stop within 15s of the cancel")
	}
	out := stdout.String()
	t.Logf("demo output:\n%s", out)
	want := []string{"summary (stopped early)", "wrote " + chart, "wrote " + jsonPath}
	for _, addr := range held { // said, not silent; a port held by another program may be freed meanwhile
		want = append(want, addr+" is in use")
	}
	for _, w := range want {
		if !strings.Contains(out, w) {
			t.Errorf("output lacks %q", w)
		}
	}
	if strings.Contains(out, "nats://127.0.0.1:4222") {
		t.Error("the demo's NATS claims 127.0.0.1:4222, which another listener holds")
	}
	if data, err := os.ReadFile(chart); err != nil || !strings.Contains(string(data), "</svg>") {
		t.Errorf("chart %s: %v, %d bytes; want an SVG", chart, err, len(data))
	}
	var sum struct {
		Completed *bool             `json:"completed"`
		Baselines []json.RawMessage `json:"baselines"`
		Replayed  *int              `json:"replayed_requests"`
		Served    int               `json:"requests_served"`
	}
	if data, err := os.ReadFile(jsonPath); err != nil || json.Unmarshal(data, &sum) != nil || sum.Completed == nil || *sum.Completed {
		t.Errorf("JSON %s: %v, %+v; want a summary marked not completed", jsonPath, err, sum)
	}
	// Stopped early, the run may have served nothing yet; whatever it started is
	// replayed, every request it served among them, or there is no comparison at all.
	switch {
	case sum.Baselines == nil || sum.Replayed == nil:
		t.Errorf("JSON %s: baselines %v, replayed_requests %v; want both, empty or not", jsonPath, sum.Baselines, sum.Replayed)
	case *sum.Replayed < sum.Served:
		t.Errorf("JSON %s: %d requests replayed, %d served; want every served one replayed", jsonPath, *sum.Replayed, sum.Served)
	case (*sum.Replayed == 0) != (len(sum.Baselines) == 0):
		t.Errorf("JSON %s: %d requests replayed under %d baselines; want baselines exactly when there are requests", jsonPath, *sum.Replayed, len(sum.Baselines))
	}
}

// TestDemoSummaryComparesBaselines runs a short demo to its end through the command and
// reads its JSON: every baseline policy is there, replayed on exactly the requests the
// run served, and the summary prints each.
func TestDemoSummaryComparesBaselines(t *testing.T) {
	dir := t.TempDir()
	jsonPath := filepath.Join(dir, "demo.json")
	env := map[string]string{"GPUSCALER_GRPC_ADDR": "127.0.0.1:0", "GPUSCALER_HTTP_ADDR": "-", "GPUSCALER_NATS_ADDR": "127.0.0.1:0"}
	// The clocks of a one-minute demo, in 10 s: the burst is long enough to serve.
	r := runCLI(t.Context(), env, "demo", "--duration", "10s", "--seed", "3", "--polling-interval", "1s", "--cooldown", "2s", "--hpa-sync", "1s", "--json", jsonPath)
	if r.code != 0 {
		t.Fatalf("got %v, want exit 0", r)
	}
	var sum struct {
		Completed bool `json:"completed"`
		Baselines []struct {
			Policy     string  `json:"policy"`
			Setting    string  `json:"setting"`
			GPUSeconds float64 `json:"gpu_seconds"`
		} `json:"baselines"`
		Replayed int `json:"replayed_requests"`
		Served   int `json:"requests_served"`
	}
	data, err := os.ReadFile(jsonPath)
	if err != nil || json.Unmarshal(data, &sum) != nil {
		t.Fatalf("JSON %s: %v\n%s", jsonPath, err, data)
	}
	if !sum.Completed || sum.Served == 0 || sum.Replayed != sum.Served {
		t.Errorf("completed %v, %d served, %d replayed; want a completed run whose every served request is replayed", sum.Completed, sum.Served, sum.Replayed)
	}
	var policies []string
	for _, b := range sum.Baselines {
		policies = append(policies, b.Policy)
		if b.GPUSeconds <= 0 || !strings.Contains(r.stdout, b.Setting) {
			t.Errorf("baseline %+v: want GPU-seconds above 0, and its setting in the printed table", b)
		}
	}
	if want := []string{"always-on", "always-on", "seeds-hpa-gpu-util", "keda-poll-backlog", "gpuscaler-backlog", "gpuscaler"}; !slices.Equal(policies, want) {
		t.Errorf("baselines %q, want %q", policies, want)
	}
	if !strings.Contains(r.stdout, "live run") {
		t.Errorf("summary lacks the live run's row:\n%s", r.stdout)
	}
}

// holdPort listens on addr until the test ends, and reports whether it does. When
// something else holds it already (a local nats-server, a test running beside this one)
// it is taken all the same, but may be freed at any moment.
func holdPort(t *testing.T, addr string) bool {
	t.Helper()
	l, err := net.Listen("tcp", addr)
	if errors.Is(err, syscall.EADDRINUSE) {
		return false
	}
	if err != nil {
		t.Fatalf("hold %s: %v", addr, err)
	}
	t.Cleanup(func() { l.Close() })
	return true
}

// TestDemoFailedRunLeavesOutputsAlone: the outputs are opened before the run, but a run
// that fails removes the file it created and leaves one that was there as it was. An
// address given is used as given: taken, the run fails and names it.
func TestDemoFailedRunLeavesOutputsAlone(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	dir := t.TempDir()
	chart, jsonPath := filepath.Join(dir, "new.svg"), filepath.Join(dir, "old.json")
	if err := os.WriteFile(jsonPath, []byte("old\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"GPUSCALER_HTTP_ADDR": "-", "GPUSCALER_NATS_ADDR": "127.0.0.1:0"}
	r := runCLI(t.Context(), env, "demo", "--grpc-addr", l.Addr().String(), "--chart", chart, "--json", jsonPath)
	if r.code != 1 || !strings.Contains(r.stderr, l.Addr().String()) || !strings.Contains(r.stderr, "address already in use") {
		t.Fatalf("got %v, want exit 1 naming %s, in use", r, l.Addr())
	}
	if _, err := os.Stat(chart); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("chart %s after a failed run: %v, want it removed", chart, err)
	}
	if data, err := os.ReadFile(jsonPath); err != nil || string(data) != "old\n" {
		t.Errorf("JSON %s after a failed run holds %q (%v), want what it held before", jsonPath, data, err)
	}
}
