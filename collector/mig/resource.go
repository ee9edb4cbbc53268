// Package mig names MIG (Multi-Instance GPU) profiles as NVIDIA's device plugin,
// mig-parted and nvidia-smi do, "[<c>c.]<g>g.<GB>gb[±attribute]", for every part of the
// collector that meets them: the DCGM and NVML sources name the instances they read
// (ProfileOf, with cgo), the kubelet side reads them from resource names
// (ResourcePrefix), and the simulator offers them. A leaf: it imports nothing of the
// collector's.
package mig

// ResourcePrefix starts the resource name of a MIG slice under the NVIDIA device
// plugin's "mixed" strategy; the rest is the profile: nvidia.com/mig-1g.10gb, or
// nvidia.com/mig-1g.10gb.shared for its replicas.
const ResourcePrefix = "nvidia.com/mig-"
