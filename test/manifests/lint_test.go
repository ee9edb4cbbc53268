package manifests

import (
	"path/filepath"
	"testing"

	"helm.sh/helm/v3/pkg/lint"
	"helm.sh/helm/v3/pkg/lint/support"

	"github.com/gpuscaler/gpuscaler/deploy/render"
)

// TestHelmLint runs `helm lint`'s checks (Helm's library at the pinned version) on each
// chart with each of its cases' values: Chart.yaml, the values schema, template rendering, the
// objects' names and deprecated APIs. Warnings fail as errors do; hints (INFO) do not.
func TestHelmLint(t *testing.T) {
	r := root(t)
	for _, c := range render.AllCases() {
		t.Run(c.Name, func(t *testing.T) {
			vals, err := render.CaseValues(r, c)
			if err != nil {
				t.Fatal(err)
			}
			for _, m := range lint.All(filepath.Join(r, c.ChartPath()), vals, c.ReleaseNamespace(), true).Messages {
				if m.Severity >= support.WarningSev {
					t.Errorf("helm lint: %s", m)
				} else {
					t.Logf("helm lint: %s", m)
				}
			}
		})
	}
}
