package collector

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// Pod UIDs and container ids of the shapes the kubelet and the runtimes use.
const (
	cgUID       = "6f1f3c3a-2b1e-4c55-9a59-1d1c0e7a1b2c" // an API server pod UID (a UUID)
	cgUIDEsc    = "6f1f3c3a_2b1e_4c55_9a59_1d1c0e7a1b2c" // the same in a systemd slice name
	cgUID2      = "0b6f4a3e-93c8-4f0e-8d7c-5a3c2e1f9d80"
	cgStaticUID = "a1b2c3d4e5f60718293a4b5c6d7e8f90" // a static pod's: an MD5 hash
	cgCID       = "3d9a54b0c3e1f6a2b7c8d9e0f1a2b3c4d5e6f7a8b9c0d1e2f3a4b5c6d7e8f9a0"
)

// writeProcCgroup writes <root>/<pid>/cgroup, as a fake host /proc.
func writeProcCgroup(t *testing.T, root string, pid uint32, content string) {
	t.Helper()
	dir := filepath.Join(root, strconv.FormatUint(uint64(pid), 10))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "cgroup"), []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestCgroupPods(t *testing.T) {
	root := t.TempDir()
	writeProcCgroup(t, root, 100, "0::/kubepods/burstable/pod"+cgUID+"/"+cgCID+"\n")
	writeProcCgroup(t, root, 200, "0::/system.slice/sshd.service\n")
	writeProcCgroup(t, root, 300, "garbage\n")
	c := newCgroupPods(root)

	check := func(pid uint32, want string, wantErr error) {
		t.Helper()
		got, err := c.podOf(pid)
		switch {
		case wantErr != nil && !errors.Is(err, wantErr):
			t.Errorf("process %d: got %q, %v; want an error wrapping %v", pid, got, err, wantErr)
		case wantErr == nil && (err != nil || got != want):
			t.Errorf("process %d: got %q, %v; want %q", pid, got, err, want)
		}
	}
	check(100, cgUID, nil)
	check(200, "", errNoPod)
	check(400, "", fs.ErrNotExist) // exited, or not in this PID namespace
	if _, err := c.podOf(300); err == nil || !strings.Contains(err.Error(), "not hierarchy-ID") {
		t.Errorf("process 300: got error %v, want the parse error", err)
	}

	// Answers are remembered while the PID keeps being asked about: the file is not
	// read again (here it is gone).
	if err := os.RemoveAll(filepath.Join(root, "100")); err != nil {
		t.Fatal(err)
	}
	c.retain(map[uint32]struct{}{100: {}, 200: {}})
	check(100, cgUID, nil)
	check(200, "", errNoPod)
	if _, ok := c.known[300]; ok {
		t.Error("a PID whose cgroup could not be parsed was remembered")
	}
	// A PID missing from one round is forgotten, and read again: it may be another
	// process now.
	c.retain(map[uint32]struct{}{200: {}})
	check(100, "", fs.ErrNotExist)
	writeProcCgroup(t, root, 100, "0::/kubepods/pod"+cgUID2+"/"+cgCID+"\n")
	check(100, cgUID2, nil)

	if got := newCgroupPods("").root; got != "/proc" {
		t.Errorf("default proc root: got %q, want /proc", got)
	}
}
