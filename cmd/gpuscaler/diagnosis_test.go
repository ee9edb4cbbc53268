package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/gpuscaler/gpuscaler/test/testkit"
)

// background runs the command line args until the test ends, and returns its stderr.
func background(t *testing.T, args ...string) *testkit.SyncBuffer {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	var stdout, stderr testkit.SyncBuffer
	done := make(chan int, 1)
	go func() { done <- run(ctx, args, mapEnv(nil), &stdout, &stderr) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Errorf("%s still running 10s after its context ended; stderr:\n%s", args[0], stderr.String())
		}
	})
	return &stderr
}

// logLine waits until the log has a line containing every one of want, and returns it.
func logLine(t *testing.T, log *testkit.SyncBuffer, want ...string) string {
	t.Helper()
	var found string
	has := func() bool {
	lines:
		for line := range strings.SplitSeq(log.String(), "\n") {
			for _, w := range want {
				if !strings.Contains(line, w) {
					continue lines
				}
			}
			found = line
			return true
		}
		return false
	}
	defer func() {
		if t.Failed() {
			t.Logf("no log line with all of %q; log:\n%s", want, log)
		}
	}()
	testkit.Eventually(t, 10*time.Second, has)
	return found
}

// readyz waits until the part's /readyz answers 503, and returns its body.
func readyz(t *testing.T, log *testkit.SyncBuffer) string {
	t.Helper()
	addr, ok := "", false
	testkit.Eventually(t, 10*time.Second, func() bool {
		addr, ok = logValue(log.String(), "serving metrics and probes", "httpAddr")
		return ok
	})
	resp, err := http.Get("http://" + addr + "/readyz")
	if err != nil {
		t.Fatalf("GET /readyz: %v", err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("/readyz: got %d %q, want 503", resp.StatusCode, body)
	}
	return string(body)
}

func wantAll(t *testing.T, what, got string, want ...string) {
	t.Helper()
	for _, w := range want {
		if !strings.Contains(got, w) {
			t.Errorf("%s: got %q, want it to contain %q", what, got, w)
		}
	}
}

// TestScalerCommandNamesUnreachableNATS is the issue's case: gpuscaler scaler --nats-url
// at a port where nothing listens logged only "create or update stream GPUSCALER: context
// deadline exceeded", every 11 s. It must say at once where and why, and /readyz too.
func TestScalerCommandNamesUnreachableNATS(t *testing.T) {
	url := "nats://" + testkit.FreeAddr(t)
	log := background(t, "scaler", "--nats-url", url, "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0")
	line := logLine(t, log, "cannot connect to NATS")
	wantAll(t, "log line", line, "level=WARN", "url="+url, "nothing listens there", "connection refused")
	wantAll(t, "/readyz", readyz(t, log), "not connected to NATS at "+url, "connection refused")
}

// TestCollectorCommandSaysItCannotPublish: the collector said nothing for 35 s with NATS
// unreachable. Within its interval it must say it cannot publish, and where and why.
func TestCollectorCommandSaysItCannotPublish(t *testing.T) {
	url := "nats://" + testkit.FreeAddr(t)
	log := background(t, "collector", "--source", "sim", "--sim-gpus", "1", "--kubeconfig", "none", "--node", "n1",
		"--nats-url", url, "--interval", "100ms", "--http-addr", "127.0.0.1:0")
	wantAll(t, "connect line", logLine(t, log, "cannot connect to NATS"), "url="+url, "connection refused")
	wantAll(t, "publish line", logLine(t, log, "cannot publish"), "not connected to NATS at "+url, "connection refused")
	wantAll(t, "/readyz", readyz(t, log), "not connected to NATS at "+url, "connection refused")
}

// TestScalerRefusesNATSClientFlagsWithoutURL: without --nats-url the scaler connects in
// process to its embedded server, which speaks no TLS and checks no identities. A TLS or
// credentials flag there is a mistake; its error named nats://127.0.0.1:4222, where no
// server of the scaler's was.
func TestScalerRefusesNATSClientFlagsWithoutURL(t *testing.T) {
	for _, flag := range []string{"nats-tls-ca", "nats-tls-cert", "nats-token", "nats-user", "nats-creds", "nats-token-file"} {
		t.Run(flag, func(t *testing.T) {
			r := runCLI(t.Context(), nil, "scaler", "--"+flag, "x", "--grpc-addr", "127.0.0.1:0", "--http-addr", "-",
				"--embedded-nats-addr", "127.0.0.1:0", "--data-dir", t.TempDir())
			if r.code != 2 {
				t.Fatalf("got %v, want exit 2", r)
			}
			wantAll(t, "stderr", r.stderr, "--"+flag+" needs --nats-url", "embedded NATS server", "Run 'gpuscaler scaler --help'")
			if defaultPort.MatchString(r.stderr) {
				t.Errorf("got stderr %q, want no default URL named", r.stderr)
			}
		})
	}
}

// tlsNATS starts a nats-server requiring TLS on a random port (never the default 4222),
// with a certificate from a CA the tests do not give the client.
func tlsNATS(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	cert, key := testkit.NewCA(t, "ca").IssueFiles(t, dir, "server")
	tlsConfig, err := server.GenTLSConfig(&server.TLSConfigOpts{CertFile: cert, KeyFile: key})
	if err != nil {
		t.Fatal(err)
	}
	s, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, NoSigs: true, NoLog: true, TLS: true, TLSConfig: tlsConfig})
	if err != nil {
		t.Fatal(err)
	}
	s.Start()
	t.Cleanup(s.Shutdown)
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatal("NATS not ready within 10s")
	}
	return fmt.Sprintf("tls://127.0.0.1:%d", s.Addr().(*net.TCPAddr).Port)
}

// defaultPort matches NATS's default port in an address, and not a port that merely
// starts with its digits (the test server's random one can be 42229).
var defaultPort = regexp.MustCompile(`:4222\b`)

// TestTLSErrorsNameTheURLGiven: a TLS failure against a server away from the default
// address names that server, in publish's error and in the scaler's log.
func TestTLSErrorsNameTheURLGiven(t *testing.T) {
	url := tlsNATS(t)
	t.Run("publish", func(t *testing.T) {
		r := runCLI(t.Context(), nil, "publish", "queue", "--nats-url", url, "--namespace", "ml", "--queue", "jobs", "--waiting", "1")
		if r.code != 1 {
			t.Fatalf("got %v, want exit 1", r)
		}
		wantAll(t, "stderr", r.stderr, "connect to NATS at "+url, "not trusted", "certificate signed by unknown authority")
		if defaultPort.MatchString(r.stderr) {
			t.Errorf("got stderr %q, want only %s named", r.stderr, url)
		}
	})
	t.Run("scaler", func(t *testing.T) {
		log := background(t, "scaler", "--nats-url", url, "--grpc-addr", "127.0.0.1:0", "--http-addr", "-")
		line := logLine(t, log, "cannot connect to NATS")
		wantAll(t, "log line", line, "url="+url, "not trusted", "certificate signed by unknown authority")
		if defaultPort.MatchString(line) {
			t.Errorf("got log line %q, want only %s named", line, url)
		}
	})
}
