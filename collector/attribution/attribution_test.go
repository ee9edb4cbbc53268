package attribution

import (
	"testing"

	"google.golang.org/protobuf/proto"

	gpuscalerv1 "github.com/gpuscaler/gpuscaler/proto/gpuscaler/v1"
)

// The node lab's GPUs (collector/nodelab_test.go), copied for the fuzz target's seeds:
// a test binary of this package cannot import the collector's tests. Keep them in step.
//
// Real-shaped UUIDs (NVML's "GPU-" + 8-4-4-4-12 hex).
const (
	labGPU0 = "GPU-0c7e1d8a-5b1f-4b6e-9d1a-7f3e2c4b5a60"
	labGPU1 = "GPU-1d8f2e9b-6c2a-4c7f-8e2b-8a4f3d5c6b71"
	labMIGa = "MIG-a1b2c3d4-e5f6-5a7b-8c9d-0e1f2a3b4c5d"
)

// labSamples are the node lab's samples: GPU 0 whole, GPU 1 in MIG mode with two
// 1g.10gb instances (GPU instance ids 7 and 8), minor numbers equal to indices.
func labSamples() []*gpuscalerv1.GPUSample {
	return []*gpuscalerv1.GPUSample{
		{Uuid: labGPU0, Index: 0, Minor: proto.Uint32(0), GpuUtil: proto.Float64(90), FbUsedBytes: proto.Uint64(40 << 30), FbTotalBytes: proto.Uint64(80 << 30)},
		{Uuid: labGPU1, Index: 1, Minor: proto.Uint32(1), DeviceId: labMIGa, MigProfile: "1g.10gb", MigInstanceId: proto.Uint32(7), GpuUtil: proto.Float64(30)},
		{Uuid: labGPU1, Index: 1, Minor: proto.Uint32(1), DeviceId: "MIG-b2c3d4e5-f6a7-5b8c-9d0e-1f2a3b4c5d6e", MigProfile: "1g.10gb", MigInstanceId: proto.Uint32(8), GpuUtil: proto.Float64(60)},
	}
}

// FuzzAttribute feeds the kubelet's device ids, as any kubelet or device plugin might
// spell them, through attribution: it must never panic, and the report it makes must be
// valid (a report that fails validation would cost the node every report). The first id
// is allocated to two pods, the second free, the DRA device claimed.
func FuzzAttribute(f *testing.F) {
	f.Add(labGPU0+"::1", labMIGa, "gpu-1")
	f.Add("MIG-"+labGPU1+"/8/0", "nvidia1/gi8", "gpu-0-mig-1g10gb-19-0")
	f.Add("nvidia0/gi7/vgpu1", labGPU0, "")
	f.Fuzz(func(t *testing.T, held, free, draDevice string) {
		h := Holder{Namespace: "ml", Pod: "p", Container: "c"}
		alloc := &Allocation{Holders: map[string][]Holder{}}
		if held != "" {
			d := &gpuscalerv1.Device{Id: held, Resource: "nvidia.com/gpu.shared"}
			alloc.Allocatable, alloc.Allocated = append(alloc.Allocatable, d), append(alloc.Allocated, d)
			alloc.Holders[held] = []Holder{h, {Namespace: "other", Pod: "q"}}
		}
		if free != "" && free != held {
			alloc.Allocatable = append(alloc.Allocatable, &gpuscalerv1.Device{Id: free, Resource: "nvidia.com/mig-1g.10gb"})
		}
		alloc.Claims = []Claim{{Driver: "gpu.nvidia.com", Pool: "p", Device: draDevice, Holder: h}}
		r := &gpuscalerv1.NodeReport{Node: "node-1", Gpus: labSamples()}
		Attribute(r, alloc)
		if err := r.Validate(); err != nil {
			t.Fatalf("attributed report is invalid: %v", err)
		}
	})
}
