package manifests

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/kedacore/keda/v2/pkg/scalers/externalscaler"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/gpuscaler/gpuscaler/deploy/render"
	"github.com/gpuscaler/gpuscaler/test/testkit"
)

// Secrets the chart generates with its default values, by namespace/name.
var (
	calloutSecret = render.Namespace + "/" + render.Release + "-auth-callout"
	caSecret      = render.Namespace + "/" + render.Release + "-grpc-ca"
	serverSecret  = render.Namespace + "/" + render.Release + "-grpc-tls"
	clientSecret  = "keda/" + render.Release + "-keda-client-tls"
)

// install renders the chart as `helm install` or `helm upgrade` would over a cluster
// holding cluster, and returns the Secrets it renders (all generated), decoded.
func install(t *testing.T, vals map[string]any, cluster []*unstructured.Unstructured) ([]*unstructured.Unstructured, map[string]map[string][]byte) {
	t.Helper()
	out, err := render.RenderWith(filepath.Join(root(t), render.ChartDir), vals, render.Options{Cluster: cluster})
	if err != nil {
		t.Fatal(err)
	}
	secrets, err := render.GeneratedSecrets(out)
	if err != nil {
		t.Fatal(err)
	}
	data := map[string]map[string][]byte{}
	for _, s := range secrets {
		d, _, _ := unstructured.NestedStringMap(s.Object, "data")
		data[s.GetNamespace()+"/"+s.GetName()] = map[string][]byte{}
		for k, v := range d {
			b, err := base64.StdEncoding.DecodeString(v)
			if err != nil {
				t.Fatalf("Secret %s/%s key %s: %v", s.GetNamespace(), s.GetName(), k, err)
			}
			data[s.GetNamespace()+"/"+s.GetName()][k] = b
		}
	}
	return secrets, data
}

// without returns secrets less those named.
func without(secrets []*unstructured.Unstructured, names ...string) []*unstructured.Unstructured {
	return slices.DeleteFunc(slices.Clone(secrets), func(s *unstructured.Unstructured) bool {
		return slices.Contains(names, s.GetNamespace()+"/"+s.GetName())
	})
}

func parseCert(t *testing.T, what string, pemBytes []byte) *x509.Certificate {
	t.Helper()
	b, _ := pem.Decode(pemBytes)
	if b == nil {
		t.Fatalf("%s: no PEM certificate", what)
	}
	c, err := x509.ParseCertificate(b.Bytes)
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	return c
}

// checkChain: the scaler's certificate and KEDA's are valid key pairs, issued by the CA
// every Secret carries as ca.crt, for serving the scaler's names and for a client.
func checkChain(t *testing.T, data map[string]map[string][]byte, dnsNames ...string) {
	t.Helper()
	for _, name := range []string{caSecret, serverSecret, clientSecret} {
		if _, err := tls.X509KeyPair(data[name]["tls.crt"], data[name]["tls.key"]); err != nil {
			t.Errorf("Secret %s: got tls.crt and tls.key that are no key pair: %v", name, err)
		}
	}
	ca := parseCert(t, caSecret, data[caSecret]["tls.crt"])
	if !ca.IsCA {
		t.Errorf("got a CA certificate that is no CA")
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca)
	for _, name := range []string{serverSecret, clientSecret} {
		if string(data[name]["ca.crt"]) != string(data[caSecret]["tls.crt"]) {
			t.Errorf("Secret %s: got a ca.crt other than the CA's", name)
		}
	}
	server := parseCert(t, serverSecret, data[serverSecret]["tls.crt"])
	for _, n := range dnsNames {
		if _, err := server.Verify(x509.VerifyOptions{DNSName: n, Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
			t.Errorf("the scaler's certificate for %s: %v", n, err)
		}
	}
	client := parseCert(t, clientSecret, data[clientSecret]["tls.crt"])
	if _, err := client.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Errorf("KEDA's client certificate: %v", err)
	}
}

// TestGeneratedSecretsKeptAcrossUpgrades installs the chart with its default values (the
// renderer's fake cluster stands in for the one helm install writes to), checks what it
// generated, and upgrades over those Secrets: each must come back unchanged, and only
// what is missing or no longer fits is made anew, with the CA that is kept.
func TestGeneratedSecretsKeptAcrossUpgrades(t *testing.T) {
	first, data := install(t, nil, nil)
	if got, want := slices.Sorted(maps.Keys(data)), []string{calloutSecret, caSecret, serverSecret, clientSecret}; !slices.Equal(got, want) {
		t.Fatalf("got generated Secrets %v, want %v", got, want)
	}
	for key, min := range map[string]int{"issuer-seed": 32, "callout-password": 24} {
		if got := len(data[calloutSecret][key]); got < min {
			t.Errorf("got a %d-byte %s, want %d at least", got, key, min)
		}
	}
	checkChain(t, data, scalerHost, render.Release+"."+render.Namespace+".svc", render.Release+"."+render.Namespace, render.Release)
	again, _ := install(t, nil, nil)
	if err := render.SameSecrets(again, first); err == nil {
		t.Fatal("got the same Secrets from two fresh installs, want each install its own keys")
	}

	changed := func(before, after map[string]map[string][]byte) []string {
		var out []string
		for _, name := range []string{calloutSecret, caSecret, serverSecret, clientSecret} {
			if !maps.EqualFunc(before[name], after[name], func(a, b []byte) bool { return string(a) == string(b) }) {
				out = append(out, name)
			}
		}
		return out
	}
	cases := map[string]struct {
		vals    map[string]any
		cluster []*unstructured.Unstructured
		changed []string
		names   []string // the scaler's certificate must be valid for these
	}{
		"upgrade":                      {cluster: first},
		"the scaler's Secret deleted":  {cluster: without(first, serverSecret), changed: []string{serverSecret}},
		"KEDA's Secret deleted":        {cluster: without(first, clientSecret), changed: []string{clientSecret}},
		"the callout's Secret deleted": {cluster: without(first, calloutSecret), changed: []string{calloutSecret}},
		"the CA deleted": {cluster: without(first, caSecret),
			changed: []string{caSecret, serverSecret, clientSecret}},
		"another cluster domain": {vals: map[string]any{"clusterDomain": "cluster.example"}, cluster: first,
			changed: []string{serverSecret}, names: []string{render.Release + "." + render.Namespace + ".svc.cluster.example"}},
	}
	for _, name := range slices.Sorted(maps.Keys(cases)) {
		tc := cases[name]
		t.Run(name, func(t *testing.T) {
			_, after := install(t, tc.vals, tc.cluster)
			if got := changed(data, after); !slices.Equal(got, tc.changed) {
				t.Errorf("got %v made anew, want %v", got, tc.changed)
			}
			checkChain(t, after, append(tc.names, render.Release+"."+render.Namespace+".svc")...)
		})
	}
}

// TestGeneratedCertificatesServeMTLS runs the scaler with the default values' arguments
// and the certificates the chart generated, on this machine (NATS, listen addresses and
// the mounted files moved here), and calls it as KEDA's external scaler does (its
// pkg/util/tls_config.go NewTLSConfig: the client certificate and caCert from the
// ClusterTriggerAuthentication's Secret; gRPC takes the server name from the
// scalerAddress): KEDA gets its answer, a caller without KEDA's certificate nothing.
func TestGeneratedCertificatesServeMTLS(t *testing.T) {
	def := namedCase(t, "default")
	scaler, ok := find[*appsv1.Deployment](caseObjects(t, def), render.Release)
	if !ok {
		t.Fatal("got no scaler Deployment")
	}
	_, data := install(t, nil, nil)
	dir := t.TempDir()
	for name, b := range map[string][]byte{
		"tls.crt": data[serverSecret]["tls.crt"], "tls.key": data[serverSecret]["tls.key"], "ca.crt": data[serverSecret]["ca.crt"],
		"token": []byte("a-projected-serviceaccount-token"),
	} {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	ns := startPlainNATS(t)
	grpcAddr, httpAddr := testkit.FreeAddr(t), testkit.FreeAddr(t)
	runArgs(t, scaler.Spec.Template.Spec.Containers[0], map[string]string{
		"nats-url": ns.ClientURL(), "nats-token-file": filepath.Join(dir, "token"),
		"grpc-addr": grpcAddr, "http-addr": httpAddr,
		"tls-cert": filepath.Join(dir, "tls.crt"), "tls-key": filepath.Join(dir, "tls.key"), "tls-client-ca": filepath.Join(dir, "ca.crt"),
		// Outside a pod there is no in-cluster API to watch pods on.
		"kubeconfig": "none",
	}, nil)
	waitHTTP(t, "http://"+httpAddr+"/readyz", func(string) bool { return true })

	call := func(cfg *tls.Config) error { return callScalerAsKEDA(t, grpcAddr, cfg) }
	kedaConfig := func(cert, key []byte) *tls.Config {
		cfg := &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: x509.NewCertPool()}
		cfg.RootCAs.AppendCertsFromPEM(data[clientSecret]["ca.crt"])
		if cert != nil {
			pair, err := tls.X509KeyPair(cert, key)
			if err != nil {
				t.Fatal(err)
			}
			cfg.Certificates = []tls.Certificate{pair}
		}
		return cfg
	}
	if err := call(kedaConfig(data[clientSecret]["tls.crt"], data[clientSecret]["tls.key"])); err != nil {
		t.Errorf("KEDA with the ClusterTriggerAuthentication's certificate: %v", err)
	}
	if err := call(kedaConfig(nil, nil)); err == nil {
		t.Errorf("got an answer for a caller without a client certificate, want none")
	}
	// A client certificate of another CA (a second install's) is refused too.
	_, other := install(t, nil, nil)
	if err := call(kedaConfig(other[clientSecret]["tls.crt"], other[clientSecret]["tls.key"])); err == nil {
		t.Errorf("got an answer for a client certificate of another CA, want none")
	}
}

// callScalerAsKEDA asks the scaler at grpcAddr for a trigger's metric spec over TLS with
// cfg, addressing it by the name KEDA's trigger uses (scalerAddress).
func callScalerAsKEDA(t *testing.T, grpcAddr string, cfg *tls.Config) error {
	conn, err := grpc.NewClient("passthrough:///"+grpcAddr, grpc.WithTransportCredentials(credentials.NewTLS(cfg)),
		grpc.WithAuthority(scalerAddress))
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	_, err = externalscaler.NewExternalScalerClient(conn).GetMetricSpec(ctx, &externalscaler.ScaledObjectRef{
		Name: "llm-server", Namespace: "inference", ScalerMetadata: map[string]string{"queue": "llm-requests"},
	})
	return err
}
