// Command render writes every committed rendering of gpuscaler's Helm charts
// (render.AllCases: deploy/manifests/*.yaml, test/manifests/testdata/*.yaml and the
// inference example's gateway.yaml), or with -check fails when one differs from a fresh
// rendering. deploy/render.sh runs it.
package main

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"path/filepath"

	"github.com/gpuscaler/gpuscaler/deploy/render"
)

func main() {
	check := flag.Bool("check", false, "do not write: fail when a committed rendering is not current")
	root := flag.String("root", ".", "the repository root, or a folder below it")
	flag.Parse()
	if err := run(*root, *check); err != nil {
		fmt.Fprintln(os.Stderr, "render:", err)
		os.Exit(1)
	}
}

func run(dir string, check bool) error {
	root, err := render.RepoRoot(dir)
	if err != nil {
		return err
	}
	var stale []string
	for _, c := range render.AllCases() {
		got, err := render.RenderCase(root, c)
		if err != nil {
			return err
		}
		path := filepath.Join(root, c.Out)
		if check {
			have, err := os.ReadFile(path)
			if err != nil || !bytes.Equal(have, got) {
				stale = append(stale, c.Out)
			}
			continue
		}
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(path, got, 0o644); err != nil {
			return err
		}
		fmt.Println("wrote", c.Out)
	}
	if len(stale) > 0 {
		return fmt.Errorf("not current, run deploy/render.sh and commit: %v", stale)
	}
	return nil
}
