package cluster

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// CalloutBus is a nats-server whose clients gpuscaler's auth callout admits, configured
// as the chart configures its bundled NATS (deploy/helm/gpuscaler/templates/_nats.tpl):
// the issuer's public key from `gpuscaler auth-callout issuer-key`, the callout's own
// user in account AUTH, admitted clients in account GPUSCALER.
type CalloutBus struct {
	NATS    *NATS
	Callout *Process
	// HTTPAddr serves the callout's /metrics and /readyz.
	HTTPAddr string
}

// CalloutOptions configure StartCalloutBus.
type CalloutOptions struct {
	NATSBin, GpuscalerBin string
	// Dir holds the configuration, the issuer seed and the store.
	Dir string
	// Kubeconfig is the callout's own credentials for TokenReview.
	Kubeconfig string
	// Flags are more flags for gpuscaler auth-callout (identities, audience).
	Flags []string
}

// StartCalloutBus starts nats-server with auth callout, then `gpuscaler auth-callout`,
// and waits until the callout answers.
func StartCalloutBus(ctx context.Context, ps *Procs, o CalloutOptions) (*CalloutBus, error) {
	if err := os.MkdirAll(o.Dir, 0o755); err != nil {
		return nil, err
	}
	secret := make([]byte, 32)
	rand.Read(secret)
	seed := filepath.Join(o.Dir, "issuer.seed")
	if err := os.WriteFile(seed, []byte(hex.EncodeToString(secret)), 0o600); err != nil {
		return nil, err
	}
	// What the chart's init container runs.
	issuerFile := filepath.Join(o.Dir, "issuer.pub")
	if err := run(ctx, o.Dir, o.GpuscalerBin, "auth-callout", "issuer-key", "--issuer-seed-file", seed, "--out", issuerFile); err != nil {
		return nil, err
	}
	issuer, err := os.ReadFile(issuerFile)
	if err != nil {
		return nil, err
	}
	password := hex.EncodeToString(secret[:8])

	port, err := FreePort()
	if err != nil {
		return nil, err
	}
	mon, err := FreePort()
	if err != nil {
		return nil, err
	}
	conf := filepath.Join(o.Dir, "nats.conf")
	err = os.WriteFile(conf, []byte(fmt.Sprintf(`listen: 127.0.0.1:%d
http: 127.0.0.1:%d
server_name: e2e-callout
jetstream { store_dir: %q }
accounts {
  AUTH { users: [ { user: callout, password: $CALLOUT_PASSWORD } ] }
  GPUSCALER { jetstream: enabled }
  SYS { }
}
system_account: SYS
authorization {
  auth_callout {
    issuer: $CALLOUT_ISSUER
    auth_users: [ callout ]
    account: AUTH
  }
}
`, port, mon, filepath.Join(o.Dir, "store"))), 0o600)
	if err != nil {
		return nil, err
	}
	b := &CalloutBus{NATS: &NATS{URL: "nats://127.0.0.1:" + strconv.Itoa(port), MonitorAddr: "127.0.0.1:" + strconv.Itoa(mon)}}
	b.NATS.Server, err = ps.Start("nats-server-callout", o.NATSBin, []string{"-c", conf},
		"CALLOUT_ISSUER="+strings.TrimSpace(string(issuer)), "CALLOUT_PASSWORD="+password)
	if err != nil {
		return nil, err
	}
	if err := waitHTTPOK(ctx, time.Minute, 100*time.Millisecond, "nats-server (auth callout) healthy", b.NATS.Server, "http://"+b.NATS.MonitorAddr+"/healthz"); err != nil {
		return nil, err
	}
	if b.HTTPAddr, err = FreeAddr(); err != nil {
		return nil, err
	}
	args := append([]string{"auth-callout",
		"--issuer-seed-file=" + seed,
		"--kubeconfig=" + o.Kubeconfig,
		"--nats-url=" + b.NATS.URL, "--nats-user=callout",
		"--http-addr=" + b.HTTPAddr,
		"--log-level=debug",
	}, o.Flags...)
	b.Callout, err = ps.Start("gpuscaler-auth-callout", o.GpuscalerBin, args, "GPUSCALER_NATS_PASSWORD="+password)
	if err != nil {
		return nil, err
	}
	if err := waitHTTPOK(ctx, time.Minute, 100*time.Millisecond, "gpuscaler auth-callout ready", b.Callout, "http://"+b.HTTPAddr+"/readyz"); err != nil {
		return nil, err
	}
	return b, nil
}

// WriteTokenKubeconfig writes a kubeconfig for the API server at host that
// authenticates with token: a ServiceAccount's own credentials.
func WriteTokenKubeconfig(path string, cp *ControlPlane, token string) error {
	return writeKubeconfig(path, cp.Host, cp.CA.CertPEM, token)
}
