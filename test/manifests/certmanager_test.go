package manifests

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"path/filepath"
	"strings"
	"testing"
	"time"

	kedav1alpha1 "github.com/kedacore/keda/v2/apis/keda/v1alpha1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/gpuscaler/gpuscaler/deploy/render"
	"github.com/gpuscaler/gpuscaler/test/testkit"
)

// TestCertManagerCertificatesServeMTLS runs the scaler as the cert-manager case wires it,
// with the two CAs the chart generated on a first install and the two certificates
// signed here as cert-manager's CA Issuers would sign them (the Issuer named by each
// Certificate, with the key pair of the Secret that Issuer names; ca.crt the CA's
// certificate, as pkg/issuer/ca writes it). Every file comes from where the Deployment
// mounts it, and KEDA's side from the ClusterTriggerAuthentication's Secrets, so the test
// follows the wiring rather than restating it. KEDA gets its answer; a client certificate
// from the server CA (what any Certificate in the release's namespace would get) is
// refused by the scaler; a serving certificate from the client CA (what any Certificate in
// KEDA's namespace would get) is refused by KEDA's caCert.
func TestCertManagerCertificatesServeMTLS(t *testing.T) {
	c := namedCase(t, "cert-manager")
	vals, err := render.CaseValues(root(t), c)
	if err != nil {
		t.Fatal(err)
	}
	out, err := render.RenderWith(filepath.Join(root(t), render.ChartDir), vals, render.Options{APIVersions: c.APIVersions})
	if err != nil {
		t.Fatal(err)
	}
	objs, err := DecodeAll(c.Name, []byte(out))
	if err != nil {
		t.Fatal(err)
	}
	kedaNS := kedaNamespace(t, c)

	// The cluster after cert-manager has issued: every rendered Secret, and each
	// Certificate's Secret signed by its Issuer's CA.
	secrets := map[string]map[string][]byte{}
	for _, s := range all[*corev1.Secret](objs) {
		secrets[s.Namespace+"/"+s.Name] = s.Data
	}
	issuers := map[string]*Issuer{}
	for _, i := range all[*Issuer](objs) {
		issuers[i.Namespace+"/"+i.Name] = i
	}
	caOf := map[string]tls.Certificate{} // Certificate namespace/name → its CA
	for _, cert := range all[*Certificate](objs) {
		iss := issuers[cert.Namespace+"/"+cert.Spec.IssuerRef.Name]
		if cert.Spec.IssuerRef.Kind != "Issuer" || iss == nil || iss.Spec.CA == nil {
			t.Fatalf("Certificate %s/%s: got issuer %+v, want a CA Issuer of its namespace", cert.Namespace, cert.Name, cert.Spec.IssuerRef)
		}
		ca := keyPair(t, secrets[cert.Namespace+"/"+iss.Spec.CA.SecretName])
		crt, key := signLeaf(t, ca, cert.Spec.CommonName, cert.Spec.DNSNames, cert.Spec.Usages)
		secrets[cert.Namespace+"/"+cert.Spec.SecretName] = map[string][]byte{"tls.crt": crt, "tls.key": key, "ca.crt": secrets[cert.Namespace+"/"+iss.Spec.CA.SecretName]["tls.crt"]}
		caOf[cert.Namespace+"/"+cert.Name] = ca
	}

	scaler, ok := find[*appsv1.Deployment](objs, render.Release)
	if !ok {
		t.Fatal("got no scaler Deployment")
	}
	pod := scaler.Spec.Template.Spec
	ctr := pod.Containers[0]
	dir := t.TempDir()
	moved := map[string]string{}
	for _, f := range []string{"tls-cert", "tls-key", "tls-client-ca"} {
		name, key, _ := strings.Cut(secretFile(t, pod, ctr, flagValue(ctr.Args, f)), "/")
		data := secrets[render.Namespace+"/"+name][key]
		if len(data) == 0 {
			t.Fatalf("--%s: got nothing in Secret %s/%s key %s", f, render.Namespace, name, key)
		}
		moved[f] = testkit.WriteFile(t, dir, f, data)
	}
	ns := startPlainNATS(t)
	grpcAddr, httpAddr := testkit.FreeAddr(t), testkit.FreeAddr(t)
	moved["nats-url"], moved["grpc-addr"], moved["http-addr"] = ns.ClientURL(), grpcAddr, httpAddr
	moved["nats-token-file"] = testkit.WriteFile(t, dir, "token", []byte("a-projected-serviceaccount-token"))
	moved["stream-replicas"] = "1" // the case's NATS is a cluster of three; this one is not
	moved["nats-tls-ca"] = ""      // and serves TLS (its static users need it); this one does not
	moved["kubeconfig"] = "none"   // outside a pod there is no in-cluster API to watch pods on
	runArgs(t, ctr, moved, nil)
	waitHTTP(t, "http://"+httpAddr+"/readyz", func(string) bool { return true })

	// KEDA's side: the ClusterTriggerAuthentication's parameters, from KEDA's namespace.
	cta, ok := find[*kedav1alpha1.ClusterTriggerAuthentication](objs, "")
	if !ok {
		t.Fatal("got no ClusterTriggerAuthentication")
	}
	param := map[string][]byte{}
	for _, r := range cta.Spec.SecretTargetRef {
		param[r.Parameter] = secrets[kedaNS+"/"+r.Name][r.Key]
	}
	call := func(roots []byte, cert, key []byte) error {
		cfg := &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: x509.NewCertPool()}
		cfg.RootCAs.AppendCertsFromPEM(roots)
		pair, err := tls.X509KeyPair(cert, key)
		if err != nil {
			t.Fatal(err)
		}
		cfg.Certificates = []tls.Certificate{pair}
		return callScalerAsKEDA(t, grpcAddr, cfg)
	}
	if err := call(param["caCert"], param["tlsClientCert"], param["tlsClientKey"]); err != nil {
		t.Errorf("KEDA with the ClusterTriggerAuthentication's certificate: %v", err)
	}
	serverCA := caOf[render.Namespace+"/"+render.Release+"-grpc"]
	clientCA := caOf[kedaNS+"/"+render.Release+"-keda-client"]
	crt, key := signLeaf(t, serverCA, "keda-operator", nil, []string{"client auth"})
	if err := call(param["caCert"], crt, key); err == nil {
		t.Error("got an answer for a client certificate from the server CA, want none: a Certificate in the release's namespace would mint one")
	}
	// KEDA verifies the scaler with caCert: a serving certificate for the scaler's names
	// from the client CA fails that check.
	names := []string{strings.Split(scalerAddress, ":")[0]}
	crt, _ = signLeaf(t, clientCA, names[0], names, []string{"server auth"})
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(param["caCert"])
	block, _ := pem.Decode(crt)
	leaf, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := leaf.Verify(x509.VerifyOptions{DNSName: names[0], Roots: roots}); err == nil {
		t.Error("KEDA's caCert verifies a serving certificate from the client CA, want not: a Certificate in KEDA's namespace would mint one")
	}
}

// keyPair reads a CA Issuer's Secret (tls.crt, tls.key).
func keyPair(t *testing.T, data map[string][]byte) tls.Certificate {
	t.Helper()
	pair, err := tls.X509KeyPair(data["tls.crt"], data["tls.key"])
	if err != nil {
		t.Fatalf("CA key pair: %v", err)
	}
	return pair
}

// signLeaf signs an ECDSA P-256 certificate with ca, as cert-manager's CA issuer does
// for a Certificate with these commonName, dnsNames and usages.
func signLeaf(t *testing.T, ca tls.Certificate, cn string, dnsNames, usages []string) (crtPEM, keyPEM []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()),
		Subject:      pkix.Name{CommonName: cn},
		DNSNames:     dnsNames,
		NotBefore:    time.Now().Add(-time.Minute),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
	}
	for _, u := range usages {
		switch u {
		case "server auth":
			tmpl.ExtKeyUsage = append(tmpl.ExtKeyUsage, x509.ExtKeyUsageServerAuth)
		case "client auth":
			tmpl.ExtKeyUsage = append(tmpl.ExtKeyUsage, x509.ExtKeyUsageClientAuth)
		default:
			t.Fatalf("usage %q: not one this test signs", u)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Leaf, &key.PublicKey, ca.PrivateKey)
	if err != nil {
		t.Fatal(err)
	}
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb})
}

// TestCertManagerNeverAClusterIssuer renders the cert-manager path with the values that
// change what it makes (true rather than auto, no ClusterTriggerAuthentication, KEDA in
// the release's own namespace, another release name): never a ClusterIssuer, and every
// Issuer and Certificate in the release's namespace or KEDA's, each Certificate naming an
// Issuer of its own namespace (the only kind cert-manager resolves there).
func TestCertManagerNeverAClusterIssuer(t *testing.T) {
	certManager := func(extra map[string]any) map[string]any {
		vals := map[string]any{"scaler": map[string]any{"tls": map[string]any{"certManager": map[string]any{"enabled": true}}}}
		for k, v := range extra {
			vals[k] = v
		}
		return vals
	}
	cases := map[string]struct {
		vals    map[string]any
		release string
		kedaNS  string
	}{
		"enabled true":                    {vals: certManager(nil), kedaNS: "keda"},
		"no ClusterTriggerAuthentication": {vals: certManager(map[string]any{"keda": map[string]any{"clusterTriggerAuthentication": map[string]any{"enabled": false}}}), kedaNS: "keda"},
		"KEDA in the release's namespace": {vals: certManager(map[string]any{"keda": map[string]any{"namespace": render.Namespace}}), kedaNS: render.Namespace},
		"another release, KEDA elsewhere": {vals: certManager(map[string]any{"keda": map[string]any{"namespace": "autoscaling"}}), release: "gpu", kedaNS: "autoscaling"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			out, err := render.RenderWith(filepath.Join(root(t), render.ChartDir), tc.vals, render.Options{Release: tc.release})
			if err != nil {
				t.Fatal(err)
			}
			objs, err := DecodeAll(name, []byte(out))
			if err != nil {
				t.Fatal(err)
			}
			for _, ci := range all[*ClusterIssuer](objs) {
				t.Errorf("got ClusterIssuer %s", ci.Name)
			}
			home := map[string]bool{render.Namespace: true, tc.kedaNS: true}
			issuers := map[string]bool{}
			for _, i := range all[*Issuer](objs) {
				if !home[i.Namespace] {
					t.Errorf("got Issuer %s/%s, want it in %s or %s", i.Namespace, i.Name, render.Namespace, tc.kedaNS)
				}
				issuers[i.Namespace+"/"+i.Name] = true
			}
			if len(issuers) != 2 {
				t.Errorf("got Issuers %v, want two: the server CA's and the client CA's", issuers)
			}
			certs := all[*Certificate](objs)
			if len(certs) == 0 {
				t.Fatal("got no Certificate: the cert-manager path was not rendered")
			}
			for _, c := range certs {
				if !home[c.Namespace] || c.Spec.IssuerRef.Kind != "Issuer" || !issuers[c.Namespace+"/"+c.Spec.IssuerRef.Name] {
					t.Errorf("got Certificate %s/%s from %+v, want an Issuer of the chart in its own namespace", c.Namespace, c.Name, c.Spec.IssuerRef)
				}
			}
		})
	}
}
