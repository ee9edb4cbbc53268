package main

import (
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/gpuscaler/gpuscaler/internal/natstest"
	gpuscalerv1 "github.com/gpuscaler/gpuscaler/proto/gpuscaler/v1"
	"github.com/gpuscaler/gpuscaler/scaler"
	"github.com/gpuscaler/gpuscaler/scaler/scalertest"
	"github.com/gpuscaler/gpuscaler/test/testkit"
)

// explained is one element of explain's JSON output.
type explained struct {
	Kind          string            `json:"kind"`
	Namespace     string            `json:"namespace"`
	Name          string            `json:"name"`
	Trigger       int               `json:"trigger"`
	Type          string            `json:"type"`
	ScalerAddress string            `json:"scalerAddress"`
	Metadata      map[string]string `json:"metadata"`
	Warnings      []string          `json:"warnings"`
	Explanation   json.RawMessage   `json:"explanation"`
}

func decodeExplained(t *testing.T, out string) ([]explained, []*gpuscalerv1.Explanation) {
	t.Helper()
	var got []explained
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("explain -o json printed %q: %v", out, err)
	}
	exs := make([]*gpuscalerv1.Explanation, len(got))
	for i, e := range got {
		exs[i] = &gpuscalerv1.Explanation{}
		if err := protojson.Unmarshal(e.Explanation, exs[i]); err != nil {
			t.Fatalf("explanation %d: %v", i, err)
		}
	}
	return got, exs
}

// TestExplainReadmeQuickStart checks the README's quick start claim with the command it
// now gives: after `publish queue --namespace default --queue demo --waiting 3`, a
// trigger with queue: demo is active with a backlog of 3.
func TestExplainReadmeQuickStart(t *testing.T) {
	url, _ := startScaler(t)
	s, _ := scalertest.Start(t, url)
	addr := s.GRPCAddr().String()
	if r := runCLI(t.Context(), nil, "publish", "queue", "--nats-url", url, "--namespace", "default", "--queue", "demo", "--waiting", "3"); r.code != 0 {
		t.Fatalf("publish: %v", r)
	}
	var r result
	testkit.Eventually(t, 5*time.Second, func() bool {
		r = runCLI(t.Context(), nil, "explain", "--scaler-address", addr, "--metadata", "queue=demo")
		return r.code == 0 && strings.Contains(r.stdout, "value 3")
	})
	for _, want := range []*regexp.Regexp{
		regexp.MustCompile(`(?m)^  IsActive +true$`),
		regexp.MustCompile(`(?m)^  queue-backlog +target 1 +value 3 +→ 3 replicas$`),
		regexp.MustCompile(`(?m)^  3 waiting \+ 0 in flight = 3, summed over 1 live producer, newest report stored \S+ \([0-9.]+m?s ago\)$`),
		regexp.MustCompile(`(?m)^    producer "gpuscaler-publish": 3 waiting \+ 0 in flight, [0-9.]+m?s ago$`),
		regexp.MustCompile(`(?m)^  - Active: KEDA scales the workload from zero`),
	} {
		if !want.MatchString(r.stdout) {
			t.Errorf("explain output does not match %s:\n%s", want, r.stdout)
		}
	}
	if r.stderr != "" {
		t.Errorf("stderr %q, want nothing", r.stderr)
	}

	r = runCLI(t.Context(), nil, "explain", "--scaler-address", addr, "--metadata", "queue=demo", "-o", "json")
	got, exs := decodeExplained(t, r.stdout)
	if r.code != 0 || len(got) != 1 || got[0].Namespace != "default" || got[0].ScalerAddress != addr ||
		!exs[0].GetAnswer().GetActive() || exs[0].GetAnswer().GetMetrics()[0].GetValue() != 3 {
		t.Fatalf("explain -o json: %v; decoded %+v %v", r, got, exs)
	}
}

// TestExplainFile explains the shipped example ScaledObject, read from a file and from
// stdin beside a Deployment, against a scaler that has no reports yet: every trigger, in
// order, with the Unavailable KEDA would get and why: its one trigger, on a queue and the
// pods' GPUs.
func TestExplainFile(t *testing.T) {
	url, _ := startScaler(t)
	s, _ := scalertest.Start(t, url)
	addr := s.GRPCAddr().String()
	file := filepath.Join("..", "..", "examples", "inference-scale-to-zero", "scaledobject.yaml")
	r := runCLI(t.Context(), nil, "explain", "--file", file, "--scaler-address", addr, "-o", "json")
	got, exs := decodeExplained(t, r.stdout)
	if r.code != 0 || len(got) != 1 {
		t.Fatalf("got %v, want one trigger explained", r)
	}
	g, ex := got[0], exs[0]
	if g.Kind != "ScaledObject" || g.Namespace != "inference" || g.Name != "llm-server" || g.Trigger != 0 || g.Type != "external-push" ||
		g.Metadata["scalerAddress"] != "gpuscaler.gpuscaler.svc.cluster.local:9090" {
		t.Errorf("trigger 0: %+v", g)
	}
	for _, says := range []string{"no report for queue inference/llm-requests", "no node report since this scaler started"} {
		if ex.GetAnswer().GetErrorCode() != "Unavailable" || !strings.Contains(ex.GetAnswer().GetError(), says) {
			t.Errorf("trigger 0 answer: %v, want Unavailable saying %q", ex.GetAnswer(), says)
		}
	}
	if len(g.Warnings) != 1 || !strings.HasPrefix(g.Warnings[0], "fallback: ") {
		t.Errorf("trigger 0 warnings %q, want the example's fallback", g.Warnings)
	}

	// The table, from stdin, with a Deployment before the ScaledObject.
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	stdin := filepath.Join(t.TempDir(), "stdin")
	if err := os.WriteFile(stdin, append([]byte("apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: llm-server}\n---\n"), data...), 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(stdin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	old := os.Stdin
	os.Stdin = f
	r = runCLI(t.Context(), nil, "explain", "--file", "-", "--scaler-address", addr)
	os.Stdin = old
	for _, want := range []string{
		"ScaledObject inference/llm-server, trigger 0 (requests), answered by the scaler at " + addr,
		"Unavailable: data unavailable: no report for queue inference/llm-requests",
		`GPUs of the pods podSelector "app.kubernetes.io/name=llm-server" selects`,
		"IsActive fails (Unavailable): KEDA neither scales to nor from zero",
		"Settings of this ScaledObject that change what KEDA does with these answers\n  ! fallback: while the scaler answers Unavailable (missing data), after 3 failures KEDA counts the trigger active and sets 2 replicas",
	} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("explain table does not say %q:\n%s", want, r.stdout)
		}
	}
}

// TestExplainOverMutualTLS connects as KEDA does with a TriggerAuthentication's caCert,
// tlsClientCert and tlsClientKey, through an address other than the certificate's name,
// as through a port-forward.
func TestExplainOverMutualTLS(t *testing.T) {
	dir := t.TempDir()
	ca := testkit.NewCA(t, "ca")
	serverCert, serverKey := ca.IssueFiles(t, dir, "gpuscaler.gpuscaler.svc")
	clientCert, clientKey := ca.IssueFiles(t, dir, "keda-operator")
	caFile := testkit.WriteFile(t, dir, "ca.crt", ca.PEM)
	ns := natstest.Start(t, "", "")
	nc := natstest.Connect(t, ns.ClientURL())
	s := scalertest.Run(t, scaler.Config{TLS: scaler.TLSConfig{CertFile: serverCert, KeyFile: serverKey, ClientCAFile: caFile}}, nc)
	_, port, _ := net.SplitHostPort(s.GRPCAddr().String())

	base := []string{"explain", "--metadata", "queue=jobs", "--namespace", "ml", "--timeout", "3s"}
	tests := map[string]struct {
		args []string
		want string
		code int
	}{
		"KEDA's certificates, through a port-forward": {
			args: []string{"--scaler-address", "localhost:" + port, "--tls-ca", caFile, "--tls-cert", clientCert, "--tls-key", clientKey, "--tls-server-name", "gpuscaler.gpuscaler.svc"},
			want: "Queue ml/jobs",
		},
		"no client certificate": {
			args: []string{"--scaler-address", "localhost:" + port, "--tls-ca", caFile},
			want: "scaler at localhost:" + port, code: 1,
		},
		"plain text to a TLS scaler": {
			args: []string{"--scaler-address", "localhost:" + port},
			want: "does it serve TLS when you did not ask for it (or the reverse)?", code: 1,
		},
		"cert without key": {
			args: []string{"--tls-cert", clientCert},
			want: "--tls-cert and --tls-key go together", code: 2,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			r := runCLI(t.Context(), nil, append(base, tc.args...)...)
			out := r.stdout + r.stderr
			if r.code != tc.code || !strings.Contains(out, tc.want) {
				t.Fatalf("got %v, want exit %d saying %q", r, tc.code, tc.want)
			}
		})
	}
}

func TestExplainUsageErrors(t *testing.T) {
	dir := t.TempDir()
	deployment := testkit.WriteFile(t, dir, "d.yaml", []byte("apiVersion: apps/v1\nkind: Deployment\n"))
	// A port nothing listens on: bound, then released.
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := lis.Addr().String()
	lis.Close()
	so := testkit.WriteFile(t, dir, "so.yaml", []byte("apiVersion: keda.sh/v1alpha1\nkind: ScaledObject\nmetadata: {name: web, namespace: ml}\nspec:\n  triggers:\n    - type: external\n      metadata: {scalerAddress: gpuscaler.invalid:9090, queue: q}\n"))
	tests := map[string]struct {
		args []string
		code int
		want string
	}{
		"nothing named":         {[]string{"explain"}, 2, "name a trigger: --metadata KEY=VALUE (repeated), or --file"},
		"both":                  {[]string{"explain", "--file", so, "--metadata", "queue=q"}, 2, "give --file or --metadata, not both"},
		"metadata without =":    {[]string{"explain", "--metadata", "queue"}, 2, `invalid value "queue" for flag -metadata: want key=value, as in queue=demo`},
		"output yaml":           {[]string{"explain", "--metadata", "queue=q", "-o", "yaml"}, 2, `--output "yaml": want table or json`},
		"timeout zero":          {[]string{"explain", "--metadata", "queue=q", "--timeout", "0s"}, 2, "--timeout 0s: want a positive duration"},
		"no such file":          {[]string{"explain", "--file", filepath.Join(dir, "absent.yaml")}, 2, "absent.yaml: no such file or directory"},
		"no KEDA object":        {[]string{"explain", "--file", deployment}, 2, "no keda.sh/v1alpha1 ScaledObject or ScaledJob in it (found Deployment (apps/v1))"},
		"nothing listening":     {[]string{"explain", "--metadata", "queue=q", "--scaler-address", dead, "--timeout", "1s"}, 1, "scaler at " + dead},
		"the trigger's address": {[]string{"explain", "--file", so, "--timeout", "1s"}, 1, "gpuscaler.invalid:9090 is the trigger's scalerAddress, which resolves only inside the cluster: run 'kubectl -n gpuscaler port-forward svc/gpuscaler 9090'"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			r := runCLI(t.Context(), nil, tc.args...)
			if r.code != tc.code || !strings.Contains(r.stderr, tc.want) {
				t.Fatalf("got %v, want exit %d and stderr containing %q", r, tc.code, tc.want)
			}
		})
	}
}

// TestPrintExplanationCPUAndMemory: the capacity table says of each node how many Jobs
// its CPU or memory lets through of those its free devices take, and which nodes are
// counted on their devices alone.
func TestPrintExplanationCPUAndMemory(t *testing.T) {
	ex := &gpuscalerv1.Explanation{Capacity: &gpuscalerv1.Capacity{GpusPerReplica: 1, Slots: 4, Nodes: []*gpuscalerv1.NodeCapacity{
		{Node: "gpu-a", Free: 2, GpuSlots: 2, Slots: 2},
		{Node: "gpu-b", Free: 3, GpuSlots: 3, Slots: 1, LimitedBy: "CPU"},
		{Node: "gpu-e", Free: 1, GpuSlots: 1, Slots: 1, ResourcesUnknown: true},
	}}}
	var out strings.Builder
	printExplanation(&out, explainTarget{}, "scaler:9090", ex)
	for _, want := range []string{
		`gpu-b\s+\S+ ago\s+3\s+1 \(CPU; free devices take 3\)`,
		`gpu-e\s+\S+ ago\s+1\s+1 \(CPU and memory unknown\)`,
	} {
		if !regexp.MustCompile(want).MatchString(out.String()) {
			t.Errorf("explain output does not match %q:\n%s", want, out.String())
		}
	}
}

// TestPrintExplanationTrafficSource: the queue's line of arrivals and service time says
// whether its live producers measured them or the scaler estimated them.
func TestPrintExplanationTrafficSource(t *testing.T) {
	producers := []*gpuscalerv1.ProducerStatus{{ProducerId: "gw-0", Measured: true}, {ProducerId: "gw-1"}, {ProducerId: "old", Stale: true}}
	for measuring, want := range map[int32]string{
		0: "service time 5 s: estimated from differences between reports (a producer that does not measure)",
		1: "service time 5 s: measured by 1 of 2 live producers, estimated for the others from differences between reports",
		2: "service time 5 s: measured by its producers",
	} {
		ex := &gpuscalerv1.Explanation{Effective: map[string]string{"queue": "q", "targetWait": "10s"}, Queue: &gpuscalerv1.QueueStatus{
			Namespace: "ml", Queue: "q", ArrivalRate: 2, ServiceSeconds: 5, MeasuringProducers: measuring, Producers: producers,
			Stored: timestamppb.Now(), Age: durationpb.New(time.Second),
		}}
		var out strings.Builder
		printExplanation(&out, explainTarget{}, "scaler:9090", ex)
		if !strings.Contains(out.String(), "arrivals 2/s (dispersion unknown), "+want+"\n") {
			t.Errorf("%d measuring: explain output does not say %q:\n%s", measuring, want, out.String())
		}
	}
	// A known dispersion is shown as it is, a trend as the change a minute, and a known
	// level with its window.
	for trend, want := range map[float64]string{
		0:      "arrivals 2/s (dispersion 7.5), service time 5 s",
		0.05:   "arrivals 2/s (dispersion 7.5, +3/s a minute), service time 5 s",
		-0.005: "arrivals 2/s (dispersion 7.5, -0.3/s a minute), service time 5 s",
		0.001:  "arrivals 2/s (dispersion 7.5, +0.06/s a minute, level 1.8/s over 4m13s), service time 5 s",
	} {
		var level, window float64
		if trend == 0.001 {
			level, window = 1.8, 252.6
		}
		ex := &gpuscalerv1.Explanation{Effective: map[string]string{"queue": "q", "targetWait": "10s"}, Queue: &gpuscalerv1.QueueStatus{
			Namespace: "ml", Queue: "q", ArrivalRate: 2, ArrivalDispersion: 7.5, ArrivalTrend: trend, ServiceSeconds: 5, Stored: timestamppb.Now(), Age: durationpb.New(time.Second),
			ArrivalLevel: level, LevelWindowSeconds: window,
		}}
		var out strings.Builder
		printExplanation(&out, explainTarget{}, "scaler:9090", ex)
		if !strings.Contains(out.String(), want) {
			t.Errorf("explain output does not say %q:\n%s", want, out.String())
		}
	}
}

// TestPrintExplanationOldestWait: the oldest waiting item's wait is shown where a
// producer measured it, and nothing where none did or nothing waits.
func TestPrintExplanationOldestWait(t *testing.T) {
	for oldest, want := range map[float64]string{0: "", 12.34: "\n  the oldest waiting item has waited 12.3s\n"} {
		ex := &gpuscalerv1.Explanation{Effective: map[string]string{"queue": "q", "targetWait": "10s"}, Queue: &gpuscalerv1.QueueStatus{
			Namespace: "ml", Queue: "q", Waiting: 3, ArrivalRate: 2, ServiceSeconds: 5, OldestWaitSeconds: oldest, Stored: timestamppb.Now(), Age: durationpb.New(time.Second),
		}}
		var out strings.Builder
		printExplanation(&out, explainTarget{}, "scaler:9090", ex)
		if got := strings.Contains(out.String(), "oldest waiting"); got != (want != "") || !strings.Contains(out.String(), want) {
			t.Errorf("oldest wait %g s: explain output, want %q:\n%s", oldest, want, out.String())
		}
	}
}

// TestPrintExplanationColdStart: the text says the cold start queue-demand used and
// whose it is, and what each producer's last report carried.
func TestPrintExplanationColdStart(t *testing.T) {
	queue := func(c *gpuscalerv1.ColdStart) *gpuscalerv1.Explanation {
		return &gpuscalerv1.Explanation{
			Effective: map[string]string{"queue": "q", "targetWait": "10s"},
			Queue: &gpuscalerv1.QueueStatus{Namespace: "ml", Queue: "q", Stored: timestamppb.Now(), Age: durationpb.New(time.Second), ColdStart: c,
				Producers: []*gpuscalerv1.ProducerStatus{{ProducerId: "gw-1", Age: durationpb.New(time.Second), ColdStartSeconds: 31.5}}},
		}
	}
	for c, want := range map[*gpuscalerv1.ColdStart]string{
		nil: "  cold start unknown\n",
		{Seconds: 31.5, Source: "producer", ProducerId: "gw-1"}:            "  cold start 31.5s, measured by producer \"gw-1\"\n",
		{Seconds: 28, Source: "collector", Pod: "ml/llm-0", Node: "gpu-a"}: "  cold start 28s, measured by the collector of node gpu-a on pod ml/llm-0\n",
		{Seconds: 45, Source: "trigger"}:                                   "  cold start 45s, the trigger's coldStart key\n",
	} {
		var out strings.Builder
		printExplanation(&out, explainTarget{}, "scaler:9090", queue(c))
		for _, w := range []string{want, `producer "gw-1": 0 waiting + 0 in flight, measured cold start 31.5 s`} {
			if !strings.Contains(out.String(), w) {
				t.Errorf("explain output does not hold %q:\n%s", w, out.String())
			}
		}
	}
}
