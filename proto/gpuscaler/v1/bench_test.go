package gpuscalerv1

import (
	"fmt"
	"testing"

	"google.golang.org/protobuf/proto"
)

func benchReport() []byte {
	r := validNodeReport()
	r.Gpus = nil
	for g := range 8 {
		s := &GPUSample{Uuid: fmt.Sprintf("GPU-%d", g), GpuUtil: proto.Float64(50), SmActive: proto.Float64(40), TensorActive: proto.Float64(30),
			FbUsedBytes: proto.Uint64(1), FbTotalBytes: proto.Uint64(2), PowerWatts: proto.Float64(300), TemperatureCelsius: proto.Float64(50), Model: "NVIDIA H100 80GB HBM3"}
		if g < 7 {
			s.Pod = &PodRef{Namespace: "ns", Name: fmt.Sprintf("svc-%d", g), Container: "main", Labels: map[string]string{"app": "svc", "tier": "gpu", "pod-template-hash": "7d4b9c8f6"}, OwnerKind: "Deployment", OwnerName: "svc"}
		}
		r.Gpus = append(r.Gpus, s)
	}
	b, _ := proto.Marshal(r)
	return b
}

// BenchmarkUnmarshalReflect is the baseline Decode avoids: proto.Unmarshal of an 8-GPU
// NodeReport with pod labels.
func BenchmarkUnmarshalReflect(b *testing.B) {
	data := benchReport()
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	for b.Loop() {
		r := new(NodeReport)
		if err := proto.Unmarshal(data, r); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkDecode is what the scaler does per stored NodeReport: subject parse, decode
// and validation.
func BenchmarkDecode(b *testing.B) {
	data := benchReport()
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Decode("gpuscaler.v1.node.gpu-node-1", data); err != nil {
			b.Fatal(err)
		}
	}
}

// TestGeneratedAndReflectDecodingAgree guards the switch to UnmarshalVT: both decoders
// read the same message from the same bytes.
func TestGeneratedAndReflectDecodingAgree(t *testing.T) {
	data := benchReport()
	a, b := new(NodeReport), new(NodeReport)
	if err := proto.Unmarshal(data, a); err != nil {
		t.Fatal(err)
	}
	if err := b.UnmarshalVT(data); err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(a, b) {
		t.Fatalf("UnmarshalVT read %v, proto.Unmarshal read %v", b, a)
	}
	vt, err := a.MarshalVT()
	if err != nil {
		t.Fatal(err)
	}
	c := new(NodeReport)
	if err := proto.Unmarshal(vt, c); err != nil || !proto.Equal(a, c) {
		t.Fatalf("MarshalVT output does not read back: %v, %v", c, err)
	}
}
