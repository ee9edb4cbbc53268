// Package natsconn connects gpuscaler's parts to NATS: a URL list, one way to
// authenticate (user and password, token, token file, NKey seed or .creds file), TLS, reconnection
// forever with back-off, and a record of how long the connection has been down, which
// readiness checks read.
package natsconn

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
)

// DefaultURL is where parts look for NATS when given no URL: the address the scaler's
// embedded server listens on by default.
const DefaultURL = "nats://127.0.0.1:4222"

// Options says how to reach NATS. The zero value connects to DefaultURL without
// authentication and gives up at once if it cannot.
type Options struct {
	// URLs is a comma-separated list of server URLs (nats://, tls://). Empty means DefaultURL.
	URLs string
	// Name identifies the connection in the server's monitoring ("gpuscaler-scaler").
	Name string

	// At most one way to authenticate: User with Password, Token, TokenFile, NKeySeedFile
	// or CredsFile.
	User         string
	Password     string
	Token        string
	NKeySeedFile string
	CredsFile    string
	// TokenFile holds the token, read afresh at every (re)connect: a projected Kubernetes
	// ServiceAccount token, which the kubelet rewrites before it expires. When its content
	// changes, the connection flushes what it has sent and reconnects, so the server (its
	// auth callout) admits it on the new token before the old one, and the user issued
	// for it, expire. Publishes made while reconnecting are buffered, not lost.
	TokenFile string
	// TokenFileCheck is how often TokenFile is read for a change. Zero means 10 s.
	TokenFileCheck time.Duration

	// TLS: a CA bundle to verify the server, and a client certificate for mutual TLS.
	TLSCAFile   string
	TLSCertFile string
	TLSKeyFile  string

	// InboxPrefix, when set, replaces _INBOX as the prefix of this connection's reply
	// subjects (gpuscalerv1.InboxPrefix for a producer).
	InboxPrefix string

	// InProcess, when set, connects to an embedded server in the same process (no TCP);
	// URLs is then ignored.
	InProcess nats.InProcessConnProvider

	// RetryInitialConnect keeps trying when NATS cannot be reached at start, as
	// long-running parts should; Connect then returns at once with a connection that
	// connects when it can. Without it, Connect fails with the reason.
	RetryInitialConnect bool

	// Log receives connection events. Nil discards them.
	Log *slog.Logger
}

// Conn is a NATS connection that remembers since when it has been disconnected.
type Conn struct {
	*nats.Conn

	mu sync.Mutex // guards downSince
	// downSince is when the connection was last lost, zero while connected.
	downSince time.Time

	closed    chan struct{} // closed when the connection is closed for good
	closeOnce sync.Once
}

// Connect opens a connection as opts says. It reconnects forever after a loss, waiting
// 1 s (plus jitter) between attempts, and buffers up to 8 MiB of publishes meanwhile.
func Connect(ctx context.Context, opts Options) (*Conn, error) {
	log := opts.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	natsOpts, err := opts.natsOptions()
	if err != nil {
		return nil, err
	}
	c := &Conn{closed: make(chan struct{})}
	var tf *tokenFile
	if opts.TokenFile != "" {
		if tf, err = newTokenFile(opts.TokenFile, log); err != nil {
			return nil, err
		}
		natsOpts = append(natsOpts, nats.TokenHandler(tf.token))
	}
	if opts.RetryInitialConnect {
		c.downSince = time.Now()
	}
	natsOpts = append(natsOpts,
		nats.MaxReconnects(-1),
		nats.ReconnectWait(time.Second),
		nats.ReconnectJitter(500*time.Millisecond, 2*time.Second),
		nats.ReconnectBufSize(8<<20),
		nats.RetryOnFailedConnect(opts.RetryInitialConnect),
		nats.ConnectHandler(func(nc *nats.Conn) {
			c.setDown(false)
			log.Info("connected to NATS", "url", opts.connectedURL(nc))
		}),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			c.setDown(true)
			if err != nil {
				log.Warn("disconnected from NATS; reconnecting", "err", err)
			}
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			c.setDown(false)
			log.Info("reconnected to NATS", "url", opts.connectedURL(nc))
		}),
		nats.ClosedHandler(func(*nats.Conn) { c.closeOnce.Do(func() { close(c.closed) }) }),
		nats.ErrorHandler(func(_ *nats.Conn, sub *nats.Subscription, err error) {
			subject := ""
			if sub != nil {
				subject = sub.Subject
			}
			log.Warn("NATS error", "subject", subject, "err", err)
		}),
	)
	url := opts.URLs
	if url == "" {
		url = DefaultURL
	}
	type result struct {
		nc  *nats.Conn
		err error
	}
	done := make(chan result, 1)
	go func() {
		nc, err := nats.Connect(url, natsOpts...)
		done <- result{nc, err}
	}()
	select {
	case <-ctx.Done():
		go func() {
			if r := <-done; r.nc != nil {
				r.nc.Close()
			}
		}()
		return nil, ctx.Err()
	case r := <-done:
		if r.err != nil {
			return nil, fmt.Errorf("connect to NATS at %s: %w", redact(url), r.err)
		}
		c.Conn = r.nc
		if !opts.RetryInitialConnect {
			log.Info("connected to NATS", "url", opts.connectedURL(r.nc))
		}
		if tf != nil {
			go tf.watch(c, opts.TokenFileCheck)
		}
		return c, nil
	}
}

func (o Options) natsOptions() ([]nats.Option, error) {
	var out []nats.Option
	if o.Name != "" {
		out = append(out, nats.Name(o.Name))
	}
	if o.InProcess != nil {
		out = append(out, nats.InProcessServer(o.InProcess))
	}
	if o.InboxPrefix != "" {
		out = append(out, nats.CustomInboxPrefix(o.InboxPrefix))
	}
	var ways []string
	if o.User != "" || o.Password != "" {
		ways = append(ways, "user/password")
		out = append(out, nats.UserInfo(o.User, o.Password))
	}
	if o.Token != "" {
		ways = append(ways, "token")
		out = append(out, nats.Token(o.Token))
	}
	if o.TokenFile != "" {
		ways = append(ways, "token file") // the handler is added by Connect
	}
	if o.NKeySeedFile != "" {
		ways = append(ways, "nkey")
		opt, err := nats.NkeyOptionFromSeed(o.NKeySeedFile)
		if err != nil {
			return nil, fmt.Errorf("NATS nkey seed %s: %w", o.NKeySeedFile, err)
		}
		out = append(out, opt)
	}
	if o.CredsFile != "" {
		ways = append(ways, "creds")
		out = append(out, nats.UserCredentials(o.CredsFile))
	}
	if len(ways) > 1 {
		return nil, fmt.Errorf("NATS authentication: choose one way, not %s", strings.Join(ways, " and "))
	}
	if (o.TLSCertFile == "") != (o.TLSKeyFile == "") {
		return nil, errors.New("NATS TLS: a client certificate needs both the certificate and the key file")
	}
	if o.TLSCAFile != "" {
		out = append(out, nats.RootCAs(o.TLSCAFile))
	}
	if o.TLSCertFile != "" {
		out = append(out, nats.ClientCert(o.TLSCertFile, o.TLSKeyFile))
	}
	return out, nil
}

func (c *Conn) setDown(down bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case !down:
		c.downSince = time.Time{}
	case c.downSince.IsZero():
		c.downSince = time.Now()
	}
}

// DownFor returns how long the connection has been down, or 0 while it is connected.
func (c *Conn) DownFor() time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.downSince.IsZero() {
		return 0
	}
	return time.Since(c.downSince)
}

// redact hides passwords and tokens in URLs for messages. nats.go takes URLs with or
// without a scheme ("user:pass@host:4222"), so both are redacted.
func redact(urls string) string {
	parts := strings.Split(urls, ",")
	for i, u := range parts {
		scheme, rest, ok := strings.Cut(u, "://")
		if !ok {
			scheme, rest = "", u
		}
		if at := strings.LastIndex(rest, "@"); at >= 0 {
			rest = "[redacted]@" + rest[at+1:]
		}
		if ok {
			rest = scheme + "://" + rest
		}
		parts[i] = rest
	}
	return strings.Join(parts, ",")
}

// connectedURL names the server nc is connected to for the logs. An in-process
// connection has no URL of its own: nats.go reports its default URL there, which would
// point a reader at the wrong port.
func (o Options) connectedURL(nc *nats.Conn) string {
	if o.InProcess != nil {
		return "in-process"
	}
	return nc.ConnectedUrlRedacted()
}
