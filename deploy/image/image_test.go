package main

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"io"
	"log"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/google/go-containerregistry/pkg/v1/validate"
)

// The binaries the images are built from: $GPUSCALER_BIN (cgo) and
// $GPUSCALER_STATIC_BIN (CGO_ENABLED=0), as make test-image passes bin/gpuscaler and
// bin/gpuscaler-static; else TestMain builds them with make, with its flags.
var cgoBin, staticBin string

func TestMain(m *testing.M) {
	cgoBin, staticBin = os.Getenv("GPUSCALER_BIN"), os.Getenv("GPUSCALER_STATIC_BIN")
	if cgoBin == "" || staticBin == "" {
		root, err := filepath.Abs("../..")
		if err == nil {
			cmd := exec.Command("make", "-s", "build", "build-static")
			cmd.Dir = root
			if out, err := cmd.CombinedOutput(); err != nil {
				os.Stderr.Write(out)
				os.Stderr.WriteString("make build build-static: " + err.Error() + "\n")
				os.Exit(1)
			}
		}
		cgoBin, staticBin = filepath.Join(root, "bin/gpuscaler"), filepath.Join(root, "bin/gpuscaler-static")
	}
	os.Exit(m.Run())
}

// testOptions builds both images from the test binaries into dir.
func testOptions(dir string) options {
	return options{
		ScalerBin:    staticBin,
		CollectorBin: cgoBin,
		Repository:   "gpuscaler",
		Tag:          "test",
		Out:          dir,
		CACerts:      "/etc/ssl/certs/ca-certificates.crt",
		LDD:          "ldd",
		Created:      time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC),
	}
}

// TestImages builds both images, reads each back from its docker archive and checks
// its config, its files and that the binary runs in it, as the image's user, with
// nothing from the host: in a chroot of the image's file system.
func TestImages(t *testing.T) {
	dir := t.TempDir()
	opts := testOptions(dir)
	got, err := build(t.Context(), opts)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 {
		t.Fatalf("got %d images, want 2", len(got))
	}
	version, commit, err := stampedVersion(t.Context(), staticBin)
	if err != nil {
		t.Fatal(err)
	}
	cacerts, err := os.ReadFile(opts.CACerts)
	if err != nil {
		t.Fatal(err)
	}
	base := map[string]os.FileMode{
		"etc":                               os.ModeDir | 0o755,
		"etc/passwd":                        0o644,
		"etc/group":                         0o644,
		"etc/ssl":                           os.ModeDir | 0o755,
		"etc/ssl/certs":                     os.ModeDir | 0o755,
		"etc/ssl/certs/ca-certificates.crt": 0o644,
		"tmp":                               os.ModeDir | os.ModeSticky | 0o777,
		"usr":                               os.ModeDir | 0o755,
		"usr/local":                         os.ModeDir | 0o755,
		"usr/local/bin":                     os.ModeDir | 0o755,
		"usr/local/bin/gpuscaler":           0o755,
	}

	tests := []struct {
		ref, archive, bin, title, cmd string
		ports                         []string
		layers                        int
		// libs are files the image has beyond base, by their path in the image.
		libs []string
	}{
		{ref: "gpuscaler:test", archive: "gpuscaler.tar", bin: staticBin, title: "gpuscaler", cmd: "scaler",
			ports: []string{"8080/tcp", "9090/tcp"}, layers: 2},
		{ref: "gpuscaler-collector:test", archive: "gpuscaler-collector.tar", bin: cgoBin, title: "gpuscaler-collector", cmd: "collector",
			ports: []string{"8081/tcp"}, layers: 3, libs: collectorLibs(t)},
	}
	for i, tc := range tests {
		t.Run(tc.title, func(t *testing.T) {
			if got[i].Ref.String() != tc.ref || got[i].Archive != filepath.Join(dir, tc.archive) {
				t.Fatalf("got %s in %s, want %s in %s", got[i].Ref, got[i].Archive, tc.ref, tc.archive)
			}
			// The archive is a docker-archive of one image, tagged tc.ref.
			m, err := tarball.LoadManifest(func() (io.ReadCloser, error) { return os.Open(got[i].Archive) })
			if err != nil {
				t.Fatal(err)
			}
			if len(m) != 1 || !slices.Equal(m[0].RepoTags, []string{tc.ref}) {
				t.Fatalf("got manifest.json %+v, want one image tagged %s", m, tc.ref)
			}
			tag, err := name.NewTag(tc.ref)
			if err != nil {
				t.Fatal(err)
			}
			img, err := tarball.ImageFromPath(got[i].Archive, &tag)
			if err != nil {
				t.Fatal(err)
			}
			if err := validate.Image(img); err != nil {
				t.Fatalf("the archived image is not consistent: %v", err)
			}
			if d, _ := img.Digest(); d != got[i].Digest {
				t.Errorf("got digest %s from the archive, want %s as built", d, got[i].Digest)
			}
			if mt, _ := img.MediaType(); mt != types.DockerManifestSchema2 {
				t.Errorf("got manifest media type %s, want %s", mt, types.DockerManifestSchema2)
			}

			cfg, err := img.ConfigFile()
			if err != nil {
				t.Fatal(err)
			}
			if cfg.Architecture != runtime.GOARCH || cfg.OS != "linux" {
				t.Errorf("got platform %s/%s, want linux/%s", cfg.OS, cfg.Architecture, runtime.GOARCH)
			}
			if !slices.Equal(cfg.Config.Entrypoint, []string{"/usr/local/bin/gpuscaler"}) || !slices.Equal(cfg.Config.Cmd, []string{tc.cmd}) {
				t.Errorf("got entrypoint %q cmd %q, want /usr/local/bin/gpuscaler %s", cfg.Config.Entrypoint, cfg.Config.Cmd, tc.cmd)
			}
			if cfg.Config.User != "65532:65532" {
				t.Errorf("got user %q, want 65532:65532 (nonroot)", cfg.Config.User)
			}
			var ports []string
			for p := range cfg.Config.ExposedPorts {
				ports = append(ports, p)
			}
			slices.Sort(ports)
			if !slices.Equal(ports, tc.ports) {
				t.Errorf("got exposed ports %v, want %v", ports, tc.ports)
			}
			for k, want := range map[string]string{
				"org.opencontainers.image.title":    tc.title,
				"org.opencontainers.image.source":   "https://github.com/gpuscaler/gpuscaler",
				"org.opencontainers.image.version":  version,
				"org.opencontainers.image.revision": commit,
			} {
				if cfg.Config.Labels[k] != want {
					t.Errorf("got label %s=%q, want %q", k, cfg.Config.Labels[k], want)
				}
			}
			if !cfg.Created.Time.Equal(opts.Created) {
				t.Errorf("got created %v, want %v", cfg.Created.Time, opts.Created)
			}
			layers, err := img.Layers()
			if err != nil {
				t.Fatal(err)
			}
			if len(layers) != tc.layers || len(cfg.History) != tc.layers {
				t.Errorf("got %d layers and %d history entries, want %d", len(layers), len(cfg.History), tc.layers)
			}

			// Its files: the base, the libraries, and the binary, byte for byte.
			files := imageFiles(t, img)
			want := map[string]os.FileMode{}
			for p, m := range base {
				want[p] = m
			}
			for _, lib := range tc.libs {
				want[strings.TrimPrefix(lib, "/")] = 0o755
				for d := filepath.Dir(lib); d != "/"; d = filepath.Dir(d) {
					want[strings.TrimPrefix(d, "/")] = os.ModeDir | 0o755
				}
			}
			for p, m := range want {
				f, ok := files[p]
				switch {
				case !ok:
					t.Errorf("image has no %s", p)
				case f.mode != m:
					t.Errorf("got %s mode %v, want %v", p, f.mode, m)
				case !f.modTime.Equal(opts.Created):
					t.Errorf("got %s dated %v, want %v", p, f.modTime, opts.Created)
				}
			}
			for p := range files {
				if _, ok := want[p]; !ok {
					t.Errorf("image has %s, which it should not", p)
				}
			}
			bin, err := os.ReadFile(tc.bin)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(files["usr/local/bin/gpuscaler"].data, bin) {
				t.Errorf("the image's /usr/local/bin/gpuscaler differs from %s", tc.bin)
			}
			if !bytes.Equal(files["etc/ssl/certs/ca-certificates.crt"].data, cacerts) {
				t.Errorf("the image's CA certificates differ from %s", opts.CACerts)
			}
			if !strings.Contains(string(files["etc/passwd"].data), "nonroot:x:65532:65532:") {
				t.Errorf("got /etc/passwd %q, want the nonroot user", files["etc/passwd"].data)
			}

			// The binary runs in the image alone.
			root := writeRoot(t, files)
			out, code := runInRoot(t, root, "version")
			wantVersion := "cgo)\n"
			if tc.cmd == "scaler" {
				wantVersion = "no cgo: no DCGM or NVML source)\n"
			}
			if code != 0 || !strings.HasPrefix(out, "gpuscaler "+version+" (commit "+commit+", ") || !strings.HasSuffix(out, wantVersion) {
				t.Errorf("gpuscaler version in the image: exit %d, %q; want exit 0, gpuscaler %s (commit %s, …%s", code, out, version, commit, wantVersion)
			}
			if tc.cmd == "collector" {
				checkLoadsNVML(t, root, tc.libs)
			}
		})
	}

	// The static binary, as the scaler image has it: every command is there, and the
	// collector's DCGM and NVML sources fail at start saying why, with no panic.
	t.Run("static binary", func(t *testing.T) {
		img, err := tarball.ImageFromPath(got[0].Archive, nil)
		if err != nil {
			t.Fatal(err)
		}
		root := writeRoot(t, imageFiles(t, img))
		out, code := runInRoot(t, root, "--help")
		if code != 0 || !strings.Contains(out, "scaler") || !strings.Contains(out, "collector") {
			t.Errorf("gpuscaler --help: exit %d, %q; want exit 0 and the commands", code, out)
		}
		for _, source := range []string{"dcgm", "nvml", "auto"} {
			out, code := runInRoot(t, root, "collector", "--source", source, "--http-addr", "-", "--node", "n")
			if code != 1 {
				t.Errorf("collector --source %s: exit %d, want 1\n%s", source, code, out)
			}
			for _, want := range []string{"gpuscaler collector: ", "this binary was built without cgo (CGO_ENABLED=0)", "C compiler", "--source exporter"} {
				if !strings.Contains(out, want) {
					t.Errorf("collector --source %s printed %q, want it to say %q", source, out, want)
				}
			}
			if strings.Contains(out, "panic") || strings.Contains(out, "goroutine ") {
				t.Errorf("collector --source %s panicked:\n%s", source, out)
			}
		}
	})

	builtDigests = []v1.Hash{got[0].Digest, got[1].Digest}
}

// builtDigests are the digests TestImages built, which TestPush's build of the same
// binaries must give again: the images are reproducible.
var builtDigests []v1.Hash

// TestPush pushes both images to a registry served in-process on loopback and pulls
// them back: the same digests, every blob there.
func TestPush(t *testing.T) {
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	t.Cleanup(srv.Close)
	host := strings.TrimPrefix(srv.URL, "http://")

	opts := testOptions("")
	opts.Repository, opts.Push = host+"/team/gpuscaler", true
	got, err := build(t.Context(), opts)
	if err != nil {
		t.Fatal(err)
	}
	for i, ref := range []string{host + "/team/gpuscaler:test", host + "/team/gpuscaler-collector:test"} {
		if got[i].Ref.String() != ref || !got[i].Pushed || got[i].Archive != "" {
			t.Errorf("got %s pushed %v archive %q, want %s pushed and no archive", got[i].Ref, got[i].Pushed, got[i].Archive, ref)
		}
		tag, err := name.NewTag(ref)
		if err != nil {
			t.Fatal(err)
		}
		img, err := remote.Image(tag, remote.WithContext(t.Context()))
		if err != nil {
			t.Fatalf("pull %s: %v", ref, err)
		}
		if err := validate.Image(img); err != nil {
			t.Fatalf("pulled %s: %v", ref, err)
		}
		if d, _ := img.Digest(); d != got[i].Digest {
			t.Errorf("pulled %s with digest %s, want %s as pushed", ref, d, got[i].Digest)
		}
		// The same binaries make the same image, whatever its name.
		if builtDigests != nil && got[i].Digest != builtDigests[i] {
			t.Errorf("%s: got digest %s, want %s as TestImages built it from the same binaries", ref, got[i].Digest, builtDigests[i])
		}
	}
}

// TestBuildRejects: inputs the images cannot be built from fail before anything is
// written, naming the flag, the value and what was wanted.
func TestBuildRejects(t *testing.T) {
	tests := map[string]struct {
		change func(*options)
		want   []string
	}{
		"cgo scaler binary": {func(o *options) { o.ScalerBin = cgoBin },
			[]string{"--scaler-bin " + cgoBin, "built with cgo", "CGO_ENABLED=0 (make build-static)"}},
		"static collector binary": {func(o *options) { o.CollectorBin = staticBin },
			[]string{"--collector-bin " + staticBin, "built without cgo", "make build"}},
		"missing binary": {func(o *options) { o.ScalerBin = "/no/such/gpuscaler" },
			[]string{"--scaler-bin /no/such/gpuscaler", "make build-static"}},
		"not gpuscaler": {func(o *options) { o.CollectorBin = "/bin/true" },
			[]string{"--collector-bin /bin/true"}},
		"push to Docker Hub's library": {func(o *options) { o.Push = true },
			[]string{`--push with --repository "gpuscaler"`, "registry.example.com/team/gpuscaler"}},
		"bad tag": {func(o *options) { o.Tag = "a b" },
			[]string{`--tag "a b"`}},
		"no CA certificates": {func(o *options) { o.CACerts = "/no/such.crt" },
			[]string{"--ca-certs /no/such.crt", "ca-certificates"}},
		"no ldd": {func(o *options) { o.LDD = "/no/such/ldd" },
			[]string{"/no/such/ldd", "--ldd"}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			opts := testOptions(dir)
			tc.change(&opts)
			_, err := build(t.Context(), opts)
			if err == nil {
				t.Fatal("built, want an error")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("got error %q, want it to say %q", err, w)
				}
			}
			if entries, _ := os.ReadDir(dir); len(entries) != 0 {
				t.Errorf("left %d files in --out", len(entries))
			}
		})
	}
}

func TestRunUsage(t *testing.T) {
	tests := map[string]struct {
		args []string
		env  map[string]string
		code int
		want string
	}{
		"argument":       {args: []string{"now"}, code: 2, want: `unexpected argument "now"`},
		"unknown flag":   {args: []string{"--registry", "x"}, code: 2, want: "flag provided but not defined: -registry"},
		"bad epoch":      {env: map[string]string{"SOURCE_DATE_EPOCH": "yesterday"}, code: 2, want: `SOURCE_DATE_EPOCH "yesterday": want seconds`},
		"help":           {args: []string{"--help"}, code: 0, want: "REPOSITORY-collector:TAG"},
		"missing binary": {args: []string{"--scaler-bin", "/no/such"}, code: 1, want: "image: --scaler-bin /no/such"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := run(context.Background(), tc.args, func(k string) string { return tc.env[k] }, &stdout, &stderr)
			if code != tc.code || !strings.Contains(stderr.String(), tc.want) {
				t.Errorf("got exit %d, stderr %q; want exit %d and %q", code, stderr.String(), tc.code, tc.want)
			}
		})
	}
}

// TestRunSaysWhatNext: after building, the command says how to load the archives into
// kind and the chart values that name the images.
func TestRunSaysWhatNext(t *testing.T) {
	dir := t.TempDir()
	var stdout, stderr bytes.Buffer
	args := []string{"--scaler-bin", staticBin, "--collector-bin", cgoBin, "--tag", "v9", "--out", dir}
	if code := run(t.Context(), args, func(string) string { return "" }, &stdout, &stderr); code != 0 {
		t.Fatalf("got exit %d, stderr %q", code, stderr.String())
	}
	for _, want := range []string{
		"gpuscaler:v9  sha256:", "gpuscaler-collector:v9  sha256:",
		"kind load image-archive " + filepath.Join(dir, "gpuscaler.tar") + "\n",
		"kind load image-archive " + filepath.Join(dir, "gpuscaler-collector.tar") + "\n",
		"helm install gpuscaler deploy/helm/gpuscaler -n gpuscaler --create-namespace --set image.repository=gpuscaler,image.tag=v9\n",
	} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("got stdout %q, want %q", stdout.String(), want)
		}
	}
}

func TestParseLDD(t *testing.T) {
	tests := map[string]struct {
		out     string
		want    []string
		wantErr string
	}{
		// ldd of a cgo gpuscaler on Debian 12.
		"debian": {out: "\tlinux-vdso.so.1 (0x00007ffd6b5f2000)\n\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f1a8f773000)\n\t/lib64/ld-linux-x86-64.so.2 (0x00007f1a8f969000)\n",
			want: []string{"/lib/x86_64-linux-gnu/libc.so.6", "/lib64/ld-linux-x86-64.so.2"}},
		// Older glibc printed the vDSO with an empty target.
		"old vdso": {out: "\tlinux-vdso.so.1 =>  (0x00007fff)\n\tlibc.so.6 => /lib/libc.so.6 (0x1)\n", want: []string{"/lib/libc.so.6"}},
		"arm64":    {out: "\tlinux-vdso.so.1 (0x0000ffff)\n\tlibc.so.6 => /lib/aarch64-linux-gnu/libc.so.6 (0x1)\n\t/lib/ld-linux-aarch64.so.1 (0x2)\n", want: []string{"/lib/aarch64-linux-gnu/libc.so.6", "/lib/ld-linux-aarch64.so.1"}},
		"static":   {out: "\tnot a dynamic executable\n"},
		"missing":  {out: "\tlibdcgm.so.4 => not found\n\tlibc.so.6 => /lib/libc.so.6 (0x1)\n", wantErr: "needs libdcgm.so.4, which the loader cannot find"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := parseLDD(tc.out)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("got %v, %v; want error %q", got, err, tc.wantErr)
				}
				return
			}
			if err != nil || !slices.Equal(got, tc.want) {
				t.Errorf("got %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}

// FuzzParseLDD: whatever ldd prints, parseLDD does not panic and returns only absolute
// paths.
func FuzzParseLDD(f *testing.F) {
	f.Add("\tlinux-vdso.so.1 (0x00007ffd6b5f2000)\n\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f1a8f773000)\n\t/lib64/ld-linux-x86-64.so.2 (0x1)\n")
	f.Add("\tlibdcgm.so.4 => not found\n")
	f.Add("=> (\n/ (")
	f.Fuzz(func(t *testing.T, out string) {
		libs, err := parseLDD(out)
		if err != nil {
			return
		}
		for _, l := range libs {
			if !strings.HasPrefix(l, "/") {
				t.Fatalf("got path %q from %q, want an absolute path", l, out)
			}
		}
	})
}

// checkLoadsNVML: the collector in its image loads an NVML library put where the NVIDIA
// container toolkit puts libnvidia-ml.so.1, one that links libm as the real one does:
// its NVML source then fails at nvmlInit, which the stand-in answers "driver not
// loaded", and not at dlopen ("library not found"), which it would if the image
// lacked a library the stand-in links.
func checkLoadsNVML(t *testing.T, root string, libs []string) {
	t.Helper()
	var libdir string
	for _, l := range libs {
		if filepath.Base(l) == "libc.so.6" {
			libdir = filepath.Dir(l)
		}
	}
	src := filepath.Join(t.TempDir(), "nvml.c")
	err := os.WriteFile(src, []byte(`#include <math.h>
volatile double x = 2;
/* NVML_ERROR_DRIVER_NOT_LOADED (nvml.h); sqrt keeps libm.so.6 among its needs. */
int nvmlInit_v2(void) { return 9 + (int)(sqrt(x) - sqrt(x)); }
int nvmlInit(void) { return nvmlInit_v2(); }
int nvmlShutdown(void) { return 0; }
const char *nvmlErrorString(int r) { return r == 9 ? "Driver Not Loaded" : "Unknown Error"; }
`), 0o644)
	if err != nil {
		t.Fatal(err)
	}
	lib := filepath.Join(root, libdir, "libnvidia-ml.so.1")
	cc := exec.Command("cc", "-shared", "-fPIC", "-o", lib, src, "-Wl,--no-as-needed", "-lm")
	if out, err := cc.CombinedOutput(); err != nil {
		t.Fatalf("cc (the project needs a C compiler for cgo): %v\n%s", err, out)
	}
	out, code := runInRoot(t, root, "collector", "--source", "nvml", "--http-addr", "-", "--node", "n")
	if code != 1 || !strings.Contains(out, "NVML Init: ") || strings.Contains(out, "LIBRARY_NOT_FOUND") || !strings.Contains(out, "(9)") {
		t.Errorf("collector --source nvml with a stand-in libnvidia-ml.so.1 in %s: exit %d, %q; want exit 1 and NVML Init failing with 9 (driver not loaded), the library loaded", libdir, code, out)
	}
}

// collectorLibs are the files the collector image must carry besides the base: what
// ldd lists for the cgo binary, its loader, and glibc's other run-time libraries.
func collectorLibs(t *testing.T) []string {
	t.Helper()
	libs, err := sharedLibraries(t.Context(), "ldd", cgoBin)
	if err != nil {
		t.Fatal(err)
	}
	b, err := readBinary(t.Context(), "collector-bin", cgoBin)
	if err != nil {
		t.Fatal(err)
	}
	if b.interp == "" || !slices.Contains(libs, b.interp) {
		libs = append(libs, b.interp)
	}
	if libs, err = withGlibc(libs); err != nil {
		t.Fatal(err)
	}
	// What a dlopened NVIDIA library links, beyond libc (readelf -d libnvidia-ml.so.1).
	for _, want := range []string{"libc.so.6", "libm.so.6", "libdl.so.2", "libpthread.so.0", "librt.so.1"} {
		if !slices.ContainsFunc(libs, func(l string) bool { return filepath.Base(l) == want }) {
			t.Errorf("the collector image's libraries %q lack %s", libs, want)
		}
	}
	return libs
}

// imageFile is one entry of an image's flattened file system.
type imageFile struct {
	mode    os.FileMode
	modTime time.Time
	data    []byte
}

// imageFiles flattens the image's layers, by path.
func imageFiles(t *testing.T, img v1.Image) map[string]imageFile {
	t.Helper()
	rc := mutate.Extract(img)
	defer rc.Close()
	files := map[string]imageFile{}
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return files
		}
		if err != nil {
			t.Fatal(err)
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		files[h.Name] = imageFile{mode: h.FileInfo().Mode(), modTime: h.ModTime, data: data}
	}
}

// writeRoot writes the files to a directory, to chroot into.
func writeRoot(t *testing.T, files map[string]imageFile) string {
	t.Helper()
	root := t.TempDir()
	paths := make([]string, 0, len(files))
	for p := range files {
		paths = append(paths, p)
	}
	slices.Sort(paths)
	for _, p := range paths {
		f, dst := files[p], filepath.Join(root, p)
		var err error
		if f.mode.IsDir() {
			err = os.MkdirAll(dst, 0o755)
		} else {
			err = os.WriteFile(dst, f.data, 0o644)
		}
		if err == nil {
			err = os.Chmod(dst, f.mode&(os.ModePerm|os.ModeSticky))
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	return root
}

// runInRoot runs the image's gpuscaler with args in a chroot of root, as the image's
// nonroot user where the test runs as root (CI), else as root of a user namespace, and
// returns its combined output and exit code.
func runInRoot(t *testing.T, root string, args ...string) (string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "/usr/local/bin/gpuscaler", args...)
	cmd.Err = nil // the path is looked up inside root, not here
	cmd.Dir = "/"
	cmd.Env = []string{"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=/"}
	cmd.SysProcAttr = &syscall.SysProcAttr{Chroot: root}
	if os.Geteuid() == 0 {
		cmd.SysProcAttr.Credential = &syscall.Credential{Uid: 65532, Gid: 65532}
	} else {
		cmd.SysProcAttr.Cloneflags = syscall.CLONE_NEWUSER
		cmd.SysProcAttr.UidMappings = []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getuid(), Size: 1}}
		cmd.SysProcAttr.GidMappings = []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getgid(), Size: 1}}
	}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case err == nil:
		return out.String(), 0
	case errors.As(err, &exit) && exit.Exited():
		return out.String(), exit.ExitCode()
	default:
		t.Fatalf("gpuscaler %s in a chroot of the image: %v\n%s", strings.Join(args, " "), err, out.String())
		return "", -1
	}
}
