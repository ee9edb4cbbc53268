package inference

import (
	"container/heap"
	"context"
	"fmt"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/gpuscaler/gpuscaler/cmd/gpuscaler/internal/kedarules"
	pb "github.com/gpuscaler/gpuscaler/proto/externalscaler"
	gpuscalerv1 "github.com/gpuscaler/gpuscaler/proto/gpuscaler/v1"
	"github.com/gpuscaler/gpuscaler/scaler"
	"github.com/gpuscaler/gpuscaler/scaler/demand"
)

// Request is one request to an inference service: when it arrived, since the trace
// began, and how long a replica takes to serve it once it starts.
type Request struct {
	At, Service time.Duration
}

// Service is one Deployment and the requests sent to it, in arrival order.
type Service struct {
	Name     string
	Requests []Request
}

// Config is the cluster and KEDA configuration every service of a scenario shares.
type Config struct {
	// Concurrency is the requests one replica serves at once.
	Concurrency int
	// MinReplicas and MaxReplicas are the ScaledObject's minReplicaCount and
	// maxReplicaCount.
	MinReplicas, MaxReplicas int
	// PollingInterval and Cooldown are the ScaledObject's pollingInterval and
	// cooldownPeriod (KEDA's defaults: 30s, 300s).
	PollingInterval, Cooldown time.Duration
	// HPASync is kube-controller-manager's --horizontal-pod-autoscaler-sync-period
	// (15s) and ScaleDownWindow the HPA's default scale-down stabilization (300s).
	HPASync, ScaleDownWindow time.Duration
	// Tolerances are the HPA's tolerances; nil: its defaults (10% both ways).
	Tolerances *kedarules.Tolerances
	// Load draws how long a new replica loads its model before it serves.
	Load func(*rand.Rand) time.Duration
	// ReportInterval is the producer's heartbeat (the queue package's default, 1s).
	ReportInterval time.Duration
	// Seed makes the model loads repeatable.
	Seed uint64
	// WarmUp is the start of the replay that is run but not measured: a trace cut from a
	// service that was running before it began starts every scaled policy from zero
	// replicas, and the wake that follows is the cut's, not the policy's. Requests that
	// arrive before it count in no wait, and GPU time before it in no GPU-hours.
	WarmUp time.Duration
	// CutEnd says the same of the trace's end: the service went on after it. GPU time
	// after the replay's last request arrives counts in no GPU-hours: the traffic did
	// not stop there, the trace did, and how long a policy takes to scale down from a
	// stop the service never saw is not its cost. The replay still runs on
	// (Scenario.Tail), so the last requests are served and their waits count.
	CutEnd bool
}

// paidTo is when GPU time stops counting in a replay whose last request arrives at
// last: then where the trace is cut (CutEnd), else never.
func (c Config) paidTo(last time.Duration) time.Duration {
	if c.CutEnd {
		return last
	}
	return math.MaxInt64
}

// The lag of the seeds' Prometheus path: dcgm-exporter samples the GPUs every 30s (its
// default collect interval, -c 30000), and Prometheus scrapes it every 30s (a common
// ServiceMonitor interval), so the HPA, syncing every 15s through prometheus-adapter,
// acts on utilisation 0 to 60s old. Each service gets its own phases of the two clocks,
// drawn from the seed. prometheus-adapter's own relist and caching are left out: they
// only add to the lag.
const (
	dcgmExporterInterval = 30 * time.Second
	scrapeInterval       = 30 * time.Second
	// gpuUtilTarget is the seeds' HPA target, average utilisation per replica.
	gpuUtilTarget = 80
)

// serviceRun is what one policy did to one service.
type serviceRun struct {
	gpuSeconds float64
	// lifetimes sums each replica's life, created to removed, kept apart from
	// gpuSeconds, which is summed over time, so tests can hold one against the other.
	lifetimes  float64
	starts     []time.Duration // when each request's service started; -1: never
	restarted  int             // requests started twice: always 0
	waits      []float64       // seconds, by request
	measured   int             // the last requests, those that arrived after the warm-up
	cold       int             // requests that waited for a model load
	maxReplica int
	timeline   *timeline
}

// event kinds, in the order they are handled when they fall at the same instant.
const (
	evCompletion = iota
	evReady
	evArrival
	evReport
	evPoll
	evSync
	evCollect
	evScrape
)

type replica struct {
	created time.Duration
	readyAt time.Duration
	busy    int
	leaving bool // scaled down: takes no new work, goes when its work is done
}

type completion struct {
	at time.Duration
	r  *replica
}

type completions []completion

func (c completions) Len() int           { return len(c) }
func (c completions) Less(i, j int) bool { return c[i].at < c[j].at }
func (c completions) Swap(i, j int)      { c[i], c[j] = c[j], c[i] }
func (c *completions) Push(x any)        { *c = append(*c, x.(completion)) }
func (c *completions) Pop() any {
	old := *c
	x := old[len(old)-1]
	*c = old[:len(old)-1]
	return x
}

// sim replays one service under one policy.
type sim struct {
	cfg    Config
	pol    Policy
	svc    Service
	rng    *rand.Rand
	end    time.Duration
	paidTo time.Duration // GPU time after it counts in no GPU-hours (Config.CutEnd)
	now    time.Duration
	epoch  time.Time // the scaler's clock reads epoch + now
	reqIdx int       // next request to arrive
	queue  []int     // waiting requests, FIFO
	head   int
	inFl   int
	reps   []*replica
	want   int // the Deployment's replicas
	done   completions
	run    serviceRun

	// the scaler, and what the producer last told it
	state       *scaler.State
	server      *scaler.Server
	ref         *pb.ScaledObjectRef
	specs       []*pb.MetricSpec
	seq         uint64
	lastReport  time.Duration
	lastBacklog uint64
	arrivals    uint64

	// What the producer measures and reports, as queue.Reporter does (QueueTraffic):
	// completions and busy seconds counted as things happen (arrivals are s.arrivals,
	// since the last report), and its account as of the last report.
	totals  demand.Totals
	measure demand.Measure
	// loads are the latest model loads, created to ready, as the gateway measures a
	// backend's cold start; the producer reports the largest (gateway.recentStarts).
	loads []time.Duration

	so  kedarules.ScaledObject
	hpa kedarules.HPA

	// the seeds' path: utilisation as dcgm-exporter last sampled it, and as Prometheus
	// last scraped that
	collectPhase, scrapePhase time.Duration
	sampled, scraped          float64

	// when each periodic clock ticks next; a tick at the instant of another event
	// still happens (after it)
	nextPoll, nextSync, nextCollect, nextScrape time.Duration
}

const namespace = "replay"

func newSim(cfg Config, pol Policy, svc Service, end, paidTo time.Duration, tl *timeline) *sim {
	h := fnv.New64a()
	h.Write([]byte(svc.Name))
	s := &sim{cfg: cfg, pol: pol, svc: svc, end: end, paidTo: paidTo,
		rng:   rand.New(rand.NewPCG(cfg.Seed, h.Sum64())),
		epoch: time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC),
	}
	s.run.timeline = tl
	s.run.waits = make([]float64, len(svc.Requests))
	s.run.starts = make([]time.Duration, len(svc.Requests))
	for i := range s.run.starts {
		s.run.starts[i] = -1
	}
	cooldown := cfg.Cooldown
	if pol.Cooldown > 0 {
		cooldown = pol.Cooldown
	}
	s.so = kedarules.ScaledObject{Cooldown: cooldown}
	s.hpa = kedarules.HPA{Min: max(cfg.MinReplicas, 1), Max: cfg.MaxReplicas, ScaleDownWindow: cfg.ScaleDownWindow, Tolerances: cfg.Tolerances}
	phases := rand.New(rand.NewPCG(cfg.Seed^0x9e3779b97f4a7c15, h.Sum64()))
	s.collectPhase = time.Duration(phases.Int64N(int64(dcgmExporterInterval)))
	s.scrapePhase = time.Duration(phases.Int64N(int64(scrapeInterval)))
	return s
}

// play runs the service to the end of the replay and past it until every request has
// been served.
func (s *sim) play(ctx context.Context) (serviceRun, error) {
	switch s.pol.Kind {
	case KindAlwaysOn:
		s.want = peakReplicas(s.svc.Requests, s.cfg.Concurrency, s.cfg.MaxReplicas)
		for range s.want {
			s.reps = append(s.reps, &replica{}) // loaded before the trace starts
		}
		s.run.maxReplica = s.want
	case KindGPUUtil:
		s.want = max(s.cfg.MinReplicas, 1)
		s.scale()
		for _, r := range s.reps {
			r.readyAt = 0 // the seeds' path never scales to zero: warm from the start
		}
	case KindScaler:
		md := map[string]string{scaler.KeyQueue: "q"}
		for k, v := range s.pol.Metadata {
			md[k] = v
		}
		s.state = scaler.NewState(s.clock)
		s.server = scaler.NewLocalServer(s.state)
		s.ref = &pb.ScaledObjectRef{Name: s.svc.Name, Namespace: namespace, ScalerMetadata: md}
		spec, err := s.server.GetMetricSpec(ctx, s.ref)
		if err != nil {
			return s.run, fmt.Errorf("policy %s: %w", s.pol.Name, err)
		}
		s.specs = spec.GetMetricSpecs()
		s.want = s.cfg.MinReplicas
		s.scale()
		s.report() // the producer's first report, as NewReporter sends it
	}
	for steps := 0; ; steps++ {
		if steps%4096 == 0 && ctx.Err() != nil {
			return s.run, ctx.Err()
		}
		at, kind := s.next()
		if kind < 0 {
			break
		}
		s.advance(at)
		if err := s.handle(ctx, kind); err != nil {
			return s.run, err
		}
		s.run.timeline.backlog(s.now, s.backlog())
	}
	s.advance(max(s.now, s.end))
	for _, r := range s.reps {
		s.run.lifetimes += s.life(r)
	}
	s.run.measured = len(s.svc.Requests) - sort.Search(len(s.svc.Requests), func(i int) bool { return s.svc.Requests[i].At >= s.cfg.WarmUp })
	return s.run, nil
}

func (s *sim) clock() time.Time { return s.epoch.Add(s.now) }

// asleep says nothing can happen in the service until its next request: no replicas, no
// work.
func (s *sim) asleep() bool {
	return len(s.reps) == 0 && s.backlog() == 0
}

func (s *sim) backlog() int { return len(s.queue) - s.head + s.inFl }

// next returns the time and kind of the next event, or kind -1 when the replay is over.
func (s *sim) next() (time.Duration, int) {
	at, kind := time.Duration(math.MaxInt64), -1
	consider := func(t time.Duration, k int) {
		if t < at || t == at && k < kind {
			at, kind = t, k
		}
	}
	if len(s.done) > 0 {
		consider(s.done[0].at, evCompletion)
	}
	for _, r := range s.reps {
		if r.readyAt > s.now {
			consider(r.readyAt, evReady)
		}
	}
	if s.reqIdx < len(s.svc.Requests) {
		consider(s.svc.Requests[s.reqIdx].At, evArrival)
	}
	finished := s.reqIdx == len(s.svc.Requests) && s.backlog() == 0
	if finished && (s.now >= s.end || len(s.reps) == 0 && s.pol.Kind == KindScaler) {
		return 0, -1
	}
	switch s.pol.Kind {
	case KindScaler:
		if !s.asleep() { // asleep, polls find nothing and heartbeats change nothing
			consider(s.lastReport+s.cfg.ReportInterval, evReport)
			consider(s.due(&s.nextPoll, s.cfg.PollingInterval, 0), evPoll)
		}
		if len(s.reps) > 0 {
			consider(s.due(&s.nextSync, s.cfg.HPASync, 0), evSync)
		}
	case KindGPUUtil:
		consider(s.due(&s.nextCollect, dcgmExporterInterval, s.collectPhase), evCollect)
		consider(s.due(&s.nextScrape, scrapeInterval, s.scrapePhase), evScrape)
		consider(s.due(&s.nextSync, s.cfg.HPASync, 0), evSync)
	}
	if finished && at > s.end {
		// Nothing but the policy's own clocks is left: stop at the end of the replay.
		if kind >= evReport {
			return 0, -1
		}
	}
	return at, kind
}

// due returns when the clock that ticks every period from phase ticks next: *next,
// unless that has passed unseen (the service slept), then its first tick from now on.
func (s *sim) due(next *time.Duration, period, phase time.Duration) time.Duration {
	if *next < s.now {
		switch {
		case s.now <= phase:
			*next = phase
		default:
			*next = phase + (s.now-phase+period-1)/period*period
		}
	}
	return *next
}

// advance moves the clock to at, paying for the replicas held meanwhile.
func (s *sim) advance(at time.Duration) {
	if at <= s.now {
		return
	}
	n := len(s.reps)
	s.totals.Busy += float64(s.inFl) * (at - s.now).Seconds()
	s.run.gpuSeconds += float64(n) * s.paid(s.now, at)
	s.run.timeline.hold(s.now, at, n)
	s.now = at
}

func (s *sim) handle(ctx context.Context, kind int) error {
	switch kind {
	case evCompletion:
		c := heap.Pop(&s.done).(completion)
		c.r.busy--
		s.inFl--
		s.totals.Completions++
		if c.r.leaving && c.r.busy == 0 {
			s.remove(c.r)
		}
		s.dispatch()
	case evReady:
		for _, r := range s.reps {
			if r.readyAt == s.now && r.readyAt > r.created {
				s.loads = append(s.loads, r.readyAt-r.created)
				if len(s.loads) > recentLoads {
					s.loads = s.loads[1:]
				}
			}
		}
		s.dispatch()
	case evArrival:
		s.queue = append(s.queue, s.reqIdx)
		s.reqIdx++
		s.arrivals++
		s.dispatch()
		if s.pol.Kind == KindScaler && s.lastBacklog == 0 && s.backlog() > 0 {
			if s.skippedHeartbeats() {
				s.heartbeat()
			}
			s.report() // the Reporter wakes at once on work after an empty report
			return s.push(ctx)
		}
	case evReport:
		s.report()
		return s.push(ctx)
	case evPoll:
		s.nextPoll += s.cfg.PollingInterval
		return s.poll(ctx)
	case evSync:
		s.nextSync += s.cfg.HPASync
		return s.sync(ctx)
	case evCollect:
		s.nextCollect += dcgmExporterInterval
		s.sampled = s.util()
	case evScrape:
		s.nextScrape += scrapeInterval
		s.scraped = s.sampled
	}
	return nil
}

// skippedHeartbeats says the replay skipped producer heartbeats while the service slept.
func (s *sim) skippedHeartbeats() bool {
	return s.now-s.lastReport > s.cfg.ReportInterval
}

// heartbeat sends the last heartbeat the producer would have sent before now while the
// replay skipped them: the scaler's estimates then decay over the idle time exactly as
// they do over the heartbeats the replay did not send (each folds in zero arrivals and
// the same counts).
func (s *sim) heartbeat() {
	ticks := (s.now - s.lastReport) / s.cfg.ReportInterval
	if (s.now-s.lastReport)%s.cfg.ReportInterval == 0 {
		ticks--
	}
	if ticks <= 0 {
		return
	}
	saved, arrivals := s.now, s.arrivals
	s.now, s.arrivals = s.lastReport+ticks*s.cfg.ReportInterval, 0
	waiting := uint64(len(s.queue) - s.head)
	s.apply(waiting-min(waiting, arrivals), uint64(s.inFl), 0)
	s.now, s.arrivals = saved, arrivals
}

// report publishes the queue's state as the producer's Reporter does.
func (s *sim) report() {
	s.apply(uint64(len(s.queue)-s.head), uint64(s.inFl), s.arrivals)
	s.arrivals = 0
}

// recentLoads is how many of the latest model loads the producer's cold start is the
// largest of, as the gateway's (gateway.recentStarts).
const recentLoads = 5

func (s *sim) apply(waiting, inFlight, arrivals uint64) {
	s.seq++
	stored := s.clock()
	// The producer measures: the arrivals this report carries, and every completion and
	// busy second up to now (a heartbeat the replay skipped has none: the service slept).
	cur := demand.Totals{Arrivals: s.measure.Totals.Arrivals + arrivals, Completions: s.totals.Completions, Busy: s.totals.Busy}
	traffic := &gpuscalerv1.QueueTraffic{}
	s.measure.Report(cur, s.now-s.lastReport, traffic)
	s.measure.Oldest(s.now, waiting, traffic)
	var cold time.Duration
	for _, l := range s.loads {
		cold = max(cold, l)
	}
	r := &gpuscalerv1.QueueReport{Namespace: namespace, Queue: "q", Waiting: waiting, InFlight: inFlight,
		Arrivals: arrivals, ObservedAt: timestamppb.New(stored), ProducerId: "replay", Sequence: s.seq,
		Traffic: traffic, ColdStartSeconds: cold.Seconds()}
	if err := s.state.Apply(gpuscalerv1.Event{Queue: r}, stored); err != nil {
		panic(fmt.Sprintf("replay: apply queue report: %v", err)) // one queue per state: no limit applies
	}
	s.lastReport = s.now
	s.lastBacklog = waiting + inFlight
}

// freshen sends the heartbeats the replay skipped, so the scaler reads current data.
func (s *sim) freshen() {
	if s.skippedHeartbeats() {
		s.heartbeat()
		s.report()
	}
}

// push is StreamIsActive: at zero replicas, a report that makes the trigger active
// reaches KEDA at once.
func (s *sim) push(ctx context.Context) error {
	if !s.pol.Push || len(s.reps) > 0 {
		return nil
	}
	return s.activate(ctx)
}

func (s *sim) poll(ctx context.Context) error {
	s.freshen()
	return s.activate(ctx)
}

// activate asks IsActive and lets KEDA act on the answer.
func (s *sim) activate(ctx context.Context) error {
	resp, err := s.server.IsActive(ctx, s.ref)
	if err != nil && status.Code(err) == codes.InvalidArgument {
		return fmt.Errorf("policy %s: %w", s.pol.Name, err)
	}
	next, _, changed := s.so.Observe(s.clock(), s.want, resp.GetResult(), err)
	if changed {
		s.want = next
		s.scale()
	}
	return nil
}

// sync is one HPA sync.
func (s *sim) sync(ctx context.Context) error {
	if s.want < 1 {
		return nil // the HPA does not act on a workload at zero: KEDA does
	}
	var metrics []kedarules.Metric
	switch s.pol.Kind {
	case KindGPUUtil:
		metrics = append(metrics, kedarules.Metric{Name: "gpu-util", Value: s.scraped, Target: gpuUtilTarget})
	case KindScaler:
		s.freshen()
		for _, spec := range s.specs {
			resp, err := s.server.GetMetrics(ctx, &pb.GetMetricsRequest{ScaledObjectRef: s.ref, MetricName: spec.GetMetricName()})
			if err != nil {
				if status.Code(err) == codes.InvalidArgument {
					return fmt.Errorf("policy %s: %w", s.pol.Name, err)
				}
				continue // a failed metric is left out, as the HPA does
			}
			metrics = append(metrics, kedarules.Metric{Name: spec.GetMetricName(),
				Value: resp.GetMetricValues()[0].GetMetricValueFloat(), Target: spec.GetTargetSizeFloat()})
		}
	}
	if want, _ := s.hpa.Desired(s.clock(), s.want, metrics); want != s.want {
		s.want = want
		s.scale()
	}
	return nil
}

// util is the replicas' summed GPU utilisation, in percent: a replica's GPU is as busy
// as the share of its concurrency in use.
func (s *sim) util() float64 {
	busy := 0
	for _, r := range s.reps {
		busy += r.busy
	}
	return 100 * float64(busy) / float64(s.cfg.Concurrency)
}

// scale brings the replicas to s.want as a ReplicaSet does: new ones load their model;
// going down, it deletes those not ready first, then idle ones, then the busy ones, which
// finish what they serve.
func (s *sim) scale() {
	live := 0
	for _, r := range s.reps {
		if !r.leaving {
			live++
		}
	}
	for ; live < s.want; live++ {
		s.reps = append(s.reps, &replica{created: s.now, readyAt: s.now + s.cfg.Load(s.rng)})
	}
	for live > s.want {
		victim := -1
		for i, r := range s.reps {
			if r.leaving {
				continue
			}
			if victim < 0 || rank(r, s.now) < rank(s.reps[victim], s.now) {
				victim = i
			}
		}
		r := s.reps[victim]
		r.leaving = true
		if r.busy == 0 {
			s.remove(r)
		}
		live--
	}
	s.run.maxReplica = max(s.run.maxReplica, len(s.reps))
	s.dispatch()
}

// rank orders replicas for deletion: not ready first (the newest first), then idle, then
// busy.
func rank(r *replica, now time.Duration) int64 {
	switch {
	case r.readyAt > now:
		return -int64(r.readyAt)
	case r.busy == 0:
		return 1
	}
	return 2 + int64(r.busy)
}

// life is how long r has held its GPU, in the seconds that count (see paid).
func (s *sim) life(r *replica) float64 { return s.paid(r.created, s.now) }

// paid is the part of [from, to) that GPU-hours count, in seconds: after the warm-up and
// before paidTo.
func (s *sim) paid(from, to time.Duration) float64 {
	return max(min(to, s.paidTo)-max(from, s.cfg.WarmUp), 0).Seconds()
}

func (s *sim) remove(r *replica) {
	s.run.lifetimes += s.life(r)
	s.reps = slices.DeleteFunc(s.reps, func(x *replica) bool { return x == r })
}

// dispatch hands waiting requests, oldest first, to the least busy ready replica.
func (s *sim) dispatch() {
	for s.head < len(s.queue) {
		var best *replica
		for _, r := range s.reps {
			if r.leaving || r.readyAt > s.now || r.busy >= s.cfg.Concurrency {
				continue
			}
			if best == nil || r.busy < best.busy {
				best = r
			}
		}
		if best == nil {
			return
		}
		i := s.queue[s.head]
		s.head++
		if s.head > 1024 && s.head*2 > len(s.queue) {
			s.queue = append(s.queue[:0], s.queue[s.head:]...)
			s.head = 0
		}
		req := s.svc.Requests[i]
		wait := (s.now - req.At).Seconds()
		if s.run.starts[i] >= 0 {
			s.run.restarted++
		}
		s.run.starts[i] = s.now
		s.run.waits[i] = wait
		s.run.timeline.wait(req.At, wait)
		if best.readyAt > req.At && req.At >= s.cfg.WarmUp {
			s.run.cold++
		}
		best.busy++
		s.inFl++
		heap.Push(&s.done, completion{at: s.now + req.Service, r: best})
	}
}

// peakReplicas is the most replicas the requests need at once if each started the
// moment it arrived, concurrency to a replica, at most max.
func peakReplicas(reqs []Request, concurrency, maxReplicas int) int {
	return min(PeakNeed(reqs, concurrency), maxReplicas)
}

// PeakNeed returns the replicas, each serving concurrency requests at once, that serve
// every one of reqs (in order of arrival) the moment it arrives: the most requests in
// service at once over concurrency, rounded up, and at least 1.
func PeakNeed(reqs []Request, concurrency int) int {
	ends := make(durations, 0, 64)
	peak := 0
	for _, r := range reqs {
		for len(ends) > 0 && ends[0] <= r.At {
			heap.Pop(&ends)
		}
		heap.Push(&ends, r.At+r.Service)
		peak = max(peak, len(ends))
	}
	return max((peak+concurrency-1)/concurrency, 1)
}

type durations []time.Duration

func (d durations) Len() int           { return len(d) }
func (d durations) Less(i, j int) bool { return d[i] < d[j] }
func (d durations) Swap(i, j int)      { d[i], d[j] = d[j], d[i] }
func (d *durations) Push(x any)        { *d = append(*d, x.(time.Duration)) }
func (d *durations) Pop() any {
	old := *d
	x := old[len(old)-1]
	*d = old[:len(old)-1]
	return x
}
