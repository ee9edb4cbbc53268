package collectors

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"google.golang.org/protobuf/proto"

	gpuscalerv1 "github.com/gpuscaler/gpuscaler/proto/gpuscaler/v1"
)

// nvmlMaxXIDEventsPerCollect bounds the XID events one Collect takes from NVML, so a
// storm of them cannot hold Collect up; the rest wait for the next Collect.
const nvmlMaxXIDEventsPerCollect = 256

// nvmlNoInstance is the GPU instance id NVML gives an event that concerns no particular
// GPU instance: every event of a GPU not in MIG mode, and whole-GPU events of one in it.
const nvmlNoInstance = math.MaxUint32

// nvmlSource reads GPUs through NVML (libnvidia-ml.so.1, shipped with the driver), for
// nodes without DCGM. NVML has no cheap equivalent of DCGM's SM-active and
// tensor-active profiling fields, nor of graphics-engine activity on a MIG instance,
// so those readings are always absent.
//
// Collect and Close may be called from several goroutines: one mutex serialises them.
type nvmlSource struct {
	lib nvml.Interface

	mu     sync.Mutex // guards everything below, and Close against Collect
	closed bool
	// events receives the XID events of every GPU registered when the source started;
	// nil when NVML offers no event set.
	events nvml.EventSet
	// xids counts the XID events seen per GPU UUID.
	xids map[string]*nvmlXIDCount
	// migs remembers what never changes for the life of a MIG device (its GPU instance
	// and profile), by its "MIG-…" UUID. Entries not seen in the latest Collect (a MIG
	// device destroyed by a reconfiguration) are dropped.
	migs map[string]*nvmlMIG
	gen  uint64 // counts Collects, to tell which migs entries the latest one saw
}

// nvmlXIDCount counts one GPU's XID events: those NVML attributes to no GPU instance,
// and those it attributes to one (MIG), by GPU instance id.
type nvmlXIDCount struct {
	whole      uint64
	byInstance map[uint32]uint64
}

// nvmlMIG is what a MIG device's identity says of it.
type nvmlMIG struct {
	instanceID *uint32 // GPU instance id; nil when NVML would not say
	profile    string  // "1g.5gb", "1c.3g.20gb", "1g.5gb+me", …; "" when unknown
	seen       uint64  // the Collect (nvmlSource.gen) that last saw the device
}

// NewNVML starts NVML through the driver's libnvidia-ml.so.1 and returns a Source
// reading every GPU it sees. Without the library, the driver or a GPU it fails with an
// error wrapping ErrNoGPUSource that says what is missing.
func NewNVML() (Source, error) {
	s, err := newNVMLSource(nvml.New())
	if err != nil {
		return nil, err
	}
	return s, nil
}

// newNVMLSource starts lib (Init) and prepares to count XID errors. It is NewNVML with
// the library injected, for tests with go-nvml's mocks.
func newNVMLSource(lib nvml.Interface) (*nvmlSource, error) {
	if ret := lib.Init(); ret != nvml.SUCCESS {
		return nil, fmt.Errorf("%w: NVML Init: %w (%d): %s", ErrNoGPUSource, ret, int32(ret), nvmlInitHint(ret))
	}
	n, ret := lib.DeviceGetCount()
	switch {
	case ret != nvml.SUCCESS:
		_ = lib.Shutdown()
		return nil, fmt.Errorf("NVML: count GPUs: %w", ret)
	case n == 0:
		_ = lib.Shutdown()
		return nil, fmt.Errorf("%w: NVML sees no GPU", ErrNoGPUSource)
	}
	s := &nvmlSource{lib: lib, xids: map[string]*nvmlXIDCount{}, migs: map[string]*nvmlMIG{}}
	s.watchXIDs(n)
	return s, nil
}

// nvmlInitHint says what a failed nvmlInit most likely means on a Kubernetes node.
func nvmlInitHint(ret nvml.Return) string {
	switch ret {
	case nvml.ERROR_LIBRARY_NOT_FOUND:
		return "NVML library libnvidia-ml.so.1 not found: is this a GPU node with the NVIDIA driver, " +
			"and does the container get the driver's libraries (the NVIDIA container toolkit's runtime)?"
	case nvml.ERROR_DRIVER_NOT_LOADED:
		return "the NVIDIA kernel driver is not loaded"
	case nvml.ERROR_NO_PERMISSION:
		return "no permission to open the GPU devices (/dev/nvidia*)"
	case nvml.ERROR_LIB_RM_VERSION_MISMATCH:
		return "libnvidia-ml.so.1 does not match the running kernel driver (upgraded without a reboot?)"
	default:
		return "NVML could not start"
	}
}

// watchXIDs registers the first n GPUs for XID events on one event set, so Collect can
// count them without blocking. It is best effort: a GPU (or a driver) that cannot
// report XID events keeps an XID count of 0.
func (s *nvmlSource) watchXIDs(n int) {
	set, ret := s.lib.EventSetCreate()
	if ret != nvml.SUCCESS || set == nil {
		return
	}
	registered := 0
	for i := range n {
		dev, ret := s.lib.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			continue
		}
		if dev.RegisterEvents(nvml.EventTypeXidCriticalError, set) == nvml.SUCCESS {
			registered++
		}
	}
	if registered == 0 {
		_ = set.Free()
		return
	}
	s.events = set
}

func (s *nvmlSource) Name() string { return "nvml" }

// Collect reads every GPU once, or each of its MIG devices instead when it is in MIG
// mode and has some. It makes a handful of NVML calls per device and waits for no event;
// an NVML call cannot be interrupted, so ctx is checked between devices.
func (s *nvmlSource) Collect(ctx context.Context) ([]*gpuscalerv1.GPUSample, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, errors.New("NVML source is closed")
	}
	s.gen++
	s.takeXIDs(ctx)
	n, ret := s.lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("NVML: count GPUs: %w", ret)
	}
	out := make([]*gpuscalerv1.GPUSample, 0, n)
	for i := range n {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		dev, ret := s.lib.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			return nil, fmt.Errorf("NVML: GPU %d: get handle: %w", i, ret)
		}
		uuid, ret := dev.GetUUID()
		if ret != nvml.SUCCESS {
			return nil, fmt.Errorf("NVML: GPU %d: read UUID: %w", i, ret)
		}
		model, ret := dev.GetName()
		if ret != nvml.SUCCESS {
			model = ""
		}
		if current, _, ret := dev.GetMigMode(); ret == nvml.SUCCESS && current == nvml.DEVICE_MIG_ENABLE {
			var err error
			before := len(out)
			if out, err = s.appendMIGSamples(out, dev, i, uuid, model); err != nil {
				return nil, err
			}
			if len(out) > before {
				continue
			}
			// MIG mode with no MIG device yet: report the GPU itself, as the DCGM source
			// does, so the node's GPUs stay visible.
		}
		out = append(out, s.gpuSample(dev, i, uuid, model))
	}
	for id, m := range s.migs {
		if m.seen != s.gen {
			delete(s.migs, id)
		}
	}
	return out, nil
}

// gpuSample reads a whole GPU.
func (s *nvmlSource) gpuSample(dev nvml.Device, index int, uuid, model string) *gpuscalerv1.GPUSample {
	g := &gpuscalerv1.GPUSample{Uuid: uuid, Index: uint32(index), Model: model}
	nvmlReadMemory(dev, g)
	if u, ret := dev.GetUtilizationRates(); ret == nvml.SUCCESS {
		g.GpuUtil = proto.Float64(float64(min(u.Gpu, 100)))
	}
	if mw, ret := dev.GetPowerUsage(); ret == nvml.SUCCESS {
		g.PowerWatts = proto.Float64(float64(mw) / 1000)
	}
	if c, ret := dev.GetTemperature(nvml.TEMPERATURE_GPU); ret == nvml.SUCCESS {
		g.TemperatureCelsius = proto.Float64(float64(c))
	}
	g.XidErrors = s.xidCount(uuid, nil)
	return g
}

// appendMIGSamples appends a sample per MIG device of the GPU at index. It reads each
// MIG device's framebuffer only: NVML measures power and temperature for the physical
// GPU, whose figures on each of its slices would be counted once per slice, and does
// not measure utilisation in MIG mode at all.
func (s *nvmlSource) appendMIGSamples(out []*gpuscalerv1.GPUSample, dev nvml.Device, index int, uuid, model string) ([]*gpuscalerv1.GPUSample, error) {
	slots, ret := dev.GetMaxMigDeviceCount()
	if ret != nvml.SUCCESS {
		return out, fmt.Errorf("NVML: GPU %d: count MIG devices: %w", index, ret)
	}
	for j := range slots {
		mig, ret := dev.GetMigDeviceHandleByIndex(j)
		if ret == nvml.ERROR_NOT_FOUND {
			continue // an empty slot
		}
		if ret != nvml.SUCCESS {
			return out, fmt.Errorf("NVML: GPU %d: MIG device %d: get handle: %w", index, j, ret)
		}
		migUUID, ret := mig.GetUUID()
		if ret != nvml.SUCCESS {
			return out, fmt.Errorf("NVML: GPU %d: MIG device %d: read UUID: %w", index, j, ret)
		}
		m := s.migIdentity(dev, mig, migUUID)
		g := &gpuscalerv1.GPUSample{
			Uuid:       uuid,
			Index:      uint32(index),
			Model:      model,
			DeviceId:   migUUID,
			MigProfile: m.profile,
		}
		if m.instanceID != nil { // a copy: the cache's must not be shared with callers
			g.MigInstanceId = proto.Uint32(*m.instanceID)
		}
		nvmlReadMemory(mig, g)
		g.XidErrors = s.xidCount(uuid, m.instanceID)
		out = append(out, g)
	}
	return out, nil
}

// migIdentity returns a MIG device's GPU instance and profile, from the cache when an
// earlier Collect learnt them. Only complete answers are cached, so a failed read is
// tried again next time.
func (s *nvmlSource) migIdentity(parent, mig nvml.Device, migUUID string) *nvmlMIG {
	if m, ok := s.migs[migUUID]; ok {
		m.seen = s.gen
		return m
	}
	m := &nvmlMIG{seen: s.gen}
	giID, ret := mig.GetGpuInstanceId()
	giKnown := ret == nvml.SUCCESS && giID >= 0
	if giKnown {
		m.instanceID = proto.Uint32(uint32(giID))
	}
	m.profile = nvmlMIGProfileOf(parent, mig, giID, giKnown)
	if giKnown && m.profile != "" {
		s.migs[migUUID] = m
	}
	return m
}

// nvmlMIGProfileOf names a MIG device's profile as NVIDIA's device plugin, mig-parted
// and nvidia-smi do (go-nvlib's MigProfile). Slices and memory come from the MIG
// device's attributes, or else from its GPU instance's profile; the attribute suffix
// ("+me", "-me", "+gfx", …) from that profile. "" when neither can be read.
func nvmlMIGProfileOf(parent, mig nvml.Device, giID int, giKnown bool) string {
	profile, info := -1, nvml.GpuInstanceProfileInfo{}
	if giKnown {
		if gi, ret := parent.GetGpuInstanceById(giID); ret == nvml.SUCCESS && gi != nil {
			if gii, ret := gi.GetInfo(); ret == nvml.SUCCESS {
				profile, info = nvmlFindGIProfile(parent, gii.ProfileId)
			}
		}
	}
	var giSlices, ciSlices uint32
	var memMiB uint64
	if a, ret := mig.GetAttributes(); ret == nvml.SUCCESS {
		giSlices, ciSlices, memMiB = a.GpuInstanceSliceCount, a.ComputeInstanceSliceCount, a.MemorySizeMB
	} else if profile >= 0 {
		// Without attributes, assume the compute instance spans the GPU instance, the
		// usual (and the device plugin's only supported) layout.
		giSlices, ciSlices, memMiB = info.SliceCount, info.SliceCount, info.MemorySizeMB
	}
	mem, ret := parent.GetMemoryInfo()
	if ret != nvml.SUCCESS {
		return ""
	}
	return nvmlMIGProfile(profile, giSlices, ciSlices, memMiB, mem.Total)
}

// nvmlFindGIProfile finds, among a GPU's GPU-instance profiles, the one whose id is
// profileID, and returns its nvml.GPU_INSTANCE_PROFILE_* index and info; -1 when none
// matches. An index is not an id: an A100's 1g.5gb profile is index 0 and id 19.
func nvmlFindGIProfile(dev nvml.Device, profileID uint32) (int, nvml.GpuInstanceProfileInfo) {
	for i := range nvml.GPU_INSTANCE_PROFILE_COUNT {
		info, ret := dev.GetGpuInstanceProfileInfo(i)
		if ret == nvml.SUCCESS && info.Id == profileID {
			return i, info
		}
	}
	return -1, nvml.GpuInstanceProfileInfo{}
}

// nvmlMIGProfile names a MIG profile "[<c>c.]<g>g.<GB>gb[±attribute]" as go-nvlib does:
// giProfile is its nvml.GPU_INSTANCE_PROFILE_* index (-1 when unknown: no attribute
// suffix), giSlices and ciSlices the GPU and compute instances' slices, memMiB the
// instance's memory in MiB and gpuTotalBytes the whole GPU's. The GB figure is the
// instance's share of the GPU rounded up to eighths, times the GPU's size in GiB, so
// that an A100 40GB's 4864 MiB slice is "5gb" and its 40192 MiB one "40gb". "" when a
// figure is missing.
func nvmlMIGProfile(giProfile int, giSlices, ciSlices uint32, memMiB, gpuTotalBytes uint64) string {
	if giSlices == 0 || memMiB == 0 || gpuTotalBytes == 0 {
		return ""
	}
	const mib, gib = 1 << 20, 1 << 30
	share := float64(memMiB) * mib / float64(gpuTotalBytes)
	share = math.Ceil(share*8) / 8
	gb := uint64(math.Round(share * float64((gpuTotalBytes+gib-1)/gib)))

	var suffix string
	switch giProfile {
	case nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV1, nvml.GPU_INSTANCE_PROFILE_2_SLICE_REV1:
		suffix = "+me"
	case nvml.GPU_INSTANCE_PROFILE_1_SLICE_ALL_ME, nvml.GPU_INSTANCE_PROFILE_2_SLICE_ALL_ME:
		suffix = "+me.all"
	case nvml.GPU_INSTANCE_PROFILE_1_SLICE_GFX, nvml.GPU_INSTANCE_PROFILE_2_SLICE_GFX,
		nvml.GPU_INSTANCE_PROFILE_3_SLICE_GFX, nvml.GPU_INSTANCE_PROFILE_4_SLICE_GFX:
		suffix = "+gfx"
	case nvml.GPU_INSTANCE_PROFILE_1_SLICE_NO_ME, nvml.GPU_INSTANCE_PROFILE_2_SLICE_NO_ME:
		suffix = "-me"
	}
	if ciSlices == 0 || ciSlices == giSlices {
		return fmt.Sprintf("%dg.%dgb%s", giSlices, gb, suffix)
	}
	return fmt.Sprintf("%dc.%dg.%dgb%s", ciSlices, giSlices, gb, suffix)
}

// nvmlReadMemory fills the framebuffer readings of g from dev, leaving them nil when
// NVML cannot say.
func nvmlReadMemory(dev nvml.Device, g *gpuscalerv1.GPUSample) {
	m, ret := dev.GetMemoryInfo()
	if ret != nvml.SUCCESS || m.Total == 0 {
		return
	}
	g.FbTotalBytes = proto.Uint64(m.Total)
	g.FbUsedBytes = proto.Uint64(min(m.Used, m.Total))
}

// takeXIDs counts the XID events waiting in the event set, without waiting for more.
func (s *nvmlSource) takeXIDs(ctx context.Context) {
	if s.events == nil {
		return
	}
	for range nvmlMaxXIDEventsPerCollect {
		if ctx.Err() != nil {
			return
		}
		e, ret := s.events.Wait(0) // 0 ms: ERROR_TIMEOUT at once when none is waiting
		if ret != nvml.SUCCESS {
			return
		}
		if e.EventType&nvml.EventTypeXidCriticalError == 0 || e.Device == nil {
			continue
		}
		uuid, ret := e.Device.GetUUID()
		if ret != nvml.SUCCESS {
			continue
		}
		c := s.xids[uuid]
		if c == nil {
			c = &nvmlXIDCount{}
			s.xids[uuid] = c
		}
		if e.GpuInstanceId == nvmlNoInstance {
			c.whole++
			continue
		}
		if c.byInstance == nil {
			c.byInstance = map[uint32]uint64{}
		}
		c.byInstance[e.GpuInstanceId]++
	}
}

// xidCount returns the XID events seen on a GPU (instance nil): all of them; or on one
// of its GPU instances: those of that instance and those of the whole GPU.
func (s *nvmlSource) xidCount(uuid string, instance *uint32) uint64 {
	c := s.xids[uuid]
	if c == nil {
		return 0
	}
	if instance != nil {
		return c.whole + c.byInstance[*instance]
	}
	n := c.whole
	for _, v := range c.byInstance {
		n += v
	}
	return n
}

// Close frees the event set and shuts NVML down. Calls after the first do nothing.
func (s *nvmlSource) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	if s.events != nil {
		_ = s.events.Free()
		s.events = nil
	}
	if ret := s.lib.Shutdown(); ret != nvml.SUCCESS {
		return fmt.Errorf("NVML Shutdown: %w", ret)
	}
	return nil
}
