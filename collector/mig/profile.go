//go:build cgo

package mig

import (
	"fmt"
	"math"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// ProfileOf names a MIG device's profile as NVIDIA's device plugin, mig-parted
// and nvidia-smi do (go-nvlib's MigProfile). Slices and memory come from the MIG
// device's attributes, or else from its GPU instance's profile; the attribute suffix
// ("+me", "-me", "+gfx", …) from that profile. "" when neither can be read.
func ProfileOf(parent, dev nvml.Device, giID int, giKnown bool) string {
	profile, info := -1, nvml.GpuInstanceProfileInfo{}
	if giKnown {
		if gi, ret := parent.GetGpuInstanceById(giID); ret == nvml.SUCCESS && gi != nil {
			if gii, ret := gi.GetInfo(); ret == nvml.SUCCESS {
				profile, info = findGIProfile(parent, gii.ProfileId)
			}
		}
	}
	var giSlices, ciSlices uint32
	var memMiB uint64
	if a, ret := dev.GetAttributes(); ret == nvml.SUCCESS {
		giSlices, ciSlices, memMiB = a.GpuInstanceSliceCount, a.ComputeInstanceSliceCount, a.MemorySizeMB
	} else if profile >= 0 {
		// Without attributes, assume the compute instance spans the GPU instance, the
		// usual (and the device plugin's only supported) layout.
		giSlices, ciSlices, memMiB = info.SliceCount, info.SliceCount, info.MemorySizeMB
	}
	mem, ret := parent.GetMemoryInfo()
	if ret != nvml.SUCCESS {
		return ""
	}
	return ProfileName(profile, giSlices, ciSlices, memMiB, mem.Total)
}

// findGIProfile finds, among a GPU's GPU-instance profiles, the one whose id is
// profileID, and returns its nvml.GPU_INSTANCE_PROFILE_* index and info; -1 when none
// matches. An index is not an id: an A100's 1g.5gb profile is index 0 and id 19.
func findGIProfile(dev nvml.Device, profileID uint32) (int, nvml.GpuInstanceProfileInfo) {
	for i := range nvml.GPU_INSTANCE_PROFILE_COUNT {
		info, ret := dev.GetGpuInstanceProfileInfo(i)
		if ret == nvml.SUCCESS && info.Id == profileID {
			return i, info
		}
	}
	return -1, nvml.GpuInstanceProfileInfo{}
}

// ProfileName names a MIG profile "[<c>c.]<g>g.<GB>gb[±attribute]" as go-nvlib does:
// giProfile is its nvml.GPU_INSTANCE_PROFILE_* index (-1 when unknown: no attribute
// suffix), giSlices and ciSlices the GPU and compute instances' slices, memMiB the
// instance's memory in MiB and gpuTotalBytes the whole GPU's. The GB figure is the
// instance's share of the GPU rounded up to eighths, times the GPU's size in GiB, so
// that an A100 40GB's 4864 MiB slice is "5gb" and its 40192 MiB one "40gb". "" when a
// figure is missing.
func ProfileName(giProfile int, giSlices, ciSlices uint32, memMiB, gpuTotalBytes uint64) string {
	if giSlices == 0 || memMiB == 0 || gpuTotalBytes == 0 {
		return ""
	}
	const mib, gib = 1 << 20, 1 << 30
	share := float64(memMiB) * mib / float64(gpuTotalBytes)
	share = math.Ceil(share*8) / 8
	gb := uint64(math.Round(share * float64((gpuTotalBytes+gib-1)/gib)))

	var suffix string
	switch giProfile {
	case nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV1, nvml.GPU_INSTANCE_PROFILE_2_SLICE_REV1:
		suffix = "+me"
	case nvml.GPU_INSTANCE_PROFILE_1_SLICE_ALL_ME, nvml.GPU_INSTANCE_PROFILE_2_SLICE_ALL_ME:
		suffix = "+me.all"
	case nvml.GPU_INSTANCE_PROFILE_1_SLICE_GFX, nvml.GPU_INSTANCE_PROFILE_2_SLICE_GFX,
		nvml.GPU_INSTANCE_PROFILE_3_SLICE_GFX, nvml.GPU_INSTANCE_PROFILE_4_SLICE_GFX:
		suffix = "+gfx"
	case nvml.GPU_INSTANCE_PROFILE_1_SLICE_NO_ME, nvml.GPU_INSTANCE_PROFILE_2_SLICE_NO_ME:
		suffix = "-me"
	}
	if ciSlices == 0 || ciSlices == giSlices {
		return fmt.Sprintf("%dg.%dgb%s", giSlices, gb, suffix)
	}
	return fmt.Sprintf("%dc.%dg.%dgb%s", ciSlices, giSlices, gb, suffix)
}
