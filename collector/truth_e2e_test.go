package collector

import (
	"math"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/gpuscaler/gpuscaler/collector/internal/collectortest"
	"github.com/gpuscaler/gpuscaler/collector/kubelet"
	"github.com/gpuscaler/gpuscaler/collector/sim"
	"github.com/gpuscaler/gpuscaler/internal/natstest"
	pb "github.com/gpuscaler/gpuscaler/proto/externalscaler"
	"github.com/gpuscaler/gpuscaler/scaler/scalertest"
	"github.com/gpuscaler/gpuscaler/test/testkit"
)

// TestGPUTruthThroughScaler runs node-lab layouts end to end: a real pod-resources server
// on a unix socket, the real Collector publishing into an in-process NATS server, and the
// real scaler answering over gRPC what KEDA asks. Time-sliced pods at 90% read as busy and
// active; a device the collector cannot match, or a pod whose labels it cannot read, gives
// Unavailable naming the pod, never a 0.
func TestGPUTruthThroughScaler(t *testing.T) {
	// Four replicas of GPU 0 (NVIDIA/k8s-device-plugin NewAnnotatedID), three held by
	// ml/llm-* pods: the GPU runs at 90% (labSamples).
	timeSliced := func(extra ...*podresourcesv1.PodResources) *collectortest.Kubelet {
		return &collectortest.Kubelet{
			Allocatable: &podresourcesv1.AllocatableResourcesResponse{Devices: []*podresourcesv1.ContainerDevices{
				collectortest.Devices("nvidia.com/gpu", collectortest.Replicas(labGPU0, 4)...),
				collectortest.Devices("nvidia.com/mig-1g.10gb", labMIGa, labMIGb),
			}},
			Pods: &podresourcesv1.ListPodResourcesResponse{PodResources: append([]*podresourcesv1.PodResources{
				collectortest.PodHolding("ml", "llm-0", collectortest.Devices("nvidia.com/gpu", labGPU0+"::0")),
				collectortest.PodHolding("ml", "llm-1", collectortest.Devices("nvidia.com/gpu", labGPU0+"::1")),
				collectortest.PodHolding("ml", "llm-2", collectortest.Devices("nvidia.com/gpu", labGPU0+"::3")),
			}, extra...)},
		}
	}
	llmPods := podsOf{
		"ml/llm-0": {UID: "u0", Labels: map[string]string{"app": "llm"}},
		"ml/llm-1": {UID: "u1", Labels: map[string]string{"app": "llm"}},
		"ml/llm-2": {UID: "u2", Labels: map[string]string{"app": "llm"}},
	}
	md := map[string]string{"scalerAddress": "gpuscaler:9090", "podSelector": "app=llm", "gpuUtilTarget": "70"}

	tests := map[string]struct {
		kubelet   *collectortest.Kubelet
		pods      podsOf
		wantValue float64  // gpu-util, when wantErr is empty
		wantErr   []string // in the Unavailable error of GetMetrics and IsActive
	}{
		// One GPU at 90% over three pods: 90 / (1 GPU / 3 pods) = 270; the HPA asks
		// ceil(270/70) = 4 pods, as 3 × 90/70 rounds up to.
		"time-sliced pods at 90% are busy and active": {kubelet: timeSliced(), pods: llmPods, wantValue: 270},
		"a selected pod's device matches no GPU": {
			kubelet: timeSliced(collectortest.PodHolding("ml", "llm-3", collectortest.Devices("nvidia.com/gpu", "GPU-99999999-0000-0000-0000-000000000000"))),
			pods:    merge(llmPods, podsOf{"ml/llm-3": {UID: "u3", Labels: map[string]string{"app": "llm"}}}),
			wantErr: []string{"pod ml/llm-3 on node node-1 holds device GPU-99999999-0000-0000-0000-000000000000", "could not match to a GPU"},
		},
		"a device id in no known form": {
			kubelet: timeSliced(collectortest.PodHolding("ml", "llm-3", collectortest.Devices("nvidia.com/gpu", "weird-id"))),
			pods:    merge(llmPods, podsOf{"ml/llm-3": {UID: "u3", Labels: map[string]string{"app": "llm"}}}),
			wantErr: []string{"pod ml/llm-3 on node node-1 holds device weird-id", "no known form"},
		},
		"a pod whose labels the collector cannot read": {
			kubelet: timeSliced(),
			pods:    podsOf{"ml/llm-0": llmPods["ml/llm-0"], "ml/llm-1": llmPods["ml/llm-1"]},
			wantErr: []string{"pod ml/llm-2 on node node-1 holds GPU " + labGPU0, "could not read the pod's labels"},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			sock := collectortest.SocketPath(t)
			collectortest.ServeKubelet(t, sock, tc.kubelet)
			ns := natstest.Start(t, "", "")
			_, client := scalertest.Start(t, ns.ClientURL())
			runCollector(t, Config{Node: "node-1", Interval: 50 * time.Millisecond}, labSource{labSamples},
				newTestPodResources(t, kubelet.PodResourcesConfig{Socket: sock}), tc.pods, natstest.Connect(t, ns.ClientURL()).Conn)
			ref := &pb.ScaledObjectRef{Name: "llm", Namespace: "ml", ScalerMetadata: md}

			var lastErr error
			testkit.Eventually(t, 5*time.Second, func() bool {
				resp, err := client.GetMetrics(t.Context(), &pb.GetMetricsRequest{ScaledObjectRef: ref, MetricName: "gpu-util"})
				lastErr = err
				if len(tc.wantErr) > 0 {
					return err != nil && strings.Contains(err.Error(), tc.wantErr[0])
				}
				return err == nil && math.Abs(resp.GetMetricValues()[0].GetMetricValueFloat()-tc.wantValue) < 1e-9
			})
			active, err := client.IsActive(t.Context(), ref)
			if len(tc.wantErr) == 0 {
				if err != nil || !active.GetResult() {
					t.Fatalf("IsActive = %v, %v; want true", active, err)
				}
				return
			}
			for _, e := range []error{lastErr, err} {
				if status.Code(e) != codes.Unavailable {
					t.Fatalf("error %v, want Unavailable", e)
				}
				for _, want := range tc.wantErr {
					if !strings.Contains(e.Error(), want) {
						t.Errorf("error %q does not mention %q", e, want)
					}
				}
			}
		})
	}
}

func merge(a, b podsOf) podsOf {
	out := podsOf{}
	for k, v := range a {
		out[k] = v
	}
	for k, v := range b {
		out[k] = v
	}
	return out
}

// TestPerPodUsageThroughScaler: two workloads time-sliced on one GPU at 90%, one using 20
// of it and the other 70, measured per pod (the sim stands in for NVML's per-process
// samples). The first workload's trigger reads its own 20% on its half of the GPU, 40%
// per GPU, not the device's 90%.
func TestPerPodUsageThroughScaler(t *testing.T) {
	util := func(v float64) *float64 { return &v }
	simulated, err := sim.New("node-1", sim.Config{GPUs: 2, Replicas: 2, Pods: []sim.Pod{
		{Namespace: "ml", Name: "a-0", Labels: map[string]string{"app": "a"}, GPUs: []string{"0"}, Util: util(20)},
		{Namespace: "ml", Name: "b-0", Labels: map[string]string{"app": "b"}, GPUs: []string{"0"}, Util: util(70)},
	}})
	if err != nil {
		t.Fatal(err)
	}
	ns := natstest.Start(t, "", "")
	_, client := scalertest.Start(t, ns.ClientURL())
	runCollector(t, Config{Node: "node-1", Interval: 50 * time.Millisecond}, simulated, simulated, simulated, natstest.Connect(t, ns.ClientURL()).Conn)
	for app, want := range map[string]float64{"a": 40, "b": 140} {
		ref := &pb.ScaledObjectRef{Name: app, Namespace: "ml", ScalerMetadata: map[string]string{
			"scalerAddress": "gpuscaler:9090", "podSelector": "app=" + app, "gpuUtilTarget": "70"}}
		testkit.Eventually(t, 5*time.Second, func() bool {
			resp, err := client.GetMetrics(t.Context(), &pb.GetMetricsRequest{ScaledObjectRef: ref, MetricName: "gpu-util"})
			return err == nil && math.Abs(resp.GetMetricValues()[0].GetMetricValueFloat()-want) < 1e-9
		})
		// A trigger with only podSelector is always active while its pods can be judged
		// (KEDA would otherwise scale it to zero, where it has no GPUs to wake on).
		active, err := client.IsActive(t.Context(), ref)
		if err != nil || !active.GetResult() {
			t.Fatalf("app %s: IsActive = %v, %v; want true", app, active.GetResult(), err)
		}
	}
}
