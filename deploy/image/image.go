package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"path"
	"slices"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// options says what to build and where it goes.
type options struct {
	ScalerBin, CollectorBin string
	// Repository is the scaler image's; the collector's is Repository + "-collector".
	Repository string
	// Tag is both images' tag; empty uses the binaries' stamped version.
	Tag string
	// Out is where the docker-archive tarballs go; empty writes none.
	Out string
	// Push sends both images to Repository's registry.
	Push bool
	// CACerts is the host file both images carry as /etc/ssl/certs/ca-certificates.crt;
	// empty for none.
	CACerts string
	// LDD is the ldd command.
	LDD string
	// Created is the images' creation time and their files' modification time.
	Created time.Time
}

// The images' fixed facts, as the Dockerfile sets them.
const (
	binaryPath = "/usr/local/bin/gpuscaler"
	// nonroot is distroless's nonroot user and group, as the Dockerfile's USER: the
	// scaler and auth callout run as it; the collector's pod sets root for the kubelet's
	// socket.
	nonroot   = 65532
	sourceURL = "https://github.com/gpuscaler/gpuscaler"
	caPath    = "/etc/ssl/certs/ca-certificates.crt"
)

// image is one image to build.
type image struct {
	title       string
	description string
	bin         *binary
	cmd         string
	ports       []string
	// libs are the shared libraries the image carries for the binary: the files the
	// loader maps for it on the build host, and the rest of glibc's (withGlibc).
	libs []string
}

// built is one image built, and where it was written.
type built struct {
	Ref     name.Tag
	Image   v1.Image
	Digest  v1.Hash
	Archive string // the docker-archive tarball; "" when none was written
	Pushed  bool
	size    int64
}

func (b built) summary() string {
	var where []string
	if b.Archive != "" {
		where = append(where, b.Archive)
	}
	if b.Pushed {
		where = append(where, "pushed")
	}
	return fmt.Sprintf("%.1f MB compressed  %s", float64(b.size)/1e6, strings.Join(where, ", "))
}

// build reads the binaries, builds both images and writes or pushes them as opts says.
func build(ctx context.Context, opts options) ([]built, error) {
	scaler, err := readBinary(ctx, "scaler-bin", opts.ScalerBin)
	if err != nil {
		return nil, err
	}
	if scaler.cgo || scaler.interp != "" {
		return nil, fmt.Errorf("--scaler-bin %s was built with cgo (it loads %s): the scaler image has no C library; "+
			"build it with CGO_ENABLED=0 (make build-static)", opts.ScalerBin, cmp.Or(scaler.interp, "libc"))
	}
	collector, err := readBinary(ctx, "collector-bin", opts.CollectorBin)
	if err != nil {
		return nil, err
	}
	if !collector.cgo {
		return nil, fmt.Errorf("--collector-bin %s was built without cgo (CGO_ENABLED=0): the collector image needs its "+
			"DCGM and NVML sources; build it with a C compiler (make build)", opts.CollectorBin)
	}
	if scaler.version != collector.version || scaler.commit != collector.commit || scaler.arch != collector.arch {
		return nil, fmt.Errorf("--scaler-bin %s is %s (commit %s, %s) but --collector-bin %s is %s (commit %s, %s): "+
			"build both from the same checkout (make image does)", opts.ScalerBin, scaler.version, scaler.commit, scaler.arch,
			opts.CollectorBin, collector.version, collector.commit, collector.arch)
	}
	// Ask ldd now, so that a missing library fails before any layer is compressed.
	libs, err := sharedLibraries(ctx, opts.LDD, collector.path)
	if err != nil {
		return nil, err
	}
	if collector.interp != "" && !slices.Contains(libs, collector.interp) {
		libs = append(libs, collector.interp)
	}
	if libs, err = withGlibc(libs); err != nil {
		return nil, err
	}
	tag := cmp.Or(opts.Tag, scaler.version)
	scalerRef, err := name.NewTag(opts.Repository + ":" + tag)
	if err != nil {
		return nil, fmt.Errorf("--repository %q and --tag %q: %w", opts.Repository, tag, err)
	}
	collectorRef, err := name.NewTag(opts.Repository + "-collector:" + tag)
	if err != nil {
		return nil, fmt.Errorf("--repository %q: %w", opts.Repository, err)
	}
	if opts.Push && !strings.Contains(opts.Repository, "/") {
		return nil, fmt.Errorf("--push with --repository %q: name the registry (registry.example.com/team/gpuscaler); "+
			"a bare name means Docker Hub's library/%s, which is not yours", opts.Repository, opts.Repository)
	}

	base, err := baseLayer(opts)
	if err != nil {
		return nil, err
	}
	images := []struct {
		ref  name.Tag
		spec image
	}{
		{scalerRef, image{
			title:       "gpuscaler",
			description: "KEDA external scaler for GPU workloads: the scaler, the NATS auth callout and the CLI (static, no cgo)",
			bin:         scaler, cmd: "scaler", ports: []string{"9090/tcp", "8080/tcp"},
		}},
		{collectorRef, image{
			title:       "gpuscaler-collector",
			description: "gpuscaler's GPU node collector (cgo: DCGM and NVML load the NVIDIA libraries at run time)",
			bin:         collector, cmd: "collector", ports: []string{"8081/tcp"}, libs: libs,
		}},
	}
	// Build both before writing either, so that a failure leaves nothing behind.
	var out []built
	for _, im := range images {
		img, err := im.spec.build(opts, base)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", im.ref, err)
		}
		b := built{Ref: im.ref, Image: img}
		if b.Digest, err = img.Digest(); err != nil {
			return nil, fmt.Errorf("%s: %w", im.ref, err)
		}
		if b.size, err = compressedSize(img); err != nil {
			return nil, fmt.Errorf("%s: %w", im.ref, err)
		}
		out = append(out, b)
	}
	for i, b := range out {
		if opts.Out != "" {
			archive := path.Join(opts.Out, path.Base(b.Ref.RepositoryStr())+".tar")
			if err := writeArchive(archive, b.Ref, b.Image); err != nil {
				return nil, err
			}
			out[i].Archive = archive
		}
		if opts.Push {
			// Credentials as docker login and podman login left them.
			if err := remote.Write(b.Ref, b.Image, remote.WithContext(ctx), remote.WithAuthFromKeychain(authn.DefaultKeychain)); err != nil {
				return nil, fmt.Errorf("push %s: %w", b.Ref, err)
			}
			out[i].Pushed = true
		}
	}
	return out, nil
}

// build makes the image: the base layer, the shared libraries when it needs them, then
// the binary, each a layer of its own so that a new binary changes one layer.
func (im image) build(opts options, base layer) (v1.Image, error) {
	layers := []layer{base}
	if len(im.libs) > 0 {
		l, err := libraryLayer(opts, im.libs)
		if err != nil {
			return nil, err
		}
		layers = append(layers, l)
	}
	data, err := os.ReadFile(im.bin.path)
	if err != nil {
		return nil, err
	}
	bin, err := newLayer("the gpuscaler binary", opts.Created, []file{{path: binaryPath, mode: 0o755, data: data}})
	if err != nil {
		return nil, err
	}
	layers = append(layers, bin)

	// Docker's image manifest (v2, schema 2) rather than OCI's: a docker-archive keeps
	// only the config and layers, and whoever reads it back (docker load, kind, this
	// tool's tests) rebuilds that manifest, so the digest printed here is the one the
	// archive and the registry give.
	ports := map[string]struct{}{}
	for _, p := range im.ports {
		ports[p] = struct{}{}
	}
	img, err := mutate.ConfigFile(empty.Image, &v1.ConfigFile{
		Architecture: im.bin.arch,
		OS:           "linux",
		RootFS:       v1.RootFS{Type: "layers"},
		Config: v1.Config{
			Entrypoint:   []string{binaryPath},
			Cmd:          []string{im.cmd},
			User:         fmt.Sprintf("%d:%d", nonroot, nonroot),
			Env:          []string{"PATH=/usr/local/bin:/usr/bin:/bin"},
			WorkingDir:   "/",
			ExposedPorts: ports,
			Labels: map[string]string{
				"org.opencontainers.image.title":       im.title,
				"org.opencontainers.image.description": im.description,
				"org.opencontainers.image.source":      sourceURL,
				"org.opencontainers.image.version":     im.bin.version,
				"org.opencontainers.image.revision":    im.bin.commit,
			},
		},
	})
	if err != nil {
		return nil, err
	}
	for _, l := range layers {
		img, err = mutate.Append(img, mutate.Addendum{
			Layer:     l.Layer,
			MediaType: types.DockerLayer,
			History:   v1.History{Created: v1.Time{Time: opts.Created}, CreatedBy: "gpuscaler deploy/image: " + l.what},
		})
		if err != nil {
			return nil, err
		}
	}
	return mutate.CreatedAt(img, v1.Time{Time: opts.Created})
}

// baseLayer is what both images carry besides the binary: /etc/passwd and /etc/group
// naming root and nonroot (as distroless does, so tools show names), CA certificates
// for TLS to servers with public certificates (a hosted NATS), and a /tmp.
func baseLayer(opts options) (layer, error) {
	files := []file{
		{path: "/etc/passwd", mode: 0o644, data: []byte(fmt.Sprintf(
			"root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:%d:%d:nonroot:/home/nonroot:/sbin/nologin\n", nonroot, nonroot))},
		{path: "/etc/group", mode: 0o644, data: []byte(fmt.Sprintf("root:x:0:\nnonroot:x:%d:\n", nonroot))},
		{path: "/tmp", mode: 0o1777, dir: true},
	}
	what := "/etc/passwd, /etc/group, /tmp"
	if opts.CACerts != "" {
		data, err := os.ReadFile(opts.CACerts)
		if err != nil {
			if errors.Is(err, os.ErrNotExist) {
				return layer{}, fmt.Errorf("--ca-certs %s: no such file (Debian: apt-get install ca-certificates; \"\" builds images without CA certificates)", opts.CACerts)
			}
			return layer{}, fmt.Errorf("--ca-certs: %w", err)
		}
		files = append(files, file{path: caPath, mode: 0o644, data: data})
		what += ", " + caPath
	}
	return newLayer(what, opts.Created, files)
}

// libraryLayer holds the shared libraries, each at the path the loader found it on the
// build host (so the loader finds it there again) with the file's content. The NVIDIA
// libraries are not among them: the NVIDIA container toolkit mounts libnvidia-ml into
// the container at run time, and libdcgm comes from the host (deploy/README.md, GPU
// sources).
func libraryLayer(opts options, libs []string) (layer, error) {
	var files []file
	for _, lib := range libs {
		data, err := os.ReadFile(lib)
		if err != nil {
			return layer{}, fmt.Errorf("shared library: %w", err)
		}
		files = append(files, file{path: lib, mode: 0o755, data: data})
	}
	return newLayer("shared libraries (ldd, glibc): "+strings.Join(libs, ", "), opts.Created, files)
}

// writeArchive writes img as a docker-archive tarball tagged ref, through a temporary
// file so that a failed write leaves no truncated archive behind.
func writeArchive(file string, ref name.Tag, img v1.Image) error {
	if err := os.MkdirAll(path.Dir(file), 0o755); err != nil {
		return err
	}
	tmp := file + ".tmp"
	if err := tarball.WriteToFile(tmp, ref, img); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("write %s: %w", file, err)
	}
	return os.Rename(tmp, file)
}

func compressedSize(img v1.Image) (int64, error) {
	layers, err := img.Layers()
	if err != nil {
		return 0, err
	}
	var n int64
	for _, l := range layers {
		s, err := l.Size()
		if err != nil {
			return 0, err
		}
		n += s
	}
	return n, nil
}
