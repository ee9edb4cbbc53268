package cgroup

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpuscaler/gpuscaler/collector/internal/collectortest"
)

func TestPods(t *testing.T) {
	root := t.TempDir()
	collectortest.WriteProcCgroup(t, root, 100, "0::/kubepods/burstable/pod"+cgUID+"/"+cgCID+"\n")
	collectortest.WriteProcCgroup(t, root, 200, "0::/system.slice/sshd.service\n")
	collectortest.WriteProcCgroup(t, root, 300, "garbage\n")
	c := NewPods(root)

	check := func(pid uint32, want string, wantErr error) {
		t.Helper()
		got, err := c.PodOf(pid)
		switch {
		case wantErr != nil && !errors.Is(err, wantErr):
			t.Errorf("process %d: got %q, %v; want an error wrapping %v", pid, got, err, wantErr)
		case wantErr == nil && (err != nil || got != want):
			t.Errorf("process %d: got %q, %v; want %q", pid, got, err, want)
		}
	}
	check(100, cgUID, nil)
	check(200, "", ErrNoPod)
	check(400, "", fs.ErrNotExist) // exited, or not in this PID namespace
	if _, err := c.PodOf(300); err == nil || !strings.Contains(err.Error(), "not hierarchy-ID") {
		t.Errorf("process 300: got error %v, want the parse error", err)
	}

	// Answers are remembered while the PID keeps being asked about: the file is not
	// read again (here it is gone).
	if err := os.RemoveAll(filepath.Join(root, "100")); err != nil {
		t.Fatal(err)
	}
	c.Retain(map[uint32]struct{}{100: {}, 200: {}})
	check(100, cgUID, nil)
	check(200, "", ErrNoPod)
	if _, ok := c.known[300]; ok {
		t.Error("a PID whose cgroup could not be parsed was remembered")
	}
	// A PID missing from one round is forgotten, and read again: it may be another
	// process now.
	c.Retain(map[uint32]struct{}{200: {}})
	check(100, "", fs.ErrNotExist)
	collectortest.WriteProcCgroup(t, root, 100, "0::/kubepods/pod"+cgUID2+"/"+cgCID+"\n")
	check(100, cgUID2, nil)

	if got := NewPods("").root; got != "/proc" {
		t.Errorf("default proc root: got %q, want /proc", got)
	}
}
