package manifests

import (
	"fmt"
	"maps"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	sigsyaml "sigs.k8s.io/yaml"

	"github.com/gpuscaler/gpuscaler/deploy/render"
)

// gatewayRoute is one route of the gateway's routes file, as `gpuscaler gateway
// --routes` reads it (the contract the chart renders to).
type gatewayRoute struct {
	Name       string `json:"name"`
	Host       string `json:"host,omitempty"`
	PathPrefix string `json:"pathPrefix,omitempty"`
	Service    struct {
		Name string `json:"name"`
		Port int32  `json:"port"`
	} `json:"service"`
	Queue       string `json:"queue"`
	HoldTimeout string `json:"holdTimeout"`
	Concurrency int    `json:"concurrency,omitempty"`
}

// gatewayRoutesFile is the routes file: the key routes.yaml of the gateway's ConfigMap.
type gatewayRoutesFile struct {
	Routes []gatewayRoute `json:"routes"`
}

// gatewayFlags are the flags of `gpuscaler gateway` the gateway's contract names
// (besides the NATS and log flags every command has): the chart may pass these and no
// others. TestGatewayFlagsExist holds them against the binary's --help once it has the
// command.
var gatewayFlags = []string{
	"routes", "listen", "http-addr", "namespace", "kubeconfig",
	"max-held", "max-held-bytes", "max-body-bytes", "max-header-bytes",
	"first-byte-timeout", "idle-timeout", "shutdown-grace", "report-interval", "producer-id",
	"nats-url", "nats-user", "nats-password", "nats-token", "nats-token-file", "nats-nkey-seed",
	"nats-creds", "nats-tls-ca", "nats-tls-cert", "nats-tls-key", "log-format", "log-level",
}

// gateway is what a rendering of the gateway's chart holds, found and checked to exist.
type gateway struct {
	dep    *appsv1.Deployment
	pod    corev1.PodSpec
	ctr    corev1.Container
	routes gatewayRoutesFile
}

// findGateway finds the gateway's Deployment (named after the release) and reads the
// routes file from the ConfigMap mounted where --routes points.
func findGateway(t *testing.T, c render.Case, objs []Object) gateway {
	t.Helper()
	dep, ok := find[*appsv1.Deployment](objs, c.ReleaseName())
	if !ok {
		t.Fatalf("got no Deployment %s", c.ReleaseName())
	}
	g := gateway{dep: dep, pod: dep.Spec.Template.Spec}
	if len(g.pod.Containers) != 1 {
		t.Fatalf("got %d containers, want the gateway alone", len(g.pod.Containers))
	}
	g.ctr = g.pod.Containers[0]
	file := flagValue(g.ctr.Args, "routes")
	vol := mountedVolume(g.ctr.VolumeMounts, file)
	var cmName string
	for _, v := range g.pod.Volumes {
		if v.Name == vol && v.ConfigMap != nil {
			cmName = v.ConfigMap.Name
		}
	}
	for _, m := range g.ctr.VolumeMounts {
		if m.Name == vol && m.SubPath != "" {
			t.Errorf("got the routes mounted with subPath %s, want the folder: the kubelet never updates a subPath mount, so the gateway would not see a change", m.SubPath)
		}
	}
	cm, ok := find[*corev1.ConfigMap](objs, cmName)
	if !ok {
		t.Fatalf("got --routes=%s on volume %q, want a ConfigMap of the release mounted there", file, vol)
	}
	data, ok := cm.Data[filepath.Base(file)]
	if !ok {
		t.Fatalf("got ConfigMap %s keys %v, want %s", cm.Name, slices.Sorted(maps.Keys(cm.Data)), filepath.Base(file))
	}
	if err := sigsyaml.UnmarshalStrict([]byte(data), &g.routes); err != nil {
		t.Fatalf("the routes file does not parse as the gateway's format: %v\n%s", err, data)
	}
	return g
}

// TestGatewayChart checks every rendering of the gateway's chart: what the gateway needs
// of its pod, and no more rights than it needs.
func TestGatewayChart(t *testing.T) {
	mainAudience, mainNATS, producers := mainChartNATS(t)
	for _, c := range render.GatewayCases {
		t.Run(c.Name, func(t *testing.T) {
			objs := caseObjects(t, c)
			vals, err := render.CaseValues(root(t), c)
			if err != nil {
				t.Fatal(err)
			}
			g := findGateway(t, c, objs)
			ns := c.ReleaseNamespace()

			if cmd, _ := splitCommand(g.ctr.Args); cmd != "gateway" {
				t.Errorf("got command %q, want gateway", cmd)
			}
			for _, o := range objs {
				if m, _ := metaOf(o); m.GetNamespace() != ns {
					t.Errorf("%s: got namespace %q, want %s: the gateway's chart installs into one namespace and nothing else", o.Source, m.GetNamespace(), ns)
				}
			}

			// The routes: what values gave, in the gateway's format.
			want := gatewayRoutesFile{Routes: []gatewayRoute{}}
			if rs, ok := vals["routes"]; ok {
				b, _ := sigsyaml.Marshal(map[string]any{"routes": rs})
				if err := sigsyaml.UnmarshalStrict(b, &want); err != nil {
					t.Fatal(err)
				}
			}
			if fmt.Sprint(g.routes) != fmt.Sprint(want) {
				t.Errorf("got routes %+v, want values' routes %+v", g.routes, want)
			}
			if _, ok := g.dep.Spec.Template.Annotations["checksum/routes"]; ok {
				t.Errorf("got a checksum of the routes on the pods, want none: the gateway reloads them, and a rollout would drop held requests")
			}

			// Replicas, rollout, disruption budget, spread.
			replicas := deref(g.dep.Spec.Replicas, 1)
			if wantReplicas, ok := vals["replicas"]; ok {
				if fmt.Sprint(replicas) != fmt.Sprint(wantReplicas) {
					t.Errorf("got %d replicas, want values' %v", replicas, wantReplicas)
				}
			} else if replicas != 2 {
				t.Errorf("got %d replicas by default, want 2", replicas)
			}
			if ru := g.dep.Spec.Strategy.RollingUpdate; ru == nil || ru.MaxUnavailable == nil || ru.MaxUnavailable.IntValue() != 0 {
				t.Errorf("got rolling update %v, want maxUnavailable 0: a new replica takes clients before an old one leaves", ru)
			}
			pdb, ok := find[*policyv1.PodDisruptionBudget](objs, c.ReleaseName())
			if !ok {
				t.Fatal("got no PodDisruptionBudget")
			}
			if sel, _ := metav1.LabelSelectorAsSelector(pdb.Spec.Selector); !sel.Matches(labels.Set(g.dep.Spec.Template.Labels)) {
				t.Errorf("got PDB selector %v, want it to select the gateway's pods", pdb.Spec.Selector)
			}
			if pdb.Spec.MinAvailable == nil || pdb.Spec.MinAvailable.IntValue() >= int(replicas) {
				t.Errorf("got PDB minAvailable %v with %d replicas, want fewer than the replicas (or drains block)", pdb.Spec.MinAvailable, replicas)
			}
			if len(g.pod.TopologySpreadConstraints) == 0 {
				t.Errorf("got no topologySpreadConstraints, want the replicas spread")
			}
			for _, tol := range g.pod.Tolerations {
				if tol.Key == "nvidia.com/gpu" || tol.Operator == corev1.TolerationOpExists && tol.Key == "" {
					t.Errorf("got toleration %v, want the gateway kept off GPU nodes' taints", tol)
				}
			}
			if c.Name == "gateway-default" {
				spread := g.pod.TopologySpreadConstraints[0]
				if spread.TopologyKey != "kubernetes.io/hostname" {
					t.Errorf("got spread over %s, want kubernetes.io/hostname", spread.TopologyKey)
				}
				if !avoidsGPUNodes(g.pod.Affinity) {
					t.Errorf("got affinity %v, want GPU nodes (nvidia.com/gpu.present=true) avoided", g.pod.Affinity)
				}
			}

			// Identity and RBAC: a Role on EndpointSlices of its namespace, read only.
			checkGatewayRBAC(t, c, objs, g.pod)
			env := map[string]string{}
			for _, e := range g.ctr.Env {
				if e.ValueFrom != nil && e.ValueFrom.FieldRef != nil {
					env[e.Name] = e.ValueFrom.FieldRef.FieldPath
				}
			}
			if env["POD_NAME"] != "metadata.name" || env["POD_NAMESPACE"] != "metadata.namespace" {
				t.Errorf("got downward API env %v, want POD_NAME=metadata.name (each replica's producer id) and POD_NAMESPACE=metadata.namespace", env)
			}

			// NATS: the main chart's NATS by default, with a token of the callout's audience.
			url := flagValue(g.ctr.Args, "nats-url")
			if nats, _ := vals["nats"].(map[string]any); nats == nil || nats["url"] == nil {
				if url != mainNATS {
					t.Errorf("got --nats-url=%s by default, want gpuscaler's chart's NATS Service %s", url, mainNATS)
				}
			}
			if file := flagValue(g.ctr.Args, "nats-token-file"); file != "" {
				token := projectedToken(g.pod, g.ctr, file)
				switch {
				case token == nil:
					t.Errorf("got --nats-token-file=%s, want a projected ServiceAccount token there", file)
				case token.Audience != mainAudience:
					t.Errorf("got token audience %q, want gpuscaler's auth callout's %q", token.Audience, mainAudience)
				case deref(token.ExpirationSeconds, 3600) < 600:
					t.Errorf("got expirationSeconds %d, want 600 at least", deref(token.ExpirationSeconds, 3600))
				}
				if id := ns + "/" + g.pod.ServiceAccountName; !identityAdmitted(producers, id) {
					t.Errorf("got ServiceAccount %s, which gpuscaler's chart's default --producer-identities=%s does not admit", id, producers)
				}
			} else if c.Name == "gateway-default" || c.Name == "gateway-example" {
				t.Errorf("got args %v, want --nats-token-file: the default NATS auth is the pod's ServiceAccount token", g.ctr.Args)
			}

			// Ports, probes and the Service.
			ports := map[string]int32{}
			for _, p := range g.ctr.Ports {
				ports[p.Name] = p.ContainerPort
			}
			if got, want := flagValue(g.ctr.Args, "listen"), fmt.Sprintf(":%d", ports["http"]); got != want {
				t.Errorf("got --listen=%s, want %s, the port named http", got, want)
			}
			if got, want := flagValue(g.ctr.Args, "http-addr"), fmt.Sprintf(":%d", ports["metrics"]); got != want {
				t.Errorf("got --http-addr=%s, want %s, the port named metrics", got, want)
			}
			for name, p := range map[string]*corev1.Probe{"/readyz": g.ctr.ReadinessProbe, "/healthz": g.ctr.LivenessProbe} {
				if p == nil || p.HTTPGet == nil || p.HTTPGet.Path != name || p.HTTPGet.Port.String() != "metrics" {
					t.Errorf("got probe %v, want GET %s on port metrics (--http-addr)", p, name)
				}
			}
			svc, ok := find[*corev1.Service](objs, c.ReleaseName())
			if !ok {
				t.Fatalf("got no Service %s", c.ReleaseName())
			}
			svcPorts := map[string]corev1.ServicePort{}
			for _, p := range svc.Spec.Ports {
				svcPorts[p.Name] = p
			}
			if p := svcPorts["http"]; p.TargetPort.String() != "http" || (c.Name == "gateway-default" && p.Port != 80) {
				t.Errorf("got Service port http %v, want port 80 by default to targetPort http", p)
			}
			if p := svcPorts["metrics"]; p.TargetPort.String() != "metrics" {
				t.Errorf("got Service port metrics %v, want targetPort metrics", p)
			}
			if svc.Spec.ClusterIP == corev1.ClusterIPNone {
				t.Errorf("got a headless Service, want one virtual IP that spreads clients over the ready replicas")
			}

			// Stopping: the pod's grace covers the preStop sleep and the gateway's own.
			grace, err := time.ParseDuration(flagValue(g.ctr.Args, "shutdown-grace"))
			if err != nil {
				t.Fatalf("got --shutdown-grace=%q: %v", flagValue(g.ctr.Args, "shutdown-grace"), err)
			}
			var sleep int64
			if l := g.ctr.Lifecycle; l != nil && l.PreStop != nil && l.PreStop.Sleep != nil {
				sleep = l.PreStop.Sleep.Seconds
			}
			if tgp := deref(g.pod.TerminationGracePeriodSeconds, 30); time.Duration(tgp)*time.Second <= grace+time.Duration(sleep)*time.Second {
				t.Errorf("got terminationGracePeriodSeconds %d, want above --shutdown-grace %s plus the preStop sleep %ds: the kubelet kills the gateway at the end of it", tgp, grace, sleep)
			}

			// The hardening of gpuscaler's scaler (TestPodHardening checks every pod too).
			ps, sc := g.pod.SecurityContext, g.ctr.SecurityContext
			if ps == nil || !deref(ps.RunAsNonRoot, false) || ps.SeccompProfile == nil || ps.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
				t.Errorf("got pod securityContext %v, want non-root and RuntimeDefault seccomp", ps)
			}
			if sc == nil || !deref(sc.ReadOnlyRootFilesystem, false) || deref(sc.AllowPrivilegeEscalation, true) ||
				sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(sc.Capabilities.Add) > 0 {
				t.Errorf("got container securityContext %v, want a read-only root, no privilege escalation, every capability dropped", sc)
			}
		})
	}
}

// checkGatewayRBAC: the gateway's ServiceAccount is bound to one Role of its namespace
// that reads EndpointSlices and nothing else; the release makes no cluster-wide object.
func checkGatewayRBAC(t *testing.T, c render.Case, objs []Object, pod corev1.PodSpec) {
	t.Helper()
	ns := c.ReleaseNamespace()
	if n := len(all[*rbacv1.ClusterRole](objs)) + len(all[*rbacv1.ClusterRoleBinding](objs)); n > 0 {
		t.Errorf("got %d ClusterRoles and ClusterRoleBindings, want none: the gateway reads its own namespace only", n)
	}
	sa, ok := find[*corev1.ServiceAccount](objs, pod.ServiceAccountName)
	if !ok {
		t.Fatalf("got serviceAccountName %q, not rendered", pod.ServiceAccountName)
	}
	if deref(sa.AutomountServiceAccountToken, true) {
		t.Errorf("got ServiceAccount %s mounting its API token in every pod, want only the gateway's pods to ask for it", sa.Name)
	}
	if !deref(pod.AutomountServiceAccountToken, false) {
		t.Errorf("got no API token in the gateway's pods, want one: it watches EndpointSlices")
	}
	roles := all[*rbacv1.Role](objs)
	if len(roles) != 1 {
		t.Fatalf("got %d Roles, want one", len(roles))
	}
	wantRules := []rbacv1.PolicyRule{{APIGroups: []string{"discovery.k8s.io"}, Resources: []string{"endpointslices"}, Verbs: []string{"get", "list", "watch"}}}
	if fmt.Sprint(roles[0].Rules) != fmt.Sprint(wantRules) {
		t.Errorf("got Role rules %v, want exactly %v", roles[0].Rules, wantRules)
	}
	bindings := all[*rbacv1.RoleBinding](objs)
	want := rbacv1.Subject{Kind: "ServiceAccount", Name: sa.Name, Namespace: ns}
	if len(bindings) != 1 || bindings[0].RoleRef != (rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: roles[0].Name}) ||
		!slices.Equal(bindings[0].Subjects, []rbacv1.Subject{want}) {
		t.Errorf("got RoleBindings %v, want one binding Role %s to %v alone", bindings, roles[0].Name, want)
	}
}

// metaOf returns an object's metadata.
func metaOf(o Object) (metav1.Object, error) {
	m, ok := o.Obj.(metav1.Object)
	if !ok {
		return nil, fmt.Errorf("%s: no metadata", o.Source)
	}
	return m, nil
}

// projectedToken returns the projected ServiceAccount token a container reads at file,
// or nil.
func projectedToken(pod corev1.PodSpec, ctr corev1.Container, file string) *corev1.ServiceAccountTokenProjection {
	vol := mountedVolume(ctr.VolumeMounts, file)
	for _, v := range pod.Volumes {
		if v.Name == vol && v.Projected != nil && len(v.Projected.Sources) == 1 {
			if tok := v.Projected.Sources[0].ServiceAccountToken; tok != nil && strings.HasSuffix(file, "/"+tok.Path) {
				return tok
			}
		}
	}
	return nil
}

// avoidsGPUNodes says an affinity prefers (or requires) nodes whose
// nvidia.com/gpu.present is not "true".
func avoidsGPUNodes(a *corev1.Affinity) bool {
	if a == nil || a.NodeAffinity == nil {
		return false
	}
	gpu := labels.Set{"nvidia.com/gpu.present": "true"}
	for _, p := range a.NodeAffinity.PreferredDuringSchedulingIgnoredDuringExecution {
		for _, e := range p.Preference.MatchExpressions {
			if e.Key == "nvidia.com/gpu.present" && e.Operator == corev1.NodeSelectorOpNotIn && slices.Contains(e.Values, gpu["nvidia.com/gpu.present"]) && p.Weight > 0 {
				return true
			}
		}
	}
	return false
}

// mainChartNATS returns, from gpuscaler's chart with its default values, the audience
// its auth callout admits, the URL of its NATS client Service and the callout's
// --producer-identities.
func mainChartNATS(t *testing.T) (audience, url, producers string) {
	t.Helper()
	def := namedCase(t, "default")
	objs := caseObjects(t, def)
	callout, ok := find[*appsv1.Deployment](objs, render.Release+"-auth-callout")
	if !ok {
		t.Fatal("got no auth callout in gpuscaler's chart's defaults")
	}
	audience = flagValue(callout.Spec.Template.Spec.Containers[0].Args, "audience")
	producers = flagValue(callout.Spec.Template.Spec.Containers[0].Args, "producer-identities")
	svc, ok := find[*corev1.Service](objs, render.Release+"-nats")
	if !ok {
		t.Fatal("got no NATS Service in gpuscaler's chart's defaults")
	}
	var port int32
	for _, p := range svc.Spec.Ports {
		if p.Name == "nats" {
			port = p.Port
		}
	}
	return audience, "nats://" + svc.Name + "." + svc.Namespace + ".svc.cluster.local:" + strconv.Itoa(int(port)), producers
}

// identityAdmitted says whether namespace/name matches one of the auth callout's
// comma-separated namespace/serviceaccount patterns, "*" matching a whole part
// (deploy/README.md, "Producers in the cluster").
func identityAdmitted(patterns, id string) bool {
	ns, name, _ := strings.Cut(id, "/")
	for p := range strings.SplitSeq(patterns, ",") {
		pns, pname, _ := strings.Cut(p, "/")
		if (pns == "*" || pns == ns) && (pname == "*" || pname == name) {
			return true
		}
	}
	return false
}

// TestGatewayValuesRejected: values the gateway's chart cannot honour fail at render
// time, by its schema or its checks, naming what is wrong.
func TestGatewayValuesRejected(t *testing.T) {
	chart := filepath.Join(root(t), render.GatewayChartDir)
	route := func(edit func(map[string]any)) map[string]any {
		r := map[string]any{"name": "llm", "service": map[string]any{"name": "llm-server", "port": 8000},
			"queue": "llm-requests", "holdTimeout": "5m"}
		edit(r)
		return map[string]any{"routes": []any{r}}
	}
	cases := map[string]struct {
		values map[string]any
		want   string
	}{
		"misspelt key":                  {values: map[string]any{"replica": 3}, want: "replica"},
		"negative replicas":             {values: map[string]any{"replicas": -1}, want: "replicas"},
		"no replica":                    {values: map[string]any{"replicas": 0}, want: "replicas"},
		"a route without a queue":       {values: route(func(r map[string]any) { delete(r, "queue") }), want: "queue"},
		"a route without a Service":     {values: route(func(r map[string]any) { delete(r, "service") }), want: "service"},
		"a route without a name":        {values: route(func(r map[string]any) { delete(r, "name") }), want: "name"},
		"a route without holdTimeout":   {values: route(func(r map[string]any) { delete(r, "holdTimeout") }), want: "holdTimeout"},
		"a queue of two subject tokens": {values: route(func(r map[string]any) { r["queue"] = "llm.requests" }), want: "queue"},
		"a queue with a wildcard":       {values: route(func(r map[string]any) { r["queue"] = "llm-*" }), want: "queue"},
		"a Service port out of range":   {values: route(func(r map[string]any) { r["service"] = map[string]any{"name": "s", "port": 70000} }), want: "port"},
		"a Service port by name":        {values: route(func(r map[string]any) { r["service"] = map[string]any{"name": "s", "port": "http"} }), want: "port"},
		"a path without its slash":      {values: route(func(r map[string]any) { r["pathPrefix"] = "v1" }), want: "pathPrefix"},
		"a host with a scheme":          {values: route(func(r map[string]any) { r["host"] = "https://llm.example.com" }), want: "host"},
		"a wildcard inside a host":      {values: route(func(r map[string]any) { r["host"] = "llm.*.example.com" }), want: "host"},
		"holdTimeout without a unit":    {values: route(func(r map[string]any) { r["holdTimeout"] = "300" }), want: "holdTimeout"},
		"no concurrency":                {values: route(func(r map[string]any) { r["concurrency"] = 0 }), want: "concurrency"},
		"an unknown route field":        {values: route(func(r map[string]any) { r["timeout"] = "5m" }), want: "timeout"},
		"two routes of one name": {
			values: map[string]any{"routes": []any{
				map[string]any{"name": "llm", "service": map[string]any{"name": "a", "port": 80}, "queue": "a", "holdTimeout": "1m"},
				map[string]any{"name": "llm", "service": map[string]any{"name": "b", "port": 80}, "queue": "b", "holdTimeout": "1m"},
			}},
			want: `two routes are named "llm"`,
		},
		"a disruption budget that blocks drains": {values: map[string]any{"replicas": 1}, want: "podDisruptionBudget.minAvailable 1 with replicas 1"},
		"shutdownGrace in fractions":             {values: map[string]any{"shutdownGrace": "1.5s"}, want: "shutdownGrace"},
		"shutdownGrace without a unit":           {values: map[string]any{"shutdownGrace": "30"}, want: "shutdownGrace"},
		"a negative preStop sleep":               {values: map[string]any{"preStopSleepSeconds": -1}, want: "preStopSleepSeconds"},
		"token auth without its Secret": {
			values: map[string]any{"nats": map[string]any{"auth": map[string]any{"type": "token", "insecureAllowPasswordsWithoutTLS": true}}},
			want:   "nats.auth.secretName is required with nats.auth.type token",
		},
		"an unknown auth type": {values: map[string]any{"nats": map[string]any{"auth": map[string]any{"type": "serviceAccount"}}}, want: "type"},
		"NATS TLS without its CA": {
			values: map[string]any{"nats": map[string]any{"tls": map[string]any{"enabled": true}}},
			want:   "nats.tls.secretName is required",
		},
		"a NATS URL of another scheme": {values: map[string]any{"nats": map[string]any{"url": "http://nats:4222"}}, want: "url"},
		"tokens shorter-lived than Kubernetes allows": {
			values: map[string]any{"nats": map[string]any{"auth": map[string]any{"kubernetes": map[string]any{"tokenExpirationSeconds": 60}}}},
			want:   "tokenExpirationSeconds",
		},
	}
	for _, name := range slices.Sorted(maps.Keys(cases)) {
		tc := cases[name]
		t.Run(name, func(t *testing.T) {
			_, err := render.RenderWith(chart, tc.values, render.Options{Release: "llm-gateway", Namespace: "inference"})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got error %v, want one mentioning %q", err, tc.want)
			}
		})
	}
}

// TestGatewayValuesAccepted: what the routes format allows renders, so the schema is
// not stricter than the gateway.
func TestGatewayValuesAccepted(t *testing.T) {
	chart := filepath.Join(root(t), render.GatewayChartDir)
	cases := map[string]map[string]any{
		"an exact host":                 {"host": "llm.example.com"},
		"a wildcard host":               {"host": "*.example.com"},
		"a path prefix":                 {"pathPrefix": "/v1/chat/completions"},
		"the root path":                 {"pathPrefix": "/"},
		"a queue with an underscore":    {"queue": "llm_requests"},
		"a queue of capitals and :":     {"queue": "LLM:requests"},
		"a concurrency":                 {"concurrency": 4},
		"a hold timeout of hours":       {"holdTimeout": "1h30m"},
		"a hold timeout of fractions":   {"holdTimeout": "1.5s"},
		"a Service port of 1":           {"service": map[string]any{"name": "s", "port": 1}},
		"a Service name with a number":  {"service": map[string]any{"name": "llm-2", "port": 80}},
		"a route name that is a number": {"name": "1"},
	}
	for _, name := range slices.Sorted(maps.Keys(cases)) {
		t.Run(name, func(t *testing.T) {
			r := map[string]any{"name": "llm", "service": map[string]any{"name": "llm-server", "port": 8000},
				"queue": "llm-requests", "holdTimeout": "5m"}
			maps.Copy(r, cases[name])
			if _, err := render.RenderWith(chart, map[string]any{"routes": []any{r}}, render.Options{Release: "llm-gateway", Namespace: "inference"}); err != nil {
				t.Errorf("got %v, want it rendered", err)
			}
		})
	}
}

// TestGatewayShutdownGraceSeconds: the template's reading of shutdownGrace (whole hours,
// minutes and seconds) agrees with Go's time.ParseDuration, which the gateway uses.
func TestGatewayShutdownGraceSeconds(t *testing.T) {
	chart := filepath.Join(root(t), render.GatewayChartDir)
	for _, grace := range []string{"0s", "45s", "2m", "1m30s", "1h", "1h2m3s", "90s"} {
		t.Run(grace, func(t *testing.T) {
			out, err := render.RenderWith(chart, map[string]any{"shutdownGrace": grace, "preStopSleepSeconds": 0}, render.Options{Release: "llm-gateway", Namespace: "inference"})
			if err != nil {
				t.Fatal(err)
			}
			objs, err := DecodeAll(grace, []byte(out))
			if err != nil {
				t.Fatal(err)
			}
			dep, _ := find[*appsv1.Deployment](objs, "llm-gateway")
			d, _ := time.ParseDuration(grace)
			if got, want := deref(dep.Spec.Template.Spec.TerminationGracePeriodSeconds, 0), int64(d/time.Second)+10; got != want {
				t.Errorf("got terminationGracePeriodSeconds %d, want %d (%s plus 10 s)", got, want, grace)
			}
		})
	}
}

// TestGatewayFlagsExist: the chart passes the gateway only flags of its contract, each
// with a value; once the binary has `gpuscaler gateway`, every flag of the contract must
// be in its --help, so that a rename fails here rather than in a cluster.
func TestGatewayFlagsExist(t *testing.T) {
	for _, c := range render.GatewayCases {
		objs := caseObjects(t, c)
		g := findGateway(t, c, objs)
		_, args := splitCommand(g.ctr.Args)
		for _, a := range args {
			name, value, ok := strings.Cut(strings.TrimPrefix(a, "--"), "=")
			if !strings.HasPrefix(a, "--") || !ok || value == "" {
				t.Errorf("%s: got argument %q, want --flag=value", c.Name, a)
			}
			if !slices.Contains(gatewayFlags, name) {
				t.Errorf("%s: got %s, not a flag of gpuscaler gateway's contract %v", c.Name, a, gatewayFlags)
			}
		}
		for _, e := range g.ctr.Env {
			if name, ok := strings.CutPrefix(e.Name, "GPUSCALER_"); ok && !slices.Contains(gatewayFlags, strings.ToLower(strings.ReplaceAll(name, "_", "-"))) {
				t.Errorf("%s: got env %s, which no flag of the contract reads", c.Name, e.Name)
			}
		}
	}
	if _, err := runHelp(t, "gateway"); err != nil {
		t.Logf("the binary has no gateway command yet (%v): checked against the contract only", err)
		return
	}
	flags, _ := commandFlags(t, "gateway")
	for _, f := range gatewayFlags {
		if _, ok := flags[f]; !ok {
			t.Errorf("got gpuscaler gateway --help without --%s, which the chart may pass", f)
		}
	}
}

// runHelp runs `gpuscaler <command> --help` and returns what it printed, or an error
// when the binary has no such command.
func runHelp(t *testing.T, command string) (string, error) {
	t.Helper()
	cmd := exec.Command(gpuscalerBinary(t), append(strings.Fields(command), "--help")...)
	cmd.Env = cleanEnv()
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("gpuscaler %s --help: %w: %s", command, err, firstLine(string(out)))
	}
	return string(out), nil
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(strings.TrimSpace(s), "\n")
	return line
}

// TestGatewayNotes: what helm install prints names the image, where clients connect and
// each route's queue, or says that there is no route yet.
func TestGatewayNotes(t *testing.T) {
	chrt, err := loader.Load(filepath.Join(root(t), render.GatewayChartDir))
	if err != nil {
		t.Fatal(err)
	}
	example, err := chartutil.ReadValuesFile(filepath.Join(root(t), "examples/inference-scale-to-zero/gateway-values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for name, tc := range map[string]struct {
		vals map[string]any
		want []string
	}{
		"defaults": {want: []string{"gpuscaler:0.1.0", "http://llm-gateway.inference.svc", "no routes yet", "inference/llm-gateway, audience gpuscaler-nats"}},
		"example": {vals: example, want: []string{"http://llm-gateway.inference.svc", "llm: any host/v1 -> Service llm-server:8000, queue llm-requests, held up to 5m",
			"queue: <the route's queue>", "nats://gpuscaler-nats.gpuscaler.svc.cluster.local:4222"}},
	} {
		t.Run(name, func(t *testing.T) {
			top, err := chartutil.ToRenderValues(chrt, tc.vals, chartutil.ReleaseOptions{Name: "llm-gateway", Namespace: "inference", Revision: 1, IsInstall: true}, chartutil.DefaultCapabilities)
			if err != nil {
				t.Fatal(err)
			}
			files, err := engine.Render(chrt, top)
			if err != nil {
				t.Fatal(err)
			}
			notes := files["gpuscaler-gateway/templates/NOTES.txt"]
			for _, want := range tc.want {
				if !strings.Contains(notes, want) {
					t.Errorf("NOTES.txt does not say %q:\n%s", want, notes)
				}
			}
		})
	}
}

// TestGatewayNATSSecrets: a shared NATS identity comes from the Secret named, as
// environment (token, user and password stay out of the process list) or a mounted file
// (nkey, creds), and with it no ServiceAccount token is projected.
func TestGatewayNATSSecrets(t *testing.T) {
	chart := filepath.Join(root(t), render.GatewayChartDir)
	for authType, want := range map[string][]string{
		"token":        {"env GPUSCALER_NATS_TOKEN=nats-id/token"},
		"userPassword": {"env GPUSCALER_NATS_USER=nats-id/user", "env GPUSCALER_NATS_PASSWORD=nats-id/password"},
		"nkey":         {"--nats-nkey-seed=nats-id/nkey"},
		"creds":        {"--nats-creds=nats-id/creds"},
		"none":         nil,
	} {
		t.Run(authType, func(t *testing.T) {
			vals := map[string]any{"nats": map[string]any{"auth": map[string]any{"type": authType, "secretName": "nats-id"},
				"tls": map[string]any{"enabled": true, "secretName": "nats-ca"}}}
			out, err := render.RenderWith(chart, vals, render.Options{Release: "llm-gateway", Namespace: "inference"})
			if err != nil {
				t.Fatal(err)
			}
			objs, err := DecodeAll(authType, []byte(out))
			if err != nil {
				t.Fatal(err)
			}
			dep, _ := find[*appsv1.Deployment](objs, "llm-gateway")
			pod := dep.Spec.Template.Spec
			ctr := pod.Containers[0]
			var got []string
			for _, e := range ctr.Env {
				if r := e.ValueFrom; r != nil && r.SecretKeyRef != nil {
					got = append(got, "env "+e.Name+"="+r.SecretKeyRef.Name+"/"+r.SecretKeyRef.Key)
				}
			}
			for _, flag := range []string{"nats-nkey-seed", "nats-creds"} {
				if file := flagValue(ctr.Args, flag); file != "" {
					got = append(got, "--"+flag+"="+secretFile(t, pod, ctr, file))
				}
			}
			if !slices.Equal(got, want) {
				t.Errorf("got NATS credentials %v, want %v", got, want)
			}
			if file := flagValue(ctr.Args, "nats-token-file"); file != "" {
				t.Errorf("got --nats-token-file=%s with auth %s, want none", file, authType)
			}
			for _, v := range pod.Volumes {
				if v.Projected != nil {
					t.Errorf("got projected volume %s with auth %s, want no token for NATS", v.Name, authType)
				}
			}
		})
	}
}
