package demo

import (
	"bytes"
	"context"
	"encoding/xml"
	"flag"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpuscaler/gpuscaler/internal/testkit"
)

var update = flag.Bool("update", false, "rewrite golden files")

// fastTiming compresses the demo's clocks so a whole run (wake from zero, scale up, drain,
// cool down to zero, two waves of training Jobs) fits in a few seconds.
func fastTiming() Timing {
	return Timing{
		PollingInterval: 300 * time.Millisecond,
		Cooldown:        1500 * time.Millisecond,
		HPASync:         400 * time.Millisecond,
		ScaleDownWindow: time.Second,
		Startup:         300 * time.Millisecond,
		JobRun:          1200 * time.Millisecond,
		NodeInterval:    100 * time.Millisecond,
		QueueInterval:   100 * time.Millisecond,
		Step:            25 * time.Millisecond,
		Row:             250 * time.Millisecond,
	}
}

// TestRunEndToEnd runs the whole demo, real NATS, scaler, collectors and producers, and
// checks the story it exists to tell: the service wakes from zero by push, scales with its
// backlog, goes back to zero once idle past cooldownPeriod, and training Jobs never
// outnumber the GPUs free for them.
func TestRunEndToEnd(t *testing.T) {
	var out testkit.SyncBuffer
	sum, err := Run(t.Context(), Config{
		Duration: 12 * time.Second, Nodes: 2, GPUsPerNode: 8, Seed: 7,
		GRPCAddr: "127.0.0.1:0", HTTPAddr: "-", NATSAddr: "127.0.0.1:0",
		Timing: fastTiming(), Out: &out, Log: testkit.Logger(t),
	})
	if err != nil {
		t.Fatalf("Run: %v\n%s", err, out.String())
	}
	text := out.String()
	t.Logf("demo output:\n%s", text)
	if !sum.Completed {
		t.Error("Completed = false, want true")
	}
	// A poll that coincides with the first request may answer first; the push must come
	// either way, well inside one polling interval.
	if len(sum.Activations) == 0 {
		t.Fatal("no activation from zero")
	}
	if a := sum.Activations[0]; a.PushMilliseconds <= 0 || a.PushMilliseconds >= 300 {
		t.Errorf("activation %+v: want a push within the 300ms polling interval", a)
	}
	if sum.PeakReplicas < 2 {
		t.Errorf("peak replicas = %d, want the HPA to have scaled past 1 on the burst", sum.PeakReplicas)
	}
	if sum.EndReplicas != 0 {
		t.Errorf("replicas at the end = %d, want 0 after the idle phase and cooldown", sum.EndReplicas)
	}
	if sum.SecondsAtZero <= 0 || sum.SecondsAtZero >= sum.Seconds {
		t.Errorf("seconds at zero = %.1f of %.1f, want some but not all", sum.SecondsAtZero, sum.Seconds)
	}
	if sum.RequestsServed == 0 {
		t.Error("no request served")
	}
	// 8 training GPUs hold two 4-GPU Jobs at once.
	if sum.TrainingPoolGPUs != 8 || sum.TrainingPeakRun != 2 {
		t.Errorf("training: %d GPUs, peak %d running; want 8 GPUs, 2 running", sum.TrainingPoolGPUs, sum.TrainingPeakRun)
	}
	// Without the cap, KEDA would create a Job per queued item: six at once for two
	// slots, four of them pending. The cap reads queue and node reports that can each be
	// an interval old, so a Job may briefly wait, but never that many.
	if sum.TrainingPeakPend >= trainingBatchLen-2 {
		t.Errorf("training: up to %d Jobs pending, want fewer than the %d an uncapped ScaledJob would leave", sum.TrainingPeakPend, trainingBatchLen-2)
	}
	if sum.TrainingFinished == 0 || sum.TrainingCreated < sum.TrainingFinished {
		t.Errorf("training: %d created, %d finished; want some finished", sum.TrainingCreated, sum.TrainingFinished)
	}
	for _, want := range []string{"after the first request", "KEDA: active → 1 replica(s)", "HPA: ", "inactive for cooldownPeriod", "ScaledJob: ", "summary after"} {
		if !strings.Contains(text, want) {
			t.Errorf("output lacks %q", want)
		}
	}
	if len(sum.Rows) < 30 {
		t.Errorf("%d timeline rows, want one per 250ms over 12s", len(sum.Rows))
	}
	var chart bytes.Buffer
	if err := WriteChart(&chart, sum); err != nil {
		t.Fatal(err)
	}
	checkSVG(t, chart.Bytes())
}

func TestRunStopsCleanlyOnCancel(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var out testkit.SyncBuffer
	done := make(chan struct{})
	var sum *Summary
	var err error
	go func() {
		defer close(done)
		sum, err = Run(ctx, Config{Duration: time.Minute, Nodes: 2, GPUsPerNode: 4,
			GRPCAddr: "127.0.0.1:0", HTTPAddr: "-", NATSAddr: "127.0.0.1:0", Timing: fastTiming(), Out: &out})
	}()
	testkit.Eventually(t, 10*time.Second, func() bool { return strings.Count(out.String(), "\n") > 12 })
	cancel()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return within 10s of the cancel")
	}
	if err != nil {
		t.Fatalf("Run after cancel: %v, want nil", err)
	}
	if sum == nil || sum.Completed {
		t.Fatalf("summary = %+v, want one marked not completed", sum)
	}
	if !strings.Contains(out.String(), "summary (stopped early)") {
		t.Errorf("output lacks the early-stop summary:\n%s", out.String())
	}
}

// TestConfigValidate checks Validate on a configuration as Run sees it, its zero values
// filled: zero is a default there, a negative value a mistake. (The command calls Validate
// on its flags as given, so a zero there is refused: see cmd/gpuscaler's
// TestDemoFlagErrors.)
func TestConfigValidate(t *testing.T) {
	for name, tc := range map[string]struct {
		cfg  Config
		want string
	}{
		"defaults":             {Config{}, ""},
		"one node":             {Config{Nodes: 1}, "--nodes 1: want 2 to 64"},
		"negative nodes":       {Config{Nodes: -4}, "--nodes -4: want 2 to 64"},
		"too few GPUs":         {Config{GPUsPerNode: 2}, "--gpus-per-node 2"},
		"too many GPUs":        {Config{GPUsPerNode: 17}, "--gpus-per-node 17"},
		"negative GPUs":        {Config{GPUsPerNode: -8}, "--gpus-per-node -8"},
		"too short":            {Config{Duration: time.Second}, "--duration 1s"},
		"negative duration":    {Config{Duration: -time.Minute}, "--duration -1m0s"},
		"negative polling":     {Config{Timing: Timing{PollingInterval: -time.Second}}, "--polling-interval -1s: want more than 0"},
		"negative HPA sync":    {Config{Timing: Timing{HPASync: -time.Second}}, "--hpa-sync -1s: want more than 0"},
		"negative cooldown":    {Config{Timing: Timing{Cooldown: -time.Second}}, "--cooldown -1s: want 0 or more"},
		"no cooldown, as KEDA": {Config{Timing: Timing{Cooldown: 0}}, ""},
		"negative startup":     {Config{Timing: Timing{Startup: -time.Second}}, "Timing.Startup -1s"},
		"gRPC address no port": {Config{GRPCAddr: "localhost"}, `--grpc-addr "localhost": want host:port`},
		"HTTP off":             {Config{HTTPAddr: "-"}, ""},
		"NATS port too big":    {Config{NATSAddr: "127.0.0.1:65536"}, `--nats-addr "127.0.0.1:65536"`},
		"two nodes of 4 GPUs":  {Config{Nodes: 2, GPUsPerNode: 4}, ""},
	} {
		t.Run(name, func(t *testing.T) {
			err := tc.cfg.withDefaults().Validate()
			if tc.want == "" && err != nil {
				t.Fatalf("Validate = %v, want nil", err)
			}
			if tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
				t.Fatalf("Validate = %v, want an error naming %q", err, tc.want)
			}
		})
	}
}

// TestFreeIfTaken holds a port with a real listener: the demo moves off it only then.
func TestFreeIfTaken(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if got, taken := freeIfTaken(l.Addr().String()); !taken || got != "127.0.0.1:0" {
		t.Errorf("freeIfTaken(%s), held: got %q, %v; want 127.0.0.1:0, true", l.Addr(), got, taken)
	}
	free := testkit.FreeAddr(t)
	if got, taken := freeIfTaken(free); taken || got != free {
		t.Errorf("freeIfTaken(%s), free: got %q, %v; want it unchanged, false", free, got, taken)
	}
}

// TestChartGolden draws a fixed summary and compares it with testdata/chart.svg (go test
// -update rewrites it). Look at the file after a change: it is what users see.
func TestChartGolden(t *testing.T) {
	util := func(v float64) *float64 { return &v }
	sum := &Summary{Seconds: 10, RequestsServed: 42, GPUSeconds: 12, SecondsAtZero: 3,
		Activations: []ActivationSummary{{AtSeconds: 2, Milliseconds: 0.4, Via: "push"}}}
	for i := range 11 {
		r := Row{Seconds: float64(i), Backlog: float64(i * (10 - i)), Rate: float64(i % 4), Replicas: min(i/2, 3), Ready: min(i/3, 3),
			JobsRunning: i % 3, JobQueue: 5 - i/2}
		if i >= 2 {
			r.Util = util(float64(10 * i))
		}
		sum.Rows = append(sum.Rows, r)
	}
	var got bytes.Buffer
	if err := WriteChart(&got, sum); err != nil {
		t.Fatal(err)
	}
	checkSVG(t, got.Bytes())
	path := filepath.Join("testdata", "chart.svg")
	if *update {
		if err := os.WriteFile(path, got.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -update to create it)", err)
	}
	if !bytes.Equal(got.Bytes(), want) {
		t.Errorf("chart differs from %s; run go test ./internal/demo -run TestChartGolden -update and look at it", path)
	}
}

// checkSVG fails unless data is well-formed XML with an svg root holding paths.
func checkSVG(t *testing.T, data []byte) {
	t.Helper()
	dec := xml.NewDecoder(bytes.NewReader(data))
	root, paths := "", 0
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("chart is not well-formed XML: %v", err)
		}
		if se, ok := tok.(xml.StartElement); ok {
			if root == "" {
				root = se.Name.Local
			}
			if se.Name.Local == "path" {
				paths++
			}
		}
	}
	if root != "svg" || paths < 7 {
		t.Fatalf("chart: root %q with %d paths, want svg with a path per series", root, paths)
	}
}
