//go:build cgo

package mig

import (
	"bufio"
	"os"
	"regexp"
	"strconv"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpuscaler/gpuscaler/collector/internal/collectortest"
)

func TestProfileName(t *testing.T) {
	const a100_40, a100_80, a30, h100 = 40960 << 20, 81920 << 20, 24576 << 20, 81559 << 20 // bytes, as NVML reports them
	tests := map[string]struct {
		giProfile          int
		giSlices, ciSlices uint32
		memMiB, gpuBytes   uint64
		want               string
	}{
		"A100 40GB 1g.5gb":       {nvml.GPU_INSTANCE_PROFILE_1_SLICE, 1, 1, 4864, a100_40, "1g.5gb"},
		"A100 40GB 1g.5gb+me":    {nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV1, 1, 1, 4864, a100_40, "1g.5gb+me"},
		"A100 40GB 7g.40gb":      {nvml.GPU_INSTANCE_PROFILE_7_SLICE, 7, 7, 40192, a100_40, "7g.40gb"},
		"A100 40GB 1c.3g.20gb":   {nvml.GPU_INSTANCE_PROFILE_3_SLICE, 3, 1, 19968, a100_40, "1c.3g.20gb"},
		"A100 80GB 1g.10gb":      {nvml.GPU_INSTANCE_PROFILE_1_SLICE, 1, 1, 9856, a100_80, "1g.10gb"},
		"A100 80GB 3g.40gb":      {nvml.GPU_INSTANCE_PROFILE_3_SLICE, 3, 3, 40192, a100_80, "3g.40gb"},
		"A100 80GB 7g.80gb":      {nvml.GPU_INSTANCE_PROFILE_7_SLICE, 7, 7, 80896, a100_80, "7g.80gb"},
		"A30 1g.6gb":             {nvml.GPU_INSTANCE_PROFILE_1_SLICE, 1, 1, 5952, a30, "1g.6gb"},
		"A30 1g.6gb+me.all":      {nvml.GPU_INSTANCE_PROFILE_1_SLICE_ALL_ME, 1, 1, 5952, a30, "1g.6gb+me.all"},
		"A30 1g.6gb-me":          {nvml.GPU_INSTANCE_PROFILE_1_SLICE_NO_ME, 1, 1, 5952, a30, "1g.6gb-me"},
		"A30 1g.6gb+gfx":         {nvml.GPU_INSTANCE_PROFILE_1_SLICE_GFX, 1, 1, 5952, a30, "1g.6gb+gfx"},
		"H100 1g.10gb":           {nvml.GPU_INSTANCE_PROFILE_1_SLICE, 1, 1, 9856, h100, "1g.10gb"},
		"unknown profile index":  {-1, 2, 2, 9856, a100_40, "2g.10gb"},
		"unknown compute slices": {nvml.GPU_INSTANCE_PROFILE_2_SLICE, 2, 0, 9856, a100_40, "2g.10gb"},
		"no slices":              {nvml.GPU_INSTANCE_PROFILE_2_SLICE, 0, 0, 9856, a100_40, ""},
		"no memory":              {nvml.GPU_INSTANCE_PROFILE_2_SLICE, 2, 2, 0, a100_40, ""},
		"no GPU memory":          {nvml.GPU_INSTANCE_PROFILE_2_SLICE, 2, 2, 9856, 0, ""},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if got := ProfileName(tc.giProfile, tc.giSlices, tc.ciSlices, tc.memMiB, tc.gpuBytes); got != tc.want {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
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

// TestProfileNamesOfAnH200: the NVML source names each of an H200's profiles as
// nvidia-smi does (and the device plugin, whose resource names are nvidia.com/mig-<name>),
// from the sizes NVML gave on a real one. Naming a slice by its own memory rounded up to
// whole GiB, as the DCGM source did, gives 1g.16gb for 1g.18gb.
func TestProfileNamesOfAnH200(t *testing.T) {
	smi := readLGIP(t, "testdata/nvidia-smi-mig-lgip-h200.txt")
	if len(smi) != len(collectortest.H200GIProfiles) {
		t.Fatalf("nvidia-smi lists %d profiles, NVML gave %d", len(smi), len(collectortest.H200GIProfiles))
	}
	for index, p := range collectortest.H200GIProfiles {
		want, ok := smi[p.Id]
		if !ok {
			t.Errorf("profile id %d (index %d) is not in nvidia-smi's list", p.Id, index)
			continue
		}
		if gib := float64(p.MemorySizeMB) / 1024; gib != want.gib {
			t.Errorf("profile %s: NVML's %d MiB is not nvidia-smi's %.2f GiB: the capture and the table disagree", want.name, p.MemorySizeMB, want.gib)
		}
		if got := ProfileName(index, p.SliceCount, p.SliceCount, uint64(p.MemorySizeMB), collectortest.H200TotalMiB<<20); got != want.name {
			t.Errorf("profile index %d (id %d, %d slices, %d MiB): named %q, nvidia-smi says %q", index, p.Id, p.SliceCount, p.MemorySizeMB, got, want.name)
		}
	}
}
