package scaler

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	pb "github.com/gpuscaler/gpuscaler/proto/externalscaler"
)

// testCA issues certificates for tests.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

func newTestCA(t *testing.T) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "gpuscaler test CA"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IsCA:                  true,
		KeyUsage:              x509.KeyUsageCertSign,
		BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	return &testCA{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// issue returns a PEM certificate and key for name, usable by servers and clients.
func (ca *testCA) issue(t *testing.T, name string, serial int64) (certPEM, keyPEM []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serial),
		Subject:      pkix.Name{CommonName: name},
		DNSNames:     []string{name, "localhost"},
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1")},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, _ := x509.MarshalECPrivateKey(key)
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})
}

func writeFile(t *testing.T, dir, name string, data []byte) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestMutualTLS serves gRPC with a server certificate and a client CA, as a
// TriggerAuthentication's caCert/tlsClientCert/tlsClientKey would be used by KEDA.
func TestMutualTLS(t *testing.T) {
	dir := t.TempDir()
	ca, otherCA := newTestCA(t), newTestCA(t)
	serverCert, serverKey := ca.issue(t, "gpuscaler", 2)
	clientCert, clientKey := ca.issue(t, "keda-operator", 3)
	strangerCert, strangerKey := otherCA.issue(t, "stranger", 4)
	ns := startNATS(t, "", "")
	s := startScaler(t, ns.ClientURL(), Config{TLS: TLSConfig{
		CertFile:     writeFile(t, dir, "tls.crt", serverCert),
		KeyFile:      writeFile(t, dir, "tls.key", serverKey),
		ClientCAFile: writeFile(t, dir, "ca.crt", ca.pem),
	}})

	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca.pem)
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
		})
	}
}

func TestTLSConfigErrors(t *testing.T) {
	dir := t.TempDir()
	ca := newTestCA(t)
	cert, key := ca.issue(t, "gpuscaler", 2)
	certFile, keyFile := writeFile(t, dir, "tls.crt", cert), writeFile(t, dir, "tls.key", key)
	garbage := writeFile(t, dir, "garbage.pem", []byte("not pem"))
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
	ca := newTestCA(t)
	cert1, key1 := ca.issue(t, "gpuscaler", 10)
	certFile, keyFile := writeFile(t, dir, "tls.crt", cert1), writeFile(t, dir, "tls.key", key1)
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

	cert2, key2 := ca.issue(t, "gpuscaler", 11)
	later := time.Now().Add(time.Minute)
	writeFile(t, dir, "tls.crt", cert2)
	writeFile(t, dir, "tls.key", key2)
	_ = os.Chtimes(certFile, later, later)
	if got := serial(); got != 11 {
		t.Fatalf("serial after renewal = %d, want 11", got)
	}

	writeFile(t, dir, "tls.crt", []byte("half written"))
	_ = os.Chtimes(certFile, later.Add(time.Minute), later.Add(time.Minute))
	if got := serial(); got != 11 {
		t.Fatalf("serial after a broken renewal = %d, want the previous 11", got)
	}
}
