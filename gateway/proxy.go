package gateway

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/http/httputil"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/gpuscaler/gpuscaler/gateway/routes"
)

// forward is what the proxy's hooks need of one forwarded request, found in its
// context.
type forward struct {
	state    *routeState
	route    *routes.Route
	addr     string                  // the endpoint, or fixed target, acquired; "" once released
	deadline time.Time               // the end of the hold budget, which bounds dial retries
	client   context.Context         // the client's request context
	ctx      context.Context         // the upstream request's
	cancel   context.CancelCauseFunc // cancels the upstream request
	code     int                     // set by the error handler
	reason   string
	conn     connTrace // the last attempt's connection (retryTransport)
	resent   bool      // sent again after its idle connection was closed (retryTransport)
}

type forwardKey struct{}

// ServeHTTP routes, holds, forwards and counts one request.
func (g *Gateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	g.active.Add(1)
	defer g.active.Done()
	rt := g.routing.Load()
	var route *routes.Route
	if rt != nil {
		route = rt.table.Match(r)
	}
	if route == nil {
		writeError(w, http.StatusNotFound, ReasonNoRoute, fmt.Sprintf("no route for host %q and path %q", r.Host, r.URL.Path), 0)
		g.done(r, noRoute, http.StatusNotFound, ReasonNoRoute, 0)
		return
	}
	st := rt.states[route.Name]
	arrived := time.Now()

	body, err := readBody(w, r, g.cfg.MaxBodyBytes)
	if err != nil {
		var tooLarge *http.MaxBytesError
		switch {
		case errors.As(err, &tooLarge):
			writeError(w, http.StatusRequestEntityTooLarge, ReasonBodyTooLarge, fmt.Sprintf("request body over %d bytes", tooLarge.Limit), 0)
			g.done(r, route.Name, http.StatusRequestEntityTooLarge, ReasonBodyTooLarge, 0)
		default:
			g.done(r, route.Name, StatusClientClosed, "", 0) // the client went away or sent garbage
		}
		return
	}

	st.counter.Enqueued(1)
	deadline := arrived.Add(route.HoldTimeout)
	addr, err := st.acquire(r.Context(), int64(len(body)), deadline, g.limits, st.onHold)
	st.holdSeconds.Observe(time.Since(arrived).Seconds())
	if err != nil {
		st.counter.Dropped(1)
		g.refuse(w, r, st, route, err, time.Since(arrived))
		return
	}
	st.counter.Started(1)
	forwarded := time.Now()
	fw := &forward{state: st, route: route, addr: addr, deadline: deadline, client: r.Context()}
	rec := &recorder{ResponseWriter: w}
	defer func() {
		// ReverseProxy panics with http.ErrAbortHandler when a response breaks off
		// after its header went out; count it all the same.
		if fw.addr != "" { // where the request went last (see retryTransport)
			st.release(fw.addr)
		}
		st.counter.Finished(1)
		st.upstreamSeconds.Observe(time.Since(forwarded).Seconds())
		code := rec.code
		switch {
		case fw.client.Err() != nil:
			code = StatusClientClosed
		case fw.code != 0:
			code = fw.code
		case code == 0:
			code = http.StatusOK
		}
		if errors.Is(context.Cause(fw.ctx), errIdleTimeout) {
			fw.reason = ReasonIdleTimeout
		}
		g.done(r, route.Name, code, fw.reason, time.Since(arrived))
	}()
	ctx, cancel := context.WithCancelCause(httptrace.WithClientTrace(context.WithValue(r.Context(), forwardKey{}, fw), fw.conn.hooks()))
	defer cancel(nil)
	fw.ctx, fw.cancel = ctx, cancel
	out := r.WithContext(ctx)
	out.TransferEncoding = nil
	out.ContentLength = int64(len(body))
	out.Body, out.GetBody = http.NoBody, nil
	if len(body) > 0 {
		out.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
		out.Body, _ = out.GetBody()
	}
	g.proxy.ServeHTTP(rec, out)
}

// readBody reads r's body whole, up to max bytes (an *http.MaxBytesError beyond): it
// is kept to be sent again when a dial is refused.
func readBody(w http.ResponseWriter, r *http.Request, max int64) ([]byte, error) {
	if r.Body == nil || r.Body == http.NoBody || r.ContentLength == 0 {
		return nil, nil
	}
	if r.ContentLength > max {
		return nil, &http.MaxBytesError{Limit: max}
	}
	// Read as it arrives, never allocated from the Content-Length a client declares:
	// a client that declares 16 MiB and sends nothing would otherwise hold 16 MiB.
	return io.ReadAll(http.MaxBytesReader(w, r.Body, max))
}

// refuse answers a request that was never forwarded.
func (g *Gateway) refuse(w http.ResponseWriter, r *http.Request, st *routeState, route *routes.Route, err error, held time.Duration) {
	if errors.Is(err, errClientGone) {
		g.done(r, route.Name, StatusClientClosed, "", held)
		return
	}
	code, reason := g.answerUnheld(w, st, route, err)
	g.done(r, route.Name, code, reason, held)
}

// answerUnheld answers a request whose hold ended without a replica to take it
// (errOverflow, errRouteRemoved, errHoldTimeout), and returns the code and reason it
// answered with.
func (g *Gateway) answerUnheld(w http.ResponseWriter, st *routeState, route *routes.Route, err error) (int, string) {
	ns := g.cfg.Namespace
	switch {
	case errors.Is(err, errOverflow):
		writeError(w, http.StatusServiceUnavailable, ReasonOverflow,
			fmt.Sprintf("route %s holds as many requests as it may (%d requests, %d bytes) waiting for %s", route.Name, g.limits.maxHeld, g.limits.maxHeldBytes, route.BackendName()),
			g.cfg.RetryAfter)
		return http.StatusServiceUnavailable, ReasonOverflow
	case errors.Is(err, errRouteRemoved) && g.stopping.Load():
		writeError(w, http.StatusServiceUnavailable, ReasonShuttingDown, "the gateway is stopping; send the request again", g.cfg.RetryAfter)
		return http.StatusServiceUnavailable, ReasonShuttingDown
	case errors.Is(err, errRouteRemoved):
		writeError(w, http.StatusServiceUnavailable, ReasonRouteRemoved, fmt.Sprintf("route %s was removed while the request waited", route.Name), g.cfg.RetryAfter)
		return http.StatusServiceUnavailable, ReasonRouteRemoved
	default: // errHoldTimeout
		msg := fmt.Sprintf("%s had no ready replica within %s", route.BackendName(), route.HoldTimeout)
		st.mu.Lock()
		noSlices, logged := st.noSlices && route.ServiceName != "", st.noSlicesLogged
		if noSlices {
			msg = fmt.Sprintf("service %s has no endpoints in namespace %s", route.ServiceName, ns)
			st.noSlicesLogged = true
		}
		st.mu.Unlock()
		if noSlices && !logged {
			g.log.Warn("held requests time out: the route's Service has no EndpointSlice; is its name right?", "route", route.Name, "service", route.ServiceName, "namespace", ns)
		}
		writeError(w, http.StatusServiceUnavailable, ReasonHoldTimeout, msg, g.cfg.RetryAfter)
		return http.StatusServiceUnavailable, ReasonHoldTimeout
	}
}

// done counts and logs a request answered.
func (g *Gateway) done(r *http.Request, route string, code int, reason string, took time.Duration) {
	g.m.requests.WithLabelValues(route, strconv.Itoa(code)).Inc()
	level := slog.LevelDebug
	if reason != "" || code == StatusClientClosed {
		level = slog.LevelInfo
	}
	if !g.log.Enabled(r.Context(), level) {
		return
	}
	g.log.Log(r.Context(), level, "request", "route", route, "method", r.Method, "path", r.URL.Path, "code", code, "reason", reason, "took", took)
}

// newProxy makes the reverse proxy: to the acquired endpoint, retrying refused dials
// within the hold budget, with first-byte and idle timeouts, streams flushed as written.
func (g *Gateway) newProxy() *httputil.ReverseProxy {
	dialer := &net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}
	// HTTP/1.1 only, https backends included: a custom DialContext and no
	// ForceAttemptHTTP2 or Protocols keep the transport from HTTP/2, which
	// retryTransport's test of a reused connection assumes.
	base := &http.Transport{
		DialContext:           dialer.DialContext,
		MaxIdleConns:          1024,
		MaxIdleConnsPerHost:   256,
		IdleConnTimeout:       90 * time.Second,
		ResponseHeaderTimeout: g.cfg.FirstByteTimeout,
		ExpectContinueTimeout: time.Second,
	}
	return &httputil.ReverseProxy{
		Transport: &retryTransport{log: g.log, base: base, pause: g.cfg.DialRetry},
		Rewrite: func(pr *httputil.ProxyRequest) {
			fw := pr.In.Context().Value(forwardKey{}).(*forward)
			pr.SetURL(fw.state.targetURL(fw.addr))
			pr.SetXForwarded()
		},
		// ReverseProxy flushes text/event-stream and responses of unknown length
		// (chunked) at every write by itself (flushInterval in net/http/httputil), which
		// is every stream an inference server sends; a response of known length goes
		// out in one write, not one per read: an eighth more requests a second through
		// the gateway on two cores (BenchmarkThroughput).
		FlushInterval: 0,
		ModifyResponse: func(resp *http.Response) error {
			fw := resp.Request.Context().Value(forwardKey{}).(*forward)
			resp.Body = newIdleBody(resp.Body, g.cfg.IdleTimeout, fw.cancel)
			return nil
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			fw := r.Context().Value(forwardKey{}).(*forward)
			switch {
			case fw.client.Err() != nil:
				fw.code = StatusClientClosed // nobody to answer
			case errors.Is(err, errHoldTimeout), errors.Is(err, errRouteRemoved):
				// Given back to the hold by retryTransport, and no replica took it.
				fw.code, fw.reason = g.answerUnheld(w, fw.state, fw.route, err)
				return
			case isDialError(err):
				fw.code, fw.reason = http.StatusBadGateway, ReasonUnreachable
				writeError(w, fw.code, fw.reason, fmt.Sprintf("%s refused connections until the hold timeout: %v", fw.state.name, err), g.cfg.RetryAfter)
			case isTimeout(err):
				fw.code, fw.reason = http.StatusGatewayTimeout, ReasonFirstByte
				writeError(w, fw.code, fw.reason, fmt.Sprintf("upstream sent no response header within %s", g.cfg.FirstByteTimeout), 0)
			default:
				fw.code, fw.reason = http.StatusBadGateway, ReasonUpstreamError
				writeError(w, fw.code, fw.reason, fmt.Sprintf("upstream: %v", err), 0)
			}
			if fw.code != StatusClientClosed {
				g.log.Warn("upstream failed", "route", fw.state.name, "endpoint", fw.addr, "err", err)
			}
		},
		ErrorLog:   slog.NewLogLogger(g.log.Handler(), slog.LevelDebug),
		BufferPool: &bufferPool{},
	}
}

// bufferPool keeps ReverseProxy's copy buffers between responses; it would otherwise
// allocate 32 KiB for each.
type bufferPool struct{ p sync.Pool }

func (b *bufferPool) Get() []byte {
	if buf, ok := b.p.Get().(*[]byte); ok {
		return *buf
	}
	return make([]byte, 32<<10)
}

func (b *bufferPool) Put(buf []byte) { b.p.Put(&buf) }

// retryTransport sends a request again, within its hold deadline, when it did not run:
//   - a refused dial (nothing was sent): again after a short fixed pause, as a replica
//     that just turned ready may not listen yet;
//   - a connection that had been idle, closed by the server before any byte of an
//     answer: once, at once, on a new connection. A server closes its idle keep-alive
//     connections when it shuts down (its pod deleted at a scale-down), and one may be
//     taken for a request in the instant before the close arrives. Go's transport
//     resends only idempotent methods there; an inference request is a POST, and runs
//     nowhere until it is sent again. (A server that read the request and died before
//     answering gets it twice; an inference request has no effect but its answer.)
//     This holds for HTTP/1.1, one request per connection at a time, which is all the
//     transport speaks (newProxy): over HTTP/2 nearly every request is on a reused
//     connection, and a stream lost mid-work would be sent again.
//
// When the endpoint it went to has meanwhile left the route's ready endpoints, the
// request goes back to the hold instead (at the head of the line), and on to a replica
// that takes it or to the hold's usual end: its timeout, or its client gone.
type retryTransport struct {
	log   *slog.Logger
	base  http.RoundTripper
	pause time.Duration
}

func (t *retryTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	fw, _ := req.Context().Value(forwardKey{}).(*forward)
	if fw == nil {
		return t.base.RoundTrip(req)
	}
	for {
		fw.conn.reused.Store(false)
		fw.conn.answered.Store(false)
		resp, err := t.base.RoundTrip(req)
		if err == nil || req.Context().Err() != nil {
			return resp, err
		}
		var pause time.Duration
		switch {
		case isDialError(err):
			pause = t.pause
		case fw.conn.reused.Load() && !fw.conn.answered.Load() && !isTimeout(err) && !fw.resent && time.Now().Before(fw.deadline):
			// Once per request: the idle connections left may be to the same closing
			// server, so they go, and the request goes out on a new one. A request that
			// breaks its server itself is then sent twice at most, not once per pooled
			// connection.
			fw.resent = true
			t.log.Debug("the server closed an idle connection; sending again", "route", fw.state.name, "endpoint", fw.addr, "err", err)
			if ci, ok := t.base.(interface{ CloseIdleConnections() }); ok {
				ci.CloseIdleConnections()
			}
		default:
			return resp, err
		}
		if !fw.state.listed(fw.addr) {
			t.log.Debug("endpoint gone; holding the request for another", "route", fw.state.name, "endpoint", fw.addr, "err", err)
			addr, herr := fw.state.rehold(req.Context(), fw.addr, req.ContentLength, fw.deadline)
			fw.addr = addr
			if herr != nil {
				return nil, herr
			}
			again := *req
			u := *req.URL
			target := fw.state.targetURL(addr)
			u.Scheme, u.Host = target.Scheme, target.Host
			again.URL = &u
			req = &again
		} else if pause > 0 {
			if time.Until(fw.deadline) < pause {
				return resp, err
			}
			t.log.Debug("connection refused; dialling again", "route", fw.state.name, "endpoint", fw.addr, "err", err)
			timer := time.NewTimer(pause)
			select {
			case <-req.Context().Done():
				timer.Stop()
				return nil, err
			case <-timer.C:
			}
		}
		if req.GetBody != nil {
			again := *req
			if again.Body, err = req.GetBody(); err != nil {
				return nil, err
			}
			req = &again
		}
	}
}

// connTrace is what an attempt to send a request learnt of its connection: whether it
// had been used before, and whether any byte of an answer came back on it. The
// transport calls its hooks from its own goroutines.
type connTrace struct {
	reused, answered atomic.Bool
}

func (c *connTrace) hooks() *httptrace.ClientTrace {
	return &httptrace.ClientTrace{
		GotConn:              func(i httptrace.GotConnInfo) { c.reused.Store(i.Reused) },
		GotFirstResponseByte: func() { c.answered.Store(true) },
	}
}

// isDialError reports whether err is a failure to connect: nothing was sent.
func isDialError(err error) bool {
	var op *net.OpError
	return errors.Is(err, syscall.ECONNREFUSED) || (errors.As(err, &op) && op.Op == "dial")
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// idleBody cancels the upstream request when no read of the body returns within the
// idle timeout. A stream may last as long as it keeps sending.
type idleBody struct {
	io.ReadCloser
	idle  time.Duration
	timer *time.Timer
}

func newIdleBody(rc io.ReadCloser, idle time.Duration, cancel context.CancelCauseFunc) *idleBody {
	return &idleBody{ReadCloser: rc, idle: idle, timer: time.AfterFunc(idle, func() { cancel(errIdleTimeout) })}
}

func (b *idleBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	b.timer.Reset(b.idle)
	return n, err
}

func (b *idleBody) Close() error {
	b.timer.Stop()
	return b.ReadCloser.Close()
}

// recorder remembers the status code written through it.
type recorder struct {
	http.ResponseWriter
	code int
}

func (r *recorder) WriteHeader(code int) {
	if r.code == 0 && code >= 200 {
		r.code = code
	}
	r.ResponseWriter.WriteHeader(code)
}

func (r *recorder) Write(p []byte) (int, error) {
	if r.code == 0 {
		r.code = http.StatusOK
	}
	return r.ResponseWriter.Write(p)
}

// Flush lets ReverseProxy flush every write of a stream.
func (r *recorder) Flush() {
	_ = http.NewResponseController(r.ResponseWriter).Flush()
}

func (r *recorder) Unwrap() http.ResponseWriter { return r.ResponseWriter }
