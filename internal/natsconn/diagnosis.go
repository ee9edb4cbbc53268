package natsconn

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
)

// ErrNotConnected marks the errors Conn.Problem and Conn.Explain return: the connection to
// NATS is down. errors.Is finds it.
var ErrNotConnected = errors.New("NATS is not connected")

// failureLogEvery is how often, at most, a connection that keeps failing to reach NATS
// logs why. The first failure after the connection was up (or at start) is logged at once.
const failureLogEvery = 10 * time.Second

// errHandshake stands for the cause of a failed NATS handshake that nats.go had already
// forgotten when it was asked (a list of URLs tried without a pause between them).
var errHandshake = errors.New("the NATS handshake failed")

// diagnosis follows one connection's attempts to reach NATS and says why they fail: in
// the log (the first failure at once, then at most once per every, with the number of
// failed attempts since the last line) and to callers, as an error (Conn.Problem).
//
// nats.go reports failed attempts unevenly: its reconnect error handler hears of a dial
// that failed, but not of a TLS or authorization failure after the dial, and its first
// connect turns "connection refused" into "no servers available". So the dialer reports
// every dial (see dialer), a status listener reports every failed handshake (see
// Conn.watchHandshakes), and the reconnect error handler only what neither can see.
type diagnosis struct {
	target string // where the connection goes: the redacted URL list, or "in-process"
	log    *slog.Logger
	every  time.Duration
	now    func() time.Time

	mu sync.Mutex // guards the fields below
	// quiet holds back log lines while a first connect that is not retried runs: its
	// failure is returned to the caller instead.
	quiet bool
	// failures counts failed attempts since the connection was last up; unlogged, those
	// not yet counted in a log line.
	failures, unlogged int
	// logged is when a failure was last logged, zero when none was since the connection
	// was last up.
	logged time.Time
	// cause is why the last attempt failed, nil when none has since the connection was
	// last up.
	cause error
}

func newDiagnosis(target string, log *slog.Logger, quiet bool) *diagnosis {
	return &diagnosis{target: target, log: log, every: failureLogEvery, now: time.Now, quiet: quiet}
}

// failed records a failed attempt and why, and logs it unless a line was logged less
// than every ago.
func (d *diagnosis) failed(err error) {
	now := d.now()
	d.mu.Lock()
	d.failures++
	d.unlogged++
	d.cause = err
	if d.quiet || (!d.logged.IsZero() && now.Sub(d.logged) < d.every) {
		d.mu.Unlock()
		return
	}
	n := d.unlogged
	d.unlogged, d.logged = 0, now
	d.mu.Unlock()
	d.log.Warn("cannot connect to NATS; retrying (logged at once, then at most every "+d.every.String()+")",
		"url", d.target, "reason", reason(err), "err", err, "failedAttempts", n)
}

// speak lets failures be logged from now on.
func (d *diagnosis) speak() {
	d.mu.Lock()
	d.quiet = false
	d.mu.Unlock()
}

// connected records that the connection is up, and returns how many attempts failed
// before.
func (d *diagnosis) connected() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	n := d.failures
	d.failures, d.unlogged, d.logged, d.cause = 0, 0, time.Time{}, nil
	return n
}

// lastCause is why the last attempt failed, nil when none has since the connection was
// last up.
func (d *diagnosis) lastCause() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.cause
}

// problem is the error Conn.Problem returns for a connection down for down.
func (d *diagnosis) problem(down time.Duration, closed bool) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	return &notConnectedError{target: d.target, down: down, failures: d.failures, cause: d.cause, closed: closed}
}

// notConnectedError says that the connection to NATS is down, for how long, and why.
type notConnectedError struct {
	target   string
	down     time.Duration
	failures int
	cause    error
	closed   bool
}

func (e *notConnectedError) Error() string {
	if e.closed {
		if e.cause == nil {
			return fmt.Sprintf("the connection to NATS at %s is closed", e.target)
		}
		return fmt.Sprintf("the connection to NATS at %s is closed: %s: %v", e.target, reason(e.cause), e.cause)
	}
	down := ""
	if e.down > 0 {
		down = " for " + e.down.Round(time.Second).String()
	}
	if e.cause == nil {
		return fmt.Sprintf("not connected to NATS at %s%s (connecting)", e.target, down)
	}
	attempts := "1 failed attempt"
	if e.failures != 1 {
		attempts = fmt.Sprintf("%d failed attempts", e.failures)
	}
	return fmt.Sprintf("not connected to NATS at %s%s (%s; the last: %s: %v)", e.target, down, attempts, reason(e.cause), e.cause)
}

func (e *notConnectedError) Is(target error) bool { return target == ErrNotConnected }

func (e *notConnectedError) Unwrap() error { return e.cause }

// explainedError is an error of an operation on NATS that ran out of time, or found the
// connection closed, while the connection was down: the problem first, then the error.
type explainedError struct {
	problem, err error
}

func (e *explainedError) Error() string   { return e.problem.Error() + ": " + e.err.Error() }
func (e *explainedError) Unwrap() []error { return []error{e.problem, e.err} }

// Problem says why the connection is down, or nil while it is up: where it tries to
// connect, for how long it has been down, how many attempts failed and why the last did.
// The error wraps ErrNotConnected and the last attempt's cause.
func (c *Conn) Problem() error {
	if c.IsConnected() {
		return nil
	}
	return c.diag.problem(c.DownFor(), c.IsClosed())
}

// Explain returns err, from an operation on NATS, with the connection's Problem in
// front when the operation ran out of time or found the connection closed while the
// connection was down: "context deadline exceeded" alone does not tell an operator that
// nothing answers at the URL. Other errors, and errors while connected, are returned as
// they are. errors.Is still finds what err wraps.
func (c *Conn) Explain(err error) error {
	if err == nil || errors.Is(err, ErrNotConnected) {
		return err
	}
	if !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, nats.ErrTimeout) && !errors.Is(err, nats.ErrConnectionClosed) {
		return err
	}
	problem := c.Problem()
	if problem == nil {
		return err
	}
	return &explainedError{problem: problem, err: err}
}

// watchHandshakes reports each failed handshake to the diagnosis until the connection
// closes. nats.go calls no handler when an attempt dials but fails its handshake (TLS,
// authorization, a server that never says hello); it only moves the status from
// CONNECTING back to RECONNECTING, with the cause in LastError, which it keeps until the
// next attempt ends. Every attempt to one server waits a second first, so the cause read
// here is that attempt's; with a list of URLs, a cause already overwritten by the next
// server's attempt reads as errHandshake.
func (c *Conn) watchHandshakes(ch chan nats.Status) {
	defer c.RemoveStatusListener(ch)
	var prev nats.Status
	for {
		select {
		case <-c.closed:
			return
		case s := <-ch:
			if prev == nats.CONNECTING && (s == nats.RECONNECTING || s == nats.DISCONNECTED) {
				err := c.LastError()
				if err == nil {
					err = errHandshake
				}
				c.diag.failed(err)
			}
			prev = s
		}
	}
}

// dialer is nats.go's dialer with every failed dial reported to the diagnosis as it
// happens, with the dial's own error: nats.go's first connect would hide a refused one
// behind "no servers available".
type dialer struct {
	net.Dialer
	diag *diagnosis
}

func (d *dialer) Dial(network, address string) (net.Conn, error) {
	conn, err := d.Dialer.Dial(network, address)
	if err != nil {
		d.diag.failed(err)
	}
	return conn, err
}

// isDialError reports whether err is one the dialer has reported already.
func isDialError(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}

// reason says in a few words what err means for reaching NATS, for an operator reading
// the log: whether anything listens, answers, speaks TLS, or accepts the credentials.
func reason(err error) string {
	var (
		dns      *net.DNSError
		op       *net.OpError
		verify   *tls.CertificateVerificationError
		unknown  x509.UnknownAuthorityError
		hostname x509.HostnameError
		invalid  x509.CertificateInvalidError
		record   tls.RecordHeaderError
	)
	switch {
	case err == nil:
		return "no cause known"
	case errors.Is(err, syscall.ECONNREFUSED):
		return "nothing listens there (connection refused)"
	case errors.As(err, &dns):
		return "the host name does not resolve"
	case errors.Is(err, nats.ErrAuthorization), errors.Is(err, nats.ErrAuthExpired), errors.Is(err, nats.ErrAuthRevoked),
		errors.Is(err, nats.ErrAccountAuthExpired):
		return "the server refused the credentials"
	case errors.Is(err, nats.ErrSecureConnWanted):
		return "TLS is wanted (a tls:// URL or a --nats-tls flag), but the server offers none"
	case errors.Is(err, nats.ErrSecureConnRequired):
		return "the server requires TLS"
	case errors.As(err, &verify), errors.As(err, &unknown), errors.As(err, &hostname), errors.As(err, &invalid):
		return "the TLS handshake failed: the server's certificate is not trusted"
	case errors.As(err, &op) && op.Op == "remote error":
		return "the TLS handshake failed: the server refused this client's certificate"
	case errors.Is(err, nats.ErrTLS), errors.As(err, &record):
		return "the TLS handshake failed"
	case errors.Is(err, nats.ErrNoServers):
		return "no server could be reached"
	case errors.Is(err, nats.ErrTimeout), isTimeout(err):
		return "no answer in time (timeout)"
	case errors.Is(err, errHandshake):
		return "the server did not complete the NATS handshake"
	}
	return "the attempt failed"
}

// isTimeout reports whether err is a network timeout: a dial or a read that waited too long.
func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
