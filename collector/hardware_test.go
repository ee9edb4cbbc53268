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
	"context"
	"errors"
	"math"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/encoding/protojson"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/gpuscaler/gpuscaler/collector/dcgm"
	"github.com/gpuscaler/gpuscaler/collector/internal/collectortest"
	"github.com/gpuscaler/gpuscaler/collector/kubelet"
	"github.com/gpuscaler/gpuscaler/collector/nvml"
	"github.com/gpuscaler/gpuscaler/internal/natstest"
	pb "github.com/gpuscaler/gpuscaler/proto/externalscaler"
	gpuscalerv1 "github.com/gpuscaler/gpuscaler/proto/gpuscaler/v1"
	"github.com/gpuscaler/gpuscaler/scaler/scalertest"
	"github.com/gpuscaler/gpuscaler/test/testkit"
)

// openHardwareNVML opens the NVML source as the collector does (OpenSource), logging
// to the test.
func openHardwareNVML(t *testing.T, reg prometheus.Registerer) Source {
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
	return src
}

// TestHardwareAutoFallsBackToNVML: --source auto takes DCGM where libdcgm is installed,
// else NVML, and --source dcgm without DCGM fails saying what is missing.
func TestHardwareAutoFallsBackToNVML(t *testing.T) {
	collectortest.NvidiaSMI(t)
	_, dcgmErr := dcgm.New(dcgm.Config{Every: time.Second, Log: testkit.Logger(t)})
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

// TestHardwareThroughScaler runs the real GPU end to end: the kubelet's pod-resources API
// (a real gRPC server on a unix socket) says two time-sliced pods hold GPU 0 (the device
// plugin's "<uuid>::<n>" replicas), the real Collector reads it through NVML and publishes
// into an in-process NATS server, and the scaler answers what KEDA asks. Under the load
// the trigger is active and its gpu-util is the GPU's utilisation over half a GPU per pod.
func TestHardwareThroughScaler(t *testing.T) {
	pid, _ := collectortest.LoadPID(t)
	if pid == 0 {
		t.Skip("no CUDA load: GPUSCALER_HW_LOAD_PID is not set (hack/hardware-check.sh sets it)")
	}
	smi := collectortest.NvidiaSMI(t)
	gpu := smi[0].UUID
	for _, g := range smi {
		if g.MIGMode != "Enabled" {
			gpu = g.UUID
			break
		}
	}
	src := openHardwareNVML(t, nil)
	sock := collectortest.SocketPath(t)
	collectortest.ServeKubelet(t, sock, &collectortest.Kubelet{
		Allocatable: &podresourcesv1.AllocatableResourcesResponse{Devices: []*podresourcesv1.ContainerDevices{
			collectortest.Devices("nvidia.com/gpu", collectortest.Replicas(gpu, 4)...)}},
		Pods: &podresourcesv1.ListPodResourcesResponse{PodResources: []*podresourcesv1.PodResources{
			collectortest.PodHolding("ml", "llm-0", collectortest.Devices("nvidia.com/gpu", gpu+"::0")),
			collectortest.PodHolding("ml", "llm-1", collectortest.Devices("nvidia.com/gpu", gpu+"::2")),
		}},
	})
	ns := natstest.Start(t, "", "")
	_, client := scalertest.Start(t, ns.ClientURL())
	node := "gpu-node"
	reports := subscribeReports(t, ns.ClientURL(), node)
	runCollector(t, Config{Node: node, Interval: 500 * time.Millisecond, CollectorID: "hardware"}, src,
		newTestPodResources(t, kubelet.PodResourcesConfig{Socket: sock}), podsOf{
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
	collectortest.LogSamples(t, "reported", last.GetGpus())
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
	smi := collectortest.NvidiaSMI(t)
	gpu := smi[0].UUID
	src := openHardwareNVML(t, nil)
	sock := collectortest.SocketPath(t)
	collectortest.ServeKubelet(t, sock, &collectortest.Kubelet{
		Allocatable: &podresourcesv1.AllocatableResourcesResponse{Devices: []*podresourcesv1.ContainerDevices{
			collectortest.Devices("nvidia.com/gpu", collectortest.Replicas(gpu, 4)...)}},
		Pods: &podresourcesv1.ListPodResourcesResponse{PodResources: []*podresourcesv1.PodResources{
			collectortest.PodHolding("ml", "llm-0", collectortest.Devices("nvidia.com/gpu", gpu+"::0")),
			collectortest.PodHolding("ml", "batch-0", collectortest.Devices("nvidia.com/gpu", gpu+"::1")),
		}},
	})
	ns := natstest.Start(t, "", "")
	_, client := scalertest.Start(t, ns.ClientURL())
	const node = "gpu-node"
	reports := subscribeReports(t, ns.ClientURL(), node)
	runCollector(t, Config{Node: node, Interval: 500 * time.Millisecond, CollectorID: "hardware"}, src,
		newTestPodResources(t, kubelet.PodResourcesConfig{Socket: sock}), podsOf{
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
	// Each pod's figure is the mean of the last nvml.PodUsageSpan's windows: wait for a
	// span of them, logging each report's figures (the NVML source's own tests,
	// collector/nvml/hardware_test.go, log its per-process samples).
	for end := time.Now().Add(nvml.PodUsageSpan + time.Second); time.Now().Before(end); {
		time.Sleep(500 * time.Millisecond) // one report interval between the figures logged
		l, b := own()
		t.Logf("own use of the GPU in the last report: llm-0 %v, batch-0 %v; pids llm-0 %d, batch-0 %d", fmtUtil(l), fmtUtil(b), llm.pid, batch.pid)
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

// fmtUtil shows a utilisation that may be absent.
func fmtUtil(u *float64) string {
	if u == nil {
		return "absent"
	}
	return strconv.FormatFloat(*u, 'f', 0, 64) + "%"
}
