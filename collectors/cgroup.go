package collectors

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// maxCgroupFileBytes bounds what is read of one /proc/<pid>/cgroup. A real one is a
// line per cgroup v1 hierarchy (about a dozen) plus the unified one, well under 4 KiB.
const maxCgroupFileBytes = 64 << 10

// podUIDFromCgroup returns the UID of the Kubernetes pod a process runs in, read from
// the content of its /proc/<pid>/cgroup: "" and no error when the process is in no pod
// (a host process). It fails when the content is not a cgroup file, or when its lines
// name two different pods.
//
// Each line is "hierarchy-ID:controller-list:cgroup-path" (man 7 cgroups): one "0::"
// line on cgroup v2, one line per hierarchy on v1, both on a hybrid host. The kubelet
// puts every pod in a cgroup of its own, named from the pod's UID, under "kubepods"
// (see podUIDFromCgroupPath). A v1 host may show the pod in some hierarchies and "/" in
// others (the hybrid "0::/" line); only the lines that name a pod count.
func podUIDFromCgroup(content string) (string, error) {
	var uid string
	lines := 0
	for line := range strings.Lines(content) {
		line = strings.TrimSuffix(line, "\n")
		if line == "" {
			continue
		}
		id, rest, ok := strings.Cut(line, ":")
		if _, err := strconv.ParseUint(id, 10, 32); !ok || err != nil {
			return "", fmt.Errorf("cgroup line %.80q is not hierarchy-ID:controllers:path", line)
		}
		// The path is the rest after the second colon: it may itself hold colons.
		_, path, ok := strings.Cut(rest, ":")
		if !ok || !strings.HasPrefix(path, "/") {
			return "", fmt.Errorf("cgroup line %.80q is not hierarchy-ID:controllers:path", line)
		}
		lines++
		u := podUIDFromCgroupPath(path)
		if u == "" {
			continue
		}
		if uid != "" && u != uid {
			return "", fmt.Errorf("cgroup lines name two pods, %s and %s", uid, u)
		}
		uid = u
	}
	if lines == 0 {
		return "", errors.New("no cgroup line")
	}
	return uid, nil
}

// podUIDFromCgroupPath returns the UID of the pod whose cgroup holds path, or "".
//
// The kubelet names a pod's cgroup "pod<UID>" under kubepods, under its QoS class's
// cgroup "burstable" or "besteffort", or directly under kubepods for a Guaranteed pod
// (kubernetes pkg/kubelet/cm: pod_container_manager_linux.go GetPodContainerName and
// podCgroupNamePrefix; qos_container_manager_linux.go; node_container_manager_linux.go
// defaultNodeAllocatableCgroupName). The container runtime puts each container in a
// cgroup below it. The cgroup driver decides the spelling (cgroup_manager_linux.go):
//
//	cgroupfs: /kubepods/burstable/pod<uid>/<container id>
//	systemd:  /kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid>.slice/cri-containerd-<id>.scope
//
// where the systemd name joins every component of the path with "-" after escaping
// each component's own "-" as "_" (CgroupName.ToSystemd, escapeSystemdCgroupName), so
// the UID's dashes read as underscores.
//
// A reader in a cgroup namespace of its own (a container's, the default on cgroup v2)
// sees the paths of cgroups outside its namespace relative to its own root, starting
// with "/.." (man 7 cgroup_namespaces): "/../../../kubepods-besteffort.slice/…" or
// "/../../besteffort/pod<uid>/…". A systemd pod slice still says kubepods in its own
// name; a cgroupfs "pod<uid>" counts after a kubepods component or after "..".
//
// When several components name a pod (a kubelet nested in a pod, as kind runs it),
// the innermost wins: it is the one the process's own kubelet made.
func podUIDFromCgroupPath(path string) string {
	var uid string
	underKubepods := false
	for c := range strings.SplitSeq(path, "/") {
		switch {
		case c == "kubepods" || c == "..":
			underKubepods = true
		case strings.HasSuffix(c, ".slice"):
			if u := podUIDFromSlice(c); u != "" {
				uid = u
			}
		case underKubepods && strings.HasPrefix(c, "pod") && isPodUID(c[len("pod"):]):
			uid = c[len("pod"):]
		}
	}
	return uid
}

// podUIDFromSlice returns the pod UID a kubelet's systemd pod slice is named after
// ("kubepods-besteffort-pod<uid with _ for ->.slice"), or "".
func podUIDFromSlice(slice string) string {
	name := strings.TrimSuffix(slice, ".slice")
	i := strings.LastIndexByte(name, '-')
	if i < 0 {
		return ""
	}
	parents, last := name[:i], name[i+1:]
	if !strings.HasPrefix(last, "pod") || !sliceNameHas(parents, "kubepods") {
		return ""
	}
	uid := strings.ReplaceAll(last[len("pod"):], "_", "-")
	if !isPodUID(uid) {
		return ""
	}
	return uid
}

// sliceNameHas reports whether one of the "-"-separated tokens of s is tok.
func sliceNameHas(s, tok string) bool {
	for t := range strings.SplitSeq(s, "-") {
		if t == tok {
			return true
		}
	}
	return false
}

// isPodUID reports whether s is a pod UID as the kubelet names cgroups after: a
// lower-case UUID from the API server (8-4-4-4-12 hex digits), or the 32 hex digits of
// the MD5 hash the kubelet gives a static pod (kubernetes pkg/kubelet/config/common.go
// applyDefaults).
func isPodUID(s string) bool {
	switch len(s) {
	case 32:
		for i := range len(s) {
			if !isPodUIDDigit(s[i]) {
				return false
			}
		}
		return true
	case 36:
		for i := range len(s) {
			switch i {
			case 8, 13, 18, 23:
				if s[i] != '-' {
					return false
				}
			default:
				if !isPodUIDDigit(s[i]) {
					return false
				}
			}
		}
		return true
	default:
		return false
	}
}

func isPodUIDDigit(c byte) bool { return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' }

// errNoPod says a process runs in no Kubernetes pod.
var errNoPod = errors.New("the process is in no pod")

// cgroupPods finds the pod of a host process through /proc/<pid>/cgroup under root,
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
	uid, err := podUIDFromCgroup(string(b))
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
