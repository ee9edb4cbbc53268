//go:build cgo

package dcgm

import (
	"slices"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"google.golang.org/protobuf/proto"
)

// TestMIGProfileFromNVML: the DCGM source names an H200's MIG instances as the
// device plugin does, with NVML's help, whatever framebuffer size DCGM reads for them
// (fullMIG's 19968 MiB would have made 1g.20gb); with the single strategy (slices offered
// as nvidia.com/gpu) the name is what capacityAware's gpusPerReplica matches. Without
// NVML the names are guessed from DCGM's sizes, and the warning says so.
func TestMIGProfileFromNVML(t *testing.T) {
	const gpu = "GPU-c848f83d-0b16-b318-6c7a-8f85dced8a88"
	insts := []instance{
		{ID: 1, ParentGPU: 0, InstanceID: 1, HasComputeInstance: true, Slices: 1},
		{ID: 2, ParentGPU: 0, InstanceID: 2, HasComputeInstance: true, Slices: 3},
		{ID: 3, ParentGPU: 0, InstanceID: 5, HasComputeInstance: true, Slices: 1},
	}
	attrs := func(slices, mib uint32) *nvml.DeviceAttributes {
		return &nvml.DeviceAttributes{GpuInstanceSliceCount: slices, ComputeInstanceSliceCount: slices, MemorySizeMB: uint64(mib)}
	}
	nv := mockNVMLIDs(map[string]int{gpu: 0}, map[string][]mockMIGDevice{gpu: {
		{gi: 1, uuid: "MIG-11111111-0000-0000-0000-000000000001", attrs: attrs(1, 16384), giProf: proto.Uint32(20)},
		{gi: 2, uuid: "MIG-11111111-0000-0000-0000-000000000002", attrs: attrs(3, 71424), giProf: proto.Uint32(9)},
		{gi: 5, uuid: "MIG-11111111-0000-0000-0000-000000000005", attrs: attrs(1, 33280), giProf: proto.Uint32(15)},
	}})
	nvmlFailsInit := mockNVMLIDs(nil, nil)
	nvmlFailsInit.InitFunc = func() nvml.Return { return nvml.ERROR_LIBRARY_NOT_FOUND }
	for name, tc := range map[string]struct {
		ids      identifier
		want     []string
		wantWarn bool
	}{
		"NVML names the profiles": {ids: newNVMLIdentifier(nv), want: []string{"1g.18gb+me", "3g.71gb", "1g.35gb"}},
		"no NVML: named from DCGM's 19968 MiB": {
			ids: newNVMLIdentifier(nvmlFailsInit), want: []string{"1g.20gb", "3g.20gb", "1g.20gb"}, wantWarn: true,
		},
	} {
		t.Run(name, func(t *testing.T) {
			f := newFake(t, []gpuInfo{{ID: 0, UUID: gpu, Model: "NVIDIA H200"}}, insts)
			for _, in := range insts {
				f.fullMIG(in.ID)
			}
			log, logs := testLogger()
			src := newTestSource(t, f, tc.ids, newFakeClock(), Config{Log: log})
			var got []string
			for _, s := range collect(t, src) {
				got = append(got, s.GetMigProfile())
			}
			if !slices.Equal(got, tc.want) {
				t.Fatalf("got MIG profiles %q, want %q", got, tc.want)
			}
			if warned := strings.Contains(logs.String(), "profiles are named from DCGM's sizes"); warned != tc.wantWarn {
				t.Errorf("warned of guessed profile names: %v, want %v:\n%s", warned, tc.wantWarn, logs)
			}
		})
	}
}
