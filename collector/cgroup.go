package collector

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"

	"github.com/gpuscaler/gpuscaler/collector/cgroup"
)

// maxCgroupFileBytes bounds what is read of one /proc/<pid>/cgroup. A real one is a
// line per cgroup v1 hierarchy (about a dozen) plus the unified one, well under 4 KiB.
const maxCgroupFileBytes = 64 << 10

// errNoPod says a process runs in no Kubernetes pod.
var errNoPod = errors.New("the process is in no pod")

// cgroupPods finds the pod of a host process through /proc/<pid>/cgroup under root
// (read by package cgroup),
// and remembers the answer for as long as the process keeps being asked about.
//
// PIDs are reused, so an answer is kept only while the PID appears in every round of
// questions (retain): a process that is still being sampled a second later is the same
// process, since the kernel hands out PIDs in increasing order up to pid_max (4194304
// on 64-bit systemd hosts) before it wraps. A PID missing from one round is asked again
// from /proc the next time it appears.
//
// It is not safe for concurrent use: its owner serialises calls.
type cgroupPods struct {
	root  string
	known map[uint32]string // pod UID by PID; "" for a process in no pod
}

func newCgroupPods(root string) *cgroupPods {
	if root == "" {
		root = "/proc"
	}
	return &cgroupPods{root: root, known: map[uint32]string{}}
}

// podOf returns the UID of the pod process pid runs in. It fails wrapping errNoPod for
// a process in no pod, and with the reason when the cgroup file cannot be read or
// parsed (the process has exited, the proc root is not the host's).
func (c *cgroupPods) podOf(pid uint32) (string, error) {
	uid, ok := c.known[pid]
	if !ok {
		var err error
		if uid, err = c.read(pid); err != nil {
			return "", err // not remembered: it may be readable next time
		}
		c.known[pid] = uid
	}
	if uid == "" {
		return "", fmt.Errorf("process %d: %w", pid, errNoPod)
	}
	return uid, nil
}

func (c *cgroupPods) read(pid uint32) (string, error) {
	path := filepath.Join(c.root, strconv.FormatUint(uint64(pid), 10), "cgroup")
	f, err := os.Open(path)
	if err != nil {
		return "", fmt.Errorf("process %d: %w", pid, err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxCgroupFileBytes))
	if err != nil {
		return "", fmt.Errorf("process %d: read %s: %w", pid, path, err)
	}
	uid, err := cgroup.PodUID(string(b))
	if err != nil {
		return "", fmt.Errorf("process %d: %s: %w", pid, path, err)
	}
	return uid, nil
}

// retain forgets every PID not in seen.
func (c *cgroupPods) retain(seen map[uint32]struct{}) {
	for pid := range c.known {
		if _, ok := seen[pid]; !ok {
			delete(c.known, pid)
		}
	}
}
