package collectors

import (
	"fmt"
	"strings"
	"time"

	"github.com/NVIDIA/go-dcgm/pkg/dcgm"
)

// goDCGM is dcgmAPI over github.com/NVIDIA/go-dcgm (cgo; libdcgm.so.4 is loaded at run
// time). It is the only code that calls go-dcgm, and it follows dcgmAPI's rule: nothing
// but Init before Init has succeeded.
type goDCGM struct {
	group  dcgm.GroupHandle
	fields dcgm.FieldHandle
	// watching says group and fields exist and must be destroyed at Shutdown.
	watching bool
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
	return err
}

func (d *goDCGM) GPUs() ([]dcgmGPU, error) {
	ids, err := dcgm.GetSupportedDevices()
	if err != nil {
		return nil, err
	}
	out := make([]dcgmGPU, 0, len(ids))
	for _, id := range ids {
		info, err := dcgm.GetDeviceInfo(id)
		if err != nil {
			return nil, fmt.Errorf("GPU %d: %w", id, err)
		}
		out = append(out, dcgmGPU{ID: id, UUID: info.UUID, Model: info.Identifiers.Model})
	}
	return out, nil
}

func (d *goDCGM) Instances() ([]dcgmInstance, error) {
	h, err := dcgm.GetGPUInstanceHierarchy()
	if err != nil {
		return nil, err
	}
	var out []dcgmInstance
	for i := uint(0); i < h.Count && i < uint(len(h.EntityList)); i++ {
		e := h.EntityList[i]
		if e.Entity.EntityGroupId != dcgm.FE_GPU_I {
			continue // compute instances share their GPU instance's figures
		}
		out = append(out, dcgmInstance{
			ID: e.Entity.EntityId, ParentGPU: e.Parent.EntityId,
			InstanceID: e.Info.NvmlInstanceId, Slices: e.Info.NvmlProfileSlices,
		})
	}
	return out, nil
}

func (d *goDCGM) Watch(entities []dcgmEntity, fields []uint16, every time.Duration) error {
	group, err := dcgm.CreateGroup(fmt.Sprintf("gpuscaler-%d", time.Now().UnixNano()))
	if err != nil {
		return err
	}
	for _, e := range entities {
		if err := dcgm.AddEntityToGroup(group, entityGroup(e), e.ID); err != nil {
			_ = dcgm.DestroyGroup(group)
			return fmt.Errorf("add %v to group: %w", e, err)
		}
	}
	fg, err := dcgm.FieldGroupCreate(fmt.Sprintf("gpuscaler-fields-%d", time.Now().UnixNano()), shorts(fields))
	if err != nil {
		_ = dcgm.DestroyGroup(group)
		return err
	}
	// Keep three periods of samples: enough for the latest value, little memory.
	if err := dcgm.WatchFieldsWithGroupEx(fg, group, every.Microseconds(), 3*every.Seconds(), 3); err != nil {
		_ = dcgm.FieldGroupDestroy(fg)
		_ = dcgm.DestroyGroup(group)
		return err
	}
	d.group, d.fields, d.watching = group, fg, true
	return nil
}

func (d *goDCGM) Latest(entities []dcgmEntity, fields []uint16) ([]dcgmValue, error) {
	pairs := make([]dcgm.GroupEntityPair, len(entities))
	for i, e := range entities {
		pairs[i] = dcgm.GroupEntityPair{EntityGroupId: entityGroup(e), EntityId: e.ID}
	}
	values, err := dcgm.EntitiesGetLatestValues(pairs, shorts(fields), 0)
	if err != nil {
		return nil, err
	}
	out := make([]dcgmValue, 0, len(values))
	for _, v := range values {
		dv := dcgmValue{
			Entity: dcgmEntity{MIG: v.EntityGroupId == dcgm.FE_GPU_I, ID: v.EntityID},
			Field:  uint16(v.FieldID),
			TS:     v.TS,
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

func (d *goDCGM) Shutdown() error {
	if d.watching {
		_ = dcgm.FieldGroupDestroy(d.fields)
		_ = dcgm.DestroyGroup(d.group)
		d.watching = false
	}
	return dcgm.Shutdown()
}

func entityGroup(e dcgmEntity) dcgm.Field_Entity_Group {
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
