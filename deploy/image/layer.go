package main

import (
	"archive/tar"
	"bytes"

	"fmt"
	"io"
	"path"
	"slices"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/klauspost/compress/gzip"
)

// file is one entry of a layer.
type file struct {
	path string // absolute, in the image
	mode int64  // permission bits, with the sticky bit where wanted
	dir  bool
	data []byte // a regular file's content
}

// layer is a built layer and what it holds, for the image's history.
type layer struct {
	v1.Layer
	what string
}

// newLayer makes a gzipped tar layer of files, with the parent directories they need.
// klauspost's gzip (go-containerregistry's own) compresses a 34 MB binary three times
// as fast as compress/gzip, to within 4% of its size.
// The same files make the same bytes: entries are sorted, owned by root, dated at
// created, and the gzip header has no name or time, so the same binaries make the same
// image digests.
func newLayer(what string, created time.Time, files []file) (layer, error) {
	entries := map[string]file{}
	for _, f := range files {
		if !path.IsAbs(f.path) || path.Clean(f.path) != f.path {
			return layer{}, fmt.Errorf("layer file %q: want a clean absolute path", f.path)
		}
		entries[f.path] = f
		for dir := path.Dir(f.path); dir != "/"; dir = path.Dir(dir) {
			if _, ok := entries[dir]; !ok {
				entries[dir] = file{path: dir, mode: 0o755, dir: true}
			}
		}
	}
	paths := make([]string, 0, len(entries))
	for p := range entries {
		paths = append(paths, p)
	}
	slices.Sort(paths)

	var buf bytes.Buffer
	gz, err := gzip.NewWriterLevel(&buf, gzip.DefaultCompression)
	if err != nil {
		return layer{}, err
	}
	tw := tar.NewWriter(gz)
	for _, p := range paths {
		f := entries[p]
		h := &tar.Header{
			Name:    p[1:],
			Mode:    f.mode,
			ModTime: created,
			Format:  tar.FormatPAX,
		}
		if f.dir {
			h.Typeflag, h.Name = tar.TypeDir, h.Name+"/"
		} else {
			h.Typeflag, h.Size = tar.TypeReg, int64(len(f.data))
		}
		if err := tw.WriteHeader(h); err != nil {
			return layer{}, err
		}
		if _, err := tw.Write(f.data); err != nil {
			return layer{}, err
		}
	}
	if err := tw.Close(); err != nil {
		return layer{}, err
	}
	if err := gz.Close(); err != nil {
		return layer{}, err
	}
	blob := buf.Bytes()
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(blob)), nil
	}, tarball.WithMediaType(types.DockerLayer))
	if err != nil {
		return layer{}, err
	}
	return layer{Layer: l, what: what}, nil
}
