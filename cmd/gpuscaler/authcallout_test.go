package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
	"golang.org/x/crypto/bcrypt"

	"github.com/gpuscaler/gpuscaler/authcallout"
	"github.com/gpuscaler/gpuscaler/internal/natstest"
	"github.com/gpuscaler/gpuscaler/test/testkit"
)

func TestAuthCalloutUsageErrors(t *testing.T) {
	dir := t.TempDir()
	seed := testkit.WriteFile(t, dir, "seed", []byte(strings.Repeat("k", 64)))
	for name, tc := range map[string]struct {
		args []string
		says string
	}{
		"no seed":            {[]string{"auth-callout"}, "--issuer-seed-file is required"},
		"short seed":         {[]string{"auth-callout", "--issuer-seed-file", testkit.WriteFile(t, dir, "short", []byte("abc"))}, "at least 32 bytes"},
		"zero ttl":           {[]string{"auth-callout", "--issuer-seed-file", seed, "--user-max-ttl", "0s"}, "--user-max-ttl 0s: want a positive duration"},
		"bad identities":     {[]string{"auth-callout", "--issuer-seed-file", seed, "--kubeconfig", "none", "--producer-identities", "team-*/x"}, "producer identities"},
		"bad static users":   {[]string{"auth-callout", "--issuer-seed-file", seed, "--static-users", testkit.WriteFile(t, dir, "u.yaml", []byte("users: [{user: a}]"))}, "static users"},
		"issuer-key no seed": {[]string{"auth-callout", "issuer-key"}, "--issuer-seed-file is required"},
	} {
		t.Run(name, func(t *testing.T) {
			r := runCLI(t.Context(), nil, tc.args...)
			if r.code == 0 || !strings.Contains(r.stderr, tc.says) {
				t.Fatalf("got %v, want a failure saying %q", r, tc.says)
			}
		})
	}
}

func TestAuthCalloutIssuerKeyAndHashPassword(t *testing.T) {
	dir := t.TempDir()
	seed := testkit.WriteFile(t, dir, "seed", []byte(strings.Repeat("k", 64)))
	kp, err := authcallout.LoadIssuer(seed)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := kp.PublicKey()
	r := runCLI(t.Context(), nil, "auth-callout", "issuer-key", "--issuer-seed-file", seed)
	if r.code != 0 || r.stdout != want+"\n" {
		t.Fatalf("got %v, want %s", r, want)
	}
	out := filepath.Join(dir, "sub", "issuer.pub")
	if r := runCLI(t.Context(), map[string]string{"GPUSCALER_ISSUER_SEED_FILE": seed}, "auth-callout", "issuer-key", "--out", out); r.code != 0 {
		t.Fatalf("got %v", r)
	}
	if got, _ := os.ReadFile(out); string(got) != want+"\n" {
		t.Fatalf("--out wrote %q, want %s", got, want)
	}

	var stdout, stderr testkit.SyncBuffer
	if err := runHashPassword(nil, mapEnv(nil), strings.NewReader("s3cret\n"), &stdout); err != nil {
		t.Fatal(err)
	}
	if err := bcrypt.CompareHashAndPassword([]byte(strings.TrimSpace(stdout.String())), []byte("s3cret")); err != nil {
		t.Fatalf("hash-password printed %q, not a hash of the password: %v (%s)", stdout.String(), err, stderr.String())
	}
	if err := runHashPassword(nil, mapEnv(nil), strings.NewReader(""), &stdout); err == nil {
		t.Fatal("hash-password accepted an empty password")
	}
}

// TestAuthCalloutCommand runs `gpuscaler auth-callout` against a nats-server configured
// for it (authcallout.NATSConfig, as the chart's), with a static producer: the producer
// gets in with its password and may publish only for its namespace; a wrong password
// does not get in.
func TestAuthCalloutCommand(t *testing.T) {
	dir := t.TempDir()
	seed := testkit.WriteFile(t, dir, "seed", []byte(strings.Repeat("s", 64)))
	kp, _ := authcallout.LoadIssuer(seed)
	pub, _ := kp.PublicKey()
	url := natstest.StartConfig(t, authcallout.NATSConfig{Issuer: pub, CalloutPassword: "pw"}.String()).ClientURL()
	hash, _ := bcrypt.GenerateFromPassword([]byte("right"), bcrypt.MinCost)
	users := testkit.WriteFile(t, dir, "users.yaml", []byte(`users:
- user: ci
  passwordHash: "`+string(hash)+`"
  role: producer
  namespace: team-a
`))

	ctx, cancel := context.WithCancel(t.Context())
	var stdout, stderr testkit.SyncBuffer
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"auth-callout", "--issuer-seed-file", seed, "--kubeconfig", "none", "--static-users", users,
			"--http-addr", "-", "--nats-url", url, "--nats-user", "callout"},
			mapEnv(map[string]string{"GPUSCALER_NATS_PASSWORD": "pw"}), &stdout, &stderr)
	}()
	t.Cleanup(func() {
		cancel()
		if code := <-done; code != 0 {
			t.Errorf("auth-callout exited with %d:\n%s", code, stderr.String())
		}
	})
	testkit.Eventually(t, 10*time.Second, func() bool { return strings.Contains(stderr.String(), "answering NATS authorization requests") })

	if _, err := nats.Connect(url, nats.UserInfo("ci", "wrong")); err == nil || !strings.Contains(strings.ToLower(err.Error()), "authorization violation") {
		t.Fatalf("wrong password: got %v, want an authorization violation", err)
	}
	asyncErr := make(chan error, 4)
	nc, err := nats.Connect(url, nats.UserInfo("ci", "right"), nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { asyncErr <- err }))
	if err != nil {
		t.Fatalf("static producer refused: %v\n%s", err, stderr.String())
	}
	defer nc.Close()
	nc.Publish("gpuscaler.v1.queue.team-b.x.p", nil)
	nc.Flush()
	select {
	case err := <-asyncErr:
		if !strings.Contains(err.Error(), `Permissions Violation for Publish to "gpuscaler.v1.queue.team-b.x.p"`) {
			t.Fatalf("got %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("publishing for another namespace was not refused")
	}
	// gpuscaler publish names the refusal, not a bare timeout.
	r := runCLI(t.Context(), nil, "publish", "queue", "--nats-url", url, "--nats-user", "ci", "--nats-password", "right",
		"--namespace", "team-b", "--queue", "x", "--waiting", "1", "--timeout", "2s")
	if r.code == 0 || !strings.Contains(r.stderr, "NATS refused it: nats: permissions violation") || !strings.Contains(r.stderr, "gpuscaler.v1.queue.<its namespace>.<queue>.<producer>") {
		t.Fatalf("publish for another namespace: got %v, want it refused by NATS, saying so", r)
	}
	if !strings.Contains(stderr.String(), `reason=bad_password`) {
		t.Fatalf("the refusal is not in the log:\n%s", stderr.String())
	}
}

// TestNATSConfigCommand: `gpuscaler auth-callout nats-config` prints a configuration
// nats-server accepts once its variables are set, and deploy/README.md shows exactly
// that output for your own NATS.
func TestNATSConfigCommand(t *testing.T) {
	r := runCLI(t.Context(), nil, "auth-callout", "nats-config")
	if r.code != 0 {
		t.Fatalf("nats-config: %s", r)
	}
	kp, _ := nkeys.CreateAccount()
	pub, _ := kp.PublicKey()
	t.Setenv("CALLOUT_ISSUER", pub)
	t.Setenv("CALLOUT_PASSWORD", "pw")
	natstest.StartConfig(t, r.stdout)

	readme, err := os.ReadFile("../../deploy/README.md")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(readme), "as `gpuscaler auth-callout nats-config` prints them:\n\n```\n"+r.stdout+"```\n") {
		t.Errorf("deploy/README.md (Your own NATS) does not show what `gpuscaler auth-callout nats-config` prints:\n%s", r.stdout)
	}
	// With namespaces listed for JetStream, each has its account, which a server accepts.
	r = runCLI(t.Context(), nil, "auth-callout", "nats-config", "--jetstream-namespaces=training, team-b,training")
	if r.code != 0 {
		t.Fatalf("nats-config --jetstream-namespaces: %s", r)
	}
	for _, want := range []string{`"GPUSCALER_NS_training" {`, `"GPUSCALER_NS_team-b" {`, `to: "gpuscaler.ns.team-b.$JS.API.CONSUMER.INFO.>"`} {
		if strings.Count(r.stdout, want) != 1 {
			t.Errorf("nats-config --jetstream-namespaces prints %q %d times, want once:\n%s", want, strings.Count(r.stdout, want), r.stdout)
		}
	}
	natstest.StartConfig(t, r.stdout)
}
