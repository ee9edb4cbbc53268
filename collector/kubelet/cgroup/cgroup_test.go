package cgroup

import (
	"strings"
	"testing"

	"github.com/gpuscaler/gpuscaler/collector/internal/collectortest"
)

// Pod UIDs and container ids of the shapes the kubelet and the runtimes use.
const (
	cgUID       = collectortest.PodUID
	cgUIDEsc    = collectortest.PodUIDEscaped
	cgUID2      = collectortest.PodUID2
	cgStaticUID = collectortest.StaticPodUID
	cgCID       = collectortest.ContainerID
)

// TestPodUID reads /proc/<pid>/cgroup files as the kernel writes them
// ("hierarchy-ID:controller-list:cgroup-path", man 7 cgroups; paths relative to the
// reader's cgroup namespace, man 7 cgroup_namespaces) for the cgroups the kubelet
// makes: kubernetes pkg/kubelet/cm/pod_container_manager_linux.go (GetPodContainerName:
// "pod"+UID under the QoS cgroup), qos_container_manager_linux.go (burstable and
// besteffort under kubepods, Guaranteed pods directly in it) and
// cgroup_manager_linux.go (CgroupName.ToSystemd: components joined by "-" into
// ".slice" names, each component's "-" escaped as "_"). Container scopes are
// containerd's "cri-containerd-<id>.scope" and CRI-O's "crio-<id>.scope" (and its
// monitor's "crio-conmon-<id>.scope"); with the cgroupfs driver the container cgroup is
// the bare container id.
func TestPodUID(t *testing.T) {
	tests := map[string]struct {
		content string
		want    string
		wantErr string
	}{
		"v2, systemd driver, containerd, burstable": {
			content: "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + cgUIDEsc + ".slice/cri-containerd-" + cgCID + ".scope\n",
			want:    cgUID,
		},
		"v2, systemd driver, besteffort": {
			content: "0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod" + cgUIDEsc + ".slice/cri-containerd-" + cgCID + ".scope\n",
			want:    cgUID,
		},
		"v2, systemd driver, guaranteed (no QoS level)": {
			content: "0::/kubepods.slice/kubepods-pod" + cgUIDEsc + ".slice/cri-containerd-" + cgCID + ".scope\n",
			want:    cgUID,
		},
		"v2, cgroupfs driver, burstable": {
			content: "0::/kubepods/burstable/pod" + cgUID + "/" + cgCID + "\n",
			want:    cgUID,
		},
		"v2, cgroupfs driver, guaranteed": {
			content: "0::/kubepods/pod" + cgUID + "/" + cgCID + "\n",
			want:    cgUID,
		},
		"v2, CRI-O": {
			content: "0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod" + cgUIDEsc + ".slice/crio-" + cgCID + ".scope\n",
			want:    cgUID,
		},
		"v2, CRI-O's conmon": {
			content: "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + cgUIDEsc + ".slice/crio-conmon-" + cgCID + ".scope\n",
			want:    cgUID,
		},
		"v2, a container's own sub-cgroup": {
			content: "0::/kubepods/burstable/pod" + cgUID + "/" + cgCID + "/init.scope\n",
			want:    cgUID,
		},
		"v2, read from another pod's cgroup namespace, systemd driver": {
			content: "0::/../../../kubepods-besteffort.slice/kubepods-besteffort-pod" + cgUIDEsc + ".slice/cri-containerd-" + cgCID + ".scope\n",
			want:    cgUID,
		},
		"v2, read from another pod's cgroup namespace, cgroupfs driver": {
			content: "0::/../../besteffort/pod" + cgUID + "/" + cgCID + "\n",
			want:    cgUID,
		},
		"v2, kubelet --cgroup-root below another cgroup": {
			content: "0::/k8s/kubepods/burstable/pod" + cgUID + "/" + cgCID + "\n",
			want:    cgUID,
		},
		"v2, static pod": {
			content: "0::/kubepods/besteffort/pod" + cgStaticUID + "/" + cgCID + "\n",
			want:    cgStaticUID,
		},
		"v1, cgroupfs driver, several controllers": {
			content: "12:memory:/kubepods/besteffort/pod" + cgUID + "/" + cgCID + "\n" +
				"11:cpu,cpuacct:/kubepods/besteffort/pod" + cgUID + "/" + cgCID + "\n" +
				"10:devices:/kubepods/besteffort/pod" + cgUID + "/" + cgCID + "\n" +
				"9:rdma:/\n" +
				"8:pids:/kubepods/besteffort/pod" + cgUID + "/" + cgCID + "\n" +
				"1:name=systemd:/kubepods/besteffort/pod" + cgUID + "/" + cgCID + "\n" +
				"0::/\n",
			want: cgUID,
		},
		"v1, systemd driver, docker": {
			content: "11:devices:/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod" + cgUIDEsc + ".slice/docker-" + cgCID + ".scope\n" +
				"4:memory:/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod" + cgUIDEsc + ".slice/docker-" + cgCID + ".scope\n" +
				"1:name=systemd:/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod" + cgUIDEsc + ".slice/docker-" + cgCID + ".scope\n",
			want: cgUID,
		},
		"no trailing newline": {
			content: "0::/kubepods/pod" + cgUID + "/" + cgCID,
			want:    cgUID,
		},
		"host process, v2":   {content: "0::/system.slice/nvidia-persistenced.service\n"},
		"host process, init": {content: "0::/init.scope\n"},
		"host process, a user session": {
			content: "0::/user.slice/user-1000.slice/session-3.scope\n",
		},
		"host process, v1": {
			content: "12:memory:/user.slice\n11:cpu,cpuacct:/user.slice\n1:name=systemd:/user.slice/user-1000.slice/session-3.scope\n0::/user.slice/user-1000.slice/session-3.scope\n",
		},
		"the root cgroup":                  {content: "0::/\n"},
		"podman, not Kubernetes":           {content: "0::/machine.slice/libpod-" + cgCID + ".scope\n"},
		"a pod-like name outside kubepods": {content: "0::/pod" + cgUID + "/" + cgCID + "\n"},
		"a pod slice outside kubepods":     {content: "0::/machine.slice/machine-pod" + cgUIDEsc + ".slice\n"},
		"not a UID after pod": {
			content: "0::/kubepods/burstable/podman/" + cgCID + "\n",
		},
		"upper-case UID": {
			content: "0::/kubepods/pod" + strings.ToUpper(cgUID) + "/" + cgCID + "\n",
		},
		"a path holding a colon": {
			content: "0::/kubepods/pod" + cgUID + "/odd:name\n",
			want:    cgUID,
		},
		"lines naming two pods": {
			content: "12:memory:/kubepods/pod" + cgUID + "/" + cgCID + "\n0::/kubepods/pod" + cgUID2 + "/" + cgCID + "\n",
			wantErr: "two pods",
		},
		"empty":             {content: "", wantErr: "no cgroup line"},
		"blank lines":       {content: "\n\n", wantErr: "no cgroup line"},
		"not a cgroup file": {content: "Name:\tpython3\nState:\tS (sleeping)\n", wantErr: "not hierarchy-ID"},
		"no path":           {content: "0::\n", wantErr: "not hierarchy-ID"},
		"relative path":     {content: "0::kubepods/pod" + cgUID + "\n", wantErr: "not hierarchy-ID"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := PodUID(tc.content)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("got %q, error %v; want an error saying %q", got, err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("got error %v, want %q", err, tc.want)
			}
			if got != tc.want {
				t.Errorf("got pod %q, want %q", got, tc.want)
			}
		})
	}
}

// FuzzPodUID: any content gives a pod UID that is well formed and written in
// the content (as is, or with "_" for "-" in a systemd slice), no pod, or an error;
// never a panic.
func FuzzPodUID(f *testing.F) {
	for _, seed := range []string{
		"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + cgUIDEsc + ".slice/cri-containerd-" + cgCID + ".scope\n",
		"0::/kubepods/burstable/pod" + cgUID + "/" + cgCID + "\n",
		"12:memory:/kubepods/besteffort/pod" + cgUID + "/" + cgCID + "\n0::/\n",
		"0::/../../besteffort/pod" + cgUID + "/x\n",
		"0::/system.slice/containerd.service\n",
		"0::/kubepods-pod.slice\n",
		"0::/-pod" + cgUIDEsc + ".slice\n",
		"1:a:b:c\n",
		"",
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, content string) {
		got, err := PodUID(content)
		if err != nil {
			if got != "" {
				t.Fatalf("got pod %q with error %v", got, err)
			}
			return
		}
		if got == "" {
			return
		}
		if !isPodUID(got) {
			t.Fatalf("got malformed pod UID %q", got)
		}
		if !strings.Contains(content, got) && !strings.Contains(content, strings.ReplaceAll(got, "-", "_")) {
			t.Fatalf("got pod UID %q, which the content does not hold", got)
		}
		if again, err := PodUID(content); again != got || err != nil {
			t.Fatalf("second parse got %q, %v; want %q", again, err, got)
		}
	})
}
