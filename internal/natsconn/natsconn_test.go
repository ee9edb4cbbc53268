package natsconn

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/gpuscaler/gpuscaler/test/testkit"

	"github.com/gpuscaler/gpuscaler/internal/embedded"
)

// startNATS starts an embedded NATS server on addr (a random port when empty) storing in
// dir. It shuts down at cleanup; shutting it down earlier is allowed.
func startNATS(t *testing.T, addr, dir string) *embedded.Server {
	t.Helper()
	ns, err := embedded.Start(embedded.Options{Addr: addr, StoreDir: dir})
	if err != nil {
		t.Fatalf("start NATS: %v", err)
	}
	t.Cleanup(ns.Shutdown)
	return ns
}

func TestConnectRejectsOptions(t *testing.T) {
	url := "nats://" + testkit.FreeAddr(t) // reached only if the options pass by mistake
	tests := map[string]struct {
		opts Options
		want []string
	}{
		"token and user": {
			opts: Options{User: "u", Password: "p", Token: "t"},
			want: []string{"choose one way", "user/password and token"},
		},
		"password alone and token": {
			opts: Options{Password: "p", Token: "t"},
			want: []string{"user/password and token"},
		},
		"token and creds": {
			opts: Options{Token: "t", CredsFile: "/nonexistent/x.creds"},
			want: []string{"token and creds"},
		},
		"user, token and creds": {
			opts: Options{User: "u", Token: "t", CredsFile: "/nonexistent/x.creds"},
			want: []string{"user/password and token and creds"},
		},
		"nkey seed file missing": {
			opts: Options{NKeySeedFile: "/nonexistent/seed.nk"},
			want: []string{"nkey seed", "/nonexistent/seed.nk"},
		},
		"cert without key": {
			opts: Options{TLSCertFile: "cert.pem"},
			want: []string{"TLS", "both the certificate and the key"},
		},
		"key without cert": {
			opts: Options{TLSKeyFile: "key.pem"},
			want: []string{"TLS", "both the certificate and the key"},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			tc.opts.URLs = url
			c, err := Connect(t.Context(), tc.opts)
			if err == nil {
				c.Close()
				t.Fatalf("got no error, want one saying %q", tc.want)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("got error %q, want it to contain %q", err, w)
				}
			}
			if strings.Contains(err.Error(), "connect to NATS") {
				t.Errorf("got error %q, want the options rejected before dialling", err)
			}
		})
	}
}

func TestConnectFailureNamesURLWithoutSecrets(t *testing.T) {
	addr := testkit.FreeAddr(t)
	tests := map[string]struct {
		url     string
		want    string
		secrets []string
	}{
		"user and password": {
			url:     "nats://user:secret@" + addr,
			want:    "nats://[redacted]@" + addr,
			secrets: []string{"secret", "user:"},
		},
		"token": {
			url:     "nats://s3cr3tt0ken@" + addr,
			want:    "nats://[redacted]@" + addr,
			secrets: []string{"s3cr3tt0ken"},
		},
		"no credentials": {
			url:  "nats://" + addr,
			want: "nats://" + addr,
		},
		"second of two URLs": {
			url:     "nats://" + addr + ",nats://user:secret@" + addr,
			want:    "nats://" + addr + ",nats://[redacted]@" + addr,
			secrets: []string{"secret"},
		},
		// nats.go reads a URL without a scheme as nats://, credentials included.
		"no scheme": {
			url:     "user:secret@" + addr,
			want:    addr,
			secrets: []string{"secret"},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			c, err := Connect(t.Context(), Options{URLs: tc.url})
			if err == nil {
				c.Close()
				t.Fatalf("got no error connecting to %s where nothing listens, want one", addr)
			}
			msg := err.Error()
			if !strings.Contains(msg, "connect to NATS at ") || !strings.Contains(msg, tc.want) {
				t.Errorf("got error %q, want \"connect to NATS at\" naming %q", msg, tc.want)
			}
			for _, s := range tc.secrets {
				if strings.Contains(msg, s) {
					t.Errorf("got error %q, want %q hidden", msg, s)
				}
			}
		})
	}
}

func TestRedact(t *testing.T) {
	tests := map[string]struct{ in, want string }{
		"plain":             {"nats://127.0.0.1:4222", "nats://127.0.0.1:4222"},
		"user and password": {"nats://u:p@h:4222", "nats://[redacted]@h:4222"},
		"token":             {"tls://tok@h:4222", "tls://[redacted]@h:4222"},
		"@ in password":     {"nats://u:p@ss@h:4222", "nats://[redacted]@h:4222"},
		"list":              {"nats://a:1,nats://u:p@b:2", "nats://a:1,nats://[redacted]@b:2"},
		"empty":             {"", ""},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if got := redact(tc.in); got != tc.want {
				t.Errorf("redact(%q): got %q, want %q", tc.in, got, tc.want)
			}
		})
	}
}

func TestDownForFollowsTheConnection(t *testing.T) {
	dir := t.TempDir()
	ns := startNATS(t, "", dir)
	addr := ns.Addr().String()
	c, err := Connect(t.Context(), Options{URLs: ns.ClientURL(), Name: "test"})
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(c.Close)
	if !c.IsConnected() {
		t.Fatalf("got status %v after Connect, want connected", c.Status())
	}
	if got := c.DownFor(); got != 0 {
		t.Fatalf("DownFor while connected: got %s, want 0", got)
	}

	ns.Shutdown()
	testkit.Eventually(t, 5*time.Second, func() bool { return c.DownFor() > 0 })
	first := c.DownFor()
	testkit.Eventually(t, 5*time.Second, func() bool { return c.DownFor() > first })

	// The connection reconnects forever: a server back on the same address is found.
	startNATS(t, addr, dir)
	testkit.Eventually(t, 15*time.Second, func() bool { return c.DownFor() == 0 })
	if !c.IsConnected() {
		t.Errorf("got status %v after DownFor became 0, want connected", c.Status())
	}
}

func TestConnectRetryInitialConnect(t *testing.T) {
	addr := testkit.FreeAddr(t)
	c, err := Connect(t.Context(), Options{URLs: "nats://" + addr, RetryInitialConnect: true})
	if err != nil {
		t.Fatalf("got error %v with RetryInitialConnect and no server, want a connection that retries", err)
	}
	t.Cleanup(c.Close)
	if c.IsConnected() {
		t.Fatalf("got connected to %s where nothing listens", addr)
	}
	first := c.DownFor()
	if first <= 0 {
		t.Fatalf("DownFor before the first connection: got %s, want more than 0", first)
	}
	testkit.Eventually(t, 5*time.Second, func() bool { return c.DownFor() > first })

	startNATS(t, addr, t.TempDir())
	testkit.Eventually(t, 15*time.Second, func() bool { return c.IsConnected() && c.DownFor() == 0 })
}

func TestConnectInProcessIgnoresURL(t *testing.T) {
	ns := startNATS(t, "", t.TempDir())
	c, err := Connect(t.Context(), Options{URLs: "nats://" + testkit.FreeAddr(t), InProcess: ns.Server})
	if err != nil {
		t.Fatalf("connect in process: %v", err)
	}
	t.Cleanup(c.Close)
	if !c.IsConnected() {
		t.Fatalf("got status %v, want connected", c.Status())
	}
	if err := c.Publish("x", []byte("y")); err != nil {
		t.Fatalf("publish: %v", err)
	}
	if err := c.Flush(); err != nil {
		t.Fatalf("flush: %v", err)
	}
	if got := ns.NumClients(); got != 1 {
		t.Errorf("clients of the in-process server: got %d, want 1", got)
	}
}

func TestConnectHonoursContext(t *testing.T) {
	// A server that accepts and never answers: the NATS handshake waits for its INFO.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	conns := make(chan net.Conn, 16)
	go func() {
		defer close(conns)
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			conns <- conn
		}
	}()
	t.Cleanup(func() {
		l.Close()
		for conn := range conns {
			conn.Close()
		}
	})
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	c, err := Connect(ctx, Options{URLs: "nats://" + l.Addr().String()})
	if err == nil {
		c.Close()
		t.Fatal("got a connection from a silent server with a cancelled context, want an error")
	}
	if !errors.Is(err, context.Canceled) {
		t.Errorf("got error %v, want context.Canceled", err)
	}
	// A bare "context canceled" would not say where the connection was going.
	if want := "connect to NATS at nats://" + l.Addr().String(); !strings.Contains(err.Error(), want) {
		t.Errorf("got error %q, want it to contain %q", err, want)
	}
}
