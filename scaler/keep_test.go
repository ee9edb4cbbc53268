package scaler

import (
	"reflect"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	gpuscalerv1 "github.com/gpuscaler/gpuscaler/proto/gpuscaler/v1"
)

// keepTestReports are reports of two nodes, the first reporting three times with its
// pods, labels, health and devices changing, with every field the state keeps: node
// labels, MIG devices whose profile is read from the resource name, a GPU time-sliced
// between pods of two namespaces with their own utilisation, an unhealthy GPU and an
// unattributed device.
func keepTestReports() []*gpuscalerv1.NodeReport {
	pod := func(ns, name string, labels map[string]string) *gpuscalerv1.PodRef {
		return &gpuscalerv1.PodRef{Namespace: ns, Name: name, Labels: labels, OwnerKind: "ReplicaSet", OwnerName: name + "-rs"}
	}
	report := func(node, app string, util float64, unhealthy string) *gpuscalerv1.NodeReport {
		shared := &gpuscalerv1.GPUSample{
			Uuid: "GPU-1", Index: 1, Shared: true, GpuUtil: proto.Float64(util),
			FbUsedBytes: proto.Uint64(10), FbTotalBytes: proto.Uint64(80),
			Pod:       pod("ml", "a-"+app, map[string]string{"app": app}),
			OtherPods: []*gpuscalerv1.PodRef{pod("web", "b", map[string]string{"app": "b", "tier": "gpu"})},
		}
		shared.Pod.GpuUtil, shared.OtherPods[0].GpuUtil = proto.Float64(util/2), proto.Float64(util/2)
		return &gpuscalerv1.NodeReport{
			Node: node, Source: "dcgm", CollectorId: "c",
			NodeLabels: map[string]string{"nvidia.com/gpu.product": "H100", "pool": app},
			Allocatable: []*gpuscalerv1.Device{
				{Id: "GPU-0", Resource: "nvidia.com/gpu"},
				{Id: "GPU-1::0", Resource: "nvidia.com/gpu.shared"},
				{Id: "MIG-2", Resource: "nvidia.com/mig-1g.10gb"},
				{Id: "MIG-3", Resource: "nvidia.com/mig-3g.40gb.shared"},
				{Id: "MIG-4", Resource: "nvidia.com/mig-2g.20gb"},
				{Id: "MIG-5", Resource: "nvidia.com/mig-2g.20gb"}, // a profile counted twice
			},
			Allocated: []*gpuscalerv1.Device{{Id: "GPU-0", Resource: "nvidia.com/gpu"}},
			Gpus: []*gpuscalerv1.GPUSample{
				{Uuid: "GPU-0", GpuUtil: proto.Float64(util), Unhealthy: unhealthy, Pod: pod("ml", "train-"+app, map[string]string{"app": app, "job": "x"})},
				shared,
				{Uuid: "GPU-2", DeviceId: "MIG-2", MigProfile: "1g.10gb", MigInstanceId: proto.Uint32(7)},
			},
			Unattributed: []*gpuscalerv1.UnattributedDevice{{Id: "GPU-9", Resource: "nvidia.com/gpu", Reason: "gone", Pod: pod("ml", "lost", map[string]string{"app": app})}},
			Resources:    &gpuscalerv1.NodeResources{CpuAllocatableMillis: 64_000, MemoryAllocatableBytes: 512 << 30, CpuRequestedMillis: uint64(util) * 100, MemoryRequestedBytes: uint64(util) << 30},
		}
	}
	return []*gpuscalerv1.NodeReport{
		report("node-a", "llm", 40, ""),
		report("node-b", "llm", 10, ""),
		report("node-a", "llm", 60, ""),          // readings change only
		report("node-a", "vision", 70, "XID 79"), // pods, labels and health change
	}
}

// TestStateKeepsNothingOfTheReport applies reports decoded by one NodeDecoder, whose
// strings point into the message's bytes and whose messages are reused for the next
// report, and overwrites each message's bytes once applied. The state must hold what a
// state fed freshly decoded reports holds: nothing it keeps may point into a message or
// the decoder's memory.
func TestStateKeepsNothingOfTheReport(t *testing.T) {
	reused, fresh := NewState(nil), NewState(nil)
	var dec gpuscalerv1.NodeDecoder
	now := time.Now()
	for _, r := range keepTestReports() {
		data, err := proto.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		subject := "gpuscaler.v1.node." + r.GetNode()
		ev, err := dec.Decode(subject, data)
		if err != nil {
			t.Fatal(err)
		}
		if err := reused.Apply(ev, now); err != nil {
			t.Fatal(err)
		}
		for i := range data {
			data[i] = 'X'
		}
		ev, err = gpuscalerv1.Decode(subject, append([]byte(nil), mustMarshal(t, r)...))
		if err != nil {
			t.Fatal(err)
		}
		if err := fresh.Apply(ev, now); err != nil {
			t.Fatal(err)
		}
	}
	// A last report decoded over the decoder's memory, not applied.
	if _, err := dec.Decode("gpuscaler.v1.node.node-c", mustMarshal(t, &gpuscalerv1.NodeReport{Node: "node-c", Gpus: []*gpuscalerv1.GPUSample{{Uuid: "GPU-Z"}}, Resources: &gpuscalerv1.NodeResources{CpuAllocatableMillis: 1}})); err != nil {
		t.Fatal(err)
	}
	for _, node := range []string{"node-a", "node-b"} {
		got, want := reused.nodes[node], fresh.nodes[node]
		if !proto.Equal(got.report, want.report) {
			t.Errorf("%s: report kept as %v, want %v", node, got.report, want.report)
		}
		for _, f := range []struct {
			name      string
			got, want any
		}{
			{"gpus", got.gpus, want.gpus},
			{"namespaces", got.namespaces, want.namespaces},
			{"views", got.nsGPUs, want.nsGPUs},
			{"free", got.free, want.free},
		} {
			if !reflect.DeepEqual(f.got, f.want) {
				t.Errorf("%s: %s kept as %v, want %v", node, f.name, f.got, f.want)
			}
		}
	}
	if len(fresh.nodes["node-a"].free) != 2 {
		t.Fatalf("free counts %v: want two MIG profiles, the case is wrong", fresh.nodes["node-a"].free)
	}
}

func mustMarshal(t *testing.T, m proto.Message) []byte {
	t.Helper()
	b, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
