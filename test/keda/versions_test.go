package keda

import (
	"encoding/json"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// TestKEDAsOwnVersions checks that the KEDA client under test is built as KEDA builds
// it: every module KEDA's go.mod requires is linked into this test at exactly that
// version. A requirement of this module that lifted one (a newer nats.go lifting
// golang.org/x/sys, say) would test KEDA's code against dependencies it does not ship
// with, and would no longer share compiled packages with other builds of KEDA.
func TestKEDAsOwnVersions(t *testing.T) {
	// The modules of the packages compiled into this test (a test binary carries no
	// module list of its own).
	out, err := exec.CommandContext(t.Context(), "go", "list", "-deps", "-test",
		"-f", "{{with .Module}}{{.Path}} {{.Version}} {{with .Replace}}{{.Path}}{{end}}{{end}}", ".").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	linked := map[string]string{}
	for line := range strings.Lines(string(out)) {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		// Our own test helpers (test/testkit, the standard library only) are the one
		// replacement: they come from this checkout, and lift no dependency.
		if len(f) > 2 && !strings.HasPrefix(f[0], "github.com/gpuscaler/gpuscaler/") {
			t.Errorf("%s %s is replaced by %s: this module replaces only its own helpers", f[0], f[1], f[2])
		}
		if len(f) > 1 {
			linked[f[0]] = f[1]
		}
	}
	const keda = "github.com/kedacore/keda/v2"
	kedaVersion := linked[keda]
	if kedaVersion == "" {
		t.Fatalf("no package of %s in the test's dependencies", keda)
	}

	out, err = exec.CommandContext(t.Context(), "go", "mod", "download", "-json", keda+"@"+kedaVersion).Output()
	if err != nil {
		t.Fatalf("go mod download %s@%s: %v", keda, kedaVersion, err)
	}
	var mod struct{ GoMod string }
	if err := json.Unmarshal(out, &mod); err != nil || mod.GoMod == "" {
		t.Fatalf("go mod download -json gave %q (%v), want the GoMod path", out, err)
	}
	data, err := os.ReadFile(mod.GoMod)
	if err != nil {
		t.Fatal(err)
	}
	required, replaced := parseRequirements(string(data))

	compared := 0
	for path, got := range linked {
		want, ok := required[path]
		if !ok || replaced[path] {
			continue
		}
		compared++
		if got != want {
			t.Errorf("%s: got %s, want %s as in KEDA %s's go.mod", path, got, want, kedaVersion)
		}
	}
	// KEDA's scalers link hundreds of modules; a handful would mean the parse went wrong.
	if compared < 100 {
		t.Errorf("compared %d modules with KEDA's go.mod, want at least 100", compared)
	}
	t.Logf("compared the versions of %d modules compiled into this test with KEDA %s's go.mod", compared, kedaVersion)
}

// parseRequirements reads the require directives of a go.mod file (blocks or single
// lines), and the module paths its replace directives replace. KEDA's replacements do not
// apply here: only a main module's replace directives count.
func parseRequirements(gomod string) (required map[string]string, replaced map[string]bool) {
	required, replaced = map[string]string{}, map[string]bool{}
	block := "" // the directive of the ( … ) block being read
	for raw := range strings.Lines(gomod) {
		line, _, _ := strings.Cut(raw, "//")
		f := strings.Fields(line)
		directive := block
		switch {
		case len(f) == 0:
			continue
		case block != "" && f[0] == ")":
			block = ""
			continue
		case block == "" && len(f) == 2 && f[1] == "(":
			block = f[0]
			continue
		case block == "":
			directive, f = f[0], f[1:]
		}
		switch {
		case directive == "require" && len(f) >= 2:
			required[f[0]] = f[1]
		case directive == "replace" && len(f) >= 1:
			replaced[f[0]] = true
		}
	}
	return required, replaced
}
