// Command image builds gpuscaler's two container images without a container engine, from
// binaries `make build` and `make build-static` made:
//
//   - gpuscaler: the static binary (CGO_ENABLED=0) on an empty base, for the scaler, the
//     auth callout and the CLI. It needs no C library, so the image holds the binary, CA
//     certificates, /etc/passwd and /tmp, and nothing that could be run but gpuscaler.
//   - gpuscaler-collector: the cgo binary, whose DCGM and NVML sources load the NVIDIA
//     libraries at run time, with the shared libraries ldd lists for it on the build
//     host (glibc's loader and libc) and the rest of that glibc's run-time libraries,
//     which the NVIDIA libraries link (withGlibc): the glibc the binary was built and
//     tested with.
//
// It writes each as a docker-archive tarball, which `docker load`, `podman load` and
// `kind load image-archive` take, and with --push sends both to a registry. `make image`
// runs it; it is a module of its own so that go-containerregistry stays out of the main
// module. The Dockerfile builds the same two images with a Docker engine.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"
)

const usage = `Usage: image [flags]

Builds gpuscaler's images from built binaries, without a container engine:
  REPOSITORY:TAG            the static binary on an empty base (scaler, auth callout, CLI)
  REPOSITORY-collector:TAG  the cgo binary with the glibc it was built with
and writes each to OUT/<name>.tar (docker-archive: docker load, podman load, kind load
image-archive). --push sends both to the registry REPOSITORY names.

Flags:
`

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// run parses the flags, builds and writes the images, and returns the exit code: 0 on
// success, 2 for a usage error, 1 for any other failure.
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	var opts options
	fs := flag.NewFlagSet("image", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), usage)
		fs.PrintDefaults()
	}
	fs.StringVar(&opts.ScalerBin, "scaler-bin", "bin/gpuscaler-static", "the static gpuscaler binary (CGO_ENABLED=0: make build-static)")
	fs.StringVar(&opts.CollectorBin, "collector-bin", "bin/gpuscaler", "the cgo gpuscaler binary (make build)")
	fs.StringVar(&opts.Repository, "repository", "gpuscaler", "the scaler image's repository; the collector's is this with -collector appended. "+
		"With --push it names the registry: registry.example.com/team/gpuscaler")
	fs.StringVar(&opts.Tag, "tag", "", "the images' tag; empty uses the version the binaries were stamped with (make: git describe)")
	fs.StringVar(&opts.Out, "out", "bin/image", `directory the docker-archive tarballs are written to; "" writes none`)
	fs.BoolVar(&opts.Push, "push", false, "push both images to REPOSITORY's registry (credentials from docker login or podman login)")
	fs.StringVar(&opts.CACerts, "ca-certs", "/etc/ssl/certs/ca-certificates.crt", `the CA certificates both images carry at /etc/ssl/certs/ca-certificates.crt (Go's default); "" for none`)
	fs.StringVar(&opts.LDD, "ldd", "ldd", "the ldd that lists the collector binary's shared libraries")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "image: unexpected argument %q: every input is a flag\n", fs.Arg(0))
		return 2
	}
	created, err := sourceDateEpoch(getenv("SOURCE_DATE_EPOCH"))
	if err != nil {
		fmt.Fprintf(stderr, "image: %v\n", err)
		return 2
	}
	opts.Created = created

	built, err := build(ctx, opts)
	if err != nil {
		fmt.Fprintf(stderr, "image: %v\n", err)
		return 1
	}
	for _, b := range built {
		fmt.Fprintf(stdout, "%s  %s  %s\n", b.Ref, b.Digest, b.summary())
	}
	if opts.Out != "" && !opts.Push {
		fmt.Fprintf(stdout, "\nLoad them into kind (docker load -i and podman load -i take them too):\n")
		for _, b := range built {
			fmt.Fprintf(stdout, "  kind load image-archive %s\n", b.Archive)
		}
	}
	fmt.Fprintf(stdout, "\nInstall the chart with them:\n  helm install gpuscaler deploy/helm/gpuscaler -n gpuscaler --create-namespace "+
		"--set image.repository=%s,image.tag=%s\n", opts.Repository, built[0].Ref.TagStr())
	return 0
}

// sourceDateEpoch reads $SOURCE_DATE_EPOCH (reproducible-builds.org): the time the
// images say they were created, and the time of every file in them, so that the same
// binaries make the same image digests. Unset means the Unix epoch, as ko does.
func sourceDateEpoch(v string) (time.Time, error) {
	if v == "" {
		return time.Unix(0, 0).UTC(), nil
	}
	sec, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
	if err != nil || sec < 0 {
		return time.Time{}, fmt.Errorf("SOURCE_DATE_EPOCH %q: want seconds since the Unix epoch, 0 or more", v)
	}
	return time.Unix(sec, 0).UTC(), nil
}
