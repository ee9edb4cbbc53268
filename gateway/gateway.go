// Package gateway is gpuscaler's front door for HTTP inference services (vLLM, SGLang,
// TGI, any OpenAI-compatible API): a reverse proxy a namespace runs in front of its
// Services. Each route of a routes file sends the requests it matches (host, path
// prefix, header) to a Service of the gateway's namespace, or to a URL, and counts them
// in a queue through gpuscaler's producer API (queue): a request is waiting
// from its arrival until it is forwarded, and in flight until its response's last byte
// or until its client goes away.
//
// While a route's backend has no ready replica (its EndpointSlices show none, or a URL
// backend's health check fails), requests are held, not refused: the queue the scaler
// reads then says there is work, which wakes a workload scaled to zero, and the first
// ready endpoint releases them. A request held longer than its route's hold timeout
// gets a 503 with Retry-After and an OpenAI-compatible JSON error. Streams (SSE,
// chunked) are passed through as they are written; a client that goes away cancels the
// upstream request, so the engine frees what it held for it.
//
// The gateway is a producer and nothing more: it meets the scaler only in the events
// it publishes, and imports none of the scaler's code.
package gateway

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/dynamic"

	"github.com/gpuscaler/gpuscaler/gateway/routes"
)

// Counter is what the gateway needs of a queue producer (queue.Reporter
// satisfies it). Its methods must be safe for concurrent use and must not block.
type Counter interface {
	Enqueued(n int) // n more waiting (arrivals)
	Started(n int)  // n moved from waiting to in flight (forwarded upstream)
	Finished(n int) // n in flight done (last byte of response, or client gone mid-response)
	Dropped(n int)  // n waiting items that left without being served: counted apart from completions
	// ColdStart records how long a new backend replica took to serve, as the gateway
	// last measured it, for every later report (see coldStarts).
	ColdStart(d time.Duration)
	Close() error // last report, marked as a clean stop
}

// Defaults for the zero Config.
const (
	DefaultMaxHeld           = 1000
	DefaultMaxHeldBytes      = 64 << 20
	DefaultMaxBodyBytes      = 16 << 20
	DefaultMaxHeaderBytes    = 64 << 10
	DefaultFirstByteTimeout  = 10 * time.Minute
	DefaultIdleTimeout       = 5 * time.Minute
	DefaultShutdownGrace     = 30 * time.Second
	DefaultHeldProbeInterval = 100 * time.Millisecond
	DefaultIdleProbeInterval = 3 * time.Second
	DefaultRoutesPoll        = 2 * time.Second
	DefaultDialRetry         = 50 * time.Millisecond
	DefaultRetryAfter        = 5 * time.Second
)

// Config sets up a Gateway. Only RoutesFile is required; the zero value of every other
// field means its default.
type Config struct {
	// RoutesFile is the routes file (ParseRoutes), read at New and polled for changes
	// every RoutesPoll (a mounted ConfigMap changes by a symlink swap, which a poll of
	// the content sees).
	RoutesFile string
	RoutesPoll time.Duration
	// Namespace is the gateway's namespace: its routes' Services are there.
	Namespace string
	// Kube reads the namespace's EndpointSlices (EndpointSlicesResource). Nil means no
	// Kubernetes: Service routes are then refused.
	Kube dynamic.Interface
	// NewCounter makes the counter of a queue; the gateway closes it when no route
	// counts in that queue any more, and at the end of Run. Nil counts nothing.
	NewCounter func(queue string) (Counter, error)
	// ServiceAddr returns the host:port that reaches a Service's port (kube-proxy
	// balances it). Nil means ClusterServiceAddr.
	ServiceAddr func(name, namespace string, port int) string

	// Per route: held requests, and the bytes of their bodies (default 1000, 64 MiB).
	MaxHeld      int
	MaxHeldBytes int64
	// MaxBodyBytes bounds a request body (413 beyond; default 16 MiB), MaxHeaderBytes
	// its header (431 beyond; default 64 KiB).
	MaxBodyBytes   int64
	MaxHeaderBytes int
	// FirstByteTimeout bounds the wait for a response's header once forwarded (default
	// 10m: a long prompt takes long to its first token), IdleTimeout the wait between two
	// reads of its body (default 5m). Nothing bounds a stream's total time.
	FirstByteTimeout time.Duration
	IdleTimeout      time.Duration
	// ShutdownGrace is how long Run lets in-flight and held requests finish once its
	// context ends (default 30s).
	ShutdownGrace time.Duration
	// HeldProbeInterval and IdleProbeInterval are how often a URL backend is probed
	// while its route holds requests (default 100ms), and otherwise (default 3s).
	HeldProbeInterval time.Duration
	IdleProbeInterval time.Duration
	// DialRetry is the pause before dialling again an endpoint that refused the
	// connection (a model server that is ready but not listening yet), within the hold
	// timeout (default 50ms).
	DialRetry time.Duration
	// RetryAfter is what 503 answers tell clients to wait (default 5s).
	RetryAfter time.Duration

	// Log receives the gateway's logs; nil discards them.
	Log *slog.Logger
	// Registerer receives the gateway's metrics; nil registers none.
	Registerer prometheus.Registerer
	// Now is the clock cold starts are measured by; nil means time.Now.
	Now func() time.Time
}

func (c *Config) defaults() {
	setDefault(&c.RoutesPoll, DefaultRoutesPoll)
	setDefault(&c.MaxHeld, DefaultMaxHeld)
	setDefault(&c.MaxHeldBytes, DefaultMaxHeldBytes)
	setDefault(&c.MaxBodyBytes, DefaultMaxBodyBytes)
	setDefault(&c.MaxHeaderBytes, DefaultMaxHeaderBytes)
	setDefault(&c.FirstByteTimeout, DefaultFirstByteTimeout)
	setDefault(&c.IdleTimeout, DefaultIdleTimeout)
	setDefault(&c.ShutdownGrace, DefaultShutdownGrace)
	setDefault(&c.HeldProbeInterval, DefaultHeldProbeInterval)
	setDefault(&c.IdleProbeInterval, DefaultIdleProbeInterval)
	setDefault(&c.DialRetry, DefaultDialRetry)
	setDefault(&c.RetryAfter, DefaultRetryAfter)
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.ServiceAddr == nil {
		c.ServiceAddr = ClusterServiceAddr
	}
	if c.NewCounter == nil {
		c.NewCounter = func(string) (Counter, error) { return nopCounter{}, nil }
	}
}

// ClusterServiceAddr is where a Service's port is reached inside the cluster, through
// its cluster DNS name: "<name>.<namespace>.svc:<port>" (kube-proxy balances it).
func ClusterServiceAddr(name, namespace string, port int) string {
	return fmt.Sprintf("%s.%s.svc:%d", name, namespace, port)
}

func setDefault[T int | int64 | time.Duration](v *T, def T) {
	if *v <= 0 {
		*v = def
	}
}

type nopCounter struct{}

func (nopCounter) Enqueued(int)            {}
func (nopCounter) Started(int)             {}
func (nopCounter) Finished(int)            {}
func (nopCounter) Dropped(int)             {}
func (nopCounter) ColdStart(time.Duration) {}
func (nopCounter) Close() error            { return nil }

// Gateway is the front door. Serve it with Run; it is an http.Handler too.
type Gateway struct {
	cfg     Config
	log     *slog.Logger
	m       *metrics
	proxy   *httputil.ReverseProxy
	probes  *http.Client
	slices  *sliceWatcher // nil without Kubernetes
	starts  *coldStarts   // the Service backends' cold starts
	limits  holdLimits
	routing atomic.Pointer[routing] // nil until Run applies the first routes
	// stopping: Run's grace is over; held requests are answered "shutting-down".
	stopping atomic.Bool
	active   sync.WaitGroup // requests being served, and the probers

	mu       sync.Mutex // guards the fields below, and replacing routing
	initial  *routes.Table
	lastData []byte                    // the routes file's content last read
	counters map[string]*sharedCounter // by queue
	base     context.Context           // the route states' parent; set by Run
}

// routing is one generation of routes: a table and the state of each of its routes, by
// name. It is replaced whole on a reload, never changed.
type routing struct {
	table  *routes.Table
	states map[string]*routeState
}

// sharedCounter is one queue's counter and the number of route states counting in it.
type sharedCounter struct {
	Counter
	refs int
}

// New reads the routes file and makes a Gateway; it serves nothing until Run. A routes
// file that does not parse, or names a Service without Kubernetes, is an error.
func New(cfg Config) (*Gateway, error) {
	cfg.defaults()
	g := &Gateway{
		cfg:      cfg,
		log:      cfg.Log,
		m:        newMetrics(cfg.Registerer),
		limits:   holdLimits{maxHeld: cfg.MaxHeld, maxHeldBytes: cfg.MaxHeldBytes},
		counters: map[string]*sharedCounter{},
		probes:   &http.Client{Transport: &http.Transport{DisableKeepAlives: true}},
		starts:   newColdStarts(cfg.Now),
	}
	t, data, err := g.readRoutes()
	if err != nil {
		return nil, err
	}
	g.initial, g.lastData = t, data
	g.proxy = g.newProxy()
	if cfg.Kube != nil {
		if g.slices, err = newSliceWatcher(cfg.Kube, cfg.Namespace, g.serviceChanged); err != nil {
			return nil, fmt.Errorf("watch EndpointSlices: %w", err)
		}
	}
	return g, nil
}

// readRoutes reads and checks the routes file.
func (g *Gateway) readRoutes() (*routes.Table, []byte, error) {
	data, err := os.ReadFile(g.cfg.RoutesFile)
	if err != nil {
		return nil, nil, fmt.Errorf("routes file: %w", err)
	}
	t, err := routes.Parse(g.cfg.RoutesFile, data)
	if err != nil {
		return nil, data, err
	}
	if g.cfg.Kube == nil {
		for _, r := range t.Routes() {
			if r.ServiceName != "" {
				return nil, data, fmt.Errorf("%w: %s: route %q: service %s needs the Kubernetes API, and there is none (--kubeconfig none): use url",
					routes.ErrInvalid, g.cfg.RoutesFile, r.Name, r.ServiceName)
			}
		}
	}
	return t, data, nil
}

// Ready says why the gateway cannot serve yet: routes not applied, or the
// EndpointSlices not read yet. Nil when it can.
func (g *Gateway) Ready() error {
	if g.routing.Load() == nil {
		return errors.New("routes not loaded yet")
	}
	if g.slices != nil && !g.slices.synced() {
		return errors.New("EndpointSlices not read yet")
	}
	return nil
}

// Run serves clients on lis until ctx ends, following the routes file and the
// backends' readiness. Then it stops accepting connections, lets requests in flight and
// held finish for up to ShutdownGrace, cuts the rest, and closes every counter (their
// last report says they stopped). It returns nil after that clean stop.
func (g *Gateway) Run(ctx context.Context, lis net.Listener) error {
	base, stop := context.WithCancel(context.WithoutCancel(ctx))
	defer stop()
	var bg sync.WaitGroup
	if g.slices != nil {
		bg.Go(func() { g.slices.run(base) })
	}
	g.mu.Lock()
	g.base = base
	err := g.applyLocked(g.initial)
	g.initial = nil
	g.mu.Unlock()
	if err != nil {
		stop()
		bg.Wait()
		return err
	}
	bg.Go(func() { g.watchRoutes(base) })

	srv := &http.Server{
		Handler:           g,
		MaxHeaderBytes:    g.cfg.MaxHeaderBytes,
		ReadHeaderTimeout: time.Minute,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(g.log.Handler(), slog.LevelDebug),
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(lis) }()
	g.log.Info("serving", "addr", lis.Addr().String(), "routes", len(g.routing.Load().table.Routes()))
	var serveErr error
	select {
	case serveErr = <-errc:
		serveErr = fmt.Errorf("gateway listener %s: %w", lis.Addr(), serveErr)
	case <-ctx.Done():
	}

	graceCtx, cancel := context.WithTimeout(context.Background(), g.cfg.ShutdownGrace)
	defer cancel()
	g.log.Info("stopping: letting requests in flight and held finish", "grace", g.cfg.ShutdownGrace)
	if err := srv.Shutdown(graceCtx); err != nil {
		// Held requests get a 503 with Retry-After, which a client can act on, rather
		// than a cut connection; then what is left in flight is cut.
		g.log.Warn("shutdown grace over: answering held requests 503 and cutting those in flight", "err", err)
		g.stopping.Store(true)
		stop()
		g.awaitNoneHeld(time.Second)
		srv.Close()
	}
	stop()          // ends the probers and the watchers
	bg.Wait()       // no reload starts a prober after this
	g.active.Wait() // the requests cut and the probers return
	g.mu.Lock()
	defer g.mu.Unlock()
	for q, c := range g.counters {
		if err := c.Close(); err != nil {
			g.log.Warn("close queue counter", "queue", q, "err", err)
		}
		delete(g.counters, q)
	}
	return serveErr
}

// awaitNoneHeld waits up to timeout for every held request to have been answered.
func (g *Gateway) awaitNoneHeld(timeout time.Duration) {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		held := 0
		for _, s := range g.routing.Load().states {
			held += s.heldNow()
		}
		if held == 0 {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// watchRoutes reloads the routes file whenever its content changes, until ctx ends.
func (g *Gateway) watchRoutes(ctx context.Context) {
	t := time.NewTicker(g.cfg.RoutesPoll)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		g.reload()
	}
}

// reload reads the routes file and applies it if it changed; a broken file is logged
// and counted, and the routes in force stay.
func (g *Gateway) reload() {
	g.mu.Lock()
	defer g.mu.Unlock()
	data, err := os.ReadFile(g.cfg.RoutesFile)
	if err == nil && bytes.Equal(data, g.lastData) {
		return
	}
	if err == nil {
		g.lastData = data
		var t *routes.Table
		if t, _, err = g.readRoutes(); err == nil {
			err = g.applyLocked(t)
		}
	}
	if err != nil {
		g.m.reloads.WithLabelValues("error").Inc()
		g.log.Error("routes file not applied; the last good routes stay", "file", g.cfg.RoutesFile, "err", err)
		return
	}
	g.m.reloads.WithLabelValues("ok").Inc()
	g.log.Info("routes reloaded", "file", g.cfg.RoutesFile, "routes", len(g.routing.Load().table.Routes()))
}

// applyLocked puts table t in force: a route whose name, queue, backend and concurrency
// are unchanged keeps its state (held requests, counts); the others get new ones, and
// the states of routes gone end (their held requests get 503 route-removed) and release
// their queue's counter, closed when no route counts in it any more.
func (g *Gateway) applyLocked(t *routes.Table) error {
	old := g.routing.Load()
	next := &routing{table: t, states: map[string]*routeState{}}
	var made []*routeState
	for _, r := range t.Routes() {
		if old != nil {
			if s := old.states[r.Name]; s != nil && s.queue == r.Queue && s.backend == r.BackendKey() && s.conc == r.Concurrency {
				next.states[r.Name] = s
				continue
			}
		}
		c, err := g.counterLocked(r.Queue)
		if err != nil {
			for _, s := range made {
				s.cancel()
				g.releaseCounterLocked(s.queue)
			}
			return fmt.Errorf("route %q: queue %s: %w", r.Name, r.Queue, err)
		}
		s := newRouteState(g.base, r, c, g.cfg.ServiceAddr(r.ServiceName, g.cfg.Namespace, r.ServicePort), g.m)
		made = append(made, s)
		next.states[r.Name] = s
	}
	g.routing.Store(next)
	if old != nil {
		for name, s := range old.states {
			if next.states[name] != s {
				s.cancel()
				g.releaseCounterLocked(s.queue)
			}
		}
	}
	backends := map[string]bool{}
	for _, r := range t.Routes() {
		if r.ServiceName != "" {
			backends[serviceBackend(r)] = true
		}
	}
	g.starts.retain(backends)
	fresh := map[string]*routes.Route{} // the Service backends of the routes made, by key
	for _, s := range made {
		r := next.table.ByName(s.name)
		if r.URL != nil {
			health := (&url.URL{Scheme: r.URL.Scheme, Host: r.URL.Host, Path: r.HealthPath}).String()
			g.active.Go(func() {
				probeURL(s, g.probes, health, r.URL.Host, g.cfg.HeldProbeInterval, g.cfg.IdleProbeInterval)
			})
		} else if g.slices != nil {
			g.refreshService(s, r)
			fresh[serviceBackend(r)] = r
		}
	}
	// What a new route's endpoints did before it was made is unknown: those not ready
	// now are not measured.
	for _, r := range fresh {
		g.measureColdStarts(next, r, true)
	}
	return nil
}

func (g *Gateway) counterLocked(queue string) (Counter, error) {
	if c := g.counters[queue]; c != nil {
		c.refs++
		return c.Counter, nil
	}
	c, err := g.cfg.NewCounter(queue)
	if err != nil {
		return nil, err
	}
	g.counters[queue] = &sharedCounter{Counter: c, refs: 1}
	return c, nil
}

func (g *Gateway) releaseCounterLocked(queue string) {
	c := g.counters[queue]
	if c == nil {
		return
	}
	if c.refs--; c.refs > 0 {
		return
	}
	delete(g.counters, queue)
	if err := c.Close(); err != nil {
		g.log.Warn("close queue counter", "queue", queue, "err", err)
	}
}

// serviceChanged refreshes the routes to Service name after its slices changed, and
// measures its cold starts; initial says the change is the slices' first read.
func (g *Gateway) serviceChanged(name string, initial bool) {
	rt := g.routing.Load()
	if rt == nil {
		return // Run reads every slice when it applies the first routes
	}
	measured := map[string]bool{}
	for _, r := range rt.table.Routes() {
		if r.ServiceName == name {
			g.refreshService(rt.states[r.Name], r)
			if b := serviceBackend(r); !measured[b] {
				measured[b] = true
				g.measureColdStarts(rt, r, initial)
			}
		}
	}
}

// serviceBackend names a route's Service backend, the Service and port, for the cold
// starts measured of it.
func serviceBackend(r *routes.Route) string {
	return r.ServiceName + ":" + strconv.Itoa(r.ServicePort)
}

// measureColdStarts reads the endpoints of r's Service backend into the cold starts
// (see coldStarts), observes each one measured for every route to that backend, and
// gives each queue those routes count in its new figure: the largest over the Service
// backends of its routes. unknownBefore: see coldStarts.observe.
func (g *Gateway) measureColdStarts(rt *routing, r *routes.Route, unknownBefore bool) {
	backend := serviceBackend(r)
	measured, _ := g.starts.observe(backend, g.slices.states(r.ServiceName, r.ServicePort), unknownBefore)
	if len(measured) == 0 {
		return
	}
	queues := map[string]bool{}
	for _, other := range rt.table.Routes() {
		if other.ServiceName == "" || serviceBackend(other) != backend {
			continue
		}
		queues[other.Queue] = true
		h := g.m.coldStartSeconds.WithLabelValues(other.Name)
		for _, d := range measured {
			h.Observe(d.Seconds())
		}
	}
	for q := range queues {
		var figure time.Duration
		var counter Counter
		for _, other := range rt.table.Routes() {
			if other.Queue == q && other.ServiceName != "" {
				figure = max(figure, g.starts.figure(serviceBackend(other)))
				counter = rt.states[other.Name].counter
			}
		}
		if figure > 0 && counter != nil {
			counter.ColdStart(figure)
			g.log.Info("backend cold start measured", "queue", q, "backend", backend, "measured", measured, "reported", figure)
		}
	}
}

func (g *Gateway) refreshService(s *routeState, r *routes.Route) {
	eps, none := g.slices.endpoints(r.ServiceName, r.ServicePort)
	s.setEndpoints(eps, none)
}
