package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
	"sigs.k8s.io/yaml"

	"github.com/gpuscaler/gpuscaler/test/e2e/cluster"

	"github.com/gpuscaler/gpuscaler/test/testkit"
)

// manifestsFieldManager owns what TestManifestsApplyServerSideDryRun applies.
const manifestsFieldManager = "gpuscaler-e2e-manifests"

// optionalKinds may be missing from the server (their CRDs are not installed here), with
// why that is fine. They are skipped, and reported, only outside deploy/manifests: the
// plain manifests are rendered with values where they are off, and an object of a kind
// the cluster lacks there would make `kubectl apply` fail for every user.
var optionalKinds = map[schema.GroupKind]string{
	{Group: "monitoring.coreos.com", Kind: "ServiceMonitor"}: "the chart's serviceMonitor.enabled, false by default (deploy/README.md: optional); its CRD is the Prometheus Operator's, which this suite does not install",
	{Group: "cert-manager.io", Kind: "Certificate"}:          certManagerWhy,
	{Group: "cert-manager.io", Kind: "Issuer"}:               certManagerWhy,
}

// certManagerWhy: the chart uses cert-manager for gRPC certificates only where the
// cluster serves cert-manager.io/v1 (scaler.tls.certManager.enabled auto) or the user
// asks for it; the plain manifests never do. test/manifests decodes these objects
// strictly against cert-manager's field names.
const certManagerWhy = "the chart's scaler.tls.certManager, used only where the cluster serves cert-manager.io/v1 (deploy/README.md); its CRDs are cert-manager's, which this suite does not install"

// manifestDoc is one Kubernetes object of a YAML stream in the repository.
type manifestDoc struct {
	file  string // relative to the repository root
	index int    // the document's index in the stream, empty documents counted
	tmpl  string // the chart template (Helm's "# Source:" line), if any
	raw   []byte // the document as written: the apply body
	obj   *unstructured.Unstructured
	gvk   schema.GroupVersionKind
}

func (d manifestDoc) String() string {
	s := fmt.Sprintf("%s#%d %s %s", d.file, d.index, d.gvk.Kind, d.obj.GetName())
	if ns := d.obj.GetNamespace(); ns != "" {
		s = fmt.Sprintf("%s#%d %s %s/%s", d.file, d.index, d.gvk.Kind, ns, d.obj.GetName())
	}
	if d.tmpl != "" {
		s += " (" + d.tmpl + ")"
	}
	return s
}

// TestManifestsApplyServerSideDryRun applies everything a user would apply from the
// repository to the real kube-apiserver, with KEDA's CRDs installed: the plain manifests
// rendered from the chart (deploy/manifests), the examples' objects (examples/**), and
// the chart's other golden renderings (test/manifests/testdata: the defaults, with their
// generated Secrets as placeholders, NATS cluster, NATS creds, every optional object on,
// cert-manager). Objects in other namespaces (KEDA's client certificate in keda) and
// cluster-scoped ones are applied alike. Namespaces are applied for real (a namespace
// that exists only in a dry run holds nothing); every other object is server-side applied with
// dryRun=All and strict field validation, so the server's admission, its built-in
// OpenAPI validation and KEDA's CRD schemas must all accept every field of every
// object. Nothing but the namespaces is stored.
func TestManifestsApplyServerSideDryRun(t *testing.T) {
	start := time.Now()
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	root := filepath.Clean(filepath.Join(wd, "..", ".."))

	files := manifestFiles(t, root)
	var docs []manifestDoc
	for _, f := range files {
		ds, skipped := readManifestDocs(t, root, f)
		if len(ds) == 0 {
			t.Logf("skipped %s: no Kubernetes objects in it", f)
			continue
		}
		for _, s := range skipped {
			t.Logf("skipped %s: not a Kubernetes object", s)
		}
		docs = append(docs, ds...)
	}
	if t.Failed() {
		t.FailNow()
	}

	// The goldens hold placeholders where helm install generates keys and certificates;
	// the API server rightly warns about a TLS Secret without PEM, so such a Secret is
	// applied with a certificate made now instead.
	for i := range docs {
		if err := realTLSData(&docs[i]); err != nil {
			t.Fatalf("%s: %v", docs[i], err)
		}
	}

	// The warnings the server sends with each response (deprecated APIs, fields it
	// ignores) are collected per request: the objects are applied one at a time.
	warnings := &warningRecorder{}
	cfg := rest.CopyConfig(env.CP.Config)
	cfg.WarningHandlerWithContext = warnings
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	groups, err := restmapper.GetAPIGroupResources(dc)
	if err != nil {
		// A group whose discovery fails (an aggregated API with nothing behind it) is
		// left out of the mapper; its objects fail below as unknown kinds.
		if !discovery.IsGroupDiscoveryFailedError(err) {
			t.Fatalf("discovery: %v", err)
		}
		t.Logf("discovery: %v", err)
	}
	mapper := restmapper.NewDiscoveryRESTMapper(groups)

	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()

	type planned struct {
		doc     manifestDoc
		mapping *meta.RESTMapping
	}
	var namespaces, objects []planned
	report := map[string][]string{} // file → what happened to each of its objects
	skippedOptional := 0
	for _, d := range docs {
		m, err := mapper.RESTMapping(d.gvk.GroupKind(), d.gvk.Version)
		if meta.IsNoMatchError(err) {
			why, optional := optionalKinds[d.gvk.GroupKind()]
			if optional && !strings.HasPrefix(d.file, "deploy/manifests/") {
				t.Logf("not applied: %s: %s is not served here: optional, %s", d, d.gvk.GroupVersion(), why)
				report[d.file] = append(report[d.file], fmt.Sprintf("%s/%s (skipped: no CRD)", d.gvk.Kind, d.obj.GetName()))
				skippedOptional++
				continue
			}
			t.Errorf("%s: the server has no %s (its CRD is not installed): %v", d, d.gvk, err)
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", d, err)
			continue
		}
		if m.Scope.Name() == meta.RESTScopeNameNamespace && d.obj.GetNamespace() == "" {
			t.Logf("%s has no metadata.namespace: applying it in namespace default, as kubectl would", d)
			d.obj.SetNamespace(metav1.NamespaceDefault)
		}
		p := planned{doc: d, mapping: m}
		if m.GroupVersionKind.GroupKind() == (schema.GroupKind{Kind: "Namespace"}) {
			namespaces = append(namespaces, p)
		} else {
			objects = append(objects, p)
		}
	}
	if t.Failed() {
		t.FailNow()
	}

	apply := func(p planned, dryRun bool) error {
		d := p.doc
		ri := dyn.Resource(p.mapping.Resource)
		var r dynamic.ResourceInterface = ri
		if p.mapping.Scope.Name() == meta.RESTScopeNameNamespace {
			r = ri.Namespace(d.obj.GetNamespace())
		}
		opts := metav1.PatchOptions{FieldManager: manifestsFieldManager, Force: new(true), FieldValidation: metav1.FieldValidationStrict}
		if dryRun {
			opts.DryRun = []string{metav1.DryRunAll}
		}
		// The body is the document as written (application/apply-patch+yaml), comments
		// and all: a key given twice is the server's to find, not lost in decoding. One
		// without metadata.namespace takes the request's.
		warnings.take()
		_, err := r.Patch(ctx, d.obj.GetName(), types.ApplyPatchType, d.raw, opts)
		if err != nil {
			return err
		}
		// A warning is the server accepting something it says is wrong (a deprecated
		// field or label, an annotation that does nothing): as good as a rejection.
		if w := warnings.take(); len(w) > 0 {
			return fmt.Errorf("accepted, but with warnings: %s", strings.Join(w, "; "))
		}
		return nil
	}

	// Namespaces for real, first: every other object is admitted only into a namespace
	// that exists (NamespaceLifecycle), dry run or not. The suite's namespaces are never
	// deleted (no controller manager runs to finalize them), and these hold nothing.
	declared := map[string]bool{}
	for _, p := range namespaces {
		if err := apply(p, false); err != nil {
			t.Errorf("%s: server-side apply: %v", p.doc, err)
			report[p.doc.file] = append(report[p.doc.file], fmt.Sprintf("Namespace/%s (FAILED)", p.doc.obj.GetName()))
			continue
		}
		declared[p.doc.obj.GetName()] = true
		report[p.doc.file] = append(report[p.doc.file], fmt.Sprintf("Namespace/%s (applied for real)", p.doc.obj.GetName()))
	}
	if t.Failed() {
		t.FailNow()
	}
	needed := map[string]bool{}
	for _, p := range objects {
		if ns := p.doc.obj.GetNamespace(); ns != "" && p.mapping.Scope.Name() == meta.RESTScopeNameNamespace {
			needed[ns] = true
		}
	}
	for _, ns := range sortedKeys(needed) {
		if !declared[ns] {
			// Not declared by any Namespace document read (objects for a namespace the
			// user brings, or default).
			_, err := env.Kube.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				t.Logf("namespace %s: no Namespace document for it; creating it", ns)
				err = cluster.CreateNamespace(ctx, env.Kube, ns)
			}
			if err != nil {
				t.Fatal(err)
			}
		}
		testkit.Eventually(t, 30*time.Second, func(ctx context.Context) error {
			n, err := env.Kube.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
			if err != nil {
				return err
			}
			return testkit.Check(n.Status.Phase == corev1.NamespaceActive, "namespace %s: phase %s", ns, n.Status.Phase)
		})
	}

	// Every other object: server-side apply, dryRun=All, strict field validation.
	kinds := map[string]int{}
	accepted := 0
	for _, p := range objects {
		if err := apply(p, true); err != nil {
			t.Errorf("%s: server-side apply (dry run): %v", p.doc, err)
			report[p.doc.file] = append(report[p.doc.file], fmt.Sprintf("%s/%s (FAILED)", p.doc.gvk.Kind, p.doc.obj.GetName()))
			continue
		}
		kinds[p.doc.gvk.Kind]++
		accepted++
		report[p.doc.file] = append(report[p.doc.file], fmt.Sprintf("%s/%s", p.doc.gvk.Kind, p.doc.obj.GetName()))
	}

	// A dry run stores nothing: the objects are not there (KEDA would otherwise start
	// polling the examples' ScaledObjects, whose scaler is not at their scalerAddress).
	for _, p := range objects {
		d := p.doc
		r := dyn.Resource(p.mapping.Resource)
		var err error
		if p.mapping.Scope.Name() == meta.RESTScopeNameNamespace {
			_, err = r.Namespace(d.obj.GetNamespace()).Get(ctx, d.obj.GetName(), metav1.GetOptions{})
		} else {
			_, err = r.Get(ctx, d.obj.GetName(), metav1.GetOptions{})
		}
		if !apierrors.IsNotFound(err) {
			t.Errorf("%s: after a dry run, GET gave %v, want NotFound", d, err)
		}
	}

	for _, f := range files {
		if r := report[f]; len(r) > 0 {
			t.Logf("%s: %s", f, strings.Join(r, ", "))
		}
	}
	var kindList []string
	for _, k := range sortedKeys(kinds) {
		kindList = append(kindList, fmt.Sprintf("%s ×%d", k, kinds[k]))
	}
	t.Logf("%d files: namespaces %s applied; %d of %d other objects accepted by server-side apply with dryRun=All and strict field validation (%s); optional objects skipped: %d; in %s",
		len(report), strings.Join(sortedKeys(declared), ", "), accepted, len(objects), strings.Join(kindList, ", "), skippedOptional, time.Since(start).Round(time.Millisecond))
}

// manifestFiles lists, relative to root, the YAML files the test applies: the plain
// manifests, every YAML under examples/, and the chart's golden renderings.
func manifestFiles(t *testing.T, root string) []string {
	t.Helper()
	var files []string
	for _, pattern := range []string{"deploy/manifests/*.yaml", "test/manifests/testdata/*.yaml"} {
		m, err := filepath.Glob(filepath.Join(root, pattern))
		if err != nil {
			t.Fatal(err)
		}
		if len(m) == 0 {
			t.Fatalf("no files match %s", pattern)
		}
		for _, f := range m {
			rel, _ := filepath.Rel(root, f)
			files = append(files, filepath.ToSlash(rel))
		}
	}
	n := len(files)
	err := filepath.WalkDir(filepath.Join(root, "examples"), func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		if ext := filepath.Ext(path); ext == ".yaml" || ext == ".yml" {
			rel, _ := filepath.Rel(root, path)
			files = append(files, filepath.ToSlash(rel))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == n {
		t.Fatal("no YAML files under examples/")
	}
	slices.Sort(files)
	return files
}

// readManifestDocs splits a YAML file into its Kubernetes objects. Documents of only
// comments are left out; documents with neither apiVersion nor kind are not Kubernetes
// objects and are returned as skipped; one without the other fails the test.
func readManifestDocs(t *testing.T, root, file string) (docs []manifestDoc, skipped []string) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(root, file))
	if err != nil {
		t.Fatal(err)
	}
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	for i := 0; ; i++ {
		raw, err := r.Read()
		if errors.Is(err, io.EOF) {
			return docs, skipped
		}
		if err != nil {
			t.Errorf("%s#%d: %v", file, i, err)
			return docs, skipped
		}
		var m map[string]any
		if err := yaml.Unmarshal(raw, &m); err != nil {
			t.Errorf("%s#%d: %v", file, i, err)
			continue
		}
		if len(m) == 0 {
			continue
		}
		obj := &unstructured.Unstructured{Object: m}
		gvk := obj.GroupVersionKind()
		switch {
		case obj.GetAPIVersion() == "" && obj.GetKind() == "":
			skipped = append(skipped, fmt.Sprintf("%s#%d", file, i))
			continue
		case obj.GetAPIVersion() == "" || obj.GetKind() == "" || obj.GetName() == "":
			t.Errorf("%s#%d: apiVersion %q, kind %q, metadata.name %q: all three are needed", file, i, obj.GetAPIVersion(), obj.GetKind(), obj.GetName())
			continue
		}
		docs = append(docs, manifestDoc{file: file, index: i, tmpl: helmSource(raw), raw: raw, obj: obj, gvk: gvk})
	}
}

// helmSource returns the template named by Helm's "# Source:" line, if any.
func helmSource(doc []byte) string {
	for line := range strings.SplitSeq(string(doc), "\n") {
		if s, ok := strings.CutPrefix(line, "# Source: "); ok {
			return s
		}
	}
	return ""
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// warningRecorder keeps the warnings the API server returns (Warning headers).
type warningRecorder struct {
	mu   sync.Mutex
	msgs []string
}

func (w *warningRecorder) HandleWarningHeaderWithContext(_ context.Context, code int, _ string, text string) {
	if code != 299 || text == "" {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.msgs = append(w.msgs, text)
}

// take returns the warnings so far and forgets them.
func (w *warningRecorder) take() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	msgs := w.msgs
	w.msgs = nil
	return msgs
}

// placeholderPrefix begins the placeholder the renderer writes for generated Secret data
// (deploy/render/render.go, placeholders).
const placeholderPrefix = "generated at install: "

// realTLSData gives a kubernetes.io/tls Secret whose data are placeholders a certificate
// and key made by the run's CA, and rewrites the document's apply body to match.
func realTLSData(d *manifestDoc) error {
	if d.gvk.Kind != "Secret" {
		return nil
	}
	if typ, _, _ := unstructured.NestedString(d.obj.Object, "type"); typ != "kubernetes.io/tls" {
		return nil
	}
	data, _, _ := unstructured.NestedStringMap(d.obj.Object, "data")
	crt, err := base64.StdEncoding.DecodeString(data["tls.crt"])
	if err != nil || !strings.HasPrefix(string(crt), placeholderPrefix) {
		return nil
	}
	certPEM, keyPEM, err := env.CP.CA.Issue(d.obj.GetName(), nil, []string{d.obj.GetName()}, nil)
	if err != nil {
		return err
	}
	data["tls.crt"] = base64.StdEncoding.EncodeToString(certPEM)
	data["tls.key"] = base64.StdEncoding.EncodeToString(keyPEM)
	if _, ok := data["ca.crt"]; ok {
		data["ca.crt"] = base64.StdEncoding.EncodeToString(env.CP.CA.CertPEM)
	}
	if err := unstructured.SetNestedStringMap(d.obj.Object, data, "data"); err != nil {
		return err
	}
	raw, err := yaml.Marshal(d.obj.Object)
	if err != nil {
		return err
	}
	d.raw = raw
	return nil
}
