package gpuscalerv1

import (
	"errors"
	"fmt"
	"math"
	"strings"
)

// ErrInvalidEvent reports an event that decodes but breaks the contract.
var ErrInvalidEvent = errors.New("invalid event")

// Bounds of a NodeReport. MaxGPUs is far above any node built (8 GPUs, each split into at
// most 7 MIG instances); the label bounds are Kubernetes' own.
const (
	MaxGPUs = 256
	// MaxDevices bounds the allocatable, allocated and unattributed devices of a report:
	// the kubelet lists a shared GPU once per replica, so a node of 8 GPUs at 48 replicas
	// offers 384 devices, and 8 GPUs of 7 MIG slices at 16 replicas, 896.
	MaxDevices = 4096
	// MaxPodsPerGPU bounds the pods one shared device lists. NVIDIA's device plugin allows
	// any replica count, but a GPU shared by more than a few dozen pods is not a layout
	// anyone runs; 256 keeps a hostile report small.
	MaxPodsPerGPU = 256
	MaxPodLabels  = 128
	// MaxTaints bounds a node's reported taints. Kubernetes sets no number, but a node
	// carries a handful; 128 keeps a hostile report small.
	MaxTaints = 128
	// MaxNodeCPUMillis and MaxNodeMemoryBytes bound a node's reported CPU (a million
	// cores, in millicores) and memory (1 PiB), allocatable and requested alike: the
	// largest machines have a few thousand cores and tens of TiB, so more is a broken
	// or hostile collector, not a node.
	MaxNodeCPUMillis   = 1 << 20 * 1000
	MaxNodeMemoryBytes = 1 << 50
	maxLabelKeyLen     = 317 // a 253-byte prefix, '/', a 63-byte name
	maxLabelValueLen   = 63
)

// Validate reports whether r is a well-formed NodeReport: a valid node name, and per
// device a UUID, percentages within 0–100, finite readings, framebuffer used no larger
// than total, device ids unique, a namespace and name on every attributed pod and no pod
// listed twice on one device, and an id, resource and pod on every unattributed device.
// A receiver drops a report that fails, whole: half a node's GPUs would be a false
// picture.
func (r *NodeReport) Validate() error {
	if err := ValidateNodeName(r.GetNode()); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidEvent, err)
	}
	if n := len(r.GetGpus()); n > MaxGPUs {
		return fmt.Errorf("%w: node %s reports %d GPUs, more than %d", ErrInvalidEvent, r.GetNode(), n, MaxGPUs)
	}
	if n := len(r.GetAllocatable()); n > MaxDevices {
		return fmt.Errorf("%w: node %s reports %d allocatable devices, more than %d", ErrInvalidEvent, r.GetNode(), n, MaxDevices)
	}
	seen := make(map[string]struct{}, len(r.GetGpus()))
	for i, g := range r.GetGpus() {
		if err := g.validate(); err != nil {
			return fmt.Errorf("%w: node %s: gpus[%d]: %w", ErrInvalidEvent, r.GetNode(), i, err)
		}
		id := g.DeviceID()
		if _, dup := seen[id]; dup {
			return fmt.Errorf("%w: node %s: gpus[%d]: device %s appears twice", ErrInvalidEvent, r.GetNode(), i, id)
		}
		seen[id] = struct{}{}
	}
	if n := len(r.GetUnattributed()); n > MaxDevices {
		return fmt.Errorf("%w: node %s reports %d unattributed devices, more than %d", ErrInvalidEvent, r.GetNode(), n, MaxDevices)
	}
	for i, u := range r.GetUnattributed() {
		if u.GetId() == "" || u.GetResource() == "" {
			return fmt.Errorf("%w: node %s: unattributed[%d]: device id and resource are required", ErrInvalidEvent, r.GetNode(), i)
		}
		if u.GetPod() == nil {
			return fmt.Errorf("%w: node %s: unattributed[%d]: the pod holding device %s is required", ErrInvalidEvent, r.GetNode(), i, u.GetId())
		}
		if err := u.GetPod().validate(); err != nil {
			return fmt.Errorf("%w: node %s: unattributed[%d]: %w", ErrInvalidEvent, r.GetNode(), i, err)
		}
	}
	for _, list := range []struct {
		name    string
		devices []*Device
	}{{"allocatable", r.GetAllocatable()}, {"allocated", r.GetAllocated()}} {
		clear(seen)
		for i, d := range list.devices {
			if d.GetId() == "" || d.GetResource() == "" {
				return fmt.Errorf("%w: node %s: %s[%d]: device id and resource are required", ErrInvalidEvent, r.GetNode(), list.name, i)
			}
			if _, dup := seen[d.GetId()]; dup {
				return fmt.Errorf("%w: node %s: %s[%d]: device %s appears twice", ErrInvalidEvent, r.GetNode(), list.name, i, d.GetId())
			}
			seen[d.GetId()] = struct{}{}
		}
	}
	if err := r.GetScheduling().validate(); err != nil {
		return fmt.Errorf("%w: node %s: scheduling.%w", ErrInvalidEvent, r.GetNode(), err)
	}
	if err := r.GetResources().validate(); err != nil {
		return fmt.Errorf("%w: node %s: resources.%w", ErrInvalidEvent, r.GetNode(), err)
	}
	return nil
}

// validate checks res against MaxNodeCPUMillis and MaxNodeMemoryBytes. Requested may
// exceed allocatable: pods bound before the kubelet reserved more, or static pods the
// scheduler never placed. A nil res (resources unknown) is valid.
func (res *NodeResources) validate() error {
	for _, f := range []struct {
		name    string
		v, most uint64
	}{
		{"cpu_allocatable_millis", res.GetCpuAllocatableMillis(), MaxNodeCPUMillis},
		{"memory_allocatable_bytes", res.GetMemoryAllocatableBytes(), MaxNodeMemoryBytes},
		{"cpu_requested_millis", res.GetCpuRequestedMillis(), MaxNodeCPUMillis},
		{"memory_requested_bytes", res.GetMemoryRequestedBytes(), MaxNodeMemoryBytes},
	} {
		if f.v > f.most {
			return fmt.Errorf("%s: %d, more than %d", f.name, f.v, f.most)
		}
	}
	return nil
}

// Taint effects a NodeScheduling carries: those that keep a pod that does not tolerate
// them off the node (k8s.io/api core/v1 types.go, TaintEffect).
const (
	TaintNoSchedule = "NoSchedule"
	TaintNoExecute  = "NoExecute"
)

// validate checks the taints as Kubernetes validates a Node's (pkg/apis/core/validation,
// validateNodeTaints: a qualified-name key, a label-value value, each key and effect
// once), less the effects the report leaves out. A nil s (no scheduling known) is valid.
func (s *NodeScheduling) validate() error {
	if n := len(s.GetTaints()); n > MaxTaints {
		return fmt.Errorf("taints: %d taints, more than %d", n, MaxTaints)
	}
	for i, t := range s.GetTaints() {
		k := t.GetKey()
		if k == "" || len(k) > maxLabelKeyLen || strings.ContainsFunc(k, notKeyRune) {
			return fmt.Errorf("taints[%d]: key %.40q is not a Kubernetes taint key (1 to %d bytes of letters, digits, '-', '_', '.' and '/')", i, k, maxLabelKeyLen)
		}
		if v := t.GetValue(); len(v) > maxLabelValueLen || strings.ContainsFunc(v, notKeyRune) || strings.Contains(v, "/") {
			return fmt.Errorf("taints[%d]: value %.40q of taint %s is not a Kubernetes label value (at most %d bytes of letters, digits, '-', '_' and '.')", i, v, k, maxLabelValueLen)
		}
		if e := t.GetEffect(); e != TaintNoSchedule && e != TaintNoExecute {
			return fmt.Errorf("taints[%d]: effect %q of taint %s: want NoSchedule or NoExecute", i, e, k)
		}
		for _, o := range s.GetTaints()[:i] {
			if o.GetKey() == k && o.GetEffect() == t.GetEffect() {
				return fmt.Errorf("taints[%d]: taint %s:%s appears twice", i, k, t.GetEffect())
			}
		}
	}
	return nil
}

// notKeyRune reports a rune no label key or value holds.
func notKeyRune(r rune) bool {
	return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' || r == '.' || r == '/')
}

// sharedSuffix ends the resource name NVIDIA's device plugin gives a shared device's
// replicas under renameByDefault: nvidia.com/gpu.shared, nvidia.com/mig-1g.10gb.shared
// (k8s-device-plugin api/config/v1/resources.go, DefaultSharedRename).
const sharedSuffix = ".shared"

// Profile returns the device's MIG profile: MigProfile, or, when that is empty, what a
// "nvidia.com/mig-<profile>" resource name says (the mixed strategy), without the
// ".shared" suffix of a shared slice's replicas; "" for a whole GPU.
func (d *Device) Profile() string {
	if p := d.GetMigProfile(); p != "" {
		return p
	}
	if p, ok := strings.CutPrefix(d.GetResource(), "nvidia.com/mig-"); ok {
		return strings.TrimSuffix(p, sharedSuffix)
	}
	return ""
}

// RenamedReplica reports whether the device is a replica offered under the renamed
// resource (nvidia.com/gpu.shared, …): a resource of its own, which a pod asking for
// nvidia.com/gpu or nvidia.com/mig-<profile> cannot be given.
func (d *Device) RenamedReplica() bool { return strings.HasSuffix(d.GetResource(), sharedSuffix) }

// DeviceID returns the device plugin id of the sample's device: DeviceId, or Uuid when
// DeviceId is empty.
func (g *GPUSample) DeviceID() string {
	if id := g.GetDeviceId(); id != "" {
		return id
	}
	return g.GetUuid()
}

func (g *GPUSample) validate() error {
	if g.GetUuid() == "" {
		return errors.New("uuid is required")
	}
	for _, p := range []struct {
		name string
		v    *float64
	}{{"gpu_util", g.GpuUtil}, {"sm_active", g.SmActive}, {"tensor_active", g.TensorActive}} {
		if p.v != nil && !(*p.v >= 0 && *p.v <= 100) { // also false for NaN
			return fmt.Errorf("%s %v is outside 0–100", p.name, *p.v)
		}
	}
	for _, p := range []struct {
		name string
		v    *float64
	}{{"power_watts", g.PowerWatts}, {"temperature_celsius", g.TemperatureCelsius}} {
		if p.v != nil && (math.IsNaN(*p.v) || math.IsInf(*p.v, 0)) {
			return fmt.Errorf("%s %v is not a finite number", p.name, *p.v)
		}
	}
	if g.FbUsedBytes != nil && g.FbTotalBytes != nil && g.GetFbUsedBytes() > g.GetFbTotalBytes() {
		return fmt.Errorf("fb_used_bytes %d exceeds fb_total_bytes %d", g.GetFbUsedBytes(), g.GetFbTotalBytes())
	}
	if len(g.GetOtherPods()) > 0 && g.GetPod() == nil {
		return errors.New("other_pods without pod: the first pod goes in pod")
	}
	if n := len(g.GetOtherPods()) + 1; n > MaxPodsPerGPU {
		return fmt.Errorf("%d pods on one device, more than %d", n, MaxPodsPerGPU)
	}
	var first podKey
	var seen map[podKey]struct{}
	for i, p := range g.Pods() {
		if err := p.validate(); err != nil {
			return err
		}
		k := podKey{p.GetNamespace(), p.GetName()}
		switch {
		case i == 0:
			first = k
		case i == 1:
			seen = map[podKey]struct{}{first: {}}
			fallthrough
		default:
			if _, dup := seen[k]; dup {
				return fmt.Errorf("pod %s/%s is listed twice", k.namespace, k.name)
			}
			seen[k] = struct{}{}
		}
	}
	return nil
}

type podKey struct{ namespace, name string }

// Pods returns every pod holding the device: Pod, then OtherPods; nil when none does.
func (g *GPUSample) Pods() []*PodRef {
	if g.GetPod() == nil {
		return nil
	}
	if len(g.GetOtherPods()) == 0 {
		return []*PodRef{g.GetPod()}
	}
	return append([]*PodRef{g.GetPod()}, g.GetOtherPods()...)
}

// NumPods returns how many pods hold the device: 0 without Pod, else 1 + len(OtherPods).
func (g *GPUSample) NumPods() int {
	if g.GetPod() == nil {
		return 0
	}
	return 1 + len(g.GetOtherPods())
}

// PodAt returns the i-th pod holding the device (0 ≤ i < NumPods): Pod, then OtherPods.
// With NumPods it walks the pods without the slice Pods allocates.
func (g *GPUSample) PodAt(i int) *PodRef {
	if i == 0 {
		return g.GetPod()
	}
	return g.GetOtherPods()[i-1]
}

// Healthy reports whether the device is healthy: its Unhealthy reason is empty.
func (g *GPUSample) Healthy() bool { return g.GetUnhealthy() == "" }

// MaxColdStartSeconds bounds a cold start, measured or stated: a replica that takes
// longer than an hour to serve was not loading all that time (a pod idle with no work
// reads as one that never went busy), and a stated figure that long is a slip of units.
const MaxColdStartSeconds = 3600

func (p *PodRef) validate() error {
	if err := ValidateNamespace(p.GetNamespace()); err != nil {
		return fmt.Errorf("pod: %w", err)
	}
	if p.GetName() == "" {
		return errors.New("pod: name is required")
	}
	if p.GpuUtil != nil && !(*p.GpuUtil >= 0 && *p.GpuUtil <= 100) {
		return fmt.Errorf("pod %s/%s: gpu_util %v is outside 0–100", p.GetNamespace(), p.GetName(), *p.GpuUtil)
	}
	if p.ColdStartSeconds != nil && !(*p.ColdStartSeconds >= 0 && *p.ColdStartSeconds <= MaxColdStartSeconds) {
		return fmt.Errorf("pod %s/%s: cold_start_seconds %v is outside 0–%d", p.GetNamespace(), p.GetName(), *p.ColdStartSeconds, MaxColdStartSeconds)
	}
	if n := len(p.GetLabels()); n > MaxPodLabels {
		return fmt.Errorf("pod %s/%s: %d labels, more than %d", p.GetNamespace(), p.GetName(), n, MaxPodLabels)
	}
	for k, v := range p.GetLabels() {
		if k == "" || len(k) > maxLabelKeyLen || len(v) > maxLabelValueLen {
			return fmt.Errorf("pod %s/%s: label %.40q=%.40q is not a Kubernetes label (key 1 to %d bytes, value at most %d)",
				p.GetNamespace(), p.GetName(), k, v, maxLabelKeyLen, maxLabelValueLen)
		}
	}
	return nil
}

// Bounds of a QueueReport's traffic. A billion items a second is far above what one
// producer hands out, a service time or an averaging window of 30 years far above any
// item's or producer's, and a dispersion of a billion (batches of a billion items) far
// above any traffic's; beyond them a
// figure is a broken or hostile producer, and read as one it would ask for replicas
// without end.
const (
	MaxTrafficRate    = 1e9
	MaxServiceSeconds = 1e9
	MaxDispersion     = 1e9
	MaxWindowSeconds  = 1e9
)

// Validate reports whether r is a well-formed QueueReport: a valid namespace, queue name
// and producer id, and, where it carries its traffic, figures that are finite, not
// negative, rates of at most MaxTrafficRate a second, a service time of at most
// MaxServiceSeconds and a dispersion of at most MaxDispersion.
func (r *QueueReport) Validate() error {
	if err := ValidateNamespace(r.GetNamespace()); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidEvent, err)
	}
	if err := ValidateQueueName(r.GetQueue()); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidEvent, err)
	}
	if err := ValidateProducerID(r.GetProducerId()); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidEvent, err)
	}
	if t := r.GetTraffic(); t != nil {
		if err := t.validate(); err != nil {
			return fmt.Errorf("%w: queue %s/%s, producer %q: traffic: %w", ErrInvalidEvent, r.GetNamespace(), r.GetQueue(), r.GetProducerId(), err)
		}
	}
	return nil
}

// validate checks t's figures against their bounds. NaN fails every comparison, so
// each check is written to fail on it.
func (t *QueueTraffic) validate() error {
	for _, f := range []struct {
		name        string
		v, from, to float64
	}{
		{"busy_seconds_total", t.GetBusySecondsTotal(), 0, math.MaxFloat64},
		{"arrival_rate", t.GetArrivalRate(), 0, MaxTrafficRate},
		{"completion_rate", t.GetCompletionRate(), 0, MaxTrafficRate},
		{"drop_rate", t.GetDropRate(), 0, MaxTrafficRate},
		{"service_seconds", t.GetServiceSeconds(), 0, MaxServiceSeconds},
		{"arrival_dispersion", t.GetArrivalDispersion(), 0, MaxDispersion},
		{"arrival_trend", t.GetArrivalTrend(), -MaxTrafficRate, MaxTrafficRate},
		{"arrival_level", t.GetArrivalLevel(), 0, MaxTrafficRate},
		{"level_window_seconds", t.GetLevelWindowSeconds(), 0, MaxWindowSeconds},
		{"oldest_wait_seconds", t.GetOldestWaitSeconds(), 0, MaxWindowSeconds},
	} {
		if !(f.v >= f.from && f.v <= f.to) {
			return fmt.Errorf("%s %v is outside %g–%g", f.name, f.v, f.from, f.to)
		}
	}
	return nil
}

// Backlog returns the items the queue holds: waiting plus in flight. It saturates rather
// than wrapping around.
func (r *QueueReport) Backlog() uint64 {
	b := r.GetWaiting() + r.GetInFlight()
	if b < r.GetWaiting() {
		return math.MaxUint64
	}
	return b
}
