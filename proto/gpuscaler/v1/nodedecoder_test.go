package gpuscalerv1

import (
	"errors"
	"fmt"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// sharedNodeReport is a report with every kind of field set: labels on the node and its
// pods, time-sliced GPUs with several pods (one of them listed through two pod fields,
// which protobuf merges), MIG, unhealthy devices and an unattributed device.
func sharedNodeReport() *NodeReport {
	r := validNodeReport()
	r.NodeLabels = map[string]string{"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "zone": "a"}
	r.Allocatable = append(r.Allocatable, &Device{Id: "GPU-2::0", Resource: "nvidia.com/gpu", Unhealthy: true}, &Device{Id: "GPU-2::1", Resource: "nvidia.com/gpu.shared"})
	r.Gpus = append(r.Gpus,
		&GPUSample{
			Uuid: "GPU-2", Index: 2, Shared: true, GpuUtil: proto.Float64(90), Minor: proto.Uint32(2),
			XidErrors: 3, LastXid: 79, Unhealthy: "XID 79: fallen off the bus",
			Pod:       &PodRef{Namespace: "ml", Name: "a", Uid: "u-a", OwnerKind: "ReplicaSet", OwnerName: "rs", GpuUtil: proto.Float64(30), ColdStartSeconds: proto.Float64(45.5)},
			OtherPods: []*PodRef{{Namespace: "ml", Name: "b", GpuUtil: proto.Float64(60), LabelsUnknown: true, ColdStartSeconds: proto.Float64(0)}, {Namespace: "web", Name: "c", Labels: map[string]string{"app": "c", "tier": "gpu"}}},
		},
		&GPUSample{Uuid: "GPU-3", Index: 3},
	)
	r.Unattributed = []*UnattributedDevice{{Id: "GPU-9", Resource: "nvidia.com/gpu", Reason: "no such device", Pod: &PodRef{Namespace: "ml", Name: "d"}}}
	r.Scheduling = &NodeScheduling{Unschedulable: true, Taints: []*Taint{
		{Key: "nvidia.com/gpu", Value: "present", Effect: "NoSchedule"},
		{Key: "ToBeDeletedByClusterAutoscaler", Value: "1732700000", Effect: "NoSchedule"},
		{Key: "node.kubernetes.io/unreachable", Effect: "NoExecute"},
	}}
	r.Resources = &NodeResources{CpuAllocatableMillis: 191_500, MemoryAllocatableBytes: 2_000 << 30, CpuRequestedMillis: 96_250, MemoryRequestedBytes: 1_500 << 30}
	return r
}

// stripUnknown drops the unknown fields of m and every message in it: UnmarshalVT keeps
// them, the NodeDecoder skips them (but for those of unattributed devices, which it
// decodes with UnmarshalVT).
func stripUnknown(m protoreflect.Message) {
	m.SetUnknown(nil)
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		switch {
		case fd.IsList() && fd.Message() != nil:
			for i := range v.List().Len() {
				stripUnknown(v.List().Get(i).Message())
			}
		case fd.Message() != nil && !fd.IsMap():
			stripUnknown(v.Message())
		}
		return true
	})
}

// agree decodes data with d and with UnmarshalVT and fails unless both refuse it or both
// read the same report, unknown fields aside.
func agree(t *testing.T, d *NodeDecoder, data []byte) {
	t.Helper()
	want := new(NodeReport)
	wantErr := want.UnmarshalVT(data)
	got, err := d.decode(data)
	switch {
	case (err == nil) != (wantErr == nil):
		t.Fatalf("NodeDecoder: %v; UnmarshalVT: %v (data %x)", err, wantErr, data)
	case err != nil:
		return
	}
	stripUnknown(want.ProtoReflect())
	stripUnknown(got.ProtoReflect()) // unattributed devices are decoded by UnmarshalVT
	if !proto.Equal(got, want) {
		t.Fatalf("NodeDecoder read\n%v\nUnmarshalVT read\n%v\n(data %x)", got, want, data)
	}
}

// TestNodeDecoderAgrees decodes reports of every shape in turn with one decoder, larger
// after smaller and smaller after larger, so that nothing of a report survives into the
// next.
func TestNodeDecoderAgrees(t *testing.T) {
	big := sharedNodeReport()
	// Fields out of order, a field given twice and an unknown field, encoded by hand.
	var odd []byte
	odd = protowire.AppendTag(odd, 99, protowire.BytesType)
	odd = protowire.AppendString(odd, "from a newer collector")
	odd = protowire.AppendTag(odd, 1, protowire.BytesType)
	odd = protowire.AppendString(odd, "first")
	gpu, _ := proto.Marshal(&GPUSample{Uuid: "GPU-0", Pod: &PodRef{Namespace: "ml", Labels: map[string]string{"a": "1"}}})
	pod2, _ := proto.Marshal(&PodRef{Name: "merged", Labels: map[string]string{"b": "2"}})
	gpu = protowire.AppendTag(gpu, 15, protowire.BytesType)
	gpu = protowire.AppendBytes(gpu, pod2)
	odd = protowire.AppendTag(odd, 9, protowire.BytesType)
	odd = protowire.AppendBytes(odd, gpu)
	odd = protowire.AppendTag(odd, 1, protowire.BytesType)
	odd = protowire.AppendString(odd, "gpu-node-2")
	// Resources given twice: protobuf merges the two.
	res1, _ := proto.Marshal(&NodeResources{CpuAllocatableMillis: 8000, MemoryRequestedBytes: 1 << 30})
	res2, _ := proto.Marshal(&NodeResources{CpuRequestedMillis: 500})
	odd = protowire.AppendTag(odd, 12, protowire.BytesType)
	odd = protowire.AppendBytes(odd, res1)
	odd = protowire.AppendTag(odd, 12, protowire.BytesType)
	odd = protowire.AppendBytes(odd, res2)

	inputs := map[string][]byte{"odd": odd}
	for name, r := range map[string]*NodeReport{
		"empty": {}, "valid": validNodeReport(), "shared": big,
		"bench": func() *NodeReport { r := new(NodeReport); _ = proto.Unmarshal(benchReport(), r); return r }(),
	} {
		b, err := proto.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		inputs[name] = b
	}
	var d NodeDecoder
	for _, order := range [][]string{
		{"shared", "empty", "valid", "shared", "bench", "odd", "shared", "valid", "odd", "empty"},
	} {
		for _, name := range order {
			t.Run(name, func(t *testing.T) { agree(t, &d, inputs[name]) })
		}
	}
	// The merged pod holds both occurrences' fields.
	r, err := d.decode(odd)
	if err != nil {
		t.Fatal(err)
	}
	if res := r.GetResources(); res.GetCpuAllocatableMillis() != 8000 || res.GetCpuRequestedMillis() != 500 || res.GetMemoryRequestedBytes() != 1<<30 {
		t.Fatalf("resources given twice read as %v", res)
	}
	if p := r.GetGpus()[0].GetPod(); p.GetNamespace() != "ml" || p.GetName() != "merged" || len(p.GetLabels()) != 2 || r.GetNode() != "gpu-node-2" {
		t.Fatalf("fields given twice read as %v", r)
	}
}

// TestNodeDecoderRefuses covers the payloads UnmarshalVT refuses: each must be refused
// too.
func TestNodeDecoderRefuses(t *testing.T) {
	valid, _ := proto.Marshal(sharedNodeReport())
	var d NodeDecoder
	for i := range valid { // every truncation of a valid report
		agree(t, &d, valid[:i])
	}
	for _, data := range [][]byte{
		{0x0a, 0x80},                         // a length cut short
		{0x08, 0x01},                         // node as a varint: wrong wire type
		{0x4a, 0x02, 0x38, 0x01},             // a GPU's gpu_util as a varint
		{0x4a, 0x03, 0x7a, 0x01, 0x08},       // a pod's namespace as a varint
		{0x04},                               // an end-group tag alone
		{0x00},                               // field 0
		{0x32, 0x04, 0x0a, 0x05, 0x61, 0x62}, // a label key longer than the message
		{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01}, // a tag of eleven bytes
	} {
		want := new(NodeReport)
		if want.UnmarshalVT(data) == nil {
			t.Fatalf("%x: UnmarshalVT accepts it; the case is wrong", data)
		}
		if _, err := d.decode(data); err == nil {
			t.Errorf("%x: NodeDecoder accepts what UnmarshalVT refuses", data)
		}
	}
}

// TestNodeDecoderDecodes checks the whole path: a valid report on its subject, a report
// that fails validation, one on another node's subject, and a queue report, which
// NodeDecoder hands to Decode.
func TestNodeDecoderDecodes(t *testing.T) {
	var d NodeDecoder
	valid, _ := proto.Marshal(sharedNodeReport())
	ev, err := d.Decode("gpuscaler.v1.node.gpu-node-1", valid)
	if err != nil || ev.Node.GetNode() != "gpu-node-1" || len(ev.Node.GetGpus()) != 4 {
		t.Fatalf("Decode: %v, %v", ev.Node, err)
	}
	if _, err := d.Decode("gpuscaler.v1.node.gpu-node-2", valid); !errors.Is(err, ErrSubjectMismatch) {
		t.Errorf("another node's subject: %v, want ErrSubjectMismatch", err)
	}
	bad := sharedNodeReport()
	bad.Gpus[0].GpuUtil = proto.Float64(101)
	data, _ := proto.Marshal(bad)
	_, err = d.Decode("gpuscaler.v1.node.gpu-node-1", data)
	if _, want := Decode("gpuscaler.v1.node.gpu-node-1", data); err == nil || err.Error() != want.Error() {
		t.Errorf("invalid report: %v, want Decode's %v", err, want)
	}
	if _, err := d.Decode("gpuscaler.v1.node.gpu-node-1", []byte{0x0a, 0x80}); !errors.Is(err, ErrUndecodable) {
		t.Errorf("undecodable: %v", err)
	}
	if _, err := d.Decode("gpuscaler.v1.node.gpu-node-1", make([]byte, MaxEventBytes+1)); !errors.Is(err, ErrUndecodable) {
		t.Errorf("too large: %v", err)
	}
	q, _ := proto.Marshal(&QueueReport{Namespace: "ml", Queue: "jobs", ProducerId: "p", Waiting: 3})
	if ev, err := d.Decode("gpuscaler.v1.queue.ml.jobs.p", q); err != nil || ev.Queue.GetWaiting() != 3 {
		t.Errorf("queue report: %v, %v", ev, err)
	}
}

// TestNodeDecoderAllocatesNothing holds the decoder to its purpose: a report like the
// last is decoded without allocating.
func TestNodeDecoderAllocatesNothing(t *testing.T) {
	for name, r := range map[string]*NodeReport{"bench": nil, "shared": sharedNodeReport()} {
		data := benchReport()
		if r != nil {
			r.Unattributed = nil // decoded apart, allocating
			data, _ = proto.Marshal(r)
		}
		var d NodeDecoder
		if _, err := d.decode(data); err != nil {
			t.Fatal(err)
		}
		if n := testing.AllocsPerRun(100, func() { _, _ = d.decode(data) }); n != 0 {
			t.Errorf("%s: %v allocations per report, want 0", name, n)
		}
	}
}

// FuzzNodeDecoderAgrees holds NodeDecoder to UnmarshalVT on any bytes. Each input is
// decoded after a large report with the same decoder, so that what the decoder reuses is
// exercised.
func FuzzNodeDecoderAgrees(f *testing.F) {
	big, _ := proto.Marshal(sharedNodeReport())
	f.Add(big)
	f.Add(benchReport())
	valid, _ := proto.Marshal(validNodeReport())
	f.Add(valid)
	f.Add([]byte{0x0a, 0x80})
	f.Add([]byte{0x32, 0x04, 0x0a, 0x05, 0x61, 0x62})
	f.Add([]byte{0x62, 0x04, 0x08, 0xe8, 0x07, 0x18}) // resources, its last varint cut short
	f.Fuzz(func(t *testing.T, data []byte) {
		var d NodeDecoder
		if _, err := d.decode(big); err != nil {
			t.Fatal(err)
		}
		agree(t, &d, data)
		if len(data) < 64 {
			return
		}
		// Also with one byte changed, so a change of a field in a valid report is met.
		mutated := append([]byte(nil), data...)
		mutated[len(mutated)/2] ^= 0x40
		agree(t, &d, mutated)
	})
}

func BenchmarkNodeDecoder(b *testing.B) {
	data := benchReport()
	var d NodeDecoder
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := d.Decode("gpuscaler.v1.node.gpu-node-1", data); err != nil {
			b.Fatal(err)
		}
	}
}

// TestNodeDecoderDropsWhatOneLargeReportGrew: a report far larger than valid ones (here
// 2,000 pods on one GPU and 1,000 node labels, which validation refuses) is decoded, but
// what the decoder grew for it is not kept past the next report.
func TestNodeDecoderDropsWhatOneLargeReportGrew(t *testing.T) {
	large := &NodeReport{Node: "n", NodeLabels: map[string]string{}, Gpus: []*GPUSample{{Uuid: "GPU-0", Pod: &PodRef{Namespace: "ml", Name: "p"}}}}
	for i := range 2000 {
		large.Gpus[0].OtherPods = append(large.Gpus[0].OtherPods, &PodRef{Namespace: "ml", Name: fmt.Sprint("p", i)})
	}
	for i := range 1000 {
		large.NodeLabels[fmt.Sprint("label-", i)] = "x"
	}
	var d NodeDecoder
	agree(t, &d, mustMarshalNode(t, large))
	if len(d.pods) < 2000 || len(d.labels) != 1000 {
		t.Fatalf("the large report took %d pod slots and %d labels; the case is wrong", len(d.pods), len(d.labels))
	}
	agree(t, &d, mustMarshalNode(t, validNodeReport()))
	if len(d.pods) > maxKeptPodSlots || d.labels != nil {
		t.Errorf("after a valid report the decoder still holds %d pod slots and %d labels' map", len(d.pods), len(d.labels))
	}
}

func mustMarshalNode(t *testing.T, r *NodeReport) []byte {
	t.Helper()
	b, err := proto.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
