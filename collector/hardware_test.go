//go:build cgo && hardware

package collector

// Checks against a real NVIDIA GPU, for a machine that has one: they are built only with
// the hardware tag, so `make test` and CI (no GPU) never compile them.
//
//	make test-hardware                       # or:
//	go test -tags hardware -count=1 -v -run Hardware ./collector/
//
// hack/hardware-check.sh runs them with a CUDA load on the GPU (GPUSCALER_HW_LOAD_PID, the
// load's PID, and GPUSCALER_HW_LOAD_MIB, what it holds), which the busy checks need; without
// a load they are skipped. What they read is logged (-v): the README's "On real GPUs"
// section records what one run saw.

import (
	"bytes"
	"context"
	"encoding/csv"
	"errors"
	"math"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/protobuf/encoding/protojson"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/gpuscaler/gpuscaler/internal/natstest"
	pb "github.com/gpuscaler/gpuscaler/proto/externalscaler"
	gpuscalerv1 "github.com/gpuscaler/gpuscaler/proto/gpuscaler/v1"
	"github.com/gpuscaler/gpuscaler/scaler/scalertest"
	"github.com/gpuscaler/gpuscaler/test/testkit"
)

// smiGPU is one GPU as nvidia-smi reads it.
type smiGPU struct {
	index                 int
	uuid, name, migMode   string
	memTotalMiB, memUsed  float64
	util                  float64
	utilKnown, memUsedSet bool
}

// nvidiaSMI reads every GPU through nvidia-smi, the driver's own tool, which the
// checks take as the truth; the test is skipped without it.
func nvidiaSMI(t *testing.T) []smiGPU {
	t.Helper()
	path, err := exec.LookPath("nvidia-smi")
	if err != nil {
		t.Skip("no nvidia-smi on the PATH: not a GPU machine")
	}
	out, err := exec.Command(path, "--query-gpu=index,uuid,name,memory.total,memory.used,utilization.gpu,mig.mode.current",
		"--format=csv,noheader,nounits").Output()
	if err != nil {
		t.Fatalf("nvidia-smi: %v", err)
	}
	r := csv.NewReader(bytes.NewReader(out))
	r.TrimLeadingSpace = true
	rows, err := r.ReadAll()
	if err != nil {
		t.Fatalf("nvidia-smi output %q: %v", out, err)
	}
	var gpus []smiGPU
	for _, row := range rows {
		if len(row) != 7 {
			t.Fatalf("nvidia-smi row %q: want 7 fields", row)
		}
		g := smiGPU{uuid: row[1], name: row[2], migMode: row[6]}
		g.index, _ = strconv.Atoi(row[0])
		g.memTotalMiB, _ = strconv.ParseFloat(row[3], 64)
		var uerr, merr error
		g.memUsed, merr = strconv.ParseFloat(row[4], 64)
		g.memUsedSet = merr == nil
		g.util, uerr = strconv.ParseFloat(row[5], 64)
		g.utilKnown = uerr == nil // "[N/A]" in MIG mode
		gpus = append(gpus, g)
	}
	t.Logf("nvidia-smi: %s", bytes.TrimSpace(out))
	return gpus
}

// openHardwareNVML opens the NVML source as the collector does (OpenSource), logging
// to the test.
func openHardwareNVML(t *testing.T, reg prometheus.Registerer) *nvmlSource {
	t.Helper()
	src, err := OpenSource(SourceConfig{Kind: "nvml", Every: time.Second, Log: testkit.Logger(t), Registerer: reg})
	if err != nil {
		t.Fatalf("open the NVML source: %v", err)
	}
	t.Cleanup(func() {
		if err := src.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return src.(*nvmlSource)
}

func logSamples(t *testing.T, what string, samples []*gpuscalerv1.GPUSample) {
	t.Helper()
	for _, s := range samples {
		t.Logf("%s: %s", what, protojson.Format(s))
	}
}

// loadPID is the PID of the CUDA load the check script started, 0 without one.
func loadPID(t *testing.T) (pid uint32, heldMiB float64) {
	t.Helper()
	v := os.Getenv("GPUSCALER_HW_LOAD_PID")
	if v == "" {
		return 0, 0
	}
	n, err := strconv.ParseUint(v, 10, 32)
	if err != nil {
		t.Fatalf("GPUSCALER_HW_LOAD_PID=%q: %v", v, err)
	}
	mib, _ := strconv.ParseFloat(os.Getenv("GPUSCALER_HW_LOAD_MIB"), 64)
	return uint32(n), mib
}

// TestHardwareNVMLAgreesWithNVIDIASMI: every GPU nvidia-smi lists is reported once,
// under its UUID, index and name, with its framebuffer total exact to the MiB, its
// utilisation and memory in use present (never absent on a healthy GPU) and healthy.
func TestHardwareNVMLAgreesWithNVIDIASMI(t *testing.T) {
	smi := nvidiaSMI(t)
	src := openHardwareNVML(t, nil)
	time.Sleep(time.Second) // a utilisation window after the source's first read
	samples, err := src.Collect(t.Context())
	if err != nil {
		t.Fatalf("Collect: %v", err)
	}
	logSamples(t, "NVML sample", samples)
	t.Logf("XID event set: %v (nil: NVML offers none here, XIDs are not watched)", src.events)
	if len(samples) != len(smi) {
		t.Fatalf("NVML source gave %d samples, nvidia-smi lists %d GPUs", len(samples), len(smi))
	}
	for _, want := range smi {
		i := slices.IndexFunc(samples, func(s *gpuscalerv1.GPUSample) bool { return s.GetUuid() == want.uuid })
		if i < 0 {
			t.Errorf("no sample for %s (index %d)", want.uuid, want.index)
			continue
		}
		g := samples[i]
		if want.migMode == "Enabled" {
			t.Logf("GPU %d is in MIG mode: its MIG devices are reported instead", want.index)
			continue
		}
		// A whole GPU's device id is its UUID, which DeviceId leaves empty.
		if g.GetIndex() != uint32(want.index) || g.GetModel() != want.name || g.DeviceID() != want.uuid {
			t.Errorf("GPU %s: index %d, model %q, device id %q; nvidia-smi says index %d, %q", want.uuid,
				g.GetIndex(), g.GetModel(), g.GetDeviceId(), want.index, want.name)
		}
		if g.GetUnhealthy() != "" {
			t.Errorf("GPU %s reads unhealthy: %s", want.uuid, g.GetUnhealthy())
		}
		if g.GpuUtil == nil || g.FbUsedBytes == nil || g.FbTotalBytes == nil {
			t.Errorf("GPU %s: a reading is absent (util %v, used %v, total %v)", want.uuid, g.GpuUtil, g.FbUsedBytes, g.FbTotalBytes)
			continue
		}
		// nvidia-smi's memory.total is NVML's total in MiB (nvmlDeviceGetMemoryInfo, the
		// v1 struct, as go-nvml's GetMemoryInfo).
		if got := float64(g.GetFbTotalBytes()) / (1 << 20); math.Abs(got-want.memTotalMiB) > 1 {
			t.Errorf("GPU %s: framebuffer total %.0f MiB, nvidia-smi %.0f MiB", want.uuid, got, want.memTotalMiB)
		}
		if g.Minor == nil {
			t.Errorf("GPU %s: no minor number (GKE's nvidiaN device ids need it)", want.uuid)
		}
	}
}

// TestHardwareAutoFallsBackToNVML: --source auto takes DCGM where libdcgm is installed,
// else NVML, and --source dcgm without DCGM fails saying what is missing.
func TestHardwareAutoFallsBackToNVML(t *testing.T) {
	nvidiaSMI(t)
	_, dcgmErr := NewDCGM(DCGMConfig{Every: time.Second, Log: testkit.Logger(t)})
	t.Logf("--source dcgm: %v", dcgmErr)
	src, err := OpenSource(SourceConfig{Kind: "auto", Every: time.Second, Log: testkit.Logger(t)})
	if err != nil {
		t.Fatalf("--source auto: %v", err)
	}
	defer src.Close()
	t.Logf("--source auto opened %q", src.Name())
	switch {
	case dcgmErr == nil && src.Name() != "dcgm":
		t.Errorf("DCGM opens here, but auto chose %q", src.Name())
	case dcgmErr != nil && src.Name() != "nvml":
		t.Errorf("DCGM does not open here (%v), but auto chose %q", dcgmErr, src.Name())
	case dcgmErr != nil && !errors.Is(dcgmErr, ErrNoGPUSource):
		t.Errorf("DCGM's failure %v is not ErrNoGPUSource: auto would not say what it tried", dcgmErr)
	}
}

// TestHardwareBusyGPU: with the check script's CUDA load running, NVML reads the GPU
// busy and holding the load's memory, samples the load's process on it, and, the load
// being in no pod, leaves the GPU's per-pod use unmeasured (counted, never a 0).
func TestHardwareBusyGPU(t *testing.T) {
	pid, heldMiB := loadPID(t)
	if pid == 0 {
		t.Skip("no CUDA load: GPUSCALER_HW_LOAD_PID is not set (hack/hardware-check.sh sets it)")
	}
	nvidiaSMI(t)
	reg := prometheus.NewRegistry()
	src := openHardwareNVML(t, reg)
	var (
		maxUtil, maxProc float64
		usedMiB          float64
		onGPU            string
	)
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) && (maxUtil < 50 || maxProc == 0) {
		time.Sleep(500 * time.Millisecond)
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

// TestHardwareThroughScaler runs the real GPU end to end: the kubelet's pod-resources API
// (a real gRPC server on a unix socket) says two time-sliced pods hold GPU 0 (the device
// plugin's "<uuid>::<n>" replicas), the real Collector reads it through NVML and publishes
// into an in-process NATS server, and the scaler answers what KEDA asks. Under the load
// the trigger is active and its gpu-util is the GPU's utilisation over half a GPU per pod.
func TestHardwareThroughScaler(t *testing.T) {
	pid, _ := loadPID(t)
	if pid == 0 {
		t.Skip("no CUDA load: GPUSCALER_HW_LOAD_PID is not set (hack/hardware-check.sh sets it)")
	}
	smi := nvidiaSMI(t)
	gpu := smi[0].uuid
	for _, g := range smi {
		if g.migMode != "Enabled" {
			gpu = g.uuid
			break
		}
	}
	src := openHardwareNVML(t, nil)
	sock := socketPath(t)
	serveKubelet(t, sock, &fakeKubelet{
		allocatable: &podresourcesv1.AllocatableResourcesResponse{Devices: []*podresourcesv1.ContainerDevices{
			devices("nvidia.com/gpu", replicas(gpu, 4)...)}},
		list: &podresourcesv1.ListPodResourcesResponse{PodResources: []*podresourcesv1.PodResources{
			podHolding("ml", "llm-0", devices("nvidia.com/gpu", gpu+"::0")),
			podHolding("ml", "llm-1", devices("nvidia.com/gpu", gpu+"::2")),
		}},
	})
	ns := natstest.Start(t, "", "")
	_, client := scalertest.Start(t, ns.ClientURL())
	node := "gpu-node"
	reports := subscribeReports(t, ns.ClientURL(), node)
	runCollector(t, Config{Node: node, Interval: 500 * time.Millisecond, CollectorID: "hardware"}, src,
		newTestPodResources(t, PodResourcesConfig{Socket: sock}), podsOf{
			"ml/llm-0": {UID: "u0", Labels: map[string]string{"app": "llm"}},
			"ml/llm-1": {UID: "u1", Labels: map[string]string{"app": "llm"}},
		}, natstest.Connect(t, ns.ClientURL()).Conn)

	ref := &pb.ScaledObjectRef{Name: "llm", Namespace: "ml", ScalerMetadata: map[string]string{
		"scalerAddress": "gpuscaler:9090", "podSelector": "app=llm", "gpuUtilTarget": "50",
	}}
	var value float64
	var lastErr error
	testkit.Eventually(t, 15*time.Second, func() bool {
		resp, err := client.GetMetrics(context.Background(), &pb.GetMetricsRequest{ScaledObjectRef: ref, MetricName: "gpu-util"})
		lastErr = err
		if err != nil {
			return false
		}
		value = resp.GetMetricValues()[0].GetMetricValueFloat()
		return value > 20
	})
	t.Logf("gpu-util for app=llm: %.1f (last error %v)", value, lastErr)
	active, err := client.IsActive(context.Background(), ref)
	if err != nil || !active.GetResult() {
		t.Fatalf("IsActive = %v, %v; want true under load", active, err)
	}
	// The newest report's reading of the GPU, over 1 GPU / 2 pods, is what the scaler
	// answered, give or take the report that landed between the two reads.
	rs := reports()
	if len(rs) == 0 {
		t.Fatal("no NodeReport seen")
	}
	last := rs[len(rs)-1]
	logSamples(t, "reported", last.GetGpus())
	for _, g := range last.GetGpus() {
		if g.GetUuid() != gpu {
			continue
		}
		if g.GetPod().GetName() != "llm-0" || len(g.GetOtherPods()) != 1 || g.GetOtherPods()[0].GetName() != "llm-1" || !g.GetShared() {
			t.Errorf("GPU %s: pod %v, others %v, shared %v; want llm-0 and llm-1 sharing it", gpu, g.GetPod(), g.GetOtherPods(), g.GetShared())
		}
		if v := g.GetGpuUtil() * 2; math.Abs(v-value) > 50 {
			t.Logf("gpu-util %.1f against the last report's %.1f × 2 = %.1f: the load's utilisation moved between reads", value, g.GetGpuUtil(), v)
		}
	}
	if !strings.Contains(protojson.Format(last), gpu) {
		t.Errorf("the last report does not name %s", gpu)
	}
}

// hwPod is a pod the check script made: a CUDA load moved into a cgroup shaped as the
// kubelet shapes a container's (GPUSCALER_HW_POD_<name>_PID and _UID).
type hwPod struct {
	pid uint32
	uid string
}

func hardwarePod(t *testing.T, name string) hwPod {
	t.Helper()
	pid, err := strconv.ParseUint(os.Getenv("GPUSCALER_HW_POD_"+name+"_PID"), 10, 32)
	uid := os.Getenv("GPUSCALER_HW_POD_" + name + "_UID")
	if err != nil || uid == "" {
		t.Skip("no pods: GPUSCALER_HW_POD_" + name + "_PID and _UID are not set (hack/hardware-check.sh sets them)")
	}
	return hwPod{uint32(pid), uid}
}

// TestHardwareSharedGPUPerPod: two pods time-slice one GPU, ml/llm-0 busy all the time
// and ml/batch-0 about a tenth of it (GPUSCALER_HW_POD_B_DUTY; at 0.5 or more both
// should get a fair share), each a real process in a kubelet-shaped cgroup.
// NVML's per-process samples, joined to the pods through /proc/<pid>/cgroup, give each
// pod its own figure (PodRef.gpu_util), so the scaler sees llm busy and batch nearly
// idle; split evenly, as without them, both would read the same.
func TestHardwareSharedGPUPerPod(t *testing.T) {
	llm, batch := hardwarePod(t, "A"), hardwarePod(t, "B")
	smi := nvidiaSMI(t)
	gpu := smi[0].uuid
	src := openHardwareNVML(t, nil)
	sock := socketPath(t)
	serveKubelet(t, sock, &fakeKubelet{
		allocatable: &podresourcesv1.AllocatableResourcesResponse{Devices: []*podresourcesv1.ContainerDevices{
			devices("nvidia.com/gpu", replicas(gpu, 4)...)}},
		list: &podresourcesv1.ListPodResourcesResponse{PodResources: []*podresourcesv1.PodResources{
			podHolding("ml", "llm-0", devices("nvidia.com/gpu", gpu+"::0")),
			podHolding("ml", "batch-0", devices("nvidia.com/gpu", gpu+"::1")),
		}},
	})
	ns := natstest.Start(t, "", "")
	_, client := scalertest.Start(t, ns.ClientURL())
	const node = "gpu-node"
	reports := subscribeReports(t, ns.ClientURL(), node)
	runCollector(t, Config{Node: node, Interval: 500 * time.Millisecond, CollectorID: "hardware"}, src,
		newTestPodResources(t, PodResourcesConfig{Socket: sock}), podsOf{
			"ml/llm-0":   {UID: llm.uid, Labels: map[string]string{"app": "llm"}},
			"ml/batch-0": {UID: batch.uid, Labels: map[string]string{"app": "batch"}},
		}, natstest.Connect(t, ns.ClientURL()).Conn)

	own := func() (llmUtil, batchUtil *float64) {
		rs := reports()
		if len(rs) == 0 {
			return nil, nil
		}
		for _, g := range rs[len(rs)-1].GetGpus() {
			for _, p := range append([]*gpuscalerv1.PodRef{g.GetPod()}, g.GetOtherPods()...) {
				switch p.GetName() {
				case "llm-0":
					llmUtil = p.GpuUtil
				case "batch-0":
					batchUtil = p.GpuUtil
				}
			}
		}
		return llmUtil, batchUtil
	}
	testkit.Eventually(t, 20*time.Second, func() bool { l, b := own(); return l != nil && b != nil })
	// Each pod's figure is the mean of the last nvmlPodUsageSpan's windows: wait for a
	// span of them, logging each window's per-process samples as NVML gave them.
	for end := time.Now().Add(nvmlPodUsageSpan + time.Second); time.Now().Before(end); {
		time.Sleep(500 * time.Millisecond)
		src.mu.Lock()
		t.Logf("per-process SM use in the window (device → pid → %%): %v; pids llm-0 %d, batch-0 %d", src.usage, llm.pid, batch.pid)
		src.mu.Unlock()
	}
	l, b := own()
	metric := func(app string) float64 {
		resp, err := client.GetMetrics(context.Background(), &pb.GetMetricsRequest{
			ScaledObjectRef: &pb.ScaledObjectRef{Name: app, Namespace: "ml", ScalerMetadata: map[string]string{
				"scalerAddress": "gpuscaler:9090", "podSelector": "app=" + app, "gpuUtilTarget": "50"}},
			MetricName: "gpu-util"})
		if err != nil {
			t.Fatalf("gpu-util for app=%s: %v", app, err)
		}
		return resp.GetMetricValues()[0].GetMetricValueFloat()
	}
	lm, bm := metric("llm"), metric("batch")
	t.Logf("own use of the GPU: llm-0 %.0f%%, batch-0 %.0f%%; gpu-util per GPU held: app=llm %.0f, app=batch %.0f", *l, *b, lm, bm)
	if duty, _ := strconv.ParseFloat(os.Getenv("GPUSCALER_HW_POD_B_DUTY"), 64); duty >= 0.5 {
		// Both busy all the time: the GPU's time is split between them.
		if *l < 25 || *b < 25 || *l > 75 || *b > 75 {
			t.Errorf("two equally busy pods read %.0f%% and %.0f%% (gpu-util %.0f and %.0f): want each a fair share", *l, *b, lm, bm)
		}
		return
	}
	if *l < 2**b {
		t.Errorf("llm-0's own use %.0f%% is not well above batch-0's %.0f%%: the samples did not tell the processes apart", *l, *b)
	}
	if lm < 2*bm {
		t.Errorf("gpu-util app=llm %.0f, app=batch %.0f: the scaler did not use the pods' own figures", lm, bm)
	}
}

// TestHardwareMIGProfileNames: the names the NVML source gives this GPU's MIG profiles
// (and the DCGM source, which asks NVML for them) are the device plugin's (NVIDIA's MIG
// user guide, "Supported MIG Profiles"). NVML answers a profile's size without MIG mode
// on a GPU that can run it; the check does not turn MIG on. The DCGM source's guess
// from sizes alone, when NVML cannot tell, is logged.
func TestHardwareMIGProfileNames(t *testing.T) {
	smi := nvidiaSMI(t)
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
		if strings.Contains(smi[0].name, product) {
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
		n := nvmlMIGProfile(i, info.SliceCount, info.SliceCount, info.MemorySizeMB, mem.Total)
		d := migProfileName(uint(info.SliceCount), float64(info.MemorySizeMB))
		t.Logf("profile index %d: id %d, %d slices, %d MiB, %d instances: named %q (DCGM's guess without NVML %q)",
			i, info.Id, info.SliceCount, info.MemorySizeMB, info.InstanceCount, n, d)
		nvmlNames = append(nvmlNames, n)
	}
	if len(nvmlNames) == 0 {
		t.Skip("NVML gives no MIG profile on this GPU")
	}
	if want == nil {
		t.Skipf("no known MIG profile table for %q; the names are logged above", smi[0].name)
	}
	slices.Sort(nvmlNames)
	if want = slices.Sorted(slices.Values(want)); !slices.Equal(nvmlNames, want) {
		t.Errorf("named the profiles %v; %s's are %v", nvmlNames, smi[0].name, want)
	}
}

// BenchmarkHardwareNVMLCollect: one Collect of every GPU on this machine, the NVML calls
// the collector makes each interval.
func BenchmarkHardwareNVMLCollect(b *testing.B) {
	if _, err := exec.LookPath("nvidia-smi"); err != nil {
		b.Skip("no nvidia-smi on the PATH: not a GPU machine")
	}
	src, err := OpenSource(SourceConfig{Kind: "nvml", Every: time.Second})
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
	nvidiaSMI(t)
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
		time.Sleep(250 * time.Millisecond)
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
