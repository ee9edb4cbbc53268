//go:build cgo

package dcgm

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gpuscaler/gpuscaler/collector/dcgmerr"
	"github.com/gpuscaler/gpuscaler/collector/internal/collectortest"
	"github.com/gpuscaler/gpuscaler/collector/sourceerr"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/protobuf/proto"

	gpuscalerv1 "github.com/gpuscaler/gpuscaler/proto/gpuscaler/v1"
)

// errorsC is the text DCGM's errorString gives the return codes these tests use
// (NVIDIA/DCGM dcgmlib/src/dcgm_errors.c, errorString; the codes are go-dcgm
// pkg/dcgm/const.go's DCGM_ST_*). Written out here, not taken from dcgmerr's classes, so
// the classifier is checked against DCGM rather than against itself.
var errorsC = map[int]string{
	-1:  "Bad parameter passed to function",
	-3:  "Generic unspecified error",
	-6:  "Feature not supported",
	-10: "Object is in an undefined state",
	-14: "No data is available",
	-16: "Field is not being watched",
	-17: "No permission",
	-18: "GPU is lost",
	-19: "GPU requires reset",
	-21: "Host engine connection invalid/disconnected",
	-22: "This GPU is not supported by DCGM",
	-29: "Host engine is running as non-root",
	-33: "This request is serviced by a module of DCGM that is not currently loaded",
	-34: "The requested operation could not be completed because the affected resource is in use",
	-36: "Profiling is not supported for this group of GPUs or GPU",
	-37: "The third-party Profiling module returned an unrecoverable error",
	-38: "The requested profiling metrics cannot be collected in a single pass",
	-44: "The installed driver version is insufficient for this API",
	-45: "The specified GPU instance does not exist",
	-46: "The specified GPU compute instance does not exist",
}

// codeErr is an error as goDCGM returns it from a go-dcgm function that keeps DCGM's
// return code in a *dcgm.Error (EntitiesGetLatestValues, GetSupportedDevices: go-dcgm
// pkg/dcgm/fields.go, api.go): classified by the code.
func codeErr(code int) error { return dcgmerr.Wrap(errors.New(errorsC[code]), code, true) }

// textErr is an error as goDCGM returns it from a go-dcgm function that keeps only
// DCGM's text behind its own prefix (WatchFieldsWithGroupEx: "error watching fields:
// %s"; connectStandaloneV2: "error connecting to nv-hostengine: %s"; CreateGroup…):
// classified by the text.
func textErr(prefix string, code int) error {
	return dcgmerr.Wrap(fmt.Errorf("%s: %s", prefix, errorsC[code]), 0, false)
}

// fake is a library over a model of one node's DCGM host engine, reproducing what
// the source must survive:
//   - go-dcgm counts Inits (pkg/dcgm/api.go Init): a second Init before Shutdown does
//     not connect again;
//   - a restarted nv-hostengine forgets its watches, and a connection made to the old
//     one stays dead: every call on it fails with CONNECTION_NOT_VALID;
//   - dcgmEntitiesGetLatestValues answers every (entity, field) pair asked
//     (go-dcgm fields.go EntitiesGetLatestValues): a pair DCGM does not watch, or of an
//     entity it no longer has, is a blank value with status NOT_WATCHED (DCGM
//     DcgmCacheManager.cpp PrecheckWatchInfoForSamples), or with goneStatus
//     (INSTANCE_NOT_FOUND from its MIG manager lookups, GetGpuId); a watched pair with
//     no sample is a blank DCGM wrote itself, with an OK status (InsertNvmlErrorValue,
//     InsertBlankValue);
//   - the profiling module refuses a watch of profiling fields with profErr.
//
// A call other than Init before Init succeeded fails the test: without libdcgm it would
// kill the process.
type fake struct {
	t       *testing.T
	initErr error // every Init's answer, e.g. no libdcgm

	engineDown bool // nv-hostengine is not running: Init cannot connect
	engineGen  int  // bumped by restart
	connGen    int  // the engine generation Init connected to; 0 before Init or after Shutdown

	gpus       []gpuInfo
	insts      []instance
	values     map[fakeKey]value  // what DCGM sampled
	goneStatus int                // status of a vanished entity's values; 0 means NOT_WATCHED
	status     map[uint]gpuStatus // GPUStatus; absent means OK
	profErr    error

	watches map[watch]fakeWatch
	next    watch
	every   time.Duration
	calls   []string

	// now is DCGM's clock (time.Now when nil). Tests write a value's TS as a small sample
	// number; Latest stamps each new number, as DCGM stamps a sample, with now in µs
	// since the epoch (dcgm_structs.h dcgmFieldValue_v1.ts), and keeps that stamp.
	now    func() time.Time
	stamps map[int64]int64
}

type fakeKey struct {
	e entity
	f uint16
}

type fakeWatch struct {
	entities []entity
	fields   []uint16
}

func newFake(t *testing.T, gpus []gpuInfo, insts []instance) *fake {
	return &fake{t: t, gpus: gpus, insts: insts, values: map[fakeKey]value{}, status: map[uint]gpuStatus{}}
}

// set records v as DCGM's latest sample of field on entity.
func (f *fake) set(mig bool, id uint, field uint16, v float64) {
	f.values[fakeKey{entity{MIG: mig, ID: id}, field}] = value{Value: v, TS: 1}
}

// restart kills and restarts nv-hostengine: its watches are gone, and so is every
// connection to the old one.
func (f *fake) restart() {
	f.engineGen++
	f.watches = nil
}

// live checks the library rule and fails like go-dcgm on a dead connection.
func (f *fake) live(call string) error {
	f.t.Helper()
	f.calls = append(f.calls, call)
	if f.connGen == 0 {
		f.t.Errorf("%s called while DCGM is not initialised: without libdcgm that kills the process", call)
		return errors.New("not initialised")
	}
	return nil
}

// dead says the connection is gone (the engine restarted or stopped since Init).
func (f *fake) dead() bool { return f.engineDown || f.connGen != f.engineGen+1 }

func (f *fake) Init(addr string) error {
	f.calls = append(f.calls, "Init("+addr+")")
	switch {
	case f.initErr != nil:
		return f.initErr
	case f.connGen != 0:
		return nil // go-dcgm: already initialised, only counted
	case f.engineDown:
		return textErr("error connecting to nv-hostengine", -21)
	}
	f.connGen = f.engineGen + 1
	return nil
}

func (f *fake) GPUs() ([]gpuInfo, error) {
	if err := f.live("GPUs"); err != nil {
		return nil, err
	}
	if f.dead() {
		return nil, codeErr(-21)
	}
	return slices.Clone(f.gpus), nil
}

func (f *fake) Instances() ([]instance, error) {
	if err := f.live("Instances"); err != nil {
		return nil, err
	}
	if f.dead() {
		return nil, textErr("error retrieving DCGM MIG hierarchy", -21)
	}
	return slices.Clone(f.insts), nil
}

func (f *fake) Watch(entities []entity, fields []uint16, every time.Duration) (watch, error) {
	if err := f.live(fmt.Sprintf("Watch%v", fields)); err != nil {
		return 0, err
	}
	if f.dead() {
		return 0, textErr("error creating group", -21)
	}
	if f.profErr != nil && slices.ContainsFunc(fields, func(x uint16) bool { return x >= 1000 }) {
		return 0, f.profErr
	}
	f.next++
	if f.watches == nil {
		f.watches = map[watch]fakeWatch{}
	}
	f.watches[f.next] = fakeWatch{entities: slices.Clone(entities), fields: slices.Clone(fields)}
	f.every = every
	return f.next, nil
}

func (f *fake) Unwatch(w watch) error {
	if err := f.live("Unwatch"); err != nil {
		return err
	}
	if f.dead() {
		return textErr("error unwatching fields", -21)
	}
	delete(f.watches, w)
	return nil
}

func (f *fake) exists(e entity) bool {
	if e.MIG {
		return slices.ContainsFunc(f.insts, func(in instance) bool { return in.ID == e.ID })
	}
	return slices.ContainsFunc(f.gpus, func(g gpuInfo) bool { return g.ID == e.ID })
}

func (f *fake) watched(e entity, field uint16) bool {
	for _, w := range f.watches {
		if slices.Contains(w.entities, e) && slices.Contains(w.fields, field) {
			return true
		}
	}
	return false
}

func (f *fake) Latest(entities []entity, fields []uint16) ([]value, error) {
	if err := f.live("Latest"); err != nil {
		return nil, err
	}
	if f.dead() {
		return nil, codeErr(-21)
	}
	var out []value
	for _, e := range entities {
		for _, field := range fields {
			v, ok := f.values[fakeKey{e, field}]
			switch {
			case !f.exists(e):
				v = value{Blank: true, Status: orInt(f.goneStatus, -16)}
			case !f.watched(e, field):
				v = value{Blank: true, Status: -16}
			case !ok:
				v = value{Blank: true}
			}
			v.Entity, v.Field = e, field
			v.TS = f.stamp(v.TS)
			out = append(out, v)
		}
	}
	return out, nil
}

// stamp turns a test's sample number into DCGM's sample time, the first time it is seen.
func (f *fake) stamp(n int64) int64 {
	if n <= 0 {
		return n
	}
	if f.stamps == nil {
		f.stamps = map[int64]int64{}
	}
	ts, ok := f.stamps[n]
	if !ok {
		now := time.Now
		if f.now != nil {
			now = f.now
		}
		ts = now().UnixMicro()
		f.stamps[n] = ts
	}
	return ts
}

// orInt returns a, or b when a is zero.
func orInt(a, b int) int {
	if a != 0 {
		return a
	}
	return b
}

func (f *fake) GPUStatus(gpu uint) gpuStatus {
	if err := f.live("GPUStatus"); err != nil {
		return gpuStatus{}
	}
	if st, ok := f.status[gpu]; ok {
		return st
	}
	return gpuStatus{Name: "OK"}
}

func (f *fake) Shutdown() error {
	f.calls = append(f.calls, "Shutdown")
	if f.connGen == 0 {
		return errors.New("init() needs to be called before shutdown()") // go-dcgm api.go Shutdown
	}
	dead := f.dead()
	f.connGen = 0
	if dead {
		return textErr("error disconnecting from nv-hostengine", -21)
	}
	f.watches = nil
	return nil
}

// count returns how many calls of f's since the mark-th started with prefix.
func (f *fake) count(mark int, prefix string) int {
	n := 0
	for _, c := range f.calls[mark:] {
		if strings.HasPrefix(c, prefix) {
			n++
		}
	}
	return n
}

// fakeClock is the source's injected clock.
type fakeClock struct{ t time.Time }

func newFakeClock() *fakeClock               { return &fakeClock{t: time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)} }
func (c *fakeClock) now() time.Time          { return c.t }
func (c *fakeClock) advance(d time.Duration) { c.t = c.t.Add(d) }
func testLogger() (*slog.Logger, *bytes.Buffer) {
	b := &bytes.Buffer{}
	return slog.New(slog.NewTextHandler(b, nil)), b
}

// mockMIGDevice is a MIG device NVML shows: its GPU and compute instance ids and UUID,
// and, when set, its attributes and its GPU instance's profile id (then the GPU answers
// with an H200's profiles, collectortest.H200GIProfiles).
type mockMIGDevice struct {
	gi, ci int
	uuid   string
	ret    nvml.Return // what GetUUID answers; SUCCESS when zero
	attrs  *nvml.DeviceAttributes
	giProf *uint32
}

// mockNVMLIDs is a go-nvml mock library with GPUs (by UUID, with their minor numbers)
// and their MIG devices, answering what nvmlIdentifier asks, as NVML does
// (nvml.go's MIG walk: GetMaxMigDeviceCount, GetMigDeviceHandleByIndex answering
// ERROR_NOT_FOUND for an empty slot, GetGpuInstanceId, GetComputeInstanceId, GetUUID).
func mockNVMLIDs(minors map[string]int, migs map[string][]mockMIGDevice) *mock.Interface {
	return &mock.Interface{
		InitFunc:     func() nvml.Return { return nvml.SUCCESS },
		ShutdownFunc: func() nvml.Return { return nvml.SUCCESS },
		DeviceGetHandleByUUIDFunc: func(uuid string) (nvml.Device, nvml.Return) {
			minor, ok := minors[uuid]
			if !ok {
				return nil, nvml.ERROR_NOT_FOUND
			}
			devs := migs[uuid]
			return &mock.Device{
				GetMinorNumberFunc:       func() (int, nvml.Return) { return minor, nvml.SUCCESS },
				GetMaxMigDeviceCountFunc: func() (int, nvml.Return) { return 7, nvml.SUCCESS },
				GetMemoryInfoFunc: func() (nvml.Memory, nvml.Return) {
					return nvml.Memory{Total: collectortest.H200TotalMiB << 20}, nvml.SUCCESS
				},
				GetGpuInstanceProfileInfoFunc: collectortest.H200GIProfile,
				GetGpuInstanceByIdFunc: func(id int) (nvml.GpuInstance, nvml.Return) {
					for _, m := range devs {
						if m.gi == id && m.giProf != nil {
							info := nvml.GpuInstanceInfo{Id: uint32(id), ProfileId: *m.giProf}
							return &mock.GpuInstance{GetInfoFunc: func() (nvml.GpuInstanceInfo, nvml.Return) { return info, nvml.SUCCESS }}, nvml.SUCCESS
						}
					}
					return nil, nvml.ERROR_NOT_FOUND
				},
				GetMigDeviceHandleByIndexFunc: func(j int) (nvml.Device, nvml.Return) {
					if j >= len(devs) {
						return nil, nvml.ERROR_NOT_FOUND
					}
					m := devs[j]
					return &mock.Device{
						GetAttributesFunc: func() (nvml.DeviceAttributes, nvml.Return) {
							if m.attrs == nil {
								return nvml.DeviceAttributes{}, nvml.ERROR_NOT_SUPPORTED
							}
							return *m.attrs, nvml.SUCCESS
						},
						GetGpuInstanceIdFunc:     func() (int, nvml.Return) { return m.gi, nvml.SUCCESS },
						GetComputeInstanceIdFunc: func() (int, nvml.Return) { return m.ci, nvml.SUCCESS },
						GetUUIDFunc: func() (string, nvml.Return) {
							if m.ret != nvml.SUCCESS {
								return "", m.ret
							}
							return m.uuid, nvml.SUCCESS
						},
					}, nvml.SUCCESS
				},
			}, nvml.SUCCESS
		},
	}
}

// newTestSource starts a source over f with the given NVML ids (nil: none) at clk's time.
func newTestSource(t *testing.T, f *fake, ids identifier, clk *fakeClock, cfg Config) *Source {
	t.Helper()
	f.now = clk.now
	src, err := newSource(f, ids, clk.now, cfg)
	if err != nil {
		t.Fatalf("newSource: %v", err)
	}
	t.Cleanup(func() { _ = src.Close() })
	return src
}

func collect(t *testing.T, src *Source) []*gpuscalerv1.GPUSample {
	t.Helper()
	s, err := src.Collect(t.Context())
	if err != nil {
		t.Fatalf("Collect: %v", err)
	}
	if err := (&gpuscalerv1.NodeReport{Node: "n", Gpus: s}).Validate(); err != nil {
		t.Fatalf("samples do not make a valid NodeReport: %v", err)
	}
	return s
}

// fullGPU sets every base and profiling field of GPU id to a healthy reading.
func (f *fake) fullGPU(id uint) {
	for field, v := range map[uint16]float64{
		fieldGPUTemp: 40, fieldPower: 100, fieldGPUUtil: 50, fieldXID: 0,
		fieldFBTotal: 40960, fieldFBFree: 39936, fieldFBUsed: 1024,
		fieldGREngineActive: 0.5, fieldSMActive: 0.4, fieldPipeTensorActive: 0.2,
	} {
		f.set(false, id, field, v)
	}
}

// fullMIG sets a MIG instance's fields: framebuffer and the profiling fields.
func (f *fake) fullMIG(id uint) {
	for field, v := range map[uint16]float64{
		fieldFBTotal: 19968, fieldFBUsed: 1024, fieldXID: 0,
		fieldGREngineActive: 0.25, fieldSMActive: 0.2, fieldPipeTensorActive: 0.1,
	} {
		f.set(true, id, field, v)
	}
}

func TestInitFailureCallsNothingElse(t *testing.T) {
	f := newFake(t, nil, nil)
	f.initErr = errors.New("libdcgm.so.4 not found")
	ids := mockNVMLIDs(nil, nil)
	_, err := newSource(f, newNVMLIdentifier(ids), nil, Config{Addr: "localhost:5555"})
	if !errors.Is(err, sourceerr.ErrNoGPUSource) {
		t.Fatalf("got error %v, want ErrNoGPUSource", err)
	}
	if want := []string{"Init(localhost:5555)"}; !slices.Equal(f.calls, want) {
		t.Fatalf("got calls %v, want only %v: any other DCGM call without libdcgm kills the process", f.calls, want)
	}
	if n := len(ids.InitCalls()); n != 0 {
		t.Fatalf("got %d NVML Inits, want none when DCGM is absent", n)
	}
}

// TestNewWithoutLibrary runs the real go-dcgm: on a machine without libdcgm it must
// fail cleanly; on one with it, it must read GPUs.
func TestNewWithoutLibrary(t *testing.T) {
	src, err := New(Config{Every: time.Second})
	if err != nil {
		if !errors.Is(err, sourceerr.ErrNoGPUSource) {
			t.Fatalf("New error %v, want ErrNoGPUSource", err)
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

func TestCollect(t *testing.T) {
	f := newFake(t, []gpuInfo{
		{ID: 0, UUID: "GPU-aaaa", Model: "NVIDIA A100-SXM4-40GB"}, // in MIG mode
		{ID: 1, UUID: "GPU-bbbb", Model: "NVIDIA A100-SXM4-40GB"},
		{ID: 2, UUID: "GPU-cccc", Model: "NVIDIA A100-SXM4-40GB"}, // no utilisation, power or profiling
	}, []instance{
		{ID: 7, ParentGPU: 0, InstanceID: 13, Slices: 1, HasComputeInstance: true},
		{ID: 8, ParentGPU: 0, InstanceID: 2, Slices: 3, HasComputeInstance: true},
	})
	for field, v := range map[uint16]float64{
		fieldGPUUtil: 87, fieldGREngineActive: 0.1 /* not util on a whole GPU */, fieldSMActive: 0.5,
		fieldPipeTensorActive: 1.0000001, fieldFBUsed: 1024, fieldFBFree: 80896, fieldFBTotal: 81920,
		fieldPower: 312.5, fieldGPUTemp: 61,
	} {
		f.set(false, 1, field, v)
	}
	f.set(true, 7, fieldGREngineActive, 0.995)
	f.set(true, 7, fieldFBUsed, 4845)
	f.set(true, 7, fieldFBTotal, 9856)
	f.set(true, 8, fieldFBUsed, 100)
	f.set(true, 8, fieldFBFree, 19868) // no total: used + free
	f.set(false, 2, fieldGPUTemp, 35)
	f.set(false, 2, fieldFBTotal, 40960)
	ids := mockNVMLIDs(map[string]int{"GPU-aaaa": 3, "GPU-bbbb": 0, "GPU-cccc": 1}, map[string][]mockMIGDevice{
		"GPU-aaaa": {{gi: 2, ci: 0, uuid: "MIG-2222"}, {gi: 13, ci: 0, uuid: "MIG-1111"}},
	})
	src := newTestSource(t, f, newNVMLIdentifier(ids), newFakeClock(), Config{Every: 500 * time.Millisecond})

	wantWatched := []entity{{ID: 1}, {ID: 2}, {MIG: true, ID: 7}, {MIG: true, ID: 8}}
	if len(f.watches) != 2 || f.every != 500*time.Millisecond {
		t.Fatalf("got %d watches every %s, want 2 (base and profiling fields apart) every 500ms", len(f.watches), f.every)
	}
	for _, w := range f.watches {
		if !slices.Equal(w.entities, wantWatched) {
			t.Fatalf("got watched %v, want %v (GPU 0 through its MIG instances)", w.entities, wantWatched)
		}
	}
	samples := collect(t, src)
	if len(samples) != 4 {
		t.Fatalf("got %d samples, want 4: %v", len(samples), samples)
	}
	g1, g2, mig1, mig3 := samples[0], samples[1], samples[2], samples[3]

	if g1.GetUuid() != "GPU-bbbb" || g1.GetIndex() != 1 || g1.GetGpuUtil() != 87 || g1.GetSmActive() != 50 ||
		g1.GetTensorActive() != 100 || g1.GetFbUsedBytes() != 1024<<20 || g1.GetFbTotalBytes() != 81920<<20 ||
		g1.GetPowerWatts() != 312.5 || g1.GetTemperatureCelsius() != 61 || g1.MigInstanceId != nil ||
		g1.Minor == nil || g1.GetMinor() != 0 || g1.GetDeviceId() != "" || g1.GetUnhealthy() != "" {
		t.Errorf("whole GPU: got %v", g1)
	}
	if g2.GpuUtil != nil || g2.PowerWatts != nil || g2.FbUsedBytes != nil || g2.SmActive != nil ||
		g2.GetTemperatureCelsius() != 35 || g2.GetMinor() != 1 || g2.GetUnhealthy() != "" {
		t.Errorf("GPU without utilisation or power: got %v, want those readings absent, not zero, and healthy", g2)
	}
	if mig1.GetUuid() != "GPU-aaaa" || mig1.GetMigProfile() != "1g.10gb" || mig1.GetMigInstanceId() != 13 ||
		mig1.GetDeviceId() != "MIG-1111" || mig1.GetGpuUtil() != 99.5 || mig1.GetFbTotalBytes() != 9856<<20 ||
		mig1.GetMinor() != 3 {
		t.Errorf("MIG 1g.10gb: got %v", mig1)
	}
	if mig3.GetMigProfile() != "3g.20gb" || mig3.GetFbTotalBytes() != 19968<<20 || mig3.GpuUtil != nil ||
		mig3.GetDeviceId() != "MIG-2222" {
		t.Errorf("MIG 3g.20gb with no total and no activity: got %v", mig3)
	}
}

// TestMIGDeviceIDs: go-dcgm's MigEntityInfo has no MIG device UUID, so without NVML
// every slice had an empty DeviceId: two slices on one GPU made the NodeReport invalid
// ("device … appears twice"). Each slice gets NVML's MIG UUID, or, when NVML cannot
// tell, the device plugin's legacy MIG-<GPU UUID>/<gi>/<ci> (k8s-device-plugin
// api/config/v1/replicas.go IsMigUUID), unique on the node, logged once.
func TestMIGDeviceIDs(t *testing.T) {
	const gpu = "GPU-b1028956-cfa2-0990-bf4a-5da9abb51763"
	insts := []instance{
		{ID: 1, ParentGPU: 0, InstanceID: 3, ComputeInstanceID: 0, HasComputeInstance: true, Slices: 3},
		{ID: 2, ParentGPU: 0, InstanceID: 5, ComputeInstanceID: 0, HasComputeInstance: true, Slices: 3},
		{ID: 3, ParentGPU: 0, InstanceID: 9, Slices: 1}, // no compute instance listed
	}
	nvmlFailsInit := mockNVMLIDs(nil, nil)
	nvmlFailsInit.InitFunc = func() nvml.Return { return nvml.ERROR_LIBRARY_NOT_FOUND }
	for name, tc := range map[string]struct {
		ids        identifier
		want       []string
		wantMinor  *uint32
		wantWarned bool
	}{
		"NVML knows every MIG device": {
			ids: newNVMLIdentifier(mockNVMLIDs(map[string]int{gpu: 4}, map[string][]mockMIGDevice{gpu: {
				{gi: 3, ci: 0, uuid: "MIG-aaaaaaaa-0000-0000-0000-000000000003"},
				{gi: 5, ci: 0, uuid: "MIG-aaaaaaaa-0000-0000-0000-000000000005"},
				{gi: 9, ci: 0, uuid: "MIG-aaaaaaaa-0000-0000-0000-000000000009"},
			}})),
			want:      []string{"MIG-aaaaaaaa-0000-0000-0000-000000000003", "MIG-aaaaaaaa-0000-0000-0000-000000000005", "MIG-aaaaaaaa-0000-0000-0000-000000000009"},
			wantMinor: proto.Uint32(4),
		},
		"NVML cannot read one MIG device's UUID": {
			ids: newNVMLIdentifier(mockNVMLIDs(map[string]int{gpu: 4}, map[string][]mockMIGDevice{gpu: {
				{gi: 3, ci: 0, uuid: "MIG-aaaaaaaa-0000-0000-0000-000000000003"},
				{gi: 5, ci: 0, ret: nvml.ERROR_UNKNOWN},
				{gi: 9, ci: 0, uuid: "MIG-aaaaaaaa-0000-0000-0000-000000000009"},
			}})),
			want:       []string{"MIG-aaaaaaaa-0000-0000-0000-000000000003", "MIG-" + gpu + "/5/0", "MIG-aaaaaaaa-0000-0000-0000-000000000009"},
			wantMinor:  proto.Uint32(4),
			wantWarned: true,
		},
		"no NVML library": {
			ids:        newNVMLIdentifier(nvmlFailsInit),
			want:       []string{"MIG-" + gpu + "/3/0", "MIG-" + gpu + "/5/0", "MIG-" + gpu + "/9/0"},
			wantWarned: true,
		},
		"no identifier": {
			want:       []string{"MIG-" + gpu + "/3/0", "MIG-" + gpu + "/5/0", "MIG-" + gpu + "/9/0"},
			wantWarned: true,
		},
	} {
		t.Run(name, func(t *testing.T) {
			f := newFake(t, []gpuInfo{{ID: 0, UUID: gpu, Model: "NVIDIA A100-SXM4-40GB"}}, insts)
			for _, in := range insts {
				f.fullMIG(in.ID)
			}
			log, logs := testLogger()
			clk := newFakeClock()
			src := newTestSource(t, f, tc.ids, clk, Config{Log: log})
			for range 2 { // the second after a rediscovery: still logged once
				samples := collect(t, src)
				var got []string
				for _, s := range samples {
					got = append(got, s.GetDeviceId())
					if (s.Minor == nil) != (tc.wantMinor == nil) || s.Minor != nil && s.GetMinor() != *tc.wantMinor {
						t.Errorf("got minor %v on %s, want %v (the parent GPU's)", s.Minor, s.GetDeviceId(), tc.wantMinor)
					}
				}
				if !slices.Equal(got, tc.want) {
					t.Fatalf("got device ids %q, want %q", got, tc.want)
				}
				clk.advance(defaultRediscover)
			}
			if n, want := strings.Count(logs.String(), "MIG device UUIDs unknown"), map[bool]int{true: 1}[tc.wantWarned]; n != want {
				t.Errorf("got the unknown-MIG-UUID warning %d times, want %d:\n%s", n, want, logs)
			}
		})
	}
}

// TestProfilingRefused: the profiling module refuses a watch of the profiling
// fields on GPUs without profiling support, under a non-root embedded host engine, or
// while another profiler (Nsight, a second DCGM client) holds the counters, and DCGM
// then watches none of the fields of that watch (go-dcgm WatchFieldsWithGroupEx returns
// "error watching fields: <errorString>", NVIDIA/DCGM dcgm_errors.c). With the fields in
// one group the source failed entirely; now the base fields still read.
func TestProfilingRefused(t *testing.T) {
	for name, code := range map[string]int{
		"PROFILING_NOT_SUPPORTED": -36, "REQUIRES_ROOT": -29, "IN_USE": -34, "MODULE_NOT_LOADED": -33,
	} {
		t.Run(name, func(t *testing.T) {
			f := newFake(t, []gpuInfo{{ID: 0, UUID: "GPU-0"}, {ID: 1, UUID: "GPU-1"}},
				[]instance{{ID: 4, ParentGPU: 1, InstanceID: 1, Slices: 3}})
			f.fullGPU(0)
			f.fullMIG(4)
			f.profErr = textErr("error watching fields", code)
			log, logs := testLogger()
			reg := prometheus.NewRegistry()
			clk := newFakeClock()
			src := newTestSource(t, f, nil, clk, Config{Log: log, Registerer: reg})

			for range 2 {
				samples := collect(t, src)
				gpu, mig := samples[0], samples[1]
				if gpu.GetGpuUtil() != 50 || gpu.GetFbUsedBytes() != 1024<<20 || gpu.SmActive != nil || gpu.TensorActive != nil {
					t.Errorf("GPU: got %v, want its base readings and no profiling reading (absent, not zero)", gpu)
				}
				if mig.GetFbTotalBytes() != 19968<<20 || mig.GpuUtil != nil || mig.SmActive != nil {
					t.Errorf("MIG instance: got %v, want its memory and no gpu_util (graphics-engine activity is a profiling field)", mig)
				}
				clk.advance(defaultRediscover) // the profiling watch is retried, and refused again
			}
			if n := strings.Count(logs.String(), "DCGM refuses the profiling fields"); n != 1 {
				t.Errorf("got the refusal logged %d times, want once:\n%s", n, logs)
			}
			if want := dcgmerr.StatusName(code); !strings.Contains(logs.String(), want) {
				t.Errorf("got log %q, want the reason %s", logs, want)
			}
			wantMetric := func(v int) string {
				return fmt.Sprintf(`# HELP gpuscaler_collector_dcgm_fields_unsupported 1 for each DCGM field the source cannot watch on this node (the profiling module refused it), 0 once it can.
# TYPE gpuscaler_collector_dcgm_fields_unsupported gauge
gpuscaler_collector_dcgm_fields_unsupported{field="DCGM_FI_PROF_GR_ENGINE_ACTIVE"} %[1]d
gpuscaler_collector_dcgm_fields_unsupported{field="DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"} %[1]d
gpuscaler_collector_dcgm_fields_unsupported{field="DCGM_FI_PROF_SM_ACTIVE"} %[1]d
`, v)
			}
			if err := testutil.CollectAndCompare(reg, strings.NewReader(wantMetric(1)), "gpuscaler_collector_dcgm_fields_unsupported"); err != nil {
				t.Error(err)
			}

			// The other profiler lets go: the next rediscovery watches the profiling fields.
			f.profErr = nil
			clk.advance(defaultRediscover)
			samples := collect(t, src)
			if samples[0].GetSmActive() != 40 || samples[1].GetGpuUtil() != 25 {
				t.Errorf("after the refusal ends: got %v, want SM active and MIG utilisation", samples)
			}
			if err := testutil.CollectAndCompare(reg, strings.NewReader(wantMetric(0)), "gpuscaler_collector_dcgm_fields_unsupported"); err != nil {
				t.Error(err)
			}
		})
	}
}

// TestReconnects: a GPU Operator upgrade or driver update restarts nv-hostengine;
// the old connection then fails every call with CONNECTION_NOT_VALID ("Host engine
// connection invalid/disconnected", dcgm_errors.c), and go-dcgm connects again only
// after Shutdown brought its Init count to zero (pkg/dcgm/api.go). Collect fails
// meanwhile (the node's report goes stale, never zero) and reconnects with back-off.
func TestReconnects(t *testing.T) {
	f := newFake(t, []gpuInfo{{ID: 0, UUID: "GPU-0"}, {ID: 1, UUID: "GPU-1"}}, nil)
	f.fullGPU(0)
	f.fullGPU(1)
	log, logs := testLogger()
	clk := newFakeClock()
	src := newTestSource(t, f, nil, clk, Config{Addr: "localhost:5555", Log: log})
	collect(t, src)
	start := clk.now()

	f.restart()
	f.engineDown = true
	mark := len(f.calls)
	var inits []time.Duration // when Init was tried, after the restart
	for clk.now().Sub(start) < 100*time.Second {
		n := f.count(mark, "Init")
		samples, err := src.Collect(t.Context())
		if !errors.Is(err, dcgmerr.ErrConnection) || samples != nil {
			t.Fatalf("at +%s: got %d samples, %v; want no samples and a connection error", clk.now().Sub(start), len(samples), err)
		}
		if f.count(mark, "Init") > n {
			inits = append(inits, clk.now().Sub(start))
		}
		clk.advance(500 * time.Millisecond)
	}
	want := []time.Duration{1 * time.Second, 3 * time.Second, 7 * time.Second, 15 * time.Second, 31 * time.Second, 61 * time.Second, 91 * time.Second}
	if !slices.Equal(inits, want) {
		t.Fatalf("got Init tried at %v, want at %v (back-off 1 s doubling to 30 s)", inits, want)
	}
	if f.count(mark, "Shutdown") != 1 {
		t.Errorf("got calls %v, want one Shutdown before reconnecting", f.calls[mark:])
	}

	f.engineDown = false // the new nv-hostengine is up
	var samples []*gpuscalerv1.GPUSample
	for samples == nil {
		var err error
		if samples, err = src.Collect(t.Context()); err != nil && !errors.Is(err, dcgmerr.ErrConnection) {
			t.Fatalf("got %v, want a connection error until the back-off allows the next try", err)
		}
		clk.advance(500 * time.Millisecond)
	}
	if got := clk.now().Sub(start); got != 121*time.Second+500*time.Millisecond {
		t.Errorf("got reconnected at +%s, want at +121s", got-500*time.Millisecond)
	}
	if len(samples) != 2 || samples[0].GetGpuUtil() != 50 || samples[1].GetSmActive() != 40 {
		t.Errorf("after reconnecting: got %v, want both GPUs read through new watches", samples)
	}
	for msg, want := range map[string]int{"connection lost": 1, "connection restored": 1} {
		if n := strings.Count(logs.String(), msg); n != want {
			t.Errorf("got %q logged %d times, want %d:\n%s", msg, n, want, logs)
		}
	}
	// A second outage is logged again.
	f.restart()
	if _, err := src.Collect(t.Context()); !errors.Is(err, dcgmerr.ErrConnection) {
		t.Fatalf("after the second restart: got %v, want a connection error", err)
	}
	if n := strings.Count(logs.String(), "connection lost"); n != 2 {
		t.Errorf("got the outage logged %d times over two outages, want 2", n)
	}
}

// TestRediscovers: mig-parted re-lays out a GPU's MIG instances. DCGM then answers
// the vanished instances' values with NOT_WATCHED (DcgmCacheManager.cpp
// PrecheckWatchInfoForSamples) or INSTANCE_NOT_FOUND (its MIG manager, GetGpuId): the
// source rediscovers at once; and when DCGM reuses an entity id for a new instance
// (values still read), the periodic rediscovery finds it.
func TestRediscovers(t *testing.T) {
	const gpu = "GPU-0"
	two := []instance{
		{ID: 1, ParentGPU: 0, InstanceID: 1, Slices: 3, HasComputeInstance: true},
		{ID: 2, ParentGPU: 0, InstanceID: 2, Slices: 3, HasComputeInstance: true},
	}
	seven := []instance{}
	for i := range 7 {
		seven = append(seven, instance{ID: uint(10 + i), ParentGPU: 0, InstanceID: uint(7 + i), Slices: 1, HasComputeInstance: true})
	}
	migUUIDs := func(insts []instance) map[string][]mockMIGDevice {
		var devs []mockMIGDevice
		for _, in := range insts {
			devs = append(devs, mockMIGDevice{gi: int(in.InstanceID), uuid: fmt.Sprintf("MIG-%d", in.InstanceID)})
		}
		return map[string][]mockMIGDevice{gpu: devs}
	}
	for name, goneStatus := range map[string]int{"NOT_WATCHED": -16, "INSTANCE_NOT_FOUND": -45} {
		t.Run(name, func(t *testing.T) {
			f := newFake(t, []gpuInfo{{ID: 0, UUID: gpu}, {ID: 1, UUID: "GPU-1"}}, two)
			f.goneStatus = goneStatus
			f.fullGPU(1)
			for i := range 20 {
				f.fullMIG(uint(i))
			}
			f.set(true, 1, fieldXID, 79) // an XID on instance 1
			nvMIGs := migUUIDs(two)
			nv := mockNVMLIDs(map[string]int{gpu: 0, "GPU-1": 1}, nvMIGs)
			clk := newFakeClock()
			src := newTestSource(t, f, newNVMLIdentifier(nv), clk, Config{})
			ids := func(samples []*gpuscalerv1.GPUSample) (out []string) {
				for _, s := range samples {
					out = append(out, s.DeviceID()+"/"+s.GetUnhealthy())
				}
				return out
			}
			if got, want := ids(collect(t, src)), []string{"GPU-1/", "MIG-1/XID 79", "MIG-2/"}; !slices.Equal(got, want) {
				t.Fatalf("got %q, want %q", got, want)
			}

			// Re-layout to seven 1g slices, 2 s after the last discovery: the vanished
			// instances read as gone until the source may rediscover (5 s apart at most).
			f.insts = seven
			nvMIGs[gpu] = migUUIDs(seven)[gpu]
			clk.advance(2 * time.Second)
			gone := fmt.Sprintf("DCGM no longer knows or watches it (%s)", dcgmerr.StatusName(goneStatus))
			if got, want := ids(collect(t, src)), []string{"GPU-1/", "MIG-1/" + gone, "MIG-2/" + gone}; !slices.Equal(got, want) {
				t.Fatalf("right after the re-layout: got %q, want %q", got, want)
			}
			mark := len(f.calls)
			clk.advance(3 * time.Second)
			got := ids(collect(t, src))
			want := []string{"GPU-1/", "MIG-7/", "MIG-8/", "MIG-9/", "MIG-10/", "MIG-11/", "MIG-12/", "MIG-13/"}
			if !slices.Equal(got, want) {
				t.Fatalf("after rediscovery: got %q, want %q", got, want)
			}
			if f.count(mark, "Unwatch") != 2 || f.count(mark, "Watch") != 2 || len(f.watches) != 2 {
				t.Errorf("got calls %v and %d watches; want the 2 old watches ended and 2 new", f.calls[mark:], len(f.watches))
			}

			// DCGM reuses entity id 10 for a new GPU instance 1, its values reading on: only
			// the periodic rediscovery sees it. GPU instance 1's XID count from the first
			// layout went with it.
			f.insts = slices.Clone(seven)
			f.insts[0].InstanceID, f.insts[0].Slices = 1, 3
			nvMIGs[gpu] = migUUIDs(f.insts)[gpu]
			clk.advance(10 * time.Second)
			if got := ids(collect(t, src)); got[1] != "MIG-7/" {
				t.Fatalf("before the periodic rediscovery: got %q, want the old layout still", got)
			}
			clk.advance(defaultRediscover)
			samples := collect(t, src)
			got = ids(samples)
			if want := []string{"GPU-1/", "MIG-1/", "MIG-8/"}; !slices.Equal(got[:3], want) {
				t.Fatalf("after the periodic rediscovery: got %q, want %q…", got, want)
			}
			if samples[1].GetXidErrors() != 0 || samples[1].GetLastXid() != 0 {
				t.Errorf("got %d XIDs, last %d, on the new instance; want the vanished one's dropped", samples[1].GetXidErrors(), samples[1].GetLastXid())
			}
		})
	}
}

// TestGPUFailureIsolation: one failing GPU is reported Unhealthy, with its reason,
// and its neighbours read as before (the Source contract, collector/source.go).
func TestGPUFailureIsolation(t *testing.T) {
	for name, tc := range map[string]struct {
		fail    func(f *fake)
		want    string
		lastXID uint32
	}{
		// DcgmCacheManager.cpp GetLatestSample: a field with no sample returns the NVML
		// error of its last read, NVML_ERROR_GPU_IS_LOST → DCGM_ST_GPU_IS_LOST.
		"GPU_IS_LOST status on its values": {
			fail: func(f *fake) {
				for _, field := range baseFields {
					f.values[fakeKey{entity{ID: 1}, field}] = value{Blank: true, Status: -18}
				}
			},
			want: "GPU is lost (DCGM_ST_GPU_IS_LOST)",
		},
		"RESET_REQUIRED status on a value": {
			fail: func(f *fake) {
				f.values[fakeKey{entity{ID: 1}, fieldPower}] = value{Blank: true, Status: -19}
			},
			want: "GPU requires reset (DCGM_ST_RESET_REQUIRED)",
		},
		// DcgmCacheManager.cpp: a lost GPU's fields are written as blank values with an
		// OK status (InsertNvmlErrorValue with NVML_ERROR_GPU_IS_LOST), and
		// dcgmGetGpuStatus says DcgmEntityStatusLost (go-dcgm device_status.go).
		"blank values, GPU status Lost": {
			fail: func(f *fake) {
				f.blankAll(1)
				f.status[1] = gpuStatus{Lost: true, Name: "Lost"}
			},
			want: "GPU is lost (DCGM GPU status Lost)",
		},
		"every field blank while its neighbours read": {
			fail: func(f *fake) { f.blankAll(1) },
			want: "no reading: every DCGM field is blank",
		},
		// k8s-device-plugin internal/rm/health.go: any XID but 13, 31, 43, 45, 68 and
		// 109 marks the device unhealthy.
		"critical XID 79 (fallen off the bus)": {
			fail:    func(f *fake) { f.set(false, 1, fieldXID, 79) },
			want:    "XID 79",
			lastXID: 79,
		},
		"application XID 13 is not a failure": {
			fail:    func(f *fake) { f.set(false, 1, fieldXID, 13) },
			lastXID: 13,
		},
		"application XID 109 is not a failure": {
			fail:    func(f *fake) { f.set(false, 1, fieldXID, 109) },
			lastXID: 109,
		},
	} {
		t.Run(name, func(t *testing.T) {
			f := newFake(t, []gpuInfo{{ID: 0, UUID: "GPU-0"}, {ID: 1, UUID: "GPU-1"}, {ID: 2, UUID: "GPU-2"}}, nil)
			for id := range uint(3) {
				f.fullGPU(id)
			}
			src := newTestSource(t, f, nil, newFakeClock(), Config{})
			healthy := collect(t, src)
			tc.fail(f)
			samples := collect(t, src)
			if got := samples[1].GetUnhealthy(); got != tc.want {
				t.Errorf("got GPU 1 unhealthy %q, want %q", got, tc.want)
			}
			if got := samples[1].GetLastXid(); got != tc.lastXID {
				t.Errorf("got GPU 1 last XID %d, want %d", got, tc.lastXID)
			}
			for _, i := range []int{0, 2} {
				if !proto.Equal(samples[i], healthy[i]) {
					t.Errorf("GPU %d: got %v, want it unaffected: %v", i, samples[i], healthy[i])
				}
			}
		})
	}
}

// TestUndescribedGPU: DCGM may fail to describe one GPU (GetDeviceInfo of a lost
// GPU: go-dcgm api.go returns a *dcgm.Error); the others are still listed, and a GPU
// the source knew keeps its identity, reported Unhealthy when its fields do not read.
func TestUndescribedGPU(t *testing.T) {
	f := newFake(t, []gpuInfo{{ID: 0, UUID: "GPU-0"}, {ID: 1, UUID: "GPU-1"}}, nil)
	f.fullGPU(0)
	f.fullGPU(1)
	log, logs := testLogger()
	clk := newFakeClock()
	src := newTestSource(t, f, nil, clk, Config{Log: log})
	collect(t, src)

	f.gpus = []gpuInfo{{ID: 0, UUID: "GPU-0"}, {ID: 1, Err: codeErr(-18)}, {ID: 2, Err: codeErr(-18)}}
	f.blankAll(1)
	f.status[1] = gpuStatus{Lost: true, Name: "Lost"}
	for range 2 {
		clk.advance(defaultRediscover)
		samples := collect(t, src)
		if len(samples) != 2 || samples[0].GetGpuUtil() != 50 || samples[1].GetUuid() != "GPU-1" ||
			samples[1].GetUnhealthy() != "GPU is lost (DCGM GPU status Lost)" {
			t.Fatalf("got %v, want GPU 0 read, GPU 1 known by its old UUID and lost, GPU 2 (never described) absent", samples)
		}
	}
	if n := strings.Count(logs.String(), "cannot describe a GPU"); n != 1 {
		t.Errorf("got the undescribed GPU logged %d times, want once:\n%s", n, logs)
	}
}

// blankAll makes every field of GPU id a blank DCGM wrote itself (status OK).
func (f *fake) blankAll(id uint) {
	for k := range f.values {
		if k.e == (entity{ID: id}) {
			f.values[k] = value{Blank: true}
		}
	}
}

// TestReadsNothing: Collect fails when no device reads and none is known to have
// failed, and reports the devices when DCGM says they are lost.
func TestReadsNothing(t *testing.T) {
	f := newFake(t, []gpuInfo{{ID: 0, UUID: "GPU-0"}, {ID: 1, UUID: "GPU-1"}},
		[]instance{{ID: 3, ParentGPU: 1, InstanceID: 1, Slices: 7}})
	src := newTestSource(t, f, nil, newFakeClock(), Config{})
	if s, err := src.Collect(t.Context()); err == nil {
		t.Fatalf("every field blank: got %v, want an error", s)
	}
	f.status[0] = gpuStatus{Lost: true, Name: "Lost"}
	f.status[1] = gpuStatus{Lost: true, Name: "Lost"}
	samples := collect(t, src)
	for _, s := range samples {
		if s.GetUnhealthy() != "GPU is lost (DCGM GPU status Lost)" {
			t.Errorf("got %v, want it lost (a MIG instance through its parent GPU)", s)
		}
	}
}

// TestXIDs: DCGM reports the last XID's number; each new sample of a non-zero number
// is one more XID. A critical one makes the device unhealthy for XIDHold after the last.
func TestXIDs(t *testing.T) {
	f := newFake(t, []gpuInfo{{ID: 0, UUID: "GPU-a"}}, nil)
	f.fullGPU(0)
	clk := newFakeClock()
	src := newTestSource(t, f, nil, clk, Config{XIDHold: 5 * time.Minute, Rediscover: time.Hour})
	for i, step := range []struct {
		after     time.Duration
		value     float64
		ts        int64
		count     uint64
		last      uint32
		unhealthy string
	}{
		{0, 0, 1, 0, 0, ""},
		{time.Second, 79, 2, 1, 79, "XID 79"},
		{time.Second, 79, 2, 1, 79, "XID 79"},
		{time.Second, 79, 3, 2, 79, "XID 79"},
		{time.Second, 0, 4, 2, 79, "XID 79"},
		{time.Second, 13, 5, 3, 13, "XID 79"},                   // an application XID: counted, last, not critical
		{5*time.Minute - 3*time.Second, 13, 5, 3, 13, "XID 79"}, // 1 s before the hold ends
		{time.Second, 13, 5, 3, 13, ""},                         // 5 min after the last critical one
		{time.Second, 48, 6, 4, 48, "XID 48"},
	} {
		clk.advance(step.after)
		f.values[fakeKey{entity{ID: 0}, fieldXID}] = value{Value: step.value, TS: step.ts}
		s := collect(t, src)[0]
		if s.GetXidErrors() != step.count || s.GetLastXid() != step.last || s.GetUnhealthy() != step.unhealthy {
			t.Fatalf("step %d (XID %v at %d): got count %d, last %d, unhealthy %q; want %d, %d, %q",
				i, step.value, step.ts, s.GetXidErrors(), s.GetLastXid(), s.GetUnhealthy(), step.count, step.last, step.unhealthy)
		}
	}
}

func TestClose(t *testing.T) {
	f := newFake(t, []gpuInfo{{ID: 0, UUID: "GPU-a"}}, nil)
	nv := mockNVMLIDs(map[string]int{"GPU-a": 0}, nil)
	src, err := newSource(f, newNVMLIdentifier(nv), nil, Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := src.Close(); err != nil {
		t.Fatal(err)
	}
	if err := src.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if n := f.count(0, "Shutdown"); n != 1 {
		t.Fatalf("got calls %v, want one Shutdown", f.calls)
	}
	if n := len(nv.ShutdownCalls()); n != 1 {
		t.Fatalf("got %d NVML Shutdowns, want 1", n)
	}
	if _, err := src.Collect(t.Context()); err == nil {
		t.Fatal("Collect after Close succeeded, want an error")
	}
}

// TestCloseWhileDisconnected: after a lost connection DCGM is shut down already;
// Close must not call it again (go-dcgm's Shutdown counts, and nothing but Init may
// follow a Shutdown).
func TestCloseWhileDisconnected(t *testing.T) {
	f := newFake(t, []gpuInfo{{ID: 0, UUID: "GPU-a"}}, nil)
	f.fullGPU(0)
	src, err := newSource(f, nil, newFakeClock().now, Config{})
	if err != nil {
		t.Fatal(err)
	}
	f.restart()
	if _, err := src.Collect(context.Background()); !errors.Is(err, dcgmerr.ErrConnection) {
		t.Fatalf("got %v, want a connection error", err)
	}
	if err := src.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if n := f.count(0, "Shutdown"); n != 1 {
		t.Fatalf("got calls %v, want one Shutdown", f.calls)
	}
}

// TestOldXIDAfterRestart: DCGM keeps the last XID's value and sample time for good
// (DcgmCacheManager keeps a field's last sample until a new one replaces it), so a
// collector that starts an hour after a critical XID reads it; the GPU has been fine
// since, and must not be held unhealthy for another five minutes.
func TestOldXIDAfterRestart(t *testing.T) {
	clk := newFakeClock()
	f := newFake(t, []gpuInfo{{ID: 0, UUID: "GPU-0"}}, nil)
	f.set(false, 0, fieldGPUUtil, 50)
	f.values[fakeKey{entity{ID: 0}, fieldXID}] = value{Value: 79, TS: 1}
	f.stamps = map[int64]int64{1: clk.now().Add(-time.Hour).UnixMicro()}
	src := newTestSource(t, f, nil, clk, Config{})
	s := collect(t, src)[0]
	if s.GetUnhealthy() != "" || s.GetLastXid() != 79 {
		t.Fatalf("got unhealthy %q, last XID %d; want healthy, 79", s.GetUnhealthy(), s.GetLastXid())
	}
}
