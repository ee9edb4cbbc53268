package kubelet

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/gpuscaler/gpuscaler/collector/attribution"
	"github.com/gpuscaler/gpuscaler/collector/internal/collectortest"
	gpuscalerv1 "github.com/gpuscaler/gpuscaler/proto/gpuscaler/v1"
	"github.com/gpuscaler/gpuscaler/test/testkit"
)

// unimplementedAllocatable is a kubelet from before GetAllocatableResources existed.
type unimplementedAllocatable struct {
	podresourcesv1.UnimplementedPodResourcesListerServer
	list *podresourcesv1.ListPodResourcesResponse
}

func (k *unimplementedAllocatable) List(context.Context, *podresourcesv1.ListPodResourcesRequest) (*podresourcesv1.ListPodResourcesResponse, error) {
	return k.list, nil
}

func newTestPodResources(t *testing.T, cfg PodResourcesConfig) *PodResources {
	t.Helper()
	p, err := NewPodResources(cfg)
	if err != nil {
		t.Fatalf("NewPodResources: %v", err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// testNode is a node with three whole GPUs, three MIG slices of two profiles, CPUs and
// another vendor's device. GPU-c and MIG-2 are free; GPU-d is held by a pod but no
// longer allocatable (its device plugin marked it unhealthy).
func testNode() *collectortest.Kubelet {
	return &collectortest.Kubelet{
		Allocatable: &podresourcesv1.AllocatableResourcesResponse{
			Devices: []*podresourcesv1.ContainerDevices{
				collectortest.Devices("nvidia.com/gpu", "GPU-c", "GPU-a", "GPU-b"),
				collectortest.Devices("nvidia.com/mig-1g.10gb", "MIG-2", "MIG-1"),
				collectortest.Devices("nvidia.com/mig-3g.40gb", "MIG-3"),
				collectortest.Devices("example.com/fpga", "fpga-0", "fpga-1"),
			},
			CpuIds: []int64{0, 1, 2, 3, 4, 5, 6, 7},
			Memory: []*podresourcesv1.ContainerMemory{{MemoryType: "memory", Size: 64 << 30}},
		},
		Pods: &podresourcesv1.ListPodResourcesResponse{PodResources: []*podresourcesv1.PodResources{
			{Namespace: "ml", Name: "trainer-0", Containers: []*podresourcesv1.ContainerResources{
				collectortest.Container("trainer", collectortest.Devices("nvidia.com/gpu", "GPU-a", "GPU-b")),
				collectortest.Container("log-shipper"),
			}},
			{Namespace: "ml", Name: "infer-7d9f-x2x", Containers: []*podresourcesv1.ContainerResources{
				collectortest.Container("server", collectortest.Devices("nvidia.com/mig-1g.10gb", "MIG-1")),
				collectortest.Container("embedder", collectortest.Devices("nvidia.com/mig-3g.40gb", "MIG-3")),
			}},
			{Namespace: "fpga", Name: "synth", Containers: []*podresourcesv1.ContainerResources{
				collectortest.Container("main", collectortest.Devices("example.com/fpga", "fpga-0")),
			}},
			{Namespace: "ml", Name: "old-job", Containers: []*podresourcesv1.ContainerResources{
				collectortest.Container("main", collectortest.Devices("nvidia.com/gpu", "GPU-d")),
			}},
			{Namespace: "web", Name: "frontend", Containers: []*podresourcesv1.ContainerResources{
				collectortest.Container("nginx"),
			}},
		}},
	}
}

// dev is a Device as the tests compare it.
type dev struct{ Resource, ID, MIG string }

func (d dev) String() string {
	if d.MIG == "" {
		return d.Resource + " " + d.ID
	}
	return fmt.Sprintf("%s %s (%s)", d.Resource, d.ID, d.MIG)
}

func devs(ds []*gpuscalerv1.Device) []dev {
	out := []dev{}
	for _, d := range ds {
		out = append(out, dev{d.GetResource(), d.GetId(), d.GetMigProfile()})
	}
	return out
}

var (
	gpuA = dev{"nvidia.com/gpu", "GPU-a", ""}
	gpuB = dev{"nvidia.com/gpu", "GPU-b", ""}
	gpuC = dev{"nvidia.com/gpu", "GPU-c", ""}
	gpuD = dev{"nvidia.com/gpu", "GPU-d", ""}
	mig1 = dev{"nvidia.com/mig-1g.10gb", "MIG-1", "1g.10gb"}
	mig2 = dev{"nvidia.com/mig-1g.10gb", "MIG-2", "1g.10gb"}
	mig3 = dev{"nvidia.com/mig-3g.40gb", "MIG-3", "3g.40gb"}
	fpg0 = dev{"example.com/fpga", "fpga-0", ""}
	fpg1 = dev{"example.com/fpga", "fpga-1", ""}

	holderGPUA = attribution.Holder{Namespace: "ml", Pod: "trainer-0", Container: "trainer"}
	holderGPUD = attribution.Holder{Namespace: "ml", Pod: "old-job", Container: "main"}
	holderMIG1 = attribution.Holder{Namespace: "ml", Pod: "infer-7d9f-x2x", Container: "server"}
	holderMIG3 = attribution.Holder{Namespace: "ml", Pod: "infer-7d9f-x2x", Container: "embedder"}
	holderFPGA = attribution.Holder{Namespace: "fpga", Pod: "synth", Container: "main"}
)

// checkAllocation compares a against the wanted devices and holders, and checks that
// Allocated shares its Device values with Allocatable.
func checkAllocation(t *testing.T, a *attribution.Allocation, allocatable, allocated []dev, holders map[string]attribution.Holder) {
	t.Helper()
	if got := devs(a.Allocatable); !slices.Equal(got, allocatable) {
		t.Errorf("Allocatable:\n got %v\nwant %v", got, allocatable)
	}
	if got := devs(a.Allocated); !slices.Equal(got, allocated) {
		t.Errorf("Allocated:\n got %v\nwant %v", got, allocated)
	}
	want := make(map[string][]attribution.Holder, len(holders))
	for id, h := range holders {
		want[id] = []attribution.Holder{h}
	}
	if !maps.EqualFunc(a.Holders, want, slices.Equal) {
		t.Errorf("Holders:\n got %v\nwant %v", a.Holders, want)
	}
	for _, d := range a.Allocated {
		if !slices.Contains(a.Allocatable, d) {
			t.Errorf("Allocated device %s is not one of Allocatable's values", d.GetId())
		}
	}
}

func TestPodResourcesAllocation(t *testing.T) {
	sock := collectortest.SocketPath(t)
	collectortest.ServeKubelet(t, sock, testNode())

	tests := map[string]struct {
		resources              []string
		allocatable, allocated []dev
		holders                map[string]attribution.Holder
	}{
		"default resources: whole GPUs and MIG slices": {
			allocatable: []dev{gpuA, gpuB, gpuC, gpuD, mig1, mig2, mig3},
			allocated:   []dev{gpuA, gpuB, gpuD, mig1, mig3},
			holders: map[string]attribution.Holder{
				"GPU-a": holderGPUA, "GPU-b": holderGPUA, "GPU-d": holderGPUD,
				"MIG-1": holderMIG1, "MIG-3": holderMIG3,
			},
		},
		"whole GPUs only": {
			resources:   []string{"nvidia.com/gpu"},
			allocatable: []dev{gpuA, gpuB, gpuC, gpuD},
			allocated:   []dev{gpuA, gpuB, gpuD},
			holders:     map[string]attribution.Holder{"GPU-a": holderGPUA, "GPU-b": holderGPUA, "GPU-d": holderGPUD},
		},
		"one MIG profile and another vendor's device": {
			resources:   []string{"nvidia.com/mig-1g.10gb", "example.com/*"},
			allocatable: []dev{fpg0, fpg1, mig1, mig2},
			allocated:   []dev{fpg0, mig1},
			holders:     map[string]attribution.Holder{"MIG-1": holderMIG1, "fpga-0": holderFPGA},
		},
		"nothing on the node matches": {
			resources:   []string{"amd.com/gpu"},
			allocatable: []dev{},
			allocated:   []dev{},
			holders:     map[string]attribution.Holder{},
		},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			p := newTestPodResources(t, PodResourcesConfig{Socket: sock, Resources: tt.resources})
			a, err := p.Allocation(t.Context())
			if err != nil {
				t.Fatalf("Allocation: %v", err)
			}
			checkAllocation(t, a, tt.allocatable, tt.allocated, tt.holders)
		})
	}
}

func TestPodResourcesBuildAllocation(t *testing.T) {
	pod := func(ns, name string, cs ...*podresourcesv1.ContainerResources) *podresourcesv1.PodResources {
		return &podresourcesv1.PodResources{Namespace: ns, Name: name, Containers: cs}
	}
	tests := map[string]struct {
		allocatable            []*podresourcesv1.ContainerDevices
		pods                   []*podresourcesv1.PodResources
		wantAllocatable, wantA []dev
		wantHolders            map[string]attribution.Holder
	}{
		"empty node": {
			wantAllocatable: []dev{}, wantA: []dev{}, wantHolders: map[string]attribution.Holder{},
		},
		"device passed from an init container to the app container is held once": {
			allocatable: []*podresourcesv1.ContainerDevices{collectortest.Devices("nvidia.com/gpu", "GPU-a")},
			pods: []*podresourcesv1.PodResources{pod("ml", "p",
				collectortest.Container("app", collectortest.Devices("nvidia.com/gpu", "GPU-a")),
				collectortest.Container("sidecar", collectortest.Devices("nvidia.com/gpu", "GPU-a")))},
			wantAllocatable: []dev{gpuA}, wantA: []dev{gpuA},
			wantHolders: map[string]attribution.Holder{"GPU-a": {Namespace: "ml", Pod: "p", Container: "app"}},
		},
		"held but not allocatable counts on both sides": {
			allocatable:     []*podresourcesv1.ContainerDevices{collectortest.Devices("nvidia.com/gpu", "GPU-a")},
			pods:            []*podresourcesv1.PodResources{pod("ml", "p", collectortest.Container("c", collectortest.Devices("nvidia.com/mig-1g.10gb", "MIG-1")))},
			wantAllocatable: []dev{gpuA, mig1}, wantA: []dev{mig1},
			wantHolders: map[string]attribution.Holder{"MIG-1": {Namespace: "ml", Pod: "p", Container: "c"}},
		},
		"a device listed under two resources keeps its first": {
			allocatable: []*podresourcesv1.ContainerDevices{
				collectortest.Devices("nvidia.com/gpu", "GPU-a"), collectortest.Devices("nvidia.com/mig-1g.10gb", "GPU-a"),
			},
			wantAllocatable: []dev{gpuA}, wantA: []dev{}, wantHolders: map[string]attribution.Holder{},
		},
	}
	match, err := newResourceMatcher(DefaultPodResources)
	if err != nil {
		t.Fatal(err)
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			a := buildAllocation(tt.allocatable, tt.pods, match)
			checkAllocation(t, a, tt.wantAllocatable, tt.wantA, tt.wantHolders)
		})
	}
}

func TestPodResourcesAllocatableUnsupported(t *testing.T) {
	tests := map[string]podresourcesv1.PodResourcesListerServer{
		// A kubelet older than Kubernetes 1.21 has no such method.
		"Unimplemented": &unimplementedAllocatable{list: testNode().Pods},
		// Kubelets 1.21 to 1.27 answer so when the feature gate is off.
		"feature gate off": func() *collectortest.Kubelet {
			k := testNode()
			k.AllocatableErr = errors.New("Pod Resources API GetAllocatableResources disabled")
			return k
		}(),
	}
	for name, srv := range tests {
		t.Run(name, func(t *testing.T) {
			sock := collectortest.SocketPath(t)
			collectortest.ServeKubelet(t, sock, srv)
			var logs testkit.SyncBuffer
			log := slog.New(slog.NewTextHandler(&logs, nil))
			p := newTestPodResources(t, PodResourcesConfig{Socket: sock, Log: log})
			for range 3 {
				a, err := p.Allocation(t.Context())
				if err != nil {
					t.Fatalf("Allocation: %v", err)
				}
				// Only what the pods hold is known to be allocatable.
				checkAllocation(t, a,
					[]dev{gpuA, gpuB, gpuD, mig1, mig3},
					[]dev{gpuA, gpuB, gpuD, mig1, mig3},
					map[string]attribution.Holder{
						"GPU-a": holderGPUA, "GPU-b": holderGPUA, "GPU-d": holderGPUD,
						"MIG-1": holderMIG1, "MIG-3": holderMIG3,
					})
			}
			if k, ok := srv.(*collectortest.Kubelet); ok {
				if got := k.AllocatableCalls.Load(); got != 1 {
					t.Errorf("GetAllocatableResources called %d times, want 1", got)
				}
			}
			lines := strings.Split(strings.TrimSpace(logs.String()), "\n")
			if len(lines) != 1 || !strings.Contains(lines[0], "does not list allocatable devices") {
				t.Errorf("log: got %q, want one line saying allocatable devices are not listed", lines)
			}
		})
	}
}

func TestPodResourcesErrors(t *testing.T) {
	t.Run("socket missing", func(t *testing.T) {
		sock := collectortest.SocketPath(t)
		p := newTestPodResources(t, PodResourcesConfig{Socket: sock})
		_, err := p.Allocation(t.Context())
		if !errors.Is(err, ErrNoPodResourcesSocket) {
			t.Fatalf("got %v, want ErrNoPodResourcesSocket", err)
		}
		if want := "is the kubelet's pod-resources socket mounted at " + sock + "?"; !strings.Contains(err.Error(), want) {
			t.Errorf("got %q, want it to ask %q", err, want)
		}

		// A kubelet that comes (back) is found without a new PodResources.
		collectortest.ServeKubelet(t, sock, testNode())
		testkit.Eventually(t, 10*time.Second, func() bool {
			_, err = p.Allocation(t.Context())
			return err == nil
		})
	})

	t.Run("kubelet error", func(t *testing.T) {
		sock := collectortest.SocketPath(t)
		k := testNode()
		k.AllocatableErr = status.Error(codes.PermissionDenied, "no")
		collectortest.ServeKubelet(t, sock, k)
		p := newTestPodResources(t, PodResourcesConfig{Socket: sock})
		_, err := p.Allocation(t.Context())
		if got := status.Code(err); got != codes.PermissionDenied {
			t.Errorf("code: got %s, want PermissionDenied (%v)", got, err)
		}
		if !strings.Contains(err.Error(), sock) || !strings.Contains(err.Error(), "GetAllocatableResources") {
			t.Errorf("got %q, want it to name the socket and the call", err)
		}
	})

	t.Run("timeout", func(t *testing.T) {
		sock := collectortest.SocketPath(t)
		k := testNode()
		k.Block = true
		collectortest.ServeKubelet(t, sock, k)
		p := newTestPodResources(t, PodResourcesConfig{Socket: sock, Timeout: 100 * time.Millisecond})
		_, err := p.Allocation(t.Context())
		if got := status.Code(err); got != codes.DeadlineExceeded {
			t.Errorf("code: got %s, want DeadlineExceeded (%v)", got, err)
		}
		if want := "no answer within 100ms"; err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("got %v, want it to say %q", err, want)
		}
		// The kubelet saw the call end: the deadline travelled with it.
		testkit.Eventually(t, 5*time.Second, func() bool { return k.Cancelled.Load() == 1 })
	})

	t.Run("caller's deadline", func(t *testing.T) {
		sock := collectortest.SocketPath(t)
		k := testNode()
		k.Block = true
		collectortest.ServeKubelet(t, sock, k)
		p := newTestPodResources(t, PodResourcesConfig{Socket: sock, Timeout: time.Minute})
		ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
		defer cancel()
		_, err := p.Allocation(ctx)
		if got := status.Code(err); got != codes.DeadlineExceeded {
			t.Errorf("code: got %s, want DeadlineExceeded (%v)", got, err)
		}
		if err != nil && strings.Contains(err.Error(), "no answer within") {
			t.Errorf("got %q, want no mention of the call's own timeout: the caller's deadline ended it", err)
		}
	})
}

func TestNewPodResourcesConfig(t *testing.T) {
	tests := map[string]struct {
		cfg     PodResourcesConfig
		wantErr string // empty: no error
	}{
		"zero value":              {},
		"prefix pattern":          {cfg: PodResourcesConfig{Resources: []string{"nvidia.com/*"}}},
		"relative socket":         {cfg: PodResourcesConfig{Socket: "kubelet.sock"}},
		"star alone":              {cfg: PodResourcesConfig{Resources: []string{"*"}}, wantErr: `pattern "*"`},
		"empty pattern":           {cfg: PodResourcesConfig{Resources: []string{"nvidia.com/gpu", ""}}, wantErr: `pattern ""`},
		"star inside the pattern": {cfg: PodResourcesConfig{Resources: []string{"nvidia.com/mig-*.10gb"}}, wantErr: "may only end"},
		"negative timeout":        {cfg: PodResourcesConfig{Timeout: -time.Second}, wantErr: "timeout -1s"},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			p, err := NewPodResources(tt.cfg)
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("got %v, want no error", err)
				}
				p.Close()
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				if p != nil {
					p.Close()
				}
				t.Fatalf("got %v, want an error with %q", err, tt.wantErr)
			}
		})
	}

	p := newTestPodResources(t, PodResourcesConfig{})
	if p.socket != DefaultPodResourcesSocket || p.timeout != DefaultPodResourcesTimeout {
		t.Errorf("defaults: got socket %s, timeout %s; want %s, %s", p.socket, p.timeout, DefaultPodResourcesSocket, DefaultPodResourcesTimeout)
	}
}
