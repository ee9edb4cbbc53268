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
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gpuscaler/gpuscaler/scaler"
	"github.com/gpuscaler/gpuscaler/test/testkit"
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
	// The trigger is queue-demand: the timeline shows what it asks for, and the backlog
	// from the producer's own counts.
	if sum.QueueMetric != scaler.MetricQueueDemand {
		t.Errorf("queue metric %q, want %q", sum.QueueMetric, scaler.MetricQueueDemand)
	}
	demand, backlog := false, false
	for _, r := range sum.Rows {
		demand = demand || r.Demand != nil && *r.Demand > 0
		backlog = backlog || r.Backlog > 0
	}
	if !demand || !backlog {
		t.Errorf("timeline: some queue-demand above 0 %v, some backlog %v; want both", demand, backlog)
	}
	checkBaselines(t, sum, text)
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
	var got bytes.Buffer
	if err := WriteChart(&got, chartSummary()); err != nil {
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

// chartSummary is a small run: a burst from 2 s that a replica wakes for, three more
// replicas loading from 4 s to 6 s while the first serves flat out, a backlog peaking at
// 210 and queue-demand asking for up to 20 replicas until a request is seen done, then a
// quieter sustained phase and idle.
func chartSummary() *Summary {
	sum := &Summary{Seconds: 12, RequestsServed: 42, GPUSeconds: 12, SecondsAtZero: 3, StartupSeconds: 2, QueueMetric: scaler.MetricQueueDemand,
		Activations: []ActivationSummary{{AtSeconds: 2, Milliseconds: 0.4, Via: "push"}},
		Phases: []PhaseSpan{{Name: "idle", From: 0, To: 2}, {Name: "burst", From: 2, To: 6, Rate: 20},
			{Name: "sustained", From: 6, To: 9, Rate: 8}, {Name: "idle", From: 9, To: 12}}}
	backlog := []int{0, 0, 20, 80, 150, 210, 180, 120, 60, 10, 0, 0, 0}
	demand := []float64{0, 0, 5, 20, 2.5, 3.5, 4, 3, 2.5, 2, 1.5, 1, 1} // backlog/concurrency until a request is seen done
	for i := range 13 {
		r := Row{Seconds: float64(i), Backlog: backlog[i], Replicas: min(max(i-1, 0), 4), JobsRunning: i % 3, JobQueue: max(5-i/2, 0)}
		if i >= 2 {
			r.Demand = ptr(demand[i])
		}
		switch {
		case i >= 2 && i < 6:
			r.Rate = 20
		case i >= 6 && i < 9:
			r.Rate = 8
		}
		switch {
		case i >= 3 && i < 6: // one serves at 95%, the others load at 2%
			r.Ready, r.Replicas = 1, 4
			r.UtilServing, r.Util = ptr(95.0), ptr((95.0+3*2)/4)
		case i >= 6 && i < 11:
			r.Ready, r.Replicas = 4, 4
			r.UtilServing, r.Util = ptr(float64(90-10*(i-6))), ptr(float64(90-10*(i-6)))
		case i == 2:
			r.Util = ptr(2.0) // the first replica, loading: nothing serves yet
		}
		sum.Rows = append(sum.Rows, r)
	}
	return sum
}

// TestChartAxisFitsPeak draws a backlog peaking at 210: its axis must end at 250, not 500,
// where half the panel stayed empty.
func TestChartAxisFitsPeak(t *testing.T) {
	sum := &Summary{Seconds: 3}
	for i, b := range []int{0, 210, 40} {
		sum.Rows = append(sum.Rows, Row{Seconds: float64(i), Backlog: b})
	}
	var out bytes.Buffer
	if err := WriteChart(&out, sum); err != nil {
		t.Fatal(err)
	}
	texts := svgTexts(t, out.Bytes())
	if !slices.Contains(texts, "250") || slices.Contains(texts, "500") {
		t.Errorf("chart's labels %q: want the backlog's axis to end at 250, not 500", texts)
	}
}

func TestNiceAxis(t *testing.T) {
	for _, tc := range []struct {
		peak      float64
		max, step float64
	}{
		{210, 250, 50}, // the demo's backlog
		{177, 200, 50},
		{25, 25, 5}, // arrivals per second in the burst
		{16, 20, 5}, // replicas at the cap
		{6, 6, 2},
		{5, 5, 1},
		{1, 1, 1},
		{0.4, 1, 1}, // counts: no step below 1
		{0, 1, 1},
		{1000, 1000, 200},
		{1001, 1250, 250},
	} {
		if got := niceAxis(tc.peak); got.max != tc.max || got.step != tc.step {
			t.Errorf("niceAxis(%v) = 0 to %v by %v, want 0 to %v by %v", tc.peak, got.max, got.step, tc.max, tc.step)
		}
	}
}

// TestChartExplainsItself checks what a reader needs to read the chart: the phases named
// and placed, arrivals on an axis of their own, and utilisation over the serving replicas
// drawn apart from the average that counts replicas still loading.
func TestChartExplainsItself(t *testing.T) {
	sum := chartSummary()
	c := buildChart(sum)

	var labels []string
	for _, b := range c.phases {
		labels = append(labels, b.label)
	}
	if want := []string{"idle", "burst: 20 requests/s", "sustained: 8 requests/s", "idle"}; !slices.Equal(labels, want) {
		t.Errorf("phase bands %q, want %q", labels, want)
	}
	if b := c.phases[1]; b.from != 2 || b.to != 6 {
		t.Errorf("burst band from %v to %v s, want 2 to 6", b.from, b.to)
	}

	panelWith := func(series string) panel {
		t.Helper()
		for _, p := range c.panels {
			for _, sr := range p.series {
				if strings.HasPrefix(sr.name, series) {
					return p
				}
			}
		}
		t.Fatalf("no panel draws %q", series)
		return panel{}
	}
	if arrivals, backlog := panelWith("arrivals"), panelWith("backlog"); len(arrivals.series) != 1 || arrivals.axis.max != 20 || backlog.axis.max != 250 {
		t.Errorf("arrivals on an axis to %v with %d series, backlog to %v; want arrivals alone to 20, backlog to 250",
			arrivals.axis.max, len(arrivals.series), backlog.axis.max)
	}

	util := panelWith("serving replicas")
	if len(util.series) != 2 || !strings.Contains(util.note, "loads") {
		t.Fatalf("utilisation panel %+v: want a serving and an all-GPU series, and a note on loading replicas", util)
	}
	serving, all := util.series[0], util.series[1]
	if !strings.Contains(all.name, "loading") {
		t.Errorf("all-GPU series named %q: want it to say loading replicas count in it", all.name)
	}
	// At 4 s one replica serves at 95% while three load: the serving line stays at 95,
	// the all-GPU average drops to about 25.
	if p := serving.points[4]; !p.ok || p.v != 95 {
		t.Errorf("serving utilisation at 4 s = %+v, want 95", p)
	}
	if p := all.points[4]; !p.ok || p.v > 30 {
		t.Errorf("all-GPU utilisation at 4 s = %+v, want the average with loading replicas, about 25", p)
	}
	if p := serving.points[2]; p.ok {
		t.Errorf("serving utilisation at 2 s = %+v, want none: no replica serves yet", p)
	}

	var out bytes.Buffer
	if err := WriteChart(&out, sum); err != nil {
		t.Fatal(err)
	}
	texts := strings.Join(svgTexts(t, out.Bytes()), "|")
	for _, want := range []string{"burst: 20 requests/s", "sustained: 8 requests/s", "serving replicas", "loading too", "target 80%", "woken (push, 0.4 ms)",
		"backlog its producer counts", "queue-demand: replicas"} {
		if !strings.Contains(texts, want) {
			t.Errorf("chart's text lacks %q", want)
		}
	}
	// The trigger gives queue-demand: nothing may say the scaler reports a backlog.
	for _, stale := range []string{"queueTarget", scaler.MetricQueueBacklog, "backlog the scaler reports"} {
		if strings.Contains(texts, stale) {
			t.Errorf("chart's text names %q, which the demo's trigger no longer uses", stale)
		}
	}
	demand := panelWith("queue-demand")
	if demand.title != panelWith("inference replicas").title {
		t.Errorf("queue-demand drawn in panel %q, want beside the replicas it asks for", demand.title)
	}
}

// TestServingUtil averages the replicas that serve: one at 95% with four loading is 95%,
// where the average over every GPU held would say 20.6%.
func TestServingUtil(t *testing.T) {
	now := time.Unix(1000, 0)
	node := &simNode{}
	w := &inferenceService{}
	add := func(readyAt time.Time, util float64) {
		w.replicas = append(w.replicas, &replica{pod: &pod{gpus: 1, node: node, util: util}, readyAt: readyAt})
	}
	if _, ok := w.servingUtil(now); ok {
		t.Error("servingUtil with no replica: ok, want none")
	}
	for range 4 {
		add(now.Add(3*time.Second), loadingUtil)
	}
	if u, ok := w.servingUtil(now); ok {
		t.Errorf("servingUtil with every replica loading = %v, want none", u)
	}
	add(now.Add(-time.Second), 95)
	if u, ok := w.servingUtil(now); !ok || u != 95 {
		t.Errorf("servingUtil = %v, %v; want 95 over the one serving replica, not %.1f over all %d GPUs", u, ok, (95.0+4*loadingUtil)/5, w.gpusHeld())
	}
}

// TestPhaseSpans lays the load profile over a minute, and over a run stopped at 20 s.
func TestPhaseSpans(t *testing.T) {
	full := phaseSpans(time.Minute, time.Minute+50*time.Millisecond)
	if len(full) != len(profile) || full[0].From != 0 || full[len(full)-1].To != 60 {
		t.Fatalf("phases of a minute: %+v, want %d from 0 to 60 s", full, len(profile))
	}
	for i := 1; i < len(full); i++ {
		if full[i].From != full[i-1].To {
			t.Errorf("phase %d starts at %v, want where %d ended, %v", i, full[i].From, i-1, full[i-1].To)
		}
	}
	early := phaseSpans(time.Minute, 20*time.Second)
	if last := early[len(early)-1]; last.Name != "sustained" || last.From != 18 || last.To != 20 {
		t.Errorf("phases of a run stopped at 20 s end with %+v, want sustained from 18 to 20 s", last)
	}
}

// svgTexts returns the content of every text element of an SVG.
func svgTexts(t *testing.T, data []byte) []string {
	t.Helper()
	var texts []string
	dec := xml.NewDecoder(bytes.NewReader(data))
	in := false
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			return texts
		}
		if err != nil {
			t.Fatalf("chart is not well-formed XML: %v", err)
		}
		switch tok := tok.(type) {
		case xml.StartElement:
			in = tok.Name.Local == "text"
		case xml.CharData:
			if in {
				texts = append(texts, string(tok))
			}
		case xml.EndElement:
			in = false
		}
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
