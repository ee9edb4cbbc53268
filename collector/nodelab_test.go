package collector

// The node lab: every GPU layout users run, served by a real pod-resources gRPC server on a
// unix socket as the kubelet would report it, attributed by the real Collector against a
// source's samples. Each layout's device ids are spelt as the upstream code that makes
// them spells them; deviceid's tests cite the line.

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/protobuf/proto"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/gpuscaler/gpuscaler/collector/attribution"
	"github.com/gpuscaler/gpuscaler/collector/internal/collectortest"
	"github.com/gpuscaler/gpuscaler/collector/kubelet"
	"github.com/gpuscaler/gpuscaler/internal/natstest"
	gpuscalerv1 "github.com/gpuscaler/gpuscaler/proto/gpuscaler/v1"
)

// Real-shaped UUIDs (NVML's "GPU-" + 8-4-4-4-12 hex).
const (
	labGPU0 = "GPU-0c7e1d8a-5b1f-4b6e-9d1a-7f3e2c4b5a60"
	labGPU1 = "GPU-1d8f2e9b-6c2a-4c7f-8e2b-8a4f3d5c6b71"
	labMIGa = "MIG-a1b2c3d4-e5f6-5a7b-8c9d-0e1f2a3b4c5d"
	labMIGb = "MIG-b2c3d4e5-f6a7-5b8c-9d0e-1f2a3b4c5d6e"
)

// labSource returns fixed samples: GPU 0 whole, GPU 1 in MIG mode with two 1g.10gb
// instances (GPU instance ids 7 and 8), minor numbers equal to indices.
type labSource struct {
	samples func() []*gpuscalerv1.GPUSample
}

func (labSource) Name() string { return "nvml" }
func (labSource) Close() error { return nil }
func (s labSource) Collect(context.Context) ([]*gpuscalerv1.GPUSample, error) {
	return s.samples(), nil
}

func labSamples() []*gpuscalerv1.GPUSample {
	return []*gpuscalerv1.GPUSample{
		{Uuid: labGPU0, Index: 0, Minor: proto.Uint32(0), GpuUtil: proto.Float64(90), FbUsedBytes: proto.Uint64(40 << 30), FbTotalBytes: proto.Uint64(80 << 30)},
		{Uuid: labGPU1, Index: 1, Minor: proto.Uint32(1), DeviceId: labMIGa, MigProfile: "1g.10gb", MigInstanceId: proto.Uint32(7), GpuUtil: proto.Float64(30)},
		{Uuid: labGPU1, Index: 1, Minor: proto.Uint32(1), DeviceId: labMIGb, MigProfile: "1g.10gb", MigInstanceId: proto.Uint32(8), GpuUtil: proto.Float64(60)},
	}
}

// labWant is what one sample of the report should say.
type labWant struct {
	device string   // the sample's device id
	pods   []string // namespace/name, in order
	shared bool
}

func TestNodeLab(t *testing.T) {
	gkeMIG := func(minor, gi int) string { return fmt.Sprintf("nvidia%d/gi%d", minor, gi) }
	tests := map[string]struct {
		allocatable  []*podresourcesv1.ContainerDevices
		pods         []*podresourcesv1.PodResources
		want         []labWant
		unattributed []string // device id → pod, as "id pod"
		profiles     map[string]string
	}{
		"whole GPUs, MIG mixed strategy": {
			allocatable: []*podresourcesv1.ContainerDevices{collectortest.Devices("nvidia.com/gpu", labGPU0), collectortest.Devices("nvidia.com/mig-1g.10gb", labMIGa, labMIGb)},
			pods:        []*podresourcesv1.PodResources{collectortest.PodHolding("ml", "llm-0", collectortest.Devices("nvidia.com/gpu", labGPU0)), collectortest.PodHolding("ml", "tiny-0", collectortest.Devices("nvidia.com/mig-1g.10gb", labMIGb))},
			want:        []labWant{{device: labGPU0, pods: []string{"ml/llm-0"}}, {device: labMIGa}, {device: labMIGb, pods: []string{"ml/tiny-0"}}},
		},
		"MIG single strategy: slices offered as nvidia.com/gpu": {
			allocatable: []*podresourcesv1.ContainerDevices{collectortest.Devices("nvidia.com/gpu", labGPU0, labMIGa, labMIGb)},
			pods:        []*podresourcesv1.PodResources{collectortest.PodHolding("ml", "tiny-0", collectortest.Devices("nvidia.com/gpu", labMIGa))},
			want:        []labWant{{device: labGPU0}, {device: labMIGa, pods: []string{"ml/tiny-0"}}, {device: labMIGb}},
			profiles:    map[string]string{labMIGa: "1g.10gb", labMIGb: "1g.10gb", labGPU0: ""},
		},
		"time-slicing x4, three pods on one GPU": {
			allocatable: []*podresourcesv1.ContainerDevices{collectortest.Devices("nvidia.com/gpu", collectortest.Replicas(labGPU0, 4)...)},
			pods: []*podresourcesv1.PodResources{
				collectortest.PodHolding("ml", "llm-b", collectortest.Devices("nvidia.com/gpu", labGPU0+"::2")),
				collectortest.PodHolding("ml", "llm-a", collectortest.Devices("nvidia.com/gpu", labGPU0+"::0")),
				collectortest.PodHolding("other", "batch-0", collectortest.Devices("nvidia.com/gpu", labGPU0+"::3")),
			},
			want: []labWant{{device: labGPU0, pods: []string{"ml/llm-a", "ml/llm-b", "other/batch-0"}, shared: true}, {device: labMIGa}, {device: labMIGb}},
		},
		"time-slicing, one pod holds two replicas of one GPU": {
			allocatable: []*podresourcesv1.ContainerDevices{collectortest.Devices("nvidia.com/gpu", collectortest.Replicas(labGPU0, 4)...)},
			pods:        []*podresourcesv1.PodResources{collectortest.PodHolding("ml", "llm-a", collectortest.Devices("nvidia.com/gpu", labGPU0+"::0", labGPU0+"::1"))},
			want:        []labWant{{device: labGPU0, pods: []string{"ml/llm-a"}, shared: true}, {device: labMIGa}, {device: labMIGb}},
		},
		"MPS with renameByDefault: nvidia.com/gpu.shared": {
			allocatable: []*podresourcesv1.ContainerDevices{collectortest.Devices("nvidia.com/gpu.shared", collectortest.Replicas(labGPU0, 2)...)},
			pods: []*podresourcesv1.PodResources{
				collectortest.PodHolding("ml", "llm-a", collectortest.Devices("nvidia.com/gpu.shared", labGPU0+"::0")),
				collectortest.PodHolding("ml", "llm-b", collectortest.Devices("nvidia.com/gpu.shared", labGPU0+"::1")),
			},
			want: []labWant{{device: labGPU0, pods: []string{"ml/llm-a", "ml/llm-b"}, shared: true}, {device: labMIGa}, {device: labMIGb}},
		},
		"MIG with replicas, renamed: nvidia.com/mig-1g.10gb.shared": {
			allocatable: []*podresourcesv1.ContainerDevices{collectortest.Devices("nvidia.com/mig-1g.10gb.shared", append(collectortest.Replicas(labMIGa, 2), collectortest.Replicas(labMIGb, 2)...)...)},
			pods: []*podresourcesv1.PodResources{
				collectortest.PodHolding("ml", "tiny-0", collectortest.Devices("nvidia.com/mig-1g.10gb.shared", labMIGa+"::1")),
				collectortest.PodHolding("ml", "tiny-1", collectortest.Devices("nvidia.com/mig-1g.10gb.shared", labMIGa+"::0")),
			},
			want:     []labWant{{device: labGPU0}, {device: labMIGa, pods: []string{"ml/tiny-0", "ml/tiny-1"}, shared: true}, {device: labMIGb, shared: true}},
			profiles: map[string]string{labMIGa + "::0": "1g.10gb", labMIGb + "::1": "1g.10gb"},
		},
		"legacy MIG ids": {
			allocatable: []*podresourcesv1.ContainerDevices{collectortest.Devices("nvidia.com/mig-1g.10gb", "MIG-"+labGPU1+"/7/0", "MIG-"+labGPU1+"/8/0")},
			pods:        []*podresourcesv1.PodResources{collectortest.PodHolding("ml", "tiny-0", collectortest.Devices("nvidia.com/mig-1g.10gb", "MIG-"+labGPU1+"/8/0"))},
			want:        []labWant{{device: labGPU0}, {device: labMIGa}, {device: labMIGb, pods: []string{"ml/tiny-0"}}},
		},
		"GKE: whole GPU, and MIG partitions by GPU instance id": {
			allocatable: []*podresourcesv1.ContainerDevices{collectortest.Devices("nvidia.com/gpu", "nvidia0", gkeMIG(1, 7), gkeMIG(1, 8))},
			pods: []*podresourcesv1.PodResources{
				collectortest.PodHolding("ml", "llm-0", collectortest.Devices("nvidia.com/gpu", "nvidia0")),
				collectortest.PodHolding("ml", "tiny-0", collectortest.Devices("nvidia.com/gpu", gkeMIG(1, 8))),
			},
			want: []labWant{{device: labGPU0, pods: []string{"ml/llm-0"}}, {device: labMIGa}, {device: labMIGb, pods: []string{"ml/tiny-0"}}},
		},
		"GKE sharing: nvidia0/vgpuN and a shared MIG partition": {
			allocatable: []*podresourcesv1.ContainerDevices{collectortest.Devices("nvidia.com/gpu", "nvidia0/vgpu0", "nvidia0/vgpu1", gkeMIG(1, 7)+"/vgpu0", gkeMIG(1, 7)+"/vgpu1")},
			pods: []*podresourcesv1.PodResources{
				collectortest.PodHolding("ml", "a", collectortest.Devices("nvidia.com/gpu", "nvidia0/vgpu1")),
				collectortest.PodHolding("ml", "b", collectortest.Devices("nvidia.com/gpu", "nvidia0/vgpu0")),
				collectortest.PodHolding("ml", "c", collectortest.Devices("nvidia.com/gpu", gkeMIG(1, 7)+"/vgpu1")),
			},
			want: []labWant{{device: labGPU0, pods: []string{"ml/a", "ml/b"}, shared: true}, {device: labMIGa, pods: []string{"ml/c"}, shared: true}, {device: labMIGb}},
		},
		"DRA: a ResourceClaim's GPU, by NVIDIA's driver": {
			pods: []*podresourcesv1.PodResources{{Namespace: "ml", Name: "dra-0", Containers: []*podresourcesv1.ContainerResources{{
				Name: "main",
				DynamicResources: []*podresourcesv1.DynamicResource{{ClaimName: "gpu", ClaimNamespace: "ml", ClaimResources: []*podresourcesv1.ClaimResource{
					{DriverName: "gpu.nvidia.com", PoolName: "node-1", DeviceName: "gpu-0",
						CdiDevices: []*podresourcesv1.CDIDevice{{Name: "k8s.gpu.nvidia.com/claim=dab5ab50-d59a-42a6-af16-cfd4628c0f7a-gpu-0"}}},
					{DriverName: "dra.net", PoolName: "node-1", DeviceName: "eth1"},
				}}},
			}}}},
			want: []labWant{{device: labGPU0, pods: []string{"ml/dra-0"}}, {device: labMIGa}, {device: labMIGb}},
		},
		"DRA MIG devices are named by placement: unattributed": {
			pods: []*podresourcesv1.PodResources{{Namespace: "ml", Name: "dra-1", Containers: []*podresourcesv1.ContainerResources{{
				Name: "main",
				DynamicResources: []*podresourcesv1.DynamicResource{{ClaimName: "mig", ClaimNamespace: "ml", ClaimResources: []*podresourcesv1.ClaimResource{
					{DriverName: "gpu.nvidia.com", PoolName: "node-1", DeviceName: "gpu-1-mig-1g10gb-19-0"},
				}}},
			}}}},
			want:         []labWant{{device: labGPU0}, {device: labMIGa}, {device: labMIGb}},
			unattributed: []string{"gpu.nvidia.com/node-1/gpu-1-mig-1g10gb-19-0 ml/dra-1"},
		},
		"a device id in no known form, and one naming a GPU the source did not measure": {
			allocatable: []*podresourcesv1.ContainerDevices{collectortest.Devices("nvidia.com/gpu", labGPU0, "gpu0-custom", "GPU-99999999-0000-0000-0000-000000000000")},
			pods: []*podresourcesv1.PodResources{
				collectortest.PodHolding("ml", "llm-0", collectortest.Devices("nvidia.com/gpu", labGPU0)),
				collectortest.PodHolding("ml", "odd", collectortest.Devices("nvidia.com/gpu", "gpu0-custom")),
				collectortest.PodHolding("ml", "ghost", collectortest.Devices("nvidia.com/gpu", "GPU-99999999-0000-0000-0000-000000000000")),
			},
			want: []labWant{{device: labGPU0, pods: []string{"ml/llm-0"}}, {device: labMIGa}, {device: labMIGb}},
			unattributed: []string{
				"GPU-99999999-0000-0000-0000-000000000000 ml/ghost",
				"gpu0-custom ml/odd",
			},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			sock := collectortest.SocketPath(t)
			allocatable := &podresourcesv1.AllocatableResourcesResponse{Devices: tc.allocatable}
			collectortest.ServeKubelet(t, sock, &collectortest.Kubelet{Allocatable: allocatable, Pods: &podresourcesv1.ListPodResourcesResponse{PodResources: tc.pods}})
			attrib := newTestPodResources(t, kubelet.PodResourcesConfig{Socket: sock})
			dir := podsOf{}
			for _, p := range tc.pods {
				dir[p.GetNamespace()+"/"+p.GetName()] = PodInfo{UID: "uid-" + p.GetName(), Labels: map[string]string{"app": p.GetName()}}
			}
			ns := natstest.Start(t, "", "")
			reg := prometheus.NewRegistry()
			c, err := New(Config{Node: "node-1"}, labSource{labSamples}, attrib, dir, natstest.Connect(t, ns.ClientURL()).Conn, nil, reg)
			if err != nil {
				t.Fatal(err)
			}
			r, err := c.Report(t.Context())
			if err != nil {
				t.Fatalf("Report: %v", err)
			}
			var got []labWant
			for _, g := range r.GetGpus() {
				w := labWant{device: g.DeviceID(), shared: g.GetShared()}
				for _, p := range g.Pods() {
					w.pods = append(w.pods, p.GetNamespace()+"/"+p.GetName())
					if p.GetLabels()["app"] != p.GetName() || p.GetLabelsUnknown() {
						t.Errorf("pod %s/%s: labels %v, unknown %v; want the directory's", p.GetNamespace(), p.GetName(), p.GetLabels(), p.GetLabelsUnknown())
					}
				}
				got = append(got, w)
			}
			if !slices.EqualFunc(got, tc.want, func(a, b labWant) bool {
				return a.device == b.device && a.shared == b.shared && slices.Equal(a.pods, b.pods)
			}) {
				t.Errorf("samples:\n got %+v\nwant %+v", got, tc.want)
			}
			var unattributed []string
			for _, u := range r.GetUnattributed() {
				unattributed = append(unattributed, u.GetId()+" "+u.GetPod().GetNamespace()+"/"+u.GetPod().GetName())
				if u.GetReason() == "" || u.GetPod().GetUid() == "" {
					t.Errorf("unattributed %s: reason %q, pod %v; want a reason and the pod as the directory knows it", u.GetId(), u.GetReason(), u.GetPod())
				}
			}
			if !slices.Equal(unattributed, tc.unattributed) {
				t.Errorf("unattributed:\n got %q\nwant %q", unattributed, tc.unattributed)
			}
			for _, d := range r.GetAllocatable() {
				if want, ok := tc.profiles[d.GetId()]; ok && d.Profile() != want {
					t.Errorf("allocatable %s: profile %q, want %q", d.GetId(), d.Profile(), want)
				}
			}
			if err := r.Validate(); err != nil {
				t.Fatalf("report is invalid: %v", err)
			}
		})
	}
}

// TestNodeLabUnknownIDCounted: an id in no known form is counted as an attribution error
// (gpuscaler_collector_errors_total{stage="attribution"}), each report.
func TestNodeLabUnknownIDCounted(t *testing.T) {
	sock := collectortest.SocketPath(t)
	collectortest.ServeKubelet(t, sock, &collectortest.Kubelet{
		Allocatable: &podresourcesv1.AllocatableResourcesResponse{Devices: []*podresourcesv1.ContainerDevices{collectortest.Devices("nvidia.com/gpu", labGPU0, "weird/id")}},
		Pods:        &podresourcesv1.ListPodResourcesResponse{},
	})
	ns := natstest.Start(t, "", "")
	reg := prometheus.NewRegistry()
	c, err := New(Config{Node: "node-1"}, labSource{labSamples}, newTestPodResources(t, kubelet.PodResourcesConfig{Socket: sock}), nil, natstest.Connect(t, ns.ClientURL()).Conn, nil, reg)
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if _, err := c.Report(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	want := `
# HELP gpuscaler_collector_errors_total Failures by source and stage (source, attribution, invalid, publish).
# TYPE gpuscaler_collector_errors_total counter
gpuscaler_collector_errors_total{source="nvml",stage="attribution"} 2
gpuscaler_collector_errors_total{source="nvml",stage="invalid"} 0
gpuscaler_collector_errors_total{source="nvml",stage="publish"} 0
gpuscaler_collector_errors_total{source="nvml",stage="source"} 0
`
	if err := testutil.CollectAndCompare(reg, strings.NewReader(want), "gpuscaler_collector_errors_total"); err != nil {
		t.Fatal(err)
	}
}

// TestNodeLabUnknownLabelsAndUnhealthy: a pod the directory does not know is marked
// LabelsUnknown; a free device of an unhealthy GPU is marked Unhealthy, so it is never
// counted free.
func TestNodeLabUnknownLabelsAndUnhealthy(t *testing.T) {
	sock := collectortest.SocketPath(t)
	collectortest.ServeKubelet(t, sock, &collectortest.Kubelet{
		Allocatable: &podresourcesv1.AllocatableResourcesResponse{Devices: []*podresourcesv1.ContainerDevices{
			collectortest.Devices("nvidia.com/mig-1g.10gb", labMIGa, labMIGb), collectortest.Devices("nvidia.com/gpu", labGPU0),
		}},
		Pods: &podresourcesv1.ListPodResourcesResponse{PodResources: []*podresourcesv1.PodResources{
			collectortest.PodHolding("ml", "new-pod", collectortest.Devices("nvidia.com/gpu", labGPU0)),
		}},
	})
	ns := natstest.Start(t, "", "")
	samples := func() []*gpuscalerv1.GPUSample {
		s := labSamples()
		s[2].Unhealthy, s[2].LastXid = "XID 79", 79
		s[2].GpuUtil = nil
		return s
	}
	c, err := New(Config{Node: "node-1"}, labSource{samples}, newTestPodResources(t, kubelet.PodResourcesConfig{Socket: sock}), podsOf{}, natstest.Connect(t, ns.ClientURL()).Conn, nil, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	r, err := c.Report(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if p := r.GetGpus()[0].GetPod(); p.GetName() != "new-pod" || !p.GetLabelsUnknown() {
		t.Errorf("pod unknown to the directory: %v, want new-pod with labels_unknown", p)
	}
	for _, d := range r.GetAllocatable() {
		if got, want := d.GetUnhealthy(), d.GetId() == labMIGb; got != want {
			t.Errorf("allocatable %s: unhealthy %v, want %v", d.GetId(), got, want)
		}
	}
}

// TestNodeLabUnmeasuredGPUIsNotFree: a whole GPU the kubelet offers but no sample
// measures (lost before the collector started), or whose id is in no known form (WSL's
// "all"), is not counted free; a time-sliced node
// of 8 GPUs × 40 replicas (320 devices) makes a valid report.
func TestNodeLabUnmeasuredGPUIsNotFree(t *testing.T) {
	ghost := "GPU-99999999-0000-0000-0000-000000000000"
	alloc := &Allocation{Holders: map[string][]Holder{}}
	for _, id := range append(collectortest.Replicas(labGPU0, 40), ghost, "nvidia5", "all") {
		alloc.Allocatable = append(alloc.Allocatable, &gpuscalerv1.Device{Id: id, Resource: "nvidia.com/gpu"})
	}
	for g := range 7 {
		for _, id := range collectortest.Replicas(fmt.Sprintf("GPU-%08d-0000-0000-0000-000000000000", g+1), 40) {
			alloc.Allocatable = append(alloc.Allocatable, &gpuscalerv1.Device{Id: id, Resource: "nvidia.com/gpu.shared"})
		}
	}
	r := &gpuscalerv1.NodeReport{Node: "node-1", Gpus: labSamples()}
	attribution.Attribute(r, alloc)
	if err := r.Validate(); err != nil {
		t.Fatalf("report of %d devices: %v", len(r.GetAllocatable()), err)
	}
	for _, d := range r.GetAllocatable() {
		want := d.GetId() == ghost || d.GetId() == "nvidia5" || d.GetId() == "all" || (d.GetResource() == "nvidia.com/gpu.shared")
		if d.GetUnhealthy() != want {
			t.Fatalf("allocatable %s: unhealthy %v, want %v", d.GetId(), d.GetUnhealthy(), want)
		}
	}
}
