package natsconn

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/gpuscaler/gpuscaler/test/testkit"
)

// failureMsg begins the line a failed attempt to connect logs.
const failureMsg = `msg="cannot connect to NATS; retrying`

// deadURL is a nats:// URL of a loopback port that was listened on, then closed:
// nothing listens there, and a dial is refused at once.
func deadURL(t *testing.T) string {
	return "nats://" + testkit.FreeAddr(t)
}

// retrying connects to url as long-running parts do, logging into the returned buffer,
// and closes the connection at cleanup.
func retrying(t *testing.T, opts Options) (*Conn, *testkit.SyncBuffer) {
	t.Helper()
	log, buf := testkit.BufferLogger()
	opts.RetryInitialConnect, opts.Log = true, log
	c, err := Connect(t.Context(), opts)
	if err != nil {
		t.Fatalf("got error %v with RetryInitialConnect, want a connection that retries", err)
	}
	t.Cleanup(c.Close)
	return c, buf
}

// failureLines returns the lines of log about failed attempts.
func failureLines(log string) []string {
	var out []string
	for line := range strings.SplitSeq(log, "\n") {
		if strings.Contains(line, failureMsg) {
			out = append(out, line)
		}
	}
	return out
}

// waitForFailure waits until the log has a failed attempt, and returns the first line.
func waitForFailure(t *testing.T, buf *testkit.SyncBuffer) string {
	t.Helper()
	testkit.Eventually(t, 10*time.Second, func() bool { return len(failureLines(buf.String())) > 0 })
	return failureLines(buf.String())[0]
}

func wantContains(t *testing.T, what, got string, want ...string) {
	t.Helper()
	for _, w := range want {
		if !strings.Contains(got, w) {
			t.Errorf("%s: got %q, want it to contain %q", what, got, w)
		}
	}
}

// TestFailedConnectNamesURLAndCause starts real servers that each refuse the client in
// one way, and checks the first failed attempt is logged at once (a retried first
// connect logged nothing before) with the URL, credentials hidden, and the real cause;
// and that Problem says the same.
func TestFailedConnectNamesURLAndCause(t *testing.T) {
	dir := t.TempDir()
	ca, otherCA := testkit.NewCA(t, "ca"), testkit.NewCA(t, "other-ca")
	caFile := testkit.WriteFile(t, dir, "ca.pem", ca.PEM)
	otherCAFile := testkit.WriteFile(t, dir, "other-ca.pem", otherCA.PEM)
	serverCert, serverKey := ca.IssueFiles(t, dir, "server")
	tlsConfig, err := server.GenTLSConfig(&server.TLSConfigOpts{CertFile: serverCert, KeyFile: serverKey})
	if err != nil {
		t.Fatalf("server TLS config: %v", err)
	}
	tlsServer := authServer(t, &server.Options{TLS: true, TLSConfig: tlsConfig})
	mutualConfig, err := server.GenTLSConfig(&server.TLSConfigOpts{CertFile: serverCert, KeyFile: serverKey, CaFile: caFile, Verify: true})
	if err != nil {
		t.Fatalf("server TLS config: %v", err)
	}
	mutualServer := authServer(t, &server.Options{TLS: true, TLSConfig: mutualConfig, TLSVerify: true})
	tokenServer := authServer(t, &server.Options{Authorization: "s3cret"})
	dead := deadURL(t)
	deadAddr := strings.TrimPrefix(dead, "nats://")

	tests := map[string]struct {
		opts    Options
		url     string // the URL the log must name
		reason  string
		err     []string
		is      error
		secrets []string
	}{
		"connection refused": {
			opts:   Options{URLs: dead},
			url:    dead,
			reason: "nothing listens there",
			err:    []string{"connection refused", deadAddr},
			is:     syscall.ECONNREFUSED,
		},
		"connection refused, credentials in the URL": {
			opts:    Options{URLs: "nats://user:pa55word@" + deadAddr},
			url:     "nats://[redacted]@" + deadAddr,
			reason:  "nothing listens there",
			err:     []string{"connection refused"},
			is:      syscall.ECONNREFUSED,
			secrets: []string{"pa55word", "user:"},
		},
		"host name does not resolve": {
			opts:   Options{URLs: "nats://no-such-host.invalid:4333"},
			url:    "nats://no-such-host.invalid:4333",
			reason: "the host name does not resolve",
			err:    []string{"no-such-host.invalid"},
		},
		"wrong token": {
			opts:    Options{URLs: serverURL(t, tokenServer, "nats"), Token: "guess"},
			url:     serverURL(t, tokenServer, "nats"),
			reason:  "the server refused the credentials",
			err:     []string{"Authorization Violation"},
			is:      nats.ErrAuthorization,
			secrets: []string{"guess"},
		},
		"server certificate from another CA": {
			opts:   Options{URLs: serverURL(t, tlsServer, "tls"), TLSCAFile: otherCAFile},
			url:    serverURL(t, tlsServer, "tls"),
			reason: "the server's certificate is not trusted",
			err:    []string{"certificate signed by unknown authority"},
			is:     nats.ErrTLS,
		},
		// The client sees the refusal as a TLS alert or as the connection closed under
		// it (see clientCertRefused), so only the reason's start is certain.
		"no client certificate for mutual TLS": {
			opts:   Options{URLs: serverURL(t, mutualServer, "tls"), TLSCAFile: caFile},
			url:    serverURL(t, mutualServer, "tls"),
			reason: "the TLS handshake failed",
		},
		"TLS wanted, server offers none": {
			opts:   Options{URLs: serverURL(t, tokenServer, "tls"), TLSCAFile: caFile, Token: "s3cret"},
			url:    serverURL(t, tokenServer, "tls"),
			reason: "the server offers none",
			is:     nats.ErrSecureConnWanted,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			c, buf := retrying(t, tc.opts)
			line := waitForFailure(t, buf)
			wantContains(t, "log line", line, append([]string{"url=" + tc.url, tc.reason}, tc.err...)...)
			// The default port, as a whole port: a free port such as 42221 contains it.
			if defaultPort.MatchString(line) {
				t.Errorf("log line %q names port 4222, want only %s", line, tc.url)
			}
			for _, s := range tc.secrets {
				if strings.Contains(buf.String(), s) {
					t.Errorf("log %q shows %q, want it hidden", buf.String(), s)
				}
			}

			problem := c.Problem()
			if problem == nil {
				t.Fatal("Problem: got nil while not connected, want why")
			}
			if !errors.Is(problem, ErrNotConnected) {
				t.Errorf("Problem %q: want it to wrap ErrNotConnected", problem)
			}
			if tc.is != nil && !errors.Is(problem, tc.is) {
				t.Errorf("Problem %q: want it to wrap %q", problem, tc.is)
			}
			wantContains(t, "Problem", problem.Error(), append([]string{"not connected to NATS at " + tc.url, tc.reason}, tc.err...)...)
		})
	}
}

// TestConnectFailureGivesRealCause: a first connect that is not retried fails with the
// dial's own error, not nats.go's "no servers available", and logs nothing (the caller
// has the error).
func TestConnectFailureGivesRealCause(t *testing.T) {
	dead := deadURL(t)
	log, buf := testkit.BufferLogger()
	c, err := Connect(t.Context(), Options{URLs: dead, Log: log})
	if err == nil {
		c.Close()
		t.Fatal("got a connection where nothing listens, want an error")
	}
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("got error %q, want it to wrap ECONNREFUSED", err)
	}
	wantContains(t, "error", err.Error(), "connect to NATS at "+dead, "nothing listens there", "connection refused")
	if lines := failureLines(buf.String()); len(lines) > 0 {
		t.Errorf("got log lines %q for a connect not retried, want none: the error says it", lines)
	}
}

// TestConnectInProcessNamesNoURL: the embedded server's in-process connection has no
// URL; an error must not name the default one, where nothing of the scaler's listens.
func TestConnectInProcessNamesNoURL(t *testing.T) {
	ns := startNATS(t, "", t.TempDir())
	dir := t.TempDir()
	notPEM := testkit.WriteFile(t, dir, "ca.pem", []byte("not a certificate"))
	c, err := Connect(t.Context(), Options{InProcess: ns.Server, TLSCAFile: notPEM})
	if err == nil {
		c.Close()
		t.Fatal("got a connection with an unreadable CA file, want an error")
	}
	wantContains(t, "error", err.Error(), "connect to NATS at in-process", notPEM)
	// The default port, as a whole port: the temporary directory's random name, in the
	// error, may hold the digits 4222 (it did, once, in CI).
	if defaultPort.MatchString(err.Error()) {
		t.Errorf("got error %q, want it not to name the default URL", err)
	}
}

// TestFailedAttemptsKeepBeingCounted: attempts go on after a refusal of the credentials
// (nats.go would close the connection for good after the second), and once the server
// accepts, the connected line says how many failed.
func TestFailedAttemptsKeepBeingCounted(t *testing.T) {
	s := authServer(t, &server.Options{Authorization: "s3cret"})
	c, buf := retrying(t, Options{URLs: serverURL(t, s, "nats"), Token: "guess"})
	testkit.Eventually(t, 20*time.Second, func() bool {
		var nc *notConnectedError
		return errors.As(c.Problem(), &nc) && nc.failures >= 3
	})
	if c.IsClosed() {
		t.Fatalf("got the connection closed after refused credentials, want it retrying; log:\n%s", buf)
	}
	if strings.Contains(buf.String(), "closed for good") {
		t.Errorf("got log %q, want no closed-for-good line", buf)
	}
}

func TestConnectedLineCountsFailedAttempts(t *testing.T) {
	addr := testkit.FreeAddr(t)
	c, buf := retrying(t, Options{URLs: "nats://" + addr})
	waitForFailure(t, buf)
	startNATS(t, addr, t.TempDir())
	testkit.Eventually(t, 15*time.Second, func() bool { return c.IsConnected() })
	testkit.Eventually(t, 5*time.Second, func() bool { return strings.Contains(buf.String(), "msg=\"connected to NATS\"") })
	line := ""
	for l := range strings.SplitSeq(buf.String(), "\n") {
		if strings.Contains(l, "msg=\"connected to NATS\"") {
			line = l
		}
	}
	wantContains(t, "connected line", line, "url=nats://"+addr, "failedAttemptsBefore=")
	if err := c.Problem(); err != nil {
		t.Errorf("Problem while connected: got %v, want nil", err)
	}
}

// TestDiagnosisRateLimits drives the diagnosis on a fake clock: the first failure is
// logged at once, later ones at most once per period with the number since the last line,
// and a connection resets it so the next failure is logged at once again.
func TestDiagnosisRateLimits(t *testing.T) {
	log, buf := testkit.BufferLogger()
	now := time.Unix(1_700_000_000, 0)
	d := newDiagnosis("nats://nats.example:4222", log, false)
	d.now = func() time.Time { return now }
	refused := fmt.Errorf("dial tcp 10.0.0.1:4222: %w", syscall.ECONNREFUSED)

	steps := []struct {
		advance  time.Duration
		connect  bool
		wantLogs int
		wantN    string // failedAttempts of the last line
	}{
		{0, false, 1, "failedAttempts=1"},
		{time.Second, false, 1, ""},
		{2 * time.Second, false, 1, ""},
		{failureLogEvery - 3*time.Second, false, 2, "failedAttempts=3"},
		{time.Second, false, 2, ""},
		{0, true, 2, ""},
		{time.Second, false, 3, "failedAttempts=1"},
	}
	for i, st := range steps {
		now = now.Add(st.advance)
		if st.connect {
			d.connected()
			continue
		}
		d.failed(refused)
		lines := failureLines(buf.String())
		if len(lines) != st.wantLogs {
			t.Fatalf("step %d: got %d lines, want %d:\n%s", i, len(lines), st.wantLogs, buf)
		}
		if st.wantN != "" {
			wantContains(t, fmt.Sprintf("step %d line", i), lines[len(lines)-1], st.wantN, "url=nats://nats.example:4222", "connection refused")
		}
	}
}

// TestExplainNamesTheBus: a JetStream request made while nothing answers runs out of
// time; Explain puts in front where the connection tries to go and why it cannot.
func TestExplainNamesTheBus(t *testing.T) {
	dead := deadURL(t)
	c, buf := retrying(t, Options{URLs: dead})
	waitForFailure(t, buf)
	js, err := jetstream.New(c.Conn)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	_, err = js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{Name: "X", Subjects: []string{"x"}})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("got %v from a request with nothing answering, want a deadline exceeded", err)
	}
	got := c.Explain(fmt.Errorf("create or update stream X: %w", err))
	wantContains(t, "explained error", got.Error(), "not connected to NATS at "+dead, "nothing listens there", "create or update stream X: context deadline exceeded")
	for _, is := range []error{ErrNotConnected, context.DeadlineExceeded, syscall.ECONNREFUSED} {
		if !errors.Is(got, is) {
			t.Errorf("explained error %q: want it to wrap %q", got, is)
		}
	}
	if again := c.Explain(got); again != got {
		t.Errorf("explaining twice: got %q, want %q unchanged", again, got)
	}
	other := errors.New("stream name already in use")
	if got := c.Explain(other); got != other {
		t.Errorf("Explain of an error that is not a timeout: got %q, want it unchanged", got)
	}
}

func TestExplainLeavesErrorsWhileConnected(t *testing.T) {
	ns := startNATS(t, "", t.TempDir())
	c, err := Connect(t.Context(), Options{URLs: ns.ClientURL()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	err = fmt.Errorf("slow: %w", context.DeadlineExceeded)
	if got := c.Explain(err); got != err {
		t.Errorf("Explain while connected: got %q, want %q unchanged", got, err)
	}
}

// defaultPort matches NATS's default port in a host:port.
var defaultPort = regexp.MustCompile(`:4222\b`)
