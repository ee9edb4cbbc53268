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
// build whose binary comes from `make build` with cgo on, a glibc runtime image, a
// non-root user, gpuscaler as the entrypoint, and a .dockerignore that keeps every
// package the binary needs in the build context.
func TestDockerfile(t *testing.T) {
	r := root(t)
	stages := parseDockerfile(t, filepath.Join(r, "Dockerfile"))
	if len(stages) < 2 {
		t.Fatalf("got %d stages, want a build stage and a runtime stage", len(stages))
	}
	var built bool
	for _, in := range stages[0] {
		if in.cmd == "RUN" && strings.Contains(in.args, "CGO_ENABLED=1 make build") {
			built = true
		}
	}
	if !built {
		t.Errorf("got build stage %v, want RUN CGO_ENABLED=1 make build (the flags of a local build)", stages[0])
	}
	final := stages[len(stages)-1]
	get := func(cmd string) string {
		var v string
		for _, in := range final {
			if in.cmd == cmd {
				v = in.args
			}
		}
		return v
	}
	if from := get("FROM"); !strings.Contains(from, "distroless/base") && !strings.Contains(from, "debian") && !strings.Contains(from, "ubuntu") {
		t.Errorf("got runtime image %q, want one with glibc (cgo)", from)
	}
	if user := get("USER"); user == "" || strings.HasPrefix(user, "0") || strings.HasPrefix(user, "root") {
		t.Errorf("got USER %q, want a non-root user", user)
	}
	if ep := get("ENTRYPOINT"); !strings.Contains(ep, "gpuscaler") {
		t.Errorf("got ENTRYPOINT %q, want gpuscaler", ep)
	}
	if cp := get("COPY"); !strings.Contains(cp, "--from=") {
		t.Errorf("got COPY %q, want the binary copied from the build stage", cp)
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
