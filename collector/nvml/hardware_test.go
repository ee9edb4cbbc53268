//go:build cgo && hardware

package nvml

// Checks against a real NVIDIA GPU, for a machine that has one: they are built only with
// the hardware tag, so `make test` and CI (no GPU) never compile them.
//
//	make test-hardware                       # or:
//	go test -tags hardware -count=1 -v -run Hardware ./collector/nvml/
//
// hack/hardware-check.sh runs them with a CUDA load on the GPU (GPUSCALER_HW_LOAD_PID, the
// load's PID, and GPUSCALER_HW_LOAD_MIB, what it holds), which the busy checks need; without
// a load they are skipped. What they read is logged (-v): the README's "On real GPUs"
// section records what one run saw.

import (
	"math"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/gpuscaler/gpuscaler/collector/internal/collectortest"
	"github.com/gpuscaler/gpuscaler/collector/mig"
	gpuscalerv1 "github.com/gpuscaler/gpuscaler/proto/gpuscaler/v1"
	"github.com/gpuscaler/gpuscaler/test/testkit"
)

// openHardware opens the NVML source as the collector does (collector.OpenSource),
// logging to the test.
func openHardware(t *testing.T, reg prometheus.Registerer) *Source {
	t.Helper()
	src, err := New(Config{Log: testkit.Logger(t), Registerer: reg})
	if err != nil {
		t.Fatalf("open the NVML source: %v", err)
	}
	t.Cleanup(func() {
		if err := src.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return src
}

// TestHardwareNVMLAgreesWithNVIDIASMI: every GPU nvidia-smi lists is reported once,
// under its UUID, index and name, with its framebuffer total exact to the MiB, its
// utilisation and memory in use present (never absent on a healthy GPU) and healthy.
func TestHardwareNVMLAgreesWithNVIDIASMI(t *testing.T) {
	smi := collectortest.NvidiaSMI(t)
	src := openHardware(t, nil)
	time.Sleep(time.Second) // a utilisation window after the source's first read
	samples, err := src.Collect(t.Context())
	if err != nil {
		t.Fatalf("Collect: %v", err)
	}
	collectortest.LogSamples(t, "NVML sample", samples)
	t.Logf("XID event set: %v (nil: NVML offers none here, XIDs are not watched)", src.events)
	if len(samples) != len(smi) {
		t.Fatalf("NVML source gave %d samples, nvidia-smi lists %d GPUs", len(samples), len(smi))
	}
	for _, want := range smi {
		i := slices.IndexFunc(samples, func(s *gpuscalerv1.GPUSample) bool { return s.GetUuid() == want.UUID })
		if i < 0 {
			t.Errorf("no sample for %s (index %d)", want.UUID, want.Index)
			continue
		}
		g := samples[i]
		if want.MIGMode == "Enabled" {
			t.Logf("GPU %d is in MIG mode: its MIG devices are reported instead", want.Index)
			continue
		}
		// A whole GPU's device id is its UUID, which DeviceId leaves empty.
		if g.GetIndex() != uint32(want.Index) || g.GetModel() != want.Name || g.DeviceID() != want.UUID {
			t.Errorf("GPU %s: index %d, model %q, device id %q; nvidia-smi says index %d, %q", want.UUID,
				g.GetIndex(), g.GetModel(), g.GetDeviceId(), want.Index, want.Name)
		}
		if g.GetUnhealthy() != "" {
			t.Errorf("GPU %s reads unhealthy: %s", want.UUID, g.GetUnhealthy())
		}
		if g.GpuUtil == nil || g.FbUsedBytes == nil || g.FbTotalBytes == nil {
			t.Errorf("GPU %s: a reading is absent (util %v, used %v, total %v)", want.UUID, g.GpuUtil, g.FbUsedBytes, g.FbTotalBytes)
			continue
		}
		// nvidia-smi's memory.total is NVML's total in MiB (nvmlDeviceGetMemoryInfo, the
		// v1 struct, as go-nvml's GetMemoryInfo).
		if got := float64(g.GetFbTotalBytes()) / (1 << 20); math.Abs(got-want.MemTotalMiB) > 1 {
			t.Errorf("GPU %s: framebuffer total %.0f MiB, nvidia-smi %.0f MiB", want.UUID, got, want.MemTotalMiB)
		}
		if g.Minor == nil {
			t.Errorf("GPU %s: no minor number (GKE's nvidiaN device ids need it)", want.UUID)
		}
	}
}

// TestHardwareBusyGPU: with the check script's CUDA load running, NVML reads the GPU
// busy and holding the load's memory, samples the load's process on it, and, the load
// being in no pod, leaves the GPU's per-pod use unmeasured (counted, never a 0).
func TestHardwareBusyGPU(t *testing.T) {
	pid, heldMiB := collectortest.LoadPID(t)
	if pid == 0 {
		t.Skip("no CUDA load: GPUSCALER_HW_LOAD_PID is not set (hack/hardware-check.sh sets it)")
	}
	collectortest.NvidiaSMI(t)
	reg := prometheus.NewRegistry()
	src := openHardware(t, reg)
	var (
		maxUtil, maxProc float64
		usedMiB          float64
		onGPU            string
	)
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) && (maxUtil < 50 || maxProc == 0) {
		time.Sleep(500 * time.Millisecond) // a sampling window: NVML averages utilisation over it
		samples, err := src.Collect(t.Context())
		if err != nil {
			t.Fatalf("Collect: %v", err)
		}
		for _, g := range samples {
			if g.GpuUtil != nil && *g.GpuUtil > maxUtil {
				maxUtil, onGPU = *g.GpuUtil, g.DeviceID()
				usedMiB = float64(g.GetFbUsedBytes()) / (1 << 20)
			}
		}
		src.mu.Lock()
		for id, byPID := range src.usage {
			if u, ok := byPID[pid]; ok {
				t.Logf("NVML per-process sample: pid %d at %.0f%% SM on %s (all: %v)", pid, u, id, byPID)
				maxProc = max(maxProc, u)
			}
		}
		src.mu.Unlock()
		if usage := src.PodUsage(); len(usage) > 0 {
			t.Errorf("PodUsage = %v: the load is in no pod, so no device's per-pod use is complete", usage)
		}
	}
	t.Logf("busiest GPU %s: util %.0f%%, %.0f MiB used (the load holds %.0f MiB); load process at %.0f%% SM",
		onGPU, maxUtil, usedMiB, heldMiB, maxProc)
	if maxUtil < 50 {
		t.Errorf("GPU utilisation peaked at %.0f%% under a matrix-multiply load", maxUtil)
	}
	if usedMiB < heldMiB {
		t.Errorf("framebuffer in use %.0f MiB, less than the load's %.0f MiB", usedMiB, heldMiB)
	}
	if maxProc == 0 {
		t.Errorf("NVML never sampled the load's process %d (GetProcessUtilization)", pid)
	}
	if n := testutil.ToFloat64(src.metrics.unresolved.WithLabelValues("no_pod")); maxProc > 0 && n == 0 {
		t.Errorf("the load's process, in no pod, was not counted in gpuscaler_collector_nvml_unresolved_processes_total{reason=\"no_pod\"}")
	}
}

// TestHardwareMIGProfileNames: the names the NVML source gives this GPU's MIG profiles
// (and the DCGM source, which asks NVML for them) are the device plugin's (NVIDIA's MIG
// user guide, "Supported MIG Profiles"). NVML answers a profile's size without MIG mode
// on a GPU that can run it; the check does not turn MIG on. The DCGM source's guess
// from sizes alone, when NVML cannot tell, is logged.
func TestHardwareMIGProfileNames(t *testing.T) {
	smi := collectortest.NvidiaSMI(t)
	if ret := nvml.Init(); ret != nvml.SUCCESS {
		t.Fatalf("nvml.Init: %v", ret)
	}
	defer nvml.Shutdown()
	dev, ret := nvml.DeviceGetHandleByIndex(0)
	if ret != nvml.SUCCESS {
		t.Fatalf("DeviceGetHandleByIndex(0): %v", ret)
	}
	mem, ret := dev.GetMemoryInfo()
	if ret != nvml.SUCCESS {
		t.Fatalf("GetMemoryInfo: %v", ret)
	}
	// From the MIG user guide's tables, by product.
	known := map[string][]string{
		"H100 80GB":      {"1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"},
		"H100 NVL":       {"1g.12gb", "1g.12gb+me", "1g.24gb", "2g.24gb", "3g.47gb", "4g.47gb", "7g.94gb"},
		"H200":           {"1g.18gb", "1g.18gb+me", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb"},
		"A100-SXM4-80GB": {"1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"},
	}
	var want []string
	for product, names := range known {
		if strings.Contains(smi[0].Name, product) {
			want = names
		}
	}
	var nvmlNames []string
	for i := range nvml.GPU_INSTANCE_PROFILE_COUNT {
		info, ret := dev.GetGpuInstanceProfileInfo(i)
		if ret != nvml.SUCCESS {
			t.Logf("GPU instance profile index %d: %v", i, ret)
			continue
		}
		n := mig.ProfileName(i, info.SliceCount, info.SliceCount, info.MemorySizeMB, mem.Total)
		d := mig.GuessProfileName(uint(info.SliceCount), float64(info.MemorySizeMB))
		t.Logf("profile index %d: id %d, %d slices, %d MiB, %d instances: named %q (DCGM's guess without NVML %q)",
			i, info.Id, info.SliceCount, info.MemorySizeMB, info.InstanceCount, n, d)
		nvmlNames = append(nvmlNames, n)
	}
	if len(nvmlNames) == 0 {
		t.Skip("NVML gives no MIG profile on this GPU")
	}
	if want == nil {
		t.Skipf("no known MIG profile table for %q; the names are logged above", smi[0].Name)
	}
	slices.Sort(nvmlNames)
	if want = slices.Sorted(slices.Values(want)); !slices.Equal(nvmlNames, want) {
		t.Errorf("named the profiles %v; %s's are %v", nvmlNames, smi[0].Name, want)
	}
}

// BenchmarkHardwareNVMLCollect: one Collect of every GPU on this machine, the NVML calls
// the collector makes each interval.
func BenchmarkHardwareNVMLCollect(b *testing.B) {
	if _, err := exec.LookPath("nvidia-smi"); err != nil {
		b.Skip("no nvidia-smi on the PATH: not a GPU machine")
	}
	src, err := New(Config{})
	if err != nil {
		b.Fatal(err)
	}
	defer src.Close()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := src.Collect(b.Context()); err != nil {
			b.Fatal(err)
		}
	}
}

// TestHardwareProcessSamples logs what nvmlDeviceGetProcessUtilization gives, raw, over
// two seconds: how often the driver samples and what one sample holds, which
// sampleProcesses reads. It checks nothing; run it with loads on the GPU.
func TestHardwareProcessSamples(t *testing.T) {
	collectortest.NvidiaSMI(t)
	if ret := nvml.Init(); ret != nvml.SUCCESS {
		t.Fatalf("nvml.Init: %v", ret)
	}
	defer nvml.Shutdown()
	dev, ret := nvml.DeviceGetHandleByIndex(0)
	if ret != nvml.SUCCESS {
		t.Fatalf("DeviceGetHandleByIndex(0): %v", ret)
	}
	var since uint64
	for i := range 8 {
		time.Sleep(250 * time.Millisecond) // a sampling window between reads of the process samples
		samples, ret := dev.GetProcessUtilization(since)
		util, _ := dev.GetUtilizationRates()
		t.Logf("read %d (since %d): %v, %d samples; GPU util %d%%", i, since, ret, len(samples), util.Gpu)
		for _, p := range samples {
			if p.Pid == 0 {
				continue
			}
			t.Logf("  pid %d ts %d sm %d mem %d", p.Pid, p.TimeStamp, p.SmUtil, p.MemUtil)
			since = max(since, p.TimeStamp)
		}
	}
}
