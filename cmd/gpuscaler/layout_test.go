package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
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
// One package of a part is shared: scaler/demand, the arithmetic of a queue's traffic,
// which a producer runs on what it measures and the scaler on what it reads (allowed);
// it depends on proto alone.
var importRules = []struct {
	under     string
	forbidden []string
	allowed   []string
}{
	{"collector", []string{"scaler", "gateway", "authcallout", "queue", "cmd"}, nil},
	{"scaler", []string{"collector", "gateway", "authcallout", "queue", "cmd"}, nil},
	{"scaler/demand", []string{"scaler/metadata", "scaler/apipods", "scaler/scalertest", "internal"}, nil},
	{"gateway", []string{"scaler", "collector", "authcallout", "cmd"}, []string{"scaler/demand"}},
	{"queue", []string{"scaler", "collector", "gateway", "authcallout", "cmd"}, []string{"scaler/demand"}},
	{"authcallout", []string{"scaler", "collector", "gateway", "queue", "cmd"}, nil},
	{"proto", []string{"scaler", "collector", "gateway", "authcallout", "queue", "internal", "cmd"}, nil},
	{"internal", []string{"scaler", "collector", "gateway", "authcallout", "queue", "cmd"}, nil},
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
				if slices.ContainsFunc(r.allowed, func(a string) bool { return under(d, a) }) {
					continue
				}
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

// layoutTable returns the folders CONTRIBUTING.md's layout table names in its first
// column, in backquotes.
func layoutTable(t *testing.T) []string {
	t.Helper()
	doc := readRepoFile(t, "CONTRIBUTING.md")
	_, section, ok := strings.Cut(doc, "\n## Layout\n")
	if !ok {
		t.Fatal(`CONTRIBUTING.md has no "## Layout" section`)
	}
	section, _, _ = strings.Cut(section, "\n## ")
	var folders []string
	for line := range strings.SplitSeq(section, "\n") {
		cells := strings.Split(line, "|")
		if len(cells) < 3 || !strings.Contains(cells[1], "`") {
			continue
		}
		for _, m := range regexp.MustCompile("`([^`]+)`").FindAllStringSubmatch(cells[1], -1) {
			folders = append(folders, strings.TrimSuffix(m[1], "/"))
		}
	}
	if len(folders) == 0 {
		t.Fatal("CONTRIBUTING.md's layout table names no folder")
	}
	return folders
}

// TestLayoutTableNamesEveryFolder: the layout table is the map a newcomer reads, so it
// names only folders that exist, every top-level folder (itself or folders in it), every
// package folder (itself or a folder above it), and, one by one, every package directly
// under collector/ and cmd/gpuscaler/internal/ (the GPU sources and the applications).
func TestLayoutTableNamesEveryFolder(t *testing.T) {
	named := layoutTable(t)
	for _, f := range named {
		if st, err := os.Stat(filepath.Join(repoRoot, f)); err != nil || !st.IsDir() {
			t.Errorf("CONTRIBUTING.md's layout table names %s, which is not a folder here", f)
		}
	}
	entries, err := os.ReadDir(repoRoot)
	if err != nil {
		t.Fatal(err)
	}
	tracked, err := exec.CommandContext(t.Context(), "git", "-C", repoRoot, "ls-files").Output()
	if err != nil {
		t.Skip("not a git checkout:", err)
	}
	for _, e := range entries {
		if e.IsDir() && !strings.HasPrefix(e.Name(), ".") && strings.Contains("\n"+string(tracked), "\n"+e.Name()+"/") &&
			!slices.ContainsFunc(named, func(f string) bool { return under(f, e.Name()) }) {
			t.Errorf("the top-level folder %s is not in CONTRIBUTING.md's layout table", e.Name())
		}
	}
	out, err := exec.CommandContext(t.Context(), "go", "list", "-f", "{{.ImportPath}}", repoRoot+"/...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	for line := range strings.SplitSeq(strings.TrimSpace(string(out)), "\n") {
		pkg := strings.TrimPrefix(line, modulePath)
		if !slices.ContainsFunc(named, func(f string) bool { return under(pkg, f) }) {
			t.Errorf("package folder %s is not in CONTRIBUTING.md's layout table, nor a folder above it", pkg)
		}
		for _, parent := range []string{"collector/", "cmd/gpuscaler/internal/"} {
			if rest, ok := strings.CutPrefix(pkg, parent); ok && !strings.Contains(rest, "/") && !slices.Contains(named, pkg) {
				t.Errorf("%s is not named in CONTRIBUTING.md's layout table: every package directly under %s is", pkg, parent)
			}
		}
	}
}
