package cluster

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// Tool is a binary built from a wrapper module under tools/: a go.mod that requires the
// upstream module at one version (and, for Kubernetes, pins its staging modules), so that
// the module proxy and the Go build cache do all the work and no source is vendored.
type Tool struct {
	// Name names the binary in the cache and in logs.
	Name string
	// Module is the wrapper module's folder, relative to the e2e module's root.
	Module string
	// Package is the main package to build, as the wrapper's go.mod lists it in a tool line.
	Package string
	// Version is the upstream release, part of the cache key and of the file name.
	Version string
	// LDFlags are passed to the linker (version stamps).
	LDFlags string
}

// The binaries the suite runs besides gpuscaler. Versions here must match the wrapper
// modules' go.mod files; the cache key hashes those files too, so a bump rebuilds.
var (
	Etcd = Tool{
		Name: "etcd", Module: "tools/etcd", Package: "go.etcd.io/etcd/server/v3", Version: "v3.6.8",
	}
	KubeAPIServer = Tool{
		Name: "kube-apiserver", Module: "tools/kube", Package: "k8s.io/kubernetes/cmd/kube-apiserver", Version: "v1.36.4",
		// Without these it reports v0.0.0-master, and clients that check versions balk.
		LDFlags: "-X k8s.io/component-base/version.gitVersion=v1.36.4 -X k8s.io/component-base/version.gitMajor=1" +
			" -X k8s.io/component-base/version.gitMinor=36 -X k8s.io/component-base/version.gitTreeState=clean" +
			" -X k8s.io/client-go/pkg/version.gitVersion=v1.36.4 -X k8s.io/client-go/pkg/version.gitMajor=1" +
			" -X k8s.io/client-go/pkg/version.gitMinor=36",
	}
	// KubeControllerManager and KubeScheduler come from the same wrapper module as the
	// API server, so the Go build cache shares what the three have in common (about
	// 2,000 of the controller manager's 2,400 packages).
	KubeControllerManager = Tool{
		Name: "kube-controller-manager", Module: "tools/kube", Package: "k8s.io/kubernetes/cmd/kube-controller-manager", Version: "v1.36.4",
		LDFlags: KubeAPIServer.LDFlags,
	}
	KubeScheduler = Tool{
		Name: "kube-scheduler", Module: "tools/kube", Package: "k8s.io/kubernetes/cmd/kube-scheduler", Version: "v1.36.4",
		LDFlags: KubeAPIServer.LDFlags,
	}
	KEDAOperator = Tool{
		Name: "keda-operator", Module: "tools/keda", Package: "github.com/kedacore/keda/v2/cmd/operator", Version: "v2.21.0",
		LDFlags: "-X=github.com/kedacore/keda/v2/version.Version=2.21.0",
	}
	// KEDAAdapter is KEDA's metrics API server, from the operator's wrapper module.
	KEDAAdapter = Tool{
		Name: "keda-adapter", Module: "tools/keda", Package: "github.com/kedacore/keda/v2/cmd/adapter", Version: "v2.21.0",
		LDFlags: "-X=github.com/kedacore/keda/v2/version.Version=2.21.0",
	}
	// KwokTool plays the kubelet of the fake GPU nodes: it moves their pods through the
	// stages the suite gives it.
	KwokTool = Tool{
		Name: "kwok", Module: "tools/kwok", Package: "sigs.k8s.io/kwok/cmd/kwok", Version: "v0.8.0",
	}
	NATSServer = Tool{
		Name: "nats-server", Module: "tools/nats", Package: "github.com/nats-io/nats-server/v2", Version: "v2.15.2",
	}
	// HTTPAddOnInterceptor and HTTPAddOnScaler are the KEDA HTTP add-on's request holder
	// and its external scaler, for the side-by-side comparison (cmd/httpaddon-compare)
	// only: no test of the suite runs them.
	HTTPAddOnInterceptor = Tool{
		Name: "keda-http-interceptor", Module: "tools/httpaddon", Package: "github.com/kedacore/http-add-on/interceptor", Version: "v0.15.0",
		LDFlags: "-X=github.com/kedacore/http-add-on/pkg/build.version=v0.15.0",
	}
	HTTPAddOnScaler = Tool{
		Name: "keda-http-scaler", Module: "tools/httpaddon", Package: "github.com/kedacore/http-add-on/scaler", Version: "v0.15.0",
		LDFlags: HTTPAddOnInterceptor.LDFlags,
	}
)

// Builder builds tools into a cache folder, once per version: a binary is found again by
// a key hashing the wrapper module's go.mod and go.sum, the linker flags and the Go version.
type Builder struct {
	// E2ERoot is the e2e module's folder (holding tools/).
	E2ERoot string
	// CacheDir holds the binaries, under bin/.
	CacheDir string
	// Log receives progress lines.
	Log io.Writer
}

// DefaultCacheDir is where binaries are cached: $GPUSCALER_E2E_CACHE, else .e2e-cache at
// the repository root (git-ignored).
func DefaultCacheDir(repoRoot string) string {
	if d := os.Getenv("GPUSCALER_E2E_CACHE"); d != "" {
		return d
	}
	return filepath.Join(repoRoot, ".e2e-cache")
}

// Path returns where t's binary is cached, built or not.
func (b *Builder) Path(ctx context.Context, t Tool) (string, error) {
	h := sha256.New()
	for _, f := range []string{"go.mod", "go.sum"} {
		data, err := os.ReadFile(filepath.Join(b.E2ERoot, t.Module, f))
		if err != nil {
			return "", err
		}
		fmt.Fprintf(h, "%s\x00%s\x00", f, data)
	}
	goVersion, err := output(ctx, b.E2ERoot, "go", "env", "GOVERSION")
	if err != nil {
		return "", err
	}
	fmt.Fprintf(h, "%s\x00%s\x00%s", t.Package, t.LDFlags, goVersion)
	key := hex.EncodeToString(h.Sum(nil))[:12]
	return filepath.Join(b.CacheDir, "bin", fmt.Sprintf("%s-%s-%s", t.Name, t.Version, key)), nil
}

// Build returns the path of t's binary, building it first when the cache lacks it. It
// builds with -p 2: CI has two cores, shared.
func (b *Builder) Build(ctx context.Context, t Tool) (string, error) {
	path, err := b.Path(ctx, t)
	if err != nil {
		return "", err
	}
	if _, err := os.Stat(path); err == nil {
		fmt.Fprintf(b.Log, "e2e: %s %s: cached at %s\n", t.Name, t.Version, path)
		return path, nil
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return "", err
	}
	tmp := fmt.Sprintf("%s.tmp%d", path, os.Getpid())
	defer os.Remove(tmp)
	fmt.Fprintf(b.Log, "e2e: %s %s: building %s (a cold build takes minutes) ...\n", t.Name, t.Version, t.Package)
	start := time.Now()
	args := []string{"build", "-p", "2", "-mod=readonly", "-o", tmp}
	if t.LDFlags != "" {
		args = append(args, "-ldflags", t.LDFlags)
	}
	args = append(args, t.Package)
	if err := run(ctx, filepath.Join(b.E2ERoot, t.Module), "go", args...); err != nil {
		return "", fmt.Errorf("build %s: %w", t.Name, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return "", err
	}
	fmt.Fprintf(b.Log, "e2e: %s %s: built in %s\n", t.Name, t.Version, time.Since(start).Round(time.Second))
	return path, nil
}

// BuildGpuscaler builds the repository's gpuscaler binary into dir, every run: it is the
// code under test, and the Go build cache makes an unchanged tree cost a link.
func BuildGpuscaler(ctx context.Context, repoRoot, dir string, log io.Writer) (string, error) {
	path := filepath.Join(dir, "gpuscaler")
	start := time.Now()
	if err := run(ctx, repoRoot, "go", "build", "-p", "2", "-o", path, "./cmd/gpuscaler"); err != nil {
		return "", fmt.Errorf("build gpuscaler: %w", err)
	}
	fmt.Fprintf(log, "e2e: gpuscaler: built from %s in %s\n", repoRoot, time.Since(start).Round(time.Millisecond))
	return path, nil
}

// ModuleDir returns the folder of a module in the module cache, as the module at dir
// requires it (downloading it if needed).
func ModuleDir(ctx context.Context, dir, module string) (string, error) {
	out, err := output(ctx, dir, "go", "list", "-mod=readonly", "-m", "-f", "{{.Dir}}", module)
	if err != nil {
		return "", err
	}
	if out == "" {
		if _, err := output(ctx, dir, "go", "mod", "download", module); err != nil {
			return "", err
		}
		if out, err = output(ctx, dir, "go", "list", "-mod=readonly", "-m", "-f", "{{.Dir}}", module); err != nil {
			return "", err
		}
	}
	if out == "" {
		return "", fmt.Errorf("module %s: no folder in the module cache", module)
	}
	return out, nil
}

func run(ctx context.Context, dir, name string, args ...string) error {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s %s: %w\n%s", name, strings.Join(args, " "), err, out.String())
	}
	return nil
}

func output(ctx context.Context, dir, name string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("%s %s: %w\n%s", name, strings.Join(args, " "), err, stderr.String())
	}
	return strings.TrimSpace(string(out)), nil
}
