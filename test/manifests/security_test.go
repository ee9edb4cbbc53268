package manifests

import (
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	kedav1alpha1 "github.com/kedacore/keda/v2/apis/keda/v1alpha1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/gpuscaler/gpuscaler/deploy/render"
)

// kubernetesAuth says whether a case's clients authenticate to NATS with ServiceAccount
// tokens through the auth callout (nats.auth.type kubernetes).
func kubernetesAuth(objs []Object) bool {
	return flagValue(scalerArgs(objs), "nats-token-file") != ""
}

// TestAuthCalloutRBAC: the callout's ServiceAccount is bound to system:auth-delegator
// (TokenReview) and to nothing else, but for get on pods with --pod-lookup; no other
// object of the release is bound to anything but the collector's own role.
func TestAuthCalloutRBAC(t *testing.T) {
	for _, c := range render.Cases {
		t.Run(c.Name, func(t *testing.T) {
			objs := caseObjects(t, c)
			dep, ok := find[*appsv1.Deployment](objs, render.Release+"-auth-callout")
			if !kubernetesAuth(objs) {
				if ok {
					t.Errorf("got an auth callout Deployment without nats.auth.type kubernetes")
				}
				return
			}
			if !ok {
				t.Fatal("got no auth callout Deployment with nats.auth.type kubernetes")
			}
			pod := dep.Spec.Template.Spec
			sa := rbacv1.Subject{Kind: "ServiceAccount", Name: pod.ServiceAccountName, Namespace: render.Namespace}
			if _, ok := find[*corev1.ServiceAccount](objs, sa.Name); !ok {
				t.Errorf("got serviceAccountName %s, not rendered", sa.Name)
			}
			if !deref(pod.AutomountServiceAccountToken, true) {
				t.Errorf("got no API token in the callout's pods, want one (TokenReview)")
			}
			// With the bundled NATS, the callout writes its issuer's public key to one
			// ConfigMap (--issuer-key-configmap): patch on that one, nothing else.
			issuerCM := flagValue(pod.Containers[0].Args, "issuer-key-configmap")
			var wantRoles []string
			if issuerCM != "" {
				ns, name, _ := strings.Cut(issuerCM, "/")
				if ns != render.Namespace {
					t.Errorf("got --issuer-key-configmap=%s, want a ConfigMap in %s", issuerCM, render.Namespace)
				}
				if _, ok := find[*corev1.ConfigMap](objs, name); !ok {
					t.Errorf("got --issuer-key-configmap=%s, a ConfigMap the release does not render", issuerCM)
				}
				wantRoles = []string{fmt.Sprint([]rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"configmaps"}, ResourceNames: []string{name}, Verbs: []string{"patch"}}})}
			}
			var gotRoles []string
			for _, r := range all[*rbacv1.Role](objs) {
				gotRoles = append(gotRoles, fmt.Sprint(r.Rules))
				bound := false
				for _, b := range all[*rbacv1.RoleBinding](objs) {
					if b.RoleRef.Kind == "Role" && b.RoleRef.Name == r.Name {
						bound = true
						if !slices.Equal(b.Subjects, []rbacv1.Subject{sa}) {
							t.Errorf("RoleBinding %s: got subjects %v, want the callout alone", b.Name, b.Subjects)
						}
					}
				}
				if !bound {
					t.Errorf("Role %s: bound to nobody", r.Name)
				}
			}
			if !slices.Equal(gotRoles, wantRoles) {
				t.Errorf("got Roles with rules %v, want %v", gotRoles, wantRoles)
			}
			if n, want := len(all[*rbacv1.RoleBinding](objs)), len(wantRoles); n != want {
				t.Errorf("got %d RoleBindings, want %d", n, want)
			}
			roles := map[string][]rbacv1.PolicyRule{}
			for _, r := range all[*rbacv1.ClusterRole](objs) {
				roles[r.Name] = r.Rules
			}
			var got []string
			for _, b := range all[*rbacv1.ClusterRoleBinding](objs) {
				if !slices.Contains(b.Subjects, sa) {
					continue
				}
				if len(b.Subjects) != 1 {
					t.Errorf("ClusterRoleBinding %s: got subjects %v, want the callout alone", b.Name, b.Subjects)
				}
				got = append(got, b.RoleRef.Name)
				if b.RoleRef.Name != "system:auth-delegator" {
					if _, ok := roles[b.RoleRef.Name]; !ok {
						t.Errorf("ClusterRoleBinding %s: got role %s, which the release does not render", b.Name, b.RoleRef.Name)
					}
				}
			}
			want := []string{"system:auth-delegator"}
			podLookup := slices.Contains(pod.Containers[0].Args, "--pod-lookup")
			if podLookup {
				want = append(want, render.Release+"-auth-callout-pods")
				wantRules := []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get"}}}
				if r := roles[render.Release+"-auth-callout-pods"]; fmt.Sprint(r) != fmt.Sprint(wantRules) {
					t.Errorf("got pod lookup rules %v, want %v", r, wantRules)
				}
			}
			slices.Sort(got)
			slices.Sort(want)
			if !slices.Equal(got, want) {
				t.Errorf("got the callout bound to %v, want exactly %v (--pod-lookup %v)", got, want, podLookup)
			}
			for name := range roles {
				if name != render.Release+"-collector" && name != render.Release && !(podLookup && name == render.Release+"-auth-callout-pods") {
					t.Errorf("got ClusterRole %s, want none but the collector's, the scaler's (and the callout's pod lookup)", name)
				}
			}
		})
	}
}

// TestNATSIdentities: with nats.auth.type kubernetes, the scaler and the collectors
// present a projected ServiceAccount token of the audience the callout checks, and the
// callout counts exactly their ServiceAccounts as scaler and collectors.
func TestNATSIdentities(t *testing.T) {
	for _, c := range render.Cases {
		t.Run(c.Name, func(t *testing.T) {
			objs := caseObjects(t, c)
			if !kubernetesAuth(objs) {
				return
			}
			callout, _ := find[*appsv1.Deployment](objs, render.Release+"-auth-callout")
			args := callout.Spec.Template.Spec.Containers[0].Args
			audience := flagValue(args, "audience")
			if audience == "" {
				t.Fatalf("got callout args %v, want --audience", args)
			}
			scaler, _ := find[*appsv1.Deployment](objs, render.Release)
			clients := []struct {
				role string
				pod  corev1.PodSpec
			}{{"scaler", scaler.Spec.Template.Spec}}
			if ds, ok := find[*appsv1.DaemonSet](objs, render.Release+"-collector"); ok {
				clients = append(clients, struct {
					role string
					pod  corev1.PodSpec
				}{"collector", ds.Spec.Template.Spec})
			} else if got := flagValue(args, "collector-identities"); got != "" {
				t.Errorf("got --collector-identities=%s without collectors, want none", got)
			}
			for _, cl := range clients {
				if got, want := flagValue(args, cl.role+"-identities"), render.Namespace+"/"+cl.pod.ServiceAccountName; got != want {
					t.Errorf("got --%s-identities=%s, want %s, the %s's ServiceAccount", cl.role, got, want, cl.role)
				}
				ctr := cl.pod.Containers[0]
				file := flagValue(ctr.Args, "nats-token-file")
				vol := mountedVolume(ctr.VolumeMounts, file)
				var token *corev1.ServiceAccountTokenProjection
				for _, v := range cl.pod.Volumes {
					if v.Name == vol && v.Projected != nil && len(v.Projected.Sources) == 1 {
						token = v.Projected.Sources[0].ServiceAccountToken
					}
				}
				if token == nil || !strings.HasSuffix(file, "/"+token.Path) {
					t.Errorf("%s: got --nats-token-file=%s on volume %q, want a projected ServiceAccount token there", cl.role, file, vol)
					continue
				}
				if token.Audience != audience {
					t.Errorf("%s: got token audience %q, want the callout's %q", cl.role, token.Audience, audience)
				}
				if exp := deref(token.ExpirationSeconds, 3600); exp < 600 {
					t.Errorf("%s: got expirationSeconds %d, want 600 at least (the API server's minimum)", cl.role, exp)
				}
			}
			if flagValue(args, "producer-identities") == "" {
				t.Errorf("got callout args %v, want --producer-identities", args)
			}
		})
	}
}

// peer is a pod that may try to reach one of the release's pods.
type peer struct {
	namespace string
	labels    map[string]string
}

// admits says whether the NetworkPolicies selecting a pod (with podLabels, in the
// release's namespace) admit a TCP connection from p to port, as the NetworkPolicy API
// defines it (k8s.io/api/networking/v1): the union of every selecting policy's ingress
// rules; a rule with no ports admits every port, with no from every peer; a peer with a
// namespaceSelector and a podSelector needs both, with only a podSelector means this
// namespace. Namespaces carry kubernetes.io/metadata.name. A pod no policy selects
// admits everything.
func admits(t *testing.T, policies []*networkingv1.NetworkPolicy, podLabels map[string]string, p peer, port int32) bool {
	t.Helper()
	selected := false
	for _, np := range policies {
		sel, err := metav1.LabelSelectorAsSelector(&np.Spec.PodSelector)
		if err != nil {
			t.Fatal(err)
		}
		if np.Namespace != render.Namespace || !sel.Matches(labels.Set(podLabels)) {
			continue
		}
		selected = true
		for _, rule := range np.Spec.Ingress {
			portOK := len(rule.Ports) == 0
			for _, rp := range rule.Ports {
				portOK = portOK || (rp.Port != nil && rp.Port.IntValue() == int(port) && deref(rp.Protocol, corev1.ProtocolTCP) == corev1.ProtocolTCP)
			}
			fromOK := len(rule.From) == 0
			for _, f := range rule.From {
				fromOK = fromOK || peerMatches(t, np.Namespace, f, p)
			}
			if portOK && fromOK {
				return true
			}
		}
	}
	return !selected
}

func peerMatches(t *testing.T, policyNamespace string, f networkingv1.NetworkPolicyPeer, p peer) bool {
	t.Helper()
	if f.IPBlock != nil {
		return false
	}
	nsOK := p.namespace == policyNamespace
	if f.NamespaceSelector != nil {
		s, err := metav1.LabelSelectorAsSelector(f.NamespaceSelector)
		if err != nil {
			t.Fatal(err)
		}
		nsOK = s.Matches(labels.Set{"kubernetes.io/metadata.name": p.namespace})
	}
	podOK := true
	if f.PodSelector != nil {
		s, err := metav1.LabelSelectorAsSelector(f.PodSelector)
		if err != nil {
			t.Fatal(err)
		}
		podOK = s.Matches(labels.Set(p.labels))
	}
	return nsOK && podOK
}

var (
	kedaPodsOnce           sync.Once
	kedaOperator, kedaMetr map[string]string
	kedaPodsErr            error
)

// kedaPodLabels returns the pod labels of KEDA's operator and of its metrics server:
// those of KEDA v2.21.0's release manifests (config/manager/manager.yaml and
// config/metrics-server/deployment.yaml in its module), with, for the operator, the
// app.kubernetes.io/name label KEDA's Helm chart adds (keda/templates/manager/deployment.yaml
// in kedacore/charts): a policy written for either installation must admit it.
func kedaPodLabels(t *testing.T) (operator, metricsServer map[string]string) {
	t.Helper()
	kedaPodsOnce.Do(func() {
		out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "github.com/kedacore/keda/v2").Output()
		if err != nil {
			kedaPodsErr = fmt.Errorf("go list -m github.com/kedacore/keda/v2: %w", err)
			return
		}
		dir := strings.TrimSpace(string(out))
		podLabels := func(file string) (map[string]string, error) {
			data, err := os.ReadFile(filepath.Join(dir, file))
			if err != nil {
				return nil, err
			}
			objs, err := DecodeAll(file, data)
			if err != nil {
				return nil, err
			}
			for _, o := range objs {
				if d, ok := o.Obj.(*appsv1.Deployment); ok {
					return d.Spec.Template.Labels, nil
				}
			}
			return nil, fmt.Errorf("%s: no Deployment", file)
		}
		if kedaOperator, kedaPodsErr = podLabels("config/manager/manager.yaml"); kedaPodsErr != nil {
			return
		}
		kedaOperator = maps.Clone(kedaOperator)
		kedaOperator["app.kubernetes.io/name"] = "keda-operator"
		kedaMetr, kedaPodsErr = podLabels("config/metrics-server/deployment.yaml")
	})
	if kedaPodsErr != nil {
		t.Fatal(kedaPodsErr)
	}
	return kedaOperator, kedaMetr
}

// kedaNamespace is the case's keda.namespace.
func kedaNamespace(t *testing.T, c render.Case) string {
	t.Helper()
	vals, err := render.CaseValues(root(t), c)
	if err != nil {
		t.Fatal(err)
	}
	if k, ok := vals["keda"].(map[string]any); ok {
		if ns, ok := k["namespace"].(string); ok {
			return ns
		}
	}
	return "keda"
}

// reach is a connection a NetworkPolicy test expects admitted or not.
type reach struct {
	what string
	pod  map[string]string // labels of the pod reached, in the release's namespace
	from peer
	port int32
	want bool
}

// TestNetworkPolicies: who may reach what, asked of the rendered policies as a CNI
// would: the scaler's gRPC port admits KEDA's operator in KEDA's namespace and nobody
// else (not KEDA's metrics server, not a tenant pod wearing the operator's labels); NATS
// clients connect from anywhere but the route port admits only NATS servers, and its
// monitoring port no tenant; the HTTP ports admit whom networkPolicy.metricsFrom names
// (everyone by default).
func TestNetworkPolicies(t *testing.T) {
	operator, metricsServer := kedaPodLabels(t)
	for _, c := range render.Cases {
		t.Run(c.Name, func(t *testing.T) {
			objs := caseObjects(t, c)
			policies := all[*networkingv1.NetworkPolicy](objs)
			if len(policies) == 0 {
				t.Fatal("got no NetworkPolicy, want them on by default")
			}
			kedaNS := kedaNamespace(t, c)
			tenant := peer{"inference", map[string]string{"app": "llm-gateway"}}
			scaler, _ := find[*appsv1.Deployment](objs, render.Release)
			grpcPort, httpPort := scaler.Spec.Template.Spec.Containers[0].Ports[0].ContainerPort, scaler.Spec.Template.Spec.Containers[0].Ports[1].ContainerPort
			monitoring := peer{"monitoring", map[string]string{"app.kubernetes.io/name": "prometheus"}}
			metricsOpen := admits(t, policies, scaler.Spec.Template.Labels, tenant, httpPort)
			checks := []reach{
				{"KEDA's operator to the scaler's gRPC", scaler.Spec.Template.Labels, peer{kedaNS, operator}, grpcPort, true},
				{"KEDA's metrics server to the scaler's gRPC", scaler.Spec.Template.Labels, peer{kedaNS, metricsServer}, grpcPort, false},
				{"a tenant to the scaler's gRPC", scaler.Spec.Template.Labels, tenant, grpcPort, false},
				{"a tenant wearing the operator's labels to the scaler's gRPC", scaler.Spec.Template.Labels, peer{tenant.namespace, operator}, grpcPort, false},
				{"a pod of the release's namespace to the scaler's gRPC", scaler.Spec.Template.Labels, peer{render.Namespace, map[string]string{"app": "debug"}}, grpcPort, false},
				{"Prometheus to the scaler's /metrics", scaler.Spec.Template.Labels, monitoring, httpPort, true},
			}
			if nats, ok := find[*appsv1.StatefulSet](objs, render.Release+"-nats"); ok {
				natsPod := nats.Spec.Template.Labels
				checks = append(checks,
					reach{"a tenant to NATS's client port", natsPod, tenant, 4222, true},
					reach{"a tenant to NATS's route port", natsPod, tenant, 6222, false},
					reach{"a NATS server to another's route port", natsPod, peer{render.Namespace, natsPod}, 6222, true},
					reach{"a tenant to NATS's monitoring", natsPod, tenant, 8222, false},
				)
			}
			if callout, ok := find[*appsv1.Deployment](objs, render.Release+"-auth-callout"); ok {
				pod := callout.Spec.Template.Labels
				port := callout.Spec.Template.Spec.Containers[0].Ports[0].ContainerPort
				checks = append(checks,
					reach{"Prometheus to the callout's /metrics", pod, monitoring, port, true},
					reach{"a tenant to the callout's /metrics", pod, tenant, port, metricsOpen},
					reach{"a tenant to any other port of the callout", pod, tenant, 4222, false},
				)
			}
			for _, ck := range checks {
				if got := admits(t, policies, ck.pod, ck.from, ck.port); got != ck.want {
					t.Errorf("%s (%s/%v, port %d): got admitted %v, want %v", ck.what, ck.from.namespace, ck.from.labels, ck.port, got, ck.want)
				}
			}
			if c.Name == "default" && !metricsOpen {
				t.Errorf("got the scaler's /metrics closed to a tenant with the default values, want it open (networkPolicy.metricsFrom empty)")
			}
			if c.Name == "cert-manager" && metricsOpen {
				t.Errorf("got the scaler's /metrics open to a tenant with metricsFrom set, want only the monitoring namespace")
			}
			// The status page shows every namespace's triggers, queues and pods.
			if flagValue(scaler.Spec.Template.Spec.Containers[0].Args, "status-page") != "false" && metricsOpen {
				t.Errorf("got the scaler's status page on (--status-page not false) and its HTTP port open to a tenant, want one or the other")
			}
		})
	}
}

// TestGRPCCertificatesWiring: with gRPC TLS, the scaler reads its certificate and its
// client CA from the Secret the chart makes (or cert-manager fills, or the user names),
// and the ClusterTriggerAuthentication gives KEDA the Secret made for it, in KEDA's
// namespace; the scaler's certificate is for the scalerAddress the examples use.
func TestGRPCCertificatesWiring(t *testing.T) {
	for _, c := range render.Cases {
		t.Run(c.Name, func(t *testing.T) {
			objs := caseObjects(t, c)
			scaler, _ := find[*appsv1.Deployment](objs, render.Release)
			pod := scaler.Spec.Template.Spec
			ctr := pod.Containers[0]
			certFile := flagValue(ctr.Args, "tls-cert")
			if certFile == "" {
				t.Fatalf("got scaler args %v, want --tls-cert: gRPC TLS is on by default in every case", ctr.Args)
			}
			serverSecret := strings.Split(secretFile(t, pod, ctr, certFile), "/")[0]
			if got := strings.Split(secretFile(t, pod, ctr, flagValue(ctr.Args, "tls-key")), "/")[0]; got != serverSecret {
				t.Errorf("got --tls-key from Secret %q, want %q with --tls-cert", got, serverSecret)
			}
			clientCA := secretFile(t, pod, ctr, flagValue(ctr.Args, "tls-client-ca"))
			kedaNS := kedaNamespace(t, c)
			cta, hasCTA := find[*kedav1alpha1.ClusterTriggerAuthentication](objs, "")
			clientSecret, ctaCA := "", ""
			if hasCTA {
				for _, r := range cta.Spec.SecretTargetRef {
					if r.Parameter == "caCert" {
						ctaCA = r.Name + "/" + r.Key
						continue
					}
					if clientSecret != "" && r.Name != clientSecret {
						t.Errorf("got ClusterTriggerAuthentication client certificate Secrets %s and %s, want one", clientSecret, r.Name)
					}
					clientSecret = r.Name
				}
			}
			for _, ci := range all[*ClusterIssuer](objs) {
				t.Errorf("got ClusterIssuer %s: a ClusterIssuer signs for every namespace's Certificates, so any tenant could mint a certificate the scaler or KEDA trusts", ci.Name)
			}
			if certs := all[*Certificate](objs); len(certs) == 0 {
				// Without cert-manager: one CA on both sides, in the Secrets below.
				if clientCA != serverSecret+"/ca.crt" {
					t.Errorf("got --tls-client-ca from %s, want %s/ca.crt with --tls-cert", clientCA, serverSecret)
				}
				if hasCTA && ctaCA != clientSecret+"/ca.crt" {
					t.Errorf("got the ClusterTriggerAuthentication's caCert from %s, want %s/ca.crt", ctaCA, clientSecret)
				}
			}
			secrets := map[string]*corev1.Secret{}
			for _, s := range all[*corev1.Secret](objs) {
				secrets[s.Namespace+"/"+s.Name] = s
			}
			certs := map[string]*Certificate{}
			for _, cert := range all[*Certificate](objs) {
				certs[cert.Namespace+"/"+cert.Spec.SecretName] = cert
			}
			wantNames := []string{scalerHost, render.Release + "." + render.Namespace + ".svc", render.Release + "." + render.Namespace, render.Release}
			switch {
			case secrets[render.Namespace+"/"+serverSecret] != nil:
				s := secrets[render.Namespace+"/"+serverSecret]
				if got := s.Annotations["gpuscaler/dns-names"]; got != strings.Join(wantNames, ",") {
					t.Errorf("got the generated certificate for %q, want %q", got, strings.Join(wantNames, ","))
				}
				if hasCTA {
					client := secrets[kedaNS+"/"+clientSecret]
					if client == nil {
						t.Fatalf("got no Secret %s/%s for the ClusterTriggerAuthentication", kedaNS, clientSecret)
					}
					if string(client.Data["ca.crt"]) != string(s.Data["ca.crt"]) {
						t.Errorf("got KEDA's ca.crt unlike the scaler's, want one CA")
					}
				}
			case certs[render.Namespace+"/"+serverSecret] != nil:
				checkCertManager(t, objs, kedaNS, certManagerWiring{
					server: certs[render.Namespace+"/"+serverSecret], client: certs[kedaNS+"/"+clientSecret],
					withClient: hasCTA, clientCA: clientCA, ctaCA: ctaCA,
				}, wantNames)
			default:
				// The user's Secrets (scaler.tls.secretName): nothing to generate.
				if secrets[render.Namespace+"/"+render.Release+"-grpc-ca"] != nil {
					t.Errorf("got a generated CA with scaler.tls.secretName %s", serverSecret)
				}
			}
		})
	}
}

// scalerHost is the host of the examples' scalerAddress.
var scalerHost, _, _ = strings.Cut(scalerAddress, ":")

// certManagerWiring is what the scaler and KEDA read, with cert-manager: the Certificates
// of the scaler's Secret and of the ClusterTriggerAuthentication's (withClient), and the
// Secret/key the scaler's --tls-client-ca and the ClusterTriggerAuthentication's caCert
// come from.
type certManagerWiring struct {
	server, client  *Certificate
	withClient      bool
	clientCA, ctaCA string
}

// checkCertManager: cert-manager's chain as the chart writes it, with namespaced Issuers
// only (issue 28): a server CA whose Issuer, in the release's namespace, issues the
// scaler's certificate there (server auth, every name of its Service); a client CA whose
// Issuer, in KEDA's namespace, issues KEDA's certificate there (client auth). cert-manager
// resolves an issuerRef of kind Issuer in the Certificate's namespace and reads a CA
// Issuer's key pair from the Issuer's namespace (pkg/issuer/helper.go GetGenericIssuer,
// pkg/controller/helper.go ResourceNamespace): so each CA is usable from its one
// namespace, which tenants cannot write to. Each side verifies the other with the other
// CA's certificate, copied without its key; the two CAs differ, and neither key leaves
// its namespace.
func checkCertManager(t *testing.T, objs []Object, kedaNS string, w certManagerWiring, wantNames []string) {
	t.Helper()
	issuers := map[string]*Issuer{}
	for _, i := range all[*Issuer](objs) {
		if i.Namespace != render.Namespace && i.Namespace != kedaNS {
			t.Errorf("got Issuer %s/%s, want Issuers in %s and %s only", i.Namespace, i.Name, render.Namespace, kedaNS)
		}
		issuers[i.Namespace+"/"+i.Name] = i
	}
	secrets := map[string]*corev1.Secret{}
	for _, s := range all[*corev1.Secret](objs) {
		secrets[s.Namespace+"/"+s.Name] = s
	}
	for _, cert := range all[*Certificate](objs) {
		if cert.Namespace != render.Namespace && cert.Namespace != kedaNS {
			t.Errorf("got Certificate %s/%s, want Certificates in %s and %s only", cert.Namespace, cert.Name, render.Namespace, kedaNS)
		}
	}
	// caOf returns the CA key pair's Secret behind a Certificate: its Issuer's, which
	// must be a CA Issuer in the Certificate's namespace.
	caOf := func(who string, cert *Certificate, ns string) *corev1.Secret {
		t.Helper()
		ref := cert.Spec.IssuerRef
		if cert.Namespace != ns || ref.Kind != "Issuer" || ref.Group != "cert-manager.io" {
			t.Fatalf("got %s's certificate %s/%s from %+v, want an Issuer in %s", who, cert.Namespace, cert.Name, ref, ns)
		}
		iss := issuers[ns+"/"+ref.Name]
		if iss == nil || iss.Spec.CA == nil {
			t.Fatalf("got %s's certificate from Issuer %s/%s, want a CA Issuer of the release there", who, ns, ref.Name)
		}
		ca := secrets[ns+"/"+iss.Spec.CA.SecretName]
		if ca == nil || len(ca.Data["tls.crt"]) == 0 || len(ca.Data["tls.key"]) == 0 {
			t.Fatalf("Issuer %s/%s: got no key pair in Secret %s/%s", ns, iss.Name, ns, iss.Spec.CA.SecretName)
		}
		return ca
	}
	server := w.server
	if !slices.Equal(server.Spec.DNSNames, wantNames) || !slices.Equal(server.Spec.Usages, []string{"server auth"}) {
		t.Errorf("got the scaler's certificate for %v usages %v, want %v, server auth", server.Spec.DNSNames, server.Spec.Usages, wantNames)
	}
	serverCA := caOf("the scaler", server, render.Namespace)
	// The client CA is rendered whether or not the chart issues KEDA's certificate: the
	// scaler needs it either way.
	var clientCA *corev1.Secret
	for _, iss := range issuers {
		if iss.Namespace == kedaNS && iss.Spec.CA != nil {
			clientCA = secrets[kedaNS+"/"+iss.Spec.CA.SecretName]
		}
	}
	if clientCA == nil {
		t.Fatalf("got no CA Issuer with its key pair in KEDA's namespace %s", kedaNS)
	}
	if w.withClient {
		if w.client == nil {
			t.Fatal("got no Certificate for the ClusterTriggerAuthentication's Secret in KEDA's namespace")
		}
		if !slices.Equal(w.client.Spec.Usages, []string{"client auth"}) {
			t.Errorf("got KEDA's certificate with usages %v, want client auth", w.client.Spec.Usages)
		}
		if got := caOf("KEDA", w.client, kedaNS); got != clientCA {
			t.Errorf("got KEDA's certificate from the CA in %s/%s, want %s/%s", got.Namespace, got.Name, clientCA.Namespace, clientCA.Name)
		}
	}
	if string(serverCA.Data["tls.crt"]) == string(clientCA.Data["tls.crt"]) {
		t.Error("got one CA for the scaler's and KEDA's certificates, want two: a certificate issued in either namespace would then pass on both sides")
	}
	// The scaler verifies KEDA with the client CA's certificate, KEDA the scaler with the
	// server CA's: copies in their own namespaces, without keys.
	for _, chk := range []struct {
		who, file, ns string
		want          *corev1.Secret
		skip          bool
	}{
		{"the scaler's --tls-client-ca", w.clientCA, render.Namespace, clientCA, false},
		{"the ClusterTriggerAuthentication's caCert", w.ctaCA, kedaNS, serverCA, !w.withClient},
	} {
		if chk.skip {
			continue
		}
		name, key, _ := strings.Cut(chk.file, "/")
		got := secrets[chk.ns+"/"+name]
		if got == nil || key != "ca.crt" || string(got.Data[key]) != string(chk.want.Data["tls.crt"]) {
			t.Errorf("got %s from %s/%s, want ca.crt holding the certificate of %s/%s", chk.who, chk.ns, chk.file, chk.want.Namespace, chk.want.Name)
			continue
		}
		if len(got.Data["tls.key"]) > 0 {
			t.Errorf("Secret %s/%s: got a key beside the CA certificate %s reads", chk.ns, name, chk.who)
		}
	}
	// Neither CA's key leaves its namespace.
	for _, s := range secrets {
		for ca, home := range map[*corev1.Secret]string{serverCA: render.Namespace, clientCA: kedaNS} {
			if s.Namespace != home && len(s.Data["tls.key"]) > 0 && string(s.Data["tls.key"]) == string(ca.Data["tls.key"]) {
				t.Errorf("Secret %s/%s holds the key of CA %s/%s", s.Namespace, s.Name, ca.Namespace, ca.Name)
			}
		}
	}
}
