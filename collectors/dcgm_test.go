package collectors

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	gpuscalerv1 "github.com/gpuscaler/gpuscaler/proto/gpuscaler/v1"
)

// fakeDCGM is a dcgmAPI with canned devices and values. It records calls, so a test can
// check nothing but Init is called when Init fails.
type fakeDCGM struct {
	initErr error
	gpus    []dcgmGPU
	insts   []dcgmInstance
	values  []dcgmValue
	calls   []string
	watched []dcgmEntity
	every   time.Duration
}

func (f *fakeDCGM) Init(addr string) error {
	f.calls = append(f.calls, "Init("+addr+")")
	return f.initErr
}
func (f *fakeDCGM) GPUs() ([]dcgmGPU, error) {
	f.calls = append(f.calls, "GPUs")
	return f.gpus, nil
}
func (f *fakeDCGM) Instances() ([]dcgmInstance, error) {
	f.calls = append(f.calls, "Instances")
	return f.insts, nil
}
func (f *fakeDCGM) Watch(e []dcgmEntity, _ []uint16, every time.Duration) error {
	f.calls = append(f.calls, "Watch")
	f.watched, f.every = slices.Clone(e), every
	return nil
}
func (f *fakeDCGM) Latest([]dcgmEntity, []uint16) ([]dcgmValue, error) {
	f.calls = append(f.calls, "Latest")
	return f.values, nil
}
func (f *fakeDCGM) Shutdown() error { f.calls = append(f.calls, "Shutdown"); return nil }

func val(mig bool, id uint, field uint16, v float64) dcgmValue {
	return dcgmValue{Entity: dcgmEntity{MIG: mig, ID: id}, Field: field, Value: v, TS: 1}
}

func TestDCGMInitFailureCallsNothingElse(t *testing.T) {
	f := &fakeDCGM{initErr: errors.New("libdcgm.so.4 not found")}
	_, err := newDCGMSource(f, DCGMConfig{Addr: "localhost:5555"})
	if !errors.Is(err, ErrNoGPUSource) {
		t.Fatalf("error %v, want ErrNoGPUSource", err)
	}
	if want := []string{"Init(localhost:5555)"}; !slices.Equal(f.calls, want) {
		t.Fatalf("calls %v, want only %v: any other DCGM call without libdcgm kills the process", f.calls, want)
	}
}

// TestNewDCGMWithoutLibrary runs the real go-dcgm: on a machine without libdcgm it must
// fail cleanly; on one with it, it must read GPUs.
func TestNewDCGMWithoutLibrary(t *testing.T) {
	src, err := NewDCGM(DCGMConfig{Every: time.Second})
	if err != nil {
		if !errors.Is(err, ErrNoGPUSource) {
			t.Fatalf("NewDCGM error %v, want ErrNoGPUSource", err)
		}
		t.Logf("no DCGM here, as expected on a machine without GPUs: %v", err)
		return
	}
	defer src.Close()
	samples, err := src.Collect(t.Context())
	if err != nil || len(samples) == 0 {
		t.Fatalf("Collect with DCGM present = %d samples, %v; want some", len(samples), err)
	}
}

func TestDCGMCollect(t *testing.T) {
	f := &fakeDCGM{
		gpus: []dcgmGPU{
			{ID: 0, UUID: "GPU-aaaa", Model: "NVIDIA A100-SXM4-40GB"}, // in MIG mode
			{ID: 1, UUID: "GPU-bbbb", Model: "NVIDIA A100-SXM4-40GB"},
			{ID: 2, UUID: "GPU-cccc", Model: "NVIDIA A100-SXM4-40GB"}, // nothing supported
		},
		insts: []dcgmInstance{
			{ID: 7, ParentGPU: 0, InstanceID: 13, Slices: 1, DeviceUUID: "MIG-1111"},
			{ID: 8, ParentGPU: 0, InstanceID: 2, Slices: 3},
		},
		values: []dcgmValue{
			val(false, 1, dcgmFieldGPUUtil, 87),
			val(false, 1, dcgmFieldGREngineActive, 0.1), // not util on a whole GPU
			val(false, 1, dcgmFieldSMActive, 0.5),
			val(false, 1, dcgmFieldPipeTensorActive, 1.0000001),
			val(false, 1, dcgmFieldFBUsed, 1024),
			val(false, 1, dcgmFieldFBFree, 80896),
			val(false, 1, dcgmFieldFBTotal, 81920),
			val(false, 1, dcgmFieldPower, 312.5),
			val(false, 1, dcgmFieldGPUTemp, 61),
			val(true, 7, dcgmFieldGREngineActive, 0.995),
			val(true, 7, dcgmFieldFBUsed, 4845),
			val(true, 7, dcgmFieldFBTotal, 9856),
			val(true, 8, dcgmFieldFBUsed, 100),
			val(true, 8, dcgmFieldFBFree, 19868), // no total: used + free
			{Entity: dcgmEntity{ID: 2}, Field: dcgmFieldGPUUtil, Blank: true},
			{Entity: dcgmEntity{ID: 2}, Field: dcgmFieldPower, Blank: true},
		},
	}
	src, err := newDCGMSource(f, DCGMConfig{Every: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	wantWatched := []dcgmEntity{{ID: 1}, {ID: 2}, {MIG: true, ID: 7}, {MIG: true, ID: 8}}
	if !slices.Equal(f.watched, wantWatched) || f.every != 500*time.Millisecond {
		t.Fatalf("watched %v every %s; want %v every 500ms (GPU 0 through its MIG instances)", f.watched, f.every, wantWatched)
	}
	samples, err := src.Collect(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if len(samples) != 4 {
		t.Fatalf("got %d samples, want 4: %v", len(samples), samples)
	}
	g1, g2, mig1, mig3 := samples[0], samples[1], samples[2], samples[3]

	if g1.GetUuid() != "GPU-bbbb" || g1.GetIndex() != 1 || g1.GetGpuUtil() != 87 || g1.GetSmActive() != 50 ||
		g1.GetTensorActive() != 100 || g1.GetFbUsedBytes() != 1024<<20 || g1.GetFbTotalBytes() != 81920<<20 ||
		g1.GetPowerWatts() != 312.5 || g1.GetTemperatureCelsius() != 61 || g1.MigInstanceId != nil {
		t.Errorf("whole GPU: %v", g1)
	}
	if g2.GpuUtil != nil || g2.PowerWatts != nil || g2.FbUsedBytes != nil || g2.SmActive != nil {
		t.Errorf("GPU with nothing supported: got %v, want every reading absent, not zero", g2)
	}
	if mig1.GetUuid() != "GPU-aaaa" || mig1.GetMigProfile() != "1g.10gb" || mig1.GetMigInstanceId() != 13 ||
		mig1.GetDeviceId() != "MIG-1111" || mig1.GetGpuUtil() != 99.5 || mig1.GetFbTotalBytes() != 9856<<20 {
		t.Errorf("MIG 1g.10gb: %v", mig1)
	}
	if mig3.GetMigProfile() != "3g.20gb" || mig3.GetFbTotalBytes() != 19968<<20 || mig3.GpuUtil != nil {
		t.Errorf("MIG 3g.20gb with no total and no activity: %v", mig3)
	}
	if err := (&gpuscalerv1.NodeReport{Node: "n", Gpus: samples}).Validate(); err != nil {
		t.Fatalf("samples do not validate: %v", err)
	}
}

// TestDCGMCountsXIDs: DCGM reports the last XID's number; each new sample of a non-zero
// number is one more XID.
func TestDCGMCountsXIDs(t *testing.T) {
	f := &fakeDCGM{gpus: []dcgmGPU{{ID: 0, UUID: "GPU-a"}}}
	src, err := newDCGMSource(f, DCGMConfig{})
	if err != nil {
		t.Fatal(err)
	}
	xids := func(v float64, ts int64) uint64 {
		t.Helper()
		f.values = []dcgmValue{{Entity: dcgmEntity{ID: 0}, Field: dcgmFieldXID, Value: v, TS: ts}}
		s, err := src.Collect(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		return s[0].GetXidErrors()
	}
	for i, step := range []struct {
		value float64
		ts    int64
		want  uint64
	}{{0, 1, 0}, {79, 2, 1}, {79, 2, 1}, {79, 3, 2}, {0, 4, 2}, {48, 5, 3}} {
		if got := xids(step.value, step.ts); got != step.want {
			t.Fatalf("step %d (XID %v at %d): count %d, want %d", i, step.value, step.ts, got, step.want)
		}
	}
}

func TestDCGMClose(t *testing.T) {
	f := &fakeDCGM{gpus: []dcgmGPU{{ID: 0, UUID: "GPU-a"}}}
	src, err := newDCGMSource(f, DCGMConfig{})
	if err != nil {
		t.Fatal(err)
	}
	if err := src.Close(); err != nil {
		t.Fatal(err)
	}
	if err := src.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if n := slices.Index(f.calls, "Shutdown"); n < 0 || slices.Index(f.calls[n+1:], "Shutdown") >= 0 {
		t.Fatalf("calls %v, want one Shutdown", f.calls)
	}
	if _, err := src.Collect(t.Context()); err == nil {
		t.Fatal("Collect after Close succeeded, want an error")
	}
}

func TestMIGProfileName(t *testing.T) {
	for _, tc := range []struct {
		slices uint
		mib    float64
		want   string
	}{
		// An A100 40GB's profiles, with the memory sizes go-nvml's dgxa100 mock gives them.
		{1, 4864, "1g.5gb"}, {1, 9856, "1g.10gb"}, {2, 9856, "2g.10gb"}, {3, 19968, "3g.20gb"},
		{4, 19968, "4g.20gb"}, {7, 40192, "7g.40gb"},
		{1, 0, ""}, {0, 1024, ""},
	} {
		if got := migProfileName(tc.slices, tc.mib); got != tc.want {
			t.Errorf("migProfileName(%d, %v) = %q, want %q", tc.slices, tc.mib, got, tc.want)
		}
	}
}
