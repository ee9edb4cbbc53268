//go:build cgo

package dcgm

import (
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/gpuscaler/gpuscaler/collector/dcgmerr"
	"github.com/gpuscaler/gpuscaler/collector/mig"

	"google.golang.org/protobuf/proto"

	"github.com/gpuscaler/gpuscaler/collector/xid"
	gpuscalerv1 "github.com/gpuscaler/gpuscaler/proto/gpuscaler/v1"
)

// reading is what one device's field values say of it.
type reading struct {
	sample *gpuscalerv1.GPUSample // its identity and readings; XIDs and health are added by the source
	// readable says at least one base field has a value.
	readable bool
	// failure says why the values show the device failed ("GPU is lost
	// (DCGM_ST_GPU_IS_LOST)"); "" when they do not.
	failure string
	// goneWhy says why the values show DCGM no longer knows or watches the entity; ""
	// when they do not. The source then rediscovers.
	goneWhy string
	// xid is the XID field's value, when it has one.
	xid    value
	hasXID bool
}

// readDevice builds a device's sample from its field values (nil when DCGM gave none) and
// says what they show of its health. It is pure: XID counting and the health decisions
// that need other devices or time are the source's.
func readDevice(d device, f map[uint16]value) reading {
	r := reading{sample: identityOf(d)}
	for _, field := range baseFields {
		v, ok := f[field]
		if !ok {
			continue
		}
		if !v.Blank {
			r.readable = true
		}
		if v.Status == 0 {
			continue
		}
		kind, _ := dcgmerr.Classify(v.Status, true, "")
		switch {
		case errors.Is(kind, dcgmerr.ErrGPULost), errors.Is(kind, dcgmerr.ErrResetRequired):
			if r.failure == "" {
				r.failure = fmt.Sprintf("%s (%s)", kind, dcgmerr.StatusName(v.Status))
			}
		case errors.Is(kind, dcgmerr.ErrEntityGone):
			if r.goneWhy == "" {
				r.goneWhy = fmt.Sprintf("DCGM no longer knows or watches it (%s)", dcgmerr.StatusName(v.Status))
			}
		}
	}
	if len(f) == 0 {
		// DCGM answers every (entity, field) pair asked (dcgmEntitiesGetLatestValues); no
		// value at all is an entity it no longer has.
		r.goneWhy = "DCGM gave no value for it"
	}
	if r.readable {
		r.goneWhy = "" // a value that reads wins over one that says the entity is gone
	}

	get := func(field uint16) (float64, bool) {
		v, ok := f[field]
		if !ok || v.Blank || math.IsNaN(v.Value) || math.IsInf(v.Value, 0) || v.Value < 0 {
			return 0, false
		}
		return v.Value, true
	}
	pct := func(ratio float64) *float64 { return proto.Float64(min(100, ratio*100)) }
	g := r.sample
	if d.inst != nil {
		// GPU util is not defined on a MIG instance: use graphics-engine activity, a
		// profiling field, absent when the profiling module refuses.
		if v, ok := get(fieldGREngineActive); ok {
			g.GpuUtil = pct(v)
		}
	} else if v, ok := get(fieldGPUUtil); ok {
		g.GpuUtil = proto.Float64(min(100, v))
	}
	if v, ok := get(fieldSMActive); ok {
		g.SmActive = pct(v)
	}
	if v, ok := get(fieldPipeTensorActive); ok {
		g.TensorActive = pct(v)
	}
	used, hasUsed := get(fieldFBUsed)
	if hasUsed {
		g.FbUsedBytes = proto.Uint64(uint64(used) << 20)
	}
	total, hasTotal := get(fieldFBTotal)
	if free, ok := get(fieldFBFree); (!hasTotal || total == 0) && ok && hasUsed {
		total, hasTotal = used+free, true
	}
	if hasTotal && total > 0 {
		g.FbTotalBytes = proto.Uint64(uint64(total) << 20)
		if d.inst != nil && d.profile == "" {
			g.MigProfile = mig.GuessProfileName(d.inst.Slices, total)
		}
	}
	if g.FbUsedBytes != nil && g.FbTotalBytes != nil && *g.FbUsedBytes > *g.FbTotalBytes {
		g.FbUsedBytes = proto.Uint64(*g.FbTotalBytes) // a total read a moment apart from used
	}
	if v, ok := get(fieldPower); ok {
		g.PowerWatts = proto.Float64(v)
	}
	if v, ok := get(fieldGPUTemp); ok {
		g.TemperatureCelsius = proto.Float64(v)
	}
	if x, ok := f[fieldXID]; ok && !x.Blank {
		r.xid, r.hasXID = x, true
	}
	return r
}

// identityOf is a device's sample with its identity alone.
func identityOf(d device) *gpuscalerv1.GPUSample {
	g := &gpuscalerv1.GPUSample{Uuid: d.gpu.UUID, Index: uint32(d.gpu.ID), Model: d.gpu.Model, DeviceId: d.deviceID,
		MigProfile: d.profile}
	if d.minor != nil {
		g.Minor = proto.Uint32(*d.minor)
	}
	if d.inst != nil {
		g.MigInstanceId = proto.Uint32(uint32(d.inst.InstanceID))
	}
	return g
}

// xidState is one device's XID history. DCGM reports the last XID's number, with
// the time it was sampled; a new sample time with a non-zero number is one more XID.
//
// Health: NVIDIA's device plugin marks a device unhealthy on any critical XID and keeps
// it so until the plugin restarts (k8s-device-plugin internal/rm/health.go). A
// collector that did so would hold a GPU out of the scaler's sight forever after one
// recoverable fault, so the source reports a device unhealthy for a hold period
// (Config.XIDHold, 5 min by default) after its last critical XID, and healthy
// after, while LastXid keeps the number. The hold runs from when DCGM sampled the XID,
// not from when this source first read it: DCGM keeps the last XID's value for good, so
// a collector restarted, or a layout rediscovered, long after an XID must not take it
// for a new one.
type xidState struct {
	count    uint64    // XIDs seen, critical or not
	lastTS   int64     // DCGM's sample time of the last one
	last     uint32    // the last XID's number, critical or not; 0 when none
	critical uint32    // the last critical XID's number, 0 when none
	at       time.Time // when DCGM sampled the last critical XID
}

// observe records the XID field's value v (ok: it has one) read at now.
func (x *xidState) observe(v value, ok bool, now time.Time) {
	if !ok || v.Value <= 0 || v.TS == x.lastTS {
		return
	}
	x.lastTS = v.TS
	x.count++
	x.last = uint32(min(v.Value, math.MaxUint32))
	if xid.Critical(uint64(x.last)) {
		x.critical, x.at = x.last, now
		if v.TS > 0 {
			x.at = time.UnixMicro(v.TS)
		}
	}
}

// holding reports whether the last critical XID is less than hold old.
func (x *xidState) holding(now time.Time, hold time.Duration) bool {
	return x != nil && x.critical != 0 && now.Sub(x.at) < hold
}
