package scaler

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"
)

// TLSConfig names the PEM files of the gRPC server's TLS. All empty means plain gRPC.
type TLSConfig struct {
	// CertFile and KeyFile are the server's certificate (chain) and key. They are read
	// again when they change on disk (cert-manager renews them in place), checked at most
	// every 10 s.
	CertFile string
	KeyFile  string
	// ClientCAFile, when set, requires clients (KEDA) to present a certificate signed by
	// one of these CAs: mutual TLS.
	ClientCAFile string
}

// serverTLS returns the tls.Config for the gRPC server, or nil for plain gRPC.
func (c TLSConfig) serverTLS() (*tls.Config, error) {
	if c.CertFile == "" && c.KeyFile == "" {
		if c.ClientCAFile != "" {
			return nil, errors.New("TLS: a client CA needs the server's certificate and key too")
		}
		return nil, nil
	}
	if c.CertFile == "" || c.KeyFile == "" {
		return nil, errors.New("TLS: give both the certificate and the key file")
	}
	r := &certReloader{certFile: c.CertFile, keyFile: c.KeyFile, checkEvery: 10 * time.Second}
	if err := r.load(); err != nil {
		return nil, err
	}
	cfg := &tls.Config{
		MinVersion:     tls.VersionTLS12,
		GetCertificate: r.getCertificate,
	}
	if c.ClientCAFile != "" {
		pem, err := os.ReadFile(c.ClientCAFile)
		if err != nil {
			return nil, fmt.Errorf("TLS client CA: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("TLS client CA %s: no PEM certificate found", c.ClientCAFile)
		}
		cfg.ClientCAs = pool
		cfg.ClientAuth = tls.RequireAndVerifyClientCert
	}
	return cfg, nil
}

// certReloader serves a certificate and key pair, reloading it when the files change.
type certReloader struct {
	certFile, keyFile string
	checkEvery        time.Duration

	mu      sync.Mutex // guards the fields below
	cert    *tls.Certificate
	modTime time.Time // the newer of the two files' modification times at the last load
	checked time.Time // when the files were last looked at
}

func (r *certReloader) load() error {
	mod, err := r.filesModTime()
	if err != nil {
		return err
	}
	cert, err := tls.LoadX509KeyPair(r.certFile, r.keyFile)
	if err != nil {
		return fmt.Errorf("TLS certificate %s with key %s: %w", r.certFile, r.keyFile, err)
	}
	r.cert, r.modTime, r.checked = &cert, mod, time.Now()
	return nil
}

func (r *certReloader) filesModTime() (time.Time, error) {
	var newest time.Time
	for _, f := range []string{r.certFile, r.keyFile} {
		st, err := os.Stat(f)
		if err != nil {
			return time.Time{}, fmt.Errorf("TLS: %w", err)
		}
		if st.ModTime().After(newest) {
			newest = st.ModTime()
		}
	}
	return newest, nil
}

// getCertificate returns the current pair. A pair that fails to load (a half-written
// renewal, say) keeps the previous one in service until the next check.
func (r *certReloader) getCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if time.Since(r.checked) >= r.checkEvery {
		r.checked = time.Now()
		if mod, err := r.filesModTime(); err == nil && !mod.Equal(r.modTime) {
			_ = r.load()
		}
	}
	return r.cert, nil
}
