package main

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

const modulePath = "github.com/gpuscaler/gpuscaler/"

// importRules are the layout's rules (CONTRIBUTING.md, "Layout"): for the packages under
// a folder, the folders none of them may depend on, directly or through another package.
// The parts meet only in proto's event contract: the collector never carries the scaler
// and the scaler never knows how a node measured its GPUs; the gateway is a producer and
// nothing more; plumbing (internal/) serves every part and depends on none; no part
// depends on an application (cmd/gpuscaler/internal/, where only cmd can reach them).
var importRules = []struct {
	under     string
	forbidden []string
}{
	{"collector", []string{"scaler", "gateway", "authcallout", "queue", "cmd"}},
	{"scaler", []string{"collector", "gateway", "authcallout", "queue", "cmd"}},
	{"gateway", []string{"scaler", "collector", "authcallout", "cmd"}},
	{"queue", []string{"scaler", "collector", "gateway", "authcallout", "cmd"}},
	{"authcallout", []string{"scaler", "collector", "gateway", "queue", "cmd"}},
	{"proto", []string{"scaler", "collector", "gateway", "authcallout", "queue", "internal", "cmd"}},
	{"internal", []string{"scaler", "collector", "gateway", "authcallout", "queue", "cmd"}},
}

// under reports whether the package path (module-relative) is folder or below it.
func under(pkg, folder string) bool {
	return pkg == folder || strings.HasPrefix(pkg, folder+"/")
}

// TestLayoutImportsRunOneWay checks importRules on what the packages really link, tests
// aside (a collector test may run a real scaler): go list's transitive dependencies.
func TestLayoutImportsRunOneWay(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go list")
	}
	out, err := exec.CommandContext(t.Context(), "go", "list", "-f", "{{.ImportPath}}{{range .Deps}} {{.}}{{end}}", repoRoot+"/...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	checked := map[string]int{}
	for line := range strings.SplitSeq(strings.TrimSpace(string(out)), "\n") {
		fields := strings.Fields(line)
		pkg, ok := strings.CutPrefix(fields[0], modulePath)
		if !ok {
			t.Fatalf("go list named %s, outside the module", fields[0])
		}
		var deps []string
		for _, d := range fields[1:] {
			if rel, ok := strings.CutPrefix(d, modulePath); ok {
				deps = append(deps, rel)
			}
		}
		for _, r := range importRules {
			if !under(pkg, r.under) {
				continue
			}
			checked[r.under]++
			for _, d := range deps {
				if i := slices.IndexFunc(r.forbidden, func(f string) bool { return under(d, f) }); i >= 0 {
					t.Errorf("%s depends on %s: nothing under %s/ may depend on %s/", pkg, d, r.under, r.forbidden[i])
				}
			}
		}
	}
	for _, r := range importRules {
		if checked[r.under] == 0 {
			t.Errorf("no package under %s/: the rule checks nothing (a folder renamed?)", r.under)
		}
	}
}
