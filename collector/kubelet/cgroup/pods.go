package cgroup

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
)

// maxFileBytes bounds what is read of one /proc/<pid>/cgroup. A real one is a
// line per cgroup v1 hierarchy (about a dozen) plus the unified one, well under 4 KiB.
const maxFileBytes = 64 << 10

// ErrNoPod says a process runs in no Kubernetes pod.
var ErrNoPod = errors.New("the process is in no pod")

// Pods finds the pod of a host process through /proc/<pid>/cgroup under root (read by
// PodUID), and remembers the answer for as long as the process keeps being asked about.
//
// PIDs are reused, so an answer is kept only while the PID appears in every round of
// questions (Retain): a process that is still being sampled a second later is the same
// process, since the kernel hands out PIDs in increasing order up to pid_max (4194304
// on 64-bit systemd hosts) before it wraps. A PID missing from one round is asked again
// from /proc the next time it appears.
//
// It is not safe for concurrent use: its owner serialises calls.
type Pods struct {
	root  string
	known map[uint32]string // pod UID by PID; "" for a process in no pod
}

func NewPods(root string) *Pods {
	if root == "" {
		root = "/proc"
	}
	return &Pods{root: root, known: map[uint32]string{}}
}

// PodOf returns the UID of the pod process pid runs in. It fails wrapping ErrNoPod for
// a process in no pod, and with the reason when the cgroup file cannot be read or
// parsed (the process has exited, the proc root is not the host's).
func (c *Pods) PodOf(pid uint32) (string, error) {
	uid, ok := c.known[pid]
	if !ok {
		var err error
		if uid, err = c.read(pid); err != nil {
			return "", err // not remembered: it may be readable next time
		}
		c.known[pid] = uid
	}
	if uid == "" {
		return "", fmt.Errorf("process %d: %w", pid, ErrNoPod)
	}
	return uid, nil
}

func (c *Pods) read(pid uint32) (string, error) {
	path := filepath.Join(c.root, strconv.FormatUint(uint64(pid), 10), "cgroup")
	f, err := os.Open(path)
	if err != nil {
		return "", fmt.Errorf("process %d: %w", pid, err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxFileBytes))
	if err != nil {
		return "", fmt.Errorf("process %d: read %s: %w", pid, path, err)
	}
	uid, err := PodUID(string(b))
	if err != nil {
		return "", fmt.Errorf("process %d: %s: %w", pid, path, err)
	}
	return uid, nil
}

// Retain forgets every PID not in seen.
func (c *Pods) Retain(seen map[uint32]struct{}) {
	for pid := range c.known {
		if _, ok := seen[pid]; !ok {
			delete(c.known, pid)
		}
	}
}
