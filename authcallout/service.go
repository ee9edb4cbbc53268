package authcallout

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpuscaler/gpuscaler/authcallout/parse"
)

// Subject is where the NATS server sends authorization requests (nats-server
// server/auth_callout.go, AuthCalloutSubject).
const Subject = "$SYS.REQ.USER.AUTH"

// maxConcurrent bounds the requests a Service answers at once.
const maxConcurrent = 64

// queueGroup lets several replicas of the callout share the requests: each request is
// answered by one of them.
const queueGroup = "gpuscaler-auth-callout"

// Defaults of Config.
const (
	DefaultAudience = "gpuscaler-nats"
	DefaultMaxTTL   = time.Hour
)

// Config configures a Service.
type Config struct {
	// Issuer signs the users the callout issues; the NATS server's auth_callout.issuer is
	// its public key.
	Issuer nkeys.KeyPair
	// Accounts are the NATS accounts issued users join, one per role (DefaultAccounts
	// where empty).
	Accounts Accounts
	// Audience is the audience ServiceAccount tokens must carry. Empty means DefaultAudience.
	Audience string
	// Scalers, Collectors and Producers list the ServiceAccounts of each role as
	// comma-separated namespace/name patterns ("*" matches a whole part). An account that
	// matches none is refused; one that matches several takes the first of scaler,
	// collector, producer.
	Scalers, Collectors, Producers string
	// StaticUsers are clients outside the cluster, by user name (LoadStaticUsers).
	StaticUsers StaticUsers
	// MaxTTL bounds how long an issued user lives; it never outlives its token. Zero
	// means DefaultMaxTTL.
	MaxTTL time.Duration
	// Kube reviews tokens. Nil refuses every token (static users only).
	Kube Kube
	// PodLookup reads a collector's node from its pod when its token carries no node claim.
	PodLookup bool
	// ReviewTimeout bounds one TokenReview. Zero means 1.5 s: the NATS server gives up on
	// the callout after its auth timeout (2 s by default), and the client tries again.
	ReviewTimeout time.Duration

	Log      *slog.Logger
	Registry prometheus.Registerer
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// Service answers the NATS server's authorization requests. It is safe for concurrent use.
type Service struct {
	issuer    nkeys.KeyPair
	issuerPub string
	accounts  Accounts
	maxTTL    time.Duration
	static    StaticUsers
	dummy     []byte    // compared against for an unknown static user
	reviewer  *reviewer // nil without Kube
	log       *slog.Logger
	now       func() time.Time
	metrics   *metrics

	ready sync.Once
	up    chan struct{} // closed once subscribed
}

// New checks cfg and returns a Service.
func New(cfg Config) (*Service, error) {
	if cfg.Issuer == nil {
		return nil, errors.New("auth callout: no issuer key")
	}
	pub, err := cfg.Issuer.PublicKey()
	if err != nil {
		return nil, fmt.Errorf("auth callout: issuer key: %w", err)
	}
	if !nkeys.IsValidPublicAccountKey(pub) {
		return nil, fmt.Errorf("auth callout: issuer key %s is not an account key", pub)
	}
	if _, err := cfg.Issuer.Seed(); err != nil {
		return nil, fmt.Errorf("auth callout: issuer key has no seed to sign with: %w", err)
	}
	if err := cfg.Accounts.validate(); err != nil {
		return nil, fmt.Errorf("auth callout: %w", err)
	}
	s := &Service{
		issuer: cfg.Issuer, issuerPub: pub, accounts: cfg.Accounts.withDefaults(), maxTTL: cfg.MaxTTL,
		static: cfg.StaticUsers, log: cfg.Log, now: cfg.Now, up: make(chan struct{}),
	}
	if len(s.static) > 0 {
		s.dummy = dummyHashFor(s.static)
	}
	if s.maxTTL <= 0 {
		s.maxTTL = DefaultMaxTTL
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	if s.now == nil {
		s.now = time.Now
	}
	r := &reviewer{kube: cfg.Kube, audience: cfg.Audience, podLookup: cfg.PodLookup, timeout: cfg.ReviewTimeout}
	if r.audience == "" {
		r.audience = DefaultAudience
	}
	if r.timeout <= 0 {
		r.timeout = 1500 * time.Millisecond
	}
	if r.scalers, err = parsePatterns("scaler identities", cfg.Scalers); err != nil {
		return nil, err
	}
	if r.collectors, err = parsePatterns("collector identities", cfg.Collectors); err != nil {
		return nil, err
	}
	if r.producers, err = parsePatterns("producer identities", cfg.Producers); err != nil {
		return nil, err
	}
	if cfg.Kube != nil {
		s.reviewer = r
	}
	reg := cfg.Registry
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	s.metrics = newMetrics(reg)
	return s, nil
}

// IssuerPublicKey is the public key the NATS server's auth_callout.issuer must name.
func (s *Service) IssuerPublicKey() string { return s.issuerPub }

// Ready is closed once the service listens for requests.
func (s *Service) Ready() <-chan struct{} { return s.up }

// Run answers requests on nc until ctx ends. nc must be logged in as one of the NATS
// server's auth_callout auth_users.
func (s *Service) Run(ctx context.Context, nc *nats.Conn) error {
	// nats.go hands a subscription's messages over one at a time; a TokenReview takes a
	// round trip to the API server, so each request is answered on its own goroutine,
	// at most maxConcurrent at once: after a NATS restart every client reconnects at
	// once, and the server gives up on a request after its auth timeout (2 s).
	var (
		sem     = make(chan struct{}, maxConcurrent)
		wg      sync.WaitGroup
		mu      sync.Mutex // guards stopped and wg.Add
		stopped bool
	)
	defer func() {
		mu.Lock()
		stopped = true
		mu.Unlock()
		wg.Wait()
	}()
	sub, err := nc.QueueSubscribe(Subject, queueGroup, func(m *nats.Msg) {
		mu.Lock()
		if stopped {
			mu.Unlock()
			return
		}
		wg.Add(1)
		mu.Unlock()
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			resp := s.Authorize(ctx, m.Data)
			if err := m.Respond(resp); err != nil {
				s.log.Warn("cannot answer an authorization request", "err", err)
			}
		}()
	})
	if err != nil {
		return fmt.Errorf("auth callout: subscribe to %s: %w", Subject, err)
	}
	defer sub.Unsubscribe() //nolint:errcheck // best effort on the way out
	// The subscription reaches the server once connected; until the server has it, the
	// callout is not ready, and clients cannot get in.
	for {
		fctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := nc.FlushWithContext(fctx)
		cancel()
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return nil
		}
		s.log.Warn("waiting for NATS to take the authorization subscription", "err", err)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(time.Second):
		}
	}
	s.ready.Do(func() { close(s.up) })
	s.log.Info("answering NATS authorization requests", "subject", Subject, "issuer", s.issuerPub,
		"scalerAccount", s.accounts.Scaler, "collectorAccount", s.accounts.Collector, "producerAccount", s.accounts.Producer, "jetStreamNamespaces", s.accounts.JetStreamNamespaces)
	<-ctx.Done()
	return nil
}

// Authorize answers one authorization request (a JWT the NATS server signed) with a
// signed response: the user to admit, or the reason to refuse. It returns nil when the
// request is not a request at all; Run then answers with an empty reply, which the server
// takes as a refusal.
func (s *Service) Authorize(ctx context.Context, request []byte) []byte {
	start := s.now()
	req, err := parse.Request(request, start)
	if err != nil {
		s.metrics.observe(0, "malformed_request", start, s.now())
		s.log.Warn("dropping a malformed authorization request", "err", err)
		return nil
	}
	id, err := s.identify(ctx, req, start)
	if err == nil {
		var user string
		if user, err = s.issue(req, id, start); err == nil {
			s.metrics.observe(id.Role, "", start, s.now())
			s.log.Debug("admitted", "client", clientOf(req), "identity", id.Name, "role", id.Role, "namespace", id.Namespace, "node", id.Node)
			return s.respond(req, user, "")
		}
	}
	reason := reasonOf(err)
	s.metrics.observe(id.Role, reason, start, s.now())
	s.log.Warn("refused a NATS client", "client", clientOf(req), "reason", reason, "err", err)
	return s.respond(req, "", err.Error())
}

// identify establishes who the client of req is, from its token or its user and password.
func (s *Service) identify(ctx context.Context, req *jwt.AuthorizationRequestClaims, now time.Time) (Identity, error) {
	opts := req.ConnectOptions
	switch {
	case opts.Token != "":
		if s.reviewer == nil {
			return Identity{}, deny("no_kubernetes", "this callout reviews no ServiceAccount tokens (it runs without Kubernetes API access)")
		}
		return s.reviewer.review(ctx, opts.Token, now)
	case opts.Username != "":
		if len(s.static) == 0 {
			return Identity{}, deny("bad_password", "user %q: this bus admits no static users (--static-users)", opts.Username)
		}
		return checkStatic(s.static, s.dummy, opts.Username, opts.Password)
	default:
		return Identity{}, deny("no_credentials", "no credentials: connect with a ServiceAccount token (--nats-token-file) or a user and password")
	}
}

// issue returns the signed user JWT that admits req's client as id.
func (s *Service) issue(req *jwt.AuthorizationRequestClaims, id Identity, now time.Time) (string, error) {
	jetStream := id.Role == RoleProducer && s.accounts.hasJetStream(id.Namespace)
	perms, err := id.permissions(jetStream)
	if err != nil {
		return "", err
	}
	uc := jwt.NewUserClaims(req.UserNkey)
	uc.Name = id.Name
	// Outside operator mode the audience places the user in an account: its role's, or
	// its namespace's own.
	uc.Audience = s.accounts.of(id)
	uc.IssuedAt = now.Unix()
	exp := now.Add(s.maxTTL)
	if !id.Expires.IsZero() && id.Expires.Before(exp) {
		exp = id.Expires
	}
	uc.Expires = exp.Unix()
	uc.Permissions = perms
	// Only the scaler holds subscriptions worth counting; the others need at most one.
	// A server in config mode ignores limits in the users an auth callout issues
	// (nats-server#5002: client.applyAccountLimits reads the client's own JWT, not the
	// issued one), so the accounts' limits in NATSConfig are what hold there; this one
	// holds in operator mode.
	switch {
	case jetStream:
		uc.Limits.Subs = int64(DefaultTenantLimits.MaxSubscriptions)
	case id.Role != RoleScaler:
		uc.Limits.Subs = producerMaxSubs
	}
	vr := jwt.CreateValidationResults()
	uc.Validate(vr)
	if errs := vr.Errors(); len(errs) > 0 {
		return "", fmt.Errorf("issued user is not valid: %w", errors.Join(errs...))
	}
	return uc.Encode(s.issuer)
}

// respond signs the answer to req: a user JWT, or an error.
func (s *Service) respond(req *jwt.AuthorizationRequestClaims, user, errMsg string) []byte {
	rc := jwt.NewAuthorizationResponseClaims(req.UserNkey)
	rc.Audience = req.Server.ID
	rc.Jwt = user
	rc.Error = errMsg
	out, err := rc.Encode(s.issuer)
	if err != nil {
		s.log.Error("cannot sign an authorization response", "err", err)
		return nil
	}
	return []byte(out)
}

// clientOf describes a request's client for logs.
func clientOf(req *jwt.AuthorizationRequestClaims) string {
	ci := req.ClientInformation
	name := ci.Name
	if name == "" {
		name = req.ConnectOptions.Name
	}
	return fmt.Sprintf("%s (cid %d, %q)", ci.Host, ci.ID, name)
}

// LoadIssuer reads --issuer-seed-file: an NKey account seed ("SA…"), or any other secret
// of at least 32 bytes, from whose SHA-256 the account key is made (what a Helm chart can
// generate with randAlphaNum).
func LoadIssuer(path string) (nkeys.KeyPair, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("issuer seed: %w", err)
	}
	kp, err := issuerFromSecret(bytes.TrimSpace(data))
	if err != nil {
		return nil, fmt.Errorf("issuer seed %s: %w", path, err)
	}
	return kp, nil
}

func issuerFromSecret(secret []byte) (nkeys.KeyPair, error) {
	if bytes.HasPrefix(secret, []byte("SA")) {
		kp, err := nkeys.FromSeed(secret)
		if err != nil {
			return nil, fmt.Errorf("starts like an NKey account seed (SA…) but is not one: %w", err)
		}
		return kp, nil
	}
	if bytes.HasPrefix(secret, []byte("S")) && len(secret) == 58 {
		return nil, errors.New("is an NKey seed of another kind; want an account seed (SA…)")
	}
	if len(secret) < 32 {
		return nil, fmt.Errorf("is %d bytes; want an NKey account seed (SA…) or a random secret of at least 32 bytes", len(secret))
	}
	raw := sha256.Sum256(secret)
	return nkeys.FromRawSeed(nkeys.PrefixByteAccount, raw[:])
}
