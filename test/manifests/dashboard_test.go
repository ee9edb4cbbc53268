package manifests

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/gpuscaler/gpuscaler/deploy/render"
)

// metricSources are the main module's files that name every gpuscaler_ metric. The test
// reads them as text, so a metric renamed there without the dashboard following fails.
var metricSources = []string{"scaler/metrics.go", "collector/collector.go", "authcallout/metrics.go"}

var (
	quotedMetric = regexp.MustCompile(`"(gpuscaler_[a-z0-9_]+)"`)
	exprMetric   = regexp.MustCompile(`gpuscaler_[a-z0-9_]+`)
)

type dashboard struct {
	UID        string `json:"uid"`
	Title      string `json:"title"`
	Templating struct {
		List []struct {
			Name, Type, Query string
		} `json:"list"`
	} `json:"templating"`
	Panels []struct {
		ID         int    `json:"id"`
		Type       string `json:"type"`
		Title      string `json:"title"`
		Datasource *struct {
			UID string `json:"uid"`
		} `json:"datasource"`
		GridPos struct{ X, Y, W, H int } `json:"gridPos"`
		Targets []struct {
			Expr string `json:"expr"`
		} `json:"targets"`
	} `json:"panels"`
}

// TestDashboard: the Grafana dashboard is valid JSON laid out on Grafana's 24-column grid
// without overlaps, queries only metrics the binaries export (by their names in the main
// module's source), shows every one of them, and is what the chart's ConfigMap carries.
func TestDashboard(t *testing.T) {
	r := root(t)
	exported := map[string]bool{}
	for _, f := range metricSources {
		src, err := os.ReadFile(filepath.Join(r, f))
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range quotedMetric.FindAllStringSubmatch(string(src), -1) {
			exported[m[1]] = true
		}
	}
	if len(exported) < 10 {
		t.Fatalf("got metrics %v from %v, want the scaler's, the collector's and the callout's", exported, metricSources)
	}

	raw, err := os.ReadFile(filepath.Join(r, render.ChartDir, "dashboards", "gpuscaler.json"))
	if err != nil {
		t.Fatal(err)
	}
	dec := json.NewDecoder(strings.NewReader(string(raw)))
	var d dashboard
	if err := dec.Decode(&d); err != nil {
		t.Fatal(err)
	}
	if d.UID == "" || d.Title == "" {
		t.Errorf("got uid %q title %q, want both", d.UID, d.Title)
	}
	if len(d.Templating.List) == 0 || d.Templating.List[0].Name != "datasource" || d.Templating.List[0].Query != "prometheus" {
		t.Errorf("got templating %+v, want a Prometheus datasource variable named datasource", d.Templating.List)
	}
	ids := map[int]bool{}
	type cell struct{ x, y int }
	used := map[cell]string{}
	shown := map[string]bool{}
	for _, p := range d.Panels {
		if ids[p.ID] {
			t.Errorf("panel %q: got id %d twice", p.Title, p.ID)
		}
		ids[p.ID] = true
		g := p.GridPos
		if g.W <= 0 || g.H <= 0 || g.X < 0 || g.X+g.W > 24 {
			t.Errorf("panel %q: got gridPos %+v, want inside 24 columns", p.Title, g)
		}
		for x := g.X; x < g.X+g.W; x++ {
			for y := g.Y; y < g.Y+g.H; y++ {
				if other, ok := used[cell{x, y}]; ok {
					t.Errorf("panel %q overlaps panel %q at (%d,%d)", p.Title, other, x, y)
				}
				used[cell{x, y}] = p.Title
			}
		}
		if p.Type == "row" {
			continue
		}
		if p.Datasource == nil || p.Datasource.UID != "${datasource}" || len(p.Targets) == 0 {
			t.Errorf("panel %q: got datasource %+v and %d queries, want ${datasource} and at least one", p.Title, p.Datasource, len(p.Targets))
		}
		for _, tg := range p.Targets {
			for _, m := range exprMetric.FindAllString(tg.Expr, -1) {
				base := m
				for _, suffix := range []string{"_bucket", "_sum", "_count"} {
					if b, ok := strings.CutSuffix(m, suffix); ok && exported[b] {
						base = b
					}
				}
				if !exported[base] {
					t.Errorf("panel %q: got metric %s, which %v do not export", p.Title, m, metricSources)
				}
				shown[base] = true
			}
		}
	}
	for m := range exported {
		if !shown[m] {
			t.Errorf("got no panel showing %s, want every exported metric on the dashboard", m)
		}
	}

	// The ConfigMap carries the same dashboard.
	for _, o := range caseObjects(t, render.Cases[0]) {
		cm, ok := o.Obj.(*corev1.ConfigMap)
		if !ok || !strings.HasSuffix(cm.Name, "-dashboard") {
			continue
		}
		if cm.Labels["grafana_dashboard"] != "1" {
			t.Errorf("got dashboard ConfigMap labels %v, want grafana_dashboard: \"1\"", cm.Labels)
		}
		var inMap, inFile any
		if err := json.Unmarshal([]byte(cm.Data["gpuscaler.json"]), &inMap); err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(raw, &inFile); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(inMap, inFile) {
			t.Errorf("got a ConfigMap dashboard different from %s/dashboards/gpuscaler.json", render.ChartDir)
		}
		return
	}
	t.Errorf("got no dashboard ConfigMap in %s, want one by default", render.Cases[0].Out)
}
