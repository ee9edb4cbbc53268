package e2e

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/gpuscaler/gpuscaler/test/e2e/cluster"
)

// natsClusterGolden is the chart's rendering with nats.replicas 3 (deploy/render.sh
// writes it): the cluster the attacks below run is that one, its nats.conf and its
// servers' variables as the chart renders them, moved onto loopback.
const natsClusterGolden = "test/manifests/testdata/nats-cluster.yaml"

// TestAttackRoute: a route is trusted with every account's messages (the auth callout's
// requests with their tokens, the GPUSCALER stream), so whoever reaches the route port
// and joins as a route can read and inject anything. Three servers run the chart's
// rendered cluster; an intruder nats-server, configured as a fourth server of that
// cluster but without the route password (or with a wrong one), must be refused, and a
// client of its own must neither see what a client of the cluster publishes nor reach
// that client. The same server given the password joins, and both directions work: so
// the test sees a join when there is one.
func TestAttackRoute(t *testing.T) {
	r := renderedNATSCluster(t)
	servers := r.startCluster(t)

	for _, c := range []struct {
		name  string
		creds func(route string) string // the intruder's route URL to a server
		join  bool
	}{
		{"no password", func(route string) string { return "nats://" + route }, false},
		{"a wrong password", func(route string) string { return "nats://route:" + randomPassword(t) + "@" + route }, false},
		{"the route password", func(route string) string {
			return "nats://route:" + r.secrets["route-password"] + "@" + route
		}, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			intruder := r.startServer(t, "intruder-"+strings.ReplaceAll(c.name, " ", "-"), servers, c.creds)
			victim := r.connect(t, servers[0])
			spy := r.connect(t, intruder)
			seen, err := spy.SubscribeSync("secret.>")
			if err != nil {
				t.Fatal(err)
			}
			injected, err := victim.SubscribeSync("injected.>")
			if err != nil {
				t.Fatal(err)
			}
			flush(t, spy, victim)

			if c.join {
				// The intruder with the password: routed to every server, it reads what
				// the cluster's clients publish and its own publications reach them.
				waitRoutes(t, intruder, servers)
				err := cluster.Eventually(t.Context(), 30*time.Second, 100*time.Millisecond, "the joined server sees the cluster's messages", intruder.proc, func(context.Context) (bool, error) {
					if err := victim.Publish("secret.auth.request", []byte("token")); err != nil {
						return false, err
					}
					if err := spy.Publish("injected.report", []byte("forged")); err != nil {
						return false, err
					}
					flush(t, spy, victim)
					_, errSeen := seen.NextMsg(100 * time.Millisecond)
					_, errInj := injected.NextMsg(100 * time.Millisecond)
					return errSeen == nil && errInj == nil, nil
				})
				if err != nil {
					t.Fatalf("%v\nintruder's log:\n%s", err, intruder.proc.Tail(30))
				}
				return
			}

			// Refused: every server turns the route down for its credentials. (Without
			// route authentication the intruder is routed to them at once instead.)
			var joined []string
			err = cluster.Eventually(t.Context(), 30*time.Second, 100*time.Millisecond, "every server refusing the intruder's route", intruder.proc, func(context.Context) (bool, error) {
				if joined = routeNames(t, intruder); len(joined) > 0 {
					return true, nil
				}
				log, err := os.ReadFile(intruder.proc.LogPath)
				if err != nil {
					return false, err
				}
				refusals := strings.Count(string(log), "Authorization Violation")
				if refusals < len(servers) {
					return false, cluster.Retry(fmt.Errorf("%d refusals in the intruder's log, want one from each of %d servers", refusals, len(servers)))
				}
				return true, nil
			})
			if err != nil {
				t.Fatalf("%v\nintruder's log:\n%s", err, intruder.proc.Tail(30))
			}
			if len(joined) > 0 {
				t.Errorf("the intruder joined the cluster: routes to %v", joined)
			}
			for _, s := range servers {
				if names := routeNames(t, s); slices.Contains(names, intruder.name) {
					t.Errorf("%s: got routes to %v, the intruder's among them, want none", s.name, names)
				}
			}
			// Nothing crosses. Once the refusals are in, there is no path at all; the
			// window only gives a route that should not exist the time a joined one
			// takes above (well under a second).
			deadline := time.Now().Add(2 * time.Second)
			for time.Now().Before(deadline) {
				if err := victim.Publish("secret.auth.request", []byte("token")); err != nil {
					t.Fatal(err)
				}
				if err := spy.Publish("injected.report", []byte("forged")); err != nil {
					t.Fatal(err)
				}
				flush(t, spy, victim)
				m1, err1 := seen.NextMsg(100 * time.Millisecond)
				if err1 == nil {
					t.Errorf("the intruder read %s (%q) published on %s", m1.Subject, m1.Data, servers[0].name)
				}
				m2, err2 := injected.NextMsg(100 * time.Millisecond)
				if err2 == nil {
					t.Errorf("the intruder injected %s (%q) into %s", m2.Subject, m2.Data, servers[0].name)
				}
				if err1 == nil || err2 == nil {
					return
				}
			}
		})
	}
}

// natsRendering is the chart's bundled NATS cluster as rendered: its configuration, its
// server's container variables, and the values its generated Secrets would hold.
type natsRendering struct {
	name    string // the StatefulSet's name, which the route host names start with
	conf    string
	env     []any             // the nats container's env, as rendered
	secrets map[string]string // secret key → a value generated now, as helm install does
	issuer  string            // the callout issuer's public key
	dir     string
	// Each server's loopback cluster port, by its StatefulSet ordinal.
	routePorts []int
}

// natsServer is one nats-server of the attack tests.
type natsServer struct {
	name         string
	client, http string // host:port
	proc         *cluster.Process
	vars         map[string]string
}

// renderedNATSCluster reads the chart's rendering with three NATS servers.
func renderedNATSCluster(t *testing.T) *natsRendering {
	t.Helper()
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	root := filepath.Clean(filepath.Join(wd, "..", ".."))
	docs, _ := readManifestDocs(t, root, natsClusterGolden)
	r := &natsRendering{secrets: map[string]string{}, dir: t.TempDir()}
	var sts *unstructured.Unstructured
	for _, d := range docs {
		switch d.gvk.Kind {
		case "StatefulSet":
			sts = d.obj
		case "Secret":
			data, _, _ := unstructured.NestedMap(d.obj.Object, "data")
			for k := range data {
				r.secrets[k] = randomPassword(t)
			}
		}
	}
	if sts == nil {
		t.Fatalf("%s: no StatefulSet", natsClusterGolden)
	}
	r.name = sts.GetName()
	for _, d := range docs {
		if d.gvk.Kind == "ConfigMap" && d.obj.GetName() == r.name {
			r.conf, _, _ = unstructured.NestedString(d.obj.Object, "data", "nats.conf")
		}
	}
	if r.conf == "" {
		t.Fatalf("%s: no ConfigMap %s with nats.conf", natsClusterGolden, r.name)
	}
	ctrs, _, _ := unstructured.NestedSlice(sts.Object, "spec", "template", "spec", "containers")
	for _, c := range ctrs {
		if c.(map[string]any)["name"] == "nats" {
			r.env, _ = c.(map[string]any)["env"].([]any)
		}
	}
	replicas, _, _ := unstructured.NestedFieldNoCopy(sts.Object, "spec", "replicas")
	if fmt.Sprint(replicas) != "3" {
		t.Fatalf("%s: got %v NATS replicas, want 3", natsClusterGolden, replicas)
	}
	for range 3 {
		p, err := cluster.FreePort()
		if err != nil {
			t.Fatal(err)
		}
		r.routePorts = append(r.routePorts, p)
	}
	issuer, err := nkeys.CreateAccount()
	if err != nil {
		t.Fatal(err)
	}
	r.issuer, _ = issuer.PublicKey()
	return r
}

// startCluster starts the rendering's three servers and waits until they are routed to
// each other.
func (r *natsRendering) startCluster(t *testing.T) []*natsServer {
	t.Helper()
	var servers []*natsServer
	for i := range r.routePorts {
		servers = append(servers, r.startServer(t, fmt.Sprintf("%s-%d", r.name, i), nil, nil))
	}
	for _, s := range servers {
		waitRoutes(t, s, servers)
	}
	return servers
}

// startServer starts one server as the StatefulSet's pod named pod would run: the
// rendered configuration and variables, its ports on loopback. An intruder (peers given)
// is started with the rendering too, as a server of a cluster of its own, its routes
// leading to each of peers as routeURL writes them.
func (r *natsRendering) startServer(t *testing.T, pod string, peers []*natsServer, routeURL func(route string) string) *natsServer {
	t.Helper()
	ports := map[string]int{}
	for _, p := range []string{"client", "http", "cluster"} {
		n, err := cluster.FreePort()
		if err != nil {
			t.Fatal(err)
		}
		ports[p] = n
	}
	if peers == nil {
		n, err := strconv.Atoi(strings.TrimPrefix(pod, r.name+"-"))
		if err != nil || n >= len(r.routePorts) {
			t.Fatalf("pod %s is not a server of StatefulSet %s", pod, r.name)
		}
		ports["cluster"] = r.routePorts[n]
	}
	s := &natsServer{name: pod, client: fmt.Sprintf("127.0.0.1:%d", ports["client"]), http: fmt.Sprintf("127.0.0.1:%d", ports["http"])}
	dir := filepath.Join(r.dir, pod)
	if err := os.MkdirAll(filepath.Join(dir, "data"), 0o755); err != nil {
		t.Fatal(err)
	}

	// The rendered file, with what a pod has (its paths, its ports, its peers' names)
	// moved to this machine. Each rewrite must find its text: a rendering that changed
	// shape fails here rather than running something else.
	conf := r.conf
	rewrite := func(what string, re *regexp.Regexp, repl string) {
		t.Helper()
		if !re.MatchString(conf) {
			t.Fatalf("%s: no %s in the rendered nats.conf:\n%s", natsClusterGolden, what, r.conf)
		}
		conf = re.ReplaceAllString(conf, repl)
	}
	rewrite("client port", regexp.MustCompile(`(?m)^port: 4222$`), fmt.Sprintf("host: 127.0.0.1\nport: %d", ports["client"]))
	rewrite("monitoring port", regexp.MustCompile(`(?m)^http_port: 8222$`), fmt.Sprintf("http: %q", s.http))
	rewrite("cluster port", regexp.MustCompile(`(?m)^(\s+)port: 6222$`), fmt.Sprintf("${1}host: 127.0.0.1\n${1}port: %d", ports["cluster"]))
	rewrite("pid file", regexp.MustCompile(`/var/run/nats/nats.pid`), filepath.Join(dir, "nats.pid"))
	rewrite("store", regexp.MustCompile(`store_dir: /data`), "store_dir: "+filepath.Join(dir, "data"))
	if strings.Contains(conf, "/etc/") {
		t.Fatalf("%s: nats.conf names files under /etc/ this test does not provide:\n%s", natsClusterGolden, conf)
	}
	route := func(conf string) string {
		for i, p := range r.routePorts {
			host := fmt.Sprintf("%s-%d.%s-headless.", r.name, i, r.name)
			re := regexp.MustCompile(`(nats://(?:[^@/\s]*@)?)` + regexp.QuoteMeta(host) + `[^:\s]*:6222`)
			to := fmt.Sprintf("127.0.0.1:%d", p)
			if peers != nil {
				conf = re.ReplaceAllLiteralString(conf, routeURL(to))
			} else {
				conf = re.ReplaceAllString(conf, "${1}"+to)
			}
		}
		return conf
	}
	conf = route(conf)
	path := filepath.Join(dir, "nats.conf")
	if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}

	// The container's variables, as the kubelet sets them.
	s.vars = map[string]string{}
	var env []string
	for _, e := range r.env {
		e := e.(map[string]any)
		name, _ := e["name"].(string)
		var v string
		switch {
		case e["value"] != nil:
			v = regexp.MustCompile(`\$\(([A-Z0-9_]+)\)`).ReplaceAllStringFunc(e["value"].(string), func(ref string) string {
				return s.vars[ref[2:len(ref)-1]]
			})
			if strings.HasPrefix(name, "NATS_ROUTE_") {
				v = route(v)
			}
		case nestedString(e, "valueFrom", "fieldRef", "fieldPath") == "metadata.name":
			v = pod
		case nestedString(e, "valueFrom", "secretKeyRef", "key") != "":
			v = r.secrets[nestedString(e, "valueFrom", "secretKeyRef", "key")]
		case nestedString(e, "valueFrom", "configMapKeyRef", "key") == "issuer.pub":
			// The callout issuer's public key, which the callout publishes.
			v = r.issuer
		default:
			t.Fatalf("%s: env %s: got %v, which this test cannot set", natsClusterGolden, name, e)
		}
		s.vars[name] = v
		env = append(env, name+"="+v)
	}
	if _, ok := s.vars["CALLOUT_ISSUER"]; !ok {
		// Before the issuer's key was a variable of the pod, the server's command read
		// it from a file an init container wrote.
		env = append(env, "CALLOUT_ISSUER="+r.issuer)
	}

	p, err := suiteEnv(t).Procs.Start("attack-"+pod, suiteEnv(t).NATSBin, []string{"--config", path}, env...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Stop)
	s.proc = p
	err = cluster.Eventually(t.Context(), time.Minute, 100*time.Millisecond, pod+" serving", p, func(ctx context.Context) (bool, error) {
		resp, err := http.Get("http://" + s.http + "/healthz?js-server-only=true")
		if err != nil {
			return false, cluster.Retry(err)
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// suiteEnv is the suite's running system (the nats-server binary, the process list).
func suiteEnv(t *testing.T) *cluster.Env {
	t.Helper()
	if env == nil {
		t.Fatal("no e2e environment: run through run.sh")
	}
	return env
}

// connect logs in to s as the auth callout does (user callout, $CALLOUT_PASSWORD), the
// one login that bypasses the callout.
func (r *natsRendering) connect(t *testing.T, s *natsServer) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect("nats://"+s.client, nats.UserInfo("callout", s.vars["CALLOUT_PASSWORD"]), nats.Timeout(5*time.Second))
	if err != nil {
		t.Fatalf("%s: connect as callout: %v", s.name, err)
	}
	t.Cleanup(nc.Close)
	return nc
}

func flush(t *testing.T, ncs ...*nats.Conn) {
	t.Helper()
	for _, nc := range ncs {
		if err := nc.FlushTimeout(5 * time.Second); err != nil {
			t.Fatal(err)
		}
	}
}

// routeNames are the server names s's routes lead to (/routez).
func routeNames(t *testing.T, s *natsServer) []string {
	t.Helper()
	resp, err := http.Get("http://" + s.http + "/routez")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var routez struct {
		Routes []struct {
			RemoteName string `json:"remote_name"`
		} `json:"routes"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&routez); err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, r := range routez.Routes {
		names = append(names, r.RemoteName)
	}
	return names
}

// waitRoutes waits until s has a route to every other server of servers.
func waitRoutes(t *testing.T, s *natsServer, servers []*natsServer) {
	t.Helper()
	err := cluster.Eventually(t.Context(), time.Minute, 100*time.Millisecond, s.name+" routed to every other server", s.proc, func(context.Context) (bool, error) {
		names := routeNames(t, s)
		for _, o := range servers {
			if o != s && !slices.Contains(names, o.name) {
				return false, cluster.Retry(fmt.Errorf("routes to %v, none to %s", names, o.name))
			}
		}
		return true, nil
	})
	if err != nil {
		t.Fatalf("%v\n%s's log:\n%s", err, s.name, s.proc.Tail(30))
	}
}

func nestedString(m map[string]any, path ...string) string {
	v, _, _ := unstructured.NestedString(m, path...)
	return v
}

// randomPassword is what helm's randAlphaNum would make: letters and digits.
func randomPassword(t *testing.T) string {
	t.Helper()
	b := make([]byte, 24)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return strings.NewReplacer("+", "", "/", "", "=", "").Replace(base64.StdEncoding.EncodeToString(b))
}

// chartDefaultGolden is the chart's rendering with its default values.
const chartDefaultGolden = "test/manifests/testdata/default.yaml"

// TestIssuerKeyPublishedWithTheChartsRole: the bundled NATS servers read the callout
// issuer's public key from a ConfigMap the callout writes, so that no NATS container
// mounts the seed (test/manifests TestAttackNATSReadsIssuerSeed). Here the callout runs
// as its ServiceAccount with exactly the RBAC the chart renders for it (its Role and
// RoleBinding, applied to this API server): it writes the key the seed gives, and its
// token can do nothing else with ConfigMaps or Secrets there.
func TestIssuerKeyPublishedWithTheChartsRole(t *testing.T) {
	e := suiteEnv(t)
	ctx := t.Context()
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	root := filepath.Clean(filepath.Join(wd, "..", ".."))
	docs, _ := readManifestDocs(t, root, chartDefaultGolden)
	const ns = "attack-issuer"
	var (
		sa        corev1.ServiceAccount
		cm        corev1.ConfigMap
		role      rbacv1.Role
		binding   rbacv1.RoleBinding
		calloutCM string
	)
	found := map[string]bool{}
	for _, d := range docs {
		var into any
		switch {
		case d.gvk.Kind == "ServiceAccount" && strings.HasSuffix(d.obj.GetName(), "-auth-callout"):
			into = &sa
		case d.gvk.Kind == "ConfigMap" && strings.HasSuffix(d.obj.GetName(), "-auth-callout-issuer"):
			into = &cm
		case d.gvk.Kind == "Role" && strings.HasSuffix(d.obj.GetName(), "-auth-callout-issuer"):
			into = &role
		case d.gvk.Kind == "RoleBinding" && strings.HasSuffix(d.obj.GetName(), "-auth-callout-issuer"):
			into = &binding
		case d.gvk.Kind == "Deployment" && strings.HasSuffix(d.obj.GetName(), "-auth-callout"):
			ctrs, _, _ := unstructured.NestedSlice(d.obj.Object, "spec", "template", "spec", "containers")
			args, _ := ctrs[0].(map[string]any)["args"].([]any)
			for _, a := range args {
				if v, ok := strings.CutPrefix(fmt.Sprint(a), "--issuer-key-configmap="); ok {
					calloutCM = v
				}
			}
			continue
		default:
			continue
		}
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(d.obj.Object, into); err != nil {
			t.Fatalf("%s: %v", d, err)
		}
		found[d.gvk.Kind] = true
	}
	if len(found) != 4 || calloutCM == "" {
		t.Fatalf("%s: got %v and --issuer-key-configmap=%q, want the callout's ServiceAccount, issuer ConfigMap, Role, RoleBinding and the flag", chartDefaultGolden, found, calloutCM)
	}
	if calloutCM != cm.Namespace+"/"+cm.Name {
		t.Fatalf("%s: the callout writes %s, the chart renders ConfigMap %s/%s", chartDefaultGolden, calloutCM, cm.Namespace, cm.Name)
	}

	// The release's objects, moved to a namespace of this test's own.
	kube := e.Kube
	if _, err := kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = kube.CoreV1().Namespaces().Delete(context.Background(), ns, metav1.DeleteOptions{})
	})
	for _, m := range []*metav1.ObjectMeta{&sa.ObjectMeta, &cm.ObjectMeta, &role.ObjectMeta, &binding.ObjectMeta} {
		m.Namespace = ns
	}
	for i := range binding.Subjects {
		binding.Subjects[i].Namespace = ns
	}
	steps := []func() error{
		func() error {
			_, err := kube.CoreV1().ServiceAccounts(ns).Create(ctx, &sa, metav1.CreateOptions{})
			return err
		},
		func() error {
			_, err := kube.CoreV1().ConfigMaps(ns).Create(ctx, &cm, metav1.CreateOptions{})
			return err
		},
		func() error { _, err := kube.RbacV1().Roles(ns).Create(ctx, &role, metav1.CreateOptions{}); return err },
		func() error {
			_, err := kube.RbacV1().RoleBindings(ns).Create(ctx, &binding, metav1.CreateOptions{})
			return err
		},
		func() error {
			_, err := kube.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "other"}}, metav1.CreateOptions{})
			return err
		},
		func() error {
			_, err := kube.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "seed"}, StringData: map[string]string{"issuer-seed": "x"}}, metav1.CreateOptions{})
			return err
		},
	}
	for _, step := range steps {
		if err := step(); err != nil {
			t.Fatal(err)
		}
	}

	// The callout's credentials: a token of its ServiceAccount.
	tok, err := kube.CoreV1().ServiceAccounts(ns).CreateToken(ctx, sa.Name, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr(int64(600))}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	kc := clientcmdapi.NewConfig()
	kc.Clusters["e2e"] = &clientcmdapi.Cluster{Server: e.CP.Host, CertificateAuthorityData: e.CP.CA.CertPEM}
	kc.AuthInfos["callout"] = &clientcmdapi.AuthInfo{Token: tok.Status.Token}
	kc.Contexts["e2e"] = &clientcmdapi.Context{Cluster: "e2e", AuthInfo: "callout", Namespace: ns}
	kc.CurrentContext = "e2e"
	dir := t.TempDir()
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := clientcmd.WriteToFile(*kc, kubeconfig); err != nil {
		t.Fatal(err)
	}
	seed := filepath.Join(dir, "issuer-seed")
	if err := os.WriteFile(seed, []byte(randomPassword(t)+randomPassword(t)), 0o600); err != nil {
		t.Fatal(err)
	}
	want, err := exec.CommandContext(ctx, e.G.Bin, "auth-callout", "issuer-key", "--issuer-seed-file", seed).Output()
	if err != nil {
		t.Fatal(err)
	}

	// The callout, pointed at a NATS that is not there (it writes the key before it
	// connects, and then keeps retrying).
	nobody, err := cluster.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	p, err := e.Procs.Start("attack-issuer-callout", e.G.Bin, []string{"auth-callout",
		"--issuer-seed-file", seed, "--issuer-key-configmap", ns + "/" + cm.Name, "--kubeconfig", kubeconfig,
		"--nats-url", fmt.Sprintf("nats://127.0.0.1:%d", nobody), "--nats-user", "callout", "--http-addr", "-"},
		"GPUSCALER_NATS_PASSWORD=unused")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Stop)
	err = cluster.Eventually(ctx, 30*time.Second, 100*time.Millisecond, "the issuer's key in ConfigMap "+cm.Name, p, func(ctx context.Context) (bool, error) {
		got, err := kube.CoreV1().ConfigMaps(ns).Get(ctx, cm.Name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		if got.Data["issuer.pub"] != strings.TrimSpace(string(want)) {
			return false, cluster.Retry(fmt.Errorf("got data %v, want issuer.pub %s", got.Data, want))
		}
		return true, nil
	})
	if err != nil {
		t.Fatalf("%v\ncallout's log:\n%s", err, p.Tail(20))
	}

	// Its token can do nothing else there.
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	as, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	patch := []byte(`{"data":{"issuer.pub":"forged"}}`)
	for what, try := range map[string]func() error{
		"patch another ConfigMap": func() error {
			_, err := as.CoreV1().ConfigMaps(ns).Patch(ctx, "other", types.MergePatchType, patch, metav1.PatchOptions{})
			return err
		},
		"read the issuer ConfigMap": func() error { _, err := as.CoreV1().ConfigMaps(ns).Get(ctx, cm.Name, metav1.GetOptions{}); return err },
		"delete the issuer ConfigMap": func() error {
			return as.CoreV1().ConfigMaps(ns).Delete(ctx, cm.Name, metav1.DeleteOptions{})
		},
		"read a Secret": func() error { _, err := as.CoreV1().Secrets(ns).Get(ctx, "seed", metav1.GetOptions{}); return err },
	} {
		if err := try(); !apierrors.IsForbidden(err) {
			t.Errorf("the callout's token: %s: got %v, want Forbidden", what, err)
		}
	}
}
