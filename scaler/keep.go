package scaler

import (
	"maps"
	"strings"

	gpuscalerv1 "github.com/gpuscaler/gpuscaler/proto/gpuscaler/v1"
)

// The state keeps nothing of the reports it applies (see State.applyNode): these take
// what it keeps from the node's previous entry where it did not change, and copy it
// where it did. A node's names and labels change far more seldom than it reports, so
// most reports copy nothing.

// keep returns was when s equals it, else a copy of s.
func keep(s, was string) string {
	if s == was {
		return was
	}
	return strings.Clone(s)
}

// keepReport returns what a node's entry keeps of its report r: its name, source,
// labels, scheduling state, CPU and memory, and unattributed devices, taken from prev's where they did not change.
func keepReport(r *gpuscalerv1.NodeReport, prev *nodeEntry) *gpuscalerv1.NodeReport {
	var was *gpuscalerv1.NodeReport
	if prev != nil {
		was = prev.report
	}
	k := &gpuscalerv1.NodeReport{
		Node:       keep(r.GetNode(), was.GetNode()),
		Source:     keep(r.GetSource(), was.GetSource()),
		NodeLabels: keepLabels(r.GetNodeLabels(), was.GetNodeLabels()),
		Scheduling: keepScheduling(r.GetScheduling(), was.GetScheduling()),
		Resources:  keepResources(r.GetResources(), was.GetResources()),
	}
	for _, u := range r.GetUnattributed() {
		k.Unattributed = append(k.Unattributed, &gpuscalerv1.UnattributedDevice{
			Id:       strings.Clone(u.GetId()),
			Resource: strings.Clone(u.GetResource()),
			Pod:      copyPod(u.GetPod()),
			Reason:   strings.Clone(u.GetReason()),
		})
	}
	return k
}

// keepLabels returns was when it holds exactly m's labels, else a copy of m.
func keepLabels(m, was map[string]string) map[string]string {
	if len(m) == 0 {
		return nil
	}
	if maps.Equal(m, was) {
		return was
	}
	c := make(map[string]string, len(m))
	for k, v := range m {
		c[strings.Clone(k)] = strings.Clone(v)
	}
	return c
}

// copyPod returns a copy of p that shares no memory with it.
func copyPod(p *gpuscalerv1.PodRef) *gpuscalerv1.PodRef {
	if p == nil {
		return nil
	}
	c := &gpuscalerv1.PodRef{
		Namespace:     strings.Clone(p.GetNamespace()),
		Name:          strings.Clone(p.GetName()),
		Container:     strings.Clone(p.GetContainer()),
		Uid:           strings.Clone(p.GetUid()),
		Labels:        keepLabels(p.GetLabels(), nil),
		OwnerKind:     strings.Clone(p.GetOwnerKind()),
		OwnerName:     strings.Clone(p.GetOwnerName()),
		LabelsUnknown: p.GetLabelsUnknown(),
	}
	if p.GpuUtil != nil {
		u := p.GetGpuUtil()
		c.GpuUtil = &u
	}
	if p.ColdStartSeconds != nil {
		cs := p.GetColdStartSeconds()
		c.ColdStartSeconds = &cs
	}
	return c
}

// keepScheduling returns was when s says the same, else a copy of s; nil for nil. A
// node's cordon and taints change far more seldom than it reports.
func keepScheduling(s, was *gpuscalerv1.NodeScheduling) *gpuscalerv1.NodeScheduling {
	if s == nil {
		return nil
	}
	if was != nil && s.GetUnschedulable() == was.GetUnschedulable() && len(s.GetTaints()) == len(was.GetTaints()) {
		same := true
		for i, t := range s.GetTaints() {
			w := was.GetTaints()[i]
			if t.GetKey() != w.GetKey() || t.GetValue() != w.GetValue() || t.GetEffect() != w.GetEffect() {
				same = false
				break
			}
		}
		if same {
			return was
		}
	}
	k := &gpuscalerv1.NodeScheduling{Unschedulable: s.GetUnschedulable()}
	for _, t := range s.GetTaints() {
		k.Taints = append(k.Taints, &gpuscalerv1.Taint{Key: strings.Clone(t.GetKey()), Value: strings.Clone(t.GetValue()), Effect: strings.Clone(t.GetEffect())})
	}
	return k
}

// keepResources returns was when res says the same, else a copy of res; nil for nil.
// The decoder reuses res for the next report.
func keepResources(res, was *gpuscalerv1.NodeResources) *gpuscalerv1.NodeResources {
	switch {
	case res == nil:
		return nil
	case was != nil && res.GetCpuAllocatableMillis() == was.GetCpuAllocatableMillis() &&
		res.GetMemoryAllocatableBytes() == was.GetMemoryAllocatableBytes() &&
		res.GetCpuRequestedMillis() == was.GetCpuRequestedMillis() &&
		res.GetMemoryRequestedBytes() == was.GetMemoryRequestedBytes():
		return was
	}
	return &gpuscalerv1.NodeResources{
		CpuAllocatableMillis: res.GetCpuAllocatableMillis(), MemoryAllocatableBytes: res.GetMemoryAllocatableBytes(),
		CpuRequestedMillis: res.GetCpuRequestedMillis(), MemoryRequestedBytes: res.GetMemoryRequestedBytes(),
	}
}

// keepProfile returns MIG profile p as free, the counts being built, or prev's hold it,
// or else a copy.
func keepProfile(p string, free map[string]int, prev *nodeEntry) string {
	for was := range free {
		if was == p {
			return was
		}
	}
	if prev != nil {
		for was := range prev.free {
			if was == p {
				return was
			}
		}
	}
	return strings.Clone(p)
}
