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
	"net"
	"strings"
	"sync"
	"sync/atomic"
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
	// closing is set by Close: a close the owner asked for is not worth a warning.
	closing atomic.Bool

	diag *diagnosis
}

// Connect opens a connection as opts says. It reconnects forever after a loss, waiting
// 1 s (plus jitter) between attempts, and buffers up to 8 MiB of publishes meanwhile.
// Each failed attempt is logged with the URL and its cause, the first at once and then
// at most every 10 s; Problem says the same to a caller.
func Connect(ctx context.Context, opts Options) (*Conn, error) {
	log := opts.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	natsOpts, err := opts.natsOptions()
	if err != nil {
		return nil, err
	}
	target := opts.target()
	c := &Conn{closed: make(chan struct{}), diag: newDiagnosis(target, log, !opts.RetryInitialConnect)}
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
		// nats.go gives up on a server that refuses the same credentials twice, and
		// closes the connection for good: a long-running part would then wait forever
		// on a dead connection. It retries instead, saying why each time (rate-limited),
		// so that mended credentials (a rewritten token file, a fixed account) are
		// picked up without a restart.
		nats.IgnoreAuthErrorAbort(),
		nats.SetCustomDialer(&dialer{Dialer: net.Dialer{Timeout: nats.DefaultTimeout}, diag: c.diag}),
		nats.ConnectHandler(func(nc *nats.Conn) {
			c.setDown(false)
			log.Info("connected to NATS", append([]any{"url", opts.connectedURL(nc)}, failedBefore(c.diag.connected())...)...)
		}),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			c.setDown(true)
			if err != nil {
				log.Warn("disconnected from NATS; reconnecting", "url", target, "err", err)
			}
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			c.setDown(false)
			log.Info("reconnected to NATS", append([]any{"url", opts.connectedURL(nc)}, failedBefore(c.diag.connected())...)...)
		}),
		// Called for a failed dial (the dialer has said why already), and, once, for the
		// first connect's failure when it is retried: a failed handshake is news.
		nats.ReconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil && !isDialError(err) && !errors.Is(err, nats.ErrNoServers) {
				c.diag.failed(err)
			}
		}),
		nats.ClosedHandler(func(nc *nats.Conn) {
			c.closeOnce.Do(func() { close(c.closed) })
			if !c.closing.Load() {
				log.Error("the connection to NATS is closed for good", "url", target, "err", nc.LastError())
			}
		}),
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
		c.closing.Store(true)
		go func() {
			if r := <-done; r.nc != nil {
				r.nc.Close()
			}
		}()
		if cause := c.diag.lastCause(); cause != nil {
			return nil, fmt.Errorf("connect to NATS at %s: %w (the last attempt: %s: %w)", target, ctx.Err(), reason(cause), cause)
		}
		return nil, fmt.Errorf("connect to NATS at %s: %w", target, ctx.Err())
	case r := <-done:
		if r.err != nil {
			err := r.err
			// nats.go reads a refused dial as "no servers available"; the dialer saw why.
			if cause := c.diag.lastCause(); errors.Is(err, nats.ErrNoServers) && cause != nil {
				err = cause
			}
			return nil, fmt.Errorf("connect to NATS at %s: %s: %w", target, reason(err), err)
		}
		c.Conn = r.nc
		c.diag.speak()
		go c.watchHandshakes(r.nc.StatusChanged(nats.CONNECTING, nats.CONNECTED, nats.RECONNECTING, nats.DISCONNECTED))
		if tf != nil {
			go tf.watch(c, opts.TokenFileCheck)
		}
		return c, nil
	}
}

// Close closes the connection for good.
func (c *Conn) Close() {
	c.closing.Store(true)
	c.Conn.Close()
}

// failedBefore is the log attributes of a connection made after failed attempts.
func failedBefore(n int) []any {
	if n == 0 {
		return nil
	}
	return []any{"failedAttemptsBefore", n}
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

// target names where the connection goes, for messages: the URL list with its
// credentials hidden, or "in-process". An in-process connection has no URL; the default
// one nats.go is given would point a reader at the wrong port.
func (o Options) target() string {
	if o.InProcess != nil {
		return "in-process"
	}
	if o.URLs == "" {
		return DefaultURL
	}
	return redact(o.URLs)
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
