// Package demo runs gpuscaler end to end on one machine, with no cluster and no GPU: an
// embedded NATS server, simulated GPU nodes whose collectors publish real NodeReports,
// the real scaler serving gRPC on a local port, queue producers using the real producer
// API, and a model of a cluster that follows KEDA's and the HPA's published rules, asking
// the scaler over gRPC exactly what KEDA would ask. Two workloads share the cluster: an
// inference service that scales to zero on its request queue, and a training ScaledJob
// turning a job queue into Jobs only as fast as free GPUs allow. `gpuscaler demo` runs it
// and prints a live timeline and a summary.
package demo

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math/rand/v2"
	"net"
	"strconv"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/gpuscaler/gpuscaler/cmd/gpuscaler/internal/inference"
	"github.com/gpuscaler/gpuscaler/cmd/gpuscaler/internal/kedarules"
	"github.com/gpuscaler/gpuscaler/collector"
	"github.com/gpuscaler/gpuscaler/internal/embedded"
	"github.com/gpuscaler/gpuscaler/internal/natsconn"
	pb "github.com/gpuscaler/gpuscaler/proto/externalscaler"
	"github.com/gpuscaler/gpuscaler/queue"
	"github.com/gpuscaler/gpuscaler/scaler"
)

// Config shapes a run. The zero value of a field means its default, in brackets.
type Config struct {
	// Duration of the run [60s]; the load profile stretches to fit it.
	Duration time.Duration
	// Nodes [4] with GPUsPerNode GPUs each [8]; the first half (rounded up) form the
	// inference pool, the rest the training pool (node label pool=…).
	Nodes, GPUsPerNode int
	// Seed makes arrivals, service times and GPU noise repeatable. Zero is a seed like
	// any other; the command's default is 1.
	Seed uint64
	// GRPCAddr is where the scaler serves KEDA's ExternalScaler [DefaultGRPCAddr], so a
	// real KEDA can be pointed at it while the demo runs. HTTPAddr serves its /metrics
	// [DefaultHTTPAddr; "-" for none]. NATSAddr is the embedded NATS server's client
	// address [DefaultNATSAddr], where `gpuscaler publish` and the example producer find
	// it by default; the demo's own parts connect in-process. An address left empty
	// whose default port another program holds (a local nats-server, say) is replaced by
	// a free port, and the header says so: the demo must not fail for a port nobody
	// asked for. An address given is used as given. Port 0 picks a free one.
	GRPCAddr, HTTPAddr, NATSAddr string
	// Timing of KEDA, the HPA and the simulated parts.
	Timing Timing
	// Out receives the timeline and the summary [discarded].
	Out io.Writer
	// Log receives the parts' logs [discarded].
	Log *slog.Logger
}

// The addresses when Config leaves them empty: the scaler's and NATS's usual ports, on
// loopback.
const (
	DefaultGRPCAddr = "127.0.0.1:9090"
	DefaultHTTPAddr = "127.0.0.1:8080"
	DefaultNATSAddr = "127.0.0.1:4222"
)

// Timing holds the demo's clocks. KEDA's defaults (pollingInterval 30s, cooldownPeriod
// 300s, the HPA's 15s sync and 300s scale-down window) would leave a one-minute run with
// little to show, so the demo sets shorter ones, as a ScaledObject (and a cluster's
// kube-controller-manager, for the sync) may.
type Timing struct {
	// PollingInterval is the ScaledObject's and ScaledJob's pollingInterval [5s].
	PollingInterval time.Duration
	// Cooldown is the ScaledObject's cooldownPeriod. Unlike the other fields, zero means
	// what it means to KEDA, none: back to zero replicas at the first inactive answer.
	// The command's default is 15s.
	Cooldown time.Duration
	// HPASync is the HPA's sync period [5s; kube-controller-manager's default is 15s].
	HPASync time.Duration
	// ScaleDownWindow is the HPA's scale-down stabilization window [15s].
	ScaleDownWindow time.Duration
	// Startup is how long a new inference replica loads its model before it serves [4s].
	Startup time.Duration
	// JobRun is how long one training Job runs [a fifth of Duration].
	JobRun time.Duration
	// NodeInterval is the collectors' report interval and QueueInterval the producers'
	// heartbeat [1s each, the product's defaults].
	NodeInterval, QueueInterval time.Duration
	// Step is the world's time step [100ms]; Row the timeline's row interval [1s].
	Step, Row time.Duration
}

// withDefaults fills the fields left at zero. A negative value is kept, for Validate to
// refuse: it is a mistake, not a request for the default.
func (c Config) withDefaults() Config {
	or := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	or(&c.Duration, time.Minute)
	if c.Nodes == 0 {
		c.Nodes = 4
	}
	if c.GPUsPerNode == 0 {
		c.GPUsPerNode = 8
	}
	t := &c.Timing
	or(&t.PollingInterval, 5*time.Second)
	or(&t.HPASync, 5*time.Second)
	or(&t.ScaleDownWindow, 15*time.Second)
	or(&t.Startup, 4*time.Second)
	or(&t.JobRun, c.Duration/5)
	or(&t.NodeInterval, time.Second)
	or(&t.QueueInterval, time.Second)
	or(&t.Step, 100*time.Millisecond)
	or(&t.Row, time.Second)
	if c.Out == nil {
		c.Out = io.Discard
	}
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	return c
}

// Validate reports a configuration the demo cannot run, naming each field by the
// command's flag. It judges the values as they are: Run fills the zero values with their
// defaults first, while the command, whose flags hold their defaults already, calls it
// on what the user gave, so a zero that means nothing there (--duration 0) is refused
// rather than silently replaced.
func (c Config) Validate() error {
	t := c.Timing
	switch {
	case c.Nodes < 2 || c.Nodes > 64:
		return fmt.Errorf("--nodes %d: want 2 to 64 (half serve inference, half training)", c.Nodes)
	case c.GPUsPerNode < gpusPerJob || c.GPUsPerNode > 16:
		return fmt.Errorf("--gpus-per-node %d: want %d to 16 (a training Job takes %d GPUs of one node)", c.GPUsPerNode, gpusPerJob, gpusPerJob)
	case c.Duration < 5*time.Second:
		return fmt.Errorf("--duration %s: want at least 5s", c.Duration)
	case t.PollingInterval <= 0:
		return fmt.Errorf("--polling-interval %s: want more than 0 (KEDA asks the scaler once per interval)", t.PollingInterval)
	case t.Cooldown < 0:
		return fmt.Errorf("--cooldown %s: want 0 or more (0: back to zero replicas at the first inactive answer)", t.Cooldown)
	case t.HPASync <= 0:
		return fmt.Errorf("--hpa-sync %s: want more than 0 (the HPA acts once per period)", t.HPASync)
	}
	for _, d := range []struct {
		name string
		d    time.Duration
	}{{"ScaleDownWindow", t.ScaleDownWindow}, {"Startup", t.Startup}, {"JobRun", t.JobRun}, {"NodeInterval", t.NodeInterval},
		{"QueueInterval", t.QueueInterval}, {"Step", t.Step}, {"Row", t.Row}} { // no flags: set by tests
		if d.d < 0 {
			return fmt.Errorf("Timing.%s %s: want 0 or more (0 for the default)", d.name, d.d)
		}
	}
	for _, a := range []struct{ flag, addr, off string }{
		{"grpc-addr", c.GRPCAddr, ""}, {"http-addr", c.HTTPAddr, "-"}, {"nats-addr", c.NATSAddr, ""},
	} {
		if a.addr == "" || a.addr == a.off {
			continue // the default, or HTTP off
		}
		_, port, err := net.SplitHostPort(a.addr)
		if n, perr := strconv.Atoi(port); err != nil || perr != nil || n < 0 || n > 65535 {
			return fmt.Errorf("--%s %q: want host:port, such as 127.0.0.1:0 (port 0 picks a free one)", a.flag, a.addr)
		}
	}
	return nil
}

// The triggers the demo's ScaledObject and ScaledJob give the scaler.
//
// The inference service's is the configuration docs/triggers.md recommends for a service
// that scales to zero (inference.Recommended): queue-demand, the replicas its arrival rate
// and waiting requests need, each replica serving concurrency requests at once. Its GPU
// utilisation is a second metric, and keeps the service awake while its GPUs work.
func inferenceTrigger() map[string]string {
	md := demandKeys()
	maps.Copy(md, map[string]string{
		scaler.KeyQueue:         inferenceQueue,
		scaler.KeyPodSelector:   "app=" + inferenceName,
		scaler.KeyGPUUtilTarget: strconv.Itoa(gpuUtilTarget),
		// An idle replica's GPU still shows a few percent: that must not keep it awake.
		scaler.KeyActivationGPUUtil: strconv.Itoa(activationGPUUtil),
	})
	return md
}

// demandKeys are the queue-demand keys of the inference trigger, which the summary's
// replay gives its gpuscaler policy too.
func demandKeys() map[string]string {
	return map[string]string{
		scaler.KeyTargetWait:  inference.RecommendedTargetWait.String(),
		scaler.KeyConcurrency: strconv.Itoa(concurrency),
	}
}

func trainingTrigger() map[string]string {
	return map[string]string{
		scaler.KeyQueue:          trainingQueue,
		scaler.KeyQueueTarget:    "1",
		scaler.KeyCapacityAware:  "true",
		scaler.KeyGPUsPerReplica: strconv.Itoa(gpusPerJob),
		scaler.KeyNodeSelector:   "pool=training",
	}
}

// Run runs the demo until cfg.Duration has passed or ctx ends, printing the timeline to
// cfg.Out, and returns what it measured. A run stopped early (Ctrl-C) still returns its
// summary, with Completed false.
func Run(ctx context.Context, cfg Config) (*Summary, error) {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	log := cfg.Log
	var notes []string
	for _, a := range []struct {
		addr *string
		def  string
		what string
		flag string
		hint string
	}{{&cfg.GRPCAddr, DefaultGRPCAddr, "the scaler's gRPC", "grpc-addr", ""}, {&cfg.HTTPAddr, DefaultHTTPAddr, "its HTTP", "http-addr", ""},
		{&cfg.NATSAddr, DefaultNATSAddr, "the embedded NATS", "nats-addr", "; give gpuscaler publish its URL, above, as --nats-url"}} {
		if *a.addr != "" {
			continue
		}
		var taken bool
		*a.addr, taken = freeIfTaken(a.def)
		if taken {
			notes = append(notes, fmt.Sprintf("%s is in use, so %s took a free port (--%s chooses one%s)", a.def, a.what, a.flag, a.hint))
		}
	}

	ns, err := embedded.Start(embedded.Options{Addr: cfg.NATSAddr, Log: log.With("component", "embedded-nats")})
	if err != nil {
		return nil, fmt.Errorf("--nats-addr %s: %w", cfg.NATSAddr, err)
	}
	defer ns.Shutdown()
	connect := func(name string) (*natsconn.Conn, error) {
		return natsconn.Connect(ctx, natsconn.Options{Name: name, InProcess: ns.Server, Log: log.With("component", "nats", "conn", name)})
	}
	scalerConn, err := connect("gpuscaler-demo-scaler")
	if err != nil {
		return nil, err
	}
	defer scalerConn.Close()
	worldConn, err := connect("gpuscaler-demo-world")
	if err != nil {
		return nil, err
	}
	defer worldConn.Close()

	s, err := scaler.New(scaler.Config{GRPCAddr: cfg.GRPCAddr, HTTPAddr: cfg.HTTPAddr, Stream: scaler.StreamConfig{Memory: true}, NATSHealth: scalerConn},
		scalerConn.Conn, log.With("component", "scaler"), prometheus.NewRegistry())
	if err != nil {
		return nil, err
	}
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	g, gctx := errgroup.WithContext(runCtx)
	g.Go(func() error { return s.Run(gctx) })
	// fail stops what runs so far and returns err with whatever stopping it returned.
	fail := func(err error) (*Summary, error) {
		stop()
		return nil, errors.Join(err, g.Wait())
	}
	select {
	case <-s.Ready():
	case <-gctx.Done():
		return fail(ctx.Err())
	}

	cl, err := newCluster(cfg.Nodes, cfg.GPUsPerNode, cfg.Seed)
	if err != nil {
		return fail(err)
	}
	for _, n := range cl.nodes {
		labels := map[string]string{"pool": n.pool}
		c, err := collector.New(collector.Config{Node: n.name, Interval: cfg.Timing.NodeInterval, CollectorID: "demo",
			NodeLabels: func() map[string]string { return labels }},
			n.sim, n.sim, n.sim, worldConn.Conn, log.With("component", "collector", "node", n.name), prometheus.NewRegistry())
		if err != nil {
			return fail(err)
		}
		g.Go(func() error { return c.Run(gctx) })
	}

	conn, err := grpc.NewClient(s.GRPCAddr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return fail(err)
	}
	defer conn.Close()

	w, err := newWorld(cfg, cl, worldConn, pb.NewExternalScalerClient(conn))
	if err != nil {
		return fail(err)
	}
	printHeader(cfg, s, ns.ClientURL(), notes)
	sum, runErr := w.run(gctx)
	closeErr := w.close()
	stop()
	if err := errors.Join(runErr, closeErr, g.Wait()); err != nil && !errors.Is(err, context.Canceled) {
		return sum, err
	}
	printSummary(cfg.Out, sum)
	return sum, nil
}

// freeIfTaken returns addr, or, when another program holds its port, the same host with
// port 0 (a free port) and true. Any other failure to listen is left for the listener that
// follows to report, on addr, as is a port taken between this probe and that listener.
func freeIfTaken(addr string) (string, bool) {
	l, err := net.Listen("tcp", addr)
	if err == nil {
		l.Close()
		return addr, false
	}
	if !errors.Is(err, syscall.EADDRINUSE) {
		return addr, false
	}
	host, _, _ := net.SplitHostPort(addr)
	return net.JoinHostPort(host, "0"), true
}

func printHeader(cfg Config, s *scaler.Scaler, natsURL string, notes []string) {
	out := cfg.Out
	inf, tr := (cfg.Nodes+1)/2, cfg.Nodes/2
	fmt.Fprintf(out, "gpuscaler demo: %s, %d simulated nodes × %d GPUs (%d for inference, %d for training), seed %d\n",
		cfg.Duration, cfg.Nodes, cfg.GPUsPerNode, inf*cfg.GPUsPerNode, tr*cfg.GPUsPerNode, cfg.Seed)
	metrics := ""
	if a := s.HTTPAddr(); a != nil {
		metrics = fmt.Sprintf(", metrics http://%s/metrics", a)
	}
	fmt.Fprintf(out, "  scaler   gRPC %s (a real KEDA can use it: scalerAddress %s)%s, NATS %s\n", s.GRPCAddr(), s.GRPCAddr(), metrics, natsURL)
	for _, n := range notes {
		fmt.Fprintf(out, "  note     %s\n", n)
	}
	fmt.Fprintf(out, "  inference ScaledObject %s/%s: external-push, queue %q (queue-demand: targetWait %s, concurrency %d) + GPU util of app=%s (target %d%%, active above %d%%), 0..%d replicas of 1 GPU\n",
		inferenceNS, inferenceName, inferenceQueue, inference.RecommendedTargetWait, concurrency, inferenceName, gpuUtilTarget, activationGPUUtil, inf*cfg.GPUsPerNode)
	fmt.Fprintf(out, "  training  ScaledJob %s/%s: queue %q, capacityAware, %d GPUs per Job on pool=training, default strategy\n",
		trainingNS, trainingName, trainingQueue, gpusPerJob)
	t := cfg.Timing
	fmt.Fprintf(out, "  KEDA     pollingInterval %s, cooldownPeriod %s; HPA sync %s, scale-down window %s, tolerance 10%%; replicas load for %s\n\n",
		t.PollingInterval, t.Cooldown, t.HPASync, t.ScaleDownWindow, t.Startup)
}

// world owns the simulated cluster and plays KEDA against the scaler. Only its run
// goroutine touches it, but for the push stream's receiver, which hands it events.
type world struct {
	cfg      Config
	cluster  *cluster
	client   pb.ExternalScalerClient
	inf      *inferenceService
	train    *training
	so       kedarules.ScaledObject
	hpa      kedarules.HPA
	specs    []*pb.MetricSpec // the inference ScaledObject's, from GetMetricSpec
	jobSpecs []*pb.MetricSpec
	pushes   chan pushEvent
	tl       timeline
	// wakeFrom is when the request queue got work while the service was at zero, until
	// an activation answers it.
	wakeFrom time.Time
}

type pushEvent struct {
	at     time.Time
	active bool
}

func newWorld(cfg Config, cl *cluster, nc *natsconn.Conn, client pb.ExternalScalerClient) (*world, error) {
	qcfg := queue.Config{Interval: cfg.Timing.QueueInterval, ProducerID: "gpuscaler-demo"}
	infRep, err := queue.NewReporter(nc.Conn, inferenceNS, inferenceQueue, qcfg)
	if err != nil {
		return nil, err
	}
	trRep, err := queue.NewReporter(nc.Conn, trainingNS, trainingQueue, qcfg)
	if err != nil {
		infRep.Close()
		return nil, err
	}
	w := &world{
		cfg:     cfg,
		cluster: cl,
		client:  client,
		inf:     &inferenceService{reporter: infRep, startup: cfg.Timing.Startup, rng: rand.New(rand.NewPCG(cfg.Seed, 0x9e3779b97f4a7c15))},
		train:   &training{reporter: trRep, runFor: cfg.Timing.JobRun},
		so:      kedarules.ScaledObject{Cooldown: cfg.Timing.Cooldown},
		hpa:     kedarules.HPA{Min: 1, Max: cl.gpus("inference"), ScaleDownWindow: cfg.Timing.ScaleDownWindow},
		pushes:  make(chan pushEvent, 16),
	}
	w.tl.out = cfg.Out
	return w, nil
}

func (w *world) close() error {
	return errors.Join(w.inf.reporter.Close(), w.train.reporter.Close())
}

func (w *world) ref(kind string) *pb.ScaledObjectRef {
	if kind == "job" {
		return &pb.ScaledObjectRef{Name: trainingName, Namespace: trainingNS, ScalerMetadata: trainingTrigger()}
	}
	md := inferenceTrigger()
	// A push within pushInterval of the last is held, which is safe only while
	// pushInterval is at most cooldownPeriod: the demo's is 15 s, below the 30 s default.
	md[scaler.KeyPushInterval] = min(w.cfg.Timing.Cooldown, scaler.DefaultPushInterval).String()
	return &pb.ScaledObjectRef{Name: inferenceName, Namespace: inferenceNS, ScalerMetadata: md}
}

// follow holds the StreamIsActive stream KEDA keeps open for an external-push trigger,
// and hands each message to the world, stamped when it arrived. It reconnects as KEDA
// does when the stream ends.
func (w *world) follow(ctx context.Context) {
	for ctx.Err() == nil {
		stream, err := w.client.StreamIsActive(ctx, w.ref("so"))
		if err == nil {
			for {
				resp, err := stream.Recv()
				if err != nil {
					break
				}
				select {
				case w.pushes <- pushEvent{at: time.Now(), active: resp.GetResult()}:
				case <-ctx.Done():
					return
				}
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(w.cfg.Timing.PollingInterval):
		}
	}
}

// run steps the world until the duration has passed or ctx ends.
func (w *world) run(ctx context.Context) (*Summary, error) {
	cfg := w.cfg
	callCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
	so, err := w.client.GetMetricSpec(callCtx, w.ref("so"))
	if err == nil {
		var sj *pb.GetMetricSpecResponse
		sj, err = w.client.GetMetricSpec(callCtx, w.ref("job"))
		w.jobSpecs = sj.GetMetricSpecs()
	}
	cancel()
	if err != nil {
		return nil, fmt.Errorf("GetMetricSpec: %w", err)
	}
	w.specs = so.GetMetricSpecs()

	pushCtx, stopPush := context.WithCancel(ctx)
	defer stopPush()
	go w.follow(pushCtx)

	start := time.Now()
	w.tl.start = start
	w.tl.printHeader()
	step := time.NewTicker(cfg.Timing.Step)
	defer step.Stop()
	var (
		last                        = start
		nextPoll, nextHPA, nextRow  = start, start.Add(cfg.Timing.HPASync), start.Add(cfg.Timing.Row)
		submitted1, submitted2      bool
		arrivedSinceRow             int
		completed                   = true
		gpuSecInf, gpuSecJobs, zero float64
		peak                        int
	)
loop:
	for {
		select {
		case <-ctx.Done():
			completed = false
			break loop
		case ev := <-w.pushes:
			w.onActivation(ev.at, ev.active, nil, "push")
			continue
		case <-step.C:
		}
		now := time.Now()
		elapsed := now.Sub(start)
		if elapsed >= cfg.Duration {
			break
		}
		frac := float64(elapsed) / float64(cfg.Duration)
		dt := now.Sub(last)
		last = now

		if !submitted1 && frac >= 0.12 {
			w.train.submit(trainingBatchLen)
			w.tl.note("%d training jobs queued", trainingBatchLen)
			submitted1 = true
		}
		if !submitted2 && frac >= 0.45 {
			w.train.submit(trainingBatchLen)
			w.tl.note("%d training jobs queued", trainingBatchLen)
			submitted2 = true
		}
		wasEmpty := w.inf.backlog() == 0
		arrived := w.inf.step(w.cluster, now, dt, phaseAt(frac).rate)
		arrivedSinceRow += arrived
		if wasEmpty && arrived > 0 && w.inf.desired() == 0 && w.wakeFrom.IsZero() {
			w.wakeFrom = now
		}
		w.train.step(w.cluster, now)
		if err := w.cluster.sync(); err != nil {
			return nil, err
		}

		held := w.inf.gpusHeld()
		gpuSecInf += float64(held) * dt.Seconds()
		running, _ := w.train.counts()
		gpuSecJobs += float64(running*gpusPerJob) * dt.Seconds()
		if w.inf.desired() == 0 && held == 0 {
			zero += dt.Seconds()
		}
		peak = max(peak, w.inf.desired())

		if !now.Before(nextPoll) {
			nextPoll = now.Add(cfg.Timing.PollingInterval)
			w.drainPushes()
			w.pollScaledObject(ctx)
			w.pollScaledJob(ctx, now)
		}
		if !now.Before(nextHPA) {
			nextHPA = now.Add(cfg.Timing.HPASync)
			w.syncHPA(ctx, now)
		}
		if !now.Before(nextRow) {
			nextRow = nextRow.Add(cfg.Timing.Row)
			w.row(ctx, now, float64(arrivedSinceRow)/cfg.Timing.Row.Seconds())
			arrivedSinceRow = 0
		}
	}
	sum := w.summary(time.Since(start), completed, gpuSecInf, gpuSecJobs, zero, peak)
	// The replay takes milliseconds: a run stopped early (Ctrl-C) still gets its
	// comparison.
	sum.Baselines, sum.ReplayedRequests, err = replayBaselines(context.WithoutCancel(ctx), cfg, w.hpa.Max, w.inf.requests, start, sum.Duration)
	if sum.Baselines == nil {
		sum.Baselines = []Baseline{} // none to compare: an empty list, not null
	}
	return sum, err
}

// drainPushes applies the push messages already received.
func (w *world) drainPushes() {
	for {
		select {
		case ev := <-w.pushes:
			w.onActivation(ev.at, ev.active, nil, "push")
		default:
			return
		}
	}
}

// onActivation applies one activation answer, from the push stream or a poll, received
// at now. The first answer after a wake-up from zero acts; the push's own latency is
// measured even when a poll that happened to coincide answered first.
func (w *world) onActivation(now time.Time, active bool, err error, via string) {
	before := w.inf.desired()
	if active && !w.wakeFrom.IsZero() {
		lat := now.Sub(w.wakeFrom)
		n := len(w.tl.activations)
		if n == 0 || !w.tl.activations[n-1].at.After(w.wakeFrom) {
			w.tl.activations = append(w.tl.activations, activation{at: now, latency: lat, via: via})
			w.tl.note("%s: active %s after the first request", via, fmtLatency(lat))
			n++
		}
		if via == "push" {
			w.tl.activations[n-1].push = lat
			w.wakeFrom = time.Time{}
		}
	}
	next, why, changed := w.so.Observe(now, before, active, err)
	if why != "" && err != nil {
		w.tl.noteOnce(why)
	}
	if changed {
		w.inf.scale(w.cluster, next)
		w.tl.note("KEDA: %s → %d replica(s)", why, next)
	}
}

func (w *world) pollScaledObject(ctx context.Context) {
	callCtx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	resp, err := w.client.IsActive(callCtx, w.ref("so"))
	w.onActivation(time.Now(), resp.GetResult(), err, "poll") // stamped when the answer came
}

// pollScaledJob is KEDA's ScaledJob loop: IsActive, then the first metric's value, then
// the Jobs the default strategy creates.
func (w *world) pollScaledJob(ctx context.Context, now time.Time) {
	if len(w.jobSpecs) == 0 {
		return
	}
	callCtx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	act, err := w.client.IsActive(callCtx, w.ref("job"))
	if err != nil {
		w.tl.noteOnce("ScaledJob trigger error: " + kedarules.FirstLine(err.Error()))
		return
	}
	spec := w.jobSpecs[0]
	m, err := w.client.GetMetrics(callCtx, &pb.GetMetricsRequest{ScaledObjectRef: w.ref("job"), MetricName: spec.GetMetricName()})
	if err != nil {
		w.tl.noteOnce("ScaledJob trigger error: " + kedarules.FirstLine(err.Error()))
		return
	}
	value := m.GetMetricValues()[0].GetMetricValueFloat()
	unfinished := len(w.train.jobs)
	n := kedarules.JobsToCreate(act.GetResult(), value, spec.GetTargetSizeFloat(), trainingMaxJobs, unfinished)
	if n > 0 {
		w.train.create(n)
		w.train.step(w.cluster, now) // the scheduler places them at once
		w.tl.note("ScaledJob: queue %d, capacity-capped to %s → +%d Job(s)", w.train.waiting+w.trainRunning(), kedarules.FmtNum(value), n)
	}
}

func (w *world) trainRunning() int {
	r, _ := w.train.counts()
	return r
}

// syncHPA is one HPA sync over the ScaledObject's metrics, while it has replicas.
func (w *world) syncHPA(ctx context.Context, now time.Time) {
	current := w.inf.desired()
	if current == 0 {
		return // the HPA does not act at zero; KEDA does
	}
	callCtx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	var metrics []kedarules.Metric
	for _, spec := range w.specs {
		resp, err := w.client.GetMetrics(callCtx, &pb.GetMetricsRequest{ScaledObjectRef: w.ref("so"), MetricName: spec.GetMetricName()})
		if err != nil {
			w.tl.noteOnce("HPA: " + spec.GetMetricName() + ": " + kedarules.FirstLine(err.Error()))
			continue
		}
		metrics = append(metrics, kedarules.Metric{Name: spec.GetMetricName(), Value: resp.GetMetricValues()[0].GetMetricValueFloat(), Target: spec.GetTargetSizeFloat()})
	}
	desired, why := w.hpa.Desired(now, current, metrics)
	if desired != current {
		w.inf.scale(w.cluster, desired)
		w.tl.note("HPA: %s → %d replica(s)", why, desired)
	}
}

// queueSpec is the inference trigger's queue metric, as GetMetricSpec named it
// (queue-demand, or queue-backlog for a trigger without targetWait), nil when it has none.
func (w *world) queueSpec() *pb.MetricSpec {
	for _, spec := range w.specs {
		if n := spec.GetMetricName(); n == scaler.MetricQueueDemand || n == scaler.MetricQueueBacklog {
			return spec
		}
	}
	return nil
}

// row prints one timeline row with what the scaler says now.
func (w *world) row(ctx context.Context, now time.Time, rate float64) {
	callCtx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	r := row{at: now.Sub(w.tl.start), rate: rate, phase: phaseAt(float64(now.Sub(w.tl.start)) / float64(w.cfg.Duration)).name}
	r.backlog = w.inf.backlog() // the producer's own count; the trigger's queue metric is queue-demand
	r.demand = -1
	if spec := w.queueSpec(); spec != nil && spec.GetTargetSizeFloat() > 0 {
		if resp, err := w.client.GetMetrics(callCtx, &pb.GetMetricsRequest{ScaledObjectRef: w.ref("so"), MetricName: spec.GetMetricName()}); err == nil {
			r.demand = resp.GetMetricValues()[0].GetMetricValueFloat() / spec.GetTargetSizeFloat()
		}
	}
	r.util, r.utilServing = -1, -1
	if u, ok := w.inf.servingUtil(now); ok {
		r.utilServing = u // the simulation's: the scaler answers only the sum over every GPU
	}
	if held := w.inf.gpusHeld(); held > 0 {
		if resp, err := w.client.GetMetrics(callCtx, &pb.GetMetricsRequest{ScaledObjectRef: w.ref("so"), MetricName: scaler.MetricGPUUtil}); err == nil {
			// gpu-util is the sum over the workload's GPUs per replica of one GPU.
			r.util = resp.GetMetricValues()[0].GetMetricValueFloat() / float64(held)
		}
	}
	if resp, err := w.client.IsActive(callCtx, w.ref("so")); err == nil {
		r.active = resp.GetResult()
	} else {
		r.activeErr = true
	}
	r.replicas, r.ready = w.inf.desired(), w.inf.readyCount(now)
	r.jobsRunning, r.jobsPending = w.train.counts()
	r.jobQueue = w.train.waiting
	r.freeInf, r.freeTrain = w.cluster.free("inference"), w.cluster.free("training")
	w.tl.add(r)
}

// Summary is what a run measured.
type Summary struct {
	Duration  time.Duration `json:"-"`
	Seconds   float64       `json:"seconds"`
	Completed bool          `json:"completed"`
	// Activations: from the first request queued at zero replicas to the scaler saying
	// active, by push or poll.
	Activations []ActivationSummary `json:"activations"`
	// Inference service.
	RequestsServed int     `json:"requests_served"`
	RequestWaitP50 float64 `json:"request_wait_p50_s"`
	RequestWaitP99 float64 `json:"request_wait_p99_s"`
	PeakReplicas   int     `json:"peak_replicas"`
	GPUSeconds     float64 `json:"gpu_seconds"`
	// ColdStartFraction is the share of requests taken by a replica that was still
	// loading its model when they arrived, as Baseline counts it.
	ColdStartFraction float64 `json:"cold_start_fraction"`
	// Trigger is the inference trigger's scaling keys ("targetWait=30s, concurrency=4,
	// gpuUtilTarget=80"); QueueMetric the name of its queue metric, as GetMetricSpec
	// gave it.
	Trigger     string `json:"trigger"`
	QueueMetric string `json:"queue_metric"`
	// Baselines are the other ways of scaling the service, and the demo's own trigger,
	// replayed on the run's requests on a model of its cluster (the inference package):
	// the same requests under each. ReplayedRequests are the requests the run started to
	// serve, whose waits the live figures count: in a run that completed, every request
	// served; stopped early, also those in flight at the stop. Empty with none.
	Baselines         []Baseline `json:"baselines"`
	ReplayedRequests  int        `json:"replayed_requests"`
	SecondsAtZero     float64    `json:"seconds_at_zero"`
	EndReplicas       int        `json:"end_replicas"`
	MaxReplicas       int        `json:"max_replicas"`
	TrainingSubmitted int        `json:"training_jobs_submitted"`
	TrainingFinished  int        `json:"training_jobs_finished"`
	TrainingCreated   int        `json:"training_jobs_created"`
	TrainingPeakRun   int        `json:"training_peak_running"`
	TrainingPeakPend  int        `json:"training_peak_pending"`
	TrainingNoWork    int        `json:"training_jobs_without_work"`
	TrainingGPUSecs   float64    `json:"training_gpu_seconds"`
	TrainingPoolGPUs  int        `json:"training_pool_gpus"`
	// StartupSeconds is how long a new replica loads its model before it serves.
	StartupSeconds float64 `json:"replica_startup_s"`
	// Phases are the load's phases as they ran, in order; a run stopped early ends
	// inside one.
	Phases []PhaseSpan `json:"phases"`
	Rows   []Row       `json:"timeline"`
}

// PhaseSpan is one phase of the load: requests arrived at Rate per second from From to To
// seconds since the start.
type PhaseSpan struct {
	Name string  `json:"name"`
	From float64 `json:"from_s"`
	To   float64 `json:"to_s"`
	Rate float64 `json:"requests_per_s"`
}

// phaseSpans lays the load profile over a run of duration that lasted elapsed.
func phaseSpans(duration, elapsed time.Duration) []PhaseSpan {
	var spans []PhaseSpan
	from := 0.0
	for _, p := range profile {
		to := min(p.until*duration.Seconds(), elapsed.Seconds())
		if to > from {
			spans = append(spans, PhaseSpan{Name: p.name, From: from, To: to, Rate: p.rate})
		}
		from = max(from, to)
	}
	return spans
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// ActivationSummary is one wake-up from zero.
type ActivationSummary struct {
	AtSeconds    float64 `json:"t"` // when the activation arrived, since the start
	Milliseconds float64 `json:"ms"`
	Via          string  `json:"via"` // push or poll, whichever answered first
	// PushMilliseconds is the push's latency, also when a poll answered first; 0 when no
	// push came.
	PushMilliseconds float64 `json:"push_ms"`
}

func (w *world) summary(elapsed time.Duration, completed bool, gpuSecInf, gpuSecJobs, zero float64, peak int) *Summary {
	s := &Summary{
		Duration: elapsed, Seconds: elapsed.Seconds(), Completed: completed,
		RequestsServed: w.inf.served, PeakReplicas: peak,
		GPUSeconds: gpuSecInf, SecondsAtZero: zero, Trigger: demandSetting() + ", " + scaler.KeyGPUUtilTarget + "=" + strconv.Itoa(gpuUtilTarget),
		EndReplicas: w.inf.desired(), MaxReplicas: w.hpa.Max,
		TrainingSubmitted: w.train.submitted, TrainingFinished: w.train.finished, TrainingCreated: w.train.created,
		TrainingPeakRun: w.train.maxRunning, TrainingPeakPend: w.train.maxPending, TrainingNoWork: w.train.noWork, TrainingGPUSecs: gpuSecJobs,
		TrainingPoolGPUs: w.cluster.gpus("training"),
		StartupSeconds:   w.cfg.Timing.Startup.Seconds(), Phases: phaseSpans(w.cfg.Duration, elapsed),
	}
	for _, a := range w.tl.activations {
		s.Activations = append(s.Activations, ActivationSummary{AtSeconds: a.at.Sub(w.tl.start).Seconds(),
			Milliseconds: ms(a.latency), Via: a.via, PushMilliseconds: ms(a.push)})
	}
	s.RequestWaitP50, s.RequestWaitP99 = quantile(w.inf.waits, 0.5), quantile(w.inf.waits, 0.99)
	if n := len(w.inf.requests); n > 0 {
		s.ColdStartFraction = float64(w.inf.cold) / float64(n)
	}
	if spec := w.queueSpec(); spec != nil {
		s.QueueMetric = spec.GetMetricName()
	}
	for _, r := range w.tl.rows {
		s.Rows = append(s.Rows, r.export())
	}
	return s
}
