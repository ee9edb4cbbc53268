package scaler

import (
	"fmt"
	"maps"
	"os"
	"path"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/gpuscaler/gpuscaler/scaler/metadata"
)

// docTable returns the rows of the first Markdown table in doc whose header row starts
// with "| <first> |", each row split into its cells; nil when there is none.
func docTable(doc, first string) [][]string {
	var rows [][]string
	in := false
	for line := range strings.SplitSeq(doc, "\n") {
		switch {
		case !in && strings.HasPrefix(line, "| "+first+" |"):
			in = true
		case in && strings.HasPrefix(line, "| ---"):
		case in && strings.HasPrefix(line, "|"):
			cells := strings.Split(strings.Trim(line, "|"), " | ")
			for i := range cells {
				cells[i] = strings.TrimSpace(cells[i])
			}
			rows = append(rows, cells)
		case in:
			return rows
		}
	}
	return rows
}

var backquoted = regexp.MustCompile("`([^`]+)`")

// quoted returns the backquoted words of a cell, in order.
func quoted(cell string) []string {
	var out []string
	for _, m := range backquoted.FindAllStringSubmatch(cell, -1) {
		out = append(out, m[1])
	}
	return out
}

// keyTablePage follows the README's links into docs/ to the one page that holds the
// trigger-key table (a table whose header starts "| key |"), and returns its name and text.
func keyTablePage(t *testing.T) (string, string) {
	t.Helper()
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	var pages []string
	for _, m := range regexp.MustCompile(`\]\((docs/[^)#\s]+\.md)(#[^)\s]*)?\)`).FindAllStringSubmatch(string(readme), -1) {
		if !slices.Contains(pages, m[1]) {
			pages = append(pages, m[1])
		}
	}
	var found []string
	var text string
	for _, p := range pages {
		data, err := os.ReadFile(path.Join("..", p))
		if err != nil {
			t.Errorf("README.md links %s: %v", p, err)
			continue
		}
		if docTable(string(data), "key") != nil {
			found = append(found, p)
			text = string(data)
		}
	}
	if len(found) != 1 {
		t.Fatalf("the pages README.md links (%q) hold the trigger-key table %d times (%q), want once", pages, len(found), found)
	}
	return found[0], text
}

// TestReadmeDocumentsEveryKey follows the README's link to the page of the trigger-key
// table and keeps that table and its metric table in step with the code, both ways: every
// key the parser reads has a row and every row names a key it reads, every metric has a
// row and every row names a metric, and the defaults the table gives are the parser's.
func TestReadmeDocumentsEveryKey(t *testing.T) {
	page, doc := keyTablePage(t)

	documented := map[string]string{} // key → its default cell
	for _, row := range docTable(doc, "key") {
		if len(row) != 3 {
			t.Errorf("%s: key table row %q has %d cells, want 3", page, row, len(row))
			continue
		}
		keys := quoted(row[0])
		if len(keys) == 0 {
			t.Errorf("%s: key table row %q names no key", page, row)
		}
		for _, k := range keys {
			documented[k] = row[2]
		}
	}
	known := metadata.Keys()
	for _, k := range known {
		if _, ok := documented[k]; !ok {
			t.Errorf("%s does not document trigger key %q", page, k)
		}
	}
	for _, k := range slices.Sorted(maps.Keys(documented)) {
		if !slices.Contains(known, k) {
			t.Errorf("%s documents trigger key %q, which the parser does not read (it reads %q)", page, k, known)
		}
	}

	// The defaults the table gives, against what the parser makes of a trigger that
	// leaves the key out.
	queue := map[string]string{metadata.KeyQueue: "q"}
	with := func(extra ...string) map[string]string {
		m := maps.Clone(queue)
		for i := 0; i < len(extra); i += 2 {
			m[extra[i]] = extra[i+1]
		}
		return m
	}
	capacity := with(metadata.KeyCapacityAware, "true", metadata.KeyGPUsPerReplica, "1")
	for key, c := range map[string]struct {
		metadata map[string]string
		got      func(*metadata.Trigger) string
	}{
		metadata.KeyQueueTarget:          {queue, func(tr *metadata.Trigger) string { return fmt.Sprint(tr.QueueTarget) }},
		metadata.KeyActivationQueueDepth: {queue, func(tr *metadata.Trigger) string { return fmt.Sprint(tr.ActivationQueueDepth) }},
		metadata.KeyActivationGPUUtil: {with(metadata.KeyPodSelector, "app=x", metadata.KeyGPUUtilTarget, "70"),
			func(tr *metadata.Trigger) string { return fmt.Sprint(tr.ActivationGPUUtil) }},
		metadata.KeyStaleAfter:       {queue, func(tr *metadata.Trigger) string { return tr.StaleAfter.String() }},
		metadata.KeyPushInterval:     {queue, func(tr *metadata.Trigger) string { return tr.PushInterval.String() }},
		metadata.KeyConcurrency:      {with(metadata.KeyTargetWait, "10s"), func(tr *metadata.Trigger) string { return fmt.Sprint(tr.Concurrency) }},
		metadata.KeyScaleUpTolerance: {with(metadata.KeyTargetWait, "10s"), func(tr *metadata.Trigger) string { return fmt.Sprint(tr.ScaleUpTolerance) }},
		metadata.KeyCapacityAware:    {queue, func(tr *metadata.Trigger) string { return fmt.Sprint(tr.CapacityAware) }},
		metadata.KeyCapacityHeadroom: {capacity, func(tr *metadata.Trigger) string { return fmt.Sprint(tr.CapacityHeadroom) }},
		metadata.KeyMinReplicaCount:  {capacity, func(tr *metadata.Trigger) string { return fmt.Sprint(tr.MinReplicaCount) }},
	} {
		tr, err := metadata.ParseTrigger("ns", c.metadata, 0)
		if err != nil {
			t.Errorf("%s default: parse %v: %v", key, c.metadata, err)
			continue
		}
		want := c.got(tr)
		if got := quoted(documented[key]); len(got) == 0 || got[0] != want {
			t.Errorf("%s gives %s's default as %q, want `%s` first, as the parser defaults it", page, key, documented[key], want)
		}
	}

	metrics := []string{MetricQueueBacklog, MetricQueueDemand, MetricGPUUtil, MetricGPUMemory}
	var rows []string
	for _, row := range docTable(doc, "metric") {
		if q := quoted(row[0]); len(q) > 0 {
			rows = append(rows, q[0])
		}
	}
	for _, m := range metrics {
		if !slices.Contains(rows, m) {
			t.Errorf("%s's metric table has no row for metric %q (its rows: %q)", page, m, rows)
		}
	}
	for _, m := range rows {
		if !slices.Contains(metrics, m) {
			t.Errorf("%s's metric table has a row for %q, which is no metric the scaler gives (%q)", page, m, metrics)
		}
	}
}

// TestReadmeScaledObjectParses: the one ScaledObject the README shows is a trigger the
// parser accepts, as KEDA would send its metadata.
func TestReadmeScaledObjectParses(t *testing.T) {
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, block, ok := strings.Cut(string(readme), "```yaml\n")
	if !ok {
		t.Fatal("README.md has no yaml block")
	}
	block, _, _ = strings.Cut(block, "```")
	meta := map[string]string{}
	indent := -1 // the metadata map's indentation, once inside it
	for line := range strings.SplitSeq(block, "\n") {
		line, _, _ = strings.Cut(line, " #")
		trimmed := strings.TrimLeft(line, " ")
		depth := len(line) - len(trimmed)
		switch {
		case trimmed == "metadata:" && strings.Contains(block, "triggers:") && depth > 4:
			indent = depth + 2
		case indent >= 0 && depth == indent:
			k, v, _ := strings.Cut(trimmed, ":")
			meta[k] = strings.Trim(strings.TrimSpace(v), `"`)
		case indent >= 0 && depth < indent:
			indent = -1
		}
	}
	if meta[metadata.KeyQueue] == "" {
		t.Fatalf("found no trigger metadata with a queue in README.md's ScaledObject: %v", meta)
	}
	if _, err := metadata.ParseTrigger("inference", meta, 0); err != nil {
		t.Errorf("README.md's ScaledObject: the parser refuses its trigger %v: %v", meta, err)
	}
}
