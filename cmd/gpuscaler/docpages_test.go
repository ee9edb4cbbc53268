package main

import (
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode"

	"github.com/gpuscaler/gpuscaler/cmd/gpuscaler/internal/bench"
)

// readmeMaxLines bounds the front page: what it is, the two commands, one example, the
// picture, install and links; everything else is a page of docs/.
const readmeMaxLines = 200

// TestReadmeIsAFrontPage: the README grew to 1,400 lines, holding every topic. It stays a
// page a newcomer reads in five minutes, and finds every other page from in one click.
func TestReadmeIsAFrontPage(t *testing.T) {
	readme := readRepoFile(t, "README.md")
	if n := strings.Count(readme, "\n"); n > readmeMaxLines {
		t.Errorf("README.md is %d lines, want at most %d: move the detail to a page of docs/ and link it", n, readmeMaxLines)
	}
	for _, page := range docPages(t)[1:] {
		if !strings.Contains(readme, "]("+page+")") && !strings.Contains(readme, "]("+page+"#") {
			t.Errorf("README.md does not link %s", page)
		}
	}
}

// withoutCode blanks the lines of fenced code blocks, whose brackets are not links.
func withoutCode(text string) string {
	lines := strings.Split(text, "\n")
	fenced := false
	for i, line := range lines {
		if strings.HasPrefix(line, "```") {
			fenced = !fenced
			lines[i] = ""
			continue
		}
		if fenced {
			lines[i] = ""
		}
	}
	return strings.Join(lines, "\n")
}

var (
	mdLink    = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	mdHeading = regexp.MustCompile(`(?m)^#{1,6} +(.+?) *$`)
)

// headingAnchors returns the anchors GitHub gives a page's headings: lower case, every
// character but letters, digits, spaces, '-' and '_' dropped, spaces made '-', and a
// repeated anchor numbered "-1", "-2"...
func headingAnchors(text string) map[string]bool {
	anchors := map[string]bool{}
	seen := map[string]int{}
	for _, m := range mdHeading.FindAllStringSubmatch(withoutCode(text), -1) {
		var b strings.Builder
		for _, r := range strings.ToLower(m[1]) {
			switch {
			case unicode.IsLetter(r) || unicode.IsDigit(r) || r == '-' || r == '_':
				b.WriteRune(r)
			case r == ' ':
				b.WriteRune('-')
			}
		}
		a := b.String()
		if n := seen[a]; n > 0 {
			anchors[fmt.Sprintf("%s-%d", a, n)] = true
		} else {
			anchors[a] = true
		}
		seen[a]++
	}
	return anchors
}

// TestDocLinksResolve: every relative link of the README, CONTRIBUTING.md and docs/ names
// a file or folder that exists, and a link to a heading (#anchor) of a Markdown page names
// one the page has. Pages move; a link to where one was is the first thing a newcomer trips on.
func TestDocLinksResolve(t *testing.T) {
	checked := 0
	for _, page := range docPages(t) {
		text := readRepoFile(t, page)
		for _, m := range mdLink.FindAllStringSubmatch(withoutCode(text), -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			checked++
			file, anchor, _ := strings.Cut(target, "#")
			name := page // a bare #anchor is on the page itself
			if file != "" {
				name = path.Join(path.Dir(page), file)
				if _, err := os.Stat(filepath.Join(repoRoot, name)); err != nil {
					t.Errorf("%s links %s: %s does not exist", page, target, name)
					continue
				}
			}
			if anchor == "" || !strings.HasSuffix(name, ".md") {
				continue
			}
			if !headingAnchors(readRepoFile(t, name))[anchor] {
				t.Errorf("%s links %s: %s has no heading whose anchor is #%s", page, target, name, anchor)
			}
		}
	}
	if checked == 0 {
		t.Fatal("found no relative link in the docs")
	}

	// The other Markdown files of the repository (deploy/, examples/, test/...) linked
	// sections of the README that are pages of docs/ now: their links into these pages
	// must resolve too.
	own := map[string]bool{}
	for _, p := range docPages(t) {
		own[p] = true
	}
	for rel, p := range repoFiles(t, ".md") {
		if own[rel] || strings.HasPrefix(rel, figuresDir) {
			continue
		}
		data, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range mdLink.FindAllStringSubmatch(withoutCode(string(data)), -1) {
			file, anchor, _ := strings.Cut(m[1], "#")
			if file == "" || strings.Contains(file, "://") {
				continue
			}
			name := path.Join(path.Dir(rel), file)
			if !own[name] && !strings.HasPrefix(name, "docs/") {
				continue
			}
			if _, err := os.Stat(filepath.Join(repoRoot, name)); err != nil {
				t.Errorf("%s links %s: %s does not exist", rel, m[1], name)
				continue
			}
			if anchor != "" && strings.HasSuffix(name, ".md") && !headingAnchors(readRepoFile(t, name))[anchor] {
				t.Errorf("%s links %s: %s has no heading whose anchor is #%s", rel, m[1], name, anchor)
			}
		}
	}
}

// figuresDir holds the records of measured runs that the pages quote.
const figuresDir = "docs/figures/"

var (
	figureMarker  = regexp.MustCompile(`^<!-- figures from (\S+): (start|end) -->$`)
	inPlaceMarker = regexp.MustCompile(`<!-- ([a-z0-9-]+):start -->`)
)

// recordBody returns a record's figures: what follows the comment at its head, which must
// say where the figures were recorded ("Recorded: " the command, the machine, the date).
func recordBody(t *testing.T, name string) ([]string, error) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(repoRoot, name))
	if err != nil {
		return nil, err
	}
	head, body, ok := strings.Cut(string(data), "-->\n")
	if !ok || !strings.HasPrefix(head, "<!--") || !strings.Contains(head, "Recorded: ") {
		return nil, fmt.Errorf("%s does not start with a <!-- Recorded: ... --> comment saying what run it holds, where and when", name)
	}
	return strings.Split(strings.Trim(body, "\n"), "\n"), nil
}

// quoteMatches says whether quote is record's lines, in order: lines that follow each
// other in the quote follow each other in the record, except across a line "…", which
// stands for lines left out.
func quoteMatches(quote, record []string) (bool, string) {
	trim := func(s string) string { return strings.TrimRight(s, " \t") }
	var segments [][]string
	cur := []string{}
	for _, l := range quote {
		if strings.TrimSpace(l) == "…" {
			segments = append(segments, cur)
			cur = []string{}
			continue
		}
		cur = append(cur, trim(l))
	}
	segments = append(segments, cur)
	from := 0
	for _, seg := range segments {
		if len(seg) == 0 {
			continue
		}
		found := -1
		for i := from; i+len(seg) <= len(record) && found < 0; i++ {
			match := true
			for j, l := range seg {
				if trim(record[i+j]) != l {
					match = false
					break
				}
			}
			if match {
				found = i
			}
		}
		if found < 0 {
			return false, seg[0]
		}
		from = found + len(seg)
	}
	return true, ""
}

// TestDocFiguresMatchRecords: a figure typed twice drifts (the always-on row's p99 was
// 2.20 s in the demo's output and 2.9 s in the prose below it). So every measured figure
// in the README and docs/ is quoted, between "<!-- figures from docs/figures/<record>:
// start -->" and "... end -->", from a record of the run that measured it, which names the
// command, the machine and the date; a quote may leave lines out where it says "…". The
// gateway's tables are written in place by the script that measures them, which must name
// their markers. And no record lies unquoted.
func TestDocFiguresMatchRecords(t *testing.T) {
	quoted := map[string]bool{}
	for _, page := range docPages(t) {
		text := readRepoFile(t, page)
		var (
			open  string // the record of the quote being read
			quote []string
		)
		for i, line := range strings.Split(text, "\n") {
			m := figureMarker.FindStringSubmatch(line)
			switch {
			case m != nil && m[2] == "start":
				if open != "" {
					t.Errorf("%s:%d: a quote of %s starts inside the quote of %s", page, i+1, m[1], open)
				}
				open, quote = m[1], nil
			case m != nil && m[2] == "end":
				if m[1] != open {
					t.Errorf("%s:%d: the end of a quote of %s, in %q", page, i+1, m[1], open)
					open = ""
					continue
				}
				quoted[open] = true
				if !strings.HasPrefix(open, figuresDir) {
					t.Errorf("%s:%d: quotes %s, want a record in %s", page, i+1, open, figuresDir)
				}
				record, err := recordBody(t, open)
				if err != nil {
					t.Errorf("%s:%d: %v", page, i+1, err)
				} else if len(quote) > 0 && strings.HasPrefix(quote[0], "```") && strings.HasPrefix(quote[len(quote)-1], "```") {
					quote = quote[1 : len(quote)-1]
				}
				if err == nil {
					if ok, first := quoteMatches(quote, record); !ok {
						t.Errorf("%s:%d: the quote of %s differs from the record: no lines of the record, after those quoted before, read as the quote's from %q to its next \"…\"; copy the record's lines, or rerun what the record names and replace the record", page, i+1, open, first)
					}
				}
				open = ""
			case open != "":
				quote = append(quote, line)
			}
		}
		if open != "" {
			t.Errorf("%s: the quote of %s has no end marker", page, open)
		}
		for _, m := range inPlaceMarker.FindAllStringSubmatch(text, -1) {
			scripts, _ := filepath.Glob(filepath.Join(repoRoot, "hack", "*.sh"))
			writer := ""
			for _, s := range scripts {
				if data, err := os.ReadFile(s); err == nil && strings.Contains(string(data), m[0]) {
					writer = s
				}
			}
			if writer == "" {
				t.Errorf("%s: no script in hack/ writes the figures between %s and its end", page, m[0])
			}
		}
	}
	records, _ := filepath.Glob(filepath.Join(repoRoot, figuresDir, "*"))
	if len(records) == 0 {
		t.Fatalf("no record in %s", figuresDir)
	}
	for _, r := range records {
		if name := figuresDir + filepath.Base(r); !quoted[name] {
			t.Errorf("%s is quoted by no page: quote it where its figures are discussed, or remove it", name)
		}
	}
}

// flagDefaults returns each flag a command's --help lists, with its default as the help
// prints it ("" when it has none).
func flagDefaults(t *testing.T, command ...string) map[string]string {
	t.Helper()
	r := runCLI(t.Context(), nil, append(command, "--help")...)
	out := map[string]string{}
	var flag string
	for line := range strings.SplitSeq(r.stdout, "\n") {
		if m := regexp.MustCompile(`^  (--[a-z0-9-]+)`).FindStringSubmatch(line); m != nil {
			flag = m[1]
			out[flag] = ""
			continue
		}
		if m := regexp.MustCompile(`\(default ("[^"]*"|[^)\s]+)\)`).FindStringSubmatch(line); m != nil && flag != "" {
			out[flag] = strings.Trim(m[1], `"`)
		}
	}
	if len(out) == 0 {
		t.Fatalf("gpuscaler %s --help listed no flag: %v", command, r)
	}
	return out
}

// sameDefault compares a default the docs give with the one --help prints: durations as
// durations (15m is 15m0s), anything else as written.
func sameDefault(doc, help string) bool {
	if doc == help {
		return true
	}
	d, err1 := time.ParseDuration(doc)
	h, err2 := time.ParseDuration(help)
	return err1 == nil && err2 == nil && d == h
}

// foreignFlags are flags the docs name that belong to another program than gpuscaler.
var foreignFlags = map[string]string{
	"--seeds":                   "hack/replay-matrix.py's",
	"--speeds":                  "hack/replay-matrix.py's",
	"--kubernetes-virtual-gpus": "dcgm-exporter's",
}

// TestDocFlagDefaults: the flags the docs name are gpuscaler's, and the defaults they give
// are the ones the binary has. docs/operating.md's flag table lists the scaler's flags,
// each with its default; every flag it names is one gpuscaler scaler has, with that
// default. Anywhere in the docs, a flag written with its default in brackets
// ("`--stream-max-age` (15m)") has that default in one of the commands that take it.
func TestDocFlagDefaults(t *testing.T) {
	scaler := flagDefaults(t, "scaler")
	byCommand := map[string]map[string]string{"scaler": scaler}
	for _, c := range [][]string{{"collector"}, {"auth-callout"}, {"gateway"}, {"demo"}, {"replay"}, {"bench"}, {"explain"}, {"publish", "queue"}, {"publish", "node"}} {
		byCommand[strings.Join(c, " ")] = flagDefaults(t, c...)
	}

	named := regexp.MustCompile("`(--[a-z0-9-]+)[ `=]")
	for _, p := range docPages(t) {
		for _, m := range named.FindAllStringSubmatch(readRepoFile(t, p), -1) {
			known := foreignFlags[m[1]] != ""
			for _, flags := range byCommand {
				_, has := flags[m[1]]
				known = known || has
			}
			if !known {
				t.Errorf("%s names %s, which no gpuscaler command's --help lists", p, m[1])
			}
		}
	}

	const page = "docs/operating.md"
	rows := 0
	for line := range strings.SplitSeq(readRepoFile(t, page), "\n") {
		if !strings.HasPrefix(line, "| `--") {
			continue
		}
		rows++
		cells := strings.Split(strings.Trim(line, "|"), " | ")
		flags := regexp.MustCompile("`(--[a-z0-9-]+)`").FindAllStringSubmatch(cells[0], -1)
		defaults := regexp.MustCompile("`([^`]+)`").FindAllStringSubmatch(cells[1], -1)
		for i, f := range flags {
			help, ok := scaler[f[1]]
			if !ok {
				t.Errorf("%s's flag table lists %s, which gpuscaler scaler --help does not", page, f[1])
				continue
			}
			if i < len(defaults) && !sameDefault(defaults[i][1], help) {
				t.Errorf("%s gives %s's default as %q; gpuscaler scaler --help says %q", page, f[1], defaults[i][1], help)
			}
		}
	}
	if rows == 0 {
		t.Fatalf("found no flag table in %s", page)
	}

	inBrackets := regexp.MustCompile("`(--[a-z0-9-]+)` \\((?:default )?([0-9][0-9a-z.]*)\\)")
	for _, p := range docPages(t) {
		for _, m := range inBrackets.FindAllStringSubmatch(readRepoFile(t, p), -1) {
			var seen []string
			ok := false
			for c, flags := range byCommand {
				if help, has := flags[m[1]]; has {
					seen = append(seen, fmt.Sprintf("%s: %q", c, help))
					ok = ok || sameDefault(m[2], help)
				}
			}
			if !ok {
				t.Errorf("%s gives %s's default as %s; the commands that take it say %s", p, m[1], m[2], seen)
			}
		}
	}
}

// registeredMetrics returns the names of the Prometheus metrics the non-test Go files
// under dir register, with the given prefix.
func registeredMetrics(t *testing.T, dir, prefix string) []string {
	t.Helper()
	re := regexp.MustCompile(`(?:Name: +|NewDesc\()"(` + regexp.QuoteMeta(prefix) + `[a-z_]+)"`)
	var out []string
	err := filepath.WalkDir(filepath.Join(repoRoot, dir), func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
			return err
		}
		data, err := os.ReadFile(p)
		for _, m := range re.FindAllStringSubmatch(string(data), -1) {
			if !slices.Contains(out, m[1]) {
				out = append(out, m[1])
			}
		}
		return err
	})
	if err != nil || len(out) == 0 {
		t.Fatalf("found no %s metric under %s: %v", prefix, dir, err)
	}
	return out
}

// TestDocMetricsRegistered: every metric of the scaler, the auth callout and the collector
// that the docs name is one the code registers, and each page that lists a part's metrics
// names them all (docs/gateway.md's are TestGatewayDocMatches').
func TestDocMetricsRegistered(t *testing.T) {
	parts := []struct{ dir, prefix, page string }{
		{"scaler", "gpuscaler_scaler_", "docs/operating.md"},
		{"authcallout", "gpuscaler_auth_callout_", "docs/operating.md"},
		{"collector", "gpuscaler_collector_", "docs/collector.md"},
	}
	for _, part := range parts {
		registered := registeredMetrics(t, part.dir, part.prefix)
		list := readRepoFile(t, part.page)
		for _, m := range registered {
			if !strings.Contains(list, "`"+m) {
				t.Errorf("%s does not name %s, which %s/ registers", part.page, m, part.dir)
			}
		}
		named := regexp.MustCompile("`(" + regexp.QuoteMeta(part.prefix) + "[a-z_]+)")
		for _, p := range docPages(t) {
			for _, m := range named.FindAllStringSubmatch(readRepoFile(t, p), -1) {
				if !slices.Contains(registered, m[1]) {
					t.Errorf("%s names metric %s, which %s/ does not register", p, m[1], part.dir)
				}
			}
		}
	}
}

// thousands writes n with a comma between each group of three digits, as the docs do.
func thousands(n int) string {
	s := fmt.Sprint(n)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}

// TestPerformanceDocTargets: the targets table of docs/performance.md is bench.Targets,
// which gpuscaler bench prints its figures against.
func TestPerformanceDocTargets(t *testing.T) {
	const page, marker = "docs/performance.md", "<!-- checked against bench.Targets -->"
	tg := bench.Targets
	want := strings.Join([]string{
		"| target | value |",
		"| --- | --- |",
		fmt.Sprintf("| activation p99, at %s nodes | ≤ %g ms |", thousands(tg.Nodes), tg.ActivationP99Ms),
		fmt.Sprintf("| `GetMetrics` p99, at %s triggers with a namespace of %s GPUs | ≤ %g ms |", thousands(tg.Triggers), thousands(tg.BigNamespaceGPUs), tg.GetMetricsP99Ms),
		fmt.Sprintf("| NodeReports applied while KEDA reads every trigger | ≥ %s/s |", thousands(tg.IngestPerS)),
		fmt.Sprintf("| applied while readers read flat out, of applied with no reads | ≥ %g%% |", 100*tg.FlatOutRatio),
		fmt.Sprintf("| heap per tracked GPU | ≤ %g B |", tg.HeapBytesPerGPU),
	}, "\n")
	_, after, ok := strings.Cut(readRepoFile(t, page), marker+"\n")
	if !ok {
		t.Fatalf("%s has no %s", page, marker)
	}
	var got []string
	for line := range strings.SplitSeq(after, "\n") {
		if !strings.HasPrefix(line, "|") {
			break
		}
		got = append(got, line)
	}
	if g := strings.Join(got, "\n"); g != want {
		t.Errorf("%s's targets table reads\n%s\nwant, from bench.Targets,\n%s", page, g, want)
	}
}

// foreignPaths are file paths the docs name in another project's repository (the code a
// device-id form or a KEDA rule is read from), which look like ours.
var foreignPaths = map[string]string{
	"internal/rm/devices.go": "NVIDIA k8s-device-plugin's",
}

// TestDocPathsExist: a file of the repository the docs name in backquotes exists. Code
// moves (collectors/ became collector/); a page naming where a file was sends a reader
// nowhere. Folders are not checked, and paths outside the repository's own top-level
// folders are other projects' (KEDA's pkg/..., a device plugin's).
func TestDocPathsExist(t *testing.T) {
	entries, err := os.ReadDir(repoRoot)
	if err != nil {
		t.Fatal(err)
	}
	top := map[string]bool{}
	for _, e := range entries {
		if e.IsDir() && !strings.HasPrefix(e.Name(), ".") {
			top[e.Name()] = true
		}
	}
	file := regexp.MustCompile("`([a-zA-Z0-9_.-]+)(/[a-zA-Z0-9_./-]*\\.(?:go|sh|py|proto|yaml|md|txt|mod))`")
	checked := 0
	for _, p := range docPages(t) {
		for _, m := range file.FindAllStringSubmatch(readRepoFile(t, p), -1) {
			name := m[1] + m[2]
			if !top[m[1]] || foreignPaths[name] != "" {
				continue
			}
			checked++
			if _, err := os.Stat(filepath.Join(repoRoot, name)); err != nil {
				t.Errorf("%s names %s, which does not exist", p, name)
			}
		}
	}
	if checked == 0 {
		t.Fatal("found no repository path in the docs")
	}
}

// TestSecurityDocListsEveryAttack: docs/security.md's table of attack tests names every
// TestAttack… function of the repository, with the folders that hold it, and nothing
// that does not exist: the threat model says which test holds each rule, so a new
// attack test is documented and a removed one is not promised.
func TestSecurityDocListsEveryAttack(t *testing.T) {
	attackFunc := regexp.MustCompile(`(?m)^func (TestAttack\w+)\(t \*testing\.T\)`)
	found := map[string][]string{}
	for rel, p := range repoFiles(t, "_test.go") {
		data, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range attackFunc.FindAllStringSubmatch(string(data), -1) {
			found[m[1]] = append(found[m[1]], path.Dir(rel))
		}
	}
	if len(found) == 0 {
		t.Fatal("found no TestAttack function in the repository")
	}
	row := regexp.MustCompile("(?m)^\\| `(TestAttack\\w+)` \\| ([^|]+) \\|")
	listed := map[string]bool{}
	for _, m := range row.FindAllStringSubmatch(readRepoFile(t, "docs/security.md"), -1) {
		name := m[1]
		listed[name] = true
		var where []string
		for _, w := range strings.Split(m[2], ",") {
			where = append(where, strings.Trim(strings.TrimSpace(w), "`"))
		}
		slices.Sort(where)
		got := slices.Compact(slices.Sorted(slices.Values(found[name])))
		if !slices.Equal(where, got) {
			t.Errorf("docs/security.md: %s is in %v, the repository has it in %v", name, where, got)
		}
	}
	for name, dirs := range found {
		if !listed[name] {
			t.Errorf("docs/security.md does not list %s (in %v) among the attack tests", name, dirs)
		}
	}
}

// repoFiles returns the repository's files whose names end in suffix, by path relative to
// the root (slash-separated) to path from here, leaving out hidden folders (build
// caches, worktrees), testdata and node_modules.
func repoFiles(t *testing.T, suffix string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(repoRoot, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(repoRoot, p)
		rel = filepath.ToSlash(rel)
		if d.IsDir() && (strings.HasPrefix(d.Name(), ".") && rel != "." || d.Name() == "testdata" || d.Name() == "node_modules") {
			return filepath.SkipDir
		}
		if !d.IsDir() && strings.HasSuffix(rel, suffix) {
			out[rel] = p
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}
