package testkit

import (
	"crypto/tls"
	"crypto/x509"
	"testing"
)

// TestIssuedCertificatesVerify: a certificate Issue gives verifies against its CA for the
// names it promises (name, localhost, 127.0.0.1), as a server and as a client.
func TestIssuedCertificatesVerify(t *testing.T) {
	ca := NewCA(t, "test-ca")
	certPEM, keyPEM := ca.Issue(t, "scaler", 0)
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca.Cert)
	for _, name := range []string{"scaler", "localhost", "127.0.0.1"} {
		for _, usage := range []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth} {
			if _, err := leaf.Verify(x509.VerifyOptions{DNSName: name, Roots: roots, KeyUsages: []x509.ExtKeyUsage{usage}}); err != nil {
				t.Errorf("%s for usage %v: %v", name, usage, err)
			}
		}
	}
	if _, err := leaf.Verify(x509.VerifyOptions{DNSName: "other", Roots: roots}); err == nil {
		t.Error("verified for a name it was not issued for")
	}
}
