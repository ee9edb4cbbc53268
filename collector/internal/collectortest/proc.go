package collectortest

import (
	"os"
	"path/filepath"
	"strconv"
	"testing"
)

// WriteProcCgroup writes <root>/<pid>/cgroup, as a fake host /proc.
func WriteProcCgroup(t *testing.T, root string, pid uint32, content string) {
	t.Helper()
	dir := filepath.Join(root, strconv.FormatUint(uint64(pid), 10))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "cgroup"), []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// Pod UIDs and container ids of the shapes the kubelet and the runtimes use, for the
// cgroup paths of pods' processes.
const (
	PodUID        = "6f1f3c3a-2b1e-4c55-9a59-1d1c0e7a1b2c" // an API server pod UID (a UUID)
	PodUIDEscaped = "6f1f3c3a_2b1e_4c55_9a59_1d1c0e7a1b2c" // the same in a systemd slice name
	PodUID2       = "0b6f4a3e-93c8-4f0e-8d7c-5a3c2e1f9d80"
	StaticPodUID  = "a1b2c3d4e5f60718293a4b5c6d7e8f90" // a static pod's: an MD5 hash
	ContainerID   = "3d9a54b0c3e1f6a2b7c8d9e0f1a2b3c4d5e6f7a8b9c0d1e2f3a4b5c6d7e8f9a0"
)
