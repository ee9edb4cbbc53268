// Package render renders gpuscaler's Helm charts (deploy/helm/gpuscaler and
// deploy/helm/gpuscaler-gateway) the way `helm template` does, with the Helm library
// pinned in this module's go.mod, and holds the cases whose output is committed: the
// plain manifests in deploy/manifests, the inference example's gateway and the golden
// files in test/manifests/testdata. Its command, cmd/render, writes them or checks
// they are current (deploy/render.sh runs it); test/manifests decodes every rendering
// strictly into its Kubernetes and KEDA types and checks the chart against the
// gpuscaler binary.
//
// It is a module of its own so that Helm's dependencies stay out of the main module; it
// reads the repository's charts and values files, and never imports the main module.
package render

import (
	"bytes"
	"cmp"
	"encoding/base64"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	"helm.sh/helm/v3/pkg/releaseutil"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	sigsyaml "sigs.k8s.io/yaml"
)

// ChartDir is the chart, relative to the repository root.
const ChartDir = "deploy/helm/gpuscaler"

// GatewayChartDir is the gateway's chart, which a namespace installs in front of its
// inference Services.
const GatewayChartDir = "deploy/helm/gpuscaler-gateway"

// Release and Namespace name the rendered release, as in
// `helm install gpuscaler deploy/helm/gpuscaler -n gpuscaler`. They make the scaler's
// address gpuscaler.gpuscaler.svc.cluster.local:9090, the one the examples use.
const (
	Release   = "gpuscaler"
	Namespace = "gpuscaler"
)

// PlainValues are the values every plain manifest is rendered with, over its case's
// own: they name the Secrets the chart would otherwise generate (the auth callout's
// issuer seed and password, the gRPC certificates), which the user creates before
// applying (deploy/README.md). A manifest everyone downloads must not carry keys, and a
// rendering cannot keep them across upgrades as `helm install` does.
const PlainValues = "deploy/plain-values.yaml"

// Case is one rendering of the chart whose output is committed.
type Case struct {
	// Name identifies the case in tests.
	Name string
	// Values are values files relative to the repository root, applied in order over
	// the chart's defaults, as `helm install -f a -f b` does; none renders the defaults.
	Values []string
	// Out is where the output is committed, relative to the repository root.
	Out string
	// Plain marks a manifest for kubectl apply: it starts with the Namespace, which the
	// chart leaves to helm install --create-namespace.
	Plain bool
	// APIVersions are API groups/versions the cluster is taken to serve besides
	// Helm's defaults (.Capabilities.APIVersions), e.g. cert-manager.io/v1.
	APIVersions []string
	// Chart, Release and Namespace are the chart rendered (relative to the repository
	// root) and its release; empty: ChartDir as release Release in Namespace.
	Chart, Release, Namespace string
}

// ChartPath is the chart c renders, relative to the repository root.
func (c Case) ChartPath() string { return cmp.Or(c.Chart, ChartDir) }

// ReleaseName is the release c renders.
func (c Case) ReleaseName() string { return cmp.Or(c.Release, Release) }

// ReleaseNamespace is the namespace c renders into.
func (c Case) ReleaseNamespace() string { return cmp.Or(c.Namespace, Namespace) }

// Gateway says c renders the gateway's chart.
func (c Case) Gateway() bool { return c.ChartPath() == GatewayChartDir }

// Cases are every committed rendering: the plain manifests users apply, and golden files
// for the chart's defaults and the value combinations its ci/ folder holds
// (chart-testing's convention).
var Cases = []Case{
	{Name: "plain", Values: []string{PlainValues}, Out: "deploy/manifests/gpuscaler.yaml", Plain: true},
	{Name: "external-nats", Values: []string{ChartDir + "/ci/external-nats-values.yaml", PlainValues}, Out: "deploy/manifests/gpuscaler-external-nats.yaml", Plain: true},
	{Name: "sim", Values: []string{ChartDir + "/ci/sim-values.yaml", PlainValues}, Out: "deploy/manifests/gpuscaler-sim.yaml", Plain: true},
	{Name: "default", Out: "test/manifests/testdata/default.yaml"},
	{Name: "nats-cluster", Values: []string{ChartDir + "/ci/nats-cluster-values.yaml"}, Out: "test/manifests/testdata/nats-cluster.yaml"},
	{Name: "external-nats-creds", Values: []string{ChartDir + "/ci/external-nats-creds-values.yaml"}, Out: "test/manifests/testdata/external-nats-creds.yaml"},
	{Name: "full", Values: []string{ChartDir + "/ci/full-values.yaml"}, Out: "test/manifests/testdata/full.yaml"},
	{Name: "jetstream-namespaces", Values: []string{"examples/training-queue/gpuscaler-values.yaml"}, Out: "test/manifests/testdata/jetstream-namespaces.yaml"},
	{Name: "cert-manager", Values: []string{ChartDir + "/ci/cert-manager-values.yaml"}, Out: "test/manifests/testdata/cert-manager.yaml",
		APIVersions: []string{"cert-manager.io/v1"}},
}

// GatewayCases are the committed renderings of the gateway's chart: the inference
// example's gateway (release llm-gateway in namespace inference, which `kubectl apply -f
// examples/inference-scale-to-zero/` applies with the rest of the example), and golden
// files for its defaults and its ci/ values.
var GatewayCases = []Case{
	{Name: "gateway-example", Chart: GatewayChartDir, Release: "llm-gateway", Namespace: "inference",
		Values: []string{"examples/inference-scale-to-zero/gateway-values.yaml"},
		Out:    "examples/inference-scale-to-zero/gateway.yaml"},
	{Name: "gateway-default", Chart: GatewayChartDir, Release: "llm-gateway", Namespace: "inference",
		Out: "test/manifests/testdata/gateway-default.yaml"},
	{Name: "gateway-full", Chart: GatewayChartDir, Release: "llm-gateway", Namespace: "inference",
		Values: []string{GatewayChartDir + "/ci/full-values.yaml"},
		Out:    "test/manifests/testdata/gateway-full.yaml"},
	{Name: "gateway-creds", Chart: GatewayChartDir, Release: "llm-gateway", Namespace: "inference",
		Values: []string{GatewayChartDir + "/ci/creds-values.yaml"},
		Out:    "test/manifests/testdata/gateway-creds.yaml"},
}

// AllCases are Cases and GatewayCases: every committed rendering.
func AllCases() []Case { return slices.Concat(Cases, GatewayCases) }

// CaseValues reads c's values files from the repository at root and merges them.
func CaseValues(root string, c Case) (map[string]any, error) {
	vals := map[string]any{}
	for _, f := range c.Values {
		v, err := chartutil.ReadValuesFile(filepath.Join(root, f))
		if err != nil {
			return nil, err
		}
		vals = mergeValues(vals, v)
	}
	return vals, nil
}

// mergeValues merges b over a as Helm merges values files (mergeMaps in Helm's
// pkg/cli/values/options.go): maps key by key, anything else replaced.
func mergeValues(a, b map[string]any) map[string]any {
	out := make(map[string]any, len(a))
	maps.Copy(out, a)
	for k, v := range b {
		if bm, ok := v.(map[string]any); ok {
			if am, ok := out[k].(map[string]any); ok {
				out[k] = mergeValues(am, bm)
				continue
			}
		}
		out[k] = v
	}
	return out
}

// RenderCase renders c from the repository at root, in the form committed at c.Out.
//
// What the chart generates at install (Secrets: keys, certificates, passwords) differs
// on every rendering, so a case that renders any is rendered twice: first as on a fresh
// install; then as an upgrade of a cluster holding those Secrets with each generated
// value replaced by a placeholder naming where it first appeared (a value found in
// several Secrets, such as a CA certificate, gets one placeholder). The chart must keep
// what it finds, so the second rendering is stable, and it fails here if it does not.
func RenderCase(root string, c Case) ([]byte, error) {
	vals, err := CaseValues(root, c)
	if err != nil {
		return nil, err
	}
	dir := filepath.Join(root, c.ChartPath())
	opts := Options{APIVersions: c.APIVersions, Release: c.ReleaseName(), Namespace: c.ReleaseNamespace()}
	first, err := RenderWith(dir, vals, opts)
	if err != nil {
		return nil, fmt.Errorf("case %s: %w", c.Name, err)
	}
	body := first
	if secrets, err := GeneratedSecrets(first); err != nil {
		return nil, fmt.Errorf("case %s: %w", c.Name, err)
	} else if len(secrets) > 0 {
		opts.Cluster = placeholders(secrets)
		if body, err = RenderWith(dir, vals, opts); err != nil {
			return nil, fmt.Errorf("case %s, upgrade: %w", c.Name, err)
		}
		kept, err := GeneratedSecrets(body)
		if err != nil {
			return nil, fmt.Errorf("case %s, upgrade: %w", c.Name, err)
		}
		if err := SameSecrets(kept, opts.Cluster); err != nil {
			return nil, fmt.Errorf("case %s: an upgrade does not keep what the install generated: %w", c.Name, err)
		}
	}
	var b bytes.Buffer
	from := "its default values"
	if len(c.Values) > 0 {
		from = strings.Join(c.Values, " and ")
	}
	fmt.Fprintf(&b, "# Rendered from %s with %s by deploy/render.sh: do not edit.\n", c.ChartPath(), from)
	if len(opts.Cluster) > 0 {
		b.WriteString("# Generated keys, certificates and passwords are placeholders here: helm install\n" +
			"# generates them, and every upgrade keeps them.\n")
	}
	if c.Plain {
		fmt.Fprintf(&b, "# gpuscaler publishes no image: build the images it names and load or push them\n")
		fmt.Fprintf(&b, "# (deploy/README.md, Images). Create the Secrets it names first (deploy/README.md),\n# then apply with\n")
		fmt.Fprintf(&b, "#   kubectl apply --server-side -f %s\n# or install the chart:\n", filepath.Base(c.Out))
		fmt.Fprintf(&b, "#   helm install %s %s -n %s --create-namespace", Release, ChartDir, Namespace)
		for _, v := range c.Values {
			fmt.Fprintf(&b, " -f %s", v)
		}
		fmt.Fprintf(&b, "\n---\napiVersion: v1\nkind: Namespace\nmetadata:\n  name: %s\n", Namespace)
	}
	if c.Gateway() {
		fmt.Fprintf(&b, "# The same as\n#   helm install %s %s -n %s", c.ReleaseName(), c.ChartPath(), c.ReleaseNamespace())
		for _, v := range c.Values {
			fmt.Fprintf(&b, " -f %s", v)
		}
		b.WriteString("\n")
	}
	b.WriteString(body)
	return b.Bytes(), nil
}

// Options are what a rendering may know of the cluster.
type Options struct {
	// APIVersions are served besides Helm's defaults (.Capabilities.APIVersions).
	APIVersions []string
	// Release and Namespace name the release; empty: Release and Namespace.
	Release, Namespace string
	// Cluster holds the objects the chart's lookup finds, as `helm upgrade` would in a
	// cluster holding them; only Secrets. Empty: lookup finds nothing, as in
	// `helm template` and a first `helm install`.
	Cluster []*unstructured.Unstructured
}

// Render renders the chart at dir with vals over its defaults, as
// `helm template gpuscaler <dir> -n gpuscaler` prints it.
func Render(dir string, vals map[string]any) (string, error) {
	return RenderWith(dir, vals, Options{})
}

// RenderWith renders the chart at dir with vals over its defaults, as `helm template`
// prints it but with opts' view of the cluster: the chart's values schema applies,
// NOTES.txt is left out, objects come in Helm's install order, each after a "# Source:"
// line.
func RenderWith(dir string, vals map[string]any, opts Options) (string, error) {
	chrt, err := loader.Load(dir)
	if err != nil {
		return "", err
	}
	rel := chartutil.ReleaseOptions{Name: cmp.Or(opts.Release, Release), Namespace: cmp.Or(opts.Namespace, Namespace), Revision: 1, IsInstall: true}
	if len(opts.Cluster) > 0 {
		rel.Revision, rel.IsInstall, rel.IsUpgrade = 2, false, true
	}
	caps := chartutil.DefaultCapabilities.Copy()
	caps.APIVersions = append(caps.APIVersions, opts.APIVersions...)
	top, err := chartutil.ToRenderValues(chrt, vals, rel, caps)
	if err != nil {
		return "", err
	}
	files, err := engine.RenderWithClientProvider(chrt, top, secretsOnly{opts.Cluster})
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

// secretsOnly serves the chart's lookup calls from a fake cluster holding objs: Helm's
// engine reads them through a dynamic client (k8s.io/client-go's fake). The chart looks
// up only Secrets; any other kind is an error, so a new lookup is noticed here.
type secretsOnly struct{ objs []*unstructured.Unstructured }

func (s secretsOnly) GetClientFor(apiVersion, kind string) (dynamic.NamespaceableResourceInterface, bool, error) {
	if apiVersion != "v1" || kind != "Secret" {
		return nil, false, fmt.Errorf("the chart looks up %s %s; the renderer's cluster holds Secrets only", apiVersion, kind)
	}
	objs := make([]runtime.Object, len(s.objs))
	for i, o := range s.objs {
		objs[i] = o.DeepCopy()
	}
	gvr := schema.GroupVersionResource{Version: "v1", Resource: "secrets"}
	client := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{gvr: "SecretList"}, objs...)
	return client.Resource(gvr), true, nil
}

// GeneratedSecrets returns the Secrets in a rendering: every Secret the chart renders is
// one it generated (Secrets of the user's are only named).
func GeneratedSecrets(rendered string) ([]*unstructured.Unstructured, error) {
	var out []*unstructured.Unstructured
	for doc := range strings.SplitSeq(rendered, "\n---\n") {
		var m map[string]any
		if err := sigsyaml.Unmarshal([]byte(doc), &m); err != nil {
			return nil, err
		}
		if m["kind"] == "Secret" && m["apiVersion"] == "v1" {
			out = append(out, &unstructured.Unstructured{Object: m})
		}
	}
	return out, nil
}

// placeholders returns secrets with every data value replaced by a placeholder that
// names the Secret and key where the value first appears; equal values get the same
// placeholder, so that what the chart compares (a certificate's ca.crt with its CA)
// still agrees.
func placeholders(secrets []*unstructured.Unstructured) []*unstructured.Unstructured {
	seen := map[string]string{}
	var out []*unstructured.Unstructured
	for _, s := range secrets {
		s = s.DeepCopy()
		data, _, _ := unstructured.NestedMap(s.Object, "data")
		for _, k := range slices.Sorted(maps.Keys(data)) {
			v := fmt.Sprint(data[k])
			p, ok := seen[v]
			if !ok {
				p = base64.StdEncoding.EncodeToString([]byte(fmt.Sprintf("generated at install: %s/%s %s", s.GetNamespace(), s.GetName(), k)))
				seen[v] = p
			}
			data[k] = p
		}
		_ = unstructured.SetNestedMap(s.Object, data, "data")
		out = append(out, s)
	}
	return out
}

// SameSecrets says whether got holds exactly want's Secrets with want's data: nil if
// it does, else what differs.
func SameSecrets(got, want []*unstructured.Unstructured) error {
	key := func(s *unstructured.Unstructured) string { return s.GetNamespace() + "/" + s.GetName() }
	have := map[string]map[string]any{}
	for _, s := range got {
		have[key(s)], _, _ = unstructured.NestedMap(s.Object, "data")
	}
	if len(have) != len(want) {
		return fmt.Errorf("got %d Secrets, want %d", len(have), len(want))
	}
	for _, s := range want {
		data, _, _ := unstructured.NestedMap(s.Object, "data")
		g, ok := have[key(s)]
		if !ok {
			return fmt.Errorf("Secret %s is gone", key(s))
		}
		for _, k := range slices.Sorted(maps.Keys(data)) {
			if fmt.Sprint(g[k]) != fmt.Sprint(data[k]) {
				return fmt.Errorf("Secret %s key %s made anew", key(s), k)
			}
		}
	}
	return nil
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
