//go:build cgo

package collectortest

import "github.com/NVIDIA/go-nvml/pkg/nvml"

// An NVIDIA H200's MIG profiles as NVML gave them on one (hack/hardware-check.sh,
// driver 580.159.04, 2026-11-26, MIG mode off: NVML answers the profiles of a GPU that
// can run MIG): nvmlDeviceGetGpuInstanceProfileInfo by profile index, the indices it
// answered NOT_SUPPORTED for left out. collector/mig/testdata/nvidia-smi-mig-lgip-h200.txt is what
// `nvidia-smi mig -lgip` printed on the same machine.
const H200TotalMiB = 143771

var H200GIProfiles = map[int]nvml.GpuInstanceProfileInfo{
	nvml.GPU_INSTANCE_PROFILE_1_SLICE:      {Id: 19, SliceCount: 1, InstanceCount: 7, MemorySizeMB: 16384},
	nvml.GPU_INSTANCE_PROFILE_2_SLICE:      {Id: 14, SliceCount: 2, InstanceCount: 3, MemorySizeMB: 33280},
	nvml.GPU_INSTANCE_PROFILE_3_SLICE:      {Id: 9, SliceCount: 3, InstanceCount: 2, MemorySizeMB: 71424},
	nvml.GPU_INSTANCE_PROFILE_4_SLICE:      {Id: 5, SliceCount: 4, InstanceCount: 1, MemorySizeMB: 71424},
	nvml.GPU_INSTANCE_PROFILE_7_SLICE:      {Id: 0, SliceCount: 7, InstanceCount: 1, MemorySizeMB: 143360},
	nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV1: {Id: 20, SliceCount: 1, InstanceCount: 1, MemorySizeMB: 16384},
	nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV2: {Id: 15, SliceCount: 1, InstanceCount: 4, MemorySizeMB: 33280},
}

// H200GIProfile answers GetGpuInstanceProfileInfo as the H200 did.
func H200GIProfile(i int) (nvml.GpuInstanceProfileInfo, nvml.Return) {
	if p, ok := H200GIProfiles[i]; ok {
		return p, nvml.SUCCESS
	}
	if i >= nvml.GPU_INSTANCE_PROFILE_COUNT {
		return nvml.GpuInstanceProfileInfo{}, nvml.ERROR_INVALID_ARGUMENT
	}
	return nvml.GpuInstanceProfileInfo{}, nvml.ERROR_NOT_SUPPORTED
}
