package e2e

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpuscaler/gpuscaler/test/e2e/cluster"

	"github.com/gpuscaler/gpuscaler/test/testkit"
)

const natsAudience = "gpuscaler-nats"

// calloutBus is the bus as the chart installs it, for one test: namespaces with their
// ServiceAccounts, nats-server running the chart's configuration, the auth callout
// reviewing tokens with the real kube-apiserver, a node, and pods on it whose
// ServiceAccounts' tokens the clients present.
type calloutBus struct {
	*cluster.CalloutBus
	sys, teamA, teamB, teamC string
	dir, node                string
	// Tokens for the NATS audience, bound to pods on node; the files hold them.
	scalerToken, collectorToken, teamAToken string
	producerPod                             *corev1.Pod
	// jetStreamNamespaces have accounts of their own with JetStream (startCalloutBusWith).
	jetStreamNamespaces []string
}

// writeToken writes tok to a file of b's folder and returns its path.
func (b *calloutBus) writeToken(t *testing.T, name, tok string) string {
	t.Helper()
	p := filepath.Join(b.dir, name+".token")
	if err := os.WriteFile(p, []byte(tok), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func startCalloutBus(t *testing.T) *calloutBus {
	t.Helper()
	return startCalloutBusWith(t, false)
}

// startCalloutBusWith is startCalloutBus; with jetStream, team-a and team-b are listed
// for JetStream (b.jetStreamNamespaces), each with an account of its own.
func startCalloutBusWith(t *testing.T, jetStream bool) *calloutBus {
	t.Helper()
	ctx := t.Context()
	sys := newNamespace(t, "gpuscaler-sys")
	teamA, teamB, teamC := newNamespace(t, "team-a"), newNamespace(t, "team-b"), newNamespace(t, "team-c")
	for ns, names := range map[string][]string{sys: {"auth-callout", "scaler", "collector"}, teamA: {"inference"}, teamB: {"inference"}, teamC: {"inference"}} {
		for _, n := range names {
			if _, err := env.Kube.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: n}}, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
	}
	// The callout's RBAC, as the chart grants it.
	crb := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: sys + "-auth-callout"},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "system:auth-delegator"},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Namespace: sys, Name: "auth-callout"}},
	}
	if _, err := env.Kube.RbacV1().ClusterRoleBindings().Create(ctx, crb, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		env.Kube.RbacV1().ClusterRoleBindings().Delete(context.Background(), crb.Name, metav1.DeleteOptions{})
	})

	dir := filepath.Join(env.Dir, "callout-"+sys)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	var jetStreamNamespaces []string
	if jetStream {
		jetStreamNamespaces = []string{teamA, teamB}
	}
	kubeconfig := filepath.Join(dir, "callout.kubeconfig")
	if err := cluster.WriteTokenKubeconfig(kubeconfig, env.CP, tokenFor(t, sys, "auth-callout", "", nil)); err != nil {
		t.Fatal(err)
	}
	bus, err := cluster.StartCalloutBus(ctx, env.Procs, cluster.CalloutOptions{
		NATSBin: natsBin(t), GpuscalerBin: env.G.Bin, Dir: dir, RepoRoot: env.RepoRoot, Kubeconfig: kubeconfig,
		Flags: []string{
			"--scaler-identities=" + sys + "/scaler",
			"--collector-identities=" + sys + "/collector",
			"--producer-identities=" + teamA + "/inference," + teamB + "/*",
		},
		JetStreamNamespaces: jetStreamNamespaces,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { bus.Callout.Stop(); bus.NATS.Server.Stop() })

	// Pods on nodes, so that the tokens carry the bound pod's node.
	node := "gpu-" + sys
	if _, err := env.Kube.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { env.Kube.CoreV1().Nodes().Delete(context.Background(), node, metav1.DeleteOptions{}) })
	collectorPod := createPod(t, sys, "collector-x1", "collector", node)
	scalerPod := createPod(t, sys, "scaler-0", "scaler", node)
	producerPod := createPod(t, teamA, "inference-0", "inference", node)

	b := &calloutBus{CalloutBus: bus, sys: sys, teamA: teamA, teamB: teamB, teamC: teamC, dir: dir, node: node, producerPod: producerPod, jetStreamNamespaces: jetStreamNamespaces}
	b.scalerToken = b.writeToken(t, "scaler", tokenFor(t, sys, "scaler", natsAudience, scalerPod))
	b.collectorToken = tokenFor(t, sys, "collector", natsAudience, collectorPod)
	b.teamAToken = b.writeToken(t, "team-a", tokenFor(t, teamA, "inference", natsAudience, producerPod))
	return b

}

// TestTenantIsolationOnTheBus runs the bus as the chart installs it: nats-server with
// auth callout, `gpuscaler auth-callout` reviewing tokens with the real kube-apiserver
// under its own ServiceAccount (bound to system:auth-delegator and nothing else), and
// the scaler, a producer and a collector authenticating with projected ServiceAccount
// tokens the apiserver issued through the TokenRequest API, bound to pods on nodes.
// Legitimate traffic flows; every attack of issue 10 is refused.
func TestTenantIsolationOnTheBus(t *testing.T) {
	ctx := t.Context()
	b := startCalloutBus(t)
	bus, dir, node := b.CalloutBus, b.dir, b.node
	teamA, teamB, teamC := b.teamA, b.teamB, b.teamC
	scalerToken, collectorToken, teamAToken, producerPod := b.scalerToken, b.collectorToken, b.teamAToken, b.producerPod
	writeToken := func(name, tok string) string { return b.writeToken(t, name, tok) }
	g := cluster.NewGpuscaler(env.Procs, env.G.Bin, bus.NATS.URL, dir)
	s, err := g.StartScaler(ctx, "--nats-token-file="+scalerToken)
	if err != nil {
		t.Fatalf("the scaler cannot run on the callout bus: %v", err)
	}
	t.Cleanup(s.Stop)

	publish := func(ns, queue, tokenFile string, waiting int) (string, error) {
		cmd := exec.CommandContext(ctx, env.G.Bin, "publish", "queue", "--nats-url="+bus.NATS.URL, "--nats-token-file="+tokenFile,
			"--namespace="+ns, "--queue="+queue, fmt.Sprintf("--waiting=%d", waiting), "--timeout=3s")
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	t.Run("a producer publishes for its own namespace", func(t *testing.T) {
		if out, err := publish(teamA, "jobs", teamAToken, 3); err != nil {
			t.Fatalf("gpuscaler publish with the producer's token: %v\n%s", err, out)
		}
		// The scaler sees team-a's backlog.
		testkit.Eventually(t, 10*time.Second, func(ctx context.Context) error {
			v, err := s.Metric(ctx, teamA, "app", map[string]string{"queue": "jobs"}, "queue-backlog")
			return testkit.Check(err == nil && v == 3, "%v %v", v, err)
		})
	})
	t.Run("a tenant in a publishes for b", func(t *testing.T) {
		out, err := publish(teamB, "jobs", teamAToken, 0)
		if err == nil {
			t.Fatalf("team-a's identity published for team-b:\n%s", out)
		}
		t.Logf("refused as expected: %s", strings.TrimSpace(out))
		consistently(t, 2*time.Second, "team-b's queue stays unknown", func(ctx context.Context) error {
			_, err := s.Metric(ctx, teamB, "app", map[string]string{"queue": "jobs"}, "queue-backlog")
			return testkit.Check(err != nil, "%v", err)
		})
	})
	t.Run("a collector publishes its own node and no other", func(t *testing.T) {
		nc, errs := connect(t, bus.NATS.URL, nats.Token(collectorToken))
		if err := nc.Publish("gpuscaler.v1.node.other-node", []byte("forged")); err != nil {
			t.Fatal(err)
		}
		nc.Flush()
		waitErr(t, errs, `Permissions Violation for Publish to "gpuscaler.v1.node.other-node"`)
		// Its own node's subject it may publish: a real collector (sim source) on it.
		sim := cluster.SimNode{GPUs: 2, Pods: []cluster.SimPod{{Namespace: teamA, Name: "inference-0", Labels: map[string]string{"app": "llm"}, GPUs: []string{"0"}, Util: f64p(40)}}}
		c, err := g.StartCollector(ctx, node, sim, time.Second, "--nats-token-file="+writeToken("collector", collectorToken))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(c.Stop)
		// The scaler reads the utilisation of team-a's pod from the collector.
		testkit.Eventually(t, 15*time.Second, func(ctx context.Context) error {
			v, err := s.Metric(ctx, teamA, "app", map[string]string{"podSelector": "app=llm", "gpuUtilTarget": "80"}, "gpu-util")
			return testkit.Check(err == nil && v == 40, "%v %v", v, err)
		})
	})
	t.Run("a tenant deletes or purges the stream", func(t *testing.T) {
		nc, errs := connect(t, bus.NATS.URL, nats.Token(tokenFor(t, teamA, "inference", natsAudience, producerPod)))
		js, err := jetstream.New(nc)
		if err != nil {
			t.Fatal(err)
		}
		short, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		if err := js.DeleteStream(short, "GPUSCALER"); err == nil {
			t.Fatal("a tenant deleted the GPUSCALER stream")
		}
		waitErr(t, errs, `Permissions Violation for Publish to "$JS.API.STREAM.DELETE.GPUSCALER"`)
		nc.Publish("$JS.API.STREAM.PURGE.GPUSCALER", nil)
		waitErr(t, errs, `Permissions Violation for Publish to "$JS.API.STREAM.PURGE.GPUSCALER"`)
		// The stream and team-a's report in it are still there.
		v, err := s.Metric(ctx, teamA, "app", map[string]string{"queue": "jobs"}, "queue-backlog")
		if err != nil || v != 3 {
			t.Fatalf("after the attack: %v %v, want 3", v, err)
		}
	})
	refused := map[string]struct {
		token  func() string
		reason string
	}{
		"a token for another audience": {func() string { return tokenFor(t, teamA, "inference", "https://kubernetes.default.svc", nil) }, "wrong_audience"},
		"a ServiceAccount not listed":  {func() string { return tokenFor(t, teamC, "inference", natsAudience, nil) }, "not_listed"},
		"a revoked token (its pod deleted)": {func() string {
			p := createPod(t, teamA, "inference-gone", "inference", node)
			tok := tokenFor(t, teamA, "inference", natsAudience, p)
			zero := int64(0)
			if err := env.Kube.CoreV1().Pods(teamA).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
				t.Fatal(err)
			}
			// The pod is gone.
			testkit.Eventually(t, 10*time.Second, func(ctx context.Context) error {
				_, err := env.Kube.CoreV1().Pods(teamA).Get(ctx, p.Name, metav1.GetOptions{})
				return testkit.Check(err != nil, "%v", err)
			})
			return tok
		}, "rejected"},
		"a token that is not a ServiceAccount's": {func() string { return "not-a-jwt" }, "malformed_token"},
	}
	for name, tc := range refused {
		t.Run(name, func(t *testing.T) {
			_, err := nats.Connect(bus.NATS.URL, nats.Token(tc.token()), nats.Timeout(5*time.Second))
			if err == nil || !strings.Contains(strings.ToLower(err.Error()), "authorization violation") {
				t.Fatalf("got %v, want an authorization violation", err)
			}
			// The callout counts the refusal.
			testkit.Eventually(t, 5*time.Second, func(ctx context.Context) error {
				m := metricsText(ctx, "http://"+bus.HTTPAddr+"/metrics")
				want := fmt.Sprintf(`gpuscaler_auth_callout_decisions_total{reason=%q,result="denied",role="unknown"}`, tc.reason)
				return testkit.Check(strings.Contains(m, want), "/metrics has no %s", want)
			})
		})
	}
}

// tokenFor asks the apiserver for a token of ServiceAccount ns/name, for audience aud
// (empty: the apiserver's own), bound to pod when given: what the kubelet mounts as a
// projected serviceAccountToken volume.
func tokenFor(t *testing.T, ns, name, aud string, pod *corev1.Pod) string {
	t.Helper()
	req := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr(int64(3600))}}
	if aud != "" {
		req.Spec.Audiences = []string{aud}
	}
	if pod != nil {
		req.Spec.BoundObjectRef = &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID}
	}
	tr, err := env.Kube.CoreV1().ServiceAccounts(ns).CreateToken(t.Context(), name, req, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("token for %s/%s: %v", ns, name, err)
	}
	return tr.Status.Token
}

func ptr[T any](v T) *T { return &v }

// createPod creates a pod of ServiceAccount sa bound to node (no kubelet runs it).
func createPod(t *testing.T, ns, name, sa, node string) *corev1.Pod {
	t.Helper()
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PodSpec{ServiceAccountName: sa, NodeName: node, AutomountServiceAccountToken: ptr(false),
			Containers: []corev1.Container{{Name: "c", Image: "registry.k8s.io/pause:3.10"}}},
	}
	p, err := env.Kube.CoreV1().Pods(ns).Create(t.Context(), p, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("pod %s/%s: %v", ns, name, err)
	}
	return p
}

// connect connects to NATS with opt and returns the connection and its asynchronous
// errors (permission violations).
func connect(t *testing.T, url string, opt nats.Option) (*nats.Conn, chan error) {
	t.Helper()
	errs := make(chan error, 16)
	nc, err := nats.Connect(url, opt, nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		select {
		case errs <- err:
		default:
		}
	}))
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(nc.Close)
	return nc, errs
}

func waitErr(t *testing.T, errs chan error, want string) {
	t.Helper()
	deadline := time.After(5 * time.Second)
	for {
		select {
		case err := <-errs:
			if strings.Contains(err.Error(), want) {
				return
			}
		case <-deadline:
			t.Fatalf("no error %q within 5s", want)
		}
	}
}

func metricsText(ctx context.Context, url string) string {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// natsBin is the nats-server binary the suite built.
func natsBin(t *testing.T) string {
	t.Helper()
	if env.NATSBin == "" {
		t.Fatal(errors.New("the suite's nats-server binary is unknown"))
	}
	return env.NATSBin
}
