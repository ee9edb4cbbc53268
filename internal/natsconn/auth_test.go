package natsconn

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/gpuscaler/gpuscaler/test/testkit"
)

// authServer starts a real nats-server on a random loopback port with the
// authentication and TLS settings in opts, and shuts it down at cleanup.
func authServer(t *testing.T, opts *server.Options) *server.Server {
	t.Helper()
	opts.Host = "127.0.0.1"
	opts.Port = -1
	opts.NoSigs = true
	opts.NoLog = true
	s, err := server.NewServer(opts)
	if err != nil {
		t.Fatalf("new NATS server: %v", err)
	}
	s.Start()
	t.Cleanup(s.Shutdown)
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatal("NATS server not ready for connections within 10s")
	}
	return s
}

// serverURL is the address s listens on for clients, with the given scheme.
func serverURL(t *testing.T, s *server.Server, scheme string) string {
	t.Helper()
	addr, ok := s.Addr().(*net.TCPAddr)
	if !ok {
		t.Fatalf("got server address %v, want a TCP address", s.Addr())
	}
	return fmt.Sprintf("%s://127.0.0.1:%d", scheme, addr.Port)
}

// roundTrip proves c works: a message published on a fresh subject comes back to a
// subscriber on the same connection.
func roundTrip(t *testing.T, c *Conn) {
	t.Helper()
	subject := "auth.test." + nats.NewInbox()
	sub, err := c.SubscribeSync(subject)
	if err != nil {
		t.Fatalf("subscribe: %v", err)
	}
	if err := c.Publish(subject, []byte("hello")); err != nil {
		t.Fatalf("publish: %v", err)
	}
	if err := c.Flush(); err != nil {
		t.Fatalf("flush: %v", err)
	}
	msg, err := sub.NextMsg(5 * time.Second)
	if err != nil {
		t.Fatalf("receive on %s: %v", subject, err)
	}
	if got := string(msg.Data); got != "hello" {
		t.Fatalf("got message %q, want %q", got, "hello")
	}
}

// rejection is a connection attempt the server must refuse.
type rejection struct {
	opts Options
	// is, when set, is the error the failure must wrap.
	is error
	// says, when set, are words the error must contain (any one of them).
	says []string
}

// authCase is a server requiring one way to authenticate, the options that pass it,
// and attempts it must refuse. URLs in the options are filled in once the server runs.
type authCase struct {
	server *server.Options
	scheme string
	good   Options
	bad    map[string]rejection
}

func TestConnectAuthenticates(t *testing.T) {
	tests := map[string]func(t *testing.T) authCase{
		"token":          tokenCase,
		"user/password":  userPasswordCase,
		"nkey seed file": nkeyCase,
		"creds file":     credsCase,
		"mutual TLS":     mutualTLSCase,
	}
	for name, setup := range tests {
		t.Run(name, func(t *testing.T) {
			tc := setup(t)
			url := serverURL(t, authServer(t, tc.server), tc.scheme)

			t.Run("accepted", func(t *testing.T) {
				opts := tc.good
				opts.URLs = url
				c, err := Connect(t.Context(), opts)
				if err != nil {
					t.Fatalf("got error %v, want a connection", err)
				}
				t.Cleanup(c.Close)
				roundTrip(t, c)
			})
			for badName, bad := range tc.bad {
				t.Run(badName, func(t *testing.T) {
					ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
					defer cancel()
					opts := bad.opts
					opts.URLs = url
					opts.RetryInitialConnect = false
					c, err := Connect(ctx, opts)
					if err == nil {
						c.Close()
						t.Fatal("got a connection, want the server to refuse it")
					}
					t.Logf("refused: %v", err)
					if errors.Is(err, context.DeadlineExceeded) {
						t.Fatalf("got %v, want the server's refusal before the deadline", err)
					}
					if bad.is != nil && !errors.Is(err, bad.is) {
						t.Errorf("got error %q, want one wrapping %q", err, bad.is)
					}
					if len(bad.says) > 0 && !containsAny(err.Error(), bad.says) {
						t.Errorf("got error %q, want it to mention one of %q", err, bad.says)
					}
				})
			}
		})
	}
}

func containsAny(s string, words []string) bool {
	for _, w := range words {
		if strings.Contains(s, w) {
			return true
		}
	}
	return false
}

func tokenCase(*testing.T) authCase {
	return authCase{
		server: &server.Options{Authorization: "s3cret"},
		scheme: "nats",
		good:   Options{Token: "s3cret"},
		bad: map[string]rejection{
			"wrong token": {opts: Options{Token: "guess"}, is: nats.ErrAuthorization},
			"no token":    {opts: Options{}, is: nats.ErrAuthorization},
		},
	}
}

func userPasswordCase(*testing.T) authCase {
	return authCase{
		server: &server.Options{Username: "scaler", Password: "pa55word"},
		scheme: "nats",
		good:   Options{User: "scaler", Password: "pa55word"},
		bad: map[string]rejection{
			"wrong password": {opts: Options{User: "scaler", Password: "guess"}, is: nats.ErrAuthorization},
			"wrong user":     {opts: Options{User: "other", Password: "pa55word"}, is: nats.ErrAuthorization},
		},
	}
}

func nkeyCase(t *testing.T) authCase {
	dir := t.TempDir()
	user := newKey(t, nkeys.CreateUser)
	stranger := newKey(t, nkeys.CreateUser)
	return authCase{
		server: &server.Options{Nkeys: []*server.NkeyUser{{Nkey: publicKey(t, user)}}},
		scheme: "nats",
		good:   Options{NKeySeedFile: testkit.WriteFile(t, dir, "user.nk", seed(t, user))},
		bad: map[string]rejection{
			"unknown seed": {
				opts: Options{NKeySeedFile: testkit.WriteFile(t, dir, "stranger.nk", seed(t, stranger))},
				is:   nats.ErrAuthorization,
			},
		},
	}
}

// credsCase runs the server in operator mode: it trusts one operator, which signs a
// system account and the account the user belongs to.
func credsCase(t *testing.T) authCase {
	dir := t.TempDir()
	operator := newKey(t, nkeys.CreateOperator)
	system := newKey(t, nkeys.CreateAccount)
	account := newKey(t, nkeys.CreateAccount)
	unknownAccount := newKey(t, nkeys.CreateAccount)

	opClaims := jwt.NewOperatorClaims(publicKey(t, operator))
	opClaims.SystemAccount = publicKey(t, system)
	opJWT := encode(t, opClaims, operator)
	trusted, err := jwt.DecodeOperatorClaims(opJWT)
	if err != nil {
		t.Fatalf("decode operator JWT: %v", err)
	}

	resolver := &server.MemAccResolver{}
	for _, acc := range []nkeys.KeyPair{system, account} {
		pub := publicKey(t, acc)
		if err := resolver.Store(pub, encode(t, jwt.NewAccountClaims(pub), operator)); err != nil {
			t.Fatalf("store account JWT: %v", err)
		}
	}

	return authCase{
		server: &server.Options{
			TrustedOperators: []*jwt.OperatorClaims{trusted},
			AccountResolver:  resolver,
			SystemAccount:    publicKey(t, system),
		},
		scheme: "nats",
		good:   Options{CredsFile: testkit.WriteFile(t, dir, "user.creds", creds(t, account))},
		bad: map[string]rejection{
			"user of an unknown account": {
				opts: Options{CredsFile: testkit.WriteFile(t, dir, "stranger.creds", creds(t, unknownAccount))},
				is:   nats.ErrAuthorization,
			},
		},
	}
}

// creds returns a .creds file for a new user signed by account.
func creds(t *testing.T, account nkeys.KeyPair) []byte {
	t.Helper()
	user := newKey(t, nkeys.CreateUser)
	userJWT := encode(t, jwt.NewUserClaims(publicKey(t, user)), account)
	out, err := jwt.FormatUserConfig(userJWT, seed(t, user))
	if err != nil {
		t.Fatalf("format creds: %v", err)
	}
	return out
}

// clientCertRefused are the ways a client sees the server refuse its certificate
// during or just after the handshake: a TLS alert, or the connection closed under it.
// (Go's client sends no certificate the server's CAs did not sign, so a certificate
// from another CA reads as "certificate required" too.)
var clientCertRefused = []string{"remote error: tls: ", "tls error: "}

func mutualTLSCase(t *testing.T) authCase {
	dir := t.TempDir()
	ca, otherCA := testkit.NewCA(t, "ca"), testkit.NewCA(t, "other-ca")
	caFile := testkit.WriteFile(t, dir, "ca.pem", ca.PEM)
	serverCert, serverKey := ca.IssueFiles(t, dir, "server")
	clientCert, clientKey := ca.IssueFiles(t, dir, "client")
	strangerCert, strangerKey := otherCA.IssueFiles(t, dir, "stranger")

	tlsConfig, err := server.GenTLSConfig(&server.TLSConfigOpts{
		CertFile: serverCert,
		KeyFile:  serverKey,
		CaFile:   caFile,
		Verify:   true,
	})
	if err != nil {
		t.Fatalf("server TLS config: %v", err)
	}
	return authCase{
		server: &server.Options{TLS: true, TLSConfig: tlsConfig, TLSVerify: true},
		scheme: "tls",
		good:   Options{TLSCAFile: caFile, TLSCertFile: clientCert, TLSKeyFile: clientKey},
		bad: map[string]rejection{
			"no client certificate": {
				opts: Options{TLSCAFile: caFile},
				says: clientCertRefused,
			},
			"client certificate from another CA": {
				opts: Options{TLSCAFile: caFile, TLSCertFile: strangerCert, TLSKeyFile: strangerKey},
				says: clientCertRefused,
			},
			"server certificate not trusted": {
				opts: Options{TLSCertFile: clientCert, TLSKeyFile: clientKey},
				says: []string{"x509: certificate signed by unknown authority"},
			},
		},
	}
}

// TestConnectTriesEachURL checks a list with a dead server still connects to the live
// one. nats.go shuffles the list, so each case meets the dead server first only some
// of the time; the cases together cover both orders in most runs.
func TestConnectTriesEachURL(t *testing.T) {
	live := serverURL(t, authServer(t, &server.Options{}), "nats")
	dead := "nats://" + testkit.FreeAddr(t)
	tests := map[string]string{
		"dead then live":    dead + "," + live,
		"live then dead":    live + "," + dead,
		"space after comma": dead + ", " + live,
	}
	for name, urls := range tests {
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			defer cancel()
			c, err := Connect(ctx, Options{URLs: urls})
			if err != nil {
				t.Fatalf("got error %v, want a connection to %s", err, live)
			}
			t.Cleanup(c.Close)
			if got := c.ConnectedUrl(); got != live {
				t.Errorf("got connected to %s, want %s", got, live)
			}
			roundTrip(t, c)
		})
	}
}

func newKey(t *testing.T, create func() (nkeys.KeyPair, error)) nkeys.KeyPair {
	t.Helper()
	kp, err := create()
	if err != nil {
		t.Fatalf("create nkey: %v", err)
	}
	return kp
}

func publicKey(t *testing.T, kp nkeys.KeyPair) string {
	t.Helper()
	pub, err := kp.PublicKey()
	if err != nil {
		t.Fatalf("nkey public key: %v", err)
	}
	return pub
}

func seed(t *testing.T, kp nkeys.KeyPair) []byte {
	t.Helper()
	s, err := kp.Seed()
	if err != nil {
		t.Fatalf("nkey seed: %v", err)
	}
	return s
}

func encode(t *testing.T, claims jwt.Claims, signer nkeys.KeyPair) string {
	t.Helper()
	token, err := claims.Encode(signer)
	if err != nil {
		t.Fatalf("encode JWT: %v", err)
	}
	return token
}
