package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
)

// output is a file a long command (demo, replay) writes at the end, opened before the
// run so that a path it cannot write fails at once.
type output struct {
	path    string
	f       *os.File
	created bool // by openOutputs: removed again if the run fails
}

// outputs are a command's output files by flag name; a flag left empty has none.
type outputs map[string]*output

// openOutputs opens each non-empty path for writing, creating it if need be but leaving
// what it holds until the run has something to replace it with.
func openOutputs(paths map[string]string) (outputs, error) {
	outs := outputs{}
	byPath := map[string]string{}
	for _, name := range slices.Sorted(maps.Keys(paths)) {
		path := paths[name]
		if path == "" {
			continue
		}
		abs, err := filepath.Abs(path)
		if err != nil {
			return nil, errors.Join(fmt.Errorf("--%s %q: %w", name, path, err), outs.abandon())
		}
		if other, ok := byPath[abs]; ok {
			return nil, errors.Join(fmt.Errorf("--%s and --%s both name %s: want two files", other, name, path), outs.abandon())
		}
		byPath[abs] = name
		_, statErr := os.Stat(path)
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE, 0o644)
		if err != nil {
			var pe *fs.PathError
			if errors.As(err, &pe) {
				err = pe.Err
			}
			return nil, errors.Join(fmt.Errorf("--%s %q: %w: want a file it can write (checked before the run, so as not to waste it)", name, path, err), outs.abandon())
		}
		outs[name] = &output{path: path, f: f, created: errors.Is(statErr, fs.ErrNotExist)}
	}
	return outs, nil
}

// write replaces the file's content with what fill writes, and closes it.
func (o *output) write(fill func(io.Writer) error) error {
	err := o.f.Truncate(0)
	if err == nil {
		b := bufio.NewWriter(o.f)
		if err = fill(b); err == nil {
			err = b.Flush()
		}
	}
	if cerr := o.f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("write %s: %w", o.path, err)
	}
	return nil
}

// abandon closes every file, removing those openOutputs created, for a run that failed.
func (outs outputs) abandon() error {
	var errs []error
	for _, o := range outs {
		errs = append(errs, o.f.Close())
		if o.created {
			errs = append(errs, os.Remove(o.path))
		}
	}
	return errors.Join(errs...)
}
