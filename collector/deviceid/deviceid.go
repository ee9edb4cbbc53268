// Package deviceid reads the device ids that the kubelet reports for GPUs, in every form a
// GPU device plugin or DRA driver gives them, and says which GPU or MIG instance each
// names. It is a pure parser: no I/O, no state. The collector uses it to match the
// kubelet's view (pod-resources) to the GPUs its source measured.
//
// The forms, each from the upstream code that makes it:
//
//   - "GPU-<uuid>": a whole GPU, by the UUID NVML gives it (NVIDIA/k8s-device-plugin
//     internal/rm/devices.go BuildDevice: dev.ID = uuid).
//   - "MIG-<uuid>": a MIG device, by its opaque MIG UUID (drivers ≥ 470).
//   - "MIG-GPU-<uuid>/<gi>/<ci>": a MIG device in the legacy form, by its GPU's UUID and
//     its GPU and compute instance ids (k8s-device-plugin api/config/v1/replicas.go
//     IsMigUUID; internal/rm/health.go parseMigDeviceUUID).
//   - "<any of the above>::<n>": replica n of a device shared by time-slicing or MPS
//     (k8s-device-plugin internal/rm/devices.go NewAnnotatedID: "%s::%d").
//   - "nvidia<minor>", "nvidia<minor>/gi<gi>", each optionally followed by "/vgpu<n>": GKE's
//     device plugin, naming a GPU by its minor number (/dev/nvidia<minor>), a MIG
//     partition by its GPU instance id, and a shared replica
//     (GoogleCloudPlatform/container-engine-accelerators pkg/gpu/nvidia/manager.go
//     discoverGPUs and ListDevices, mig/mig.go DiscoverAndMountMIGDevices,
//     gpusharing/gpusharing.go isVirtualDeviceIDForMIGMode).
//   - DRA: driver "gpu.nvidia.com", device "gpu-<minor>" for a whole GPU, and
//     "gpu-<minor>-mig-…" for a MIG device named by its placement, which no GPU source
//     reports, so it parses as a MIG device of that GPU with an unknown instance
//     (NVIDIA/k8s-dra-driver-gpu cmd/gpu-kubelet-plugin/deviceinfo.go CanonicalName,
//     mig.go MigSpecTuple.ToCanonicalName).
package deviceid

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// Kind says how a Ref names its device.
type Kind uint8

const (
	// GPUUUID names a whole GPU by its "GPU-…" UUID (Ref.UUID).
	GPUUUID Kind = iota + 1
	// MIGUUID names a MIG device by its opaque "MIG-…" UUID (Ref.UUID).
	MIGUUID
	// MIGInstance names a MIG device by its GPU's UUID (Ref.UUID) and its GPU and compute
	// instance ids (Ref.GI, Ref.CI): the legacy device-plugin form.
	MIGInstance
	// Minor names a whole GPU by its minor number (Ref.Minor): GKE and DRA.
	Minor
	// MinorGI names a MIG device by its GPU's minor number (Ref.Minor) and its GPU
	// instance id (Ref.GI): GKE.
	MinorGI
	// MinorMIGPlacement names a MIG device of the GPU with minor number Ref.Minor by its
	// placement, which GPU sources do not report: it cannot be matched to a sample.
	MinorMIGPlacement
)

var kindNames = [...]string{
	GPUUUID: "GPU UUID", MIGUUID: "MIG device UUID", MIGInstance: "MIG instance of a GPU UUID",
	Minor: "GPU minor number", MinorGI: "MIG instance of a GPU minor number", MinorMIGPlacement: "MIG placement of a GPU minor number",
}

func (k Kind) String() string {
	if int(k) < len(kindNames) && kindNames[k] != "" {
		return kindNames[k]
	}
	return "Kind(" + strconv.Itoa(int(k)) + ")"
}

// Ref is what a device id says of its device.
type Ref struct {
	Kind Kind
	// UUID is the GPU UUID (GPUUUID, MIGInstance) or the MIG device UUID (MIGUUID).
	UUID string
	// Minor is the GPU's minor number (Minor, MinorGI, MinorMIGPlacement).
	Minor uint32
	// GI and CI are the GPU and compute instance ids (MIGInstance; GI also for MinorGI).
	GI, CI uint32
	// Replica is the replica's number on a shared device, or -1 when the id names the
	// device itself. A device offered as replicas may be used by several pods at once.
	Replica int
}

// Shared reports whether the id names one replica of a shared device.
func (r Ref) Shared() bool { return r.Replica >= 0 }

// MIG reports whether the id names a MIG device rather than a whole GPU.
func (r Ref) MIG() bool {
	return r.Kind == MIGUUID || r.Kind == MIGInstance || r.Kind == MinorGI || r.Kind == MinorMIGPlacement
}

// ErrUnknownForm reports a device id in no form this package knows.
var ErrUnknownForm = errors.New("device id in no known form")

// maxID bounds what Parse reads: real ids are under 100 bytes.
const maxID = 256

// Parse reads a device id as the kubelet reports it for a device-plugin resource.
func Parse(id string) (Ref, error) {
	if len(id) > maxID {
		return Ref{}, fmt.Errorf("%w: %d bytes, more than %d", ErrUnknownForm, len(id), maxID)
	}
	base, replica, err := cutReplica(id)
	if err != nil {
		return Ref{}, err
	}
	var r Ref
	switch {
	case strings.HasPrefix(base, "MIG-GPU-"):
		r, err = parseLegacyMIG(base)
	case strings.HasPrefix(base, "MIG-"):
		if !isUUIDBody(base[len("MIG-"):]) {
			return Ref{}, fmt.Errorf("%w: %q: MIG- is not followed by a UUID", ErrUnknownForm, id)
		}
		r = Ref{Kind: MIGUUID, UUID: base, Replica: -1}
	case strings.HasPrefix(base, "GPU-"):
		if !isUUIDBody(base[len("GPU-"):]) {
			return Ref{}, fmt.Errorf("%w: %q: GPU- is not followed by a UUID", ErrUnknownForm, id)
		}
		r = Ref{Kind: GPUUUID, UUID: base, Replica: -1}
	case strings.HasPrefix(base, "nvidia"):
		r, err = parseGKE(base)
	default:
		return Ref{}, fmt.Errorf("%w: %q (want GPU-<uuid>, MIG-<uuid>, MIG-GPU-<uuid>/<gi>/<ci>, nvidia<N>[/gi<M>], each optionally a replica)", ErrUnknownForm, id)
	}
	if err != nil {
		return Ref{}, fmt.Errorf("%w: %q: %w", ErrUnknownForm, id, err)
	}
	if replica >= 0 {
		if r.Replica >= 0 {
			return Ref{}, fmt.Errorf("%w: %q: a replica of a replica", ErrUnknownForm, id)
		}
		r.Replica = replica
	}
	return r, nil
}

// cutReplica splits NVIDIA's "<id>::<n>" replica suffix off id; replica is -1 without one.
func cutReplica(id string) (base string, replica int, err error) {
	base, n, ok := strings.Cut(id, "::")
	if !ok {
		return id, -1, nil
	}
	replica, ok = number(n)
	if !ok || base == "" {
		return "", 0, fmt.Errorf("%w: %q: want <id>::<replica number>", ErrUnknownForm, id)
	}
	return base, replica, nil
}

// parseLegacyMIG reads "MIG-GPU-<uuid>/<gi>/<ci>".
func parseLegacyMIG(s string) (Ref, error) {
	parts := strings.Split(strings.TrimPrefix(s, "MIG-"), "/")
	if len(parts) != 3 || !isUUIDBody(strings.TrimPrefix(parts[0], "GPU-")) {
		return Ref{}, errors.New("want MIG-GPU-<uuid>/<gi>/<ci>")
	}
	gi, ok1 := number(parts[1])
	ci, ok2 := number(parts[2])
	if !ok1 || !ok2 {
		return Ref{}, errors.New("want MIG-GPU-<uuid>/<gi>/<ci> with numeric instance ids")
	}
	return Ref{Kind: MIGInstance, UUID: parts[0], GI: uint32(gi), CI: uint32(ci), Replica: -1}, nil
}

// parseGKE reads "nvidia<minor>", "nvidia<minor>/gi<gi>", either followed by "/vgpu<n>".
func parseGKE(s string) (Ref, error) {
	parts := strings.Split(s, "/")
	r := Ref{Kind: Minor, Replica: -1}
	minor, ok := number(strings.TrimPrefix(parts[0], "nvidia"))
	if !ok {
		return Ref{}, errors.New("want nvidia<minor number>")
	}
	r.Minor = uint32(minor)
	rest := parts[1:]
	if len(rest) > 0 {
		if gi, ok := strings.CutPrefix(rest[0], "gi"); ok {
			n, ok := number(gi)
			if !ok {
				return Ref{}, errors.New("want nvidia<minor>/gi<GPU instance id>")
			}
			r.Kind, r.GI = MinorGI, uint32(n)
			rest = rest[1:]
		}
	}
	if len(rest) > 0 {
		v, ok := strings.CutPrefix(rest[0], "vgpu")
		n, okN := number(v)
		if !ok || !okN {
			return Ref{}, fmt.Errorf("unexpected %q after nvidia<minor>[/gi<id>]: want /vgpu<n>", rest[0])
		}
		r.Replica = n
		rest = rest[1:]
	}
	if len(rest) > 0 {
		return Ref{}, fmt.Errorf("unexpected %q at the end", strings.Join(rest, "/"))
	}
	return r, nil
}

// NVIDIADRADriver is the name NVIDIA's DRA driver for GPUs publishes its devices under.
const NVIDIADRADriver = "gpu.nvidia.com"

// ErrUnknownDriver reports a DRA device of a driver this package does not know.
var ErrUnknownDriver = errors.New("DRA driver not known")

// ParseDRA reads a device that a DRA driver allocated to a claim, as the kubelet's
// pod-resources API reports it (ClaimResource: driver, pool and device name).
func ParseDRA(driver, device string) (Ref, error) {
	if driver != NVIDIADRADriver {
		return Ref{}, fmt.Errorf("%w: %q (only %s's devices are read)", ErrUnknownDriver, driver, NVIDIADRADriver)
	}
	if len(device) > maxID {
		return Ref{}, fmt.Errorf("%w: DRA device of %d bytes, more than %d", ErrUnknownForm, len(device), maxID)
	}
	rest, ok := strings.CutPrefix(device, "gpu-")
	if !ok {
		return Ref{}, fmt.Errorf("%w: DRA device %q of %s (want gpu-<minor> or gpu-<minor>-mig-…)", ErrUnknownForm, device, driver)
	}
	minorText, mig, isMIG := strings.Cut(rest, "-mig-")
	minor, ok := number(minorText)
	if !ok || (isMIG && mig == "") {
		return Ref{}, fmt.Errorf("%w: DRA device %q of %s (want gpu-<minor> or gpu-<minor>-mig-…)", ErrUnknownForm, device, driver)
	}
	r := Ref{Kind: Minor, Minor: uint32(minor), Replica: -1}
	if isMIG {
		r.Kind = MinorMIGPlacement
	}
	return r, nil
}

// number reads a decimal number of at most 9 digits, without sign or leading zeros.
func number(s string) (int, bool) {
	if s == "" || len(s) > 9 || (len(s) > 1 && s[0] == '0') {
		return 0, false
	}
	n := 0
	for _, c := range []byte(s) {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int(c-'0')
	}
	return n, true
}

// isUUIDBody reports whether s can be the part of an NVIDIA UUID after "GPU-" or "MIG-":
// letters, digits and dashes, starting and ending with a letter or digit. NVML documents
// the UUID as an opaque string (real ones are hex in 8-4-4-4-12 groups), so the grouping
// is not checked; what is refused is what no UUID holds: '/', ':', space, ….
func isUUIDBody(s string) bool {
	if s == "" || s[0] == '-' || s[len(s)-1] == '-' {
		return false
	}
	for _, c := range []byte(s) {
		switch {
		case c >= '0' && c <= '9', c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c == '-':
		default:
			return false
		}
	}
	return true
}
