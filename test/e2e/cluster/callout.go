package cluster

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"sigs.k8s.io/yaml"
)

// CalloutBus is a nats-server whose clients gpuscaler's auth callout admits, running the
// configuration the chart renders for its bundled NATS (ChartNATSConfig): the issuer's
// public key from `gpuscaler auth-callout issuer-key`, the callout's own user in account
// AUTH, admitted clients in their role's account.
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
	// RepoRoot is the repository, whose committed rendering of the chart
	// (deploy/manifests/gpuscaler.yaml) holds the NATS configuration.
	RepoRoot string
	// Kubeconfig is the callout's own credentials for TokenReview.
	Kubeconfig string
	// Flags are more flags for gpuscaler auth-callout (identities, audience).
	Flags []string
	// JetStreamNamespaces get accounts of their own with JetStream: the callout is given
	// them, and the server the accounts `gpuscaler auth-callout nats-config` prints for
	// them (test/manifests checks the chart renders the same for its
	// nats.auth.kubernetes.jetStreamNamespaces).
	JetStreamNamespaces []string
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
	chartConf, err := ChartNATSConfig(o.RepoRoot)
	if err != nil {
		return nil, err
	}
	flags := o.Flags
	if len(o.JetStreamNamespaces) > 0 {
		list := "--jetstream-namespaces=" + strings.Join(o.JetStreamNamespaces, ",")
		accounts, err := exec.CommandContext(ctx, o.GpuscalerBin, "auth-callout", "nats-config", list).Output()
		if err != nil {
			return nil, fmt.Errorf("gpuscaler auth-callout nats-config: %w", err)
		}
		chartConf += "\n# e2e: the accounts of the namespaces with JetStream.\n" + string(accounts)
		flags = append(slices.Clone(flags), list)
	}
	// The chart's configuration, then what differs on loopback: the same keys again,
	// which nats-server's parser lets the later one win.
	conf := filepath.Join(o.Dir, "nats.conf")
	err = os.WriteFile(conf, []byte(chartConf+fmt.Sprintf(`
# e2e: on loopback, in the run's folder.
host: 127.0.0.1
port: %d
http_port: %d
pid_file: %q
jetstream { store_dir: %q }
`, port, mon, filepath.Join(o.Dir, "nats.pid"), filepath.Join(o.Dir, "store"))), 0o600)
	if err != nil {
		return nil, err
	}
	b := &CalloutBus{NATS: &NATS{URL: "nats://127.0.0.1:" + strconv.Itoa(port), MonitorAddr: "127.0.0.1:" + strconv.Itoa(mon)}}
	b.NATS.Server, err = ps.Start("nats-server-callout", o.NATSBin, []string{"-c", conf}, "POD_NAME=e2e-callout",
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
	}, flags...)
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

// ChartNATSConfig returns the bundled NATS server's configuration as the chart renders it
// by default: the nats.conf of ConfigMap gpuscaler-nats in deploy/manifests/gpuscaler.yaml,
// which deploy/render.sh --check keeps current with the chart.
func ChartNATSConfig(repoRoot string) (string, error) {
	path := filepath.Join(repoRoot, "deploy", "manifests", "gpuscaler.yaml")
	data, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	for doc := range strings.SplitSeq(string(data), "\n---\n") {
		var obj struct {
			Kind     string
			Metadata struct{ Name string }
			Data     map[string]string
		}
		if err := yaml.Unmarshal([]byte(doc), &obj); err != nil {
			return "", fmt.Errorf("%s: %w", path, err)
		}
		if obj.Kind == "ConfigMap" && obj.Metadata.Name == "gpuscaler-nats" && obj.Data["nats.conf"] != "" {
			return obj.Data["nats.conf"], nil
		}
	}
	return "", fmt.Errorf("%s: no ConfigMap gpuscaler-nats with a nats.conf", path)
}
