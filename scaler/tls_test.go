package scaler

import (
	"crypto/tls"
	"crypto/x509"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/gpuscaler/gpuscaler/internal/natstest"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	pb "github.com/gpuscaler/gpuscaler/proto/externalscaler"
	gpuscalerv1 "github.com/gpuscaler/gpuscaler/proto/gpuscaler/v1"
	"github.com/gpuscaler/gpuscaler/test/testkit"
)

// TestMutualTLS serves gRPC with a server certificate and a client CA, as a
// TriggerAuthentication's caCert/tlsClientCert/tlsClientKey would be used by KEDA.
func TestMutualTLS(t *testing.T) {
	dir := t.TempDir()
	ca, otherCA := testkit.NewCA(t, "ca"), testkit.NewCA(t, "other-ca")
	serverCert, serverKey := ca.Issue(t, "gpuscaler", 2)
	clientCert, clientKey := ca.Issue(t, "keda-operator", 3)
	strangerCert, strangerKey := otherCA.Issue(t, "stranger", 4)
	ns := natstest.Start(t, "", "")
	s := startScaler(t, ns.ClientURL(), Config{TLS: TLSConfig{
		CertFile:     testkit.WriteFile(t, dir, "tls.crt", serverCert),
		KeyFile:      testkit.WriteFile(t, dir, "tls.key", serverKey),
		ClientCAFile: testkit.WriteFile(t, dir, "ca.crt", ca.PEM),
	}})

	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca.PEM)
	pair := func(c, k []byte) []tls.Certificate {
		p, err := tls.X509KeyPair(c, k)
		if err != nil {
			t.Fatal(err)
		}
		return []tls.Certificate{p}
	}
	tests := map[string]struct {
		creds  credentials.TransportCredentials
		wantOK bool
	}{
		"client certificate from the CA":   {creds: credentials.NewTLS(&tls.Config{RootCAs: pool, Certificates: pair(clientCert, clientKey)}), wantOK: true},
		"no client certificate":            {creds: credentials.NewTLS(&tls.Config{RootCAs: pool})},
		"client certificate of another CA": {creds: credentials.NewTLS(&tls.Config{RootCAs: pool, Certificates: pair(strangerCert, strangerKey)})},
		"plain text":                       {creds: insecure.NewCredentials()},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			conn := dial(t, s.GRPCAddr().String(), grpc.WithTransportCredentials(tc.creds))
			_, err := pb.NewExternalScalerClient(conn).GetMetricSpec(t.Context(), ref("ml", "llm", map[string]string{"queue": "jobs"}))
			if (err == nil) != tc.wantOK {
				t.Fatalf("GetMetricSpec error = %v, want success %v", err, tc.wantOK)
			}
			// Explain is served under the same TLS: whoever may not ask KEDA's questions
			// may not ask it either.
			_, err = gpuscalerv1.NewExplainerClient(conn).Explain(t.Context(), &gpuscalerv1.ExplainRequest{Namespace: "ml", Metadata: map[string]string{"queue": "jobs"}})
			if (err == nil) != tc.wantOK {
				t.Fatalf("Explain error = %v, want success %v", err, tc.wantOK)
			}
		})
	}
}

func TestTLSConfigErrors(t *testing.T) {
	dir := t.TempDir()
	ca := testkit.NewCA(t, "ca")
	cert, key := ca.Issue(t, "gpuscaler", 2)
	certFile, keyFile := testkit.WriteFile(t, dir, "tls.crt", cert), testkit.WriteFile(t, dir, "tls.key", key)
	garbage := testkit.WriteFile(t, dir, "garbage.pem", []byte("not pem"))
	tests := map[string]TLSConfig{
		"cert without key":        {CertFile: certFile},
		"key without cert":        {KeyFile: keyFile},
		"client CA without cert":  {ClientCAFile: certFile},
		"missing cert file":       {CertFile: filepath.Join(dir, "absent"), KeyFile: keyFile},
		"cert and key mismatched": {CertFile: keyFile, KeyFile: certFile},
		"client CA not PEM":       {CertFile: certFile, KeyFile: keyFile, ClientCAFile: garbage},
	}
	for name, cfg := range tests {
		t.Run(name, func(t *testing.T) {
			if _, err := cfg.serverTLS(); err == nil {
				t.Fatalf("serverTLS(%+v) = nil error, want one", cfg)
			}
		})
	}
	if c, err := (TLSConfig{}).serverTLS(); c != nil || err != nil {
		t.Fatalf("empty TLSConfig = %v, %v; want plain gRPC (nil, nil)", c, err)
	}
}

// TestCertReload checks a renewed certificate on disk is served without a restart, and a
// half-written one keeps the old one in service.
func TestCertReload(t *testing.T) {
	dir := t.TempDir()
	ca := testkit.NewCA(t, "ca")
	cert1, key1 := ca.Issue(t, "gpuscaler", 10)
	certFile, keyFile := testkit.WriteFile(t, dir, "tls.crt", cert1), testkit.WriteFile(t, dir, "tls.key", key1)
	r := &certReloader{certFile: certFile, keyFile: keyFile} // checkEvery 0: look on every handshake
	if err := r.load(); err != nil {
		t.Fatal(err)
	}
	serial := func() int64 {
		c, err := r.getCertificate(nil)
		if err != nil {
			t.Fatal(err)
		}
		leaf, _ := x509.ParseCertificate(c.Certificate[0])
		return leaf.SerialNumber.Int64()
	}
	if got := serial(); got != 10 {
		t.Fatalf("serial = %d, want 10", got)
	}

	cert2, key2 := ca.Issue(t, "gpuscaler", 11)
	later := time.Now().Add(time.Minute)
	testkit.WriteFile(t, dir, "tls.crt", cert2)
	testkit.WriteFile(t, dir, "tls.key", key2)
	_ = os.Chtimes(certFile, later, later)
	if got := serial(); got != 11 {
		t.Fatalf("serial after renewal = %d, want 11", got)
	}

	testkit.WriteFile(t, dir, "tls.crt", []byte("half written"))
	_ = os.Chtimes(certFile, later.Add(time.Minute), later.Add(time.Minute))
	if got := serial(); got != 11 {
		t.Fatalf("serial after a broken renewal = %d, want the previous 11", got)
	}
}
