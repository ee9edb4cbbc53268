package gateway

import (
	"container/list"
	"context"
	"errors"
	"math"
	"net/url"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpuscaler/gpuscaler/gateway/routes"
)

// routeState is what the gateway keeps of one route between requests: its queue's
// counter, its backend's readiness, the requests it holds and, with a concurrency, the
// requests in flight at each endpoint. A reload that keeps a route's name, queue,
// backend and concurrency keeps its state.
type routeState struct {
	name    string
	queue   string
	counter Counter
	backend string // backendKey of the route it was made for
	conc    int    // the route's Concurrency
	scheme  string // of the forwarding URLs
	path    string // a URL backend's base path, joined before the request's
	// fixed, when set, is where requests go while the backend is ready (the Service's
	// name, or the URL's host); else they go to an endpoint address.
	fixed string

	// The route's metrics, looked up once.
	heldGauge                    prometheus.Gauge
	holdSeconds, upstreamSeconds prometheus.Observer

	ctx    context.Context // ends when the route is removed or the gateway stops
	cancel context.CancelFunc
	wake   chan struct{} // tells a URL backend's prober that a request is held

	mu sync.Mutex // guards the fields below
	// ready: the backend can take requests; endpoints: the ready addresses (host:port).
	ready     bool
	endpoints []string
	// noSlices: a Service backend has no EndpointSlice at all.
	noSlices bool
	// noSlicesLogged: that was logged, once per state.
	noSlicesLogged bool
	inFlight       map[string]int // per endpoint, in concurrency mode
	held           int
	heldBytes      int64
	// waiters are the held requests, first come first: each gets where to go, in
	// order, as soon as the backend can take it.
	waiters list.List // of *waiter
}

// waiter is one held request.
type waiter struct {
	el    *list.Element // in routeState.waiters; nil once given an address
	addr  string        // where it goes, set before ready is closed
	ready chan struct{}
}

func newRouteState(parent context.Context, r *routes.Route, counter Counter, serviceAddr string, m *metrics) *routeState {
	ctx, cancel := context.WithCancel(parent)
	s := &routeState{
		heldGauge:       m.held.WithLabelValues(r.Name),
		holdSeconds:     m.holdSeconds.WithLabelValues(r.Name),
		upstreamSeconds: m.upstreamSeconds.WithLabelValues(r.Name),
		name:            r.Name,
		queue:           r.Queue,
		counter:         counter,
		backend:         r.BackendKey(),
		conc:            r.Concurrency,
		scheme:          "http",
		ctx:             ctx,
		cancel:          cancel,
		wake:            make(chan struct{}, 1),
		inFlight:        map[string]int{},
	}
	switch {
	case r.URL != nil:
		s.scheme, s.path = r.URL.Scheme, r.URL.Path
		if r.Concurrency == 0 {
			s.fixed = r.URL.Host
		}
	case r.Concurrency == 0:
		s.fixed = serviceAddr
	}
	return s
}

// onHold adds d to the route's held requests gauge.
func (s *routeState) onHold(d int) { s.heldGauge.Add(float64(d)) }

// setEndpoints records the backend's ready endpoints; noSlices says a Service has no
// EndpointSlice at all. Held requests that can now go are woken.
func (s *routeState) setEndpoints(endpoints []string, noSlices bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.endpoints, s.noSlices = endpoints, noSlices
	s.ready = len(endpoints) > 0
	s.dispatchLocked()
}

// dispatchLocked gives the held requests, first come first, where to go, for as long
// as the backend can take more.
func (s *routeState) dispatchLocked() {
	for s.waiters.Len() > 0 {
		addr, ok := s.tryAcquireLocked()
		if !ok {
			return
		}
		w := s.waiters.Remove(s.waiters.Front()).(*waiter)
		w.el, w.addr = nil, addr
		close(w.ready)
	}
}

// tryAcquireLocked returns where the next request goes, if it may go now: the fixed
// target of a ready backend, or in concurrency mode the ready endpoint with the fewest
// requests in flight below the concurrency, counting the request there.
func (s *routeState) tryAcquireLocked() (string, bool) {
	if !s.ready {
		return "", false
	}
	if s.fixed != "" {
		return s.fixed, true
	}
	best, bestN := "", s.conc
	for _, e := range s.endpoints {
		if n := s.inFlight[e]; n < bestN {
			best, bestN = e, n
		}
	}
	if best == "" {
		return "", false
	}
	s.inFlight[best]++
	return best, true
}

// release ends a request acquired at endpoint addr.
func (s *routeState) release(addr string) {
	if s.fixed != "" {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if n := s.inFlight[addr]; n <= 1 {
		delete(s.inFlight, addr)
	} else {
		s.inFlight[addr] = n - 1
	}
	s.dispatchLocked()
}

// heldNow returns the number of requests held.
func (s *routeState) heldNow() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.held
}

// targetURL returns the URL a request acquired at addr is forwarded to.
func (s *routeState) targetURL(addr string) *url.URL {
	return &url.URL{Scheme: s.scheme, Host: addr, Path: s.path}
}

// holdLimits bound what one route holds.
type holdLimits struct {
	maxHeld      int
	maxHeldBytes int64
}

// listed reports whether addr, acquired before, is still where requests may go: one of
// the ready endpoints, or the fixed target of a ready backend.
func (s *routeState) listed(addr string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fixed != "" {
		return s.ready && addr == s.fixed
	}
	return slices.Contains(s.endpoints, addr)
}

// rehold releases addr, where a request of n bytes went and that no longer takes it,
// and holds the request again, at the head of the line (it came before most of those
// held now; requests given an address while it was away keep it) and within no limit
// (it was let in), as acquire does. It returns the new address, or ""
// and the hold's error.
func (s *routeState) rehold(ctx context.Context, addr string, n int64, deadline time.Time) (string, error) {
	s.release(addr)
	return s.hold(ctx, n, deadline, holdLimits{maxHeld: math.MaxInt, maxHeldBytes: math.MaxInt64}, s.onHold, true)
}

// acquire returns where a request with a body of n bytes goes, holding it until the
// backend can take it, ctx ends (errClientGone), the deadline passes (errHoldTimeout)
// or the route goes (errRouteRemoved). Held requests go first come first, and a new
// one does not pass them. A request that would hold more than lim allows gets
// errOverflow at once. onHold is called with +1 when the request starts being held and
// -1 when it stops.
func (s *routeState) acquire(ctx context.Context, n int64, deadline time.Time, lim holdLimits, onHold func(int)) (string, error) {
	return s.hold(ctx, n, deadline, lim, onHold, false)
}

// hold is acquire, the request held at the head of the line when first is set.
func (s *routeState) hold(ctx context.Context, n int64, deadline time.Time, lim holdLimits, onHold func(int), first bool) (string, error) {
	s.mu.Lock()
	if s.waiters.Len() == 0 || first {
		if addr, ok := s.tryAcquireLocked(); ok {
			s.mu.Unlock()
			return addr, nil
		}
	}
	if s.held >= lim.maxHeld || s.heldBytes+n > lim.maxHeldBytes {
		s.mu.Unlock()
		return "", errOverflow
	}
	s.held++
	s.heldBytes += n
	w := &waiter{ready: make(chan struct{})}
	if first {
		w.el = s.waiters.PushFront(w)
	} else {
		w.el = s.waiters.PushBack(w)
	}
	s.mu.Unlock()
	onHold(1)
	defer func() {
		s.mu.Lock()
		s.held--
		s.heldBytes -= n
		s.mu.Unlock()
		onHold(-1)
	}()
	select {
	case s.wake <- struct{}{}:
	default:
	}
	timer := time.NewTimer(time.Until(deadline))
	defer timer.Stop()
	var err error
	select {
	case <-w.ready:
		return w.addr, nil
	case <-ctx.Done():
		err = errClientGone
	case <-timer.C:
		err = errHoldTimeout
	case <-s.ctx.Done():
		err = errRouteRemoved
	}
	s.mu.Lock()
	if w.el != nil {
		s.waiters.Remove(w.el)
		s.mu.Unlock()
		return "", err
	}
	s.mu.Unlock()
	// Given an address as it gave up: go there, unless the client is gone.
	if !errors.Is(err, errClientGone) {
		return w.addr, nil
	}
	s.release(w.addr)
	return "", err
}
