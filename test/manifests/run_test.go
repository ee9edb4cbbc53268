package manifests

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/gpuscaler/gpuscaler/deploy/render"
	"github.com/gpuscaler/gpuscaler/test/testkit"
)

// TestSimManifestRuns runs the scaler and a collector with exactly the arguments the
// published sim manifest (deploy/manifests/gpuscaler-sim.yaml) gives them, on this
// machine: only the NATS URL, the listen addresses and the mounted files' paths are
// moved here. The collector's simulated GPUs must reach the scaler's state.
func TestSimManifestRuns(t *testing.T) {
	sim := namedCase(t, "sim")
	objs := caseObjects(t, sim)
	scaler, _ := find[*appsv1.Deployment](objs, render.Release)
	collector, ok := find[*appsv1.DaemonSet](objs, "")
	if scaler == nil || !ok {
		t.Fatal("got no scaler Deployment or collector DaemonSet")
	}
	simConfig, ok := find[*corev1.ConfigMap](objs, render.Release+"-collector-sim")
	if !ok {
		t.Fatal("got no sim ConfigMap")
	}
	confPath := filepath.Join(t.TempDir(), "sim.yaml")
	if err := os.WriteFile(confPath, []byte(simConfig.Data["sim.yaml"]), 0o600); err != nil {
		t.Fatal(err)
	}

	ns := startPlainNATS(t)

	// The pods' mounted files, made here: certificates for the scaler's gRPC TLS, and a
	// ServiceAccount token (this NATS has no auth, so it admits any).
	tlsDir := t.TempDir()
	writeTestCerts(t, tlsDir)
	tokenPath := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenPath, []byte("a-projected-serviceaccount-token"), 0o600); err != nil {
		t.Fatal(err)
	}
	scalerHTTP := testkit.FreeAddr(t)
	moved := map[string]string{
		"nats-url":        ns.ClientURL(),
		"nats-token-file": tokenPath,
		"grpc-addr":       testkit.FreeAddr(t),
		"http-addr":       scalerHTTP,
		"sim-config":      confPath,
		"tls-cert":        filepath.Join(tlsDir, "tls.crt"),
		"tls-key":         filepath.Join(tlsDir, "tls.key"),
		"tls-client-ca":   filepath.Join(tlsDir, "ca.crt"),
	}
	runArgs(t, scaler.Spec.Template.Spec.Containers[0], moved, nil)
	waitHTTP(t, "http://"+scalerHTTP+"/readyz", func(string) bool { return true })

	collectorHTTP := testkit.FreeAddr(t)
	moved["http-addr"] = collectorHTTP
	runArgs(t, collector.Spec.Template.Spec.Containers[0], moved, []string{"NODE_NAME=kind-worker", "POD_NAME=gpuscaler-collector-abcde"})
	waitHTTP(t, "http://"+collectorHTTP+"/readyz", func(string) bool { return true })

	// The ConfigMap's node has 4 GPUs; the scaler holds them once the first report lands.
	waitHTTP(t, "http://"+scalerHTTP+"/metrics", func(body string) bool {
		return strings.Contains(body, `gpuscaler_scaler_state_entries{kind="gpu"} 4`)
	})
}

// runArgs starts the gpuscaler binary with a container's args, each --flag in moved
// given the value there instead, and the given environment.
func runArgs(t *testing.T, ctr corev1.Container, moved map[string]string, env []string) {
	t.Helper()
	var args []string
	for _, a := range ctr.Args {
		name, _, _ := strings.Cut(strings.TrimPrefix(a, "--"), "=")
		if v, ok := moved[name]; ok && strings.HasPrefix(a, "--") {
			a = "--" + name + "=" + v
		}
		args = append(args, a)
	}
	var out testkit.SyncBuffer
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, gpuscalerBinary(t), args...)
	cmd.Env = append(cleanEnv(), env...)
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.Cancel = func() error { return cmd.Process.Signal(os.Interrupt) }
	cmd.WaitDelay = 10 * time.Second
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		cancel()
		<-done
		if t.Failed() {
			t.Logf("gpuscaler %s:\n%s", strings.Join(args, " "), out.String())
		}
	})
}

// waitHTTP polls url until it answers 200 with a body ok accepts, for up to 30 s.
func waitHTTP(t *testing.T, url string, ok func(body string) bool) {
	t.Helper()
	testkit.Eventually(t, 30*time.Second, func(ctx context.Context) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK || !ok(string(b)) {
			return fmt.Errorf("GET %s: %s\n%.2000s", url, resp.Status, b)
		}
		return nil
	})
}

// startPlainNATS starts an in-process nats-server with JetStream and no auth, for the
// chart's binaries run outside their pods, and stops it at cleanup.
func startPlainNATS(t *testing.T) *server.Server {
	t.Helper()
	ns, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: t.TempDir(), NoSigs: true})
	if err != nil {
		t.Fatal(err)
	}
	go ns.Start()
	t.Cleanup(ns.Shutdown)
	if !ns.ReadyForConnections(10 * time.Second) {
		t.Fatal("NATS not ready")
	}
	return ns
}

// namedCase returns the render case called name.
func namedCase(t *testing.T, name string) render.Case {
	t.Helper()
	for _, c := range render.Cases {
		if c.Name == name {
			return c
		}
	}
	t.Fatalf("deploy/render has no case %q", name)
	return render.Case{}
}
