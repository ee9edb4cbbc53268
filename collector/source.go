// Package collector is the node side of gpuscaler: on every GPU node it reads the GPUs
// (through DCGM, an existing dcgm-exporter, NVML or a simulator), works out which pod
// holds each device and how many are free (the kubelet's pod-resources API, the pods'
// labels and owners from the Kubernetes API), and publishes one NodeReport per interval
// on gpuscaler.v1.node.<node>. It meets the scaler only in the event contract,
// proto/gpuscaler/v1, and does not import it.
//
// The parts meet in three small interfaces: a Source measures devices, an Attributor
// says which devices the kubelet can hand out and to whom it has, and a PodDirectory
// knows the labels and owners of the node's pods. The Collector joins them.
//
// Each GPU source is a package of its own (collector/dcgm, collector/nvml,
// collector/exporter, collector/sim), which OpenSource opens by name; the kubelet side
// is collector/kubelet, the Kubernetes side collector/kube. None of them imports this
// package: each keeps its contract by its methods alone, and what an Attributor and a
// PodDirectory answer with is package attribution's (aliased here).
package collector

import (
	"context"

	"github.com/gpuscaler/gpuscaler/collector/attribution"
	"github.com/gpuscaler/gpuscaler/collector/sourceerr"
	gpuscalerv1 "github.com/gpuscaler/gpuscaler/proto/gpuscaler/v1"
)

// Source reads a node's GPUs. Every source keeps the same contract, so the Collector,
// the metrics and the tests treat them alike.
type Source interface {
	// Name is the source's name as --source spells it and metrics label it: "dcgm",
	// "nvml", "exporter" or "sim".
	Name() string
	// Collect reads every device once: each whole GPU, and each MIG instance of a GPU in
	// MIG mode instead of that GPU. A reading the source cannot take is left nil, never
	// zero (GPUSample's optional fields). DeviceId is the device plugin's id when it
	// differs from the UUID (a MIG device's "MIG-…" UUID). Pod is set only by a source
	// that knows it (dcgm-exporter's pod labels); attribution from the kubelet replaces it.
	Collect(ctx context.Context) ([]*gpuscalerv1.GPUSample, error)
	// Close releases what the source holds. Collect must not be called after.
	//
	// A device the source sees but cannot read, or that reports a failure (lost, fallen
	// off the bus, a critical XID), is still returned, with Unhealthy saying why and
	// LastXid when known, so its pods' readings are known to be missing; the other
	// devices' samples are unaffected. Collect fails only when it can read nothing.
	Close() error
}

// PodUsageSource is a Source that also measures how much of a device each pod uses:
// NVML's per-process utilisation samples, with each process's pod found through its
// cgroup. The Collector asks it after each Collect and gives the figures to the pods it
// attributes to the device (PodRef.gpu_util), which matters on shared devices.
type PodUsageSource interface {
	Source
	// PodUsage returns, by device id (GPUSample.DeviceID), the utilisation in percent
	// (0 to 100) of each pod that ran on the device, by pod UID: in the last Collect,
	// or averaged over the last few (NVML: nvml.PodUsageSpan, as time-slicing makes one
	// window's figures jump). It is called once after each Collect. A device absent
	// from the map was not measured in the last Collect; a pod absent from a device's
	// map did not use it. The map is the caller's.
	PodUsage() map[string]map[string]float64
}

// Holder, Allocation and Claim are what an Attributor answers: package attribution
// defines them, beside the attribution that reads them, so that it and the attributors
// (collector/kubelet, collector/sim) import nothing of the collector's.
type (
	// Holder names the pod and container a device is allocated to.
	Holder = attribution.Holder
	// Allocation is what the kubelet says of the node's devices and of the GPUs that DRA
	// claims hold.
	Allocation = attribution.Allocation
	// Claim is one device that a DRA claim gives a pod.
	Claim = attribution.Claim
)

// Attributor says which devices the node can hand out and which pod holds each.
type Attributor interface {
	Allocation(ctx context.Context) (*Allocation, error)
}

// PodInfo is what gpuscaler needs of a pod beyond its name: what a podSelector matches
// and who owns it. Package attribution defines it, as it does Holder, so that a
// PodDirectory (collector/kube, collector/sim) imports nothing of the collector's.
type PodInfo = attribution.PodInfo

// PodDirectory knows the pods of this node. It is safe for concurrent use.
type PodDirectory interface {
	// Pod returns what is known of a pod, and false when nothing is.
	Pod(namespace, name string) (PodInfo, bool)
}

// ErrNoGPUSource reports that a source, or --source auto, found no way to read the GPUs.
var ErrNoGPUSource = sourceerr.ErrNoGPUSource
