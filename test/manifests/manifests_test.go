package manifests

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"k8s.io/apimachinery/pkg/api/meta"

	"github.com/gpuscaler/gpuscaler/deploy/render"
)

var update = flag.Bool("update", false, "rewrite the committed renderings (deploy/manifests, testdata) from the chart")

// root is the repository root, two folders up.
func root(t *testing.T) string {
	t.Helper()
	r, err := render.RepoRoot(".")
	if err != nil {
		t.Fatal(err)
	}
	return r
}

var (
	renderOnce sync.Once
	rendered   map[string][]byte
	renderErr  error
)

// renderCases renders every case once per test binary.
func renderCases(t *testing.T) map[string][]byte {
	t.Helper()
	renderOnce.Do(func() {
		rendered = map[string][]byte{}
		r, err := render.RepoRoot(".")
		if err != nil {
			renderErr = err
			return
		}
		for _, c := range render.AllCases() {
			out, err := render.RenderCase(r, c)
			if err != nil {
				renderErr = err
				return
			}
			rendered[c.Name] = out
		}
	})
	if renderErr != nil {
		t.Fatal(renderErr)
	}
	return rendered
}

// caseObjects decodes a case's rendering strictly.
func caseObjects(t *testing.T, c render.Case) []Object {
	t.Helper()
	objs, err := DecodeAll(c.Out, renderCases(t)[c.Name])
	if err != nil {
		t.Fatal(err)
	}
	return objs
}

// TestGolden compares each case's rendering with the committed file; -update rewrites
// them (deploy/render.sh does the same).
func TestGolden(t *testing.T) {
	r := root(t)
	for _, c := range render.AllCases() {
		t.Run(c.Name, func(t *testing.T) {
			got := renderCases(t)[c.Name]
			path := filepath.Join(r, c.Out)
			if *update {
				if err := os.WriteFile(path, got, 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (run deploy/render.sh, or go test -update)", err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("%s is not what the chart renders now: run deploy/render.sh (or go test -update) and commit\n%s",
					c.Out, firstDiff(string(got), string(want)))
			}
		})
	}
}

// firstDiff shows the first differing line of got and want.
func firstDiff(got, want string) string {
	g, w := strings.Split(got, "\n"), strings.Split(want, "\n")
	for i := range max(len(g), len(w)) {
		var gl, wl string
		if i < len(g) {
			gl = g[i]
		}
		if i < len(w) {
			wl = w[i]
		}
		if gl != wl {
			return "line " + strconv.Itoa(i+1) + ":\n  got  " + gl + "\n  want " + wl
		}
	}
	return ""
}

// TestEveryCIValuesFileIsACase keeps each chart's ci/ folder and the cases in step.
func TestEveryCIValuesFileIsACase(t *testing.T) {
	var have []string
	for _, c := range render.AllCases() {
		have = append(have, c.Values...)
	}
	for _, chart := range []string{render.ChartDir, render.GatewayChartDir} {
		files, err := filepath.Glob(filepath.Join(root(t), chart, "ci", "*-values.yaml"))
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range files {
			rel := chart + "/ci/" + filepath.Base(f)
			if !slices.Contains(have, rel) {
				t.Errorf("got %s with no case in Cases or GatewayCases (render.go), want every ci values file rendered and checked", rel)
			}
		}
		if len(files) == 0 {
			t.Errorf("got no %s/ci/*-values.yaml, want the chart's value combinations there", chart)
		}
	}
}

// TestStrictDecode decodes every rendered object into its Kubernetes (or KEDA, or
// Prometheus Operator) type with unknown fields failing, and checks that no two objects
// share a kind, namespace and name.
func TestStrictDecode(t *testing.T) {
	for _, c := range render.AllCases() {
		t.Run(c.Name, func(t *testing.T) {
			objs := caseObjects(t, c)
			if len(objs) == 0 {
				t.Fatalf("got no objects from %s", c.Out)
			}
			seen := map[string]string{}
			for _, o := range objs {
				m, err := meta.Accessor(o.Obj)
				if err != nil {
					t.Fatalf("%s: %v", o.Source, err)
				}
				if m.GetName() == "" {
					t.Errorf("%s: got an object without a name", o.Source)
				}
				key := o.GVK.Kind + " " + m.GetNamespace() + "/" + m.GetName()
				if prev, ok := seen[key]; ok {
					t.Errorf("%s: got %s again (first at %s)", o.Source, key, prev)
				}
				seen[key] = o.Source
			}
		})
	}
}

// TestStrictDecodeRejects shows the decoder is strict: each document here must fail.
func TestStrictDecodeRejects(t *testing.T) {
	cases := map[string]struct {
		doc  string
		want string
	}{
		"unknown field": {
			doc:  "apiVersion: v1\nkind: Service\nmetadata: {name: a}\nspec: {clusterIp: None}\n",
			want: `unknown field "spec.clusterIp"`,
		},
		"field in the wrong case": {
			doc:  "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\nData: {k: v}\n",
			want: `unknown field "Data"`,
		},
		"duplicate key": {
			doc:  "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\ndata: {k: v, k: w}\n",
			want: "k",
		},
		"unknown kind": {
			doc:  "apiVersion: v1\nkind: Sevrice\nmetadata: {name: a}\n",
			want: "Sevrice",
		},
		"unknown KEDA field": {
			doc:  "apiVersion: keda.sh/v1alpha1\nkind: ScaledObject\nmetadata: {name: a}\nspec: {scaleTargetRef: {name: a}, triggers: [{type: external, metadta: {}}]}\n",
			want: `unknown field "spec.triggers[0].metadta"`,
		},
		"unknown cert-manager field": {
			doc:  "apiVersion: cert-manager.io/v1\nkind: Certificate\nmetadata: {name: a}\nspec: {secretName: a, issuerRef: {name: b}, dnsName: [c]}\n",
			want: `unknown field "spec.dnsName"`,
		},
		"unknown ServiceMonitor field": {
			doc:  "apiVersion: monitoring.coreos.com/v1\nkind: ServiceMonitor\nmetadata: {name: a}\nspec: {selector: {}, endpoint: []}\n",
			want: `unknown field "spec.endpoint"`,
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := DecodeAll("test.yaml", []byte(tc.doc))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got error %v, want one mentioning %q", err, tc.want)
			}
		})
	}
}
