package bench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/crypto/bcrypt"

	"github.com/gpuscaler/gpuscaler/authcallout"
	"github.com/gpuscaler/gpuscaler/internal/embedded"
	"github.com/gpuscaler/gpuscaler/internal/natsconn"
	gpuscalerv1 "github.com/gpuscaler/gpuscaler/proto/gpuscaler/v1"
)

// benchBus is the bench's NATS: open, or guarded by the auth callout.
type benchBus struct {
	ns   *embedded.Server
	auth string
	// Logins of the scaler, the simulated nodes and the queue producer (empty: none).
	scaler, nodes, producer login
	stop                    func()
}

type login struct{ user, password string }

// as returns the options that connect as l.
func (b *benchBus) as(l login, name string) natsconn.Options {
	return natsconn.Options{URLs: b.ns.ClientURL(), Name: name, User: l.user, Password: l.password}
}

func (b *benchBus) close() {
	if b.stop != nil {
		b.stop()
	}
	b.ns.Shutdown()
}

// startBus starts the embedded NATS server, and for Auth "callout" the callout service,
// which admits the scaler and the producer (static users, the role a ServiceAccount
// would get: TokenReview is the only step missing, and it runs once per connection).
func startBus(ctx context.Context, cfg Config) (*benchBus, error) {
	b := &benchBus{auth: cfg.Auth}
	switch cfg.Auth {
	case "", "open":
		b.auth = "open"
		ns, err := embedded.Start(embedded.Options{Log: cfg.Log.With("component", "embedded-nats")})
		if err != nil {
			return nil, err
		}
		b.ns = ns
		return b, nil
	case "callout":
	default:
		return nil, fmt.Errorf("auth %q: want open or callout", cfg.Auth)
	}
	issuer, err := nkeys.CreateAccount()
	if err != nil {
		return nil, err
	}
	pub, _ := issuer.PublicKey()
	secret := func() string { b := make([]byte, 16); rand.Read(b); return hex.EncodeToString(b) }
	b.scaler, b.nodes, b.producer = login{"bench-scaler", secret()}, login{"bench-nodes", secret()}, login{"bench-producer", secret()}
	calloutPassword := secret()
	natsConf := authcallout.NATSConfig{Issuer: pub, CalloutPassword: calloutPassword,
		Trusted: []authcallout.TrustedUser{{User: b.nodes.user, Password: b.nodes.password, Publish: []string{gpuscalerv1.SubjectPrefix + ".node.>"}}}}
	ns, err := embedded.Start(embedded.Options{Log: cfg.Log.With("component", "embedded-nats"), Config: natsConf.String()})
	if err != nil {
		return nil, err
	}
	b.ns = ns
	users := "users:\n"
	for _, u := range []struct {
		l    login
		role string
		ns   string
	}{{b.scaler, "scaler", ""}, {b.producer, "producer", "bench-q"}} {
		hash, err := bcrypt.GenerateFromPassword([]byte(u.l.password), bcrypt.MinCost)
		if err != nil {
			ns.Shutdown()
			return nil, err
		}
		users += fmt.Sprintf("- {user: %s, passwordHash: %q, role: %s", u.l.user, hash, u.role)
		if u.ns != "" {
			users += ", namespace: " + u.ns
		}
		users += "}\n"
	}
	static, err := authcallout.ParseStaticUsers([]byte(users))
	if err == nil {
		var svc *authcallout.Service
		svc, err = authcallout.New(authcallout.Config{Issuer: issuer, StaticUsers: static, Log: cfg.Log.With("component", "auth-callout"), Registry: prometheus.NewRegistry()})
		if err == nil {
			err = b.runCallout(ctx, svc, calloutPassword)
		}
	}
	if err != nil {
		ns.Shutdown()
		return nil, fmt.Errorf("auth callout: %w", err)
	}
	return b, nil
}

// runCallout runs svc on its own connection until close, and waits until it answers.
func (b *benchBus) runCallout(ctx context.Context, svc *authcallout.Service, password string) error {
	nc, err := nats.Connect(b.ns.ClientURL(), nats.UserInfo("callout", password), nats.Name("bench-auth-callout"))
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- svc.Run(ctx, nc) }()
	b.stop = func() { cancel(); <-done; nc.Close() }
	select {
	case <-svc.Ready():
		return nil
	case err := <-done:
		nc.Close()
		return err
	}
}
