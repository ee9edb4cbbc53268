package manifests

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// instruction is one Dockerfile instruction, continuation lines joined.
type instruction struct {
	cmd, args string
}

func parseDockerfile(t *testing.T, path string) [][]instruction {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var stages [][]instruction
	var line string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		text := strings.TrimSpace(sc.Text())
		if line == "" && (text == "" || strings.HasPrefix(text, "#")) {
			continue
		}
		if cont, ok := strings.CutSuffix(text, "\\"); ok {
			line += cont + " "
			continue
		}
		line += text
		cmd, args, _ := strings.Cut(line, " ")
		line = ""
		in := instruction{strings.ToUpper(cmd), strings.TrimSpace(args)}
		if in.cmd == "FROM" {
			stages = append(stages, nil)
		}
		if len(stages) > 0 {
			stages[len(stages)-1] = append(stages[len(stages)-1], in)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return stages
}

// TestDockerfile checks what can be checked without a Docker engine: a multi-stage
// build whose binaries come from `make build-static` and `make build` with cgo on, the
// scaler's image static and the collector's with glibc, each as a non-root user with
// gpuscaler as the entrypoint, and a .dockerignore that keeps every package the binary
// needs in the build context. (deploy/image builds the same two images without an
// engine, and its tests run them.)
func TestDockerfile(t *testing.T) {
	r := root(t)
	stages := parseDockerfile(t, filepath.Join(r, "Dockerfile"))
	if len(stages) < 3 {
		t.Fatalf("got %d stages, want a build stage and the scaler's and the collector's", len(stages))
	}
	var static, cgo bool
	for _, in := range stages[0] {
		if in.cmd == "RUN" {
			static = static || strings.Contains(in.args, "make build-static")
			cgo = cgo || strings.Contains(in.args, "CGO_ENABLED=1 make build ")
		}
	}
	if !static || !cgo {
		t.Errorf("got build stage %v, want RUN make build-static and CGO_ENABLED=1 make build (the flags of a local build)", stages[0])
	}
	byName := map[string][]instruction{}
	for _, stage := range stages {
		if _, name, ok := strings.Cut(stage[0].args, " AS "); ok {
			byName[strings.TrimSpace(name)] = stage
		}
	}
	tests := map[string]struct {
		base, bin, cmd string
	}{
		// The static binary needs no C library.
		"scaler": {base: "distroless/static", bin: "bin/gpuscaler-static", cmd: `["scaler"]`},
		// cgo: glibc.
		"collector": {base: "distroless/base", bin: "bin/gpuscaler ", cmd: `["collector"]`},
	}
	for target, tc := range tests {
		stage, ok := byName[target]
		if !ok {
			t.Errorf("no stage %q (docker build --target %s)", target, target)
			continue
		}
		get := func(cmd string) string {
			var v string
			for _, in := range stage {
				if in.cmd == cmd {
					v = in.args
				}
			}
			return v
		}
		if from := get("FROM"); !strings.Contains(from, tc.base) {
			t.Errorf("%s: got image %q, want %s", target, from, tc.base)
		}
		if user := get("USER"); user == "" || strings.HasPrefix(user, "0") || strings.HasPrefix(user, "root") {
			t.Errorf("%s: got USER %q, want a non-root user", target, user)
		}
		if ep := get("ENTRYPOINT"); !strings.Contains(ep, "gpuscaler") {
			t.Errorf("%s: got ENTRYPOINT %q, want gpuscaler", target, ep)
		}
		if cmd := get("CMD"); cmd != tc.cmd {
			t.Errorf("%s: got CMD %q, want %s", target, cmd, tc.cmd)
		}
		if cp := get("COPY"); !strings.Contains(cp, "--from=build") || !strings.Contains(cp+" ", tc.bin) {
			t.Errorf("%s: got COPY %q, want %s copied from the build stage", target, cp, strings.TrimSpace(tc.bin))
		}
		if labels := get("LABEL"); !strings.Contains(labels, "org.opencontainers.image.version") {
			t.Errorf("%s: got LABEL %q, want the OCI labels", target, labels)
		}
	}

	// Every package of the binary must be in the build context.
	ignore, err := os.ReadFile(filepath.Join(r, ".dockerignore"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("go", "list", "-deps", "-f", "{{if .Module}}{{if .Module.Main}}{{.Dir}}{{end}}{{end}}", "./cmd/gpuscaler")
	cmd.Dir = r
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	if len(strings.Fields(string(out))) < 3 {
		t.Fatalf("got packages %q from go list, want gpuscaler's", out)
	}
	for dir := range strings.FieldsSeq(string(out)) {
		rel, _ := filepath.Rel(r, dir)
		for pattern := range strings.Lines(string(ignore)) {
			pattern = strings.TrimSpace(pattern)
			if pattern == "" || strings.HasPrefix(pattern, "#") {
				continue
			}
			if rel == pattern || strings.HasPrefix(rel, pattern+"/") {
				t.Errorf(".dockerignore's %q leaves out %s, which gpuscaler is built from", pattern, rel)
			}
		}
	}
}
