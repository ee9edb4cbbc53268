// Package attribution joins what the kubelet says of a node's devices (an Allocation:
// which it can hand out, and which pod holds each) with what a GPU source measured (the
// NodeReport's samples): it says which pods hold each sample, which devices are not free,
// and which allocated devices match no sample. It is pure: no I/O and no state of its own; the
// collector asks the kubelet and the source, and hands both here. A package of its own
// so that its fuzz target's test binary links only it, deviceid and the event contract,
// not the collector's NATS, Kubernetes and GPU libraries, whose coverage the fuzzer
// would otherwise scan at every run.
package attribution

import (
	"cmp"
	"fmt"
	"slices"

	"github.com/gpuscaler/gpuscaler/collector/deviceid"
	gpuscalerv1 "github.com/gpuscaler/gpuscaler/proto/gpuscaler/v1"
)

// Holder names the pod and container a device is allocated to.
type Holder struct {
	Namespace, Pod, Container string
}

// PodInfo is what gpuscaler needs of a pod beyond its name: what a podSelector matches
// and who owns it. A PodDirectory (collector.PodDirectory) answers it.
type PodInfo struct {
	UID    string
	Labels map[string]string
	// OwnerKind and OwnerName name the pod's top-level controller: a Deployment rather
	// than its ReplicaSet. Empty for a bare pod.
	OwnerKind, OwnerName string
}

// Allocation is what the kubelet says of the node's devices, for the resources the
// collector counts (nvidia.com/gpu, nvidia.com/gpu.shared and nvidia.com/mig-* by
// default), and of the GPUs that DRA claims hold.
type Allocation struct {
	// Allocatable lists the devices the kubelet can hand to pods, with their resource
	// name and, when the resource name says it (nvidia.com/mig-1g.10gb), MIG profile. A
	// device shared by time-slicing or MPS is listed once per replica, as the kubelet
	// offers it.
	Allocatable []*gpuscalerv1.Device
	// Allocated lists the allocatable devices held by a pod now.
	Allocated []*gpuscalerv1.Device
	// Holders maps a device id to the pods holding it, one entry per pod, in the
	// kubelet's order. A device id is held by one pod; several when the kubelet hands an
	// init container's device on to its app containers (one pod) or when a pod's
	// containers share it.
	Holders map[string][]Holder
	// Claims lists the devices that DRA resource claims give the node's containers, one
	// entry per pod and device. They are not in Allocatable: a DRA driver publishes its
	// devices in ResourceSlices, not through the kubelet's device list, so they are
	// attributed to pods but not counted as capacity.
	Claims []Claim
}

// Claim is one device that a DRA claim gives a pod (pod-resources' ClaimResource).
type Claim struct {
	Driver, Pool, Device string
	Holder               Holder
}

// ID returns the device as DRA names it: driver/pool/device.
func (c Claim) ID() string { return c.Driver + "/" + c.Pool + "/" + c.Device }

// Attribute joins what the kubelet says (alloc) with what the source measured (r.Gpus),
// in place: each sample gets every pod holding its device (Pod, then OtherPods, sorted
// by namespace and name) and Shared when the kubelet offers it as replicas; each
// allocatable device of an unhealthy GPU is marked Unhealthy; each allocated device or
// DRA claim whose GPU no sample is becomes an entry of r.Unattributed, naming its pod
// and why. It sets r.Allocatable and r.Allocated from alloc.
//
// Device ids are read by deviceid.Parse, in every form a device plugin gives them, and
// matched to samples by what they name:
//   - a GPU or MIG device UUID: the sample whose device id it is;
//   - a MIG instance of a GPU UUID (legacy ids): the MIG sample of that GPU and GPU
//     instance id;
//   - a GPU minor number (GKE, DRA): the whole-GPU sample of that minor number, or, when
//     no sample on the node carries one (a source that cannot read it), of that index,
//     which equals the minor number on the nodes NVIDIA's driver sets up by default;
//   - a MIG instance of a minor number (GKE): the MIG sample of that GPU and instance id.
//
// A sample the kubelet does not know (a device its resources do not count, or a source
// whose MIG ids are not the kubelet's, as dcgm-exporter's) keeps the pods its source
// gave. An allocated device that matches no sample is then still attributed when a
// sample the kubelet does not know names the same pod: the source's own attribution
// agrees with the kubelet's.
//
// It returns the ids it could not parse, for the caller to count and log.
func Attribute(r *gpuscalerv1.NodeReport, alloc *Allocation) (unparsed []string) {
	ix := newSampleIndex(r.GetGpus())
	r.Allocatable, r.Allocated = alloc.Allocatable, alloc.Allocated

	type match struct {
		sample *gpuscalerv1.GPUSample
		reason string // why there is none
	}
	matches := make(map[string]match, len(alloc.Allocatable))
	known := make(map[*gpuscalerv1.GPUSample]bool, len(r.GetGpus())) // samples the kubelet offers
	for _, d := range alloc.Allocatable {
		ref, err := deviceid.Parse(d.GetId())
		if err != nil {
			unparsed = append(unparsed, d.GetId())
			matches[d.GetId()] = match{reason: err.Error()}
			d.Unhealthy = true // a GPU resource's device nobody can read is not free
			continue
		}
		g, reason := ix.find(ref)
		matches[d.GetId()] = match{g, reason}
		if g == nil {
			// A whole GPU that every source names by UUID and index, yet none measured,
			// is a GPU nobody can see (lost before the collector started, say): not free.
			// A MIG device is left be: dcgm-exporter names none by the kubelet's id.
			if ref.Kind == deviceid.GPUUUID || ref.Kind == deviceid.Minor {
				d.Unhealthy = true
			}
			continue
		}
		known[g] = true
		if ref.Shared() {
			g.Shared = true
		}
		// Under the MIG "single" strategy slices are offered as nvidia.com/gpu: learn
		// their profile from the samples.
		if d.GetMigProfile() == "" && g.GetMigProfile() != "" {
			d.MigProfile = g.GetMigProfile()
		}
		if !g.Healthy() {
			d.Unhealthy = true
		}
	}

	// The source's own pods stand for the samples the kubelet does not offer; the
	// kubelet's word stands for the rest.
	sourcePods := map[podName]*gpuscalerv1.GPUSample{}
	holders := map[*gpuscalerv1.GPUSample][]*gpuscalerv1.PodRef{}
	for _, g := range r.GetGpus() {
		if !known[g] {
			for _, p := range g.Pods() {
				sourcePods[podName{p.GetNamespace(), p.GetName()}] = g
			}
			continue
		}
		g.Pod, g.OtherPods = nil, nil
	}
	hold := func(g *gpuscalerv1.GPUSample, h Holder) {
		list := holders[g]
		if slices.ContainsFunc(list, func(p *gpuscalerv1.PodRef) bool { return p.GetNamespace() == h.Namespace && p.GetName() == h.Pod }) {
			return
		}
		holders[g] = append(list, &gpuscalerv1.PodRef{Namespace: h.Namespace, Name: h.Pod, Container: h.Container})
	}
	unattributed := func(id, resource string, h Holder, reason string) {
		if _, ok := sourcePods[podName{h.Namespace, h.Pod}]; ok {
			return
		}
		r.Unattributed = append(r.Unattributed, &gpuscalerv1.UnattributedDevice{
			Id: id, Resource: resource, Reason: reason,
			Pod: &gpuscalerv1.PodRef{Namespace: h.Namespace, Name: h.Pod, Container: h.Container},
		})
	}
	for _, d := range alloc.Allocated {
		m := matches[d.GetId()]
		for _, h := range alloc.Holders[d.GetId()] {
			if m.sample == nil {
				unattributed(d.GetId(), d.GetResource(), h, m.reason)
				continue
			}
			hold(m.sample, h)
		}
	}
	for _, c := range alloc.Claims {
		ref, err := deviceid.ParseDRA(c.Driver, c.Device)
		if err != nil {
			unparsed = append(unparsed, c.ID())
			unattributed(c.ID(), "dra:"+c.Driver, c.Holder, err.Error())
			continue
		}
		g, reason := ix.find(ref)
		if g == nil {
			unattributed(c.ID(), "dra:"+c.Driver, c.Holder, reason)
			continue
		}
		hold(g, c.Holder)
	}
	for g, pods := range holders {
		slices.SortFunc(pods, func(a, b *gpuscalerv1.PodRef) int {
			return cmp.Or(cmp.Compare(a.GetNamespace(), b.GetNamespace()), cmp.Compare(a.GetName(), b.GetName()))
		})
		if len(pods) > gpuscalerv1.MaxPodsPerGPU {
			pods = pods[:gpuscalerv1.MaxPodsPerGPU]
		}
		g.Pod, g.OtherPods = pods[0], pods[1:]
		if len(pods) > 1 {
			g.Shared = true
		}
	}
	slices.SortFunc(r.Unattributed, func(a, b *gpuscalerv1.UnattributedDevice) int {
		return cmp.Or(cmp.Compare(a.GetId(), b.GetId()), cmp.Compare(a.GetPod().GetNamespace(), b.GetPod().GetNamespace()),
			cmp.Compare(a.GetPod().GetName(), b.GetPod().GetName()))
	})
	if len(r.Unattributed) > gpuscalerv1.MaxDevices {
		r.Unattributed = r.Unattributed[:gpuscalerv1.MaxDevices]
	}
	return unparsed
}

type podName struct{ namespace, name string }

// sampleIndex finds the sample a parsed device id names. Only byDevice is built up
// front: the UUID forms are what most nodes use; the maps for the other forms are built
// on their first use.
type sampleIndex struct {
	samples  []*gpuscalerv1.GPUSample
	byDevice map[string]*gpuscalerv1.GPUSample // by DeviceID: GPU and MIG device UUIDs
	byGI     map[uuidGI]*gpuscalerv1.GPUSample // MIG samples by GPU UUID and GPU instance id
	byMinor  map[uint32]*gpuscalerv1.GPUSample // whole GPUs by minor number (or index, see Attribute)
	byMinGI  map[minorGI]*gpuscalerv1.GPUSample
	inMIG    map[uint32]bool // minor numbers of GPUs measured through MIG instances
}

type uuidGI struct {
	uuid string
	gi   uint32
}

type minorGI struct{ minor, gi uint32 }

func newSampleIndex(samples []*gpuscalerv1.GPUSample) *sampleIndex {
	ix := &sampleIndex{samples: samples, byDevice: make(map[string]*gpuscalerv1.GPUSample, len(samples))}
	for _, g := range samples {
		ix.byDevice[g.DeviceID()] = g
	}
	return ix
}

// indexInstances builds byGI.
func (ix *sampleIndex) indexInstances() {
	ix.byGI = map[uuidGI]*gpuscalerv1.GPUSample{}
	for _, g := range ix.samples {
		if g.MigInstanceId != nil {
			ix.byGI[uuidGI{g.GetUuid(), g.GetMigInstanceId()}] = g
		}
	}
}

// indexMinorsOnce builds byMinor, byMinGI and inMIG, the first time only.
func (ix *sampleIndex) indexMinorsOnce() {
	if ix.byMinor != nil {
		return
	}
	ix.byMinor, ix.byMinGI, ix.inMIG = map[uint32]*gpuscalerv1.GPUSample{}, map[minorGI]*gpuscalerv1.GPUSample{}, map[uint32]bool{}
	haveMinor := slices.ContainsFunc(ix.samples, func(g *gpuscalerv1.GPUSample) bool { return g.Minor != nil })
	for _, g := range ix.samples {
		minor, hasMinor := g.GetIndex(), !haveMinor
		if g.Minor != nil {
			minor, hasMinor = g.GetMinor(), true
		}
		switch {
		case !hasMinor:
		case g.MigInstanceId != nil:
			ix.byMinGI[minorGI{minor, g.GetMigInstanceId()}] = g
			ix.inMIG[minor] = true
		case g.DeviceID() == g.GetUuid():
			ix.byMinor[minor] = g
		}
	}
}

// find returns the sample ref names, or nil and why none is.
func (ix *sampleIndex) find(ref deviceid.Ref) (*gpuscalerv1.GPUSample, string) {
	var g *gpuscalerv1.GPUSample
	switch ref.Kind {
	case deviceid.GPUUUID, deviceid.MIGUUID:
		g = ix.byDevice[ref.UUID]
	case deviceid.MIGInstance:
		if ix.byGI == nil {
			ix.indexInstances()
		}
		if g = ix.byGI[uuidGI{ref.UUID, ref.GI}]; g == nil {
			g = ix.byDevice["MIG-"+ref.UUID+fmt.Sprintf("/%d/%d", ref.GI, ref.CI)]
		}
	case deviceid.Minor:
		ix.indexMinorsOnce()
		g = ix.byMinor[ref.Minor]
		if g == nil && ix.inMIG[ref.Minor] {
			return nil, fmt.Sprintf("GPU with minor number %d is measured through its MIG instances, but the device names the whole GPU", ref.Minor)
		}
	case deviceid.MinorGI:
		ix.indexMinorsOnce()
		g = ix.byMinGI[minorGI{ref.Minor, ref.GI}]
	case deviceid.MinorMIGPlacement:
		return nil, fmt.Sprintf("a MIG device of the GPU with minor number %d named by its placement (NVIDIA's DRA driver), which no GPU source reports", ref.Minor)
	}
	if g == nil {
		return nil, fmt.Sprintf("no GPU sample is the %s the device id names", ref.Kind)
	}
	return g, ""
}
