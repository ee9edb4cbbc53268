package main

import (
	"bufio"
	"context"
	"debug/buildinfo"
	"debug/elf"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path"
	"regexp"
	"slices"
	"strings"
)

// binary is what the images need to know of a gpuscaler binary.
type binary struct {
	path string
	// arch is the binary's GOARCH, which the image's config must name.
	arch string
	// cgo says it was built with CGO_ENABLED=1 (Go's build settings say so).
	cgo bool
	// interp is the dynamic loader the binary names (PT_INTERP); "" for a static binary.
	interp string
	// version and commit are what `make build` stamped with -X, as `gpuscaler version`
	// prints them: "dev" and "unknown" when it was built without them.
	version, commit string
}

// readBinary reads a gpuscaler binary's build settings and ELF header. flagName names
// the flag that gave path, for errors.
func readBinary(ctx context.Context, flagName, path string) (*binary, error) {
	info, err := buildinfo.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("--%s %s: %w (want a gpuscaler binary from make build or make build-static)", flagName, path, err)
	}
	if info.Path != "github.com/gpuscaler/gpuscaler/cmd/gpuscaler" {
		return nil, fmt.Errorf("--%s %s: the binary of %q, want github.com/gpuscaler/gpuscaler/cmd/gpuscaler", flagName, path, info.Path)
	}
	b := &binary{path: path}
	for _, s := range info.Settings {
		if s.Key == "CGO_ENABLED" {
			b.cgo = s.Value == "1"
		}
	}
	f, err := elf.Open(path)
	if err != nil {
		return nil, fmt.Errorf("--%s %s: %w", flagName, path, err)
	}
	defer f.Close()
	if b.arch, err = goarch(f); err != nil {
		return nil, fmt.Errorf("--%s %s: %w", flagName, path, err)
	}
	for _, p := range f.Progs {
		if p.Type != elf.PT_INTERP {
			continue
		}
		buf := make([]byte, p.Filesz)
		if _, err := p.ReadAt(buf, 0); err != nil {
			return nil, fmt.Errorf("--%s %s: read its loader's name: %w", flagName, path, err)
		}
		b.interp = strings.TrimRight(string(buf), "\x00")
	}
	if b.version, b.commit, err = stampedVersion(ctx, path); err != nil {
		return nil, fmt.Errorf("--%s: %w", flagName, err)
	}
	return b, nil
}

// versionLine is what `gpuscaler version` prints (internal/version.String).
var versionLine = regexp.MustCompile(`^gpuscaler (\S+) \(commit ([^,]+), `)

// stampedVersion runs the binary's version command and returns the version and commit
// it was stamped with. Go's build info does not keep -ldflags of a -trimpath build, so
// running it is the way to ask; it also shows the binary runs on this host.
func stampedVersion(ctx context.Context, path string) (version, commit string, err error) {
	cmd := exec.CommandContext(ctx, path, "version")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", "", fmt.Errorf("%s version: %w %s", path, err, strings.TrimSpace(stderr.String()))
	}
	m := versionLine.FindStringSubmatch(string(out))
	if m == nil {
		return "", "", fmt.Errorf("%s version printed %q, want \"gpuscaler VERSION (commit COMMIT, …)\"", path, out)
	}
	return m[1], m[2], nil
}

// goarch names an ELF file's machine as GOARCH does, for the image config's architecture.
func goarch(f *elf.File) (string, error) {
	switch f.Machine {
	case elf.EM_X86_64:
		return "amd64", nil
	case elf.EM_AARCH64:
		return "arm64", nil
	case elf.EM_PPC64:
		if f.ByteOrder.String() == "LittleEndian" {
			return "ppc64le", nil
		}
	case elf.EM_S390:
		return "s390x", nil
	case elf.EM_RISCV:
		return "riscv64", nil
	}
	return "", fmt.Errorf("an ELF binary for %v, which this tool does not know the image architecture of", f.Machine)
}

// sharedLibraries runs ldd on the binary and returns the files the loader would map for
// it on this host, the loader included.
func sharedLibraries(ctx context.Context, ldd, path string) ([]string, error) {
	cmd := exec.CommandContext(ctx, ldd, path)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			return nil, fmt.Errorf("%s %s: %w: %s", ldd, path, err, strings.TrimSpace(stderr.String()))
		}
		return nil, fmt.Errorf("%s %s: %w (ldd lists the collector binary's shared libraries: on Debian it is in libc-bin; --ldd names another)", ldd, path, err)
	}
	libs, err := parseLDD(string(out))
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", ldd, path, err)
	}
	return libs, nil
}

// parseLDD reads glibc ldd's output: one line per library, "name => /path (0xaddr)", the
// loader as "/path (0xaddr)", the kernel's vDSO as "linux-vdso.so.1 (0xaddr)" (no file:
// left out). It returns the paths in the order listed, and an error for a library ldd
// could not find, which the image would lack too.
func parseLDD(out string) ([]string, error) {
	var libs []string
	var missing []string
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line == "statically linked" || line == "not a dynamic executable" {
			continue
		}
		name, target, mapped := strings.Cut(line, "=>")
		if mapped {
			target = strings.TrimSpace(target)
			if target == "not found" {
				missing = append(missing, strings.TrimSpace(name))
				continue
			}
		} else {
			target = name
		}
		path, _, _ := strings.Cut(strings.TrimSpace(target), " (")
		path = strings.TrimSpace(path)
		if path == "" || !strings.HasPrefix(path, "/") {
			// The vDSO, or "name => (0x…)" on old glibc: the kernel maps it, no file.
			continue
		}
		libs = append(libs, path)
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("needs %s, which the loader cannot find on this host", strings.Join(missing, ", "))
	}
	return libs, nil
}

// glibcRuntime are the sonames of glibc's run-time libraries, less its debugging,
// profiling and legacy ones. ldd of the collector binary lists libc.so.6 alone, but the
// NVIDIA libraries it loads at run time (libnvidia-ml, which the NVIDIA container
// toolkit mounts, and libdcgm) link others (libm, libdl, libpthread, librt), and
// nothing brings those into the container: without them dlopen fails and the source
// reads "library not found". distroless/base carries them for the same reason (glibc's
// libc6 package).
var glibcRuntime = []string{
	"libc.so.6", "libm.so.6", "libmvec.so.1", "libpthread.so.0", "libdl.so.2", "librt.so.1",
	"libresolv.so.2", "libutil.so.1", "libanl.so.1", "libnss_files.so.2", "libnss_dns.so.2",
}

// withGlibc adds to libs the glibc run-time libraries that lie beside the libc.so.6
// among them, as the loader finds them: the same glibc, from the same directory.
// Without a libc.so.6 (a binary not linked with glibc) it returns libs as they are.
func withGlibc(libs []string) ([]string, error) {
	var dir string
	for _, l := range libs {
		if path.Base(l) == "libc.so.6" {
			dir = path.Dir(l)
		}
	}
	if dir == "" {
		return libs, nil
	}
	out := slices.Clone(libs)
	for _, name := range glibcRuntime {
		p := path.Join(dir, name)
		if slices.Contains(out, p) {
			continue
		}
		if _, err := os.Stat(p); errors.Is(err, os.ErrNotExist) {
			continue // not built on this architecture or glibc version (libmvec)
		} else if err != nil {
			return nil, err
		}
		out = append(out, p)
	}
	return out, nil
}
