//go:build cgo

package dcgm

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/gpuscaler/gpuscaler/collector/dcgmerr"
	"github.com/gpuscaler/gpuscaler/collector/sourceerr"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/prometheus/client_golang/prometheus"

	gpuscalerv1 "github.com/gpuscaler/gpuscaler/proto/gpuscaler/v1"
)

// DCGM field ids read by the DCGM source. DCGM 4 renamed several (GPU_UTIL is now
// GPU_UTIL_RATIO, …) but kept their ids and units; the names here are the ones
// dcgm-exporter users know.
const (
	fieldGPUTemp          = 150  // °C, integer
	fieldPower            = 155  // W, double
	fieldGPUUtil          = 203  // percent, integer; not supported on a MIG instance
	fieldXID              = 230  // the last XID error's number, integer
	fieldFBTotal          = 250  // MiB, integer
	fieldFBFree           = 251  // MiB, integer
	fieldFBUsed           = 252  // MiB, integer
	fieldGREngineActive   = 1001 // ratio 0–1, double (profiling module)
	fieldSMActive         = 1002 // ratio 0–1, double
	fieldPipeTensorActive = 1004 // ratio 0–1, double
)

// The fields are watched as two groups. DCGM fails a whole watch, and watches none of
// its fields, when the profiling module refuses its fields (a GPU without profiling
// support, a non-root host engine, another profiler holding the counters: see
// dcgmerr.ErrProfilingRefused), so the profiling fields have a group of their own and the base
// fields are read whatever the profiling module says.
var (
	baseFields = []uint16{
		fieldGPUTemp, fieldPower, fieldGPUUtil, fieldXID, fieldFBTotal, fieldFBFree, fieldFBUsed,
	}
	profilingFields = []uint16{fieldGREngineActive, fieldSMActive, fieldPipeTensorActive}
	// fieldNames names the profiling fields as DCGM does, for the unsupported-fields metric.
	fieldNames = map[uint16]string{
		fieldGREngineActive:   "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
		fieldSMActive:         "DCGM_FI_PROF_SM_ACTIVE",
		fieldPipeTensorActive: "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
	}
)

// Defaults of Config, and the source's reconnection back-off.
const (
	defaultRediscover = 30 * time.Second
	defaultXIDHold    = 5 * time.Minute
	minBackoff        = time.Second
	maxBackoff        = 30 * time.Second
	// minRediscoverGap bounds how often values that say an entity is gone make the
	// source rediscover: a MIG re-layout takes seconds, and an entity DCGM keeps listing
	// but no longer samples must not make every Collect rewatch.
	minRediscoverGap = 5 * time.Second
)

// entity is a GPU or a MIG GPU instance as DCGM numbers it.
type entity struct {
	MIG bool // a GPU instance (DCGM_FE_GPU_I), else a GPU (DCGM_FE_GPU)
	ID  uint
}

// gpuInfo describes a GPU.
type gpuInfo struct {
	ID    uint // DCGM's GPU id, which is the NVML index
	UUID  string
	Model string
	// Err says why DCGM could not describe the GPU (UUID and Model are then empty); the
	// source keeps what an earlier discovery learnt of it.
	Err error
}

// instance describes a MIG GPU instance.
type instance struct {
	ID         uint // DCGM's GPU-instance entity id
	ParentGPU  uint // DCGM id of its GPU
	InstanceID uint // NVML GPU instance id, as nvidia-smi and dcgm-exporter's GPU_I_ID show it
	Slices     uint // compute slices of its profile
	// ComputeInstanceID is the NVML id of its (first) compute instance, when it has one
	// (HasComputeInstance): with InstanceID it names the MIG device.
	ComputeInstanceID  uint
	HasComputeInstance bool
}

// value is one field's latest value for one entity. Blank means DCGM has no value
// (not supported, not yet sampled, no permission, the GPU lost); Status is the DCGM
// return code DCGM gave the value (0 when it gave one, or a blank it wrote itself).
type value struct {
	Entity entity
	Field  uint16
	Value  float64
	Blank  bool
	Status int
	TS     int64 // when DCGM sampled it, µs since the epoch
}

// watch names a watch library.Watch started.
type watch uint64

// gpuStatus is DCGM's own view of a GPU (dcgmGetGpuStatus, go-dcgm GetGPUStatus).
type gpuStatus struct {
	Lost bool   // DcgmEntityStatusLost: fallen off the bus
	Name string // go-dcgm's name of the status: "OK", "Lost", "Inaccessible", "Unknown", …
}

// library is the part of DCGM the source uses, behind an interface so its logic is
// tested without libdcgm. Without libdcgm, go-dcgm's Init fails cleanly but any other
// call ends the process with a symbol lookup error that recover cannot catch, so every
// method but Init is called only after Init succeeded, and none after Shutdown until
// Init succeeds again.
//
// Errors are wrapped in the dcgmerr sentinels when their kind is known
// (dcgmerr.ErrConnection, dcgmerr.ErrProfilingRefused, …).
type library interface {
	// Init connects to DCGM: the embedded host engine when addr is empty, else the
	// standalone nv-hostengine at addr.
	Init(addr string) error
	// GPUs lists the GPUs DCGM supports. A GPU it cannot describe has Err set.
	GPUs() ([]gpuInfo, error)
	Instances() ([]instance, error)
	// Watch asks DCGM to sample fields of the entities every period, as one watch.
	Watch(entities []entity, fields []uint16, every time.Duration) (watch, error)
	// Unwatch stops a watch and frees what it holds in DCGM.
	Unwatch(w watch) error
	// Latest returns the latest value of every field of every entity: one value per
	// pair, with a Status when DCGM has none.
	Latest(entities []entity, fields []uint16) ([]value, error)
	GPUStatus(gpu uint) gpuStatus
	// Shutdown stops every watch and disconnects.
	Shutdown() error
}

// Source reads GPUs through DCGM field watches. Its mutex serialises Collect and
// Close.
//
// It survives what real nodes do to DCGM: a host engine restart (it reconnects with
// back-off, and Collect fails meanwhile, so the node's report stops and goes stale
// rather than reading zero), a MIG re-layout (it rediscovers), a profiling module that
// refuses (it reads the other fields), and a lost or failing GPU (reported Unhealthy,
// the others unaffected).
type Source struct {
	api   library
	ids   identifier // nil: MIG device UUIDs and minor numbers are unknown
	cfg   Config
	where string // "the embedded host engine", "nv-hostengine at …", for messages
	log   *slog.Logger
	now   func() time.Time
	// unsupported is gpuscaler_collector_dcgm_fields_unsupported, by field name.
	unsupported *prometheus.GaugeVec

	mu     sync.Mutex // guards everything below, and Close against Collect
	closed bool
	// connected says Init succeeded and Shutdown has not been called since: only then
	// may any library method but Init be called.
	connected bool
	devices   []device // what the last discovery found, in report order
	// The base and profiling watches, when watching*.
	base, prof                 watch
	watchingBase, watchingProf bool
	// profRefused is why the profiling watch was refused, "" when it is watched or was
	// never refused: a refusal is logged when this changes from "".
	profRefused string
	// lastDiscover is when the devices were last listed; stale says the watches must be
	// renewed at the next chance (the values said an entity is gone).
	lastDiscover time.Time
	stale        bool
	// The outage: since when the host engine is unreachable (zero while connected), the
	// back-off before the next Init and when that is due.
	downSince time.Time
	backoff   time.Duration
	nextTry   time.Time
	// idsWarned says the MIG ids warning was logged, until NVML resolves them again.
	idsWarned bool
	// undescribed holds the GPUs DCGM could not describe and the source never knew,
	// whose warning was logged.
	undescribed map[uint]bool
	// xids is each device's XID history, by device.key; devices gone from the
	// layout are dropped.
	xids map[string]*xidState
}

// device is a device the source reports: a whole GPU or a MIG GPU instance.
type device struct {
	entity entity
	// key names the device across discoveries, as DCGM's entity ids do not after a MIG
	// re-layout: the GPU's UUID, or the legacy MIG id.
	key      string
	gpu      gpuInfo   // the GPU, or a MIG instance's parent
	inst     *instance // nil for a whole GPU
	deviceID string    // the kubelet's id, for a MIG instance; "" for a whole GPU
	// profile names a MIG instance's profile as NVML told it (migIdentity.Profile);
	// "" when NVML could not, and for a whole GPU.
	profile string
	minor   *uint32 // the GPU's (or parent's) minor number, when NVML told
}

// New connects to DCGM (embedded, or the host engine at cfg.Addr) and watches the
// node's GPUs and MIG instances. It uses NVML (libnvidia-ml.so.1), when it can, for what
// DCGM does not say: MIG device UUIDs and GPU minor numbers. Without libdcgm it fails
// with an error wrapping sourceerr.ErrNoGPUSource and makes no other DCGM call.
func New(cfg Config) (*Source, error) {
	return newSource(&goDCGM{}, newNVMLIdentifier(nvml.New()), time.Now, cfg)
}

// newSource is New with DCGM, NVML and the clock injected; ids and now may be nil.
func newSource(api library, ids identifier, now func() time.Time, cfg Config) (*Source, error) {
	if cfg.Every <= 0 {
		cfg.Every = time.Second
	}
	if cfg.Rediscover <= 0 {
		cfg.Rediscover = defaultRediscover
	}
	if cfg.XIDHold <= 0 {
		cfg.XIDHold = defaultXIDHold
	}
	if now == nil {
		now = time.Now
	}
	log := cfg.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	where := "the embedded host engine"
	if cfg.Addr != "" {
		where = "nv-hostengine at " + cfg.Addr
	}
	if err := api.Init(cfg.Addr); err != nil {
		return nil, fmt.Errorf("%w: DCGM (%s): %w", sourceerr.ErrNoGPUSource, where, err)
	}
	s := &Source{
		api: api, ids: ids, cfg: cfg, where: where, log: log, now: now, connected: true,
		xids: map[string]*xidState{}, undescribed: map[uint]bool{},
		unsupported: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "gpuscaler_collector_dcgm_fields_unsupported",
			Help: "1 for each DCGM field the source cannot watch on this node (the profiling module refused it), 0 once it can.",
		}, []string{"field"}),
	}
	fail := func(err error) (*Source, error) {
		_ = api.Shutdown()
		if ids != nil {
			_ = ids.Close()
		}
		return nil, err
	}
	if err := s.discover(now()); err != nil {
		return fail(fmt.Errorf("DCGM (%s): %w", where, err))
	}
	if cfg.Registerer != nil {
		if err := cfg.Registerer.Register(s.unsupported); err != nil {
			return fail(fmt.Errorf("DCGM source metrics: %w", err))
		}
	}
	return s, nil
}

func (s *Source) Name() string { return "dcgm" }

// Collect reads the latest watched values of every device. While the host engine is
// unreachable it fails, with an error wrapping dcgmerr.ErrConnection, and tries to
// reconnect when the back-off allows.
func (s *Source) Collect(ctx context.Context) ([]*gpuscalerv1.GPUSample, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, errors.New("DCGM source is closed")
	}
	now := s.now()
	switch {
	case !s.connected:
		if err := s.reconnect(now); err != nil {
			return nil, err
		}
	case s.stale && s.mayRediscover(now) || now.Sub(s.lastDiscover) >= s.cfg.Rediscover:
		if err := s.discover(now); err != nil {
			return nil, s.failed(now, fmt.Errorf("DCGM (%s): rediscover: %w", s.where, err))
		}
	}
	for {
		out, gone, err := s.read(now)
		if err != nil && !errors.Is(err, dcgmerr.ErrEntityGone) {
			return nil, s.failed(now, fmt.Errorf("DCGM (%s): %w", s.where, err))
		}
		if err != nil || gone {
			s.stale = true
			if s.mayRediscover(now) { // at most once a Collect: discover sets lastDiscover
				if err := s.discover(now); err != nil {
					return nil, s.failed(now, fmt.Errorf("DCGM (%s): rediscover: %w", s.where, err))
				}
				continue
			}
		}
		if err != nil {
			return nil, fmt.Errorf("DCGM (%s): %w", s.where, err)
		}
		return out, nil
	}
}

func (s *Source) mayRediscover(now time.Time) bool {
	return now.Sub(s.lastDiscover) >= min(s.cfg.Rediscover, minRediscoverGap)
}

// failed handles an error of a DCGM call: a lost connection shuts DCGM down (go-dcgm
// counts Inits, and connects again only once Shutdown brought the count to zero) and
// starts the back-off. It returns err.
func (s *Source) failed(now time.Time, err error) error {
	if !errors.Is(err, dcgmerr.ErrConnection) || !s.connected {
		return err
	}
	_ = s.api.Shutdown()
	s.connected, s.watchingBase, s.watchingProf = false, false, false
	s.downSince, s.backoff = now, minBackoff
	s.nextTry = now.Add(s.backoff)
	s.log.Warn("DCGM host engine connection lost: the node reports nothing until it is back; reconnecting with back-off",
		"where", s.where, "err", err)
	return err
}

// reconnect connects to DCGM again, if the back-off allows, and watches the devices.
func (s *Source) reconnect(now time.Time) error {
	if now.Before(s.nextTry) {
		return fmt.Errorf("%w: DCGM (%s) unreachable since %s; next try in %s", dcgmerr.ErrConnection, s.where,
			s.downSince.Format(time.RFC3339), s.nextTry.Sub(now).Round(time.Millisecond))
	}
	if err := s.api.Init(s.cfg.Addr); err != nil {
		s.backoff = min(2*s.backoff, maxBackoff)
		s.nextTry = now.Add(s.backoff)
		s.log.Debug("DCGM reconnect failed", "where", s.where, "err", err, "retryIn", s.backoff)
		return fmt.Errorf("%w: DCGM (%s) unreachable since %s: reconnect: %w", dcgmerr.ErrConnection, s.where,
			s.downSince.Format(time.RFC3339), err)
	}
	s.connected = true
	if err := s.discover(now); err != nil {
		return s.failed(now, fmt.Errorf("DCGM (%s): discover after reconnecting: %w", s.where, err))
	}
	return nil
}

// discover lists the GPUs and MIG instances and, when the set changed, the watches were
// lost or the values said an entity is gone, watches them afresh. Otherwise it only
// refreshes their ids and retries a refused profiling watch. A GPU with MIG instances
// is measured through them and not itself.
//
// When it fails, the watches are renewed at the next chance (stale).
func (s *Source) discover(now time.Time) (err error) {
	s.lastDiscover = now
	defer func() {
		if err != nil {
			s.stale = true
		}
	}()
	gpus, err := s.api.GPUs()
	if err != nil {
		return fmt.Errorf("list GPUs: %w", err)
	}
	insts, err := s.api.Instances()
	if err != nil {
		return fmt.Errorf("list MIG instances: %w", err)
	}
	devices := s.layout(gpus, insts)
	if len(devices) == 0 {
		return errors.New("DCGM sees no GPU")
	}
	if s.stale || !s.watchingBase || !sameEntities(s.devices, devices) {
		s.unwatch()
		entities := entitiesOf(devices)
		w, err := s.api.Watch(entities, baseFields, s.cfg.Every)
		if err != nil {
			return fmt.Errorf("watch fields: %w", err)
		}
		s.base, s.watchingBase = w, true
		if err := s.watchProfiling(entities); err != nil {
			return err
		}
		keep := make(map[string]bool, len(devices))
		for _, d := range devices {
			keep[d.key] = true
		}
		maps.DeleteFunc(s.xids, func(key string, _ *xidState) bool { return !keep[key] })
	} else if !s.watchingProf {
		if err := s.watchProfiling(entitiesOf(devices)); err != nil {
			return err
		}
	}
	s.devices, s.stale = devices, false
	if !s.downSince.IsZero() { // the first discovery since an outage
		s.log.Info("DCGM host engine connection restored", "where", s.where, "after", now.Sub(s.downSince))
		s.downSince, s.backoff = time.Time{}, 0
	}
	return nil
}

// watchProfiling watches the profiling fields as a group of their own. A refusal is
// not an error: the base fields are read without them, the refusal is logged once and
// shown by gpuscaler_collector_dcgm_fields_unsupported. Only a lost connection fails.
func (s *Source) watchProfiling(entities []entity) error {
	w, err := s.api.Watch(entities, profilingFields, s.cfg.Every)
	if err != nil {
		if errors.Is(err, dcgmerr.ErrConnection) {
			return fmt.Errorf("watch profiling fields: %w", err)
		}
		for _, f := range profilingFields {
			s.unsupported.WithLabelValues(fieldNames[f]).Set(1)
		}
		if s.profRefused == "" {
			s.log.Warn("DCGM refuses the profiling fields: SM active, tensor active and MIG utilisation are not reported; "+
				"the other readings are (retried at each rediscovery)",
				"where", s.where, "reason", dcgmerr.Name(err), "err", err)
		} else {
			s.log.Debug("DCGM still refuses the profiling fields", "err", err)
		}
		s.profRefused = err.Error()
		return nil
	}
	s.prof, s.watchingProf = w, true
	for _, f := range profilingFields {
		s.unsupported.WithLabelValues(fieldNames[f]).Set(0)
	}
	if s.profRefused != "" {
		s.log.Info("DCGM now watches the profiling fields", "where", s.where)
		s.profRefused = ""
	}
	return nil
}

// unwatch stops the current watches. Errors are only logged: the watches die with the
// connection anyway, and a new watch does not depend on the old one's end.
func (s *Source) unwatch() {
	if s.watchingProf {
		if err := s.api.Unwatch(s.prof); err != nil {
			s.log.Debug("DCGM unwatch of the profiling fields failed", "err", err)
		}
		s.watchingProf = false
	}
	if s.watchingBase {
		if err := s.api.Unwatch(s.base); err != nil {
			s.log.Debug("DCGM unwatch failed", "err", err)
		}
		s.watchingBase = false
	}
}

// layout builds the devices to report from what DCGM lists, with the ids NVML gives.
func (s *Source) layout(gpus []gpuInfo, insts []instance) []device {
	known := map[uint]gpuInfo{}
	for _, d := range s.devices {
		known[d.gpu.ID] = d.gpu
	}
	byID := make(map[uint]gpuInfo, len(gpus))
	var order []uint
	for _, g := range gpus {
		if g.Err != nil {
			old, ok := known[g.ID]
			if !ok {
				if !s.undescribed[g.ID] {
					s.log.Warn("DCGM cannot describe a GPU it has never described: it is not reported", "gpu", g.ID, "err", g.Err)
					s.undescribed[g.ID] = true
				}
				continue
			}
			g = old
		}
		delete(s.undescribed, g.ID)
		byID[g.ID] = g
		order = append(order, g.ID)
	}
	inMIG := map[uint]bool{}
	for _, in := range insts {
		if _, ok := byID[in.ParentGPU]; ok {
			inMIG[in.ParentGPU] = true
		}
	}

	idents := identities{}
	var idErr error
	if s.ids != nil {
		want := make([]identifyGPU, 0, len(order))
		for _, id := range order {
			want = append(want, identifyGPU{UUID: byID[id].UUID, MIG: inMIG[id]})
		}
		idents, idErr = s.ids.Identify(want)
	} else {
		idErr = errors.New("no NVML")
	}
	minor := func(uuid string) *uint32 {
		if m, ok := idents.Minor[uuid]; ok {
			return &m
		}
		return nil
	}

	devices := make([]device, 0, len(order)+len(insts))
	for _, id := range order {
		if g := byID[id]; !inMIG[id] {
			devices = append(devices, device{entity: entity{ID: id}, key: g.UUID, gpu: g, minor: minor(g.UUID)})
		}
	}
	unresolved := 0
	for i := range insts {
		in := insts[i]
		g, ok := byID[in.ParentGPU]
		if !ok {
			continue
		}
		legacy := legacyMIGID(g.UUID, in.InstanceID, in.ComputeInstanceID)
		m, ok := idents.mig(g.UUID, in.InstanceID, in.ComputeInstanceID, in.HasComputeInstance)
		if !ok {
			m.UUID = legacy
			unresolved++
		}
		devices = append(devices, device{
			entity: entity{MIG: true, ID: in.ID}, key: legacy, gpu: g, inst: &in, deviceID: m.UUID,
			profile: m.Profile, minor: minor(g.UUID),
		})
	}
	switch {
	case unresolved > 0 && !s.idsWarned:
		s.log.Warn("MIG device UUIDs unknown (NVML could not tell them): MIG instances are reported with the device "+
			"plugin's legacy ids MIG-<GPU UUID>/<GPU instance>/<compute instance>, which pods' devices match only "+
			"with a device plugin using that form, and their profiles are named from DCGM's sizes, which on some GPUs "+
			"(an H200's 1g.16gb for 1g.18gb) are not the device plugin's names", "unresolved", unresolved, "err", idErr)
		s.idsWarned = true
	case unresolved == 0 && s.idsWarned:
		s.log.Info("MIG device UUIDs known again")
		s.idsWarned = false
	}
	if idErr != nil && unresolved == 0 {
		s.log.Debug("NVML could not identify every GPU: their minor numbers are not reported", "err", idErr)
	}
	return devices
}

// sameEntities reports whether two layouts watch the same entities for the same devices.
func sameEntities(a, b []device) bool {
	return slices.EqualFunc(a, b, func(x, y device) bool { return x.entity == y.entity && x.key == y.key })
}

func entitiesOf(devices []device) []entity {
	out := make([]entity, len(devices))
	for i, d := range devices {
		out[i] = d.entity
	}
	return out
}

// read reads every device's latest values and builds their samples. gone says the
// values show an entity DCGM no longer knows or watches (its sample is then Unhealthy).
// It fails when DCGM can be asked nothing, or no device gives any reading and none is
// known to have failed.
func (s *Source) read(now time.Time) (out []*gpuscalerv1.GPUSample, gone bool, err error) {
	fields := baseFields
	if s.watchingProf {
		fields = slices.Concat(baseFields, profilingFields)
	}
	values, err := s.api.Latest(entitiesOf(s.devices), fields)
	if err != nil {
		return nil, false, fmt.Errorf("latest values: %w", err)
	}
	byEntity := make(map[entity]map[uint16]value, len(s.devices))
	for _, v := range values {
		m := byEntity[v.Entity]
		if m == nil {
			m = make(map[uint16]value, len(fields))
			byEntity[v.Entity] = m
		}
		m[v.Field] = v
	}

	readings := make([]reading, len(s.devices))
	anyRead, anyFailed := false, false
	for i, d := range s.devices {
		r := readDevice(d, byEntity[d.entity])
		x := s.xids[d.key]
		if x == nil {
			x = &xidState{}
			s.xids[d.key] = x
		}
		x.observe(r.xid, r.hasXID, now)
		r.sample.XidErrors, r.sample.LastXid = x.count, x.last
		readings[i] = r
		anyRead = anyRead || r.readable
		anyFailed = anyFailed || r.failure != ""
		gone = gone || r.goneWhy != ""
	}
	// A device none of whose fields reads: ask DCGM what it thinks of the GPU. A lost
	// GPU's fields read blank with an OK status (DcgmCacheManager.cpp writes
	// NVML_ERROR_GPU_IS_LOST as a blank value, InsertNvmlErrorValue).
	status := map[uint]gpuStatus{}
	for i := range readings {
		r := &readings[i]
		if r.readable || r.failure != "" || r.goneWhy != "" {
			continue
		}
		gpu := s.devices[i].gpu.ID
		st, ok := status[gpu]
		if !ok {
			st = s.api.GPUStatus(gpu)
			status[gpu] = st
		}
		switch {
		case st.Lost:
			r.failure = "GPU is lost (DCGM GPU status Lost)"
			anyFailed = true
		case st.Name != "" && st.Name != "OK" && st.Name != "Unknown":
			r.failure = "no reading: every DCGM field is blank (DCGM GPU status " + st.Name + ")"
		default:
			r.failure = "no reading: every DCGM field is blank"
		}
	}
	if !anyRead && !anyFailed {
		if gone {
			return nil, true, fmt.Errorf("%w: DCGM no longer watches any device", dcgmerr.ErrEntityGone)
		}
		return nil, false, fmt.Errorf("no reading from any of %d devices: every DCGM field is blank", len(s.devices))
	}
	out = make([]*gpuscalerv1.GPUSample, len(readings))
	for i, r := range readings {
		g := r.sample
		switch x := s.xids[s.devices[i].key]; {
		case r.failure != "":
			g.Unhealthy = r.failure
		case r.goneWhy != "":
			g.Unhealthy = r.goneWhy
		case x.holding(now, s.cfg.XIDHold):
			g.Unhealthy = fmt.Sprintf("XID %d", x.critical)
		}
		out[i] = g
	}
	return out, gone, nil
}

// Close stops watching and shuts DCGM and NVML down.
func (s *Source) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	var errs []error
	if s.ids != nil {
		errs = append(errs, s.ids.Close())
	}
	if s.connected {
		s.connected = false
		errs = append(errs, s.api.Shutdown())
	}
	return errors.Join(errs...)
}
