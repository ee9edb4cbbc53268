// Package manifests renders gpuscaler's Helm chart (deploy/helm/gpuscaler) the way
// `helm template` does, with the Helm library pinned in this module's go.mod, and holds
// the cases whose output is committed: the plain manifests in deploy/manifests and the
// golden files in testdata. Its tests decode every rendered object strictly into its
// Kubernetes type, the examples into KEDA's, and check the chart against the gpuscaler
// binary's flags.
//
// It is a module of its own so that KEDA's and Helm's dependencies stay out of the main
// module; it reads the main module's files and runs its binary, and never imports it.
package manifests

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	"helm.sh/helm/v3/pkg/releaseutil"
)

// ChartDir is the chart, relative to the repository root.
const ChartDir = "deploy/helm/gpuscaler"

// Release and Namespace name the rendered release, as in
// `helm install gpuscaler deploy/helm/gpuscaler -n gpuscaler`. They make the scaler's
// address gpuscaler.gpuscaler.svc.cluster.local:9090, the one the examples use.
const (
	Release   = "gpuscaler"
	Namespace = "gpuscaler"
)

// Case is one rendering of the chart whose output is committed.
type Case struct {
	// Name identifies the case in tests.
	Name string
	// Values is a values file relative to the repository root, applied over the chart's
	// defaults; empty renders the defaults.
	Values string
	// Out is where the output is committed, relative to the repository root.
	Out string
	// Plain marks a manifest for kubectl apply: it starts with the Namespace, which the
	// chart leaves to helm install --create-namespace.
	Plain bool
}

// Cases are every committed rendering: the plain manifests users apply, and golden files
// for the value combinations the chart's ci/ folder holds (chart-testing's convention).
var Cases = []Case{
	{Name: "default", Out: "deploy/manifests/gpuscaler.yaml", Plain: true},
	{Name: "external-nats", Values: ChartDir + "/ci/external-nats-values.yaml", Out: "deploy/manifests/gpuscaler-external-nats.yaml", Plain: true},
	{Name: "sim", Values: ChartDir + "/ci/sim-values.yaml", Out: "deploy/manifests/gpuscaler-sim.yaml", Plain: true},
	{Name: "nats-cluster", Values: ChartDir + "/ci/nats-cluster-values.yaml", Out: "test/manifests/testdata/nats-cluster.yaml"},
	{Name: "external-nats-creds", Values: ChartDir + "/ci/external-nats-creds-values.yaml", Out: "test/manifests/testdata/external-nats-creds.yaml"},
	{Name: "full", Values: ChartDir + "/ci/full-values.yaml", Out: "test/manifests/testdata/full.yaml"},
}

// RenderCase renders c from the repository at root, in the form committed at c.Out.
func RenderCase(root string, c Case) ([]byte, error) {
	vals := map[string]any{}
	if c.Values != "" {
		v, err := chartutil.ReadValuesFile(filepath.Join(root, c.Values))
		if err != nil {
			return nil, err
		}
		vals = v
	}
	body, err := Render(filepath.Join(root, ChartDir), vals)
	if err != nil {
		return nil, fmt.Errorf("case %s: %w", c.Name, err)
	}
	var b bytes.Buffer
	from := "its default values"
	if c.Values != "" {
		from = c.Values
	}
	fmt.Fprintf(&b, "# Rendered from %s with %s by deploy/render.sh: do not edit.\n", ChartDir, from)
	if c.Plain {
		fmt.Fprintf(&b, "# Apply with kubectl apply --server-side -f %s; or install the chart:\n", filepath.Base(c.Out))
		fmt.Fprintf(&b, "#   helm install %s %s -n %s --create-namespace", Release, ChartDir, Namespace)
		if c.Values != "" {
			fmt.Fprintf(&b, " -f %s", c.Values)
		}
		fmt.Fprintf(&b, "\n---\napiVersion: v1\nkind: Namespace\nmetadata:\n  name: %s\n", Namespace)
	}
	b.WriteString(body)
	return b.Bytes(), nil
}

// Render renders the chart at dir with vals over its defaults, as
// `helm template gpuscaler <dir> -n gpuscaler` prints it: the chart's values schema
// applies, NOTES.txt is left out, objects come in Helm's install order, each after a
// "# Source:" line.
func Render(dir string, vals map[string]any) (string, error) {
	chrt, err := loader.Load(dir)
	if err != nil {
		return "", err
	}
	opts := chartutil.ReleaseOptions{Name: Release, Namespace: Namespace, Revision: 1, IsInstall: true}
	top, err := chartutil.ToRenderValues(chrt, vals, opts, chartutil.DefaultCapabilities)
	if err != nil {
		return "", err
	}
	files, err := engine.Render(chrt, top)
	if err != nil {
		return "", err
	}
	for name := range files {
		if strings.HasSuffix(name, "NOTES.txt") {
			delete(files, name)
		}
	}
	hooks, manifests, err := releaseutil.SortManifests(files, nil, releaseutil.InstallOrder)
	if err != nil {
		return "", err
	}
	if len(hooks) > 0 {
		return "", fmt.Errorf("the chart has %d hooks; this renderer does not print them", len(hooks))
	}
	var b strings.Builder
	for _, m := range manifests {
		fmt.Fprintf(&b, "---\n# Source: %s\n%s\n", m.Name, m.Content)
	}
	return b.String(), nil
}

// RepoRoot finds the repository root above dir: the folder holding the chart.
func RepoRoot(dir string) (string, error) {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return "", err
	}
	for d := dir; ; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, ChartDir, "Chart.yaml")); err == nil {
			return d, nil
		}
		if filepath.Dir(d) == d {
			return "", fmt.Errorf("no %s above %s", ChartDir, dir)
		}
	}
}
