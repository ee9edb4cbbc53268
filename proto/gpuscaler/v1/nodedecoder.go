package gpuscalerv1

import (
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"unsafe"

	"github.com/planetscale/vtprotobuf/protohelpers"
	vttimestamppb "github.com/planetscale/vtprotobuf/types/known/timestamppb"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// A NodeDecoder decodes NodeReports into memory it reuses from one report to the next,
// for a reader that is done with each report before it decodes the next: the scaler's
// follower, where decoding was two thirds of a report's cost, nearly all of it
// allocation (about 200 objects for 8 GPUs: strings, label maps, the pointers behind
// optional fields).
//
// The report Decode returns, and every message, map and slice in it, is valid only
// until the next call. Its strings point into data, so data must not change while they
// are in use, and whoever keeps a string beyond that must copy it (strings.Clone).
// Unknown fields are skipped rather than kept. Otherwise the result is what UnmarshalVT
// reads from the same bytes, and a payload UnmarshalVT refuses is refused:
// FuzzNodeDecoderAgrees holds the two decoders to that.
//
// A NodeDecoder is not safe for concurrent use.
type NodeDecoder struct {
	report NodeReport
	ts     timestamppb.Timestamp
	labels map[string]string // the node's labels
	// Slots handed out in order by each call: gpus for the report's GPUs, with gpuPtrs
	// pointing at them; allocatable and allocated for its devices; pods for every pod of
	// every GPU, with podPtrs backing the GPUs' other_pods.
	gpus                   []*gpuSlot
	gpuPtrs                []*GPUSample
	allocatable, allocated []*Device
	pods                   []*podSlot
	nPods                  int
	podPtrs                []*PodRef
	others                 []int // scratch: the pod slots of one GPU's other_pods
	// scheduling and taints hold the node's scheduling state, when the report has it.
	scheduling NodeScheduling
	taints     []*Taint
	// resources holds the node's CPU and memory, when the report has them.
	resources NodeResources
}

// gpuSlot is a reused GPUSample with room for what its optional fields point to.
type gpuSlot struct {
	GPUSample
	f64 [5]float64 // gpu_util, sm_active, tensor_active, power_watts, temperature_celsius
	u64 [2]uint64  // fb_used_bytes, fb_total_bytes
	u32 [2]uint32  // mig_instance_id, minor
}

// podSlot is a reused PodRef with room for its optional gpu_util and
// cold_start_seconds, and its labels.
type podSlot struct {
	PodRef
	gpuUtil, coldStart float64
	labels             map[string]string
}

// Decode decodes a NodeReport and validates it, as Decode does for a node subject, in
// memory d reuses: see NodeDecoder for how long the result is valid. A QueueReport is
// decoded as Decode decodes it, into memory of its own.
func (d *NodeDecoder) Decode(subject string, data []byte) (Event, error) {
	s, err := parse(subject, data)
	switch {
	case err != nil:
		return Event{Subject: s}, err
	case s.Kind != KindNode:
		return decodeQueue(s, subject, data)
	}
	r, err := d.decode(data)
	return nodeEvent(s, subject, r, err)
}

// What a NodeDecoder keeps between reports at most: slots for as many GPUs and devices as
// a valid report holds, and for 4 pods per GPU, and label maps of at most MaxPodLabels
// entries (Go maps never shrink). A larger payload, which fails validation or is a
// node's rare peak, is decoded in memory dropped at the next call, so that one hostile
// message cannot make every shard hold megabytes for good.
const (
	maxKeptGPUSlots = MaxGPUs
	maxKeptDevSlots = MaxDevices
	maxKeptPodSlots = 4 * MaxGPUs
	maxKeptTaints   = MaxTaints
)

// decode reads data as a NodeReport into d's memory.
func (d *NodeDecoder) decode(data []byte) (*NodeReport, error) {
	if len(d.gpus) > maxKeptGPUSlots {
		d.gpus, d.gpuPtrs = nil, nil
	}
	if len(d.allocatable) > maxKeptDevSlots {
		d.allocatable = nil
	}
	if len(d.allocated) > maxKeptDevSlots {
		d.allocated = nil
	}
	if len(d.pods) > maxKeptPodSlots {
		d.pods, d.podPtrs = nil, nil
	}
	if len(d.taints) > maxKeptTaints {
		d.taints = nil
	}
	d.nPods, d.podPtrs = 0, d.podPtrs[:0]
	d.report.Reset()
	d.labels = emptied(d.labels)
	m := &d.report
	var nGPUs, nAllocatable, nAllocated, nTaints int
	w := wire{b: data}
	for w.more() {
		field, typ, pre, err := w.tag("NodeReport")
		if err != nil {
			return nil, err
		}
		switch field {
		case 1:
			m.Node, err = w.str(typ, "Node")
		case 2:
			var b []byte
			if b, err = w.msg(typ, "ObservedAt"); err == nil {
				if m.ObservedAt == nil {
					d.ts.Reset()
					m.ObservedAt = &d.ts
				}
				err = (*vttimestamppb.Timestamp)(m.ObservedAt).UnmarshalVT(b)
			}
		case 3:
			m.Sequence, err = w.uint(typ, "Sequence")
		case 4:
			m.CollectorId, err = w.str(typ, "CollectorId")
		case 5:
			m.Source, err = w.str(typ, "Source")
		case 6:
			if d.labels == nil {
				d.labels = make(map[string]string)
			}
			m.NodeLabels = d.labels
			err = w.mapEntry(typ, "NodeLabels", d.labels)
		case 7:
			var b []byte
			if b, err = w.msg(typ, "Allocatable"); err == nil {
				err = decodeDevice(slot(&d.allocatable, nAllocatable), b)
				nAllocatable++
			}
		case 8:
			var b []byte
			if b, err = w.msg(typ, "Allocated"); err == nil {
				err = decodeDevice(slot(&d.allocated, nAllocated), b)
				nAllocated++
			}
		case 9:
			var b []byte
			if b, err = w.msg(typ, "Gpus"); err == nil {
				if nGPUs == len(d.gpus) {
					d.gpus = append(d.gpus, new(gpuSlot))
					d.gpuPtrs = append(d.gpuPtrs, &d.gpus[nGPUs].GPUSample)
				}
				err = d.decodeGPU(d.gpus[nGPUs], b)
				nGPUs++
			}
		case 10:
			var b []byte
			if b, err = w.msg(typ, "Unattributed"); err == nil {
				// Rare: a device the collector could not match, decoded apart.
				u := new(UnattributedDevice)
				if err = u.UnmarshalVT(b); err == nil {
					m.Unattributed = append(m.Unattributed, u)
				}
			}
		case 11:
			var b []byte
			if b, err = w.msg(typ, "Scheduling"); err == nil {
				if m.Scheduling == nil {
					d.scheduling.Reset()
					nTaints = 0
					m.Scheduling = &d.scheduling
				}
				nTaints, err = d.decodeScheduling(b, nTaints)
			}
		case 12:
			var b []byte
			if b, err = w.msg(typ, "Resources"); err == nil {
				if m.Resources == nil {
					d.resources.Reset()
					m.Resources = &d.resources
				}
				// Scalars only: UnmarshalVT merges into what an earlier occurrence
				// read, as protobuf does, and allocates nothing but unknown fields.
				err = m.Resources.UnmarshalVT(b)
			}
		default:
			err = w.skip(pre)
		}
		if err != nil {
			return nil, err
		}
	}
	if m.Scheduling != nil {
		m.Scheduling.Taints = cut(d.taints, nTaints)
	}
	m.Gpus = cut(d.gpuPtrs, nGPUs)
	m.Allocatable = cut(d.allocatable, nAllocatable)
	m.Allocated = cut(d.allocated, nAllocated)
	return m, nil
}

// slot returns (*pool)[i], reset, growing the pool by one when i is its length.
func slot(pool *[]*Device, i int) *Device {
	if i == len(*pool) {
		*pool = append(*pool, new(Device))
	}
	(*pool)[i].Reset()
	return (*pool)[i]
}

// cut returns the first n of s, nil when n is 0, with no room to append over the rest.
func cut[T any](s []T, n int) []T {
	if n == 0 {
		return nil
	}
	return s[:n:n]
}

// decodeDevice decodes b into m.
func decodeDevice(m *Device, b []byte) error {
	w := wire{b: b}
	for w.more() {
		field, typ, pre, err := w.tag("Device")
		if err != nil {
			return err
		}
		switch field {
		case 1:
			m.Id, err = w.str(typ, "Id")
		case 2:
			m.Resource, err = w.str(typ, "Resource")
		case 3:
			m.MigProfile, err = w.str(typ, "MigProfile")
		case 4:
			m.Unhealthy, err = w.bool(typ, "Unhealthy")
		default:
			err = w.skip(pre)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// decodeScheduling decodes b into d.scheduling, merging with what an earlier occurrence
// of the field gave, as protobuf does: its taints continue after the n decoded so far.
// It returns the taints decoded in all.
func (d *NodeDecoder) decodeScheduling(b []byte, n int) (int, error) {
	m := &d.scheduling
	w := wire{b: b}
	for w.more() {
		field, typ, pre, err := w.tag("NodeScheduling")
		if err != nil {
			return n, err
		}
		switch field {
		case 1:
			m.Unschedulable, err = w.bool(typ, "Unschedulable")
		case 2:
			var tb []byte
			if tb, err = w.msg(typ, "Taints"); err == nil {
				if n == len(d.taints) {
					d.taints = append(d.taints, new(Taint))
				}
				t := d.taints[n]
				t.Reset()
				n++
				err = decodeTaint(t, tb)
			}
		default:
			err = w.skip(pre)
		}
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// decodeTaint decodes b into t.
func decodeTaint(t *Taint, b []byte) error {
	w := wire{b: b}
	for w.more() {
		field, typ, pre, err := w.tag("Taint")
		if err != nil {
			return err
		}
		switch field {
		case 1:
			t.Key, err = w.str(typ, "Key")
		case 2:
			t.Value, err = w.str(typ, "Value")
		case 3:
			t.Effect, err = w.str(typ, "Effect")
		default:
			err = w.skip(pre)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// decodeGPU decodes b into the GPU slot s.
func (d *NodeDecoder) decodeGPU(s *gpuSlot, b []byte) error {
	s.GPUSample.Reset()
	m := &s.GPUSample
	var pod *podSlot
	d.others = d.others[:0]
	w := wire{b: b}
	for w.more() {
		field, typ, pre, err := w.tag("GPUSample")
		if err != nil {
			return err
		}
		switch field {
		case 1:
			m.Uuid, err = w.str(typ, "Uuid")
		case 2:
			var v uint64
			v, err = w.uint(typ, "Index")
			m.Index = uint32(v)
		case 3:
			m.Model, err = w.str(typ, "Model")
		case 4:
			m.MigProfile, err = w.str(typ, "MigProfile")
		case 5:
			var v uint64
			if v, err = w.uint(typ, "MigInstanceId"); err == nil {
				s.u32[0] = uint32(v)
				m.MigInstanceId = &s.u32[0]
			}
		case 6:
			m.DeviceId, err = w.str(typ, "DeviceId")
		case 7:
			m.GpuUtil, err = w.double(typ, "GpuUtil", &s.f64[0])
		case 8:
			m.SmActive, err = w.double(typ, "SmActive", &s.f64[1])
		case 9:
			m.TensorActive, err = w.double(typ, "TensorActive", &s.f64[2])
		case 10:
			if s.u64[0], err = w.uint(typ, "FbUsedBytes"); err == nil {
				m.FbUsedBytes = &s.u64[0]
			}
		case 11:
			if s.u64[1], err = w.uint(typ, "FbTotalBytes"); err == nil {
				m.FbTotalBytes = &s.u64[1]
			}
		case 12:
			m.PowerWatts, err = w.double(typ, "PowerWatts", &s.f64[3])
		case 13:
			m.TemperatureCelsius, err = w.double(typ, "TemperatureCelsius", &s.f64[4])
		case 14:
			m.XidErrors, err = w.uint(typ, "XidErrors")
		case 15:
			var b []byte
			if b, err = w.msg(typ, "Pod"); err == nil {
				if pod == nil { // a second occurrence merges into the first, as protobuf's rules say
					pod = d.pod()
					m.Pod = &pod.PodRef
				}
				err = pod.decode(b)
			}
		case 16:
			var b []byte
			if b, err = w.msg(typ, "OtherPods"); err == nil {
				d.others = append(d.others, d.nPods)
				err = d.pod().decode(b)
			}
		case 17:
			m.Shared, err = w.bool(typ, "Shared")
		case 18:
			m.Unhealthy, err = w.str(typ, "Unhealthy")
		case 19:
			var v uint64
			v, err = w.uint(typ, "LastXid")
			m.LastXid = uint32(v)
		case 20:
			var v uint64
			if v, err = w.uint(typ, "Minor"); err == nil {
				s.u32[1] = uint32(v)
				m.Minor = &s.u32[1]
			}
		default:
			err = w.skip(pre)
		}
		if err != nil {
			return err
		}
	}
	if len(d.others) > 0 {
		start := len(d.podPtrs)
		for _, i := range d.others {
			d.podPtrs = append(d.podPtrs, &d.pods[i].PodRef)
		}
		m.OtherPods = d.podPtrs[start:len(d.podPtrs):len(d.podPtrs)]
	}
	return nil
}

// pod returns the next pod slot, reset.
func (d *NodeDecoder) pod() *podSlot {
	if d.nPods == len(d.pods) {
		d.pods = append(d.pods, new(podSlot))
	}
	s := d.pods[d.nPods]
	d.nPods++
	s.PodRef.Reset()
	s.labels = emptied(s.labels)
	return s
}

// emptied returns m emptied, or nil when it has grown past MaxPodLabels entries.
func emptied(m map[string]string) map[string]string {
	if len(m) > MaxPodLabels {
		return nil
	}
	clear(m)
	return m
}

// decode decodes b into the slot's PodRef, merging with what it holds.
func (s *podSlot) decode(b []byte) error {
	m := &s.PodRef
	w := wire{b: b}
	for w.more() {
		field, typ, pre, err := w.tag("PodRef")
		if err != nil {
			return err
		}
		switch field {
		case 1:
			m.Namespace, err = w.str(typ, "Namespace")
		case 2:
			m.Name, err = w.str(typ, "Name")
		case 3:
			m.Container, err = w.str(typ, "Container")
		case 4:
			m.Uid, err = w.str(typ, "Uid")
		case 5:
			if s.labels == nil {
				s.labels = make(map[string]string)
			}
			m.Labels = s.labels
			err = w.mapEntry(typ, "Labels", s.labels)
		case 6:
			m.OwnerKind, err = w.str(typ, "OwnerKind")
		case 7:
			m.OwnerName, err = w.str(typ, "OwnerName")
		case 8:
			m.LabelsUnknown, err = w.bool(typ, "LabelsUnknown")
		case 9:
			m.GpuUtil, err = w.double(typ, "GpuUtil", &s.gpuUtil)
		case 10:
			m.ColdStartSeconds, err = w.double(typ, "ColdStartSeconds", &s.coldStart)
		default:
			err = w.skip(pre)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// wire reads protobuf's wire format as the generated UnmarshalVT does, bound for bound
// and error for error, with strings that point into b rather than copies.
type wire struct {
	b []byte
	i int
}

func (w *wire) more() bool { return w.i < len(w.b) }

// varint reads a varint, taking at most ten bytes and keeping the low 64 bits.
func (w *wire) varint() (uint64, error) {
	var v uint64
	for shift := uint(0); ; shift += 7 {
		if shift >= 64 {
			return 0, protohelpers.ErrIntOverflow
		}
		if w.i >= len(w.b) {
			return 0, io.ErrUnexpectedEOF
		}
		c := w.b[w.i]
		w.i++
		v |= uint64(c&0x7F) << shift
		if c < 0x80 {
			return v, nil
		}
	}
}

// tag reads a field's tag: its number, its wire type, and where it began.
func (w *wire) tag(msg string) (field int32, typ int, pre int, err error) {
	pre = w.i
	v, err := w.varint()
	if err != nil {
		return 0, 0, pre, err
	}
	field, typ = int32(v>>3), int(v&7)
	if typ == 4 {
		return 0, 0, pre, fmt.Errorf("proto: %s: wiretype end group for non-group", msg)
	}
	if field <= 0 {
		return 0, 0, pre, fmt.Errorf("proto: %s: illegal tag %d (wire type %d)", msg, field, v)
	}
	return field, typ, pre, nil
}

func wrongType(typ int, name string) error {
	return fmt.Errorf("proto: wrong wireType = %d for field %s", typ, name)
}

// span reads a length and returns the bytes it covers, which must lie before end.
func (w *wire) span(end int) ([]byte, error) {
	n, err := w.varint()
	if err != nil {
		return nil, err
	}
	if int(n) < 0 {
		return nil, protohelpers.ErrInvalidLength
	}
	post := w.i + int(n)
	if post < 0 {
		return nil, protohelpers.ErrInvalidLength
	}
	if post > end {
		return nil, io.ErrUnexpectedEOF
	}
	b := w.b[w.i:post:post]
	w.i = post
	return b, nil
}

// str reads a string field, pointing into the buffer.
func (w *wire) str(typ int, name string) (string, error) {
	if typ != 2 {
		return "", wrongType(typ, name)
	}
	return w.rawStr()
}

func (w *wire) rawStr() (string, error) {
	b, err := w.span(len(w.b))
	if err != nil || len(b) == 0 {
		return "", err
	}
	return unsafe.String(&b[0], len(b)), nil
}

// msg reads an embedded message's bytes.
func (w *wire) msg(typ int, name string) ([]byte, error) {
	if typ != 2 {
		return nil, wrongType(typ, name)
	}
	return w.span(len(w.b))
}

func (w *wire) uint(typ int, name string) (uint64, error) {
	if typ != 0 {
		return 0, wrongType(typ, name)
	}
	return w.varint()
}

func (w *wire) bool(typ int, name string) (bool, error) {
	v, err := w.uint(typ, name)
	return v != 0, err
}

// double reads a double into *into and returns into.
func (w *wire) double(typ int, name string, into *float64) (*float64, error) {
	if typ != 1 {
		return nil, wrongType(typ, name)
	}
	if w.i+8 > len(w.b) {
		return nil, io.ErrUnexpectedEOF
	}
	*into = math.Float64frombits(binary.LittleEndian.Uint64(w.b[w.i:]))
	w.i += 8
	return into, nil
}

// mapEntry reads one map<string, string> entry into m. As the generated code does, it
// reads the key and value without checking their wire types, bounds them by the
// enclosing message rather than the entry, and resumes after the entry.
func (w *wire) mapEntry(typ int, name string, m map[string]string) error {
	if typ != 2 {
		return wrongType(typ, name)
	}
	entry, err := w.span(len(w.b))
	if err != nil {
		return err
	}
	post := w.i
	w.i = post - len(entry)
	var key, value string
	for w.i < post {
		pre := w.i
		v, err := w.varint()
		if err != nil {
			return err
		}
		switch int32(v >> 3) {
		case 1:
			key, err = w.rawStr()
		case 2:
			value, err = w.rawStr()
		default:
			w.i = pre
			var n int
			if n, err = protohelpers.Skip(w.b[w.i:]); err == nil {
				switch {
				case n < 0 || w.i+n < 0:
					err = protohelpers.ErrInvalidLength
				case w.i+n > post:
					err = io.ErrUnexpectedEOF
				default:
					w.i += n
				}
			}
		}
		if err != nil {
			return err
		}
	}
	m[key] = value
	w.i = post
	return nil
}

// skip passes over an unknown field that began at pre.
func (w *wire) skip(pre int) error {
	n, err := protohelpers.Skip(w.b[pre:])
	if err != nil {
		return err
	}
	if n < 0 || pre+n < 0 {
		return protohelpers.ErrInvalidLength
	}
	if pre+n > len(w.b) {
		return io.ErrUnexpectedEOF
	}
	w.i = pre + n
	return nil
}
