//go:build cgo

package collector

import (
	"bufio"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"google.golang.org/protobuf/proto"
)

// An NVIDIA H200's MIG profiles as NVML gave them on one (hack/hardware-check.sh,
// driver 580.159.04, 2026-11-26, MIG mode off: NVML answers the profiles of a GPU that
// can run MIG): nvmlDeviceGetGpuInstanceProfileInfo by profile index, the indices it
// answered NOT_SUPPORTED for left out. testdata/nvidia-smi-mig-lgip-h200.txt is what
// `nvidia-smi mig -lgip` printed on the same machine.
const h200TotalMiB = 143771

var h200GIProfiles = map[int]nvml.GpuInstanceProfileInfo{
	nvml.GPU_INSTANCE_PROFILE_1_SLICE:      {Id: 19, SliceCount: 1, InstanceCount: 7, MemorySizeMB: 16384},
	nvml.GPU_INSTANCE_PROFILE_2_SLICE:      {Id: 14, SliceCount: 2, InstanceCount: 3, MemorySizeMB: 33280},
	nvml.GPU_INSTANCE_PROFILE_3_SLICE:      {Id: 9, SliceCount: 3, InstanceCount: 2, MemorySizeMB: 71424},
	nvml.GPU_INSTANCE_PROFILE_4_SLICE:      {Id: 5, SliceCount: 4, InstanceCount: 1, MemorySizeMB: 71424},
	nvml.GPU_INSTANCE_PROFILE_7_SLICE:      {Id: 0, SliceCount: 7, InstanceCount: 1, MemorySizeMB: 143360},
	nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV1: {Id: 20, SliceCount: 1, InstanceCount: 1, MemorySizeMB: 16384},
	nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV2: {Id: 15, SliceCount: 1, InstanceCount: 4, MemorySizeMB: 33280},
}

// h200GIProfile answers GetGpuInstanceProfileInfo as the H200 did.
func h200GIProfile(i int) (nvml.GpuInstanceProfileInfo, nvml.Return) {
	if p, ok := h200GIProfiles[i]; ok {
		return p, nvml.SUCCESS
	}
	if i >= nvml.GPU_INSTANCE_PROFILE_COUNT {
		return nvml.GpuInstanceProfileInfo{}, nvml.ERROR_INVALID_ARGUMENT
	}
	return nvml.GpuInstanceProfileInfo{}, nvml.ERROR_NOT_SUPPORTED
}

// smiProfile is one row of `nvidia-smi mig -lgip`.
type smiProfile struct {
	name string
	gib  float64
}

// readLGIP reads the profiles `nvidia-smi mig -lgip` printed, by profile id.
func readLGIP(t *testing.T, path string) map[uint32]smiProfile {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	// "|   0  MIG 1g.18gb         19     7/7        16.00      No     16     1     0   |"
	row := regexp.MustCompile(`^\|\s+\d+\s+MIG (\S+)\s+(\d+)\s+\d+/\d+\s+([\d.]+)\s`)
	out := map[uint32]smiProfile{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		m := row.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		id, _ := strconv.ParseUint(m[2], 10, 32)
		gib, _ := strconv.ParseFloat(m[3], 64)
		out[uint32(id)] = smiProfile{name: m[1], gib: gib}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestMIGProfileNamesOfAnH200: the NVML source names each of an H200's profiles as
// nvidia-smi does (and the device plugin, whose resource names are nvidia.com/mig-<name>),
// from the sizes NVML gave on a real one. Naming a slice by its own memory rounded up to
// whole GiB, as the DCGM source did, gives 1g.16gb for 1g.18gb.
func TestMIGProfileNamesOfAnH200(t *testing.T) {
	smi := readLGIP(t, "testdata/nvidia-smi-mig-lgip-h200.txt")
	if len(smi) != len(h200GIProfiles) {
		t.Fatalf("nvidia-smi lists %d profiles, NVML gave %d", len(smi), len(h200GIProfiles))
	}
	for index, p := range h200GIProfiles {
		want, ok := smi[p.Id]
		if !ok {
			t.Errorf("profile id %d (index %d) is not in nvidia-smi's list", p.Id, index)
			continue
		}
		if gib := float64(p.MemorySizeMB) / 1024; gib != want.gib {
			t.Errorf("profile %s: NVML's %d MiB is not nvidia-smi's %.2f GiB: the capture and the table disagree", want.name, p.MemorySizeMB, want.gib)
		}
		if got := nvmlMIGProfile(index, p.SliceCount, p.SliceCount, uint64(p.MemorySizeMB), h200TotalMiB<<20); got != want.name {
			t.Errorf("profile index %d (id %d, %d slices, %d MiB): named %q, nvidia-smi says %q", index, p.Id, p.SliceCount, p.MemorySizeMB, got, want.name)
		}
	}
}

// TestDCGMMIGProfileFromNVML: the DCGM source names an H200's MIG instances as the
// device plugin does, with NVML's help, whatever framebuffer size DCGM reads for them
// (fullMIG's 19968 MiB would have made 1g.20gb); with the single strategy (slices offered
// as nvidia.com/gpu) the name is what capacityAware's gpusPerReplica matches. Without
// NVML the names are guessed from DCGM's sizes, and the warning says so.
func TestDCGMMIGProfileFromNVML(t *testing.T) {
	const gpu = "GPU-c848f83d-0b16-b318-6c7a-8f85dced8a88"
	insts := []dcgmInstance{
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
		ids      dcgmIdentifier
		want     []string
		wantWarn bool
	}{
		"NVML names the profiles": {ids: newNVMLIdentifier(nv), want: []string{"1g.18gb+me", "3g.71gb", "1g.35gb"}},
		"no NVML: named from DCGM's 19968 MiB": {
			ids: newNVMLIdentifier(nvmlFailsInit), want: []string{"1g.20gb", "3g.20gb", "1g.20gb"}, wantWarn: true,
		},
	} {
		t.Run(name, func(t *testing.T) {
			f := newFakeDCGM(t, []dcgmGPU{{ID: 0, UUID: gpu, Model: "NVIDIA H200"}}, insts)
			for _, in := range insts {
				f.fullMIG(in.ID)
			}
			log, logs := testLogger()
			src := newTestDCGM(t, f, tc.ids, newFakeClock(), DCGMConfig{Log: log})
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
