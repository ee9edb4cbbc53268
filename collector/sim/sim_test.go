package sim

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/gpuscaler/gpuscaler/collector/attribution"
	gpuscalerv1 "github.com/gpuscaler/gpuscaler/proto/gpuscaler/v1"
)

func ptr(v float64) *float64 { return &v }

// simNode is the simulated node the collector tests use: two llm pods in ml on GPUs 0–2,
// a pod of another namespace with the same labels on GPU 3, GPU 7 in MIG mode with one of
// its three slices held, GPUs 4–6 free.
func simNode() Config {
	return Config{
		GPUs: 8,
		MIG:  map[int][]string{7: {"1g.10gb", "1g.10gb", "3g.40gb"}},
		Pods: []Pod{
			{Namespace: "ml", Name: "llm-0", Labels: map[string]string{"app": "llm"}, OwnerKind: "Deployment", OwnerName: "llm", GPUs: []string{"0", "1"}, Util: ptr(80)},
			{Namespace: "ml", Name: "llm-1", Labels: map[string]string{"app": "llm"}, OwnerKind: "Deployment", OwnerName: "llm", GPUs: []string{"2"}, Util: ptr(40)},
			{Namespace: "other", Name: "llm-0", Labels: map[string]string{"app": "llm"}, GPUs: []string{"3"}, Util: ptr(100)},
			{Namespace: "ml", Name: "tiny-0", Labels: map[string]string{"app": "tiny"}, GPUs: []string{"7/0"}, Util: ptr(30)},
		},
		Seed: 1,
	}
}

func TestCollectAndAllocation(t *testing.T) {
	s, err := New("gpu-node-1", simNode())
	if err != nil {
		t.Fatal(err)
	}
	samples, err := s.Collect(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(samples) != 10 { // 7 whole GPUs and 3 slices
		t.Fatalf("got %d samples, want 10", len(samples))
	}
	if err := (&gpuscalerv1.NodeReport{Node: "gpu-node-1", Gpus: samples}).Validate(); err != nil {
		t.Fatal(err)
	}
	if u := samples[0].GetGpuUtil(); u != 80 {
		t.Errorf("GPU 0 (llm-0, 80%%, no jitter) util %v, want 80", u)
	}
	if u := samples[4].GetGpuUtil(); u != 0 {
		t.Errorf("free GPU 4 util %v, want 0", u)
	}
	slice := samples[7]
	if slice.GetMigProfile() != "1g.10gb" || slice.GetMigInstanceId() != 1 || !strings.HasPrefix(slice.GetDeviceId(), "MIG-") ||
		slice.GetFbTotalBytes() != 10<<30 || slice.GetIndex() != 7 {
		t.Errorf("first slice of GPU 7: %v", slice)
	}

	a, err := s.Allocation(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(a.Allocatable) != 10 || len(a.Allocated) != 5 {
		t.Fatalf("allocatable %d, allocated %d; want 10 and 5", len(a.Allocatable), len(a.Allocated))
	}
	if h := a.Holders[slice.GetDeviceId()]; !slices.Equal(h, []attribution.Holder{{Namespace: "ml", Pod: "tiny-0", Container: "main"}}) {
		t.Errorf("holder of slice 7/0: %+v", h)
	}
	if a.Allocatable[7].GetResource() != "nvidia.com/mig-1g.10gb" || a.Allocatable[7].GetMigProfile() != "1g.10gb" {
		t.Errorf("slice device: %v", a.Allocatable[7])
	}
	if info, ok := s.Pod("ml", "llm-0"); !ok || info.Labels["app"] != "llm" || info.OwnerKind != "Deployment" || info.OwnerName != "llm" {
		t.Errorf("Pod(ml, llm-0) = %+v, %v", info, ok)
	}
	if _, ok := s.Pod("ml", "absent"); ok {
		t.Error("Pod(ml, absent) found a pod")
	}
}

func TestIsDeterministic(t *testing.T) {
	collect := func(seed uint64, n int) []*gpuscalerv1.GPUSample {
		cfg := simNode()
		cfg.Jitter, cfg.Seed = 10, seed
		s, err := New("n", cfg)
		if err != nil {
			t.Fatal(err)
		}
		var out []*gpuscalerv1.GPUSample
		for range n {
			samples, _ := s.Collect(context.Background())
			out = append(out, samples...)
		}
		return out
	}
	a, b, c := collect(7, 3), collect(7, 3), collect(8, 3)
	same := func(x, y []*gpuscalerv1.GPUSample) bool {
		for i := range x {
			if !proto.Equal(x[i], y[i]) {
				return false
			}
		}
		return true
	}
	if !same(a, b) {
		t.Error("two simulations with seed 7 differ")
	}
	if same(a, c) {
		t.Error("seeds 7 and 8 gave the same readings")
	}
	for _, g := range a {
		if u := g.GetGpuUtil(); u < 0 || u > 100 {
			t.Fatalf("util %v outside 0–100", u)
		}
	}
}

func TestConfigErrors(t *testing.T) {
	tests := map[string]struct {
		mutate func(*Config)
		want   string
	}{
		"unknown GPU":          {func(c *Config) { c.Pods[0].GPUs = []string{"9"} }, `device "9"`},
		"whole GPU in MIG":     {func(c *Config) { c.Pods[0].GPUs = []string{"7"} }, `device "7"`},
		"held twice":           {func(c *Config) { c.Pods[1].GPUs = []string{"0"} }, "held by both"},
		"bad profile":          {func(c *Config) { c.MIG[7] = []string{"big"} }, `MIG profile "big"`},
		"MIG on a missing GPU": {func(c *Config) { c.MIG[12] = []string{"1g.10gb"} }, "GPU 12"},
		"pod without name":     {func(c *Config) { c.Pods[0].Name = "" }, "want a namespace and a name"},
		"too many GPUs":        {func(c *Config) { c.GPUs = 1000 }, "at most 256"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			cfg := simNode()
			tc.mutate(&cfg)
			if _, err := New("n", cfg); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("New error %v, want one containing %q", err, tc.want)
			}
		})
	}
}

func TestHandlerAndFile(t *testing.T) {
	s, err := New("n", Config{GPUs: 2})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(s.Handler())
	defer srv.Close()
	put := func(body string) int {
		req, _ := http.NewRequest(http.MethodPut, srv.URL, strings.NewReader(body))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := put("gpus: 2\npods: [{namespace: ml, name: p, gpus: [\"1\"], util: 55}]\n"); code != http.StatusNoContent {
		t.Fatalf("PUT of a good config: %d", code)
	}
	samples, _ := s.Collect(context.Background())
	if samples[1].GetGpuUtil() != 55 {
		t.Fatalf("after PUT, GPU 1 util %v, want 55", samples[1].GetGpuUtil())
	}
	if code := put("gpus: 2\nnodeLabels: {pool: a100}\npods: [{namespace: ml, name: p, gpus: [\"1\"], util: 55}]\n"); code != http.StatusNoContent {
		t.Fatalf("PUT with node labels: %d", code)
	}
	if got := s.Labels()["pool"]; got != "a100" {
		t.Fatalf("after PUT, node label pool = %q, want a100", got)
	}
	if code := put("gpus: 2\npods: [{namespace: ml, name: p, gpus: [\"5\"]}]\n"); code != http.StatusBadRequest {
		t.Fatalf("PUT of a bad config: %d, want 400", code)
	}
	if code := put("gpus: 2\nunknownKey: 1\n"); code != http.StatusBadRequest {
		t.Fatalf("PUT with an unknown key: %d, want 400", code)
	}
	if got := s.Config().Pods[0].GPUs[0]; got != "1" {
		t.Fatalf("a bad PUT changed the config: pod on GPU %q", got)
	}

	path := filepath.Join(t.TempDir(), "sim.yaml")
	if err := os.WriteFile(path, []byte("gpus: 4\nutil: 20\nmig: {3: [1g.10gb, 1g.10gb]}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := LoadConfig(path)
	if err != nil || cfg.GPUs != 4 || cfg.Util != 20 || len(cfg.MIG[3]) != 2 {
		t.Fatalf("LoadConfig = %+v, %v", cfg, err)
	}
}

// TestTimeSlicing: with replicas, each whole GPU is offered as "<uuid>::<n>"
// (k8s-device-plugin NewAnnotatedID), several pods may name it, it runs at the sum of
// their utilisations, and PodUsage gives each pod its own.
func TestTimeSlicing(t *testing.T) {
	util := func(v float64) *float64 { return &v }
	s, err := New("n1", Config{GPUs: 2, Replicas: 4, Pods: []Pod{
		{Namespace: "ml", Name: "a", GPUs: []string{"0"}, Util: util(30)},
		{Namespace: "ml", Name: "b", GPUs: []string{"0"}, Util: util(50)},
		{Namespace: "ml", Name: "c", GPUs: []string{"1"}, Util: util(20)},
	}})
	if err != nil {
		t.Fatal(err)
	}
	a, err := s.Allocation(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if len(a.Allocatable) != 8 || len(a.Allocated) != 3 {
		t.Fatalf("allocatable %d, allocated %d; want 8, 3", len(a.Allocatable), len(a.Allocated))
	}
	samples, _ := s.Collect(t.Context())
	gpu0 := samples[0].GetUuid()
	if got := a.Allocated[0].GetId(); got != gpu0+"::0" {
		t.Fatalf("first allocated %q, want %q", got, gpu0+"::0")
	}
	if got := samples[0].GetGpuUtil(); got != 80 {
		t.Fatalf("GPU 0 util %v, want 80 (30 + 50)", got)
	}
	ua, _ := s.Pod("ml", "a")
	ub, _ := s.Pod("ml", "b")
	usage := s.PodUsage()
	if got := usage[gpu0]; len(got) != 2 || got[ua.UID] != 30 || got[ub.UID] != 50 {
		t.Fatalf("usage of GPU 0: %v, want a 30 and b 50", got)
	}
	if _, ok := usage[samples[1].GetUuid()]; ok {
		t.Fatal("GPU 1, held by one pod, has per-pod usage; want none")
	}
	if _, err := New("n1", Config{GPUs: 1, Replicas: 2, Pods: []Pod{
		{Namespace: "ml", Name: "a", GPUs: []string{"0"}}, {Namespace: "ml", Name: "b", GPUs: []string{"0"}}, {Namespace: "ml", Name: "c", GPUs: []string{"0"}},
	}}); err == nil || !strings.Contains(err.Error(), "more than its 2 replicas") {
		t.Fatalf("three pods on two replicas: %v", err)
	}
}

// TestResources: a simulated node reports the CPU and memory its configuration gives,
// as quantities, and none (unknown) when it gives none; a quantity that does not parse,
// or a figure beyond a NodeReport's bounds, is refused.
func TestResources(t *testing.T) {
	sim, err := New("n1", Config{GPUs: 1, Resources: &Resources{CPU: "191500m", Memory: "2Ti", CPURequested: "8", MemoryRequested: "64Gi"}})
	if err != nil {
		t.Fatal(err)
	}
	want := &gpuscalerv1.NodeResources{CpuAllocatableMillis: 191_500, MemoryAllocatableBytes: 2 << 40, CpuRequestedMillis: 8000, MemoryRequestedBytes: 64 << 30}
	if got := sim.Resources(); !proto.Equal(got, want) {
		t.Fatalf("Resources() = %v, want %v", got, want)
	}
	if err := sim.SetConfig(Config{GPUs: 1, Resources: &Resources{CPU: "4", Memory: "1Gi"}}); err != nil {
		t.Fatal(err)
	}
	if got := sim.Resources(); got.GetCpuRequestedMillis() != 0 || got.GetMemoryAllocatableBytes() != 1<<30 {
		t.Fatalf("Resources() = %v, want nothing requested", got)
	}
	if err := sim.SetConfig(Config{GPUs: 1}); err != nil || sim.Resources() != nil {
		t.Fatalf("no resources configured: Resources() = %v, %v; want nil (unknown)", sim.Resources(), err)
	}
	pods := []Pod{{Namespace: "ml", Name: "a", GPUs: []string{"0"}, CPU: "500m", Memory: "1Gi"}, {Namespace: "ml", Name: "b", Memory: "1Gi"}}
	if err := sim.SetConfig(Config{GPUs: 1, Pods: pods, Resources: &Resources{CPU: "4", Memory: "8Gi", CPURequested: "1"}}); err != nil {
		t.Fatal(err)
	}
	if got := sim.Resources(); got.GetCpuRequestedMillis() != 1500 || got.GetMemoryRequestedBytes() != 2<<30 {
		t.Fatalf("Resources() = %v, want the pods' requests added to the node's", got)
	}
	for _, bad := range []*Resources{
		{CPU: "lots", Memory: "1Gi"},
		{CPU: "4"},
		{CPU: "4", Memory: "1Gi", CPURequested: "-1"},
		{CPU: "4", Memory: "2Pi"},
		{CPU: "4", Memory: "1Gi", CPURequested: "9Ei"},
	} {
		if err := sim.SetConfig(Config{GPUs: 1, Resources: bad}); err == nil {
			t.Errorf("SetConfig with resources %+v: nil error, want one", *bad)
		}
	}
}
