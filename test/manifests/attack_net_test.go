package manifests

import (
	"fmt"
	"maps"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nkeys"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"

	"github.com/gpuscaler/gpuscaler/deploy/render"
	"github.com/gpuscaler/gpuscaler/test/testkit"
)

// The attacks of issue 28 that the chart's defaults close (items 4 and 7); the route
// attack runs for real in test/e2e (TestAttackRoute).

// renderObjects renders the chart with values over its defaults, and decodes it.
func renderObjects(t *testing.T, values map[string]any) []Object {
	t.Helper()
	out, err := render.Render(filepath.Join(root(t), render.ChartDir), values)
	if err != nil {
		t.Fatal(err)
	}
	objs, err := DecodeAll("rendering", []byte(out))
	if err != nil {
		t.Fatal(err)
	}
	return objs
}

// TestAttackNATSReadsIssuerSeed: the seed the callout signs NATS users with makes any
// user of any account; the NATS pods need only its public key. No container of the NATS
// StatefulSet (init containers included) may mount or read the Secret key that holds it.
func TestAttackNATSReadsIssuerSeed(t *testing.T) {
	for _, c := range render.Cases {
		t.Run(c.Name, func(t *testing.T) {
			objs := caseObjects(t, c)
			sts, ok := find[*appsv1.StatefulSet](objs, render.Release+"-nats")
			if !ok || !kubernetesAuth(objs) {
				t.Skip("no bundled NATS with the auth callout in this case")
			}
			callout, _ := find[*appsv1.Deployment](objs, render.Release+"-auth-callout")
			seed := secretFile(t, callout.Spec.Template.Spec, callout.Spec.Template.Spec.Containers[0],
				flagValue(callout.Spec.Template.Spec.Containers[0].Args, "issuer-seed-file"))
			secret, key, _ := strings.Cut(seed, "/")
			if secret == "" || key == "" {
				t.Fatalf("got the callout's seed from %q, want a Secret key", seed)
			}
			pod := sts.Spec.Template.Spec
			for _, v := range pod.Volumes {
				if v.Secret == nil || v.Secret.SecretName != secret {
					continue
				}
				items := len(v.Secret.Items) == 0
				for _, it := range v.Secret.Items {
					items = items || it.Key == key
				}
				if items {
					t.Errorf("got volume %s with key %s of Secret %s (the issuer seed) in the NATS pods, want none", v.Name, key, secret)
				}
			}
			for _, ctr := range slices.Concat(pod.InitContainers, pod.Containers) {
				for _, e := range ctr.Env {
					if r := e.ValueFrom; r != nil && r.SecretKeyRef != nil && r.SecretKeyRef.Name == secret && r.SecretKeyRef.Key == key {
						t.Errorf("container %s: got $%s from the issuer seed, want nothing of it", ctr.Name, e.Name)
					}
				}
				for _, e := range ctr.EnvFrom {
					if e.SecretRef != nil && e.SecretRef.Name == secret {
						t.Errorf("container %s: got every key of Secret %s, the issuer seed's, in its environment", ctr.Name, secret)
					}
				}
			}
		})
	}
}

// schedulable says whether a pod could be placed on a node with nodeLabels, by its
// nodeSelector and required node affinity (k8s.io/api/core/v1 NodeSelector: the terms
// are ORed, a term's expressions ANDed; NotIn and DoesNotExist match a node without the
// key).
func schedulable(t *testing.T, pod corev1.PodSpec, nodeLabels map[string]string) bool {
	t.Helper()
	if !labels.SelectorFromSet(pod.NodeSelector).Matches(labels.Set(nodeLabels)) {
		return false
	}
	if pod.Affinity == nil || pod.Affinity.NodeAffinity == nil || pod.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution == nil {
		return true
	}
	ops := map[corev1.NodeSelectorOperator]selection.Operator{
		corev1.NodeSelectorOpIn: selection.In, corev1.NodeSelectorOpNotIn: selection.NotIn,
		corev1.NodeSelectorOpExists: selection.Exists, corev1.NodeSelectorOpDoesNotExist: selection.DoesNotExist,
	}
	for _, term := range pod.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms {
		sel := labels.NewSelector()
		for _, e := range term.MatchExpressions {
			op, ok := ops[e.Operator]
			if !ok {
				t.Fatalf("node selector operator %s: not one this test reads", e.Operator)
			}
			req, err := labels.NewRequirement(e.Key, op, e.Values)
			if err != nil {
				t.Fatal(err)
			}
			sel = sel.Add(*req)
		}
		if sel.Matches(labels.Set(nodeLabels)) {
			return true
		}
	}
	return false
}

// gpuNode and plainNode are a GPU node as NVIDIA's GPU feature discovery labels it,
// and a node without a GPU.
var (
	gpuNode   = map[string]string{"kubernetes.io/hostname": "gpu-1", "nvidia.com/gpu.present": "true"}
	plainNode = map[string]string{"kubernetes.io/hostname": "cpu-1"}
)

// TestAttackControlPlaneOnGPUNodes: the scaler, the callout and NATS hold every
// namespace's data and the bus's keys; on a GPU node they share the node with tenants'
// workloads (and whatever escapes them). By default none of them can be placed on a GPU
// node, and each can on a node without one; the collector still runs on GPU nodes.
func TestAttackControlPlaneOnGPUNodes(t *testing.T) {
	for _, c := range render.Cases {
		t.Run(c.Name, func(t *testing.T) {
			for _, w := range workloads(caseObjects(t, c)) {
				pod := w.pod.Spec
				collector := w.kind == "DaemonSet"
				// A GPU node with whatever labels the pod's nodeSelector asks for (the
				// collector's pool, say).
				node := maps.Clone(gpuNode)
				maps.Copy(node, pod.NodeSelector)
				if got := schedulable(t, pod, node); got != collector {
					t.Errorf("%s %s: got placeable on a GPU node %v, want %v", w.kind, w.name, got, collector)
				}
				if !collector && !schedulable(t, pod, plainNode) {
					t.Errorf("%s %s: got no place on a node without GPUs", w.kind, w.name)
				}
			}
		})
	}
	// The label is the user's to name, or to drop; a component's own node affinity
	// replaces the rule.
	t.Run("overrides", func(t *testing.T) {
		objs := renderObjects(t, map[string]any{"avoidGPUNodes": map[string]any{"key": "pool", "values": []any{"gpu", "gpu-large"}}})
		scaler, _ := find[*appsv1.Deployment](objs, render.Release)
		if schedulable(t, scaler.Spec.Template.Spec, map[string]string{"pool": "gpu-large"}) || !schedulable(t, scaler.Spec.Template.Spec, gpuNode) {
			t.Errorf("avoidGPUNodes pool in [gpu, gpu-large]: got affinity %+v, want pool=gpu-large refused and other nodes allowed", scaler.Spec.Template.Spec.Affinity)
		}
		objs = renderObjects(t, map[string]any{"avoidGPUNodes": map[string]any{"key": ""}})
		for _, w := range workloads(objs) {
			if w.kind != "DaemonSet" && !schedulable(t, w.pod.Spec, gpuNode) {
				t.Errorf("avoidGPUNodes key \"\": got %s %s kept off GPU nodes, want it anywhere", w.kind, w.name)
			}
		}
		own := map[string]any{"nodeAffinity": map[string]any{"requiredDuringSchedulingIgnoredDuringExecution": map[string]any{
			"nodeSelectorTerms": []any{map[string]any{"matchExpressions": []any{map[string]any{"key": "role", "operator": "In", "values": []any{"control"}}}}}}},
			"podAntiAffinity": map[string]any{}}
		objs = renderObjects(t, map[string]any{"nats": map[string]any{"affinity": own}})
		nats, _ := find[*appsv1.StatefulSet](objs, render.Release+"-nats")
		if !schedulable(t, nats.Spec.Template.Spec, map[string]string{"role": "control", "nvidia.com/gpu.present": "true"}) || schedulable(t, nats.Spec.Template.Spec, plainNode) {
			t.Errorf("nats.affinity with its own nodeAffinity: got %+v, want exactly that rule", nats.Spec.Template.Spec.Affinity)
		}
	})
}

// TestAttackPasswordsWithoutTLS: a token, a user's password or a static user's password
// sent to NATS without TLS is read by whoever sees the traffic, who then logs in as
// that user. The chart refuses to render them without nats.tls.enabled unless the
// loudly named opt-out says so.
func TestAttackPasswordsWithoutTLS(t *testing.T) {
	chart := filepath.Join(root(t), render.ChartDir)
	tls := map[string]any{"enabled": true, "secretName": "client-tls", "serverSecretName": "server-tls"}
	for name, auth := range map[string]map[string]any{
		"token":        {"type": "token", "secretName": "s"},
		"userPassword": {"type": "userPassword", "secretName": "s"},
		"static users": {"kubernetes": map[string]any{"staticUsersSecretName": "users"}},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := render.Render(chart, map[string]any{"nats": map[string]any{"auth": auth}})
			if err == nil || !strings.Contains(err.Error(), "in the clear") || !strings.Contains(err.Error(), "nats.auth.insecureAllowPasswordsWithoutTLS") {
				t.Errorf("without TLS: got %v, want a refusal naming nats.tls.enabled and the opt-out", err)
			}
			if _, err := render.Render(chart, map[string]any{"nats": map[string]any{"auth": auth, "tls": tls}}); err != nil {
				t.Errorf("with TLS: got %v, want it rendered", err)
			}
			optOut := map[string]any{"insecureAllowPasswordsWithoutTLS": true}
			for k, v := range auth {
				optOut[k] = v
			}
			if _, err := render.Render(chart, map[string]any{"nats": map[string]any{"auth": optOut}}); err != nil {
				t.Errorf("with the opt-out: got %v, want it rendered", err)
			}
		})
	}
	// Credentials that never cross the network as a password need no opt-out.
	if _, err := render.Render(chart, nil); err != nil {
		t.Errorf("the defaults (ServiceAccount tokens through the callout): got %v", err)
	}
	// Nor does the gateway's chart send one in the clear.
	gateway := filepath.Join(root(t), render.GatewayChartDir)
	opts := render.Options{Release: "llm-gateway", Namespace: "inference"}
	for _, typ := range []string{"token", "userPassword"} {
		t.Run("gateway "+typ, func(t *testing.T) {
			auth := map[string]any{"type": typ, "secretName": "s"}
			_, err := render.RenderWith(gateway, map[string]any{"nats": map[string]any{"auth": auth}}, opts)
			if err == nil || !strings.Contains(err.Error(), "in the clear") {
				t.Errorf("without TLS: got %v, want a refusal", err)
			}
			tls := map[string]any{"enabled": true, "secretName": "nats-ca"}
			if _, err := render.RenderWith(gateway, map[string]any{"nats": map[string]any{"auth": auth, "tls": tls}}, opts); err != nil {
				t.Errorf("with TLS: got %v, want it rendered", err)
			}
			auth["insecureAllowPasswordsWithoutTLS"] = true
			if _, err := render.RenderWith(gateway, map[string]any{"nats": map[string]any{"auth": auth}}, opts); err != nil {
				t.Errorf("with the opt-out: got %v, want it rendered", err)
			}
		})
	}
}

// TestAttackNATSMonitoring: NATS's monitoring port lists every client (/connz: names,
// addresses, subscriptions) and every stream and consumer (/jsz). No pod reaches it by
// default, whatever networkPolicy.metricsFrom; whom metricsFrom and natsMonitoringFrom
// name do (KEDA's operator, for its own nats-jetstream scaler).
func TestAttackNATSMonitoring(t *testing.T) {
	operator, _ := kedaPodLabels(t)
	tenant := peer{"inference", map[string]string{"app": "llm-gateway"}}
	monitoring := peer{"monitoring", map[string]string{"app.kubernetes.io/name": "prometheus"}}
	keda := peer{"keda", operator}
	check := func(t *testing.T, objs []Object, want map[string]bool) {
		t.Helper()
		nats, ok := find[*appsv1.StatefulSet](objs, render.Release+"-nats")
		if !ok {
			t.Fatal("no bundled NATS")
		}
		policies := all[*networkingv1.NetworkPolicy](objs)
		for who, p := range map[string]peer{"a tenant": tenant, "Prometheus": monitoring, "KEDA's operator": keda,
			"another pod of the release's namespace": {render.Namespace, map[string]string{"app": "debug"}}} {
			if got := admits(t, policies, nats.Spec.Template.Labels, p, 8222); got != want[who] {
				t.Errorf("%s to NATS's monitoring: got admitted %v, want %v", who, got, want[who])
			}
		}
	}
	for _, c := range render.Cases {
		t.Run(c.Name, func(t *testing.T) {
			objs := caseObjects(t, c)
			if _, ok := find[*appsv1.StatefulSet](objs, render.Release+"-nats"); !ok {
				t.Skip("no bundled NATS")
			}
			check(t, objs, map[string]bool{"Prometheus": c.Name == "cert-manager"})
		})
	}
	t.Run("natsMonitoringFrom", func(t *testing.T) {
		objs := renderObjects(t, map[string]any{"networkPolicy": map[string]any{"natsMonitoringFrom": []any{map[string]any{
			"namespaceSelector": map[string]any{"matchLabels": map[string]any{"kubernetes.io/metadata.name": "keda"}},
			"podSelector":       map[string]any{"matchLabels": map[string]any{"app": "keda-operator"}}}}}})
		check(t, objs, map[string]bool{"KEDA's operator": true})
	})
}

// TestAttackCollectorPort: the collector's HTTP port (its /metrics names the pods on
// each GPU) admits whom networkPolicy.metricsFrom names and nobody else; no other port
// of the collector admits anyone.
func TestAttackCollectorPort(t *testing.T) {
	tenant := peer{"inference", map[string]string{"app": "llm-gateway"}}
	monitoring := peer{"monitoring", map[string]string{"app.kubernetes.io/name": "prometheus"}}
	for _, c := range render.Cases {
		t.Run(c.Name, func(t *testing.T) {
			objs := caseObjects(t, c)
			ds, ok := find[*appsv1.DaemonSet](objs, "")
			if !ok {
				t.Skip("no collector")
			}
			policies := all[*networkingv1.NetworkPolicy](objs)
			scaler, _ := find[*appsv1.Deployment](objs, render.Release)
			metricsOpen := admits(t, policies, scaler.Spec.Template.Labels, tenant, scaler.Spec.Template.Spec.Containers[0].Ports[1].ContainerPort)
			pod := ds.Spec.Template.Labels
			port := ds.Spec.Template.Spec.Containers[0].Ports[0].ContainerPort
			for _, ck := range []reach{
				{"Prometheus to the collector's /metrics", pod, monitoring, port, true},
				{"a tenant to the collector's /metrics", pod, tenant, port, metricsOpen},
				{"a tenant to another port of the collector", pod, tenant, 4222, false},
			} {
				if got := admits(t, policies, ck.pod, ck.from, ck.port); got != ck.want {
					t.Errorf("%s (port %d): got admitted %v, want %v", ck.what, ck.port, got, ck.want)
				}
			}
			if c.Name == "cert-manager" && metricsOpen {
				t.Errorf("got /metrics open to a tenant with metricsFrom set")
			}
		})
	}
}

// TestAttackRouteTLS: with route TLS (the cert-manager case names nats.cluster.tlsSecretName),
// the rendered cluster forms over TLS with certificates of the routes' CA, and a server
// that has the route password but a certificate of another CA is refused: each server
// verifies the other's certificate, both ways. (test/e2e TestAttackRoute runs the
// password alone against real nats-server processes.)
func TestAttackRouteTLS(t *testing.T) {
	c := namedCase(t, "cert-manager")
	objs := caseObjects(t, c)
	sts, _ := find[*appsv1.StatefulSet](objs, render.Release+"-nats")
	cm, _ := find[*corev1.ConfigMap](objs, render.Release+"-nats")
	conf := cm.Data["nats.conf"]
	if sts == nil || !strings.Contains(conf, "/etc/nats/route-tls/") {
		t.Fatalf("case %s: got no route TLS in the rendered configuration:\n%s", c.Name, conf)
	}
	ctr := sts.Spec.Template.Spec.Containers[0]
	replicas := int(deref(sts.Spec.Replicas, 1))

	// The routes' CA and another, each with a certificate for 127.0.0.1, for server and
	// client authentication.
	certs := func(name string) string {
		dir := t.TempDir()
		ca := testkit.NewCA(t, name)
		cert, key := ca.Issue(t, "nats", 0)
		testkit.WriteFile(t, dir, "ca.crt", ca.PEM)
		testkit.WriteFile(t, dir, "tls.crt", cert)
		testkit.WriteFile(t, dir, "tls.key", key)
		return dir
	}
	routesCA, otherCA := certs("routes CA"), certs("another CA")
	clientTLS := certs("clients CA")
	ports := make([]int, replicas)
	for i := range ports {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ports[i] = l.Addr().(*net.TCPAddr).Port
		l.Close()
	}
	issuer, err := nkeys.CreateAccount()
	if err != nil {
		t.Fatal(err)
	}
	issuerPub, _ := issuer.PublicKey()
	t.Setenv("CALLOUT_ISSUER", issuerPub)
	t.Setenv("CALLOUT_PASSWORD", "callout-secret")
	t.Setenv("NATS_ROUTE_PASSWORD", "route-secret")

	// start runs server pod with the rendered configuration, its route certificates from
	// certDir, its cluster port clusterPort (0: any), its routes to the servers' ports.
	start := func(pod, certDir string, clusterPort int) *server.Server {
		t.Helper()
		conf := strings.ReplaceAll(conf, "/etc/nats/route-tls/", certDir+"/")
		conf = strings.ReplaceAll(conf, "/etc/nats/tls/", clientTLS+"/")
		path := filepath.Join(t.TempDir(), "nats.conf")
		if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
			t.Fatal(err)
		}
		t.Setenv("POD_NAME", pod)
		for _, e := range ctr.Env {
			if n, ok := strings.CutPrefix(e.Name, "NATS_ROUTE_"); ok && e.ValueFrom == nil {
				i, err := strconv.Atoi(n)
				if err != nil {
					t.Fatalf("got variable %s, want NATS_ROUTE_<ordinal>", e.Name)
				}
				u := strings.ReplaceAll(e.Value, "$(NATS_ROUTE_PASSWORD)", "route-secret")
				host := u[strings.LastIndex(u, "@")+1:]
				t.Setenv(e.Name, strings.Replace(u, host, "127.0.0.1:"+strconv.Itoa(ports[i]), 1))
			}
		}
		opts, err := server.ProcessConfigFile(path)
		if err != nil {
			t.Fatal(err)
		}
		opts.StoreDir, opts.PidFile = t.TempDir(), filepath.Join(t.TempDir(), "nats.pid")
		opts.Host, opts.Port, opts.HTTPPort = "127.0.0.1", -1, 0
		opts.Cluster.Host, opts.Cluster.Port = "127.0.0.1", clusterPort
		if clusterPort == 0 {
			opts.Cluster.Port = -1
		}
		opts.NoSigs = true
		s, err := server.NewServer(opts)
		if err != nil {
			t.Fatal(err)
		}
		go s.Start()
		t.Cleanup(s.Shutdown)
		if !s.ReadyForConnections(10 * time.Second) {
			t.Fatalf("%s did not start", pod)
		}
		return s
	}
	var servers []*server.Server
	for i := range replicas {
		servers = append(servers, start(fmt.Sprintf("%s-%d", sts.Name, i), routesCA, ports[i]))
	}
	routedTo := func(s *server.Server) []string {
		rz, err := s.Routez(nil)
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, r := range rz.Routes {
			names = append(names, r.RemoteName)
		}
		return names
	}
	testkit.Eventually(t, 20*time.Second, func() bool {
		for _, s := range servers {
			for _, o := range servers {
				if o != s && !slices.Contains(routedTo(s), o.Name()) {
					return false
				}
			}
		}
		return true
	})

	intruder := start("intruder", otherCA, 0)
	deadline := time.Now().Add(2 * time.Second)
	for time.Now().Before(deadline) {
		if names := routedTo(intruder); len(names) > 0 {
			t.Fatalf("a server with the password and another CA's certificate got routes to %v", names)
		}
		for _, s := range servers {
			if slices.Contains(routedTo(s), intruder.Name()) {
				t.Fatalf("%s: got a route to the intruder", s.Name())
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
}
