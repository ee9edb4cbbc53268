//go:build cgo

package nvml

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/proto"

	"github.com/gpuscaler/gpuscaler/collector/kubelet/cgroup"
	"github.com/gpuscaler/gpuscaler/collector/mig"
	"github.com/gpuscaler/gpuscaler/collector/sourceerr"
	"github.com/gpuscaler/gpuscaler/collector/xid"
	gpuscalerv1 "github.com/gpuscaler/gpuscaler/proto/gpuscaler/v1"
)

// maxXIDEventsPerCollect bounds the XID events one Collect takes from NVML, so a
// storm of them cannot hold Collect up; the rest wait for the next Collect.
const maxXIDEventsPerCollect = 256

// noInstance is the GPU (or compute) instance id NVML gives an event that concerns
// no particular instance: every event of a GPU not in MIG mode, and whole-GPU events of
// one in it.
const noInstance = math.MaxUint32

// Source reads GPUs through NVML (libnvidia-ml.so.1, shipped with the driver), for
// nodes without DCGM. NVML has no cheap equivalent of DCGM's SM-active and
// tensor-active profiling fields, nor of graphics-engine activity on a MIG instance,
// so those readings are always absent.
//
// A GPU that fails is reported, unhealthy, under the identity NVML gave it earlier
// (start-up reads every GPU once); the others are unaffected. It is also a
// collector.PodUsageSource: NVML's per-process samples, with each process's pod found through
// its cgroup under Config.ProcRoot.
//
// Collect, PodUsage and Close may be called from several goroutines: one mutex
// serialises them.
type Source struct {
	lib     nvml.Interface
	log     *slog.Logger
	now     func() time.Time // the clock XID holds are measured on; tests set it
	xidHold time.Duration
	metrics sourceMetrics

	mu     sync.Mutex // guards everything below, and Close against Collect
	closed bool
	// events receives the XID events of every GPU registered when the source started;
	// nil when NVML offers no event set.
	events nvml.EventSet
	// gpus is what is known of each GPU, by NVML index. NVML enumerates the GPUs once,
	// at Init, so an index names the same GPU for the life of the source.
	gpus []*knownGPU
	// xids is what XID events said of each GPU, by GPU UUID.
	xids   map[string]*xidCounts
	xidSeq uint64 // orders XID events: the clock may not move between two
	// migs remembers what never changes for the life of a MIG device (its GPU instance
	// and profile), by its "MIG-…" UUID. Entries not seen in the latest Collect (a MIG
	// device destroyed by a reconfiguration) are dropped.
	migs map[string]*knownMIG
	gen  uint64 // counts Collects, to tell which migs entries the latest one saw
	// lastSeen is, by GPU UUID, the NVML timestamp of the newest per-process sample
	// taken, where the next GetProcessUtilization starts; absent before NVML first
	// answered for the GPU.
	lastSeen map[string]uint64
	// usage is the per-process utilisation the latest Collect measured, by device id
	// then PID; a device absent was not measured.
	usage map[string]map[uint32]float64
	// podWindows is, by device id, each pod's use in the windows PodUsage measured over
	// the last PodUsageSpan, oldest first, which PodUsage averages.
	podWindows map[string][]podWindow
	pods       *cgroup.Pods
	// unhealthy is each device's Unhealthy reason in the latest Collect, by device id,
	// to log changes once rather than every Collect.
	unhealthy map[string]string
	warned    map[string]bool // what warnOnce has logged
}

// knownGPU is what is known of the GPU at one NVML index, as last read: enough to report
// it, unhealthy, when it stops answering.
type knownGPU struct {
	handle    nvml.Device // the handle NVML last gave; nil before one
	uuid      string      // "" until NVML told it once
	model     string
	modelRead bool
	minor     *uint32
	// migs are its MIG devices as of the last Collect that enumerated them, by slot.
	migs []migRef
}

// migRef is what identifies one MIG device in a report.
type migRef struct {
	slot                  int
	uuid                  string
	instanceID, computeID *uint32 // nil when NVML would not say
	profile               string
}

// knownMIG is what a MIG device's identity says of it.
type knownMIG struct {
	instanceID *uint32 // GPU instance id; nil when NVML would not say
	computeID  *uint32 // compute instance id; nil when NVML would not say
	profile    string  // "1g.5gb", "1c.3g.20gb", "1g.5gb+me", …; "" when unknown
	seen       uint64  // the Collect (Source.gen) that last saw the device
}

// xidCounts is what XID events said of one GPU: how many concerned no GPU instance and
// how many each GPU instance (MIG), and the last one and the last critical one by the
// GPU and compute instance it concerned (noInstance for none).
type xidCounts struct {
	whole          uint64
	byInstance     map[uint32]uint64
	last, critical map[xidPlace]xidEvent
}

// xidPlace is the part of a GPU an XID event concerned: a GPU instance and compute
// instance, either of them noInstance when the event concerned all of them.
type xidPlace struct{ gi, ci uint32 }

type xidEvent struct {
	xid uint32
	at  time.Time
	seq uint64
}

// covers reports whether an event at p concerns the MIG device m. It follows NVIDIA's
// device plugin (internal/rm/health.go, runEventMonitor), which matches an event to a
// MIG device by GPU and compute instance unless they are 0xFFFFFFFF, with one
// difference: a GPU instance with no compute instance concerns that GPU instance only,
// not the whole GPU. An identity NVML would not tell matches every event, so that a
// failing device is never missed.
func (p xidPlace) covers(m *migRef) bool {
	return (p.gi == noInstance || m.instanceID == nil || p.gi == *m.instanceID) &&
		(p.ci == noInstance || m.computeID == nil || p.ci == *m.computeID)
}

// sourceMetrics are the source's own metrics.
type sourceMetrics struct {
	unidentified prometheus.Gauge
	unresolved   *prometheus.CounterVec
}

func newSourceMetrics(reg prometheus.Registerer) (sourceMetrics, error) {
	m := sourceMetrics{
		unidentified: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "gpuscaler_collector_nvml_unidentified_devices",
			Help: "GPUs and MIG devices NVML lists but never identified (no UUID), so the last Collect could not report them.",
		}),
		unresolved: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gpuscaler_collector_nvml_unresolved_processes_total",
			Help: "Processes in NVML's per-process samples whose pod could not be found, by reason " +
				"(unreadable: no /proc/<pid>/cgroup under the proc root; no_pod: in no pod); each leaves its device's per-pod figures unmeasured.",
		}, []string{"reason"}),
	}
	for _, reason := range []string{"unreadable", "no_pod"} {
		m.unresolved.WithLabelValues(reason)
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.unidentified, m.unresolved} {
		if err := reg.Register(c); err != nil {
			return m, fmt.Errorf("NVML source metrics: %w", err)
		}
	}
	return m, nil
}

// New starts NVML through the driver's libnvidia-ml.so.1 and returns a Source
// reading every GPU it sees, which is also a collector.PodUsageSource. Without the
// library, the driver or a GPU it fails with an error wrapping sourceerr.ErrNoGPUSource
// that says what is missing.
func New(cfg Config) (*Source, error) {
	s, err := newSource(nvml.New(), cfg)
	if err != nil {
		return nil, err
	}
	return s, nil
}

// newSource starts lib (Init), prepares to follow XID errors and reads every GPU
// once, to learn the identity it reports a GPU under should it fail later. It is
// New with the library injected, for tests with go-nvml's mocks.
func newSource(lib nvml.Interface, cfg Config) (*Source, error) {
	if ret := lib.Init(); ret != nvml.SUCCESS {
		return nil, fmt.Errorf("%w: NVML Init: %w (%d): %s", sourceerr.ErrNoGPUSource, ret, int32(ret), InitHint(ret))
	}
	n, ret := lib.DeviceGetCount()
	switch {
	case ret != nvml.SUCCESS:
		_ = lib.Shutdown()
		return nil, fmt.Errorf("NVML: count GPUs: %w", ret)
	case n == 0:
		_ = lib.Shutdown()
		return nil, fmt.Errorf("%w: NVML sees no GPU", sourceerr.ErrNoGPUSource)
	}
	metrics, err := newSourceMetrics(cfg.Registerer)
	if err != nil {
		_ = lib.Shutdown()
		return nil, err
	}
	s := &Source{
		lib:        lib,
		log:        cfg.Log,
		now:        time.Now,
		xidHold:    cfg.XIDHold,
		metrics:    metrics,
		xids:       map[string]*xidCounts{},
		migs:       map[string]*knownMIG{},
		lastSeen:   map[string]uint64{},
		usage:      map[string]map[uint32]float64{},
		podWindows: map[string][]podWindow{},
		pods:       cgroup.NewPods(cfg.ProcRoot),
		unhealthy:  map[string]string{},
		warned:     map[string]bool{},
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	if s.xidHold <= 0 {
		s.xidHold = DefaultXIDHold
	}
	s.watchXIDs(n)
	// One read now learns every GPU's identity (and its MIG devices'), so a GPU lost
	// before the first Collect is still reported under it, and starts each GPU's
	// per-process sample window. A GPU that cannot be read yet is no reason to stop.
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, err := s.collect(context.Background()); err != nil {
		s.log.Warn("NVML started but could read no GPU yet", "err", err)
	}
	return s, nil
}

// InitHint says what a failed nvmlInit most likely means on a Kubernetes node; the DCGM
// source, which asks NVML for what DCGM does not say, gives it too.
func InitHint(ret nvml.Return) string {
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
// take them without blocking. It is best effort: a GPU (or a driver) that cannot
// report XID events keeps an XID count of 0.
func (s *Source) watchXIDs(n int) {
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
		s.gpu(i).handle = dev
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

func (s *Source) Name() string { return "nvml" }

// gpu returns what is known of the GPU at index, empty the first time.
func (s *Source) gpu(index int) *knownGPU {
	for len(s.gpus) <= index {
		s.gpus = append(s.gpus, &knownGPU{})
	}
	return s.gpus[index]
}

// Collect reads every GPU once, or each of its MIG devices instead when it is in MIG
// mode and has some. It makes a handful of NVML calls per device and waits for no event;
// an NVML call cannot be interrupted, so ctx is checked between devices.
//
// A GPU or MIG device that NVML cannot read (no handle, no UUID, a reading that says
// the GPU is lost or needs a reset, every reading failing) is reported with Unhealthy
// saying which call failed and how, its readings absent, under the identity NVML gave
// it before. One never identified is left out and counted
// (gpuscaler_collector_nvml_unidentified_devices): without a UUID no allocation, pod
// or device id can be matched to it, and an invented id would be a device the kubelet
// does not know. Collect fails only when NVML cannot count the GPUs or can read none.
func (s *Source) Collect(ctx context.Context) ([]*gpuscalerv1.GPUSample, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, errors.New("NVML source is closed")
	}
	return s.collect(ctx)
}

// collect is Collect with s.mu held.
func (s *Source) collect(ctx context.Context) ([]*gpuscalerv1.GPUSample, error) {
	s.gen++
	s.takeXIDs(ctx)
	clear(s.usage)
	n, ret := s.lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("NVML: count GPUs: %w", ret)
	}
	if n == 0 {
		return nil, errors.New("NVML: count GPUs: NVML sees no GPU")
	}
	c := collectRound{out: make([]*gpuscalerv1.GPUSample, 0, n)}
	read := 0
	var firstErr error
	for i := range n {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if err := s.appendGPU(&c, i); err != nil {
			if firstErr == nil {
				firstErr = err
			}
			continue
		}
		read++
	}
	s.metrics.unidentified.Set(float64(c.unidentified))
	if read == 0 {
		return nil, fmt.Errorf("NVML: none of the %d GPUs could be read (%w)", n, firstErr)
	}
	for id, m := range s.migs {
		if m.seen != s.gen {
			delete(s.migs, id)
		}
	}
	out := c.samples()
	s.logHealth(out)
	return out, nil
}

// collectRound is what one Collect builds: the samples, those of them that NVML could
// not read and come from memory, and the devices it could not report at all.
type collectRound struct {
	out          []*gpuscalerv1.GPUSample
	remembered   map[*gpuscalerv1.GPUSample]bool
	unidentified int
}

func (c *collectRound) addRemembered(g *gpuscalerv1.GPUSample) {
	if c.remembered == nil {
		c.remembered = map[*gpuscalerv1.GPUSample]bool{}
	}
	c.remembered[g] = true
	c.out = append(c.out, g)
}

// samples returns the samples, without a remembered one whose device was also read
// afresh or already remembered: NVML keeps its indexes for a session, so it should
// not happen, but a report naming a device twice would be rejected whole.
func (c *collectRound) samples() []*gpuscalerv1.GPUSample {
	if len(c.remembered) == 0 {
		return c.out
	}
	fresh := make(map[string]bool, len(c.out))
	for _, g := range c.out {
		if !c.remembered[g] {
			fresh[g.DeviceID()] = true
		}
	}
	out := c.out[:0]
	for _, g := range c.out {
		if c.remembered[g] {
			if fresh[g.DeviceID()] {
				continue
			}
			fresh[g.DeviceID()] = true
		}
		out = append(out, g)
	}
	return out
}

// appendGPU reads the GPU at index (or its MIG devices) into c. It fails when the GPU
// could not be read, having reported it unhealthy when it knows the GPU's identity.
func (s *Source) appendGPU(c *collectRound, index int) error {
	known := s.gpu(index)
	dev, ret := s.lib.DeviceGetHandleByIndex(index)
	if ret != nvml.SUCCESS {
		return s.appendUnreadable(c, index, known, "DeviceGetHandleByIndex", ret)
	}
	known.handle = dev
	uuid, ret := dev.GetUUID()
	if ret != nvml.SUCCESS {
		return s.appendUnreadable(c, index, known, "GetUUID", ret)
	}
	if known.uuid != uuid { // first read (a GPU's UUID is fixed: no other change is expected)
		*known = knownGPU{handle: dev, uuid: uuid}
	}
	if !known.modelRead {
		if name, ret := dev.GetName(); ret == nvml.SUCCESS {
			known.model, known.modelRead = name, true
		}
	}
	if known.minor == nil {
		if minor, ret := dev.GetMinorNumber(); ret == nvml.SUCCESS && minor >= 0 {
			known.minor = proto.Uint32(uint32(minor))
		}
	}
	current, _, ret := dev.GetMigMode()
	if deviceFailed(ret) {
		return s.appendUnreadable(c, index, known, "GetMigMode", ret)
	}
	if ret == nvml.SUCCESS && current == nvml.DEVICE_MIG_ENABLE {
		if has, err := s.appendMIGSamples(c, dev, index, known); has {
			return err
		}
		// MIG mode with no MIG device yet: report the GPU itself, as the DCGM source
		// does, so the node's GPUs stay visible.
	}
	known.migs = nil
	g, err := s.gpuSample(dev, index, known)
	c.out = append(c.out, g)
	return err
}

// appendUnreadable reports the GPU at index, which NVML could not read (call answered
// ret), under what is known of it: each of its MIG devices as last seen, or the GPU
// itself; nothing when its UUID was never known. It returns the failure.
func (s *Source) appendUnreadable(c *collectRound, index int, known *knownGPU, call string, ret nvml.Return) error {
	err := fmt.Errorf("GPU %d: %s: %w", index, call, ret)
	reason := "NVML " + reasonFor(call, ret)
	if known.uuid == "" {
		c.unidentified++
		s.warnOnce("unidentified GPU "+strconv.Itoa(index),
			"NVML cannot read a GPU it has never identified: it is left out of the reports",
			"index", index, "reason", reason)
		return err
	}
	if len(known.migs) > 0 {
		for i := range known.migs {
			c.addRemembered(s.unreadableMIG(index, known, &known.migs[i], reason))
		}
		return err
	}
	g := known.sample(index)
	g.Unhealthy = reason
	g.XidErrors = s.xidCount(known.uuid, nil)
	s.applyXID(g, known.uuid, nil)
	c.addRemembered(g)
	return err
}

// unreadableMIG is the sample of a MIG device NVML could not read, from what is known.
func (s *Source) unreadableMIG(index int, known *knownGPU, m *migRef, reason string) *gpuscalerv1.GPUSample {
	if old, ok := s.migs[m.uuid]; ok {
		old.seen = s.gen // keep its identity for when it answers again
	}
	g := known.migSample(index, m)
	g.Unhealthy = reason
	g.XidErrors = s.xidCount(known.uuid, m.instanceID)
	s.applyXID(g, known.uuid, m)
	return g
}

// sample is a GPU's sample with its identity only.
func (k *knownGPU) sample(index int) *gpuscalerv1.GPUSample {
	g := &gpuscalerv1.GPUSample{Uuid: k.uuid, Index: uint32(index), Model: k.model}
	if k.minor != nil {
		g.Minor = proto.Uint32(*k.minor)
	}
	return g
}

// migSample is a MIG device's sample with its identity only.
func (k *knownGPU) migSample(index int, m *migRef) *gpuscalerv1.GPUSample {
	g := k.sample(index)
	g.DeviceId = m.uuid
	g.MigProfile = m.profile
	if m.instanceID != nil { // a copy: the cache's must not be shared with callers
		g.MigInstanceId = proto.Uint32(*m.instanceID)
	}
	return g
}

// gpuSample reads a whole GPU. It fails when the GPU could not be read, with the
// sample saying why.
func (s *Source) gpuSample(dev nvml.Device, index int, known *knownGPU) (*gpuscalerv1.GPUSample, error) {
	g := known.sample(index)
	var r deviceReadings
	if m, ret := dev.GetMemoryInfo(); r.take("GetMemoryInfo", ret) {
		setMemory(g, m)
	}
	if !r.lost() {
		if u, ret := dev.GetUtilizationRates(); r.take("GetUtilizationRates", ret) {
			g.GpuUtil = proto.Float64(float64(min(u.Gpu, 100)))
		}
	}
	if !r.lost() {
		if mw, ret := dev.GetPowerUsage(); r.take("GetPowerUsage", ret) {
			g.PowerWatts = proto.Float64(float64(mw) / 1000)
		}
	}
	if !r.lost() {
		if c, ret := dev.GetTemperature(nvml.TEMPERATURE_GPU); r.take("GetTemperature", ret) {
			g.TemperatureCelsius = proto.Float64(float64(c))
		}
	}
	if !r.lost() {
		if ret := s.sampleProcesses(dev, known.uuid, g.GpuUtil); deviceFailed(ret) {
			r.take("GetProcessUtilization", ret)
		}
	}
	g.XidErrors = s.xidCount(known.uuid, nil)
	err := r.judge(g)
	s.applyXID(g, known.uuid, nil)
	if err != nil {
		return g, fmt.Errorf("GPU %d: %w", index, err)
	}
	return g, nil
}

// appendMIGSamples appends a sample per MIG device of the GPU at index, and reports
// whether the GPU has any: false leaves the GPU to be read whole. It reads each MIG
// device's framebuffer only: NVML measures power and temperature for the physical GPU,
// whose figures on each of its slices would be counted once per slice, and does not
// measure utilisation in MIG mode at all. It fails when no MIG device could be read.
//
// A MIG device NVML cannot read is reported unhealthy from what the last Collect
// learnt of the device in its slot; one never identified is left out and counted.
func (s *Source) appendMIGSamples(c *collectRound, dev nvml.Device, index int, known *knownGPU) (bool, error) {
	slots, ret := dev.GetMaxMigDeviceCount()
	if ret != nvml.SUCCESS {
		return true, s.appendUnreadable(c, index, known, "GetMaxMigDeviceCount", ret)
	}
	var (
		now      []migRef
		found    int
		read     int
		firstErr error
	)
	for j := range slots {
		migDev, ret := dev.GetMigDeviceHandleByIndex(j)
		if ret == nvml.ERROR_NOT_FOUND {
			continue // an empty slot
		}
		found++
		call := "GetMigDeviceHandleByIndex"
		var migUUID string
		if ret == nvml.SUCCESS {
			call = "GetUUID"
			migUUID, ret = migDev.GetUUID()
		}
		if ret != nvml.SUCCESS {
			err := fmt.Errorf("GPU %d: MIG device %d: %s: %w", index, j, call, ret)
			if firstErr == nil {
				firstErr = err
			}
			if m := known.migAt(j); m != nil {
				c.addRemembered(s.unreadableMIG(index, known, m, "NVML "+reasonFor(call, ret)))
				now = append(now, *m)
				continue
			}
			c.unidentified++
			s.warnOnce(fmt.Sprintf("unidentified MIG %d/%d", index, j),
				"NVML cannot read a MIG device it has never identified: it is left out of the reports",
				"index", index, "slot", j, "reason", "NVML "+reasonFor(call, ret))
			continue
		}
		id := s.migIdentity(dev, migDev, migUUID)
		ref := migRef{slot: j, uuid: migUUID, instanceID: id.instanceID, computeID: id.computeID, profile: id.profile}
		now = append(now, ref)
		g := known.migSample(index, &ref)
		var r deviceReadings
		if m, ret := migDev.GetMemoryInfo(); r.take("GetMemoryInfo", ret) {
			setMemory(g, m)
		}
		g.XidErrors = s.xidCount(known.uuid, id.instanceID)
		err := r.judge(g)
		s.applyXID(g, known.uuid, &ref)
		c.out = append(c.out, g)
		if err != nil {
			if firstErr == nil {
				firstErr = fmt.Errorf("GPU %d: MIG device %d: %w", index, j, err)
			}
			continue
		}
		read++
	}
	if found == 0 {
		return false, nil
	}
	known.migs = now
	if read == 0 {
		return true, firstErr
	}
	return true, nil
}

// migAt returns the MIG device last seen in slot, or nil.
func (k *knownGPU) migAt(slot int) *migRef {
	for i := range k.migs {
		if k.migs[i].slot == slot {
			return &k.migs[i]
		}
	}
	return nil
}

// migIdentity returns a MIG device's GPU and compute instances and profile, from the
// cache when an earlier Collect learnt them. Only complete answers are cached, so a
// failed read is tried again next time.
func (s *Source) migIdentity(parent, migDev nvml.Device, migUUID string) *knownMIG {
	if m, ok := s.migs[migUUID]; ok {
		m.seen = s.gen
		return m
	}
	m := &knownMIG{seen: s.gen}
	giID, ret := migDev.GetGpuInstanceId()
	giKnown := ret == nvml.SUCCESS && giID >= 0
	if giKnown {
		m.instanceID = proto.Uint32(uint32(giID))
	}
	if ciID, ret := migDev.GetComputeInstanceId(); ret == nvml.SUCCESS && ciID >= 0 {
		m.computeID = proto.Uint32(uint32(ciID))
	}
	m.profile = mig.ProfileOf(parent, migDev, giID, giKnown)
	if giKnown && m.computeID != nil && m.profile != "" {
		s.migs[migUUID] = m
	}
	return m
}

// deviceReadings follows one device's readings in one Collect.
type deviceReadings struct {
	ok        int
	failed    []string    // why each reading that failed other than NOT_SUPPORTED did
	failedRet nvml.Return // the first of them
	lostCall  string      // the reading that said the GPU itself failed; "" while none did
	lostRet   nvml.Return
}

// take notes NVML's answer to a reading and reports whether it succeeded.
func (r *deviceReadings) take(call string, ret nvml.Return) bool {
	switch {
	case ret == nvml.SUCCESS:
		r.ok++
		return true
	case deviceFailed(ret):
		if r.lostCall == "" {
			r.lostCall, r.lostRet = call, ret
		}
	case ret != nvml.ERROR_NOT_SUPPORTED:
		if len(r.failed) == 0 {
			r.failedRet = ret
		}
		r.failed = append(r.failed, reasonFor(call, ret))
	}
	return false
}

// lost reports whether a reading said the GPU itself failed: the rest are not worth
// asking (each is a round trip to a GPU that is not answering).
func (r *deviceReadings) lost() bool { return r.lostCall != "" }

// judge marks g unhealthy when its readings say so: a reading said the GPU itself
// failed (its readings are then dropped: those taken a moment before came from a
// failing GPU), or every reading failed for another reason than NOT_SUPPORTED. It
// returns the failure, nil when the device was read.
func (r *deviceReadings) judge(g *gpuscalerv1.GPUSample) error {
	switch {
	case r.lost():
		g.GpuUtil, g.SmActive, g.TensorActive = nil, nil, nil
		g.FbUsedBytes, g.FbTotalBytes, g.PowerWatts, g.TemperatureCelsius = nil, nil, nil, nil
		g.Unhealthy = "NVML " + reasonFor(r.lostCall, r.lostRet)
		return fmt.Errorf("%s: %w", r.lostCall, r.lostRet)
	case r.ok == 0 && len(r.failed) > 0:
		g.Unhealthy = "NVML: every reading failed: " + strings.Join(r.failed, "; ")
		return fmt.Errorf("every reading failed: %w", r.failedRet)
	}
	return nil
}

// deviceFailed reports whether NVML's answer says the GPU itself has failed rather
// than that one reading is unavailable: it fell off the bus (XID 79: "GPU is lost") or
// needs a reset.
func deviceFailed(ret nvml.Return) bool {
	return ret == nvml.ERROR_GPU_IS_LOST || ret == nvml.ERROR_RESET_REQUIRED
}

// returnNames names NVML's answers as nvml.h does, with what they mean. The text
// of nvml.ErrorString depends on whether the library is loaded; a report's reasons
// should not.
var returnNames = map[nvml.Return][2]string{
	nvml.ERROR_UNINITIALIZED:     {"ERROR_UNINITIALIZED", "NVML is not initialised"},
	nvml.ERROR_INVALID_ARGUMENT:  {"ERROR_INVALID_ARGUMENT", "invalid argument"},
	nvml.ERROR_NOT_SUPPORTED:     {"ERROR_NOT_SUPPORTED", "not supported"},
	nvml.ERROR_NO_PERMISSION:     {"ERROR_NO_PERMISSION", "no permission"},
	nvml.ERROR_NOT_FOUND:         {"ERROR_NOT_FOUND", "not found"},
	nvml.ERROR_DRIVER_NOT_LOADED: {"ERROR_DRIVER_NOT_LOADED", "the driver is not loaded"},
	nvml.ERROR_TIMEOUT:           {"ERROR_TIMEOUT", "timed out"},
	nvml.ERROR_IRQ_ISSUE:         {"ERROR_IRQ_ISSUE", "interrupt problem with the GPU"},
	nvml.ERROR_CORRUPTED_INFOROM: {"ERROR_CORRUPTED_INFOROM", "the GPU's infoROM is corrupted"},
	nvml.ERROR_GPU_IS_LOST:       {"ERROR_GPU_IS_LOST", "GPU is lost"},
	nvml.ERROR_RESET_REQUIRED:    {"ERROR_RESET_REQUIRED", "GPU needs a reset"},
	nvml.ERROR_OPERATING_SYSTEM:  {"ERROR_OPERATING_SYSTEM", "the operating system refused"},
	nvml.ERROR_MEMORY:            {"ERROR_MEMORY", "out of memory"},
	nvml.ERROR_UNKNOWN:           {"ERROR_UNKNOWN", "unknown error"},
}

// reasonFor says how an NVML call failed: "GetUUID: GPU is lost (ERROR_GPU_IS_LOST)".
func reasonFor(call string, ret nvml.Return) string {
	if n, ok := returnNames[ret]; ok {
		return fmt.Sprintf("%s: %s (%s)", call, n[1], n[0])
	}
	return fmt.Sprintf("%s: %s (NVML return %d)", call, ret.Error(), int32(ret))
}

// setMemory fills the framebuffer readings of g from m, leaving them nil when NVML
// reports no framebuffer.
func setMemory(g *gpuscalerv1.GPUSample, m nvml.Memory) {
	if m.Total == 0 {
		return
	}
	g.FbTotalBytes = proto.Uint64(m.Total)
	g.FbUsedBytes = proto.Uint64(min(m.Used, m.Total))
}

// logHealth logs each device that became unhealthy, or healthy again, since the last
// Collect.
func (s *Source) logHealth(out []*gpuscalerv1.GPUSample) {
	now := make(map[string]string, len(out))
	for _, g := range out {
		id := g.DeviceID()
		now[id] = g.GetUnhealthy()
		before := s.unhealthy[id]
		switch {
		case g.GetUnhealthy() != "" && g.GetUnhealthy() != before:
			s.log.Warn("GPU unhealthy", "device", id, "index", g.GetIndex(), "reason", g.GetUnhealthy(), "last_xid", g.GetLastXid())
		case g.GetUnhealthy() == "" && before != "":
			s.log.Info("GPU healthy again", "device", id, "index", g.GetIndex(), "was", before)
		}
	}
	s.unhealthy = now
}

// warnOnce logs msg at warning level the first time key is seen, at debug level after.
func (s *Source) warnOnce(key, msg string, args ...any) {
	if s.warned[key] {
		s.log.Debug(msg, args...)
		return
	}
	s.warned[key] = true
	s.log.Warn(msg+" (logged once)", args...)
}

// takeXIDs takes the XID events waiting in the event set, without waiting for more:
// it counts them all, and remembers the last critical one of each part of a GPU.
func (s *Source) takeXIDs(ctx context.Context) {
	if s.events == nil {
		return
	}
	for range maxXIDEventsPerCollect {
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
		uuid := s.eventGPU(e.Device)
		if uuid == "" {
			continue
		}
		c := s.xids[uuid]
		if c == nil {
			c = &xidCounts{}
			s.xids[uuid] = c
		}
		if e.GpuInstanceId == noInstance {
			c.whole++
		} else {
			if c.byInstance == nil {
				c.byInstance = map[uint32]uint64{}
			}
			c.byInstance[e.GpuInstanceId]++
		}
		if c.last == nil {
			c.last, c.critical = map[xidPlace]xidEvent{}, map[xidPlace]xidEvent{}
		}
		s.xidSeq++
		place := xidPlace{e.GpuInstanceId, e.ComputeInstanceId}
		ev := xidEvent{xid: uint32(min(e.EventData, math.MaxUint32)), at: s.now(), seq: s.xidSeq}
		c.last[place] = ev
		if xid.Critical(e.EventData) {
			c.critical[place] = ev
		}
	}
}

// eventGPU returns the UUID of the GPU an event came from. A GPU that has just fallen
// off the bus no longer answers GetUUID, yet its XID (79) is the news: it is then found
// by its handle among those NVML gave for each GPU.
func (s *Source) eventGPU(dev nvml.Device) string {
	if uuid, ret := dev.GetUUID(); ret == nvml.SUCCESS {
		return uuid
	}
	if !reflect.TypeOf(dev).Comparable() { // == on it would panic
		return ""
	}
	for _, k := range s.gpus {
		if k.handle != nil && reflect.TypeOf(k.handle).Comparable() && k.handle == dev {
			return k.uuid
		}
	}
	return ""
}

// xidCount returns the XID events seen on a GPU (instance nil): all of them; or on one
// of its GPU instances: those of that instance and those of the whole GPU.
func (s *Source) xidCount(uuid string, instance *uint32) uint64 {
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

// applyXID sets g's LastXid to the last XID, critical or not, that concerned the device
// (the GPU uuid, or its MIG device mig), and marks g unhealthy "XID <n>" while the last
// critical one is younger than the hold, unless g is already unhealthy for a reason of
// the moment.
func (s *Source) applyXID(g *gpuscalerv1.GPUSample, uuid string, ref *migRef) {
	c := s.xids[uuid]
	if c == nil {
		return
	}
	latest := func(events map[xidPlace]xidEvent) (last xidEvent) {
		for place, e := range events {
			if (ref == nil || place.covers(ref)) && e.seq > last.seq {
				last = e
			}
		}
		return last
	}
	if last := latest(c.last); last.seq != 0 {
		g.LastXid = last.xid
	}
	if crit := latest(c.critical); crit.seq != 0 && g.Unhealthy == "" && s.now().Sub(crit.at) < s.xidHold {
		g.Unhealthy = "XID " + strconv.FormatUint(uint64(crit.xid), 10)
	}
}

// sampleProcesses takes NVML's per-process utilisation samples of a whole GPU since
// the last Collect, for PodUsage, and returns NVML's answer. util is the GPU's own
// utilisation read just before, nil when unknown.
//
// What the samples mean (NVML's nvmlDeviceGetProcessUtilization): the driver keeps a
// buffer of per-process samples with CPU timestamps in microseconds; asked with the
// newest timestamp seen so far it returns those after it, or ERROR_NOT_FOUND when
// there are none. So:
//   - the first answer with samples covers the whole buffer, a window of unknown
//     length: it only sets where the next window starts, and the GPU is unmeasured
//     this once. (After a first answer of none, every later sample is new.)
//   - no sample means no process ran on the GPU in the window, but only if the GPU
//     itself reads idle: the driver samples on its own period, and a window between two
//     of its samples is empty while the GPU is busy. No sample on a GPU that reads busy
//     (or unknown) leaves it unmeasured, never "no pod used it";
//   - a process sampled more than once in the window counts for the mean of its
//     samples (NVML does not document whether it can be).
//
// NOT_SUPPORTED (older GPUs, vGPU) or any other failure leaves the GPU unmeasured.
func (s *Source) sampleProcesses(dev nvml.Device, uuid string, util *float64) nvml.Return {
	since, started := s.lastSeen[uuid]
	samples, ret := dev.GetProcessUtilization(since)
	switch {
	case ret == nvml.ERROR_NOT_FOUND,
		// go-nvml answers an empty buffer this way too.
		(ret == nvml.SUCCESS || ret == nvml.ERROR_INSUFFICIENT_SIZE) && len(samples) == 0:
		s.lastSeen[uuid] = since
		if util != nil && *util == 0 {
			s.usage[uuid] = map[uint32]float64{}
		}
		return nvml.SUCCESS
	case ret != nvml.SUCCESS:
		return ret
	}
	type acc struct {
		sum float64
		n   int
	}
	byPID := make(map[uint32]acc, len(samples))
	latest := since
	for _, p := range samples {
		if p.Pid == 0 || p.TimeStamp <= since {
			continue // an unfilled entry, or one from before the window
		}
		latest = max(latest, p.TimeStamp)
		a := byPID[p.Pid]
		a.sum += float64(min(p.SmUtil, 100))
		a.n++
		byPID[p.Pid] = a
	}
	s.lastSeen[uuid] = latest
	if !started {
		return nvml.SUCCESS
	}
	if len(byPID) == 0 {
		// Only stale or unfilled entries: no process ran in the window, as above.
		if util != nil && *util == 0 {
			s.usage[uuid] = map[uint32]float64{}
		}
		return nvml.SUCCESS
	}
	usage := make(map[uint32]float64, len(byPID))
	for pid, a := range byPID {
		usage[pid] = a.sum / float64(a.n)
	}
	s.usage[uuid] = usage
	return nvml.SUCCESS
}

// PodUsageSpan is how far back PodUsage averages a pod's use of a device.
//
// On a time-sliced GPU the driver runs one context at a time, for slices that are long
// against its 200 ms sample period: on an H200 with two pods each running matrix
// products without pause, half-second windows read 99/0, 66/33, 50/50 or 33/66 from one
// to the next (hack/hardware-check.sh, 2026-11-26, HW_POD_B_DUTY=1). Read window by
// window, a pod's figure jumps between 0 and 99, and KEDA hands the HPA whichever it
// read last; averaged over five seconds the same run read 63 and 40. That is well
// inside the HPA's 15 s sync and KEDA's polling, and as quick as a pod's figure can be
// told from another's.
const PodUsageSpan = 5 * time.Second

// podWindow is one measured window of a device: each pod's use, by pod UID.
type podWindow struct {
	at   time.Time
	pods map[string]float64
}

// PodUsage returns, by device id, each pod's SM utilisation (percent) on the devices
// the last Collect measured: for each whole GPU, the sum over the pod's processes of
// NVML's per-process samples, at most 100, averaged over the windows measured in the
// last PodUsageSpan since the pod was first seen in them (a pod absent from a
// window used none of it). See sampleProcesses for when a GPU is measured; MIG devices
// never are (NVML does not sample processes on them).
//
// A process's pod is found through /proc/<pid>/cgroup under Config.ProcRoot: NVML
// reports host PIDs, so the collector needs the host's /proc (hostPID: true, or a
// hostPath mount). A device with a sampled process whose pod cannot be found (its
// cgroup unreadable: it exited, or the proc root is not the host's; or it is in no
// pod) is left out: its pods' figures would be incomplete, and an undercount is a
// silent zero. Such processes are counted in
// gpuscaler_collector_nvml_unresolved_processes_total and logged once.
func (s *Source) PodUsage() map[string]map[string]float64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]map[string]float64, len(s.usage))
	seen := make(map[uint32]struct{})
	for id, byPID := range s.usage {
		pods := make(map[string]float64, len(byPID))
		complete := true
		for pid, util := range byPID {
			seen[pid] = struct{}{}
			uid, err := s.pods.PodOf(pid)
			if err != nil {
				complete = false
				reason := "unreadable"
				if errors.Is(err, cgroup.ErrNoPod) {
					reason = "no_pod"
				}
				s.metrics.unresolved.WithLabelValues(reason).Inc()
				s.warnOnce("unresolved process",
					"a process NVML sampled on a GPU is in no pod the collector can find, so that GPU's per-pod use is "+
						"unmeasured; NVML reports host PIDs: run the collector with hostPID: true or point --proc-root at the host's /proc",
					"device", id, "pid", pid, "err", err)
				continue
			}
			pods[uid] += util
		}
		if !complete {
			continue
		}
		for uid, u := range pods {
			pods[uid] = min(u, 100)
		}
		out[id] = s.smoothPodUse(id, pods)
	}
	s.pods.Retain(seen)
	return out
}

// smoothPodUse records the window just measured on device id and returns each pod's
// mean use over the windows of the last PodUsageSpan, counting for each pod the
// windows from the first it appears in (a pod that started a moment ago is not
// diluted by the windows before it ran). A device's windows are dropped as they age,
// when it is next measured.
func (s *Source) smoothPodUse(id string, window map[string]float64) map[string]float64 {
	at := s.now()
	ws := slices.DeleteFunc(s.podWindows[id], func(w podWindow) bool { return at.Sub(w.at) >= PodUsageSpan })
	ws = append(ws, podWindow{at: at, pods: window})
	s.podWindows[id] = ws
	out := make(map[string]float64, len(window))
	for i, w := range ws {
		for uid := range w.pods {
			if _, done := out[uid]; done {
				continue
			}
			var sum float64
			for _, later := range ws[i:] {
				sum += later.pods[uid]
			}
			out[uid] = sum / float64(len(ws)-i)
		}
	}
	return out
}

// Close frees the event set and shuts NVML down. Calls after the first do nothing.
func (s *Source) Close() error {
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
