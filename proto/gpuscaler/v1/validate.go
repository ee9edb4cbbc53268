package gpuscalerv1

import (
	"errors"
	"fmt"
	"math"
)

// ErrInvalidEvent reports an event that decodes but breaks the contract.
var ErrInvalidEvent = errors.New("invalid event")

// Validate reports whether r is a well-formed NodeReport: a valid node name, and per
// device a UUID, percentages within 0–100, finite readings, framebuffer used no larger
// than total, device ids unique, and a namespace and name on every attributed pod. A
// receiver drops a report that fails, whole: half a node's GPUs would be a false picture.
func (r *NodeReport) Validate() error {
	if err := ValidateNodeName(r.GetNode()); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidEvent, err)
	}
	seen := make(map[string]struct{}, len(r.GetGpus()))
	for i, g := range r.GetGpus() {
		if err := g.validate(); err != nil {
			return fmt.Errorf("%w: node %s: gpus[%d]: %w", ErrInvalidEvent, r.GetNode(), i, err)
		}
		id := g.DeviceID()
		if _, dup := seen[id]; dup {
			return fmt.Errorf("%w: node %s: gpus[%d]: device %s appears twice", ErrInvalidEvent, r.GetNode(), i, id)
		}
		seen[id] = struct{}{}
	}
	for _, list := range []struct {
		name    string
		devices []*Device
	}{{"allocatable", r.GetAllocatable()}, {"allocated", r.GetAllocated()}} {
		clear(seen)
		for i, d := range list.devices {
			if d.GetId() == "" || d.GetResource() == "" {
				return fmt.Errorf("%w: node %s: %s[%d]: device id and resource are required", ErrInvalidEvent, r.GetNode(), list.name, i)
			}
			if _, dup := seen[d.GetId()]; dup {
				return fmt.Errorf("%w: node %s: %s[%d]: device %s appears twice", ErrInvalidEvent, r.GetNode(), list.name, i, d.GetId())
			}
			seen[d.GetId()] = struct{}{}
		}
	}
	return nil
}

// DeviceID returns the device plugin id of the sample's device: DeviceId, or Uuid when
// DeviceId is empty.
func (g *GPUSample) DeviceID() string {
	if id := g.GetDeviceId(); id != "" {
		return id
	}
	return g.GetUuid()
}

func (g *GPUSample) validate() error {
	if g.GetUuid() == "" {
		return errors.New("uuid is required")
	}
	for _, p := range []struct {
		name string
		v    *float64
	}{{"gpu_util", g.GpuUtil}, {"sm_active", g.SmActive}, {"tensor_active", g.TensorActive}} {
		if p.v != nil && !(*p.v >= 0 && *p.v <= 100) { // also false for NaN
			return fmt.Errorf("%s %v is outside 0–100", p.name, *p.v)
		}
	}
	for _, p := range []struct {
		name string
		v    *float64
	}{{"power_watts", g.PowerWatts}, {"temperature_celsius", g.TemperatureCelsius}} {
		if p.v != nil && (math.IsNaN(*p.v) || math.IsInf(*p.v, 0)) {
			return fmt.Errorf("%s %v is not a finite number", p.name, *p.v)
		}
	}
	if g.FbUsedBytes != nil && g.FbTotalBytes != nil && g.GetFbUsedBytes() > g.GetFbTotalBytes() {
		return fmt.Errorf("fb_used_bytes %d exceeds fb_total_bytes %d", g.GetFbUsedBytes(), g.GetFbTotalBytes())
	}
	if p := g.GetPod(); p != nil {
		if err := ValidateNamespace(p.GetNamespace()); err != nil {
			return fmt.Errorf("pod: %w", err)
		}
		if p.GetName() == "" {
			return errors.New("pod: name is required")
		}
	}
	return nil
}

// Validate reports whether r is a well-formed QueueReport: a valid namespace and queue name.
func (r *QueueReport) Validate() error {
	if err := ValidateNamespace(r.GetNamespace()); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidEvent, err)
	}
	if err := ValidateQueueName(r.GetQueue()); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidEvent, err)
	}
	return nil
}

// Backlog returns the items the queue holds: waiting plus in flight. It saturates rather
// than wrapping around.
func (r *QueueReport) Backlog() uint64 {
	b := r.GetWaiting() + r.GetInFlight()
	if b < r.GetWaiting() {
		return math.MaxUint64
	}
	return b
}
