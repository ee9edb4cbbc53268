package main

import (
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// repoRoot is the repository's root, from this package's directory.
const repoRoot = "../.."

func readRepoFile(t *testing.T, name string) string {
	t.Helper()
	data, err := os.ReadFile(repoRoot + "/" + name)
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

// documentedTargets are the Makefile's targets with a "## " description, in order.
func documentedTargets(t *testing.T) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, m := range regexp.MustCompile(`(?m)^([^\s:#=$]+):[^=\n]*?## (.+)$`).FindAllStringSubmatch(readRepoFile(t, "Makefile"), -1) {
		out[m[1]] = m[2]
	}
	if len(out) == 0 {
		t.Fatal("found no documented target in the Makefile")
	}
	return out
}

// TestMakeHelpListsEveryTarget: make help missed e2e, whose name has a digit its pattern
// did not allow. Every target with a "## " description must be listed with it.
func TestMakeHelpListsEveryTarget(t *testing.T) {
	if _, err := exec.LookPath("make"); err != nil {
		t.Skip("no make on this machine")
	}
	cmd := exec.Command("make", "-s", "help")
	cmd.Dir = repoRoot
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("make help: %v\n%s", err, out)
	}
	listed := map[string]string{}
	for line := range strings.SplitSeq(strings.TrimRight(string(out), "\n"), "\n") {
		name, desc, _ := strings.Cut(strings.TrimSpace(line), " ")
		listed[name] = strings.TrimSpace(desc)
	}
	for target, desc := range documentedTargets(t) {
		got, ok := listed[target]
		if !ok {
			t.Errorf("make help does not list %q; it printed:\n%s", target, out)
			continue
		}
		if got != desc {
			t.Errorf("make help lists %q as %q, want %q", target, got, desc)
		}
	}
}

// docPages are the pages whose commands, links and figures the tests below check: the
// README, CONTRIBUTING.md and every page of docs/ (not docs/figures/, the records they
// quote).
func docPages(t *testing.T) []string {
	t.Helper()
	pages, err := filepath.Glob(filepath.Join(repoRoot, "docs", "*.md"))
	if err != nil || len(pages) == 0 {
		t.Fatalf("no page in docs/: %v", err)
	}
	out := []string{"README.md", "CONTRIBUTING.md"}
	for _, p := range pages {
		out = append(out, "docs/"+filepath.Base(p))
	}
	return out
}

// docCommand is a command a page gives.
type docCommand struct{ page, line string }

// docCommands returns the commands starting with prefix that the pages give, in
// backquotes or as lines of a code block.
func docCommands(t *testing.T, prefix string) []docCommand {
	t.Helper()
	var out []docCommand
	for _, page := range docPages(t) {
		text := readRepoFile(t, page)
		for _, m := range regexp.MustCompile("`("+regexp.QuoteMeta(prefix)+"[^`]*)`").FindAllStringSubmatch(text, -1) {
			out = append(out, docCommand{page, m[1]})
		}
		fenced := false
		for line := range strings.SplitSeq(text, "\n") {
			if strings.HasPrefix(line, "```") {
				fenced = !fenced
				continue
			}
			if fenced && strings.HasPrefix(line, prefix) {
				cmd, _, _ := strings.Cut(line, "#")
				out = append(out, docCommand{page, strings.TrimSpace(cmd)})
			}
		}
	}
	return out
}

// shellWords splits a command line as a POSIX shell would, for the quoting README's
// commands use: single and double quotes, no escapes or expansions.
func shellWords(t *testing.T, line string) []string {
	t.Helper()
	var (
		words []string
		word  strings.Builder
		in    bool // inside a word
		quote rune
	)
	for _, r := range line {
		switch {
		case quote != 0 && r == quote:
			quote = 0
		case quote != 0:
			word.WriteRune(r)
		case r == '\'' || r == '"':
			quote, in = r, true
		case r == ' ' || r == '\t':
			if in {
				words = append(words, word.String())
				word.Reset()
				in = false
			}
		default:
			word.WriteRune(r)
			in = true
		}
	}
	if quote != 0 {
		t.Fatalf("unterminated quote in %q", line)
	}
	if in {
		words = append(words, word.String())
	}
	return words
}

// TestDocGoTestCommandsRun: the README gave `go test -bench ./queue`, where -bench takes
// the path as its pattern and no package is left to test. Every `go test` command that
// names a package, in the README, CONTRIBUTING.md or docs/, must be one go test accepts,
// run from the repository root; -n makes go print what it would do, without building or
// running.
func TestDocGoTestCommandsRun(t *testing.T) {
	checked := map[string]bool{}
	for _, c := range docCommands(t, "go test ") {
		if !strings.Contains(c.line, "./") || checked[c.line] {
			continue // a description, such as "go test -race", not a command to copy; or one already run
		}
		checked[c.line] = true
		t.Run(c.line, func(t *testing.T) {
			t.Parallel()
			args := shellWords(t, c.line)[2:]
			cmd := exec.Command("go", append([]string{"test", "-n"}, args...)...)
			cmd.Dir = repoRoot
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Errorf("%s says %s, which fails run from the repository root: %v\n%s", c.page, c.line, err, lastLines(string(out), 5))
			}
		})
	}
	if len(checked) == 0 {
		t.Fatal("found no go test command in the docs")
	}
}

// TestDocMakeTargetsExist: every `make X` the README, CONTRIBUTING.md or docs/ names is a
// target of the Makefile.
func TestDocMakeTargetsExist(t *testing.T) {
	targets := documentedTargets(t)
	checked := 0
	for _, c := range docCommands(t, "make ") {
		words := shellWords(t, c.line)
		if len(words) < 2 || strings.Contains(words[1], "=") {
			continue
		}
		checked++
		if _, ok := targets[words[1]]; !ok {
			t.Errorf("%s says %q; the Makefile has no documented target %q (it has %q)", c.page, c.line, words[1], slices.Sorted(maps.Keys(targets)))
		}
	}
	if checked == 0 {
		t.Fatal("found no make command in the docs")
	}
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// TestGatewayDocMatches: every flag docs/gateway.md names is one gpuscaler gateway has,
// every gateway metric it names is one the gateway registers, and it names them all.
func TestGatewayDocMatches(t *testing.T) {
	doc := readRepoFile(t, "docs/gateway.md")
	help := runCLI(t.Context(), nil, "gateway", "--help")
	for _, m := range regexp.MustCompile("`(--[a-z-]+)").FindAllStringSubmatch(doc, -1) {
		if !strings.Contains(help.stdout, "  "+m[1]+" ") {
			t.Errorf("docs/gateway.md names %s, which gpuscaler gateway --help does not list", m[1])
		}
	}
	metrics := readRepoFile(t, "gateway/metrics.go")
	registered := regexp.MustCompile(`Name: +"(gpuscaler_gateway_[a-z_]+)"`).FindAllStringSubmatch(metrics, -1)
	if len(registered) == 0 {
		t.Fatal("found no metric in gateway/metrics.go")
	}
	for _, m := range registered {
		if !strings.Contains(doc, "`"+m[1]) {
			t.Errorf("docs/gateway.md does not name metric %s", m[1])
		}
	}
	for _, m := range regexp.MustCompile("`(gpuscaler_gateway_[a-z_]+)").FindAllStringSubmatch(doc, -1) {
		if !strings.Contains(metrics, `"`+m[1]+`"`) {
			t.Errorf("docs/gateway.md names metric %s, which the gateway does not register", m[1])
		}
	}
}
