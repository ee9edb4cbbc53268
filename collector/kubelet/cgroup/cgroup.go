// Package cgroup reads which Kubernetes pod a process runs in from its
// /proc/<pid>/cgroup file, as the kubelet names pod cgroups under every cgroup driver,
// cgroup version and cgroup namespace. PodUID is a pure parser: no I/O, no state; Pods
// (pods.go) reads the files under a host's /proc and remembers the answers, for the
// collector's NVML source. It links only the standard library, so that its fuzz test
// runs in a test binary that links little.
package cgroup

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// PodUID returns the UID of the Kubernetes pod a process runs in, read from
// the content of its /proc/<pid>/cgroup: "" and no error when the process is in no pod
// (a host process). It fails when the content is not a cgroup file, or when its lines
// name two different pods.
//
// Each line is "hierarchy-ID:controller-list:cgroup-path" (man 7 cgroups): one "0::"
// line on cgroup v2, one line per hierarchy on v1, both on a hybrid host. The kubelet
// puts every pod in a cgroup of its own, named from the pod's UID, under "kubepods"
// (see PodUIDFromPath). A v1 host may show the pod in some hierarchies and "/" in
// others (the hybrid "0::/" line); only the lines that name a pod count.
func PodUID(content string) (string, error) {
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
		u := PodUIDFromPath(path)
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

// PodUIDFromPath returns the UID of the pod whose cgroup holds path, or "".
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
func PodUIDFromPath(path string) string {
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
