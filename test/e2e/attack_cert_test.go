package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/gpuscaler/gpuscaler/test/e2e/cluster"

	"github.com/gpuscaler/gpuscaler/test/testkit"
)

// cmModule is the cert-manager release whose CRDs and RBAC this test installs,
// pinned with the module sum the Go checksum database gave for it. It is downloaded with
// `go mod download`, not required by this module: cert-manager's Kubernetes libraries
// would lift KEDA's (README.md, "Binaries are cached").
const (
	cmModule = "github.com/cert-manager/cert-manager"
	cmTag    = "v1.21.2"
	cmSum    = "h1:UWgoYM+KLNtRlqmoWOKjKBOBUPVHeepQ6/ac3ERJW68="
)

// cmGolden is the chart rendered with scaler.tls.certManager on (auto, on a
// cluster serving cert-manager.io/v1): test/manifests' golden file, which
// deploy/render.sh writes from the chart and `deploy/render.sh --check` keeps current.
const cmGolden = "test/manifests/testdata/cert-manager.yaml"

var (
	cmCertificatesGVR   = schema.GroupVersionResource{Group: "cert-manager.io", Version: "v1", Resource: "certificates"}
	cmIssuersGVR        = schema.GroupVersionResource{Group: "cert-manager.io", Version: "v1", Resource: "issuers"}
	cmClusterIssuersGVR = schema.GroupVersionResource{Group: "cert-manager.io", Version: "v1", Resource: "clusterissuers"}
	cmCertRequestsGVR   = schema.GroupVersionResource{Group: "cert-manager.io", Version: "v1", Resource: "certificaterequests"}
)

// TestAttackTenantCertificate is issue 28's second attack: with cert-manager installed, a
// tenant holding the usual edit role in its own namespace must have no issuer whose
// certificates the scaler or KEDA trusts. Before the fix the chart made ClusterIssuers,
// and a ClusterIssuer signs for a Certificate in any namespace: the tenant created one
// naming the chart's CA ClusterIssuer, got a client certificate the scaler accepts (and
// a serving certificate for the scaler's names, which KEDA accepts), and called
// GetMetrics, Explain or StreamIsActive for any namespace.
//
// What runs here is the API server with cert-manager's CRDs (the pinned release's
// deploy/crds) and the rules cert-manager's chart aggregates into edit; cert-manager's
// controller and webhook do not run, so nothing is signed. What the test shows is what
// decides whether anything could be: which issuers the chart makes, where, and what the
// tenant may create. The rest is cert-manager's rule for a namespaced Issuer, cited and
// not re-enacted: a Certificate's issuerRef of kind Issuer names an Issuer in the
// Certificate's own namespace (pkg/issuer/helper.go GetGenericIssuer, called with the
// CertificateRequest's namespace from pkg/controller/certificaterequests/sync.go), and a
// CA Issuer reads its key pair from its own namespace (pkg/controller/helper.go
// ResourceNamespace); https://cert-manager.io/docs/concepts/issuer/: "An Issuer is a
// namespaced resource, and it is not possible to issue certificates from an Issuer in a
// different namespace."
func TestAttackTenantCertificate(t *testing.T) {
	ctx := t.Context()

	// The chart's cert-manager objects as rendered, applied for real. Its Secrets (the
	// CAs' key pairs) are left out: what a tenant may do does not depend on their bytes.
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	docs, _ := readManifestDocs(t, filepath.Clean(filepath.Join(wd, "..", "..")), cmGolden)
	dyn, err := dynamic.NewForConfig(env.CP.Config)
	if err != nil {
		t.Fatal(err)
	}
	cmInstallCRDs(t, dyn)
	var chart []*unstructured.Unstructured
	for _, d := range docs {
		if d.gvk.Group != "cert-manager.io" {
			continue
		}
		if ns := d.obj.GetNamespace(); ns != "" {
			if err := cluster.CreateNamespace(ctx, env.Kube, ns); err != nil {
				t.Fatal(err)
			}
		}
		r := cmResource(t, dyn, d.obj)
		if _, err := r.Patch(ctx, d.obj.GetName(), types.ApplyPatchType, d.raw, metav1.PatchOptions{FieldManager: cmFieldManager, Force: new(true)}); err != nil {
			t.Fatalf("%s: server-side apply: %v", d, err)
		}
		obj := d.obj
		t.Cleanup(func() {
			_ = cmResource(t, dyn, obj).Delete(context.Background(), obj.GetName(), metav1.DeleteOptions{})
		})
		chart = append(chart, obj)
	}
	if len(chart) == 0 {
		t.Fatalf("%s holds no cert-manager object: the case no longer renders the certManager path", cmGolden)
	}

	tenantNS := newNamespace(t, "tenant")
	tenant := cmTenantClient(t, tenantNS)

	// The control: the tenant may make Certificates and Issuers in its own namespace. A
	// failure here would make every refusal below prove nothing.
	own := cmIssuer(tenantNS, "own")
	if _, err := tenant.Resource(cmIssuersGVR).Namespace(tenantNS).Create(ctx, own, metav1.CreateOptions{}); err != nil {
		t.Fatalf("tenant: create its own Issuer: %v", err)
	}
	ownCert := cmCertificate(tenantNS, "own", "own-tls", map[string]any{"kind": "Issuer", "name": "own"}, "server auth", "gpuscaler.gpuscaler.svc.cluster.local")
	if _, err := tenant.Resource(cmCertificatesGVR).Namespace(tenantNS).Create(ctx, ownCert, metav1.CreateOptions{}); err != nil {
		t.Fatalf("tenant: create a Certificate in its own namespace: %v", err)
	}

	// The attack: a client certificate for KEDA's name and a serving certificate for the
	// scaler's, in the tenant's own namespace, from each issuer of the chart's. A
	// ClusterIssuer would sign both there. An Issuer is looked up in the tenant's
	// namespace, where the chart has none.
	server := cmScalerDNSNames(t, chart)
	for _, iss := range chart {
		kind := iss.GetKind()
		if kind != "Issuer" && kind != "ClusterIssuer" {
			continue
		}
		ref := map[string]any{"group": "cert-manager.io", "kind": kind, "name": iss.GetName()}
		for _, c := range []*unstructured.Unstructured{
			cmCertificate(tenantNS, "mint-client-"+iss.GetName(), "mint-client", ref, "client auth", "keda-operator"),
			cmCertificate(tenantNS, "mint-server-"+iss.GetName(), "mint-server", ref, "server auth", server...),
		} {
			_, err := tenant.Resource(cmCertificatesGVR).Namespace(tenantNS).Create(ctx, c, metav1.CreateOptions{})
			switch {
			case kind == "ClusterIssuer" && err == nil:
				what := "which signs for every namespace"
				if _, isCA, _ := unstructured.NestedMap(iss.Object, "spec", "ca"); isCA {
					what = "which signs for every namespace with the CA the scaler and KEDA trust"
				}
				t.Errorf("attack: tenant %s created Certificate %s/%s from the chart's ClusterIssuer %s, %s", tenantNS, tenantNS, c.GetName(), iss.GetName(), what)
			case kind == "ClusterIssuer":
				t.Logf("tenant: Certificate from the chart's ClusterIssuer %s: %v", iss.GetName(), err)
			case err != nil:
				t.Fatalf("tenant: Certificate %s/%s naming Issuer %s: %v (the API server should accept it; cert-manager would find no such Issuer)", tenantNS, c.GetName(), iss.GetName(), err)
			default:
				// Accepted, and useless: cert-manager resolves kind Issuer in the
				// Certificate's namespace, where the chart made none.
				if _, err := dyn.Resource(cmIssuersGVR).Namespace(tenantNS).Get(ctx, iss.GetName(), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
					t.Errorf("Issuer %s/%s: got %v, want NotFound: the chart's Issuers live in %s only", tenantNS, iss.GetName(), err, iss.GetNamespace())
				} else {
					t.Logf("tenant: Certificate %s/%s naming Issuer %s: stored, but it names an Issuer of %s, where there is none; the chart's is in %s", tenantNS, c.GetName(), iss.GetName(), tenantNS, iss.GetNamespace())
				}
			}
		}
	}

	// No issuer of the chart's is cluster-scoped, in the rendering or on the server.
	for _, o := range chart {
		if o.GetKind() == "ClusterIssuer" {
			t.Errorf("%s renders ClusterIssuer %s: usable from every namespace", cmGolden, o.GetName())
		}
	}

	// Where the chart's Issuers and Certificates are (the release's namespace and KEDA's),
	// the tenant can make no Certificate, CertificateRequest or Issuer, and read no CA
	// key pair. Dry runs: RBAC decides before a dry run is honoured, so a refusal is the
	// same, and nothing is stored should one be allowed.
	dry := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}
	checked := map[string]bool{}
	for _, o := range chart {
		ns := o.GetNamespace()
		if ns == "" || checked[ns] {
			continue
		}
		checked[ns] = true
		ref := map[string]any{"group": "cert-manager.io", "kind": "Issuer", "name": o.GetName()}
		attempts := map[string]func() error{
			"create a Certificate": func() error {
				_, err := tenant.Resource(cmCertificatesGVR).Namespace(ns).Create(ctx, cmCertificate(ns, "mint", "mint", ref, "client auth", "keda-operator"), dry)
				return err
			},
			"create a CertificateRequest": func() error {
				cr := &unstructured.Unstructured{Object: map[string]any{
					"apiVersion": "cert-manager.io/v1", "kind": "CertificateRequest",
					"metadata": map[string]any{"name": "mint", "namespace": ns},
					"spec":     map[string]any{"issuerRef": ref, "request": "LS0tLS1CRUdJTg==", "usages": []any{"client auth"}},
				}}
				_, err := tenant.Resource(cmCertRequestsGVR).Namespace(ns).Create(ctx, cr, dry)
				return err
			},
			"create an Issuer": func() error {
				_, err := tenant.Resource(cmIssuersGVR).Namespace(ns).Create(ctx, cmIssuer(ns, "mint"), dry)
				return err
			},
		}
		for _, iss := range chart {
			if iss.GetKind() == "Issuer" && iss.GetNamespace() == ns {
				secret, _, _ := unstructured.NestedString(iss.Object, "spec", "ca", "secretName")
				if secret != "" {
					attempts["read the CA key pair "+secret] = func() error {
						_, err := cmTenantKube(t, tenantNS).CoreV1().Secrets(ns).Get(ctx, secret, metav1.GetOptions{})
						return err
					}
				}
			}
		}
		for _, what := range sortedKeys(attempts) {
			err := attempts[what]()
			if !apierrors.IsForbidden(err) {
				t.Errorf("tenant %s: %s in namespace %s: got %v, want Forbidden", tenantNS, what, ns, err)
				continue
			}
			t.Logf("tenant: %s in %s: forbidden", what, ns)
		}
	}
	for _, want := range chart {
		if want.GetKind() == "Certificate" && !checked[want.GetNamespace()] {
			t.Errorf("Certificate %s/%s: its namespace was not checked", want.GetNamespace(), want.GetName())
		}
	}
}

// cmInstallCRDs applies the CRDs of the pinned cert-manager release (its
// deploy/crds, "for reference, development and testing purposes": the chart's own copies
// are Helm templates) and deletes them when the test ends, so that the other tests find
// the server as before (TestManifestsApplyServerSideDryRun skips cert-manager's kinds
// because they are not served).
func cmInstallCRDs(t *testing.T, dyn dynamic.Interface) {
	t.Helper()
	ctx := t.Context()
	out, err := exec.CommandContext(ctx, "go", "mod", "download", "-json", cmModule+"@"+cmTag).Output()
	if err != nil {
		t.Fatalf("go mod download %s@%s: %v", cmModule, cmTag, err)
	}
	var mod struct{ Dir, Sum string }
	if err := json.Unmarshal(out, &mod); err != nil {
		t.Fatal(err)
	}
	if mod.Sum != cmSum {
		t.Fatalf("%s@%s: got sum %s, want %s", cmModule, cmTag, mod.Sum, cmSum)
	}
	dir := filepath.Join(mod.Dir, "deploy", "crds")
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no CRDs in %s: %v", dir, err)
	}
	var names []string
	for _, f := range files {
		docs, _ := readManifestDocs(t, dir, filepath.Base(f))
		for _, d := range docs {
			names = append(names, d.obj.GetName())
		}
	}
	if err := cluster.ApplyCRDs(ctx, env.CP, dir); err != nil {
		t.Fatal(err)
	}
	t.Logf("applied the CRDs of %s@%s: %s", cmModule, cmTag, strings.Join(names, ", "))
	crds := dyn.Resource(schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"})
	t.Cleanup(func() {
		// The API server's CRD finalizer deletes a CRD's objects first, and fails (then
		// backs off for minutes) while that resource's storage is still initialising, as
		// it can be right after a test as short as this one. Each resource serves a list
		// once its storage is up.
		testkit.Eventually(t, time.Minute, func(ctx context.Context) error {
			for _, n := range names {
				plural, group, _ := strings.Cut(n, ".")
				gvr := schema.GroupVersionResource{Group: group, Version: "v1", Resource: plural}
				if _, err := dyn.Resource(gvr).List(ctx, metav1.ListOptions{Limit: 1}); err != nil {
					return fmt.Errorf("%s not served yet: %w", n, err)
				}
			}
			return nil
		})
		for _, n := range names {
			_ = crds.Delete(context.Background(), n, metav1.DeleteOptions{})
		}
		testkit.Eventually(t, time.Minute, func(ctx context.Context) error {
			for _, n := range names {
				if _, err := crds.Get(ctx, n, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
					return fmt.Errorf("CRD %s not deleted yet (%v)", n, err)
				}
			}
			return nil
		})
	})
}

// cmFieldManager owns what TestAttackTenantCertificate applies.
const cmFieldManager = "gpuscaler-e2e-attack-cert"

// cmEditRules are the rules cert-manager's chart gives the ClusterRoles it
// aggregates into edit (and admin): deploy/charts/cert-manager/templates/rbac.yaml at
// cmTag, cert-manager-view (labelled aggregate-to-view, -edit, -admin) and
// cert-manager-edit (aggregate-to-edit, -admin).
var cmEditRules = map[string][]rbacv1.PolicyRule{
	"view": {
		{APIGroups: []string{"cert-manager.io"}, Resources: []string{"certificates", "certificaterequests", "issuers"}, Verbs: []string{"get", "list", "watch"}},
		{APIGroups: []string{"acme.cert-manager.io"}, Resources: []string{"challenges", "orders"}, Verbs: []string{"get", "list", "watch"}},
	},
	"edit": {
		{APIGroups: []string{"cert-manager.io"}, Resources: []string{"certificates", "certificaterequests", "issuers"}, Verbs: []string{"create", "delete", "deletecollection", "patch", "update"}},
		{APIGroups: []string{"cert-manager.io"}, Resources: []string{"certificates/status"}, Verbs: []string{"update"}},
		{APIGroups: []string{"acme.cert-manager.io"}, Resources: []string{"challenges"}, Verbs: []string{"delete", "deletecollection", "patch", "update"}},
		{APIGroups: []string{"acme.cert-manager.io"}, Resources: []string{"orders"}, Verbs: []string{"delete", "deletecollection"}},
	},
}

// cmTenantConfig is a client config acting as a tenant (impersonated by the admin) who
// holds edit in its namespace ns and nothing elsewhere: the RoleBinding to edit, and
// RoleBindings to cert-manager's two ClusterRoles, created here with the upstream
// chart's rules. Those carry the aggregate-to-edit label as upstream, but
// kube-controller-manager here runs no clusterrole-aggregation controller, so the rules
// aggregation would add to edit are bound beside it: the tenant's rights are the same.
func cmTenantConfig(t *testing.T, ns string) *rest.Config {
	t.Helper()
	ctx := t.Context()
	user := "tenant@" + ns
	roles := []string{"edit"}
	for _, which := range sortedKeys(cmEditRules) {
		name := ns + "-cert-manager-" + which
		labels := map[string]string{"rbac.authorization.k8s.io/aggregate-to-edit": "true", "rbac.authorization.k8s.io/aggregate-to-admin": "true"}
		if which == "view" {
			labels["rbac.authorization.k8s.io/aggregate-to-view"] = "true"
		}
		cr := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}, Rules: cmEditRules[which]}
		if _, err := env.Kube.RbacV1().ClusterRoles().Create(ctx, cr, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = env.Kube.RbacV1().ClusterRoles().Delete(context.Background(), name, metav1.DeleteOptions{})
		})
		roles = append(roles, name)
	}
	for _, role := range roles {
		rb := &rbacv1.RoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: "tenant-" + role, Namespace: ns},
			RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: role},
			Subjects:   []rbacv1.Subject{{APIGroup: "rbac.authorization.k8s.io", Kind: "User", Name: user}},
		}
		if _, err := env.Kube.RbacV1().RoleBindings(ns).Create(ctx, rb, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	cfg := rest.CopyConfig(env.CP.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: user, Groups: []string{"system:authenticated"}}
	return cfg
}

func cmTenantClient(t *testing.T, ns string) dynamic.Interface {
	t.Helper()
	dyn, err := dynamic.NewForConfig(cmTenantConfig(t, ns))
	if err != nil {
		t.Fatal(err)
	}
	return dyn
}

// cmTenantKube is a typed client as the tenant of ns, whose RBAC cmTenantClient made.
func cmTenantKube(t *testing.T, ns string) kubernetes.Interface {
	t.Helper()
	cfg := rest.CopyConfig(env.CP.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: "tenant@" + ns, Groups: []string{"system:authenticated"}}
	kc, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return kc
}

func cmResource(t *testing.T, dyn dynamic.Interface, o *unstructured.Unstructured) dynamic.ResourceInterface {
	t.Helper()
	switch o.GetKind() {
	case "Certificate":
		return dyn.Resource(cmCertificatesGVR).Namespace(o.GetNamespace())
	case "Issuer":
		return dyn.Resource(cmIssuersGVR).Namespace(o.GetNamespace())
	case "ClusterIssuer":
		return dyn.Resource(cmClusterIssuersGVR)
	}
	t.Fatalf("cert-manager kind %s: not one this test knows", o.GetKind())
	return nil
}

// cmScalerDNSNames are the names of the chart's serving certificate for the scaler.
func cmScalerDNSNames(t *testing.T, chart []*unstructured.Unstructured) []string {
	t.Helper()
	for _, o := range chart {
		usages, _, _ := unstructured.NestedStringSlice(o.Object, "spec", "usages")
		names, _, _ := unstructured.NestedStringSlice(o.Object, "spec", "dnsNames")
		if o.GetKind() == "Certificate" && slices.Contains(usages, "server auth") && len(names) > 0 {
			return names
		}
	}
	t.Fatalf("%s: no serving Certificate for the scaler", cmGolden)
	return nil
}

func cmIssuer(ns, name string) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "cert-manager.io/v1", "kind": "Issuer",
		"metadata": map[string]any{"name": name, "namespace": ns},
		"spec":     map[string]any{"selfSigned": map[string]any{}},
	}}
}

func cmCertificate(ns, name, secret string, issuerRef map[string]any, usage string, names ...string) *unstructured.Unstructured {
	spec := map[string]any{"secretName": secret, "issuerRef": issuerRef, "usages": []any{usage}, "commonName": names[0]}
	if usage == "server auth" {
		dns := make([]any, len(names))
		for i, n := range names {
			dns[i] = n
		}
		spec["dnsNames"] = dns
	}
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "cert-manager.io/v1", "kind": "Certificate",
		"metadata": map[string]any{"name": name, "namespace": ns},
		"spec":     spec,
	}}
}
