//go:build cgo

package dcgm

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/gpuscaler/gpuscaler/collector/dcgmerr"

	"github.com/NVIDIA/go-dcgm/pkg/dcgm"
)

// goDCGM is library over github.com/NVIDIA/go-dcgm (cgo; libdcgm.so.4 is loaded at run
// time). It is the only code that calls go-dcgm, and it follows library's rule: nothing
// but Init before Init has succeeded, nor after Shutdown. Every error it returns has
// been through wrapErr, so the source can tell its kind.
type goDCGM struct {
	// watches holds what each live watch created in DCGM, to destroy at Unwatch or
	// Shutdown. The handles die with the connection: Shutdown forgets them all.
	watches map[watch]goDCGMWatch
	next    watch // the last watch number given
}

// goDCGMWatch is one watch: a group of entities and a group of fields.
type goDCGMWatch struct {
	group  dcgm.GroupHandle
	fields dcgm.FieldHandle
}

// wrapErr classifies a go-dcgm error: by the return code of a *dcgm.Error, which some
// go-dcgm functions return (GetSupportedDevices, GetDeviceInfo,
// EntitiesGetLatestValues…), else by DCGM's errorString text, all that the others keep
// (they wrap it with fmt.Errorf("…: %s")).
func wrapErr(err error) error {
	if err == nil {
		return nil
	}
	var de *dcgm.Error
	if errors.As(err, &de) {
		return dcgmerr.Wrap(err, int(de.Code), true)
	}
	return dcgmerr.Wrap(err, 0, false)
}

func (d *goDCGM) Init(addr string) error {
	var err error
	switch {
	case addr == "":
		_, err = dcgm.Init(dcgm.Embedded)
	case strings.Contains(addr, "://"): // tcp://host:port, unix:///path
		_, err = dcgm.Init(dcgm.Standalone, addr)
	case strings.HasPrefix(addr, "/"):
		_, err = dcgm.Init(dcgm.Standalone, addr, "1") // a unix socket path
	default:
		_, err = dcgm.Init(dcgm.Standalone, addr, "0")
	}
	return wrapErr(err)
}

func (d *goDCGM) GPUs() ([]gpuInfo, error) {
	ids, err := dcgm.GetSupportedDevices()
	if err != nil {
		return nil, wrapErr(err)
	}
	out := make([]gpuInfo, 0, len(ids))
	for _, id := range ids {
		info, err := dcgm.GetDeviceInfo(id)
		if err != nil {
			err = wrapErr(err)
			if errors.Is(err, dcgmerr.ErrConnection) {
				return nil, fmt.Errorf("GPU %d: %w", id, err)
			}
			// One GPU DCGM cannot describe (lost, say) must not hide the others.
			out = append(out, gpuInfo{ID: id, Err: err})
			continue
		}
		out = append(out, gpuInfo{ID: id, UUID: info.UUID, Model: info.Identifiers.Model})
	}
	return out, nil
}

func (d *goDCGM) Instances() ([]instance, error) {
	h, err := dcgm.GetGPUInstanceHierarchy()
	if err != nil {
		return nil, wrapErr(err)
	}
	var out []instance
	n := min(h.Count, uint(len(h.EntityList)))
	for _, e := range h.EntityList[:n] {
		if e.Entity.EntityGroupId != dcgm.FE_GPU_I {
			continue
		}
		out = append(out, instance{
			ID: e.Entity.EntityId, ParentGPU: e.Parent.EntityId,
			InstanceID: e.Info.NvmlInstanceId, Slices: e.Info.NvmlProfileSlices,
		})
	}
	// Compute instances share their GPU instance's figures; the first of each names
	// the MIG device (with one compute instance per GPU instance, as mig-parted and the
	// GPU Operator make them, the only one).
	for _, e := range h.EntityList[:n] {
		if e.Entity.EntityGroupId != dcgm.FE_GPU_CI || e.Parent.EntityGroupId != dcgm.FE_GPU_I {
			continue
		}
		for i := range out {
			in := &out[i]
			if in.ID == e.Parent.EntityId && (!in.HasComputeInstance || e.Info.NvmlComputeInstanceId < in.ComputeInstanceID) {
				in.ComputeInstanceID, in.HasComputeInstance = e.Info.NvmlComputeInstanceId, true
			}
		}
	}
	return out, nil
}

func (d *goDCGM) Watch(entities []entity, fields []uint16, every time.Duration) (watch, error) {
	d.next++
	name := fmt.Sprintf("gpuscaler-%d-%d", time.Now().UnixNano(), d.next)
	group, err := dcgm.CreateGroup(name)
	if err != nil {
		return 0, wrapErr(err)
	}
	for _, e := range entities {
		if err := dcgm.AddEntityToGroup(group, entityGroup(e), e.ID); err != nil {
			_ = dcgm.DestroyGroup(group)
			return 0, fmt.Errorf("add %v to group: %w", e, wrapErr(err))
		}
	}
	fg, err := dcgm.FieldGroupCreate(name+"-fields", shorts(fields))
	if err != nil {
		_ = dcgm.DestroyGroup(group)
		return 0, wrapErr(err)
	}
	// Keep three periods of samples: enough for the latest value, little memory.
	if err := dcgm.WatchFieldsWithGroupEx(fg, group, every.Microseconds(), 3*every.Seconds(), 3); err != nil {
		_ = dcgm.FieldGroupDestroy(fg)
		_ = dcgm.DestroyGroup(group)
		return 0, wrapErr(err)
	}
	if d.watches == nil {
		d.watches = map[watch]goDCGMWatch{}
	}
	d.watches[d.next] = goDCGMWatch{group: group, fields: fg}
	return d.next, nil
}

func (d *goDCGM) Unwatch(w watch) error {
	h, ok := d.watches[w]
	if !ok {
		return nil
	}
	delete(d.watches, w)
	return d.destroy(h)
}

func (d *goDCGM) destroy(h goDCGMWatch) error {
	return errors.Join(wrapErr(dcgm.UnwatchFields(h.fields, h.group)), wrapErr(dcgm.FieldGroupDestroy(h.fields)),
		wrapErr(dcgm.DestroyGroup(h.group)))
}

func (d *goDCGM) Latest(entities []entity, fields []uint16) ([]value, error) {
	pairs := make([]dcgm.GroupEntityPair, len(entities))
	for i, e := range entities {
		pairs[i] = dcgm.GroupEntityPair{EntityGroupId: entityGroup(e), EntityId: e.ID}
	}
	values, err := dcgm.EntitiesGetLatestValues(pairs, shorts(fields), 0)
	if err != nil {
		return nil, wrapErr(err)
	}
	out := make([]value, 0, len(values))
	for _, v := range values {
		dv := value{
			Entity: entity{MIG: v.EntityGroupId == dcgm.FE_GPU_I, ID: v.EntityID},
			Field:  uint16(v.FieldID),
			TS:     v.TS,
			Status: v.Status,
			Blank:  v.Status != 0,
		}
		switch v.FieldType {
		case dcgm.DCGM_FT_INT64:
			n := v.Int64()
			dv.Value, dv.Blank = float64(n), dv.Blank || n >= dcgm.DCGM_FT_INT32_BLANK && n <= dcgm.DCGM_FT_INT32_NOT_PERMISSIONED ||
				n >= dcgm.DCGM_FT_INT64_BLANK
		case dcgm.DCGM_FT_DOUBLE:
			f := v.Float64()
			dv.Value, dv.Blank = f, dv.Blank || f >= dcgm.DCGM_FT_FP64_BLANK
		default:
			dv.Blank = true
		}
		out = append(out, dv)
	}
	return out, nil
}

func (d *goDCGM) GPUStatus(gpu uint) gpuStatus {
	st := dcgm.GetGPUStatus(gpu)
	return gpuStatus{Lost: st == dcgm.EntityStatusLost, Name: st.String()}
}

// Shutdown destroys the watches (which fails harmlessly on a connection already gone)
// and disconnects.
func (d *goDCGM) Shutdown() error {
	for w, h := range d.watches {
		_ = d.destroy(h)
		delete(d.watches, w)
	}
	return wrapErr(dcgm.Shutdown())
}

func entityGroup(e entity) dcgm.Field_Entity_Group {
	if e.MIG {
		return dcgm.FE_GPU_I
	}
	return dcgm.FE_GPU
}

func shorts(fields []uint16) []dcgm.Short {
	out := make([]dcgm.Short, len(fields))
	for i, f := range fields {
		out[i] = dcgm.Short(f)
	}
	return out
}
