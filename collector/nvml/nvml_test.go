//go:build cgo

package nvml

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/protobuf/proto"

	"github.com/gpuscaler/gpuscaler/collector/internal/collectortest"
	"github.com/gpuscaler/gpuscaler/collector/sourceerr"
	gpuscalerv1 "github.com/gpuscaler/gpuscaler/proto/gpuscaler/v1"
)

// These tests read an 8×A100-SXM4-40GB server built from go-nvml's own moq mocks
// (pkg/nvml/mock), modelled on its mock/dgxa100 server. dgxa100 itself is not used: it
// imports github.com/google/uuid, which this module's go.sum does not carry, and it
// models neither MIG device handles nor utilisation, power, temperature or events: a
// moq mock panics on any method whose func is not set.

const mockA100Memory = 40960 << 20 // bytes, as NVML reports an A100-SXM4-40GB

// mockA100Profiles are an A100 40GB's GPU-instance profiles by nvml.GPU_INSTANCE_PROFILE_*
// index, with the ids, slices and memory (MiB) NVML reports for them (nvidia-smi mig
// -lgip). Unlike dgxa100's table, the ids are the real ones, which are not the indexes.
var mockA100Profiles = map[int]nvml.GpuInstanceProfileInfo{
	nvml.GPU_INSTANCE_PROFILE_1_SLICE:      {Id: 19, SliceCount: 1, InstanceCount: 7, MemorySizeMB: 4864},
	nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV1: {Id: 20, SliceCount: 1, InstanceCount: 1, MemorySizeMB: 4864},
	nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV2: {Id: 15, SliceCount: 1, InstanceCount: 4, MemorySizeMB: 9856},
	nvml.GPU_INSTANCE_PROFILE_2_SLICE:      {Id: 14, SliceCount: 2, InstanceCount: 3, MemorySizeMB: 9856},
	nvml.GPU_INSTANCE_PROFILE_3_SLICE:      {Id: 9, SliceCount: 3, InstanceCount: 2, MemorySizeMB: 19968},
	nvml.GPU_INSTANCE_PROFILE_4_SLICE:      {Id: 5, SliceCount: 4, InstanceCount: 1, MemorySizeMB: 19968},
	nvml.GPU_INSTANCE_PROFILE_7_SLICE:      {Id: 0, SliceCount: 7, InstanceCount: 1, MemorySizeMB: 40192},
}

// mockNode is a mock NVML library with its GPUs and one event set.
type mockNode struct {
	lib  *mock.Interface
	gpus []*mockGPU
	set  *mock.EventSet

	mu     sync.Mutex // guards queued
	queued []nvml.EventData
}

type mockGPU struct {
	*mock.Device
	index   int
	uuid    string
	migMode int
	migs    map[int]*mockMIG // by MIG device index
	// processes is the driver's buffer of per-process samples, which
	// GetProcessUtilization answers from as NVML does: those after the timestamp it is
	// given, or ERROR_NOT_FOUND.
	processes []nvml.ProcessUtilizationSample
	since     []uint64 // the timestamps GetProcessUtilization was asked with
}

type mockMIG struct {
	*mock.Device
	uuid    string
	gi, ci  uint32
	profile int // GPU_INSTANCE_PROFILE_* index
}

// mockMinor is the minor number (/dev/nvidiaN) of mock GPU i: not i, as on hosts where
// NVML's PCI order and the driver's numbering differ, so a test cannot pass on the index.
func mockMinor(i int) uint32 { return uint32(i ^ 1) }

// newMockNode returns n A100s, each answering every reading Collect takes: GPU i
// uses i GiB, runs at 10i+5 % and 60+i W, at 30+i °C, and has no process sample.
func newMockNode(n int) *mockNode {
	node := &mockNode{}
	node.set = &mock.EventSet{
		WaitFunc: func(uint32) (nvml.EventData, nvml.Return) {
			node.mu.Lock()
			defer node.mu.Unlock()
			if len(node.queued) == 0 {
				return nvml.EventData{}, nvml.ERROR_TIMEOUT
			}
			e := node.queued[0]
			node.queued = node.queued[1:]
			return e, nvml.SUCCESS
		},
		FreeFunc: func() nvml.Return { return nvml.SUCCESS },
	}
	for i := range n {
		node.gpus = append(node.gpus, newMockGPU(i))
	}
	node.lib = &mock.Interface{
		InitFunc:           func() nvml.Return { return nvml.SUCCESS },
		ShutdownFunc:       func() nvml.Return { return nvml.SUCCESS },
		DeviceGetCountFunc: func() (int, nvml.Return) { return len(node.gpus), nvml.SUCCESS },
		DeviceGetHandleByIndexFunc: func(i int) (nvml.Device, nvml.Return) {
			if i < 0 || i >= len(node.gpus) {
				return nil, nvml.ERROR_INVALID_ARGUMENT
			}
			return node.gpus[i], nvml.SUCCESS
		},
		EventSetCreateFunc: func() (nvml.EventSet, nvml.Return) { return node.set, nvml.SUCCESS },
	}
	return node
}

func newMockGPU(i int) *mockGPU {
	g := &mockGPU{index: i, uuid: fmt.Sprintf("GPU-%08x-a100-4000-8000-%012x", i, i), migs: map[int]*mockMIG{}}
	used := uint64(i) << 30
	g.Device = &mock.Device{
		GetUUIDFunc: func() (string, nvml.Return) { return g.uuid, nvml.SUCCESS },
		GetNameFunc: func() (string, nvml.Return) { return "NVIDIA A100-SXM4-40GB", nvml.SUCCESS },
		GetMemoryInfoFunc: func() (nvml.Memory, nvml.Return) {
			return nvml.Memory{Total: mockA100Memory, Used: used, Free: mockA100Memory - used}, nvml.SUCCESS
		},
		GetUtilizationRatesFunc: func() (nvml.Utilization, nvml.Return) {
			if g.migMode == nvml.DEVICE_MIG_ENABLE {
				return nvml.Utilization{}, nvml.ERROR_NOT_SUPPORTED // as NVML answers in MIG mode
			}
			return nvml.Utilization{Gpu: uint32(10*i + 5), Memory: 1}, nvml.SUCCESS
		},
		GetMinorNumberFunc: func() (int, nvml.Return) { return int(mockMinor(i)), nvml.SUCCESS },
		GetPowerUsageFunc:  func() (uint32, nvml.Return) { return uint32(60000 + 1000*i), nvml.SUCCESS },
		GetTemperatureFunc: func(nvml.TemperatureSensors) (uint32, nvml.Return) { return uint32(30 + i), nvml.SUCCESS },
		GetMigModeFunc:     func() (int, int, nvml.Return) { return g.migMode, g.migMode, nvml.SUCCESS },
		GetProcessUtilizationFunc: func(since uint64) ([]nvml.ProcessUtilizationSample, nvml.Return) {
			g.since = append(g.since, since)
			var out []nvml.ProcessUtilizationSample
			for _, p := range g.processes {
				if p.TimeStamp > since {
					out = append(out, p)
				}
			}
			if len(out) == 0 {
				return nil, nvml.ERROR_NOT_FOUND
			}
			return out, nvml.SUCCESS
		},
		RegisterEventsFunc:       func(uint64, nvml.EventSet) nvml.Return { return nvml.SUCCESS },
		GetMaxMigDeviceCountFunc: func() (int, nvml.Return) { return 7, nvml.SUCCESS },
		GetMigDeviceHandleByIndexFunc: func(j int) (nvml.Device, nvml.Return) {
			if m, ok := g.migs[j]; ok {
				return m, nvml.SUCCESS
			}
			return nil, nvml.ERROR_NOT_FOUND
		},
		GetGpuInstanceByIdFunc: func(id int) (nvml.GpuInstance, nvml.Return) {
			for _, m := range g.migs {
				if int(m.gi) == id {
					info := nvml.GpuInstanceInfo{Device: g, Id: m.gi, ProfileId: mockA100Profiles[m.profile].Id}
					return &mock.GpuInstance{GetInfoFunc: func() (nvml.GpuInstanceInfo, nvml.Return) { return info, nvml.SUCCESS }}, nvml.SUCCESS
				}
			}
			return nil, nvml.ERROR_NOT_FOUND
		},
		GetGpuInstanceProfileInfoFunc: func(p int) (nvml.GpuInstanceProfileInfo, nvml.Return) {
			if p < 0 || p >= nvml.GPU_INSTANCE_PROFILE_COUNT {
				return nvml.GpuInstanceProfileInfo{}, nvml.ERROR_INVALID_ARGUMENT
			}
			info, ok := mockA100Profiles[p]
			if !ok {
				return nvml.GpuInstanceProfileInfo{}, nvml.ERROR_NOT_SUPPORTED
			}
			return info, nvml.SUCCESS
		},
	}
	return g
}

// addMIG puts MIG mode on and a MIG device at index slot: GPU instance gi of the
// given profile, with a compute instance of ciSlices (0: the whole GPU instance),
// using 1 GiB. Like a real MIG handle, it answers no utilisation, power, temperature
// or per-process samples (the mock would panic if asked).
func (g *mockGPU) addMIG(slot int, gi uint32, profile int, ciSlices uint32) *mockMIG {
	p := mockA100Profiles[profile]
	if ciSlices == 0 {
		ciSlices = p.SliceCount
	}
	m := &mockMIG{uuid: fmt.Sprintf("MIG-%08x-a100-4000-8000-%012x", g.index, slot), gi: gi, profile: profile}
	m.Device = &mock.Device{
		GetUUIDFunc:              func() (string, nvml.Return) { return m.uuid, nvml.SUCCESS },
		GetGpuInstanceIdFunc:     func() (int, nvml.Return) { return int(m.gi), nvml.SUCCESS },
		GetComputeInstanceIdFunc: func() (int, nvml.Return) { return int(m.ci), nvml.SUCCESS },
		GetAttributesFunc: func() (nvml.DeviceAttributes, nvml.Return) {
			return nvml.DeviceAttributes{
				GpuInstanceSliceCount: p.SliceCount, ComputeInstanceSliceCount: ciSlices, MemorySizeMB: p.MemorySizeMB,
			}, nvml.SUCCESS
		},
		GetMemoryInfoFunc: func() (nvml.Memory, nvml.Return) {
			total := p.MemorySizeMB << 20
			return nvml.Memory{Total: total, Used: 1 << 30, Free: total - 1<<30}, nvml.SUCCESS
		},
	}
	g.migMode = nvml.DEVICE_MIG_ENABLE
	g.migs[slot] = m
	return m
}

func (n *mockNode) queue(events ...nvml.EventData) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.queued = append(n.queued, events...)
}

func (n *mockNode) source(t testing.TB) *Source {
	t.Helper()
	return n.sourceWith(t, Config{})
}

func (n *mockNode) sourceWith(t testing.TB, cfg Config) *Source {
	t.Helper()
	s, err := newSource(n.lib, cfg)
	if err != nil {
		t.Fatalf("newSource: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// wantGPU is the sample of mock GPU i, whole.
func (n *mockNode) wantGPU(i int) *gpuscalerv1.GPUSample {
	return &gpuscalerv1.GPUSample{
		Uuid:               n.gpus[i].uuid,
		Index:              uint32(i),
		Model:              "NVIDIA A100-SXM4-40GB",
		Minor:              proto.Uint32(mockMinor(i)),
		GpuUtil:            proto.Float64(float64(10*i + 5)),
		FbUsedBytes:        proto.Uint64(uint64(i) << 30),
		FbTotalBytes:       proto.Uint64(mockA100Memory),
		PowerWatts:         proto.Float64(float64(60 + i)),
		TemperatureCelsius: proto.Float64(float64(30 + i)),
	}
}

// wantMIG is the sample of the MIG device at slot of mock GPU i, named profile.
func (n *mockNode) wantMIG(i, slot int, profile string) *gpuscalerv1.GPUSample {
	m := n.gpus[i].migs[slot]
	return &gpuscalerv1.GPUSample{
		Uuid:          n.gpus[i].uuid,
		Index:         uint32(i),
		Model:         "NVIDIA A100-SXM4-40GB",
		Minor:         proto.Uint32(mockMinor(i)),
		DeviceId:      m.uuid,
		MigProfile:    profile,
		MigInstanceId: proto.Uint32(m.gi),
		FbUsedBytes:   proto.Uint64(1 << 30),
		FbTotalBytes:  proto.Uint64(mockA100Profiles[m.profile].MemorySizeMB << 20),
	}
}

// collectValid collects once and checks the samples make a valid NodeReport.
func collectValid(t testing.TB, s *Source) []*gpuscalerv1.GPUSample {
	t.Helper()
	got, err := s.Collect(context.Background())
	if err != nil {
		t.Fatalf("Collect: %v", err)
	}
	if err := (&gpuscalerv1.NodeReport{Node: "n", Gpus: got}).Validate(); err != nil {
		t.Fatalf("samples do not make a valid NodeReport: %v", err)
	}
	return got
}

func diffSamples(t *testing.T, got, want []*gpuscalerv1.GPUSample) {
	t.Helper()
	if len(got) != len(want) {
		t.Errorf("got %d samples, want %d", len(got), len(want))
	}
	for i := range min(len(got), len(want)) {
		if !proto.Equal(got[i], want[i]) {
			t.Errorf("sample %d:\ngot  %v\nwant %v", i, got[i], want[i])
		}
	}
}

func TestCollect(t *testing.T) {
	wholeGPUs := func(n *mockNode) []*gpuscalerv1.GPUSample {
		var want []*gpuscalerv1.GPUSample
		for i := range n.gpus {
			want = append(want, n.wantGPU(i))
		}
		return want
	}
	notSupported := func(g *mockGPU) {
		g.GetUtilizationRatesFunc = func() (nvml.Utilization, nvml.Return) { return nvml.Utilization{}, nvml.ERROR_NOT_SUPPORTED }
		g.GetPowerUsageFunc = func() (uint32, nvml.Return) { return 0, nvml.ERROR_NOT_SUPPORTED }
		g.GetTemperatureFunc = func(nvml.TemperatureSensors) (uint32, nvml.Return) { return 0, nvml.ERROR_NOT_SUPPORTED }
		g.GetMemoryInfoFunc = func() (nvml.Memory, nvml.Return) { return nvml.Memory{}, nvml.ERROR_NOT_SUPPORTED }
	}
	tests := map[string]struct {
		setup func(n *mockNode)
		want  func(n *mockNode) []*gpuscalerv1.GPUSample
	}{
		"eight whole GPUs": {
			setup: func(*mockNode) {},
			want:  wholeGPUs,
		},
		"MIG devices instead of their GPUs": {
			setup: func(n *mockNode) {
				n.gpus[1].addMIG(0, 0, nvml.GPU_INSTANCE_PROFILE_7_SLICE, 0)
				n.gpus[3].addMIG(0, 1, nvml.GPU_INSTANCE_PROFILE_3_SLICE, 0)
				n.gpus[3].addMIG(2, 5, nvml.GPU_INSTANCE_PROFILE_2_SLICE, 0) // slot 1 empty
				n.gpus[3].addMIG(3, 9, nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV2, 0)
				n.gpus[3].addMIG(6, 13, nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV1, 0)
				n.gpus[4].addMIG(1, 7, nvml.GPU_INSTANCE_PROFILE_1_SLICE, 0)
				n.gpus[4].addMIG(4, 8, nvml.GPU_INSTANCE_PROFILE_1_SLICE, 0)
				n.gpus[6].addMIG(0, 1, nvml.GPU_INSTANCE_PROFILE_4_SLICE, 0)
				n.gpus[6].addMIG(1, 2, nvml.GPU_INSTANCE_PROFILE_3_SLICE, 1) // one compute slice of three
			},
			want: func(n *mockNode) []*gpuscalerv1.GPUSample {
				return []*gpuscalerv1.GPUSample{
					n.wantGPU(0),
					n.wantMIG(1, 0, "7g.40gb"),
					n.wantGPU(2),
					n.wantMIG(3, 0, "3g.20gb"),
					n.wantMIG(3, 2, "2g.10gb"),
					n.wantMIG(3, 3, "1g.10gb"),
					n.wantMIG(3, 6, "1g.5gb+me"),
					n.wantMIG(4, 1, "1g.5gb"),
					n.wantMIG(4, 4, "1g.5gb"),
					n.wantGPU(5),
					n.wantMIG(6, 0, "4g.20gb"),
					n.wantMIG(6, 1, "1c.3g.20gb"),
					n.wantGPU(7),
				}
			},
		},
		"MIG mode without MIG devices reports the GPU": {
			setup: func(n *mockNode) { n.gpus[2].migMode = nvml.DEVICE_MIG_ENABLE },
			want: func(n *mockNode) []*gpuscalerv1.GPUSample {
				want := wholeGPUs(n)
				want[2].GpuUtil = nil
				return want
			},
		},
		"MIG mode not supported": {
			setup: func(n *mockNode) {
				for _, g := range n.gpus {
					g.GetMigModeFunc = func() (int, int, nvml.Return) { return 0, 0, nvml.ERROR_NOT_SUPPORTED }
				}
			},
			want: wholeGPUs,
		},
		"MIG mode pending, not current": {
			setup: func(n *mockNode) {
				n.gpus[5].GetMigModeFunc = func() (int, int, nvml.Return) {
					return nvml.DEVICE_MIG_DISABLE, nvml.DEVICE_MIG_ENABLE, nvml.SUCCESS
				}
			},
			want: wholeGPUs,
		},
		"readings that fail are absent, not zero": {
			setup: func(n *mockNode) {
				notSupported(n.gpus[2])
				n.gpus[4].GetNameFunc = func() (string, nvml.Return) { return "", nvml.ERROR_UNKNOWN }
				n.gpus[5].GetPowerUsageFunc = func() (uint32, nvml.Return) { return 0, nvml.ERROR_UNKNOWN }
				n.gpus[7].GetMinorNumberFunc = func() (int, nvml.Return) { return 0, nvml.ERROR_NOT_SUPPORTED }
				n.gpus[6].GetMemoryInfoFunc = func() (nvml.Memory, nvml.Return) {
					return nvml.Memory{Total: 1 << 30, Used: 2 << 30}, nvml.SUCCESS // read a moment apart
				}
			},
			want: func(n *mockNode) []*gpuscalerv1.GPUSample {
				want := wholeGPUs(n)
				want[2] = &gpuscalerv1.GPUSample{Uuid: n.gpus[2].uuid, Index: 2, Model: "NVIDIA A100-SXM4-40GB", Minor: proto.Uint32(mockMinor(2))}
				want[4].Model = ""
				want[5].PowerWatts = nil
				want[6].FbUsedBytes, want[6].FbTotalBytes = proto.Uint64(1<<30), proto.Uint64(1<<30)
				want[7].Minor = nil
				return want
			},
		},
		"MIG identity read another way, or in part": {
			setup: func(n *mockNode) {
				noAttrs := n.gpus[3].addMIG(0, 1, nvml.GPU_INSTANCE_PROFILE_3_SLICE, 0)
				noAttrs.GetAttributesFunc = func() (nvml.DeviceAttributes, nvml.Return) {
					return nvml.DeviceAttributes{}, nvml.ERROR_NOT_SUPPORTED
				}
				noGI := n.gpus[3].addMIG(1, 13, nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV1, 0)
				noGI.GetGpuInstanceIdFunc = func() (int, nvml.Return) { return 0, nvml.ERROR_NOT_SUPPORTED }
				noMemory := n.gpus[3].addMIG(2, 5, nvml.GPU_INSTANCE_PROFILE_2_SLICE, 0)
				noMemory.GetMemoryInfoFunc = func() (nvml.Memory, nvml.Return) { return nvml.Memory{}, nvml.ERROR_NOT_SUPPORTED }
				nothing := n.gpus[3].addMIG(3, 9, nvml.GPU_INSTANCE_PROFILE_1_SLICE, 0)
				nothing.GetGpuInstanceIdFunc = noGI.GetGpuInstanceIdFunc
				nothing.GetAttributesFunc = noAttrs.GetAttributesFunc
			},
			want: func(n *mockNode) []*gpuscalerv1.GPUSample {
				want := wholeGPUs(n)
				noAttrs := n.wantMIG(3, 0, "3g.20gb") // from its GPU instance's profile
				noGI := n.wantMIG(3, 1, "1g.5gb")     // from its attributes alone: no "+me"
				noGI.MigInstanceId = nil
				noMemory := n.wantMIG(3, 2, "2g.10gb")
				noMemory.FbUsedBytes, noMemory.FbTotalBytes = nil, nil
				nothing := n.wantMIG(3, 3, "")
				nothing.MigInstanceId = nil
				return append(want[:3], append([]*gpuscalerv1.GPUSample{noAttrs, noGI, noMemory, nothing}, want[4:]...)...)
			},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			n := newMockNode(8)
			tc.setup(n)
			s := n.source(t)
			want := tc.want(n)
			for round := range 2 { // the second from what the first cached
				got := collectValid(t, s)
				if round == 0 {
					diffSamples(t, got, want)
				} else if !samplesEqual(got, want) {
					t.Errorf("second Collect differs from the first")
				}
			}
		})
	}
}

func samplesEqual(a, b []*gpuscalerv1.GPUSample) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if !proto.Equal(a[i], b[i]) {
			return false
		}
	}
	return true
}

// TestCollectErrors: Collect fails only when NVML can read nothing: the count, or
// every GPU. One GPU failing is TestUnreadable's.
func TestCollectErrors(t *testing.T) {
	lost := func() (string, nvml.Return) { return "", nvml.ERROR_GPU_IS_LOST }
	tests := map[string]struct {
		setup   func(n *mockNode)
		ctx     func() context.Context
		wantIs  error
		wantMsg string
	}{
		"GPU count": {
			setup: func(n *mockNode) {
				n.lib.DeviceGetCountFunc = func() (int, nvml.Return) { return 0, nvml.ERROR_UNKNOWN }
			},
			wantIs: nvml.ERROR_UNKNOWN, wantMsg: "count GPUs",
		},
		"no GPU any more": {
			setup:   func(n *mockNode) { n.lib.DeviceGetCountFunc = func() (int, nvml.Return) { return 0, nvml.SUCCESS } },
			wantMsg: "no GPU",
		},
		"every GPU lost": {
			setup: func(n *mockNode) {
				for _, g := range n.gpus {
					g.GetUUIDFunc = lost
				}
			},
			wantIs: nvml.ERROR_GPU_IS_LOST, wantMsg: "none of the 8 GPUs could be read (GPU 0: GetUUID",
		},
		"every handle lost": {
			setup: func(n *mockNode) {
				n.lib.DeviceGetHandleByIndexFunc = func(int) (nvml.Device, nvml.Return) { return nil, nvml.ERROR_GPU_IS_LOST }
			},
			wantIs: nvml.ERROR_GPU_IS_LOST, wantMsg: "DeviceGetHandleByIndex",
		},
		"every GPU failing one way or another": {
			setup: func(n *mockNode) {
				n.gpus[0].GetMemoryInfoFunc = func() (nvml.Memory, nvml.Return) { return nvml.Memory{}, nvml.ERROR_RESET_REQUIRED }
				n.gpus[1].GetMigModeFunc = func() (int, int, nvml.Return) { return 0, 0, nvml.ERROR_GPU_IS_LOST }
				n.gpus[2].addMIG(0, 1, nvml.GPU_INSTANCE_PROFILE_7_SLICE, 0).GetMemoryInfoFunc = func() (nvml.Memory, nvml.Return) {
					return nvml.Memory{}, nvml.ERROR_GPU_IS_LOST
				}
				for _, g := range n.gpus[3:] {
					g.GetUUIDFunc = lost
				}
			},
			wantIs: nvml.ERROR_RESET_REQUIRED, wantMsg: "GPU 0: GetMemoryInfo",
		},
		"cancelled context": {
			setup: func(*mockNode) {},
			ctx: func() context.Context {
				ctx, cancel := context.WithCancel(context.Background())
				cancel()
				return ctx
			},
			wantIs: context.Canceled,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			n := newMockNode(8)
			s := n.source(t)
			tc.setup(n)
			ctx := context.Background()
			if tc.ctx != nil {
				ctx = tc.ctx()
			}
			got, err := s.Collect(ctx)
			if err == nil {
				t.Fatalf("got %d samples and no error, want an error", len(got))
			}
			if tc.wantIs != nil && !errors.Is(err, tc.wantIs) {
				t.Errorf("got error %v, want one wrapping %v", err, tc.wantIs)
			}
			if !strings.Contains(err.Error(), tc.wantMsg) {
				t.Errorf("got error %q, want it to name %q", err, tc.wantMsg)
			}
			if got != nil {
				t.Errorf("got %d samples with the error, want none", len(got))
			}
		})
	}
}

func TestStart(t *testing.T) {
	tests := map[string]struct {
		setup         func(n *mockNode)
		wantIs        []error
		wantMsg       string
		wantShutdowns int
	}{
		"no library": {
			setup: func(n *mockNode) {
				n.lib.InitFunc = func() nvml.Return { return nvml.ERROR_LIBRARY_NOT_FOUND }
			},
			wantIs:  []error{sourceerr.ErrNoGPUSource, nvml.ERROR_LIBRARY_NOT_FOUND},
			wantMsg: "libnvidia-ml.so.1 not found",
		},
		"no driver": {
			setup: func(n *mockNode) {
				n.lib.InitFunc = func() nvml.Return { return nvml.ERROR_DRIVER_NOT_LOADED }
			},
			wantIs:  []error{sourceerr.ErrNoGPUSource, nvml.ERROR_DRIVER_NOT_LOADED},
			wantMsg: "driver is not loaded",
		},
		"no permission": {
			setup: func(n *mockNode) {
				n.lib.InitFunc = func() nvml.Return { return nvml.ERROR_NO_PERMISSION }
			},
			wantIs:  []error{sourceerr.ErrNoGPUSource, nvml.ERROR_NO_PERMISSION},
			wantMsg: "/dev/nvidia",
		},
		"no GPU": {
			setup:         func(n *mockNode) { n.gpus = nil },
			wantIs:        []error{sourceerr.ErrNoGPUSource},
			wantMsg:       "no GPU",
			wantShutdowns: 1,
		},
		"GPU count fails": {
			setup: func(n *mockNode) {
				n.lib.DeviceGetCountFunc = func() (int, nvml.Return) { return 0, nvml.ERROR_UNKNOWN }
			},
			wantIs:        []error{nvml.ERROR_UNKNOWN},
			wantMsg:       "count GPUs",
			wantShutdowns: 1,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			n := newMockNode(8)
			tc.setup(n)
			s, err := newSource(n.lib, Config{})
			if err == nil {
				_ = s.Close()
				t.Fatal("got no error")
			}
			for _, want := range tc.wantIs {
				if !errors.Is(err, want) {
					t.Errorf("got error %v, want one wrapping %v", err, want)
				}
			}
			if !strings.Contains(err.Error(), tc.wantMsg) {
				t.Errorf("got error %q, want it to say %q", err, tc.wantMsg)
			}
			if got := len(n.lib.ShutdownCalls()); got != tc.wantShutdowns {
				t.Errorf("got %d Shutdown calls, want %d", got, tc.wantShutdowns)
			}
		})
	}
}

func TestClose(t *testing.T) {
	n := newMockNode(8)
	s, err := newSource(n.lib, Config{})
	if err != nil {
		t.Fatal(err)
	}
	if s.Name() != "nvml" {
		t.Errorf("got name %q, want nvml", s.Name())
	}
	collectValid(t, s)
	for range 2 {
		if err := s.Close(); err != nil {
			t.Fatalf("Close: %v", err)
		}
	}
	if got := len(n.lib.ShutdownCalls()); got != 1 {
		t.Errorf("got %d Shutdown calls, want 1", got)
	}
	if got := len(n.set.FreeCalls()); got != 1 {
		t.Errorf("got %d event set Free calls, want 1", got)
	}
	if _, err := s.Collect(context.Background()); err == nil {
		t.Error("Collect after Close: got no error")
	}

	n = newMockNode(1)
	n.lib.ShutdownFunc = func() nvml.Return { return nvml.ERROR_UNKNOWN }
	s, err = newSource(n.lib, Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); !errors.Is(err, nvml.ERROR_UNKNOWN) {
		t.Errorf("Close: got %v, want the Shutdown error", err)
	}
}

func TestXIDs(t *testing.T) {
	n := newMockNode(8)
	n.gpus[3].addMIG(0, 1, nvml.GPU_INSTANCE_PROFILE_4_SLICE, 0)
	n.gpus[3].addMIG(1, 5, nvml.GPU_INSTANCE_PROFILE_3_SLICE, 0)
	s := n.source(t)
	for i, g := range n.gpus {
		calls := g.RegisterEventsCalls()
		if len(calls) != 1 || calls[0].V != nvml.EventTypeXidCriticalError {
			t.Errorf("GPU %d: got RegisterEvents calls %+v, want one for XID critical errors", i, calls)
		}
	}
	xid := func(g *mockGPU, gi uint32) nvml.EventData {
		return nvml.EventData{Device: g, EventType: nvml.EventTypeXidCriticalError, EventData: 79, GpuInstanceId: gi, ComputeInstanceId: gi}
	}
	lost := &mock.Device{GetUUIDFunc: func() (string, nvml.Return) { return "", nvml.ERROR_GPU_IS_LOST }}
	n.queue(
		xid(n.gpus[0], noInstance), xid(n.gpus[0], noInstance),
		xid(n.gpus[3], 1), xid(n.gpus[3], noInstance),
		nvml.EventData{Device: n.gpus[5], EventType: nvml.EventTypePState, GpuInstanceId: noInstance},
		nvml.EventData{Device: lost, EventType: nvml.EventTypeXidCriticalError, GpuInstanceId: noInstance},
		nvml.EventData{EventType: nvml.EventTypeXidCriticalError},
	)
	counts := func() map[string]uint64 {
		m := map[string]uint64{}
		for _, g := range collectValid(t, s) {
			m[g.DeviceID()] = g.GetXidErrors()
		}
		return m
	}
	check := func(when string, got map[string]uint64, want map[string]uint64) {
		t.Helper()
		for id, w := range want {
			if got[id] != w {
				t.Errorf("%s: device %s: got %d XID errors, want %d", when, id, got[id], w)
			}
		}
	}
	want := map[string]uint64{
		n.gpus[0].uuid: 2, n.gpus[1].uuid: 0, n.gpus[5].uuid: 0,
		n.gpus[3].migs[0].uuid: 2, // its own and the GPU's
		n.gpus[3].migs[1].uuid: 1, // the GPU's
	}
	check("first Collect", counts(), want)
	check("second Collect", counts(), want) // counts persist

	n.queue(xid(n.gpus[3], 5), xid(n.gpus[1], noInstance))
	want[n.gpus[3].migs[1].uuid]++
	want[n.gpus[1].uuid]++
	check("after more", counts(), want)

	// A storm is taken a bounded batch per Collect.
	for range maxXIDEventsPerCollect + 10 {
		n.queue(xid(n.gpus[7], noInstance))
	}
	check("storm, first Collect", counts(), map[string]uint64{n.gpus[7].uuid: maxXIDEventsPerCollect})
	check("storm, second Collect", counts(), map[string]uint64{n.gpus[7].uuid: maxXIDEventsPerCollect + 10})
}

func TestXIDsUnavailable(t *testing.T) {
	tests := map[string]struct {
		setup     func(n *mockNode)
		wantFrees int
	}{
		"no event set": {
			setup: func(n *mockNode) {
				n.lib.EventSetCreateFunc = func() (nvml.EventSet, nvml.Return) { return nil, nvml.ERROR_NOT_SUPPORTED }
			},
		},
		"no GPU can register": {
			setup: func(n *mockNode) {
				for _, g := range n.gpus {
					g.RegisterEventsFunc = func(uint64, nvml.EventSet) nvml.Return { return nvml.ERROR_NOT_SUPPORTED }
				}
			},
			wantFrees: 1,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			n := newMockNode(8)
			tc.setup(n)
			s := n.source(t)
			if got := len(n.set.FreeCalls()); got != tc.wantFrees {
				t.Errorf("got %d event set Free calls, want %d", got, tc.wantFrees)
			}
			n.queue(nvml.EventData{Device: n.gpus[0], EventType: nvml.EventTypeXidCriticalError, GpuInstanceId: noInstance})
			for _, g := range collectValid(t, s) {
				if g.GetXidErrors() != 0 {
					t.Errorf("device %s: got %d XID errors, want 0", g.DeviceID(), g.GetXidErrors())
				}
			}
			if got := len(n.set.WaitCalls()); got != 0 {
				t.Errorf("got %d event set Wait calls, want none", got)
			}
		})
	}
}

func TestMIGCache(t *testing.T) {
	n := newMockNode(8)
	m := n.gpus[2].addMIG(0, 1, nvml.GPU_INSTANCE_PROFILE_3_SLICE, 0)
	n.gpus[2].addMIG(1, 2, nvml.GPU_INSTANCE_PROFILE_4_SLICE, 0)
	s := n.source(t)
	for range 3 {
		collectValid(t, s)
	}
	if got := len(m.GetAttributesCalls()); got != 1 {
		t.Errorf("got %d GetAttributes calls in start-up and 3 Collects, want 1 (the profile is cached)", got)
	}
	if got := len(m.GetMemoryInfoCalls()); got != 4 {
		t.Errorf("got %d GetMemoryInfo calls in start-up and 3 Collects, want 4", got)
	}
	// Reconfigured: slot 0 now holds a new MIG device; the old one is forgotten.
	n.gpus[2].addMIG(0, 3, nvml.GPU_INSTANCE_PROFILE_1_SLICE, 0).uuid = "MIG-new"
	got := collectValid(t, s)
	if _, ok := s.migs[m.uuid]; ok {
		t.Errorf("the destroyed MIG device %s is still cached", m.uuid)
	}
	if len(s.migs) != 2 {
		t.Errorf("got %d cached MIG devices, want 2", len(s.migs))
	}
	if got[2].GetDeviceId() != "MIG-new" || got[2].GetMigProfile() != "1g.5gb" {
		t.Errorf("got %v, want MIG-new, 1g.5gb", got[2])
	}
}

func TestConcurrentCollect(t *testing.T) {
	n := newMockNode(8)
	n.gpus[4].addMIG(0, 1, nvml.GPU_INSTANCE_PROFILE_7_SLICE, 0)
	s := n.source(t)
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for range 20 {
				n.queue(nvml.EventData{Device: n.gpus[0], EventType: nvml.EventTypeXidCriticalError, GpuInstanceId: noInstance})
				if _, err := s.Collect(context.Background()); err != nil {
					t.Errorf("Collect: %v", err)
				}
				s.PodUsage()
			}
		})
	}
	wg.Wait()
	if got := collectValid(t, s)[0].GetXidErrors(); got != 80 {
		t.Errorf("got %d XID errors, want 80", got)
	}
}

// TestNew starts the real library. Without libnvidia-ml.so.1 (any machine without
// the NVIDIA driver) it must fail with sourceerr.ErrNoGPUSource; on a GPU node it must read them.
func TestNew(t *testing.T) {
	s, err := New(Config{})
	if err != nil {
		if !errors.Is(err, sourceerr.ErrNoGPUSource) {
			t.Fatalf("got error %v, want one wrapping sourceerr.ErrNoGPUSource", err)
		}
		t.Logf("no NVML here, as expected off a GPU node: %v", err)
		return
	}
	defer func() {
		if err := s.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	}()
	got := collectValid(t, s)
	if len(got) == 0 {
		t.Fatal("NVML started but Collect returned no sample")
	}
	for _, g := range got {
		t.Logf("%v", g)
	}
}

func BenchmarkCollect(b *testing.B) {
	benchmarks := map[string]func(n *mockNode){
		"8 GPUs": func(*mockNode) {},
		"8 GPUs, 7 MIG devices each": func(n *mockNode) {
			for _, g := range n.gpus {
				for slot := range 7 {
					g.addMIG(slot, uint32(slot), nvml.GPU_INSTANCE_PROFILE_1_SLICE, 0)
				}
			}
		},
	}
	for name, setup := range benchmarks {
		b.Run(name, func(b *testing.B) {
			n := newMockNode(8)
			setup(n)
			s := n.source(b)
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				if _, err := s.Collect(ctx); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkPodUsage is what a collector pays each interval on a node of 8
// time-sliced GPUs, each running 4 processes of 2 pods: a Collect, then PodUsage with
// every PID's pod known from the interval before.
func BenchmarkPodUsage(b *testing.B) {
	root := b.TempDir()
	n := newMockNode(8)
	for i, g := range n.gpus {
		var pids []uint32
		for p := range 4 {
			pid := uint32(1000 + 10*i + p)
			pids = append(pids, pid)
			uid := fmt.Sprintf("%08x-0000-4000-8000-%012x", i, p%2)
			dir := filepath.Join(root, strconv.Itoa(int(pid)))
			if err := os.MkdirAll(dir, 0o755); err != nil {
				b.Fatal(err)
			}
			line := "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + strings.ReplaceAll(uid, "-", "_") + ".slice/cri-containerd-" + collectortest.ContainerID + ".scope\n"
			if err := os.WriteFile(filepath.Join(dir, "cgroup"), []byte(line), 0o644); err != nil {
				b.Fatal(err)
			}
		}
		g.GetProcessUtilizationFunc = func(since uint64) ([]nvml.ProcessUtilizationSample, nvml.Return) {
			out := make([]nvml.ProcessUtilizationSample, len(pids))
			for j, pid := range pids {
				out[j] = nvml.ProcessUtilizationSample{Pid: pid, TimeStamp: since + 1, SmUtil: 20}
			}
			return out, nvml.SUCCESS
		}
	}
	s := n.sourceWith(b, Config{ProcRoot: root})
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := s.Collect(ctx); err != nil {
			b.Fatal(err)
		}
		if got := s.PodUsage(); len(got) != 8 {
			b.Fatalf("got %d measured GPUs, want 8", len(got))
		}
	}
}

// TestUnreadable: a GPU or MIG device NVML cannot read is reported unhealthy, its
// readings absent, under the identity it had before, and the others report as usual.
// A GPU that fell off the bus (XID 79) answers NVML_ERROR_GPU_IS_LOST to every call
// on it, its handle included (nvml.h: "The target GPU has fallen off the bus or has
// otherwise become inaccessible"); one that needs a reset, NVML_ERROR_RESET_REQUIRED.
func TestUnreadable(t *testing.T) {
	const (
		lostUUID = "NVML GetUUID: GPU is lost (ERROR_GPU_IS_LOST)"
		model    = "NVIDIA A100-SXM4-40GB"
	)
	lost := func() (string, nvml.Return) { return "", nvml.ERROR_GPU_IS_LOST }
	bare := func(n *mockNode, i int, reason string) *gpuscalerv1.GPUSample {
		return &gpuscalerv1.GPUSample{Uuid: n.gpus[i].uuid, Index: uint32(i), Model: model, Minor: proto.Uint32(mockMinor(i)), Unhealthy: reason}
	}
	bareMIG := func(n *mockNode, i, slot int, profile, reason string) *gpuscalerv1.GPUSample {
		g := n.wantMIG(i, slot, profile)
		g.FbUsedBytes, g.FbTotalBytes, g.Unhealthy = nil, nil, reason
		return g
	}
	replace := func(want []*gpuscalerv1.GPUSample, i int, with ...*gpuscalerv1.GPUSample) []*gpuscalerv1.GPUSample {
		return append(append(append([]*gpuscalerv1.GPUSample{}, want[:i]...), with...), want[i+1:]...)
	}
	wholeGPUs := func(n *mockNode) []*gpuscalerv1.GPUSample {
		var want []*gpuscalerv1.GPUSample
		for i := range n.gpus {
			want = append(want, n.wantGPU(i))
		}
		return want
	}
	twoMIGs := func(n *mockNode) {
		n.gpus[3].addMIG(0, 1, nvml.GPU_INSTANCE_PROFILE_4_SLICE, 0)
		n.gpus[3].addMIG(1, 5, nvml.GPU_INSTANCE_PROFILE_3_SLICE, 0)
	}
	withMIGs := func(n *mockNode, migs ...*gpuscalerv1.GPUSample) []*gpuscalerv1.GPUSample {
		return replace(wholeGPUs(n), 3, migs...)
	}
	tests := map[string]struct {
		before, after    func(n *mockNode) // before the source starts, and after
		want             func(n *mockNode) []*gpuscalerv1.GPUSample
		wantUnidentified float64
		check            func(t *testing.T, n *mockNode)
	}{
		"UUID lost": {
			after: func(n *mockNode) { n.gpus[2].GetUUIDFunc = lost },
			want:  func(n *mockNode) []*gpuscalerv1.GPUSample { return replace(wholeGPUs(n), 2, bare(n, 2, lostUUID)) },
		},
		"handle lost": {
			after: func(n *mockNode) {
				n.lib.DeviceGetHandleByIndexFunc = func(i int) (nvml.Device, nvml.Return) {
					if i == 5 {
						return nil, nvml.ERROR_GPU_IS_LOST
					}
					return n.gpus[i], nvml.SUCCESS
				}
			},
			want: func(n *mockNode) []*gpuscalerv1.GPUSample {
				return replace(wholeGPUs(n), 5, bare(n, 5, "NVML DeviceGetHandleByIndex: GPU is lost (ERROR_GPU_IS_LOST)"))
			},
		},
		"utilisation lost: the readings before are dropped, those after not asked": {
			after: func(n *mockNode) {
				n.gpus[1].GetUtilizationRatesFunc = func() (nvml.Utilization, nvml.Return) { return nvml.Utilization{}, nvml.ERROR_GPU_IS_LOST }
			},
			want: func(n *mockNode) []*gpuscalerv1.GPUSample {
				return replace(wholeGPUs(n), 1, bare(n, 1, "NVML GetUtilizationRates: GPU is lost (ERROR_GPU_IS_LOST)"))
			},
			check: func(t *testing.T, n *mockNode) {
				if got := len(n.gpus[1].GetPowerUsageCalls()); got != 1 {
					t.Errorf("got %d GetPowerUsage calls, want 1 (start-up's): a lost GPU is not asked further", got)
				}
			},
		},
		"memory needs a reset": {
			after: func(n *mockNode) {
				n.gpus[7].GetMemoryInfoFunc = func() (nvml.Memory, nvml.Return) { return nvml.Memory{}, nvml.ERROR_RESET_REQUIRED }
			},
			want: func(n *mockNode) []*gpuscalerv1.GPUSample {
				return replace(wholeGPUs(n), 7, bare(n, 7, "NVML GetMemoryInfo: GPU needs a reset (ERROR_RESET_REQUIRED)"))
			},
		},
		"MIG mode lost": {
			after: func(n *mockNode) {
				n.gpus[0].GetMigModeFunc = func() (int, int, nvml.Return) { return 0, 0, nvml.ERROR_GPU_IS_LOST }
			},
			want: func(n *mockNode) []*gpuscalerv1.GPUSample {
				return replace(wholeGPUs(n), 0, bare(n, 0, "NVML GetMigMode: GPU is lost (ERROR_GPU_IS_LOST)"))
			},
		},
		"process samples lost": {
			after: func(n *mockNode) {
				n.gpus[4].GetProcessUtilizationFunc = func(uint64) ([]nvml.ProcessUtilizationSample, nvml.Return) {
					return nil, nvml.ERROR_GPU_IS_LOST
				}
			},
			want: func(n *mockNode) []*gpuscalerv1.GPUSample {
				return replace(wholeGPUs(n), 4, bare(n, 4, "NVML GetProcessUtilization: GPU is lost (ERROR_GPU_IS_LOST)"))
			},
		},
		"every reading fails": {
			after: func(n *mockNode) {
				g := n.gpus[3]
				g.GetMemoryInfoFunc = func() (nvml.Memory, nvml.Return) { return nvml.Memory{}, nvml.ERROR_UNKNOWN }
				g.GetUtilizationRatesFunc = func() (nvml.Utilization, nvml.Return) { return nvml.Utilization{}, nvml.ERROR_UNKNOWN }
				g.GetPowerUsageFunc = func() (uint32, nvml.Return) { return 0, nvml.ERROR_NOT_SUPPORTED }
				g.GetTemperatureFunc = func(nvml.TemperatureSensors) (uint32, nvml.Return) { return 0, nvml.ERROR_TIMEOUT }
			},
			want: func(n *mockNode) []*gpuscalerv1.GPUSample {
				return replace(wholeGPUs(n), 3, bare(n, 3, "NVML: every reading failed: GetMemoryInfo: unknown error (ERROR_UNKNOWN); "+
					"GetUtilizationRates: unknown error (ERROR_UNKNOWN); GetTemperature: timed out (ERROR_TIMEOUT)"))
			},
		},
		"XID 79, then lost": {
			after: func(n *mockNode) {
				n.queue(nvml.EventData{Device: n.gpus[4], EventType: nvml.EventTypeXidCriticalError, EventData: 79,
					GpuInstanceId: noInstance, ComputeInstanceId: noInstance})
				n.gpus[4].GetUUIDFunc = lost // the event's device too: it is found by its handle
			},
			want: func(n *mockNode) []*gpuscalerv1.GPUSample {
				g := bare(n, 4, lostUUID)
				g.LastXid, g.XidErrors = 79, 1
				return replace(wholeGPUs(n), 4, g)
			},
		},
		"never identified: left out and counted": {
			before: func(n *mockNode) { n.gpus[6].GetUUIDFunc = lost },
			want: func(n *mockNode) []*gpuscalerv1.GPUSample {
				return replace(wholeGPUs(n), 6)
			},
			wantUnidentified: 1,
		},
		"never a handle: left out and counted": {
			before: func(n *mockNode) {
				n.lib.DeviceGetHandleByIndexFunc = func(i int) (nvml.Device, nvml.Return) {
					if i == 0 || i == 1 {
						return nil, nvml.ERROR_GPU_IS_LOST
					}
					return n.gpus[i], nvml.SUCCESS
				}
			},
			want:             func(n *mockNode) []*gpuscalerv1.GPUSample { return wholeGPUs(n)[2:] },
			wantUnidentified: 2,
		},
		"a lost GPU's MIG devices": {
			before: twoMIGs,
			after:  func(n *mockNode) { n.gpus[3].GetUUIDFunc = lost },
			want: func(n *mockNode) []*gpuscalerv1.GPUSample {
				return withMIGs(n, bareMIG(n, 3, 0, "4g.20gb", lostUUID), bareMIG(n, 3, 1, "3g.20gb", lostUUID))
			},
		},
		"MIG devices that cannot be counted": {
			before: twoMIGs,
			after: func(n *mockNode) {
				n.gpus[3].GetMaxMigDeviceCountFunc = func() (int, nvml.Return) { return 0, nvml.ERROR_UNKNOWN }
			},
			want: func(n *mockNode) []*gpuscalerv1.GPUSample {
				const why = "NVML GetMaxMigDeviceCount: unknown error (ERROR_UNKNOWN)"
				return withMIGs(n, bareMIG(n, 3, 0, "4g.20gb", why), bareMIG(n, 3, 1, "3g.20gb", why))
			},
		},
		"one MIG device without a handle": {
			before: twoMIGs,
			after: func(n *mockNode) {
				g := n.gpus[3]
				g.GetMigDeviceHandleByIndexFunc = func(j int) (nvml.Device, nvml.Return) {
					if j == 1 {
						return nil, nvml.ERROR_UNKNOWN
					}
					if m, ok := g.migs[j]; ok {
						return m, nvml.SUCCESS
					}
					return nil, nvml.ERROR_NOT_FOUND
				}
			},
			want: func(n *mockNode) []*gpuscalerv1.GPUSample {
				return withMIGs(n, n.wantMIG(3, 0, "4g.20gb"),
					bareMIG(n, 3, 1, "3g.20gb", "NVML GetMigDeviceHandleByIndex: unknown error (ERROR_UNKNOWN)"))
			},
		},
		"one MIG device's UUID lost": {
			before: twoMIGs,
			after:  func(n *mockNode) { n.gpus[3].migs[0].GetUUIDFunc = lost },
			want: func(n *mockNode) []*gpuscalerv1.GPUSample {
				return withMIGs(n, bareMIG(n, 3, 0, "4g.20gb", lostUUID), n.wantMIG(3, 1, "3g.20gb"))
			},
		},
		"one MIG device's memory lost": {
			before: twoMIGs,
			after: func(n *mockNode) {
				n.gpus[3].migs[1].GetMemoryInfoFunc = func() (nvml.Memory, nvml.Return) { return nvml.Memory{}, nvml.ERROR_GPU_IS_LOST }
			},
			want: func(n *mockNode) []*gpuscalerv1.GPUSample {
				return withMIGs(n, n.wantMIG(3, 0, "4g.20gb"), bareMIG(n, 3, 1, "3g.20gb", "NVML GetMemoryInfo: GPU is lost (ERROR_GPU_IS_LOST)"))
			},
		},
		"a MIG device never identified": {
			before: twoMIGs,
			after: func(n *mockNode) {
				n.gpus[3].addMIG(4, 9, nvml.GPU_INSTANCE_PROFILE_1_SLICE, 0).GetUUIDFunc = lost
			},
			want: func(n *mockNode) []*gpuscalerv1.GPUSample {
				return withMIGs(n, n.wantMIG(3, 0, "4g.20gb"), n.wantMIG(3, 1, "3g.20gb"))
			},
			wantUnidentified: 1,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			n := newMockNode(8)
			if tc.before != nil {
				tc.before(n)
			}
			s := n.source(t)
			if tc.after != nil {
				tc.after(n)
			}
			want := tc.want(n)
			for round := range 2 { // the second from what the first remembered
				got := collectValid(t, s)
				if round == 0 {
					diffSamples(t, got, want)
				} else if !samplesEqual(got, want) {
					t.Errorf("second Collect differs from the first")
				}
			}
			if got := testutil.ToFloat64(s.metrics.unidentified); got != tc.wantUnidentified {
				t.Errorf("got %v unidentified devices, want %v", got, tc.wantUnidentified)
			}
			if tc.check != nil {
				tc.check(t, n)
			}
		})
	}
}

// TestXIDHealth: a critical XID makes the device it concerns unhealthy "XID <n>"
// for the hold after the last one, and its LastXid the last one's number. For MIG, an
// event concerns a MIG device when its GPU and compute instances match or are
// 0xFFFFFFFF (k8s-device-plugin internal/rm/health.go, runEventMonitor).
func TestXIDHealth(t *testing.T) {
	n := newMockNode(4)
	g := n.gpus[2]
	a := g.addMIG(0, 1, nvml.GPU_INSTANCE_PROFILE_3_SLICE, 1) // GPU instance 1, compute instance 0
	b := g.addMIG(1, 1, nvml.GPU_INSTANCE_PROFILE_3_SLICE, 1) // GPU instance 1, compute instance 1
	b.ci = 1
	c := g.addMIG(2, 2, nvml.GPU_INSTANCE_PROFILE_3_SLICE, 0) // GPU instance 2, compute instance 0
	s := n.source(t)
	clock := time.Unix(1_700_000_000, 0)
	s.now = func() time.Time { return clock }

	xid := func(dev nvml.Device, xid uint64, gi, ci uint32) nvml.EventData {
		return nvml.EventData{Device: dev, EventType: nvml.EventTypeXidCriticalError, EventData: xid, GpuInstanceId: gi, ComputeInstanceId: ci}
	}
	const all = noInstance
	type health struct {
		unhealthy string
		lastXID   uint32
	}
	steps := []struct {
		name    string
		advance time.Duration
		events  []nvml.EventData
		want    map[string]health // by device id; the others healthy, with no XID
	}{
		{
			name:   "a critical XID and an application one",
			events: []nvml.EventData{xid(n.gpus[0], 48, all, all), xid(n.gpus[1], 13, all, all)},
			want:   map[string]health{n.gpus[0].uuid: {"XID 48", 48}, n.gpus[1].uuid: {"", 13}},
		},
		{
			name: "just inside the hold", advance: DefaultXIDHold - time.Second,
			want: map[string]health{n.gpus[0].uuid: {"XID 48", 48}, n.gpus[1].uuid: {"", 13}},
		},
		{
			name: "the hold is over: healthy, the last XID kept", advance: time.Second,
			want: map[string]health{n.gpus[0].uuid: {"", 48}, n.gpus[1].uuid: {"", 13}},
		},
		{
			name:   "another XID",
			events: []nvml.EventData{xid(n.gpus[0], 94, all, all)},
			want:   map[string]health{n.gpus[0].uuid: {"XID 94", 94}, n.gpus[1].uuid: {"", 13}},
		},
		{
			name: "a later XID holds from its own time", advance: 3 * time.Minute,
			events: []nvml.EventData{xid(n.gpus[0], 63, all, all)},
			want:   map[string]health{n.gpus[0].uuid: {"XID 63", 63}, n.gpus[1].uuid: {"", 13}},
		},
		{
			name: "past the first hold, within the second", advance: 3 * time.Minute,
			want: map[string]health{n.gpus[0].uuid: {"XID 63", 63}, n.gpus[1].uuid: {"", 13}},
		},
		{
			name: "one MIG device's compute instance", advance: 10 * time.Minute,
			events: []nvml.EventData{xid(g, 94, 1, 1)},
			want:   map[string]health{n.gpus[0].uuid: {"", 63}, n.gpus[1].uuid: {"", 13}, b.uuid: {"XID 94", 94}},
		},
		{
			name:   "an application error on a MIG device",
			events: []nvml.EventData{xid(g, 43, 2, 0)},
			want:   map[string]health{n.gpus[0].uuid: {"", 63}, n.gpus[1].uuid: {"", 13}, b.uuid: {"XID 94", 94}, c.uuid: {"", 43}},
		},
		{
			name: "the whole MIG-mode GPU", advance: time.Minute,
			events: []nvml.EventData{xid(g, 48, all, all)},
			want: map[string]health{
				n.gpus[0].uuid: {"", 63}, n.gpus[1].uuid: {"", 13},
				a.uuid: {"XID 48", 48}, b.uuid: {"XID 48", 48}, c.uuid: {"XID 48", 48},
			},
		},
		{
			name:   "a GPU instance, every compute instance of it",
			events: []nvml.EventData{xid(g, 74, 2, all)},
			want: map[string]health{
				n.gpus[0].uuid: {"", 63}, n.gpus[1].uuid: {"", 13},
				a.uuid: {"XID 48", 48}, b.uuid: {"XID 48", 48}, c.uuid: {"XID 74", 74},
			},
		},
		{
			name: "all held over", advance: DefaultXIDHold,
			want: map[string]health{
				n.gpus[0].uuid: {"", 63}, n.gpus[1].uuid: {"", 13},
				a.uuid: {"", 48}, b.uuid: {"", 48}, c.uuid: {"", 74},
			},
		},
	}
	for _, step := range steps {
		clock = clock.Add(step.advance)
		n.queue(step.events...)
		for _, got := range collectValid(t, s) {
			want := step.want[got.DeviceID()]
			if got.GetUnhealthy() != want.unhealthy || got.GetLastXid() != want.lastXID {
				t.Errorf("%s: device %s: got unhealthy %q, last XID %d; want %q, %d",
					step.name, got.DeviceID(), got.GetUnhealthy(), got.GetLastXid(), want.unhealthy, want.lastXID)
			}
		}
	}
}

func TestXIDHoldConfig(t *testing.T) {
	n := newMockNode(1)
	s := n.sourceWith(t, Config{XIDHold: time.Minute})
	clock := time.Unix(1_700_000_000, 0)
	s.now = func() time.Time { return clock }
	n.queue(nvml.EventData{Device: n.gpus[0], EventType: nvml.EventTypeXidCriticalError, EventData: 48, GpuInstanceId: noInstance, ComputeInstanceId: noInstance})
	for _, step := range []struct {
		advance time.Duration
		want    string
	}{{0, "XID 48"}, {time.Minute - time.Second, "XID 48"}, {time.Second, ""}} {
		clock = clock.Add(step.advance)
		if got := collectValid(t, s)[0].GetUnhealthy(); got != step.want {
			t.Errorf("%v after: got unhealthy %q, want %q", clock.Sub(time.Unix(1_700_000_000, 0)), got, step.want)
		}
	}
}

// TestPodUsage: a time-sliced GPU's per-process samples, each process mapped to its
// pod through a fake host /proc, give each pod's share; a GPU whose figures would be
// incomplete or whose window says nothing is left out (unmeasured), never reported as
// unused. NVML's contract (nvml.h, nvmlDeviceGetProcessUtilization): samples newer than
// lastSeenTimeStamp, ERROR_NOT_FOUND when there are none.
func TestPodUsage(t *testing.T) {
	const (
		podA, podB          = collectortest.PodUID, collectortest.PodUID2
		a1, a2, b1          = 1001, 1002, 2001 // processes of pod A (systemd driver) and pod B (cgroupfs)
		hostProc, exited    = 3001, 4242
		before, t1, t2, t3  = 100, 200, 300, 400 // NVML sample timestamps (µs)
		idleGPU, busyGPU    = 1, 2
		unreadGPU, hostGPU  = 3, 4
		unsupportedGPU      = 5
		migGPU, cappedGPU   = 6, 7
		timeSliced          = 0
		startupStaleProcess = 999
	)
	root := t.TempDir()
	collectortest.WriteProcCgroup(t, root, a1, "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod"+collectortest.PodUIDEscaped+".slice/cri-containerd-"+collectortest.ContainerID+".scope\n")
	collectortest.WriteProcCgroup(t, root, a2, "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod"+collectortest.PodUIDEscaped+".slice/cri-containerd-"+collectortest.ContainerID[1:]+"0.scope\n")
	collectortest.WriteProcCgroup(t, root, b1, "0::/kubepods/besteffort/pod"+collectortest.PodUID2+"/"+collectortest.ContainerID+"\n")
	collectortest.WriteProcCgroup(t, root, hostProc, "0::/system.slice/xorg.service\n")

	sample := func(pid uint32, ts uint64, sm uint32) nvml.ProcessUtilizationSample {
		return nvml.ProcessUtilizationSample{Pid: pid, TimeStamp: ts, SmUtil: sm, MemUtil: sm / 2}
	}
	n := newMockNode(8)
	// Before start-up: the driver's buffer holds a sample of a process long gone.
	n.gpus[timeSliced].processes = []nvml.ProcessUtilizationSample{sample(startupStaleProcess, before, 80)}
	n.gpus[idleGPU].GetUtilizationRatesFunc = func() (nvml.Utilization, nvml.Return) { return nvml.Utilization{}, nvml.SUCCESS }
	n.gpus[unsupportedGPU].GetProcessUtilizationFunc = func(uint64) ([]nvml.ProcessUtilizationSample, nvml.Return) {
		return nil, nvml.ERROR_NOT_SUPPORTED
	}
	n.gpus[migGPU].addMIG(0, 1, nvml.GPU_INSTANCE_PROFILE_7_SLICE, 0) // no GetProcessUtilizationFunc: asking would panic
	var logs strings.Builder
	reg := prometheus.NewRegistry()
	s := n.sourceWith(t, Config{ProcRoot: root, Registerer: reg, Log: slog.New(slog.NewTextHandler(&logs, nil))})

	id := func(i int) string { return n.gpus[i].uuid }
	// Each window a span apart, so each is read alone (TestPodUsageSmoothed averages).
	clock := time.Unix(1_700_000_000, 0)
	s.now = func() time.Time { return clock }
	check := func(when string, want map[string]map[string]float64) {
		t.Helper()
		clock = clock.Add(PodUsageSpan)
		got := s.PodUsage()
		if !maps.EqualFunc(got, want, func(a, b map[string]float64) bool { return maps.Equal(a, b) }) {
			t.Errorf("%s: got %v, want %v", when, got, want)
		}
	}
	// Start-up's window is the driver's whole buffer, of unknown length: GPU 0 is not
	// measured from it. The idle GPU with no sample is: no pod used it.
	check("after start-up", map[string]map[string]float64{id(idleGPU): {}})

	n.gpus[timeSliced].processes = append(n.gpus[timeSliced].processes,
		sample(a1, t1, 30), sample(a2, t1, 20), sample(b1, t1, 40), sample(b1, t2, 50)) // b1 twice: its mean
	n.gpus[unreadGPU].processes = []nvml.ProcessUtilizationSample{sample(a1, t1, 10), sample(exited, t1, 10)}
	n.gpus[hostGPU].processes = []nvml.ProcessUtilizationSample{sample(b1, t1, 10), sample(hostProc, t1, 10)}
	n.gpus[cappedGPU].processes = []nvml.ProcessUtilizationSample{sample(a1, t1, 70), sample(a2, t1, 60)}
	collectValid(t, s)
	check("first Collect", map[string]map[string]float64{
		id(timeSliced): {podA: 50, podB: 45},
		id(idleGPU):    {},
		// busy GPU, no sample: unmeasured; a process that exited, or one outside any
		// pod: unmeasured; NOT_SUPPORTED: unmeasured; MIG devices: never measured.
		id(cappedGPU): {podA: 100},
	})
	if got := n.gpus[timeSliced].since; !slices.Equal(got, []uint64{0, before}) {
		t.Errorf("GPU 0 asked for samples since %v, want [0 %d]: each window starts after the last sample seen", got, before)
	}
	if got := testutil.ToFloat64(s.metrics.unresolved.WithLabelValues("unreadable")); got != 1 {
		t.Errorf("got %v unreadable processes, want 1", got)
	}
	if got := testutil.ToFloat64(s.metrics.unresolved.WithLabelValues("no_pod")); got != 1 {
		t.Errorf("got %v processes in no pod, want 1", got)
	}

	// Known PIDs are not read again while they keep being sampled.
	if err := os.RemoveAll(filepath.Join(root, strconv.Itoa(a1))); err != nil {
		t.Fatal(err)
	}
	n.gpus[timeSliced].processes = append(n.gpus[timeSliced].processes, sample(a1, t3, 10), sample(b1, t3, 15))
	collectValid(t, s)
	check("second Collect", map[string]map[string]float64{
		id(timeSliced): {podA: 10, podB: 15},
		id(idleGPU):    {},
	})
	if got := testutil.ToFloat64(s.metrics.unresolved.WithLabelValues("unreadable")); got != 1 {
		t.Errorf("got %v unreadable processes after a window without them, want still 1", got)
	}
	if got := strings.Count(logs.String(), "in no pod the collector can find"); got != 1 {
		t.Errorf("got %d warnings about unresolved processes, want 1 (logged once):\n%s", got, logs.String())
	}

	// A PID absent from a window is forgotten: next time it is read again, and a1 has
	// since exited.
	collectValid(t, s)
	check("a window without samples, busy GPU", map[string]map[string]float64{id(idleGPU): {}})
	n.gpus[timeSliced].processes = append(n.gpus[timeSliced].processes, sample(a1, t3+100, 10))
	collectValid(t, s)
	check("a1 again, exited", map[string]map[string]float64{id(idleGPU): {}})

	// The metrics are registered under their names.
	if err := testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP gpuscaler_collector_nvml_unidentified_devices GPUs and MIG devices NVML lists but never identified (no UUID), so the last Collect could not report them.
# TYPE gpuscaler_collector_nvml_unidentified_devices gauge
gpuscaler_collector_nvml_unidentified_devices 0
`), "gpuscaler_collector_nvml_unidentified_devices"); err != nil {
		t.Error(err)
	}
	if got, err := testutil.GatherAndCount(reg, "gpuscaler_collector_nvml_unresolved_processes_total"); err != nil || got != 2 {
		t.Errorf("got %d unresolved-process series (%v), want 2 (by reason)", got, err)
	}
}

// TestPodUsageSmoothed: a pod's use is its mean over the windows of the last
// PodUsageSpan, from the first it appears in, a window it is absent from counting 0;
// windows the GPU was not measured in do not count, and windows age out. On a real
// time-sliced H200, two equally busy pods read 99/0, 66/33, 50/50 from one second to
// the next (PodUsageSpan): this is what makes them read near their shares.
func TestPodUsageSmoothed(t *testing.T) {
	const a, b = 1001, 2001
	root := t.TempDir()
	collectortest.WriteProcCgroup(t, root, a, "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod"+collectortest.PodUIDEscaped+".slice/cri-containerd-"+collectortest.ContainerID+".scope\n")
	collectortest.WriteProcCgroup(t, root, b, "0::/kubepods/besteffort/pod"+collectortest.PodUID2+"/"+collectortest.ContainerID+"\n")
	n := newMockNode(1)
	s := n.sourceWith(t, Config{ProcRoot: root})
	clock := time.Unix(1_700_000_000, 0)
	s.now = func() time.Time { return clock }
	gpu := n.gpus[0].uuid
	ts := uint64(1000)
	window := func(samples map[uint32]uint32) map[string]float64 {
		t.Helper()
		clock = clock.Add(time.Second)
		for pid, sm := range samples {
			ts++
			n.gpus[0].processes = append(n.gpus[0].processes, nvml.ProcessUtilizationSample{Pid: pid, TimeStamp: ts, SmUtil: sm})
		}
		collectValid(t, s)
		return s.PodUsage()[gpu]
	}
	for i, step := range []struct {
		samples map[uint32]uint32
		want    map[string]float64
	}{
		{map[uint32]uint32{a: 99}, map[string]float64{collectortest.PodUID: 99}},
		// b first appears: its mean counts from here, a's over both windows.
		{map[uint32]uint32{b: 66, a: 33}, map[string]float64{collectortest.PodUID: 66, collectortest.PodUID2: 66}},
		{map[uint32]uint32{a: 50, b: 50}, map[string]float64{collectortest.PodUID: 182.0 / 3, collectortest.PodUID2: 58}},
		{map[uint32]uint32{b: 99}, map[string]float64{collectortest.PodUID: 182.0 / 4, collectortest.PodUID2: 215.0 / 3}},
		{nil, nil}, // busy GPU, no sample: unmeasured, no window
		// Five seconds on, the first window (a at 99) has aged out.
		{map[uint32]uint32{a: 99}, map[string]float64{collectortest.PodUID: 182.0 / 4, collectortest.PodUID2: 215.0 / 4}},
	} {
		got := window(step.samples)
		if !maps.EqualFunc(got, step.want, func(x, y float64) bool { return math.Abs(x-y) < 1e-9 }) {
			t.Errorf("window %d: got %v, want %v", i, got, step.want)
		}
	}
}

// TestMetricsRegistration: a Registerer that refuses the metrics fails the start,
// and NVML is shut down again.
func TestMetricsRegistration(t *testing.T) {
	reg := prometheus.NewRegistry()
	n := newMockNode(1)
	n.sourceWith(t, Config{Registerer: reg})
	_, err := newSource(n.lib, Config{Registerer: reg}) // the same names again
	if err == nil || !strings.Contains(err.Error(), "metrics") {
		t.Fatalf("got error %v, want one about the metrics", err)
	}
	if got := len(n.lib.ShutdownCalls()); got != 1 {
		t.Errorf("got %d Shutdown calls, want 1", got)
	}
}
