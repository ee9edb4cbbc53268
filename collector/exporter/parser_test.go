package exporter

import (
	"bytes"
	"errors"
	"fmt"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/proto"

	gpuscalerv1 "github.com/gpuscaler/gpuscaler/proto/gpuscaler/v1"
)

const testdataDir = "testdata/dcgm-exporter"

func fixture(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(testdataDir, name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// parseValid parses page, checks that the samples make a valid NodeReport and
// that a second parse gives the same result, and returns what the first gave.
func parseValid(t testing.TB, page []byte) ([]*gpuscalerv1.GPUSample, []error) {
	t.Helper()
	got, problems := Parse(bytes.NewReader(page))
	if err := (&gpuscalerv1.NodeReport{Node: "n", Gpus: got}).Validate(); err != nil {
		t.Fatalf("samples do not validate: %v", err)
	}
	again, problems2 := Parse(bytes.NewReader(page))
	if !samplesEqual(got, again) || len(problems) != len(problems2) {
		t.Fatalf("a second parse differs: got %d samples and %d problems, then %d and %d",
			len(got), len(problems), len(again), len(problems2))
	}
	checkLinesCostNothingElse(t, page, got, problems)
	return got, problems
}

// checkLinesCostNothingElse checks that the lines the parser rejected cost nothing
// but themselves: the page without them parses to the same samples, rejecting nothing.
func checkLinesCostNothingElse(t testing.TB, page []byte, samples []*gpuscalerv1.GPUSample, problems []error) {
	t.Helper()
	if len(problems) > maxProblems {
		return // not every rejected line is listed
	}
	rejected := map[int]bool{}
	for _, p := range problems {
		var le *LineError
		if errors.As(p, &le) {
			rejected[le.Line] = true
		}
	}
	if len(rejected) == 0 {
		return
	}
	lines := bytes.Split(page, []byte("\n"))
	for i := range lines {
		if rejected[i+1] {
			lines[i] = nil // blank, so the other lines keep their numbers
		}
	}
	got, problems := Parse(bytes.NewReader(bytes.Join(lines, []byte("\n"))))
	for _, p := range problems {
		var le *LineError
		if errors.As(p, &le) {
			t.Fatalf("without the rejected lines %v, line %d is rejected: %v", slices.Sorted(maps.Keys(rejected)), le.Line, p)
		}
	}
	if !samplesEqual(got, samples) {
		t.Fatalf("without the rejected lines %v the samples differ", slices.Sorted(maps.Keys(rejected)))
	}
}

func samplesEqual(a, b []*gpuscalerv1.GPUSample) bool {
	return slices.EqualFunc(a, b, func(x, y *gpuscalerv1.GPUSample) bool { return proto.Equal(x, y) })
}

func diffSamples(t *testing.T, got, want []*gpuscalerv1.GPUSample) {
	t.Helper()
	if len(got) != len(want) {
		t.Errorf("got %d samples, want %d", len(got), len(want))
	}
	for i := range min(len(got), len(want)) {
		if !proto.Equal(got[i], want[i]) {
			t.Errorf("sample %d:\ngot  %s\nwant %s", i, prototext.Format(got[i]), prototext.Format(want[i]))
		}
	}
	for i := len(want); i < len(got); i++ {
		t.Errorf("extra sample %d: %s", i, prototext.Format(got[i]))
	}
}

// problemsOf splits problems into the line numbers the text parser rejected and the
// messages of the others.
func problemsOf(t *testing.T, problems []error) (lines []int, others []string) {
	t.Helper()
	for _, p := range problems {
		if p == nil {
			t.Fatal("got a nil problem")
		}
		var le *LineError
		if errors.As(p, &le) {
			lines = append(lines, le.Line)
		} else {
			others = append(others, p.Error())
		}
	}
	return lines, others
}

// markedLines returns the numbers of the lines that follow a "# rejected:" comment.
func markedLines(page []byte) []int {
	var out []int
	for i, l := range strings.Split(string(page), "\n") {
		if strings.HasPrefix(l, "# rejected:") {
			out = append(out, i+2)
		}
	}
	return out
}

// checkOthers checks that each want is in exactly one problem and every problem
// is wanted.
func checkOthers(t *testing.T, others, want []string) {
	t.Helper()
	used := make([]bool, len(others))
	for _, w := range want {
		found := false
		for i, o := range others {
			if !used[i] && strings.Contains(o, w) {
				used[i], found = true, true
				break
			}
		}
		if !found {
			t.Errorf("no problem mentions %q; got %q", w, others)
		}
	}
	for i, o := range others {
		if !used[i] {
			t.Errorf("unexpected problem %q", o)
		}
	}
}

func pctOf(ratio float64) *float64 { return proto.Float64(ratio * 100) }

func mib(n uint64) *uint64 { return proto.Uint64(n << 20) }

func podOf(ns, name, container string) *gpuscalerv1.PodRef {
	return &gpuscalerv1.PodRef{Namespace: ns, Name: name, Container: container}
}

func TestParseCaptures(t *testing.T) {
	h100 := []struct {
		uuid  string
		temp  float64
		power float64
	}{
		{"GPU-c4529c8d-69c4-b61d-e0bc-7b2460096005", 30, 113.611},
		{"GPU-bc5610b9-79c8-fedd-8899-07539c7f868a", 29, 68.347},
		{"GPU-fbc2c554-4d37-8938-0032-f923bad0f716", 26, 65.709},
		{"GPU-a65a773d-52bb-bcc1-a8ee-f78c3faa2e2d", 29, 67.316},
		{"GPU-82e45d1b-1618-559f-144c-eab51545030b", 28, 68.717},
		{"GPU-39e28159-8c62-ee71-64db-b748edd61e15", 26, 65.742},
		{"GPU-e64d69ca-b4b3-59b2-e78c-94f26c4db365", 28, 67.328},
		{"GPU-04d228d3-3b5a-3534-f5cf-969706647d56", 26, 66.997},
	}
	var h100Want []*gpuscalerv1.GPUSample
	for i, g := range h100 {
		s := &gpuscalerv1.GPUSample{
			Uuid: g.uuid, Index: uint32(i), Model: "NVIDIA H100 80GB HBM3",
			GpuUtil: proto.Float64(0), PowerWatts: proto.Float64(g.power), TemperatureCelsius: proto.Float64(g.temp),
		}
		if i == 0 {
			s.Pod = podOf("dynamo-workload", "vllm-agg-0-vllmdecodeworker-s65j5", "main")
		}
		h100Want = append(h100Want, s)
	}

	// The captures are exporters without --kubernetes-virtual-gpus or a minor number
	// field, with XID 0 throughout: every sample is healthy, unshared, with one pod at
	// most and no Minor, whatever their device="nvidiaN" labels say.
	for name, tc := range map[string]struct {
		file string
		want []*gpuscalerv1.GPUSample
	}{
		// One GPU, HELP and TYPE lines, FB_RESERVED, pod labels with an empty pod_uid.
		"linode RTX 4000 Ada with a pod": {
			file: "linode-rtx4000ada-k8s-pod.prom",
			want: []*gpuscalerv1.GPUSample{{
				Uuid: "GPU-a8394b51-c086-568a-9f1a-c1e1c934c44c", Index: 0, Model: "NVIDIA RTX 4000 Ada Generation",
				GpuUtil: proto.Float64(0), TensorActive: pctOf(0),
				FbUsedBytes: mib(1), FbTotalBytes: mib(1 + 20015 + 457),
				PowerWatts: proto.Float64(40.979), TemperatureCelsius: proto.Float64(48),
				Pod: podOf("default", "cuda-75454ffb9f-8ljq7", "cuda"),
			}},
		},
		// Eight GPUs, no HELP or TYPE lines, no framebuffer fields, a pod on GPU 0 only.
		"aicr eight H100, sampled": {
			file: "aicr-h100-8gpu-k8s-pod-sampled.prom",
			want: h100Want,
		},
		// A GPU in MIG mode with one instance in the excerpt, families not contiguous: the
		// instance replaces the GPU and does not take its power, temperature or memory.
		"NVIDIA docs A100 with a MIG slice": {
			file: "nvidia-docs-a100-mig.prom",
			want: []*gpuscalerv1.GPUSample{{
				Uuid: "GPU-34319582-d595-d1c7-d1d2-179bcfa61660", Index: 0,
				MigProfile: "1g.5gb", MigInstanceId: proto.Uint32(13),
				DeviceId: "GPU-34319582-d595-d1c7-d1d2-179bcfa61660/gi13",
				GpuUtil:  pctOf(0.995687), TensorActive: pctOf(0.930433),
			}},
		},
	} {
		t.Run(name, func(t *testing.T) {
			got, problems := parseValid(t, fixture(t, tc.file))
			if len(problems) > 0 {
				t.Errorf("got problems %v, want none", problems)
			}
			diffSamples(t, got, tc.want)
		})
	}
}

func TestParseFixtures(t *testing.T) {
	a100 := "NVIDIA A100-SXM4-80GB"
	h100 := "NVIDIA H100 80GB HBM3"
	l4 := "NVIDIA L4"
	a10 := "NVIDIA A10"
	mig0 := "GPU-2b7e8f90-3c4d-4e5f-8a6b-7c8d9e0f1a2b"
	for name, tc := range map[string]struct {
		file string
		want []*gpuscalerv1.GPUSample
		// wantOthers are problems other than rejected lines, one substring each; the
		// rejected lines are those the fixture marks with a "# rejected:" comment.
		wantOthers []string
	}{
		"whole GPUs with pods": {
			file: "whole-gpus-pods.prom",
			want: []*gpuscalerv1.GPUSample{
				{
					Uuid: "GPU-5d2f3e6a-1b7c-4f0e-9a84-2c6d1e0f7a31", Index: 0, Model: a100,
					GpuUtil: proto.Float64(97), SmActive: pctOf(0.912345), TensorActive: pctOf(0.6123),
					FbUsedBytes: mib(71234), FbTotalBytes: mib(81920),
					PowerWatts: proto.Float64(387.412), TemperatureCelsius: proto.Float64(67),
					Pod: podOf("ml-training", "llama-ft-worker-0", "trainer"),
				},
				{
					Uuid: "GPU-8a41c0d2-77e3-4b5d-b0c9-5e2a9f61d804", Index: 1, Model: a100,
					GpuUtil: proto.Float64(95), SmActive: pctOf(0.89765), TensorActive: pctOf(0.59876),
					FbUsedBytes: mib(71010), FbTotalBytes: mib(81920),
					PowerWatts: proto.Float64(379.118), TemperatureCelsius: proto.Float64(65),
					Pod: podOf("ml-training", "llama-ft-worker-0", "trainer"),
				},
				{
					Uuid: "GPU-c03e91b7-2d48-4f6a-8e15-93b7d4a0c2f9", Index: 2, Model: a100,
					GpuUtil: proto.Float64(38), SmActive: pctOf(0.3012), TensorActive: pctOf(0.120045),
					FbUsedBytes: mib(64120), FbTotalBytes: mib(81920),
					PowerWatts: proto.Float64(162.55), TemperatureCelsius: proto.Float64(48),
					XidErrors: 1, LastXid: 31, // a GPU memory page fault: the application's, not the GPU's
					Pod: podOf("inference", "vllm-mistral-7b-6c9f8d7b5-x2kqp", "vllm"),
				},
				{
					Uuid: "GPU-f1b2a3c4-5d6e-4f70-8a91-b2c3d4e5f607", Index: 3, Model: a100,
					GpuUtil: proto.Float64(0), SmActive: pctOf(0), TensorActive: pctOf(0),
					FbUsedBytes: mib(0), FbTotalBytes: mib(81920),
					PowerWatts: proto.Float64(61.042), TemperatureCelsius: proto.Float64(31),
				},
			},
		},
		"MIG slices with pods": {
			file: "mig-pods.prom",
			want: []*gpuscalerv1.GPUSample{
				{
					Uuid: mig0, Index: 0, Model: h100, MigProfile: "3g.40gb", MigInstanceId: proto.Uint32(1), DeviceId: mig0 + "/gi1",
					GpuUtil:  proto.Float64(100), // 1.0000001, clamped
					SmActive: pctOf(0.88), TensorActive: pctOf(0.64),
					FbUsedBytes: mib(38912), FbTotalBytes: mib(38912 + 1536),
					Pod: podOf("inference", "llama-70b-0", "server"),
				},
				{
					Uuid: mig0, Index: 0, Model: h100, MigProfile: "2g.20gb", MigInstanceId: proto.Uint32(5), DeviceId: mig0 + "/gi5",
					GpuUtil: pctOf(0), SmActive: pctOf(0), TensorActive: pctOf(0),
					FbUsedBytes: mib(0), FbTotalBytes: mib(19968),
				},
				{
					Uuid: mig0, Index: 0, Model: h100, MigProfile: "1g.10gb", MigInstanceId: proto.Uint32(13), DeviceId: mig0 + "/gi13",
					GpuUtil: pctOf(0.255), SmActive: pctOf(0.201), TensorActive: pctOf(0.0505),
					FbUsedBytes: mib(6144), FbTotalBytes: mib(6144 + 3584),
					Pod: podOf("inference", "embedder-5f7c9d-qwz8r", "embed"),
				},
				{
					Uuid: "GPU-9e8d7c6b-5a49-4382-a716-05f4e3d2c1b0", Index: 1, Model: h100,
					GpuUtil: proto.Float64(100), SmActive: pctOf(0.95), TensorActive: pctOf(0),
					FbUsedBytes: mib(78560), FbTotalBytes: mib(78560 + 2410),
					PowerWatts: proto.Float64(512.873), TemperatureCelsius: proto.Float64(58),
					Pod: podOf("batch", "sdxl-render-28xkq", "worker"),
				},
			},
		},
		"empty and half-empty pod labels, old label names": {
			file: "empty-pods.prom",
			want: []*gpuscalerv1.GPUSample{
				{Uuid: "GPU-0a1b2c3d-4e5f-4a6b-9c7d-8e9f0a1b2c3d", Index: 0, Model: l4, GpuUtil: proto.Float64(0), FbUsedBytes: mib(0), FbTotalBytes: mib(22478)},
				{Uuid: "GPU-1b2c3d4e-5f6a-4b7c-8d9e-0f1a2b3c4d5e", Index: 1, Model: l4, GpuUtil: proto.Float64(0), FbUsedBytes: mib(0), FbTotalBytes: mib(22478)},
				{Uuid: "GPU-2c3d4e5f-6a7b-4c8d-9e0f-1a2b3c4d5e6f", Index: 2, Model: l4, GpuUtil: proto.Float64(12), FbUsedBytes: mib(3012), FbTotalBytes: mib(22478)},
				{
					Uuid: "GPU-3d4e5f6a-7b8c-4d9e-8f0a-2b3c4d5e6f70", Index: 3, Model: l4, GpuUtil: proto.Float64(64), FbUsedBytes: mib(9876), FbTotalBytes: mib(22478),
					Pod: podOf("speech", "whisper-1", "asr"),
				},
			},
		},
		"missing fields": {
			file: "missing-fields.prom",
			want: []*gpuscalerv1.GPUSample{
				// No gpu label: index 0, sorted by UUID among index 0.
				{Uuid: "GPU-44f0e1d2-c3b4-4a59-8687-a9b8c7d6e5f4", Index: 0, TemperatureCelsius: proto.Float64(41)},
				// No FB_FREE: no total. No GPU_UTIL: no util, though GR_ENGINE_ACTIVE is there.
				{Uuid: "GPU-7f3a9c21-0b4d-4e8f-a1c2-3d4e5f6a7b8c", Index: 0, FbUsedBytes: mib(4120), PowerWatts: proto.Float64(33.12), TemperatureCelsius: proto.Float64(52)},
				// No FB_USED: neither used nor total.
				{Uuid: "GPU-1c2d3e4f-5a6b-4c7d-8e9f-a0b1c2d3e4f5", Index: 1, GpuUtil: proto.Float64(5), TemperatureCelsius: proto.Float64(47)},
				// GPU 2 has only a clock, which is not read: it is not reported.
				// FB_TOTAL printed.
				{
					Uuid: "GPU-d4c3b2a1-9f8e-4d7c-a6b5-c4d3e2f1a0b9", Index: 3, GpuUtil: proto.Float64(0),
					FbUsedBytes: mib(15000), FbTotalBytes: mib(15360), PowerWatts: proto.Float64(27.004), TemperatureCelsius: proto.Float64(39),
				},
			},
			wantOthers: []string{"GPU-44f0e1d2-c3b4-4a59-8687-a9b8c7d6e5f4: no gpu label"},
		},
		"garbage lines": {
			file: "garbage.prom",
			want: []*gpuscalerv1.GPUSample{
				{
					Uuid: "GPU-a10a0c1e-2f3a-4b5c-8d6e-7f8091a2b3c4", Index: 0, Model: a10,
					GpuUtil: proto.Float64(42), TensorActive: pctOf(0.25),
					FbUsedBytes: mib(8190), FbTotalBytes: mib(8190 + 14338 + 494),
					TemperatureCelsius: proto.Float64(55),
					Pod:                podOf("team-a", "render-0", "app"),
				},
				{
					Uuid: "GPU-a10b9e8d-7c6b-4a59-9483-72615f4e3d2c", Index: 1, Model: a10,
					SmActive:           proto.Float64(100),
					TemperatureCelsius: proto.Float64(61),
					XidErrors:          1, LastXid: 43, // GPU stopped processing: an application error
				},
			},
			wantOthers: []string{
				"DCGM_FI_DEV_FB_FREE of GPU-a10b9e8d-7c6b-4a59-9483-72615f4e3d2c: 1e+300 is beyond any framebuffer",
				"DCGM_FI_DEV_GPU_TEMP of GPU-a10a0c1e-2f3a-4b5c-8d6e-7f8091a2b3c4: series repeated; the first value kept",
				"DCGM_FI_DEV_GPU_TEMP of GPU-a10b9e8d-7c6b-4a59-9483-72615f4e3d2c: 2.147483632e+09 is DCGM's blank (no value)",
				"DCGM_FI_DEV_POWER_USAGE of GPU-a10a0c1e-2f3a-4b5c-8d6e-7f8091a2b3c4: NaN is not a finite number",
				"DCGM_FI_DEV_POWER_USAGE of GPU-a10b9e8d-7c6b-4a59-9483-72615f4e3d2c: +Inf is not a finite number",
				"DCGM_FI_PROF_SM_ACTIVE of GPU-a10a0c1e-2f3a-4b5c-8d6e-7f8091a2b3c4: -0.5 is negative",
				"DCGM_FI_PROF_PIPE_TENSOR_ACTIVE of GPU-a10b9e8d-7c6b-4a59-9483-72615f4e3d2c: 37 is above a ratio of 1",
				"DCGM_FI_DEV_GPU_TEMP series without a UUID label",
			},
		},
	} {
		t.Run(name, func(t *testing.T) {
			page := fixture(t, tc.file)
			got, problems := parseValid(t, page)
			diffSamples(t, got, tc.want)
			lines, others := problemsOf(t, problems)
			if want := markedLines(page); !slices.Equal(lines, want) {
				t.Errorf("got rejected lines %v, want %v; problems: %v", lines, want, problems)
			}
			checkOthers(t, others, tc.wantOthers)
		})
	}
}

func TestParseRules(t *testing.T) {
	const u = `UUID="GPU-1"`
	for name, tc := range map[string]struct {
		page       string
		want       []*gpuscalerv1.GPUSample
		wantLines  []int
		wantOthers []string
	}{
		"empty page":                    {page: ""},
		"only comments and blank lines": {page: "# hello\n\n   \n# HELP x y\n"},
		"last line without its newline": {
			page: `DCGM_FI_DEV_GPU_TEMP{gpu="0",` + u + `} 50`,
			want: []*gpuscalerv1.GPUSample{{Uuid: "GPU-1", TemperatureCelsius: proto.Float64(50)}},
		},
		"a quoted UTF-8 metric name": {
			page: `{"DCGM_FI_DEV_GPU_TEMP",gpu="0",` + u + "} 50\n",
			want: []*gpuscalerv1.GPUSample{{Uuid: "GPU-1", TemperatureCelsius: proto.Float64(50)}},
		},
		"counter and untyped families read as gauges": {
			page: "# TYPE DCGM_FI_DEV_GPU_TEMP counter\n" +
				`DCGM_FI_DEV_GPU_TEMP{gpu="0",` + u + "} 50\n" +
				`DCGM_FI_DEV_POWER_USAGE{gpu="0",` + u + "} 70.5\n",
			want: []*gpuscalerv1.GPUSample{{Uuid: "GPU-1", TemperatureCelsius: proto.Float64(50), PowerWatts: proto.Float64(70.5)}},
		},
		"TYPE lines are not heeded": {
			page: "# TYPE DCGM_FI_DEV_GPU_TEMP histogram\n" + `DCGM_FI_DEV_GPU_TEMP{gpu="0",` + u + "} 50\n",
			want: []*gpuscalerv1.GPUSample{{Uuid: "GPU-1", TemperatureCelsius: proto.Float64(50)}},
		},
		"a percentage a rounding error past 100 is clamped, further is dropped": {
			page: `DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-1"} 100.05` + "\n" +
				`DCGM_FI_DEV_GPU_UTIL{gpu="1",UUID="GPU-2"} 101` + "\n",
			want: []*gpuscalerv1.GPUSample{
				{Uuid: "GPU-1", GpuUtil: proto.Float64(100)},
				{Uuid: "GPU-2", Index: 1},
			},
			wantOthers: []string{"DCGM_FI_DEV_GPU_UTIL of GPU-2: 101 is above 100%"},
		},
		"FB_TOTAL below FB_USED caps used": {
			page: `DCGM_FI_DEV_FB_USED{gpu="0",` + u + "} 100\n" + `DCGM_FI_DEV_FB_TOTAL{gpu="0",` + u + "} 90\n",
			want: []*gpuscalerv1.GPUSample{{Uuid: "GPU-1", FbUsedBytes: mib(90), FbTotalBytes: mib(90)}},
		},
		"FB_TOTAL of zero falls back to the sum": {
			page: `DCGM_FI_DEV_FB_USED{gpu="0",` + u + "} 100\n" + `DCGM_FI_DEV_FB_FREE{gpu="0",` + u + "} 20\n" +
				`DCGM_FI_DEV_FB_TOTAL{gpu="0",` + u + "} 0\n",
			want: []*gpuscalerv1.GPUSample{{Uuid: "GPU-1", FbUsedBytes: mib(100), FbTotalBytes: mib(120)}},
		},
		"FB_FREE alone gives no reading": {
			page: `DCGM_FI_DEV_FB_FREE{gpu="0",` + u + "} 20\n" + `DCGM_FI_DEV_FB_RESERVED{gpu="0",` + u + "} 5\n",
			want: []*gpuscalerv1.GPUSample{{Uuid: "GPU-1"}},
		},
		"fractional MiB": {
			page: `DCGM_FI_DEV_FB_USED{gpu="0",` + u + "} 0.5\n" + `DCGM_FI_DEV_FB_FREE{gpu="0",` + u + "} 1.25\n",
			want: []*gpuscalerv1.GPUSample{{Uuid: "GPU-1", FbUsedBytes: proto.Uint64(1 << 19), FbTotalBytes: proto.Uint64(7 << 18)}},
		},
		"a MIG instance reads util from the graphics engine, not GPU_UTIL": {
			page: `DCGM_FI_DEV_GPU_UTIL{gpu="0",` + u + `,GPU_I_PROFILE="1g.10gb",GPU_I_ID="7"} 50` + "\n" +
				`DCGM_FI_PROF_GR_ENGINE_ACTIVE{gpu="0",` + u + `,GPU_I_PROFILE="1g.10gb",GPU_I_ID="7"} 0.2` + "\n",
			want: []*gpuscalerv1.GPUSample{{Uuid: "GPU-1", MigProfile: "1g.10gb", MigInstanceId: proto.Uint32(7), DeviceId: "GPU-1/gi7", GpuUtil: pctOf(0.2)}},
		},
		"a whole GPU does not read util from the graphics engine": {
			page: `DCGM_FI_PROF_GR_ENGINE_ACTIVE{gpu="0",` + u + "} 0.2\n",
			want: []*gpuscalerv1.GPUSample{{Uuid: "GPU-1"}},
		},
		"MIG instances take the GPU's index and model, not its readings": {
			page: `DCGM_FI_DEV_GPU_TEMP{gpu="3",` + u + `,modelName="NVIDIA A30"} 40` + "\n" +
				`DCGM_FI_DEV_POWER_USAGE{gpu="3",` + u + `,modelName="NVIDIA A30"} 120` + "\n" +
				`DCGM_FI_PROF_GR_ENGINE_ACTIVE{` + u + `,GPU_I_PROFILE="2g.12gb",GPU_I_ID="2"} 0.5` + "\n" +
				`DCGM_FI_PROF_GR_ENGINE_ACTIVE{` + u + `,GPU_I_PROFILE="2g.12gb",GPU_I_ID="1"} 0.25` + "\n",
			want: []*gpuscalerv1.GPUSample{
				{Uuid: "GPU-1", Index: 3, Model: "NVIDIA A30", MigProfile: "2g.12gb", MigInstanceId: proto.Uint32(1), DeviceId: "GPU-1/gi1", GpuUtil: pctOf(0.25)},
				{Uuid: "GPU-1", Index: 3, Model: "NVIDIA A30", MigProfile: "2g.12gb", MigInstanceId: proto.Uint32(2), DeviceId: "GPU-1/gi2", GpuUtil: pctOf(0.5)},
			},
		},
		"GPU_I_ID that is not a number": {
			page:       `DCGM_FI_PROF_GR_ENGINE_ACTIVE{gpu="0",` + u + `,GPU_I_ID="x"} 0.5` + "\n",
			wantOthers: []string{`DCGM_FI_PROF_GR_ENGINE_ACTIVE of GPU-1: GPU_I_ID "x" is not a GPU instance id`},
		},
		"gpu label that is not an index": {
			page:       `DCGM_FI_DEV_GPU_TEMP{gpu="zero",` + u + "} 50\n" + `DCGM_FI_DEV_POWER_USAGE{gpu="zero",` + u + "} 50\n",
			want:       []*gpuscalerv1.GPUSample{{Uuid: "GPU-1", PowerWatts: proto.Float64(50), TemperatureCelsius: proto.Float64(50)}},
			wantOthers: []string{`GPU-1: gpu label "zero" is not an index`},
		},
		"a namespace Kubernetes would not accept": {
			page:       `DCGM_FI_DEV_GPU_TEMP{gpu="0",` + u + `,namespace="Team_A",pod="p"} 50` + "\n",
			want:       []*gpuscalerv1.GPUSample{{Uuid: "GPU-1", TemperatureCelsius: proto.Float64(50)}},
			wantOthers: []string{"GPU-1: pod Team_A/p: "},
		},
		"a series repeated keeps the first value": {
			page:       `DCGM_FI_DEV_GPU_TEMP{gpu="0",` + u + "} 50\n" + `DCGM_FI_DEV_GPU_TEMP{gpu="0",` + u + "} 51\n",
			want:       []*gpuscalerv1.GPUSample{{Uuid: "GPU-1", TemperatureCelsius: proto.Float64(50)}},
			wantOthers: []string{"DCGM_FI_DEV_GPU_TEMP of GPU-1: series repeated"},
		},
		"an invalid first value leaves room for a valid second": {
			page:       `DCGM_FI_DEV_GPU_TEMP{gpu="0",` + u + "} -3\n" + `DCGM_FI_DEV_GPU_TEMP{gpu="0",` + u + "} 51\n",
			want:       []*gpuscalerv1.GPUSample{{Uuid: "GPU-1", TemperatureCelsius: proto.Float64(51)}},
			wantOthers: []string{"DCGM_FI_DEV_GPU_TEMP of GPU-1: -3 is negative"},
		},
		"a whole GPU whose UUID is a MIG instance's device id": {
			page: `DCGM_FI_DEV_GPU_TEMP{gpu="0",UUID="GPU-1/gi1"} 50` + "\n" +
				`DCGM_FI_PROF_GR_ENGINE_ACTIVE{gpu="0",` + u + `,GPU_I_ID="1"} 0.5` + "\n",
			want:       []*gpuscalerv1.GPUSample{{Uuid: "GPU-1", MigInstanceId: proto.Uint32(1), DeviceId: "GPU-1/gi1", GpuUtil: pctOf(0.5)}},
			wantOthers: []string{"GPU-1/gi1: device id GPU-1/gi1 taken by another device; dropped"},
		},
		"bad lines between good ones": {
			page: "# TYPE DCGM_FI_DEV_GPU_TEMP gauge\n" +
				`DCGM_FI_DEV_GPU_TEMP{gpu="0",UUID="GPU-1"} 50` + "\n" +
				`DCGM_FI_DEV_GPU_TEMP{gpu="1",UUID="GPU-2"} ERROR - FAILED TO CONVERT TO STRING` + "\n" +
				`DCGM_FI_DEV_GPU_TEMP{gpu="2",UUID="GPU-3"} 52` + "\n" +
				`DCGM_FI_DEV_GPU_TEMP{gpu="3",UUID="GPU-4"}` + "\n" +
				`DCGM_FI_DEV_GPU_TEMP{gpu="4",UUID="GPU-5"} 54` + "\n",
			want: []*gpuscalerv1.GPUSample{
				{Uuid: "GPU-1", TemperatureCelsius: proto.Float64(50)},
				{Uuid: "GPU-3", Index: 2, TemperatureCelsius: proto.Float64(52)},
				{Uuid: "GPU-5", Index: 4, TemperatureCelsius: proto.Float64(54)},
			},
			wantLines: []int{3, 5},
		},
		// Found by FuzzParse: series are read family by family in name order
		// over the whole page, not run by run.
		"labels do not depend on where a bad line cuts the page": {
			page: `DCGM_FI_DEV_GPU_UTIL{UUID="GPU-1",modelName="A"} 0` + "\nDCGM_FI_DEV_FB_USED\n" +
				`DCGM_FI_DEV_FB_FREE{UUID="GPU-1",modelName="B"} 0` + "\n",
			want:       []*gpuscalerv1.GPUSample{{Uuid: "GPU-1", Model: "B", GpuUtil: proto.Float64(0)}},
			wantLines:  []int{2},
			wantOthers: []string{"GPU-1: no gpu label"},
		},
		"CRLF line ends": {
			page: `DCGM_FI_DEV_GPU_TEMP{gpu="0",` + u + "} 50\r\n" + `DCGM_FI_DEV_GPU_TEMP{gpu="1",UUID="GPU-2"} 51` + "\r\n",
			want: []*gpuscalerv1.GPUSample{
				{Uuid: "GPU-1", TemperatureCelsius: proto.Float64(50)},
				{Uuid: "GPU-2", Index: 1, TemperatureCelsius: proto.Float64(51)},
			},
		},
	} {
		t.Run(name, func(t *testing.T) {
			got, problems := parseValid(t, []byte(tc.page))
			diffSamples(t, got, tc.want)
			lines, others := problemsOf(t, problems)
			if !slices.Equal(lines, tc.wantLines) {
				t.Errorf("got rejected lines %v, want %v; problems: %v", lines, tc.wantLines, problems)
			}
			checkOthers(t, others, tc.wantOthers)
		})
	}
}

func TestParseBounds(t *testing.T) {
	t.Run("more devices than a report holds", func(t *testing.T) {
		var page strings.Builder
		for i := range gpuscalerv1.MaxGPUs + 10 {
			fmt.Fprintf(&page, "DCGM_FI_DEV_GPU_TEMP{gpu=\"%d\",UUID=\"GPU-%04d\"} 40\n", i, i)
		}
		got, problems := parseValid(t, []byte(page.String()))
		if len(got) != gpuscalerv1.MaxGPUs {
			t.Errorf("got %d samples, want %d", len(got), gpuscalerv1.MaxGPUs)
		}
		if got[len(got)-1].GetIndex() != gpuscalerv1.MaxGPUs-1 {
			t.Errorf("got last index %d, want %d", got[len(got)-1].GetIndex(), gpuscalerv1.MaxGPUs-1)
		}
		if len(problems) != 1 || !strings.Contains(problems[0].Error(), "the last 10 dropped") {
			t.Errorf("got problems %v, want one about the 10 dropped", problems)
		}
	})
	t.Run("more pods on a device than a sample holds", func(t *testing.T) {
		var page strings.Builder
		for i := range gpuscalerv1.MaxPodsPerGPU + 5 {
			// Descending names: the pods kept are the first by name, not by page order.
			fmt.Fprintf(&page, "DCGM_FI_DEV_GPU_TEMP{gpu=\"0\",UUID=\"GPU-1\",container=\"c\",namespace=\"ns\",pod=\"p-%04d\",vgpu=\"%d\"} 40\n",
				gpuscalerv1.MaxPodsPerGPU+4-i, i)
		}
		got, problems := parseValid(t, []byte(page.String()))
		if len(got) != 1 {
			t.Fatalf("got %d samples, want 1", len(got))
		}
		pods := got[0].Pods()
		if len(pods) != gpuscalerv1.MaxPodsPerGPU || pods[0].GetName() != "p-0000" || pods[len(pods)-1].GetName() != fmt.Sprintf("p-%04d", gpuscalerv1.MaxPodsPerGPU-1) {
			t.Errorf("got %d pods from %s to %s, want %d from p-0000 to p-%04d", len(pods), pods[0].GetName(), pods[len(pods)-1].GetName(),
				gpuscalerv1.MaxPodsPerGPU, gpuscalerv1.MaxPodsPerGPU-1)
		}
		if len(problems) != 1 || !strings.Contains(problems[0].Error(), "GPU-1: 261 pods, more than the 256 a sample holds; the last 5 by name dropped") {
			t.Errorf("got problems %v, want one about the 5 pods dropped", problems)
		}
	})
	t.Run("problems past the limit are counted", func(t *testing.T) {
		var page strings.Builder
		for range maxProblems + 50 {
			page.WriteString("DCGM_FI_DEV_GPU_TEMP{UUID=\"GPU-1\"} ERROR - FAILED TO CONVERT TO STRING\n")
		}
		page.WriteString("DCGM_FI_DEV_GPU_TEMP{gpu=\"0\",UUID=\"GPU-2\"} 40\n")
		got, problems := parseValid(t, []byte(page.String()))
		if len(got) != 1 || got[0].GetUuid() != "GPU-2" {
			t.Errorf("got %d samples, want GPU-2 alone", len(got))
		}
		if len(problems) != maxProblems+1 {
			t.Fatalf("got %d problems, want %d", len(problems), maxProblems+1)
		}
		if got, want := problems[len(problems)-1].Error(), "50 more problems not listed"; got != want {
			t.Errorf("got last problem %q, want %q", got, want)
		}
	})
	t.Run("a long rejected line is quoted cut short", func(t *testing.T) {
		line := "DCGM_FI_DEV_GPU_TEMP{UUID=\"" + strings.Repeat("x", 500) + "\"} ERROR\n"
		_, problems := parseValid(t, []byte(line))
		var le *LineError
		if len(problems) != 1 || !errors.As(problems[0], &le) {
			t.Fatalf("got problems %v, want one rejected line", problems)
		}
		if len(le.Text) != maxLineShown || le.Line != 1 {
			t.Errorf("got line %d quoted in %d bytes, want line 1 in %d", le.Line, len(le.Text), maxLineShown)
		}
	})
}

func FuzzParse(f *testing.F) {
	entries, err := os.ReadDir(testdataDir)
	if err != nil {
		f.Fatal(err)
	}
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), ".prom") {
			f.Add(fixture(f, e.Name()))
		}
	}
	f.Add([]byte(`DCGM_FI_PROF_GR_ENGINE_ACTIVE{gpu="0",UUID="GPU-1",GPU_I_PROFILE="1g.5gb",GPU_I_ID="3",namespace="a",pod="p"} 0.5`))
	f.Add([]byte("DCGM_FI_DEV_FB_USED{UUID=\"GPU-1\"} 1e9\nDCGM_FI_DEV_FB_FREE{UUID=\"GPU-1\"} 4294967296\nDCGM_FI_DEV_FB_RESERVED{UUID=\"GPU-1\"} 4294967296\n"))
	// A GPU shared by two pods under --kubernetes-virtual-gpus, with process metrics
	// (see TestParseSharedGPU), one pod holding two replicas, copies that
	// disagree, and a minor number label.
	const g = "GPU-5d2f3e6a-1b7c-4f0e-9a84-2c6d1e0f7a31"
	f.Add([]byte(dcgmLine("DCGM_FI_DEV_GPU_UTIL", 0, g, "", `DCGM_FI_DEV_MINOR_NUMBER="1"`, "87") +
		dcgmLine("DCGM_FI_DEV_GPU_UTIL", 0, g, "", podAttrs("a", "p1", "c", "u1", "0"), "62") +
		dcgmLine("DCGM_FI_DEV_GPU_UTIL", 0, g, "", podAttrs("a", "p2", "c", "u2", "1"), "25") +
		dcgmLine("DCGM_FI_DEV_GPU_TEMP", 0, g, "", podAttrs("a", "p1", "c", "u1", "0"), "61") +
		dcgmLine("DCGM_FI_DEV_GPU_TEMP", 0, g, "", podAttrs("a", "p1", "c", "u1", "3"), "61") +
		dcgmLine("DCGM_FI_DEV_GPU_TEMP", 0, g, "", podAttrs("a", "p2", "c", "u2", "1"), "62")))
	// A MIG instance shared by two pods, XIDs on the GPU and the instance, a minor gauge.
	f.Add([]byte(dcgmLine("DCGM_FI_DEV_XID_ERRORS", 0, g, "", `err_code="79",err_msg="x"`, "79") +
		dcgmLine("DCGM_FI_DEV_GPU_MINOR_NUMBER", 0, g, "", "", "2") +
		dcgmLine("DCGM_FI_DEV_XID_ERRORS", 0, g, `GPU_I_PROFILE="1g.10gb",GPU_I_ID="9"`, podAttrs("a", "p1", "c", "", "0"), "13") +
		dcgmLine("DCGM_FI_DEV_XID_ERRORS", 0, g, `GPU_I_PROFILE="1g.10gb",GPU_I_ID="9"`, podAttrs("b", "p2", "c", "", "1"), "13")))
	f.Fuzz(func(t *testing.T, page []byte) {
		samples, problems := Parse(bytes.NewReader(page))
		if err := (&gpuscalerv1.NodeReport{Node: "n", Gpus: samples}).Validate(); err != nil {
			t.Fatalf("samples do not validate: %v", err)
		}
		if len(problems) > maxProblems+1 {
			t.Fatalf("got %d problems, want at most %d", len(problems), maxProblems+1)
		}
		for _, p := range problems {
			if p == nil {
				t.Fatal("got a nil problem")
			}
		}
		again, _ := Parse(bytes.NewReader(page))
		if !samplesEqual(samples, again) {
			t.Fatal("a second parse of the same page differs")
		}
		checkLinesCostNothingElse(t, page, samples, problems)
	})
}

func TestAppendLine(t *testing.T) {
	for name, tc := range map[string]struct{ line, want string }{
		"dcgm-exporter's labels": {
			line: `DCGM_FI_DEV_GPU_TEMP{gpu="0",UUID="GPU-1",pci_bus_id="00000000:53:00.0",device="nvidia0",modelName="NVIDIA H100 80GB HBM3",Hostname="n",DCGM_FI_DRIVER_VERSION="580.105.08",container="main",namespace="ns",pod="p",pod_uid=""} 30`,
			want: `DCGM_FI_DEV_GPU_TEMP{gpu="0",UUID="GPU-1",modelName="NVIDIA H100 80GB HBM3",container="main",namespace="ns",pod="p"} 30`,
		},
		"MIG and old pod labels": {
			line: `DCGM_FI_DEV_FB_USED{device="nvidia0",GPU_I_PROFILE="1g.5gb",GPU_I_ID="13",pod_name="p",pod_namespace="ns",container_name="c"} 1`,
			want: `DCGM_FI_DEV_FB_USED{GPU_I_PROFILE="1g.5gb",GPU_I_ID="13",pod_name="p",pod_namespace="ns",container_name="c"} 1`,
		},
		"blanks, a trailing comma, a timestamp": {
			line: `DCGM_FI_DEV_FB_USED{ Hostname = "n" , UUID="GPU-1", } 1 1700000000000`,
			want: `DCGM_FI_DEV_FB_USED{UUID="GPU-1"} 1 1700000000000`,
		},
		"escapes kept as they are": {
			line: `DCGM_FI_DEV_FB_USED{err_msg="a \"quoted\" \\ word",modelName="A \"B\""} 1`,
			want: `DCGM_FI_DEV_FB_USED{modelName="A \"B\""} 1`,
		},
		"no label read":    {line: `DCGM_FI_DEV_FB_USED{Hostname="n"} 1`, want: `DCGM_FI_DEV_FB_USED{} 1`},
		"no labels at all": {line: `DCGM_FI_DEV_FB_USED 1`, want: `DCGM_FI_DEV_FB_USED 1`},
		"a quoted name":    {line: `{"DCGM_FI_DEV_FB_USED",Hostname="n"} 1`, want: `{"DCGM_FI_DEV_FB_USED",Hostname="n"} 1`},
		"a quoted label":   {line: `DCGM_FI_DEV_FB_USED{"host.name"="n",UUID="GPU-1"} 1`, want: `DCGM_FI_DEV_FB_USED{"host.name"="n",UUID="GPU-1"} 1`},
		"cut short":        {line: `DCGM_FI_DEV_FB_USED{Hostname="n`, want: `DCGM_FI_DEV_FB_USED{Hostname="n`},
		"no equals sign":   {line: `DCGM_FI_DEV_FB_USED{Hostname "n"} 1`, want: `DCGM_FI_DEV_FB_USED{Hostname "n"} 1`},
		"no closing brace": {line: `DCGM_FI_DEV_FB_USED{UUID="GPU-1" Hostname="n"} 1`, want: `DCGM_FI_DEV_FB_USED{UUID="GPU-1" Hostname="n"} 1`},
	} {
		t.Run(name, func(t *testing.T) {
			if got := string(appendLine([]byte("prefix\n"), []byte(tc.line))); got != "prefix\n"+tc.want {
				t.Errorf("got  %s\nwant prefix\n%s", got, tc.want)
			}
		})
	}
}

// FuzzAppendLine checks that dropping the labels the parser does not read changes
// nothing else: a line expfmt accepts still parses, to the same family, value and
// timestamp, with the labels read.
func FuzzAppendLine(f *testing.F) {
	entries, err := os.ReadDir(testdataDir)
	if err != nil {
		f.Fatal(err)
	}
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), ".prom") {
			for _, line := range bytes.Split(fixture(f, e.Name()), []byte("\n")) {
				f.Add(line)
			}
		}
	}
	parse := func(line []byte) (*dto.MetricFamily, bool) {
		text := expfmt.NewTextParser(model.UTF8Validation)
		fams, err := text.TextToMetricFamilies(bytes.NewReader(append(line, '\n')))
		if err != nil || len(fams) != 1 {
			return nil, false
		}
		for _, mf := range fams {
			return mf, len(mf.GetMetric()) == 1
		}
		return nil, false
	}
	f.Fuzz(func(t *testing.T, line []byte) {
		if i := bytes.IndexByte(line, '\n'); i >= 0 {
			line = line[:i]
		}
		kept := appendLine(nil, line)
		if bytes.IndexByte(kept, '\n') >= 0 {
			t.Fatalf("%q became %q, with a newline", line, kept)
		}
		orig, ok := parse(line)
		if !ok {
			return
		}
		got, ok := parse(kept)
		if !ok {
			t.Fatalf("%q parses, %q does not", line, kept)
		}
		var want []*dto.LabelPair
		for _, lp := range orig.GetMetric()[0].GetLabel() {
			// A line it cannot follow (here the metric name inside the braces, as the
			// UTF-8 exposition allows: {a="",name}) is kept whole, every label with it.
			if labelsRead[lp.GetName()] || bytes.Equal(kept, line) {
				want = append(want, lp)
			}
		}
		om, gm := orig.GetMetric()[0], got.GetMetric()[0]
		ov, _ := valueOf(om)
		gv, _ := valueOf(gm)
		switch {
		case got.GetName() != orig.GetName():
			t.Fatalf("%q: got family %q, want %q", kept, got.GetName(), orig.GetName())
		case math.Float64bits(gv) != math.Float64bits(ov):
			t.Fatalf("%q: got value %v, want %v", kept, gv, ov)
		case gm.GetTimestampMs() != om.GetTimestampMs():
			t.Fatalf("%q: got timestamp %d, want %d", kept, gm.GetTimestampMs(), om.GetTimestampMs())
		case !slices.EqualFunc(gm.GetLabel(), want, func(a, b *dto.LabelPair) bool { return proto.Equal(a, b) }):
			t.Fatalf("%q from %q: got labels %v, want %v", kept, line, gm.GetLabel(), want)
		}
	})
}

// moreFields are profiling and health fields a fuller dcgm-exporter
// configuration adds to the linode capture's 24, for 40 in all; one of them is read.
var moreFields = []string{
	"DCGM_FI_PROF_SM_ACTIVE", "DCGM_FI_PROF_SM_OCCUPANCY", "DCGM_FI_PROF_PIPE_FP64_ACTIVE",
	"DCGM_FI_PROF_PIPE_FP32_ACTIVE", "DCGM_FI_PROF_PIPE_FP16_ACTIVE", "DCGM_FI_PROF_NVLINK_TX_BYTES",
	"DCGM_FI_PROF_NVLINK_RX_BYTES", "DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
	"DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "DCGM_FI_DEV_POWER_MGMT_LIMIT", "DCGM_FI_DEV_RETIRED_SBE",
	"DCGM_FI_DEV_RETIRED_DBE", "DCGM_FI_DEV_RETIRED_PENDING", "DCGM_FI_DEV_PCIE_LINK_GEN",
	"DCGM_FI_DEV_PCIE_LINK_WIDTH",
}

// fullPage makes a page of n GPUs with 40 fields: the linode capture's 24 and
// moreFields, with HELP and TYPE lines, families contiguous as dcgm-exporter
// prints them.
func fullPage(tb testing.TB, n int) []byte {
	tb.Helper()
	capture := string(fixture(tb, "linode-rtx4000ada-k8s-pod.prom"))
	var template string // the SM clock line, for the fields the capture lacks
	for line := range strings.Lines(capture) {
		if strings.HasPrefix(line, "DCGM_FI_DEV_SM_CLOCK{") {
			template = line
		}
	}
	for _, name := range moreFields {
		capture += "# HELP " + name + " A field.\n# TYPE " + name + " gauge\n" +
			strings.Replace(strings.Replace(template, "DCGM_FI_DEV_SM_CLOCK", name, 1), "} 2310", "} 0.5", 1)
	}
	var out bytes.Buffer
	for line := range strings.Lines(capture) {
		if strings.HasPrefix(line, "#") {
			if !strings.HasPrefix(line, "# source:") {
				out.WriteString(line)
			}
			continue
		}
		for i := range n {
			l := strings.Replace(line, `gpu="0"`, fmt.Sprintf(`gpu="%d"`, i), 1)
			l = strings.Replace(l, "GPU-a8394b51-c086-568a-9f1a-c1e1c934c4", fmt.Sprintf("GPU-a8394b51-c086-568a-9f1a-c1e1c934c%03d", i), 1)
			l = strings.Replace(l, `device="nvidia0"`, fmt.Sprintf(`device="nvidia%d"`, i), 1)
			out.WriteString(l)
		}
	}
	return out.Bytes()
}

func TestFullPage(t *testing.T) {
	got, problems := parseValid(t, fullPage(t, 8))
	if len(got) != 8 || len(problems) != 0 {
		t.Fatalf("got %d samples and problems %v, want 8 and none", len(got), problems)
	}
	for i, g := range got {
		if g.GetIndex() != uint32(i) || g.GetFbTotalBytes() != (1+20015+457)<<20 || g.GetSmActive() != 50 ||
			g.GetPod().GetName() != "cuda-75454ffb9f-8ljq7" {
			t.Errorf("sample %d: got %s", i, prototext.Format(g))
		}
	}
}

func BenchmarkParse(b *testing.B) {
	full := fullPage(b, 8)
	// The same page with every 25th sample's value printed as dcgm-exporter prints a
	// field it cannot format.
	var broken bytes.Buffer
	n := 0
	for line := range strings.Lines(string(full)) {
		if !strings.HasPrefix(line, "#") {
			if n++; n%25 == 0 {
				line = line[:strings.LastIndexByte(line, ' ')+1] + "ERROR - FAILED TO CONVERT TO STRING\n"
			}
		}
		broken.WriteString(line)
	}
	for _, bc := range []struct {
		name string
		page []byte
	}{
		{"h100-capture", fixture(b, "aicr-h100-8gpu-k8s-pod-sampled.prom")},
		{"8gpu-40fields", full},
		{"8gpu-40fields-bad-lines", broken.Bytes()},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.SetBytes(int64(len(bc.page)))
			b.ReportAllocs()
			for b.Loop() {
				samples, _ := Parse(bytes.NewReader(bc.page))
				if len(samples) != 8 {
					b.Fatalf("got %d samples, want 8", len(samples))
				}
			}
		})
	}
}

// dcgmLine is one series as dcgm-exporter prints it, with the labels of the captures in
// their order (linode-rtx4000ada-k8s-pod.prom; nvidia-docs-a100-mig.prom for a MIG
// instance's GPU_I_PROFILE and GPU_I_ID after modelName): gpu, UUID, pci_bus_id, device,
// modelName, [mig], Hostname, the label fields (DCGM_FI_DRIVER_VERSION), then extra: more
// label fields and the attributes the pod mapper adds, in name order (container,
// namespace, pod, pod_uid, vgpu).
func dcgmLine(field string, gpu int, uuid, mig, extra, value string) string {
	var b strings.Builder
	fmt.Fprintf(&b, `%s{gpu="%d",UUID="%s",pci_bus_id="00000000:%02X:00.0",device="nvidia%d",modelName="NVIDIA A100-SXM4-80GB",`,
		field, gpu, uuid, 0x17+gpu, gpu)
	if mig != "" {
		b.WriteString(mig + ",")
	}
	b.WriteString(`Hostname="gpu-node-3",DCGM_FI_DRIVER_VERSION="580.95.05"`)
	if extra != "" {
		b.WriteString("," + extra)
	}
	fmt.Fprintf(&b, "} %s\n", value)
	return b.String()
}

// podAttrs are the pod mapper's attributes for one pod (kubernetes.go, PodMapper.Process:
// container, namespace, pod, and pod_uid with --kubernetes-enable-pod-uid; vgpu when the
// kubelet's device id names a replica).
func podAttrs(ns, pod, container, uid, vgpu string) string {
	a := fmt.Sprintf(`container=%q,namespace=%q,pod=%q,pod_uid=%q`, container, ns, pod, uid)
	if vgpu != "" {
		a += fmt.Sprintf(`,vgpu=%q`, vgpu)
	}
	return a
}

// checkCase parses page and checks the samples and the problems (one substring
// each), none of them rejected lines.
func checkCase(t *testing.T, page string, want []*gpuscalerv1.GPUSample, wantOthers []string) {
	t.Helper()
	got, problems := parseValid(t, []byte(page))
	diffSamples(t, got, want)
	lines, others := problemsOf(t, problems)
	if len(lines) > 0 {
		t.Errorf("got rejected lines %v, want none; problems: %v", lines, problems)
	}
	checkOthers(t, others, wantOthers)
}

// On a GPU shared through the device plugin's replicas, dcgm-exporter started with
// --kubernetes-virtual-gpus prints every series of a device once per pod holding one of
// its replicas. NVIDIA/dcgm-exporter internal/pkg/transformation/kubernetes.go:
// toDeviceToSharingPods maps a kubelet device id "<GPU UUID>::<n>" (NVIDIA's device
// plugin, time-slicing or MPS) to the GPU UUID, "nvidia<i>/vgpu<n>" (GKE) to "nvidia<i>",
// a MIG id "MIG-<uuid>[::<n>]" to "<gpu index>-<GPU_I_ID>" (deviceinfo
// GetGPUInstanceIdentifier), the key a MIG series has (collector.Metric.GetIDOfType), and
// getSharedGPU takes <n> as the pod's VGPU; PodMapper.Process then deep-copies each
// series once per pod of its device, adding container, namespace, pod (pod_uid) and vgpu,
// and keeps the unlabelled series only for a device no pod holds. Without the flag,
// toDeviceToPod keeps one pod per device (a map, the last pod listed wins).
// Since dcgm-exporter 4.8.2 (#594), Process also prints DCGM_FI_DEV_GPU_UTIL and
// DCGM_FI_DEV_FB_USED of a held device unlabelled, and once per pod with that pod's
// processes' SM utilisation or memory (createPerProcessMetrics, process_metrics.go
// isPerProcessMetric), 0 for a pod without processes.
func TestParseSharedGPU(t *testing.T) {
	const g0, g1 = "GPU-5d2f3e6a-1b7c-4f0e-9a84-2c6d1e0f7a31", "GPU-8a41c0d2-77e3-4b5d-b0c9-5e2a9f61d804"
	a100 := "NVIDIA A100-SXM4-80GB"
	p1 := podAttrs("inference", "chat-7b-0", "server", "", "0")
	p2 := podAttrs("batch", "embedder-1", "embed", "", "1")
	p3 := podAttrs("inference", "chat-7b-1", "server", "", "2")
	// Each series printed for pods, in the order the kubelet lists them.
	perPod := func(field string, gpu int, uuid, mig, value string, pods ...string) string {
		var b strings.Builder
		for _, p := range pods {
			b.WriteString(dcgmLine(field, gpu, uuid, mig, p, value))
		}
		return b.String()
	}
	for name, tc := range map[string]struct {
		page       string
		want       []*gpuscalerv1.GPUSample
		wantOthers []string
	}{
		"three pods on a time-sliced GPU, a free GPU beside it": {
			page: perPod("DCGM_FI_DEV_GPU_TEMP", 0, g0, "", "61", p1, p2, p3) + dcgmLine("DCGM_FI_DEV_GPU_TEMP", 1, g1, "", "", "33") +
				perPod("DCGM_FI_DEV_GPU_UTIL", 0, g0, "", "87", p1, p2, p3) + dcgmLine("DCGM_FI_DEV_GPU_UTIL", 1, g1, "", "", "0") +
				perPod("DCGM_FI_DEV_POWER_USAGE", 0, g0, "", "301.5", p1, p2, p3),
			want: []*gpuscalerv1.GPUSample{
				{
					Uuid: g0, Model: a100, GpuUtil: proto.Float64(87), PowerWatts: proto.Float64(301.5), TemperatureCelsius: proto.Float64(61),
					Pod:       podOf("batch", "embedder-1", "embed"), // sorted by namespace and name, not page order
					OtherPods: []*gpuscalerv1.PodRef{podOf("inference", "chat-7b-0", "server"), podOf("inference", "chat-7b-1", "server")},
					Shared:    true,
				},
				{Uuid: g1, Index: 1, Model: a100, GpuUtil: proto.Float64(0), TemperatureCelsius: proto.Float64(33)},
			},
		},
		"pod labels under --use-old-namespace's names": {
			page: dcgmLine("DCGM_FI_DEV_GPU_TEMP", 0, g0, "", `container_name="a",pod_name="p2",pod_namespace="ns",vgpu="1"`, "61") +
				dcgmLine("DCGM_FI_DEV_GPU_TEMP", 0, g0, "", `container_name="a",pod_name="p1",pod_namespace="ns",vgpu="0"`, "61"),
			want: []*gpuscalerv1.GPUSample{{
				Uuid: g0, Model: a100, TemperatureCelsius: proto.Float64(61),
				Pod: podOf("ns", "p1", "a"), OtherPods: []*gpuscalerv1.PodRef{podOf("ns", "p2", "a")}, Shared: true,
			}},
		},
		// A container asking for two nvidia.com/gpu may get two replicas of one GPU:
		// getSharedGPU gives each its own VGPU, so each series comes twice for one pod.
		"one pod holding two replicas of a GPU is one pod, and shared": {
			page: perPod("DCGM_FI_DEV_GPU_TEMP", 0, g0, "", "61", p1, podAttrs("inference", "chat-7b-0", "server", "", "3")),
			want: []*gpuscalerv1.GPUSample{{
				Uuid: g0, Model: a100, TemperatureCelsius: proto.Float64(61), Pod: podOf("inference", "chat-7b-0", "server"), Shared: true,
			}},
		},
		"a pod whose two containers share a GPU is listed once, with the first container": {
			page: perPod("DCGM_FI_DEV_GPU_TEMP", 0, g0, "", "61",
				podAttrs("ns", "p", "sidecar", "", "0"), podAttrs("ns", "p", "", "", "2"), podAttrs("ns", "p", "main", "", "1")),
			want: []*gpuscalerv1.GPUSample{{Uuid: g0, Model: a100, TemperatureCelsius: proto.Float64(61), Pod: podOf("ns", "p", "main"), Shared: true}},
		},
		// Without --kubernetes-virtual-gpus the exporter names one pod, and prints no vgpu:
		// nothing says the GPU is shared (the kubelet's replica ids do, to the collector).
		"one pod and no vgpu label is not shared": {
			page: dcgmLine("DCGM_FI_DEV_GPU_TEMP", 0, g0, "", podAttrs("ns", "p", "c", "", ""), "61"),
			want: []*gpuscalerv1.GPUSample{{Uuid: g0, Model: a100, TemperatureCelsius: proto.Float64(61), Pod: podOf("ns", "p", "c")}},
		},
		"copies that disagree keep the first in page order": {
			page: dcgmLine("DCGM_FI_DEV_GPU_TEMP", 0, g0, "", p3, "61") + dcgmLine("DCGM_FI_DEV_GPU_TEMP", 0, g0, "", p1, "62") +
				dcgmLine("DCGM_FI_DEV_GPU_TEMP", 0, g0, "", p2, "63"),
			want: []*gpuscalerv1.GPUSample{{
				Uuid: g0, Model: a100, TemperatureCelsius: proto.Float64(61),
				Pod:       podOf("batch", "embedder-1", "embed"),
				OtherPods: []*gpuscalerv1.PodRef{podOf("inference", "chat-7b-0", "server"), podOf("inference", "chat-7b-1", "server")},
				Shared:    true,
			}},
			wantOthers: []string{"DCGM_FI_DEV_GPU_TEMP of " + g0 + ": the copies for its pods disagree, 62 for pod inference/chat-7b-0 and 61 before; the first kept"},
		},
		"a series repeated for the same pod and replica is a fault": {
			page: perPod("DCGM_FI_DEV_GPU_TEMP", 0, g0, "", "61", p1, p2, p1),
			want: []*gpuscalerv1.GPUSample{{
				Uuid: g0, Model: a100, TemperatureCelsius: proto.Float64(61),
				Pod: podOf("batch", "embedder-1", "embed"), OtherPods: []*gpuscalerv1.PodRef{podOf("inference", "chat-7b-0", "server")}, Shared: true,
			}},
			wantOthers: []string{"DCGM_FI_DEV_GPU_TEMP of " + g0 + ": series repeated; the first value kept"},
		},
		"an invalid copy leaves room for a valid one": {
			page: dcgmLine("DCGM_FI_DEV_GPU_TEMP", 0, g0, "", p1, "NaN") + dcgmLine("DCGM_FI_DEV_GPU_TEMP", 0, g0, "", p2, "61"),
			want: []*gpuscalerv1.GPUSample{{
				Uuid: g0, Model: a100, TemperatureCelsius: proto.Float64(61),
				Pod: podOf("batch", "embedder-1", "embed"), OtherPods: []*gpuscalerv1.PodRef{podOf("inference", "chat-7b-0", "server")}, Shared: true,
			}},
			wantOthers: []string{"DCGM_FI_DEV_GPU_TEMP of " + g0 + ": NaN is not a finite number"},
		},
		"a pod with an invalid namespace is left out, the others kept": {
			page: perPod("DCGM_FI_DEV_GPU_TEMP", 0, g0, "", "61", podAttrs("Team_A", "p", "c", "", "0"), p1) +
				perPod("DCGM_FI_DEV_GPU_UTIL", 0, g0, "", "10", podAttrs("Team_A", "p", "c", "", "0"), p1),
			want: []*gpuscalerv1.GPUSample{{
				Uuid: g0, Model: a100, GpuUtil: proto.Float64(10), TemperatureCelsius: proto.Float64(61),
				Pod: podOf("inference", "chat-7b-0", "server"), Shared: true,
			}},
			wantOthers: []string{g0 + ": pod Team_A/p: "}, // once, not once per series
		},
		"process metrics: the unlabelled GPU_UTIL and FB_USED are the device's, the per-pod ones not read": {
			page: dcgmLine("DCGM_FI_DEV_GPU_UTIL", 0, g0, "", "", "87") +
				dcgmLine("DCGM_FI_DEV_GPU_UTIL", 0, g0, "", podAttrs("inference", "chat-7b-0", "server", "0b5c6e1a", "0"), "62") +
				dcgmLine("DCGM_FI_DEV_GPU_UTIL", 0, g0, "", podAttrs("batch", "embedder-1", "embed", "7d41f0c2", "1"), "0") +
				dcgmLine("DCGM_FI_DEV_FB_USED", 0, g0, "", "", "30210") +
				dcgmLine("DCGM_FI_DEV_FB_USED", 0, g0, "", podAttrs("inference", "chat-7b-0", "server", "0b5c6e1a", "0"), "24576") +
				dcgmLine("DCGM_FI_DEV_FB_USED", 0, g0, "", podAttrs("batch", "embedder-1", "embed", "7d41f0c2", "1"), "5120") +
				perPod("DCGM_FI_DEV_FB_FREE", 0, g0, "", "50000", podAttrs("inference", "chat-7b-0", "server", "0b5c6e1a", "0"), podAttrs("batch", "embedder-1", "embed", "7d41f0c2", "1")),
			want: []*gpuscalerv1.GPUSample{{
				Uuid: g0, Model: a100, GpuUtil: proto.Float64(87), FbUsedBytes: mib(30210), FbTotalBytes: mib(80210),
				Pod: podOf("batch", "embedder-1", "embed"), OtherPods: []*gpuscalerv1.PodRef{podOf("inference", "chat-7b-0", "server")}, Shared: true,
			}},
		},
		"process metrics: the unlabelled series wins wherever it is in the page": {
			page: dcgmLine("DCGM_FI_DEV_GPU_UTIL", 0, g0, "", podAttrs("inference", "chat-7b-0", "server", "0b5c6e1a", "0"), "62") +
				dcgmLine("DCGM_FI_DEV_GPU_UTIL", 0, g0, "", podAttrs("batch", "embedder-1", "embed", "7d41f0c2", "1"), "25") +
				dcgmLine("DCGM_FI_DEV_GPU_UTIL", 0, g0, "", "", "87"),
			want: []*gpuscalerv1.GPUSample{{
				Uuid: g0, Model: a100, GpuUtil: proto.Float64(87),
				Pod: podOf("batch", "embedder-1", "embed"), OtherPods: []*gpuscalerv1.PodRef{podOf("inference", "chat-7b-0", "server")}, Shared: true,
			}},
		},
		// A MIG replica id "MIG-<uuid>::<n>" maps to the instance's "<gpu>-<GPU_I_ID>",
		// so the instance's series are copied per pod; the GPU's own are not.
		"pods sharing a MIG instance": {
			page: dcgmLine("DCGM_FI_DEV_GPU_TEMP", 0, g0, "", "", "44") +
				perPod("DCGM_FI_PROF_GR_ENGINE_ACTIVE", 0, g0, `GPU_I_PROFILE="3g.40gb",GPU_I_ID="2"`, "0.25", p2, p1) +
				dcgmLine("DCGM_FI_PROF_GR_ENGINE_ACTIVE", 0, g0, `GPU_I_PROFILE="3g.40gb",GPU_I_ID="1"`, podAttrs("ns", "solo", "c", "", ""), "0.5"),
			want: []*gpuscalerv1.GPUSample{
				{
					Uuid: g0, Model: a100, MigProfile: "3g.40gb", MigInstanceId: proto.Uint32(1), DeviceId: g0 + "/gi1",
					GpuUtil: pctOf(0.5), Pod: podOf("ns", "solo", "c"),
				},
				{
					Uuid: g0, Model: a100, MigProfile: "3g.40gb", MigInstanceId: proto.Uint32(2), DeviceId: g0 + "/gi2",
					GpuUtil: pctOf(0.25), Pod: podOf("batch", "embedder-1", "embed"), OtherPods: []*gpuscalerv1.PodRef{podOf("inference", "chat-7b-0", "server")}, Shared: true,
				},
			},
		},
	} {
		t.Run(name, func(t *testing.T) { checkCase(t, tc.page, tc.want, tc.wantOthers) })
	}
}

// dcgm-exporter's device label is "nvidia" and DCGM's GPU id, the gpu label's number
// (NVIDIA/dcgm-exporter internal/pkg/collector/gpu_collector.go toMetric and
// base_collector.go createMetric: GPUDevice: fmt.Sprintf("nvidia%d", mi.DeviceInfo.GPU);
// go-dcgm pkg/dcgm/device_info.go getDeviceInfo sets Device.GPU to the gpuId), and DCGM
// numbers GPUs in NVML's enumeration order (NVIDIA/DCGM dcgmlib/src/DcgmCacheManager.cpp,
// detectedGpus[i].gpuId = i; GPUs attached later get the next ids), not by minor number.
// The minor number is DCGM field 55, DCGM_FI_DEV_GPU_MINOR_NUMBER ("Device node minor
// number /dev/nvidia#", DCGM_FI_DEV_MINOR_NUMBER before; nvmlDeviceGetMinorNumber in
// DcgmCacheManager.cpp), entity level GPU (dcgm_fields.cpp), which a counters CSV may
// list as a label (dcgm-exporter counter_config.go; a label named after the field, as
// DCGM_FI_DRIVER_VERSION in every capture) or as a gauge.
func TestParseMinor(t *testing.T) {
	const g0, g1 = "GPU-5d2f3e6a-1b7c-4f0e-9a84-2c6d1e0f7a31", "GPU-8a41c0d2-77e3-4b5d-b0c9-5e2a9f61d804"
	a100 := "NVIDIA A100-SXM4-80GB"
	temp := func(gpu int, uuid, extra string) string {
		return dcgmLine("DCGM_FI_DEV_GPU_TEMP", gpu, uuid, "", extra, "40")
	}
	for name, tc := range map[string]struct {
		page       string
		want       []*gpuscalerv1.GPUSample
		wantOthers []string
	}{
		"the device label is not read as the minor number": {
			page: temp(0, g0, ""),
			want: []*gpuscalerv1.GPUSample{{Uuid: g0, Model: a100, TemperatureCelsius: proto.Float64(40)}},
		},
		"a minor number label that differs from the index": {
			page: temp(0, g0, `DCGM_FI_DEV_MINOR_NUMBER="1"`) + temp(1, g1, `DCGM_FI_DEV_MINOR_NUMBER="0"`),
			want: []*gpuscalerv1.GPUSample{
				{Uuid: g0, Model: a100, TemperatureCelsius: proto.Float64(40), Minor: proto.Uint32(1)},
				{Uuid: g1, Index: 1, Model: a100, TemperatureCelsius: proto.Float64(40), Minor: proto.Uint32(0)},
			},
		},
		"the field's current name": {
			page: temp(0, g0, `DCGM_FI_DEV_GPU_MINOR_NUMBER="3"`),
			want: []*gpuscalerv1.GPUSample{{Uuid: g0, Model: a100, TemperatureCelsius: proto.Float64(40), Minor: proto.Uint32(3)}},
		},
		"a gauge": {
			page: temp(0, g0, "") + dcgmLine("DCGM_FI_DEV_GPU_MINOR_NUMBER", 0, g0, "", "", "2") + dcgmLine("DCGM_FI_DEV_MINOR_NUMBER", 1, g1, "", "", "5"),
			want: []*gpuscalerv1.GPUSample{
				{Uuid: g0, Model: a100, TemperatureCelsius: proto.Float64(40), Minor: proto.Uint32(2)},
				{Uuid: g1, Index: 1, Model: a100, Minor: proto.Uint32(5)},
			},
		},
		"a MIG instance takes its GPU's": {
			page: temp(0, g0, `DCGM_FI_DEV_MINOR_NUMBER="4"`) +
				dcgmLine("DCGM_FI_PROF_GR_ENGINE_ACTIVE", 0, g0, `GPU_I_PROFILE="1g.10gb",GPU_I_ID="9"`, "", "0.5"),
			want: []*gpuscalerv1.GPUSample{{
				Uuid: g0, Model: a100, MigProfile: "1g.10gb", MigInstanceId: proto.Uint32(9), DeviceId: g0 + "/gi9",
				GpuUtil: pctOf(0.5), Minor: proto.Uint32(4),
			}},
		},
		"malformed labels leave it absent": {
			page: temp(0, g0, `DCGM_FI_DEV_MINOR_NUMBER="nvidia0"`) + temp(1, g1, `DCGM_FI_DEV_MINOR_NUMBER="4294967296"`) +
				temp(2, "GPU-3", `DCGM_FI_DEV_MINOR_NUMBER="-1"`) +
				// Not read again after the first: a later good label does not make it known.
				dcgmLine("DCGM_FI_DEV_POWER_USAGE", 0, g0, "", `DCGM_FI_DEV_MINOR_NUMBER="0"`, "60"),
			want: []*gpuscalerv1.GPUSample{
				{Uuid: g0, Model: a100, TemperatureCelsius: proto.Float64(40), PowerWatts: proto.Float64(60)},
				{Uuid: g1, Index: 1, Model: a100, TemperatureCelsius: proto.Float64(40)},
				{Uuid: "GPU-3", Index: 2, Model: a100, TemperatureCelsius: proto.Float64(40)},
			},
			wantOthers: []string{
				g0 + `: DCGM_FI_DEV_MINOR_NUMBER label "nvidia0" is not a minor number`,
				g1 + `: DCGM_FI_DEV_MINOR_NUMBER label "4294967296" is not a minor number`,
				`GPU-3: DCGM_FI_DEV_MINOR_NUMBER label "-1" is not a minor number`,
			},
		},
		"malformed gauges leave it absent": {
			page: dcgmLine("DCGM_FI_DEV_MINOR_NUMBER", 0, g0, "", "", "1.5") + dcgmLine("DCGM_FI_DEV_MINOR_NUMBER", 1, g1, "", "", "2147483632"),
			want: []*gpuscalerv1.GPUSample{{Uuid: g0, Model: a100}, {Uuid: g1, Index: 1, Model: a100}},
			wantOthers: []string{
				"DCGM_FI_DEV_MINOR_NUMBER of " + g0 + ": 1.5 is not a minor number",
				"DCGM_FI_DEV_MINOR_NUMBER of " + g1 + ": 2.147483632e+09 is DCGM's blank",
			},
		},
	} {
		t.Run(name, func(t *testing.T) { checkCase(t, tc.page, tc.want, tc.wantOthers) })
	}
}

// DCGM_FI_DEV_XID_ERRORS is "Value of the last XID error encountered" (NVIDIA/dcgm-exporter
// etc/default-counters.csv), printed with err_code and err_msg (gpu_collector.go toMetric).
// NVIDIA/k8s-device-plugin internal/rm/health.go: getDisabledHealthCheckXids ignores XIDs
// 13, 31, 43, 45, 68 and 109 as application errors; checkHealth marks the device unhealthy
// for any other ("XidCriticalError: Xid=%d on Device=%s; marking device as unhealthy."),
// and, on a MIG device, for an event of its GPU and compute instance or of the whole GPU
// (instance ids 0xFFFFFFFF). DCGM keeps an XID without instance ids on the GPU and one
// with them on the instance (NVIDIA/DCGM DcgmCacheManager.cpp RecordXidForGpu,
// RecordXidForGpuInstance), and dcgm-exporter prints each on its own series.
func TestParseXID(t *testing.T) {
	const g0 = "GPU-5d2f3e6a-1b7c-4f0e-9a84-2c6d1e0f7a31"
	a100 := "NVIDIA A100-SXM4-80GB"
	xid := func(gpu int, uuid, mig string, n int) string {
		return dcgmLine("DCGM_FI_DEV_XID_ERRORS", gpu, uuid, mig, fmt.Sprintf(`err_code="%d",err_msg="text"`, n), strconv.Itoa(n))
	}
	whole := func(n int) *gpuscalerv1.GPUSample {
		g := &gpuscalerv1.GPUSample{Uuid: g0, Model: a100, LastXid: uint32(n)}
		if n != 0 {
			g.XidErrors = 1
		}
		return g
	}
	unhealthy := func(g *gpuscalerv1.GPUSample, why string) *gpuscalerv1.GPUSample { g.Unhealthy = why; return g }
	mig := func(gi uint32, last uint32, why string) *gpuscalerv1.GPUSample {
		g := &gpuscalerv1.GPUSample{
			Uuid: g0, Model: a100, MigProfile: "3g.40gb", MigInstanceId: proto.Uint32(gi), DeviceId: fmt.Sprintf("%s/gi%d", g0, gi),
			GpuUtil: pctOf(0.5), LastXid: last, Unhealthy: why,
		}
		if last != 0 {
			g.XidErrors = 1
		}
		return g
	}
	slice := func(gi int) string { return fmt.Sprintf(`GPU_I_PROFILE="3g.40gb",GPU_I_ID="%d"`, gi) }
	engine := func(gi int) string { return dcgmLine("DCGM_FI_PROF_GR_ENGINE_ACTIVE", 0, g0, slice(gi), "", "0.5") }
	cases := map[string]struct {
		page       string
		want       []*gpuscalerv1.GPUSample
		wantOthers []string
	}{
		"none":                              {page: xid(0, g0, "", 0), want: []*gpuscalerv1.GPUSample{whole(0)}},
		"79, fallen off the bus: unhealthy": {page: xid(0, g0, "", 79), want: []*gpuscalerv1.GPUSample{unhealthy(whole(79), "XID 79")}},
		"48, double-bit ECC: unhealthy":     {page: xid(0, g0, "", 48), want: []*gpuscalerv1.GPUSample{unhealthy(whole(48), "XID 48")}},
		"not a whole number": {
			page: dcgmLine("DCGM_FI_DEV_XID_ERRORS", 0, g0, "", "", "79.5"), want: []*gpuscalerv1.GPUSample{{Uuid: g0, Model: a100}},
			wantOthers: []string{"DCGM_FI_DEV_XID_ERRORS of " + g0 + ": 79.5 is not an XID number; dropped"},
		},
		"DCGM's blank": {
			page: dcgmLine("DCGM_FI_DEV_XID_ERRORS", 0, g0, "", "", "2147483632"), want: []*gpuscalerv1.GPUSample{{Uuid: g0, Model: a100}},
			wantOthers: []string{"DCGM_FI_DEV_XID_ERRORS of " + g0 + ": 2.147483632e+09 is DCGM's blank"},
		},
		"the GPU's critical XID makes every instance unhealthy": {
			page: xid(0, g0, "", 79) + engine(1) + engine(2) + xid(0, g0, slice(1), 0),
			want: []*gpuscalerv1.GPUSample{mig(1, 79, "XID 79 on the GPU"), mig(2, 79, "XID 79 on the GPU")},
		},
		"an instance's critical XID is its own": {
			page: xid(0, g0, "", 0) + engine(1) + engine(2) + xid(0, g0, slice(2), 94),
			want: []*gpuscalerv1.GPUSample{mig(1, 0, ""), mig(2, 94, "XID 94")},
		},
		"an instance's application error, the GPU's critical XID": {
			page: xid(0, g0, "", 79) + engine(1) + xid(0, g0, slice(1), 13),
			want: []*gpuscalerv1.GPUSample{mig(1, 79, "XID 79 on the GPU")},
		},
		"an instance's critical XID beside the GPU's": {
			page: xid(0, g0, "", 79) + engine(1) + xid(0, g0, slice(1), 94),
			want: []*gpuscalerv1.GPUSample{mig(1, 94, "XID 94")},
		},
		"the GPU's application error: instances healthy": {
			page: xid(0, g0, "", 31) + engine(1) + engine(2) + xid(0, g0, slice(2), 43),
			want: []*gpuscalerv1.GPUSample{mig(1, 31, ""), mig(2, 43, "")},
		},
	}
	for _, n := range []int{13, 31, 43, 45, 68, 109} {
		cases[fmt.Sprintf("%d, an application error: healthy", n)] = struct {
			page       string
			want       []*gpuscalerv1.GPUSample
			wantOthers []string
		}{page: xid(0, g0, "", n), want: []*gpuscalerv1.GPUSample{whole(n)}}
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) { checkCase(t, tc.page, tc.want, tc.wantOthers) })
	}
}
