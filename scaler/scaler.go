// Package scaler is gpuscaler's KEDA external scaler. It keeps the latest report of every
// GPU node and queue, read from the GPUSCALER and GPUSCALER_QUEUES JetStream streams (the
// last value of every subject first, then live), and answers KEDA's ExternalScaler gRPC calls from that state:
// queue backlog, GPU utilisation and framebuffer use of a workload's pods, activation,
// and activation pushed over StreamIsActive the moment a report makes a trigger active.
//
// It never imports the collectors: the two meet only in the event contract,
// github.com/gpuscaler/gpuscaler/proto/gpuscaler/v1.
package scaler

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"runtime"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"

	"github.com/gpuscaler/gpuscaler/internal/serve"
	pb "github.com/gpuscaler/gpuscaler/proto/externalscaler"
	gpuscalerv1 "github.com/gpuscaler/gpuscaler/proto/gpuscaler/v1"
	"github.com/gpuscaler/gpuscaler/scaler/metadata"
)

// Config is the scaler's configuration. The zero value serves gRPC on :9090 and HTTP on
// :8080 without TLS, with DESIGN.md's defaults.
type Config struct {
	// GRPCAddr is where KEDA reaches the ExternalScaler service. Default ":9090".
	GRPCAddr string
	// HTTPAddr serves /metrics, /healthz, /readyz and the status page. Default ":8080";
	// "-" disables it.
	HTTPAddr string
	// NoStatusPage leaves the status page (/status) off HTTPAddr. The page shows every
	// namespace's triggers, queues and pods to whoever reaches HTTPAddr.
	NoStatusPage bool
	// TLS for the gRPC server.
	TLS TLSConfig
	// Stream shapes the GPUSCALER and GPUSCALER_QUEUES streams.
	Stream StreamConfig
	// StaleAfter is staleAfter for triggers that give none, and how long the NATS
	// connection may be down before /readyz fails. Default DefaultStaleAfter.
	StaleAfter time.Duration
	// NodeTombstoneTTL is how long a node forgotten after Stream.MaxAge keeps the
	// triggers that selected its pods, and select no live pod, Unavailable. The stream
	// keeps reports this much longer than Stream.MaxAge, so that a restarted replica
	// knows the same tombstones. Zero means DefaultNodeTombstoneTTL; negative keeps no
	// tombstones.
	NodeTombstoneTTL time.Duration
	// ConsumerRefresh is how often the info of a JetStream consumer that stream+consumer
	// triggers name is fetched, however many triggers share it. Default 1s.
	ConsumerRefresh time.Duration
	// MaxQueuesPerNamespace bounds the queues the scaler tracks per namespace, so that a
	// tenant publishing reports of ever new queue names in its own namespace cannot grow
	// the state without bound: a report of a new queue past it is dropped and counted,
	// and the namespace's other queues keep being updated. Zero means
	// DefaultMaxQueuesPerNamespace; negative sets no limit.
	MaxQueuesPerNamespace int
	// MaxProducersPerQueue bounds the producers the scaler tracks per queue, so that a
	// tenant publishing reports under ever new producer ids cannot grow a queue without
	// bound: a report of a new producer past it is dropped and counted, until one stops
	// or is forgotten. Zero means DefaultMaxProducersPerQueue; negative sets no limit.
	MaxProducersPerQueue int
	// MaxFollowedConsumers bounds how many JetStream consumers stream+consumer triggers
	// make the scaler follow at once; a trigger naming one more is refused with
	// ResourceExhausted until one falls idle. Zero means DefaultMaxFollowedConsumers;
	// negative follows none.
	MaxFollowedConsumers int
	// JetStreamNamespaces keep their JetStream work queues in NATS accounts of their own
	// (authcallout.Accounts.JetStreamNamespaces): the stream+consumer triggers of such a
	// namespace read their consumer through that account's API, imported into the
	// scaler's under gpuscalerv1.TenantJetStreamAPI, and wake at the next ConsumerRefresh
	// rather than on the first message. Triggers of other namespaces read the scaler's
	// own account, as before.
	JetStreamNamespaces []string
	// MaxConnectionAge is how long a client connection lives before the server asks the
	// client to open a new one (GOAWAY). KEDA resolves the scaler's address again then,
	// so replicas added behind a headless Service get calls within this time; streams
	// open on the old connection are left to run. Default DefaultMaxConnectionAge.
	MaxConnectionAge time.Duration
	// Pods, when set, is what the Kubernetes API says of pods (scaler/kube): a node's
	// report is then believed only of the pods the API places on that node, and
	// podSelectors match the labels the API holds, not those the node reports; a pod
	// dropped is counted and logged. Until it has synced, the triggers that read pods are
	// Unavailable. Nil believes the nodes' reports as they come: any node can then speak
	// for any pod of any namespace.
	Pods PodDirectory
	// NATSHealth says for how long the NATS connection has been down and why, for
	// /readyz and for the errors KEDA and the log see. Nil judges the connection by its
	// status alone (see ConnHealth); gpuscaler's own command passes its connection's.
	NATSHealth ConnHealth
	// Now tells time; nil means time.Now. Tests move it forward to make data stale. The
	// scaler corrects it by the NATS server's clock, which stamps every report.
	Now func() time.Time

	// streamCheckEvery is how often the follower checks the stream is still there;
	// default 5s. Tests shorten it.
	streamCheckEvery time.Duration
	// consumerIdleAfter is how long a consumer no trigger reads is still followed;
	// default 5m. Tests shorten it.
	consumerIdleAfter time.Duration
}

// DefaultMaxConnectionAge is how long a KEDA connection lives before the scaler asks for
// a new one (gRPC adds ±10% jitter).
const DefaultMaxConnectionAge = 5 * time.Minute

// Scaler is a configured scaler with its listeners bound. Run serves it.
type Scaler struct {
	cfg     Config
	js      jetstream.JetStream
	nc      *nats.Conn
	health  ConnHealth // never nil
	log     *slog.Logger
	reg     *prometheus.Registry
	clock   *natsClock
	state   *State
	metrics *metrics
	// followers follow the node stream and the queue stream, in that order.
	followers []*follower
	ready     chan struct{}
	// calls records KEDA's calls for the status page; the gRPC server writes it.
	calls *callRecorder

	grpcLis net.Listener
	httpLis net.Listener // nil when HTTP is disabled
	tls     *credentials.TransportCredentials
}

// New builds a scaler that reads NATS through nc, logs to log and registers its metrics
// on reg. nc should reconnect forever (nats.MaxReconnects(-1)): the scaler serves from
// what it has while NATS is down, and its readiness fails after Config.StaleAfter. It
// binds its listeners now, so an address in use fails here and not later. See the
// package example.
func New(cfg Config, nc *nats.Conn, log *slog.Logger, reg *prometheus.Registry) (*Scaler, error) {
	if cfg.GRPCAddr == "" {
		cfg.GRPCAddr = ":9090"
	}
	if cfg.HTTPAddr == "" {
		cfg.HTTPAddr = ":8080"
	}
	switch {
	case cfg.StaleAfter == 0:
		cfg.StaleAfter = DefaultStaleAfter
	case cfg.StaleAfter < time.Second || cfg.StaleAfter > metadata.MaxStaleAfter:
		return nil, fmt.Errorf("stale-after %s: want a duration from 1s to 24h, as a trigger's staleAfter", cfg.StaleAfter)
	}
	for _, ns := range cfg.JetStreamNamespaces {
		if err := gpuscalerv1.ValidateNamespace(ns); err != nil {
			return nil, fmt.Errorf("JetStream namespaces: %w", err)
		}
	}
	cfg.Stream = cfg.Stream.withDefaults()
	if cfg.Stream.MaxAge <= cfg.StaleAfter {
		return nil, fmt.Errorf("stream-max-age %s: want more than stale-after %s, or nodes would be forgotten before they are stale", cfg.Stream.MaxAge, cfg.StaleAfter)
	}
	switch {
	case cfg.NodeTombstoneTTL == 0:
		cfg.Stream.tombstoneTTL = DefaultNodeTombstoneTTL
	case cfg.NodeTombstoneTTL > 0:
		cfg.Stream.tombstoneTTL = cfg.NodeTombstoneTTL
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.streamCheckEvery <= 0 {
		cfg.streamCheckEvery = 5 * time.Second
	}
	if cfg.NATSHealth == nil {
		cfg.NATSHealth = &connStatus{nc: nc}
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("JetStream: %w", err)
	}
	tlsCfg, err := cfg.TLS.serverTLS()
	if err != nil {
		return nil, err
	}
	clock := &natsClock{local: cfg.Now}
	s := &Scaler{
		cfg:    cfg,
		js:     js,
		nc:     nc,
		health: cfg.NATSHealth,
		log:    log,
		reg:    reg,
		clock:  clock,
		state:  NewState(clock.Now),
		ready:  make(chan struct{}),
		calls:  newCallRecorder(cfg.Now, defaultCallRows, defaultCallIdleAfter),
	}
	s.state.SetNodeTombstoneTTL(cfg.Stream.tombstoneTTL)
	if cfg.MaxQueuesPerNamespace != 0 {
		s.state.SetMaxQueuesPerNamespace(cfg.MaxQueuesPerNamespace)
	}
	if cfg.MaxProducersPerQueue != 0 {
		s.state.SetMaxProducersPerQueue(cfg.MaxProducersPerQueue)
	}
	if tlsCfg != nil {
		creds := credentials.NewTLS(tlsCfg)
		s.tls = &creds
	}
	s.metrics = newMetrics(reg, s.state, nc.IsConnected, s.isReady, s.isFollowing, clock.Skew)
	drops := newLogLimiter(time.Minute)
	ready := s.readyWhenReplayed(2)
	follow := func(stream jetstream.StreamConfig, shards int) *follower {
		return &follower{
			js:         js,
			stream:     stream,
			shardCount: shards,
			state:      s.state,
			clock:      clock,
			metrics:    s.metrics,
			log:        log.With("component", "follower", "stream", stream.Name),
			drops:      drops,
			explain:    cfg.NATSHealth.Explain,
			checkEvery: cfg.streamCheckEvery,
			ready:      ready,
		}
	}
	// Node reports take tens of microseconds each to apply, on as many shards as there are
	// CPUs; queue reports one, on a shard of their own (see startShards).
	nodes := follow(cfg.Stream.nodeStream(), runtime.GOMAXPROCS(0))
	queues := follow(cfg.Stream.queueStream(), 1)
	// An earlier release's node stream captured every subject, queues' included: it
	// must be narrowed before the queue stream can be made.
	queues.makeRoom = func(ctx context.Context) error { _, err := nodes.ensureStream(ctx); return err }
	s.followers = []*follower{nodes, queues}
	s.state.SetProducerLeftHook(queues.producerLeft)
	if cfg.Pods != nil {
		s.state.SetPodDirectory(cfg.Pods, nodes.claimDropped)
	}
	if s.grpcLis, err = net.Listen("tcp", cfg.GRPCAddr); err != nil {
		return nil, fmt.Errorf("gRPC listener: %w", err)
	}
	if cfg.HTTPAddr != "-" {
		if s.httpLis, err = net.Listen("tcp", cfg.HTTPAddr); err != nil {
			s.grpcLis.Close()
			return nil, fmt.Errorf("HTTP listener: %w", err)
		}
	}
	return s, nil
}

// GRPCAddr is the address the gRPC server listens on.
func (s *Scaler) GRPCAddr() net.Addr { return s.grpcLis.Addr() }

// HTTPAddr is the address the HTTP server listens on, or nil when it is disabled.
func (s *Scaler) HTTPAddr() net.Addr {
	if s.httpLis == nil {
		return nil
	}
	return s.httpLis.Addr()
}

// readyWhenReplayed returns the function each of n followers calls once it has replayed
// its stream: the last call makes the scaler ready. Reports the node stream keeps past
// MaxAge are tombstones (see StreamConfig): they are turned into tombstones before the
// first answer, as every other replica has.
func (s *Scaler) readyWhenReplayed(n int) func(replayed uint64, took time.Duration) {
	var (
		mu       sync.Mutex // guards the three below
		left     = n
		messages uint64
		longest  time.Duration
	)
	return func(replayed uint64, took time.Duration) {
		mu.Lock()
		defer mu.Unlock()
		left, messages, longest = left-1, messages+replayed, max(longest, took)
		if left != 0 {
			return
		}
		took = longest
		s.metrics.replayDuration.Set(took.Seconds())
		s.metrics.replayMessages.Set(float64(messages))
		s.forget()
		nodes, gpus, queues := s.state.Size()
		s.log.Info("state restored from NATS", "messages", messages, "took", took.Round(time.Millisecond),
			"nodes", nodes, "gpus", gpus, "queues", queues)
		close(s.ready)
	}
}

// Ready is closed once the state has been restored from NATS.
func (s *Scaler) Ready() <-chan struct{} { return s.ready }

// State is the scaler's state, for in-process users such as the benchmark.
func (s *Scaler) State() *State { return s.state }

func (s *Scaler) isReady() bool {
	select {
	case <-s.ready:
		return true
	default:
		return false
	}
}

// readiness says why the scaler is not ready, or nil: the state must be restored, NATS
// must not have been down longer than StaleAfter, and neither may a stream have gone
// unfollowed that long.
func (s *Scaler) readiness() error {
	failure, since, stream := s.failing()
	if !s.isReady() {
		if problem := s.health.Problem(); problem != nil { // the root of any failure
			return fmt.Errorf("%w: %w", errNotReady, problem)
		}
		if failure != nil {
			return fmt.Errorf("%w: %w", errNotReady, failure)
		}
		return errNotReady
	}
	if down := s.health.DownFor(); down > s.cfg.StaleAfter {
		err := fmt.Errorf("NATS has been disconnected for %s, longer than %s", down.Round(time.Second), s.cfg.StaleAfter)
		if problem := s.health.Problem(); problem != nil {
			err = fmt.Errorf("%w: %w", err, problem)
		}
		return err
	}
	if failure != nil && time.Since(since) > s.cfg.StaleAfter {
		return fmt.Errorf("not following stream %s since %s: %w", stream, stamp(since), failure)
	}
	return nil
}

// failing returns why a follower is not following its stream, since when, and which
// stream; of several, the one failing longest. It returns a nil error while every
// follower follows.
func (s *Scaler) failing() (failure error, since time.Time, stream string) {
	for _, f := range s.followers {
		if err, t := f.failing(); err != nil && (failure == nil || t.Before(since)) {
			failure, since, stream = err, t, f.stream.Name
		}
	}
	return failure, since, stream
}

func (s *Scaler) isFollowing() bool {
	failure, _, _ := s.failing()
	return failure == nil
}

// Run serves until ctx ends, then stops gracefully: open streams end with a nil error so
// KEDA reconnects at once to another replica. It returns nil on a clean stop.
func (s *Scaler) Run(ctx context.Context) error {
	g, ctx := errgroup.WithContext(ctx)

	maxAge := s.cfg.MaxConnectionAge
	if maxAge <= 0 {
		maxAge = DefaultMaxConnectionAge
	}
	opts := []grpc.ServerOption{
		grpc.ChainUnaryInterceptor(s.metrics.unaryInterceptor),
		// KEDA holds one connection per scaler address for as long as it runs; let it ping.
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
		// KEDA's round-robin client resolves the address only when a connection ends:
		// ending each after a while spreads its calls over replicas added since. The
		// grace stays infinite, so a StreamIsActive stream is never cut.
		grpc.KeepaliveParams(keepalive.ServerParameters{MaxConnectionAge: maxAge}),
	}
	if s.tls != nil {
		opts = append(opts, grpc.Creds(*s.tls))
	}
	srv := grpc.NewServer(opts...)
	work, err := newWorkQueues(ctx, s.js, s.nc, workQueueConfig{
		refresh:             s.cfg.ConsumerRefresh,
		max:                 s.cfg.MaxFollowedConsumers,
		idleAfter:           s.cfg.consumerIdleAfter,
		local:               s.cfg.Now,
		explain:             s.health.Explain,
		jetStreamNamespaces: s.cfg.JetStreamNamespaces,
	}, s.clock.Now, s.log.With("component", "workqueues"), s.metrics)
	if err != nil {
		return err // New checked the namespaces; not expected
	}
	keda := &Server{
		state:    s.state,
		work:     work,
		ready:    s.ready,
		done:     ctx.Done(),
		stale:    s.cfg.StaleAfter,
		maxStale: s.cfg.Stream.MaxAge,
		metrics:  s.metrics,
		log:      s.log.With("component", "grpc"),
		triggers: newTriggerCache(defaultTriggerCacheSize),
		calls:    s.calls,
		now:      s.cfg.Now,
	}
	pb.RegisterExternalScalerServer(srv, keda)
	gpuscalerv1.RegisterExplainerServer(srv, explainer{srv: keda})
	healthSrv := health.NewServer()
	healthSrv.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING)
	healthpb.RegisterHealthServer(srv, healthSrv)

	for _, f := range s.followers {
		g.Go(func() error { return f.run(ctx) })
	}
	g.Go(func() error {
		s.log.Info("serving KEDA external scaler", "grpcAddr", s.grpcLis.Addr().String(), "tls", s.tls != nil)
		if err := srv.Serve(s.grpcLis); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			return fmt.Errorf("gRPC server: %w", err)
		}
		return nil
	})
	g.Go(func() error {
		<-ctx.Done()
		healthSrv.Shutdown()
		srv.GracefulStop()
		return nil
	})
	g.Go(func() error { return s.watchHealth(ctx, healthSrv) })
	g.Go(func() error { return s.forgetLoop(ctx) })
	g.Go(func() error { return s.silenceLoop(ctx) })
	if s.httpLis != nil {
		s.log.Info("serving metrics and probes", "httpAddr", s.httpLis.Addr().String())
		g.Go(func() error { return serve.HTTP(ctx, s.httpLis, s.httpHandler(keda)) })
	}
	return g.Wait()
}

// watchHealth keeps the gRPC health service in step with readiness, checked every second.
func (s *Scaler) watchHealth(ctx context.Context, h *health.Server) error {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	serving := false
	ready := s.ready // checked at once when the replay finishes, then on the ticker
	for {
		if ok := s.readiness() == nil; ok != serving {
			serving = ok
			st := healthpb.HealthCheckResponse_NOT_SERVING
			if ok {
				st = healthpb.HealthCheckResponse_SERVING
			}
			h.SetServingStatus("", st)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-ready:
			ready = nil // a closed channel is always ready: wait on it once
		case <-tick.C:
		}
	}
}

// forgetLoop drops nodes and queues the stream has expired (older than MaxAge).
func (s *Scaler) forgetLoop(ctx context.Context) error {
	return every(ctx, min(s.cfg.Stream.MaxAge/4, time.Minute), s.forget)
}

// silenceLoop counts and logs the queue producers that fall silent for longer than the
// default staleAfter: their shares leave their queues' readings then (for triggers that
// keep the default).
func (s *Scaler) silenceLoop(ctx context.Context) error {
	return every(ctx, max(min(s.cfg.StaleAfter/4, 5*time.Second), 100*time.Millisecond), func() {
		s.state.MarkSilentProducers(s.clock.Now().Add(-s.cfg.StaleAfter))
	})
}

// every runs f every d until ctx ends.
func every(ctx context.Context, d time.Duration, f func()) error {
	tick := time.NewTicker(d)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
			f()
		}
	}
}

// forget drops the nodes and queues silent longer than the stream's MaxAge.
func (s *Scaler) forget() {
	if n := s.state.Forget(s.clock.Now().Add(-s.cfg.Stream.MaxAge)); n > 0 {
		s.log.Info("forgot nodes and queues silent for longer than --stream-max-age; nodes that held pods are kept as tombstones",
			"entries", n, "maxAge", s.cfg.Stream.MaxAge, "tombstones", s.state.Tombstones())
	}
}

func (s *Scaler) httpHandler(srv *Server) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(s.reg, promhttp.HandlerOpts{Registry: s.reg}))
	serve.Probes(mux, s.readiness)
	if !s.cfg.NoStatusPage {
		newStatusPage(s, srv).register(mux)
	}
	return mux
}
