package deviceid

import (
	"errors"
	"strings"
	"testing"
)

const (
	gpuUUID = "GPU-b1028956-cfa2-0990-bf4a-5da9abb51763"
	migUUID = "MIG-b1028956-cfa2-0990-bf4a-5da9abb51763"
)

func TestParse(t *testing.T) {
	tests := map[string]struct {
		id   string
		want Ref
	}{
		// NVIDIA/k8s-device-plugin internal/rm/devices.go BuildDevice: dev.ID = uuid.
		"whole GPU": {id: gpuUUID, want: Ref{Kind: GPUUUID, UUID: gpuUUID, Replica: -1}},
		// internal/rm/devices.go NewAnnotatedID: fmt.Sprintf("%s::%d", id, replica),
		// for time-slicing and MPS alike (api/config/v1/sharing.go ReplicatedResources).
		"time-sliced replica": {id: gpuUUID + "::3", want: Ref{Kind: GPUUUID, UUID: gpuUUID, Replica: 3}},
		"replica 0":           {id: gpuUUID + "::0", want: Ref{Kind: GPUUUID, UUID: gpuUUID, Replica: 0}},
		// api/config/v1/replicas.go IsMigUUID: "MIG-b1028956-cfa2-0990-bf4a-5da9abb51763".
		"MIG device":         {id: migUUID, want: Ref{Kind: MIGUUID, UUID: migUUID, Replica: -1}},
		"MIG device replica": {id: migUUID + "::1", want: Ref{Kind: MIGUUID, UUID: migUUID, Replica: 1}},
		// IsMigUUID's legacy form "MIG-GPU-b1028956-cfa2-0990-bf4a-5da9abb51763/3/0"
		// (internal/rm/health.go parseMigDeviceUUID).
		"legacy MIG": {id: "MIG-" + gpuUUID + "/3/0", want: Ref{Kind: MIGInstance, UUID: gpuUUID, GI: 3, CI: 0, Replica: -1}},
		"legacy MIG replica": {id: "MIG-" + gpuUUID + "/13/1::2",
			want: Ref{Kind: MIGInstance, UUID: gpuUUID, GI: 13, CI: 1, Replica: 2}},
		// GoogleCloudPlatform/container-engine-accelerators pkg/gpu/nvidia/manager.go
		// discoverGPUs: fmt.Sprintf("nvidia%d", minor).
		"GKE GPU":   {id: "nvidia0", want: Ref{Kind: Minor, Minor: 0, Replica: -1}},
		"GKE GPU 7": {id: "nvidia7", want: Ref{Kind: Minor, Minor: 7, Replica: -1}},
		// manager.go ListDevices: fmt.Sprintf("%s/vgpu%d", device.ID, i).
		"GKE shared GPU": {id: "nvidia1/vgpu4", want: Ref{Kind: Minor, Minor: 1, Replica: 4}},
		// mig/mig.go DiscoverAndMountMIGDevices: "nvidia" + gpuID + "/" + giFile.Name(),
		// the gi number being the NVML GPU instance id (health_checker.go addMigEnabledDevice).
		"GKE MIG": {id: "nvidia0/gi3", want: Ref{Kind: MinorGI, Minor: 0, GI: 3, Replica: -1}},
		// gpusharing/gpusharing.go isVirtualDeviceIDForMIGMode: "nvidia0/gi0/vgpu0".
		"GKE shared MIG": {id: "nvidia2/gi0/vgpu0", want: Ref{Kind: MinorGI, Minor: 2, GI: 0, Replica: 0}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := Parse(tc.id)
			if err != nil {
				t.Fatalf("Parse(%q) = %v", tc.id, err)
			}
			if got != tc.want {
				t.Fatalf("Parse(%q) = %+v, want %+v", tc.id, got, tc.want)
			}
			if got.Shared() != (tc.want.Replica >= 0) {
				t.Fatalf("Shared() = %v", got.Shared())
			}
		})
	}
}

func TestParseRejects(t *testing.T) {
	for _, id := range []string{
		"", "0", "1:0", // k8s-device-plugin's index strategy reaches only the container's env, never the kubelet
		"all", // WSL's single device: no GPU to name
		"GPU-", "GPU--1", "GPU-1234567-", "GPU-a/b", "GPU-a b", "MIG-", "MIG-not_a_uuid",
		"MIG-" + gpuUUID, "MIG-" + gpuUUID + "/3", "MIG-" + gpuUUID + "/a/0", "MIG-" + gpuUUID + "/3/0/1",
		gpuUUID + "::", gpuUUID + "::x", gpuUUID + "::-1", gpuUUID + "::01", "::1", gpuUUID + "::1::2",
		"nvidia", "nvidiax", "nvidia01", "nvidia0/", "nvidia0/gi", "nvidia0/gix", "nvidia0/vgpu", "nvidia0/vgpu1/vgpu2",
		"nvidia0/gi1/vgpu1/x", "nvidia0/foo", "nvidia0::1/vgpu2",
		"nvidia1234567890",
		strings.Repeat("a", maxID+1),
	} {
		if r, err := Parse(id); !errors.Is(err, ErrUnknownForm) {
			t.Errorf("Parse(%q) = %+v, %v; want ErrUnknownForm", id, r, err)
		}
	}
}

func TestParseDRA(t *testing.T) {
	tests := map[string]struct {
		driver, device string
		want           Ref
		err            error
	}{
		// NVIDIA/k8s-dra-driver-gpu cmd/gpu-kubelet-plugin/deviceinfo.go GpuInfo.CanonicalName:
		// fmt.Sprintf("gpu-%d", d.minor).
		"GPU":   {driver: "gpu.nvidia.com", device: "gpu-0", want: Ref{Kind: Minor, Replica: -1}},
		"GPU 3": {driver: "gpu.nvidia.com", device: "gpu-3", want: Ref{Kind: Minor, Minor: 3, Replica: -1}},
		// mig.go MigSpecTuple.ToCanonicalName: "gpu-%d-mig-%s-%d-%d" (parent minor, profile,
		// profile id, placement start), e.g. partitions.go's gpu-2-mig-1g24gb-19-0; v25.8.1
		// named it "gpu-%d-mig-%d-%d-%d".
		"MIG":        {driver: "gpu.nvidia.com", device: "gpu-2-mig-1g24gb-19-0", want: Ref{Kind: MinorMIGPlacement, Minor: 2, Replica: -1}},
		"MIG v25.8":  {driver: "gpu.nvidia.com", device: "gpu-1-mig-19-0-1", want: Ref{Kind: MinorMIGPlacement, Minor: 1, Replica: -1}},
		"vfio":       {driver: "gpu.nvidia.com", device: "gpu-vfio-0", err: ErrUnknownForm},
		"no minor":   {driver: "gpu.nvidia.com", device: "gpu-", err: ErrUnknownForm},
		"empty MIG":  {driver: "gpu.nvidia.com", device: "gpu-1-mig-", err: ErrUnknownForm},
		"other":      {driver: "gpu.nvidia.com", device: "nic-0", err: ErrUnknownForm},
		"not NVIDIA": {driver: "gpu.example.com", device: "gpu-0", err: ErrUnknownDriver},
		// compute-domain channels of the same driver family are no GPU.
		"compute domain": {driver: "compute-domain.nvidia.com", device: "channel-0", err: ErrUnknownDriver},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := ParseDRA(tc.driver, tc.device)
			if tc.err != nil {
				if !errors.Is(err, tc.err) {
					t.Fatalf("ParseDRA(%q, %q) = %+v, %v; want %v", tc.driver, tc.device, got, err, tc.err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("ParseDRA(%q, %q) = %+v, %v; want %+v", tc.driver, tc.device, got, err, tc.want)
			}
		})
	}
}

// FuzzParse checks that Parse never panics, that what it accepts is consistent, and that
// a parsed id re-parses to the same Ref when spelled back.
func FuzzParse(f *testing.F) {
	for _, s := range []string{gpuUUID, gpuUUID + "::2", migUUID, "MIG-" + gpuUUID + "/3/0", "nvidia0", "nvidia1/gi2/vgpu3", "nvidia0/vgpu1", "x::1", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, id string) {
		r, err := Parse(id)
		if err != nil {
			if !errors.Is(err, ErrUnknownForm) {
				t.Fatalf("Parse(%q): error %v does not wrap ErrUnknownForm", id, err)
			}
			return
		}
		if r.Kind < GPUUUID || r.Kind > MinorGI || r.Replica < -1 {
			t.Fatalf("Parse(%q) = %+v: impossible", id, r)
		}
		if again, err := Parse(spell(r)); err != nil || again != r {
			t.Fatalf("Parse(%q) = %+v, spelt %q, re-parsed %+v, %v", id, r, spell(r), again, err)
		}
	})
}

// spell writes a Ref back in its device plugin's form.
func spell(r Ref) string {
	var s string
	switch r.Kind {
	case GPUUUID, MIGUUID:
		s = r.UUID
	case MIGInstance:
		s = "MIG-" + r.UUID + "/" + itoa(r.GI) + "/" + itoa(r.CI)
	case Minor:
		s = "nvidia" + itoa(r.Minor)
	case MinorGI:
		s = "nvidia" + itoa(r.Minor) + "/gi" + itoa(r.GI)
	}
	if r.Replica >= 0 {
		if r.Kind == Minor || r.Kind == MinorGI {
			return s + "/vgpu" + itoa(uint32(r.Replica))
		}
		return s + "::" + itoa(uint32(r.Replica))
	}
	return s
}

func itoa(n uint32) string {
	if n == 0 {
		return "0"
	}
	var b []byte
	for ; n > 0; n /= 10 {
		b = append([]byte{byte('0' + n%10)}, b...)
	}
	return string(b)
}

func FuzzParseDRA(f *testing.F) {
	f.Add("gpu.nvidia.com", "gpu-0")
	f.Add("gpu.nvidia.com", "gpu-2-mig-1g24gb-19-0")
	f.Add("x", "gpu-1")
	f.Fuzz(func(t *testing.T, driver, device string) {
		r, err := ParseDRA(driver, device)
		if err != nil {
			if !errors.Is(err, ErrUnknownForm) && !errors.Is(err, ErrUnknownDriver) {
				t.Fatalf("ParseDRA(%q, %q): error %v wraps no sentinel", driver, device, err)
			}
			return
		}
		if r.Kind != Minor && r.Kind != MinorMIGPlacement {
			t.Fatalf("ParseDRA(%q, %q) = %+v", driver, device, r)
		}
	})
}
