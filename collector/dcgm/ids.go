//go:build cgo

package dcgm

import (
	"errors"
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpuscaler/gpuscaler/collector/mig"
	nvmlsource "github.com/gpuscaler/gpuscaler/collector/nvml"
)

// identifier learns what DCGM does not say of the node's devices: each MIG device's
// "MIG-<uuid>" UUID, the kubelet's id for it (go-dcgm's MigEntityInfo carries only the
// parent GPU's UUID and the GPU and compute instance ids), its profile's name as the
// device plugin spells it, and each GPU's minor number.
// The DCGM source asks it at every discovery. It is called from one goroutine.
type identifier interface {
	// Identify reads the identities of gpus. It returns what it could learn even when it
	// fails for some devices; the error says what it could not.
	Identify(gpus []identifyGPU) (identities, error)
	// Close releases what Identify started.
	Close() error
}

// identifyGPU is a GPU to identify: its UUID, and whether DCGM lists MIG instances
// on it (only then are its MIG devices walked).
type identifyGPU struct {
	UUID string
	MIG  bool
}

// migKey names a MIG device by its parent GPU's UUID and its GPU and compute
// instance ids, which NVML and DCGM both give.
type migKey struct {
	GPU    string
	GI, CI uint
}

// identities is what a identifier learnt.
type identities struct {
	Minor map[string]uint32 // by GPU UUID
	MIG   map[migKey]migIdentity
}

// migIdentity is what NVML says of a MIG device.
type migIdentity struct {
	UUID string // "MIG-…"
	// Profile is its profile's name as the NVML source gives it (mig.ProfileOf, the
	// device plugin's spelling: "1g.18gb+me"); "" when NVML could not tell.
	Profile string
}

// mig returns what NVML said of the MIG device of GPU instance gi on gpu: the one of
// compute instance ci when ci is known, else the only MIG device of that GPU instance.
func (ids identities) mig(gpu string, gi uint, ci uint, ciKnown bool) (migIdentity, bool) {
	if ciKnown {
		m, ok := ids.MIG[migKey{GPU: gpu, GI: gi, CI: ci}]
		return m, ok
	}
	var found migIdentity
	for k, m := range ids.MIG {
		if k.GPU == gpu && k.GI == gi {
			if found.UUID != "" {
				return migIdentity{}, false // several compute instances: ambiguous
			}
			found = m
		}
	}
	return found, found.UUID != ""
}

// nvmlIdentifier is a identifier over NVML (go-nvml), as the NVML source walks MIG
// devices (nvml.go appendMIGSamples). NVML is started on the first Identify and again
// after a failed start, so a node whose libnvidia-ml.so.1 appears late still gets ids.
type nvmlIdentifier struct {
	lib     nvml.Interface
	started bool
}

func newNVMLIdentifier(lib nvml.Interface) *nvmlIdentifier { return &nvmlIdentifier{lib: lib} }

func (n *nvmlIdentifier) Identify(gpus []identifyGPU) (identities, error) {
	ids := identities{Minor: map[string]uint32{}, MIG: map[migKey]migIdentity{}}
	if !n.started {
		if ret := n.lib.Init(); ret != nvml.SUCCESS {
			return ids, fmt.Errorf("NVML Init: %w: %s", ret, nvmlsource.InitHint(ret))
		}
		n.started = true
	}
	var errs []error
	for _, g := range gpus {
		dev, ret := n.lib.DeviceGetHandleByUUID(g.UUID)
		if ret != nvml.SUCCESS {
			errs = append(errs, fmt.Errorf("NVML: GPU %s: get handle: %w", g.UUID, ret))
			continue
		}
		if minor, ret := dev.GetMinorNumber(); ret == nvml.SUCCESS && minor >= 0 {
			ids.Minor[g.UUID] = uint32(minor)
		}
		if g.MIG {
			if err := identifyMIGs(dev, g.UUID, ids.MIG); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return ids, errors.Join(errs...)
}

// identifyMIGs records the UUID and profile of every MIG device of the GPU dev, by its
// GPU and compute instance ids. The profile is named as the NVML source names it: DCGM
// gives only a GPU instance's slices and memory, and the device plugin's name cannot
// be made from those alone (an H200's 1g.18gb slice has 16384 MiB: the name rounds the
// slice's share of the whole GPU, which DCGM does not give with it).
func identifyMIGs(dev nvml.Device, gpuUUID string, into map[migKey]migIdentity) error {
	slots, ret := dev.GetMaxMigDeviceCount()
	if ret != nvml.SUCCESS {
		return fmt.Errorf("NVML: GPU %s: count MIG devices: %w", gpuUUID, ret)
	}
	var errs []error
	for j := range slots {
		migDev, ret := dev.GetMigDeviceHandleByIndex(j)
		if ret == nvml.ERROR_NOT_FOUND {
			continue // an empty slot
		}
		if ret != nvml.SUCCESS {
			errs = append(errs, fmt.Errorf("NVML: GPU %s: MIG device %d: get handle: %w", gpuUUID, j, ret))
			continue
		}
		gi, ret := migDev.GetGpuInstanceId()
		if ret != nvml.SUCCESS || gi < 0 {
			errs = append(errs, fmt.Errorf("NVML: GPU %s: MIG device %d: GPU instance id: %w", gpuUUID, j, ret))
			continue
		}
		ci, ret := migDev.GetComputeInstanceId()
		if ret != nvml.SUCCESS || ci < 0 {
			errs = append(errs, fmt.Errorf("NVML: GPU %s: MIG device %d: compute instance id: %w", gpuUUID, j, ret))
			continue
		}
		uuid, ret := migDev.GetUUID()
		if ret != nvml.SUCCESS {
			errs = append(errs, fmt.Errorf("NVML: GPU %s: MIG device %d: UUID: %w", gpuUUID, j, ret))
			continue
		}
		into[migKey{GPU: gpuUUID, GI: uint(gi), CI: uint(ci)}] = migIdentity{
			UUID: uuid, Profile: mig.ProfileOf(dev, migDev, gi, true),
		}
	}
	return errors.Join(errs...)
}

func (n *nvmlIdentifier) Close() error {
	if !n.started {
		return nil
	}
	n.started = false
	if ret := n.lib.Shutdown(); ret != nvml.SUCCESS {
		return fmt.Errorf("NVML Shutdown: %w", ret)
	}
	return nil
}

// legacyMIGID is the device plugin's legacy id of a MIG device,
// "MIG-<parent GPU UUID>/<gi>/<ci>" (NVIDIA/k8s-device-plugin api/config/v1/replicas.go,
// IsMigUUID, which accepts both forms): the id the source gives a MIG device whose UUID
// NVML could not tell. It is unique on the node, so the NodeReport stays valid, and it
// names the same device as the modern "MIG-<uuid>" form does.
func legacyMIGID(gpuUUID string, gi, ci uint) string {
	return fmt.Sprintf("MIG-%s/%d/%d", gpuUUID, gi, ci)
}
