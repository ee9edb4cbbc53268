package collectors

import (
	"context"
	"fmt"
	"math"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"

	gpuscalerv1 "github.com/gpuscaler/gpuscaler/proto/gpuscaler/v1"
)

// DCGM field ids read by the DCGM source. DCGM 4 renamed several (GPU_UTIL is now
// GPU_UTIL_RATIO, …) but kept their ids and units; the names here are the ones
// dcgm-exporter users know.
const (
	dcgmFieldGPUTemp          = 150  // °C, integer
	dcgmFieldPower            = 155  // W, double
	dcgmFieldGPUUtil          = 203  // percent, integer; not supported on a MIG instance
	dcgmFieldXID              = 230  // the last XID error's number, integer
	dcgmFieldFBTotal          = 250  // MiB, integer
	dcgmFieldFBFree           = 251  // MiB, integer
	dcgmFieldFBUsed           = 252  // MiB, integer
	dcgmFieldGREngineActive   = 1001 // ratio 0–1, double (profiling module)
	dcgmFieldSMActive         = 1002 // ratio 0–1, double
	dcgmFieldPipeTensorActive = 1004 // ratio 0–1, double
)

var dcgmFields = []uint16{
	dcgmFieldGPUTemp, dcgmFieldPower, dcgmFieldGPUUtil, dcgmFieldXID, dcgmFieldFBTotal, dcgmFieldFBFree,
	dcgmFieldFBUsed, dcgmFieldGREngineActive, dcgmFieldSMActive, dcgmFieldPipeTensorActive,
}

// dcgmEntity is a GPU or a MIG GPU instance as DCGM numbers it.
type dcgmEntity struct {
	MIG bool // a GPU instance (DCGM_FE_GPU_I), else a GPU (DCGM_FE_GPU)
	ID  uint
}

// dcgmGPU describes a GPU.
type dcgmGPU struct {
	ID    uint // DCGM's GPU id, which is the NVML index
	UUID  string
	Model string
}

// dcgmInstance describes a MIG GPU instance.
type dcgmInstance struct {
	ID         uint   // DCGM's GPU-instance entity id
	ParentGPU  uint   // DCGM id of its GPU
	InstanceID uint   // NVML GPU instance id, as nvidia-smi and dcgm-exporter's GPU_I_ID show it
	Slices     uint   // compute slices of its profile
	DeviceUUID string // the MIG device's "MIG-…" UUID, when known
}

// dcgmValue is one field's latest value for one entity. Blank means DCGM has no value
// (not supported, not yet sampled, no permission).
type dcgmValue struct {
	Entity dcgmEntity
	Field  uint16
	Value  float64
	Blank  bool
	TS     int64 // when DCGM sampled it, µs since the epoch
}

// dcgmAPI is the part of DCGM the source uses, behind an interface so its logic is
// tested without libdcgm. Without libdcgm, go-dcgm's Init fails cleanly but any other
// call ends the process with a symbol lookup error that recover cannot catch, so every
// method but Init is called only after Init succeeded.
type dcgmAPI interface {
	// Init connects to DCGM: the embedded host engine when addr is empty, else the
	// standalone nv-hostengine at addr.
	Init(addr string) error
	GPUs() ([]dcgmGPU, error)
	Instances() ([]dcgmInstance, error)
	// Watch asks DCGM to sample fields of the entities every period.
	Watch(entities []dcgmEntity, fields []uint16, every time.Duration) error
	Latest(entities []dcgmEntity, fields []uint16) ([]dcgmValue, error)
	Shutdown() error
}

// DCGMConfig configures the DCGM source.
type DCGMConfig struct {
	// Addr is a standalone nv-hostengine's address (host:port or a unix socket path);
	// empty means DCGM's embedded host engine, inside this process.
	Addr string
	// Every is how often DCGM samples the fields it watches: the report interval.
	Every time.Duration
}

// dcgmSource reads GPUs through DCGM field watches. Collect is not safe for concurrent
// use; the Collector calls it from one goroutine.
type dcgmSource struct {
	api      dcgmAPI
	cfg      DCGMConfig
	mu       sync.Mutex // guards everything below, and Close against Collect
	gpus     map[uint]dcgmGPU
	insts    []dcgmInstance
	entities []dcgmEntity
	watched  bool
	closed   bool
	// xids counts the XID errors seen per entity, and lastXID remembers when the last
	// one was sampled: DCGM reports the last XID's number, not a count.
	xids    map[dcgmEntity]uint64
	lastXID map[dcgmEntity]int64
}

// NewDCGM connects to DCGM (embedded, or the host engine at cfg.Addr) and watches the
// node's GPUs and MIG instances. Without libdcgm it fails with an error wrapping
// ErrNoGPUSource and makes no other DCGM call.
func NewDCGM(cfg DCGMConfig) (Source, error) {
	return newDCGMSource(&goDCGM{}, cfg)
}

func newDCGMSource(api dcgmAPI, cfg DCGMConfig) (*dcgmSource, error) {
	if cfg.Every <= 0 {
		cfg.Every = time.Second
	}
	where := "the embedded host engine"
	if cfg.Addr != "" {
		where = "nv-hostengine at " + cfg.Addr
	}
	if err := api.Init(cfg.Addr); err != nil {
		return nil, fmt.Errorf("%w: DCGM (%s): %w", ErrNoGPUSource, where, err)
	}
	s := &dcgmSource{api: api, cfg: cfg, xids: map[dcgmEntity]uint64{}, lastXID: map[dcgmEntity]int64{}}
	if err := s.discover(); err != nil {
		_ = api.Shutdown()
		return nil, fmt.Errorf("DCGM (%s): %w", where, err)
	}
	return s, nil
}

func (s *dcgmSource) Name() string { return "dcgm" }

// discover lists the GPUs and MIG instances and watches their fields. A GPU with MIG
// instances is measured through them and not itself.
func (s *dcgmSource) discover() error {
	gpus, err := s.api.GPUs()
	if err != nil {
		return fmt.Errorf("list GPUs: %w", err)
	}
	insts, err := s.api.Instances()
	if err != nil {
		return fmt.Errorf("list MIG instances: %w", err)
	}
	s.gpus = make(map[uint]dcgmGPU, len(gpus))
	inMIG := map[uint]bool{}
	for _, in := range insts {
		inMIG[in.ParentGPU] = true
	}
	s.entities = s.entities[:0]
	for _, g := range gpus {
		s.gpus[g.ID] = g
		if !inMIG[g.ID] {
			s.entities = append(s.entities, dcgmEntity{ID: g.ID})
		}
	}
	s.insts = insts
	for _, in := range insts {
		s.entities = append(s.entities, dcgmEntity{MIG: true, ID: in.ID})
	}
	if len(s.entities) == 0 {
		return fmt.Errorf("DCGM sees no GPU")
	}
	if err := s.api.Watch(s.entities, dcgmFields, s.cfg.Every); err != nil {
		return fmt.Errorf("watch fields: %w", err)
	}
	s.watched = true
	return nil
}

// Collect reads the latest watched values of every device.
func (s *dcgmSource) Collect(ctx context.Context) ([]*gpuscalerv1.GPUSample, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, fmt.Errorf("DCGM source is closed")
	}
	values, err := s.api.Latest(s.entities, dcgmFields)
	if err != nil {
		return nil, fmt.Errorf("DCGM latest values: %w", err)
	}
	byEntity := make(map[dcgmEntity]map[uint16]dcgmValue, len(s.entities))
	for _, v := range values {
		m := byEntity[v.Entity]
		if m == nil {
			m = make(map[uint16]dcgmValue, len(dcgmFields))
			byEntity[v.Entity] = m
		}
		m[v.Field] = v
	}
	out := make([]*gpuscalerv1.GPUSample, 0, len(s.entities))
	for _, e := range s.entities {
		out = append(out, s.sample(e, byEntity[e]))
	}
	return out, nil
}

// sample builds one device's sample from its field values.
func (s *dcgmSource) sample(e dcgmEntity, f map[uint16]dcgmValue) *gpuscalerv1.GPUSample {
	get := func(field uint16) (float64, bool) {
		v, ok := f[field]
		if !ok || v.Blank || math.IsNaN(v.Value) || v.Value < 0 {
			return 0, false
		}
		return v.Value, true
	}
	pct := func(ratio float64) *float64 { return proto.Float64(min(100, ratio*100)) }

	g := &gpuscalerv1.GPUSample{}
	if e.MIG {
		in := s.instance(e.ID)
		parent := s.gpus[in.ParentGPU]
		g.Uuid, g.Index, g.Model = parent.UUID, uint32(parent.ID), parent.Model
		g.MigInstanceId = proto.Uint32(uint32(in.InstanceID))
		g.DeviceId = in.DeviceUUID
		// GPU util is not defined on a MIG instance: use graphics-engine activity.
		if v, ok := get(dcgmFieldGREngineActive); ok {
			g.GpuUtil = pct(v)
		}
	} else {
		gpu := s.gpus[e.ID]
		g.Uuid, g.Index, g.Model = gpu.UUID, uint32(gpu.ID), gpu.Model
		if v, ok := get(dcgmFieldGPUUtil); ok {
			g.GpuUtil = proto.Float64(min(100, v))
		}
	}
	if v, ok := get(dcgmFieldSMActive); ok {
		g.SmActive = pct(v)
	}
	if v, ok := get(dcgmFieldPipeTensorActive); ok {
		g.TensorActive = pct(v)
	}
	used, hasUsed := get(dcgmFieldFBUsed)
	if hasUsed {
		g.FbUsedBytes = proto.Uint64(uint64(used) << 20)
	}
	total, hasTotal := get(dcgmFieldFBTotal)
	if free, ok := get(dcgmFieldFBFree); (!hasTotal || total == 0) && ok && hasUsed {
		total, hasTotal = used+free, true
	}
	if hasTotal && total > 0 {
		g.FbTotalBytes = proto.Uint64(uint64(total) << 20)
		if e.MIG {
			g.MigProfile = migProfileName(s.instance(e.ID).Slices, total)
		}
	}
	if g.FbUsedBytes != nil && g.FbTotalBytes != nil && *g.FbUsedBytes > *g.FbTotalBytes {
		g.FbUsedBytes = proto.Uint64(*g.FbTotalBytes) // a total read a moment apart from used
	}
	if v, ok := get(dcgmFieldPower); ok {
		g.PowerWatts = proto.Float64(v)
	}
	if v, ok := get(dcgmFieldGPUTemp); ok {
		g.TemperatureCelsius = proto.Float64(v)
	}
	// DCGM reports the last XID's number; a new sample time with a non-zero number is
	// one more XID.
	if x, ok := f[dcgmFieldXID]; ok && !x.Blank && x.Value != 0 && x.TS != s.lastXID[e] {
		s.lastXID[e] = x.TS
		s.xids[e]++
	}
	g.XidErrors = s.xids[e]
	return g
}

func (s *dcgmSource) instance(id uint) dcgmInstance {
	for _, in := range s.insts {
		if in.ID == id {
			return in
		}
	}
	return dcgmInstance{ID: id}
}

// migProfileName names a MIG profile as NVIDIA's device plugin does, "<slices>g.<GB>gb",
// from its compute slices and framebuffer in MiB, the size rounded up to whole GB as the
// device plugin rounds a profile's memory (an A100 80GB's 3g.40gb slice has 40192 MiB,
// 39.25 GiB). DCGM does not give the profile's name; this is checked against A100 and
// H100 sizes, not yet on hardware.
func migProfileName(slices uint, fbTotalMiB float64) string {
	if slices == 0 || fbTotalMiB <= 0 {
		return ""
	}
	return fmt.Sprintf("%dg.%dgb", slices, int(math.Ceil(fbTotalMiB/1024)))
}

// Close stops watching and shuts DCGM down.
func (s *dcgmSource) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	return s.api.Shutdown()
}
