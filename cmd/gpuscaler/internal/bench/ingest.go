package bench

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	pb "github.com/gpuscaler/gpuscaler/proto/externalscaler"
	gpuscalerv1 "github.com/gpuscaler/gpuscaler/proto/gpuscaler/v1"
	"github.com/gpuscaler/gpuscaler/scaler"
)

// pacer spreads events evenly at rate per second from start.
type pacer struct {
	start time.Time
	rate  float64
}

// due returns how many events should have happened by now.
func (p pacer) due(now time.Time) int {
	if !now.After(p.start) {
		return 0
	}
	return int(p.rate * now.Sub(p.start).Seconds())
}

// kedaReadsPerS is how many reads per second KEDA makes of triggers ScaledObject
// triggers. KEDA v2.21's scale loop asks each trigger every pollingInterval, and its
// metrics adapter asks it again each time the HPA reads the metric (every hpaSync, the
// controller manager's --horizontal-pod-autoscaler-sync-period); both go through
// ScalersCache.GetMetricsAndActivityForScaler (pkg/scaling/scale_handler.go), which for
// an external scaler makes two calls, GetMetrics then IsActive
// (pkg/scalers/external_scaler.go, GetMetricsAndActivity). At KEDA's defaults (30 s, and
// Kubernetes' 15 s) that is 6 reads per trigger every 30 s: 2,000 reads/s for 10,000
// triggers.
func kedaReadsPerS(triggers int, pollingInterval, hpaSync time.Duration) float64 {
	return float64(triggers) * 2 * (1/pollingInterval.Seconds() + 1/hpaSync.Seconds())
}

// ReadLoad is what the readers did during one measurement.
type ReadLoad struct {
	// Readers is how many goroutines read: KEDA's concurrent calls at its rate, or
	// flat-out readers each calling as fast as it can.
	Readers int `json:"readers"`
	// OfferedPerS is the rate reads were asked for; 0 when flat out.
	OfferedPerS float64 `json:"offered_per_s,omitempty"`
	// Reads counts gRPC calls answered (GetMetrics and IsActive each count one), and
	// PerS is their rate.
	Reads int     `json:"reads"`
	PerS  float64 `json:"reads_per_s"`
	// Errors counts calls that failed, and FirstError says why the first did.
	Errors     int    `json:"errors"`
	FirstError string `json:"first_error,omitempty"`
	// Late counts the reads due that no reader was free to make: the scaler answered too
	// slowly for the rate asked. They are dropped, not made late. Every read asked for at
	// a rate is made, failed or late.
	Late int `json:"late,omitempty"`
}

// readers reads triggers through the scaler's gRPC server, the way KEDA does: each read
// is a GetMetrics and an IsActive of one trigger, triggers taken in a shuffled order
// that is the same in every run.
type readers struct {
	client pb.ExternalScalerClient
	trigs  []trigger
}

func newReaders(client pb.ExternalScalerClient, trigs []trigger, seed uint64) *readers {
	shuffled := append([]trigger(nil), trigs...)
	rand.New(rand.NewPCG(seed, 2)).Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
	return &readers{client: client, trigs: shuffled}
}

// readCounts accumulates a ReadLoad across goroutines.
type readCounts struct {
	reads, errs, late atomic.Int64
	firstErr          sync.Once
	first             string
}

// read makes one KEDA read of trigger t.
func (r *readers) read(ctx context.Context, t trigger, c *readCounts) {
	_, err := r.client.GetMetrics(ctx, &pb.GetMetricsRequest{ScaledObjectRef: t.ref, MetricName: t.metric})
	c.count(ctx, t, err)
	_, err = r.client.IsActive(ctx, t.ref)
	c.count(ctx, t, err)
}

func (c *readCounts) count(ctx context.Context, t trigger, err error) {
	switch {
	case err == nil:
		c.reads.Add(1)
	case ctx.Err() == nil: // a call cut short by the end of the measurement is no error
		c.errs.Add(1)
		c.firstErr.Do(func() { c.first = fmt.Sprintf("%s/%s: %v", t.ref.GetNamespace(), t.ref.GetName(), err) })
	}
}

func (c *readCounts) load(readers int, offered float64, elapsed time.Duration) ReadLoad {
	n := int(c.reads.Load())
	return ReadLoad{Readers: readers, OfferedPerS: offered, Reads: n, PerS: float64(n) / elapsed.Seconds(),
		Errors: int(c.errs.Load()), FirstError: c.first, Late: int(c.late.Load())}
}

// kedaWorkers is how many reads may be in flight at KEDA's rate. KEDA calls from a
// goroutine per ScaledObject and per HPA request, so many overlap; 32 is more than the
// rates here keep busy while the scaler answers within a few milliseconds.
const kedaWorkers = 32

// atRate reads at rate reads per second until stop closes, then waits for the reads
// already asked for; ctx bounds the calls. Reads come in pairs (GetMetrics and IsActive),
// so pairs are paced at half the rate.
func (r *readers) atRate(ctx context.Context, stop <-chan struct{}, rate float64) ReadLoad {
	c := &readCounts{}
	work := make(chan trigger, 4*kedaWorkers)
	var wg sync.WaitGroup
	for range kedaWorkers {
		wg.Go(func() {
			for t := range work {
				r.read(ctx, t, c)
			}
		})
	}
	start := time.Now()
	p := pacer{start: start, rate: rate / 2}
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	for sent, done := 0, false; !done; {
		select {
		case <-stop:
			done = true
		case <-ctx.Done():
			done = true
		case now := <-tick.C:
			for due := p.due(now); sent < due; sent++ {
				select {
				case work <- r.trigs[sent%len(r.trigs)]:
				default:
					c.late.Add(2)
				}
			}
		}
	}
	close(work)
	wg.Wait()
	return c.load(kedaWorkers, rate, time.Since(start))
}

// flatOut reads from n goroutines, each as fast as the scaler answers, until stop
// closes; ctx bounds the calls.
func (r *readers) flatOut(ctx context.Context, stop <-chan struct{}, n int) ReadLoad {
	c := &readCounts{}
	start := time.Now()
	var wg sync.WaitGroup
	for j := range n {
		wg.Go(func() {
			for i := j; ctx.Err() == nil; i += n {
				select {
				case <-stop:
					return
				default:
				}
				r.read(ctx, r.trigs[i%len(r.trigs)], c)
			}
		})
	}
	wg.Wait()
	return c.load(n, 0, time.Since(start))
}

// IngestRun is one measurement of ingestion at the scaler's apply path.
type IngestRun struct {
	Applied int     `json:"applied"`
	Seconds float64 `json:"seconds"`
	Rate    float64 `json:"applied_per_s"`
	// Reads is what the readers did meanwhile; nil when none read.
	Reads *ReadLoad `json:"reads,omitempty"`
}

// Ingest is ingestion at the scaler's apply path: the nodes' reports, encoded once,
// decoded and applied to the scaler's State by as many goroutines as the follower runs
// shards, as fast as they can, with no NATS in between, while the scaler's gRPC server
// answers reads of the same State.
type Ingest struct {
	Appliers int `json:"appliers"`
	IngestRuns
	// ApplyOnly is the same runs with reports decoded beforehand: the state's own part.
	ApplyOnly IngestRuns `json:"apply_only"`
	// ApplyOnlyNodes is how many nodes' decoded reports ApplyOnly applies in turn.
	ApplyOnlyNodes int `json:"apply_only_nodes"`
}

// IngestRuns is ingestion with no reads, with reads at KEDA's rate and reads flat out.
type IngestRuns struct {
	NoReads IngestRun `json:"no_reads"`
	KEDA    IngestRun `json:"reads_at_keda_rate"`
	FlatOut IngestRun `json:"reads_flat_out"`
	// FlatOutRatio is FlatOut's rate over NoReads'.
	FlatOutRatio float64 `json:"flat_out_ratio"`
}

// applyFlatOut decodes and applies the nodes' reports (or applies decoded, when given) to state from n goroutines for d,
// as the follower does (scaler/follow.go apply: a NodeDecoder per shard, then State.Apply),
// and returns how many it applied. Goroutine j takes nodes j, j+n, j+2n…, so with as
// many nodes as a multiple of n each node has one applier, as it has one shard.
func applyFlatOut(state *scaler.State, nodes []node, decoded []gpuscalerv1.Event, n int, d time.Duration) IngestRun {
	var stop atomic.Bool
	var total atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	timer := time.AfterFunc(d, func() { stop.Store(true) })
	defer timer.Stop()
	for j := range n {
		wg.Go(func() {
			applied := 0
			var dec gpuscalerv1.NodeDecoder
			for i := j; !stop.Load(); i += n {
				if decoded != nil { // the state keeps nothing of a report it is handed
					_ = state.Apply(decoded[i%len(decoded)], time.Now())
					applied++
					continue
				}
				nd := nodes[i%len(nodes)]
				ev, err := dec.Decode(nd.subject, nd.data)
				if err != nil {
					panic(err) // the reports were built valid; anything else is a bug here
				}
				_ = state.Apply(ev, time.Now()) // a node report is never refused
				applied++
			}
			total.Add(int64(applied))
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	applied := int(total.Load())
	return IngestRun{Applied: applied, Seconds: elapsed.Seconds(), Rate: float64(applied) / elapsed.Seconds()}
}

// measureIngest applies reports flat out with no reads, with reads at KEDA's rate, and
// with reads flat out from as many readers as appliers, each for d.
func measureIngest(ctx context.Context, state *scaler.State, nodes []node, rd *readers, appliers int, kedaRate float64, d time.Duration, progress io.Writer) Ingest {
	res := Ingest{Appliers: appliers}
	applyFlatOut(state, nodes, nil, appliers, d/4) // warm up: the heap grows to its working size
	res.IngestRuns = ingestRuns(ctx, rd, appliers, kedaRate, progress, func() IngestRun { return applyFlatOut(state, nodes, nil, appliers, d) })
	// The same with reports decoded beforehand, of as many nodes as the state holds
	// cheaply twice (a decoded 8-GPU report is about 15 kB).
	decoded := make([]gpuscalerv1.Event, min(len(nodes), 2000))
	for i := range decoded {
		ev, err := gpuscalerv1.Decode(nodes[i].subject, nodes[i].data)
		if err != nil {
			panic(err) // the reports were built valid; anything else is a bug here
		}
		decoded[i] = ev
	}
	res.ApplyOnlyNodes = len(decoded)
	fmt.Fprintf(progress, "      the same, reports of %d nodes decoded beforehand:\n", len(decoded))
	res.ApplyOnly = ingestRuns(ctx, rd, appliers, kedaRate, progress, func() IngestRun { return applyFlatOut(state, nodes, decoded, appliers, d) })
	return res
}

// ingestRuns runs apply with no reads, with reads at KEDA's rate and with reads flat out.
func ingestRuns(ctx context.Context, rd *readers, appliers int, kedaRate float64, progress io.Writer, apply func() IngestRun) IngestRuns {
	var res IngestRuns
	withReads := func(read func(stop <-chan struct{}) ReadLoad) IngestRun {
		stop := make(chan struct{})
		done := make(chan ReadLoad, 1)
		go func() { done <- read(stop) }()
		run := apply()
		close(stop)
		load := <-done
		run.Reads = &load
		return run
	}
	res.NoReads = apply()
	fmt.Fprintf(progress, "      no reads: %.0f applied/s\n", res.NoReads.Rate)
	res.KEDA = withReads(func(stop <-chan struct{}) ReadLoad { return rd.atRate(ctx, stop, kedaRate) })
	fmt.Fprintf(progress, "      reads at KEDA's rate (%.0f/s asked, %.0f/s made): %.0f applied/s\n", kedaRate, res.KEDA.Reads.PerS, res.KEDA.Rate)
	res.FlatOut = withReads(func(stop <-chan struct{}) ReadLoad { return rd.flatOut(ctx, stop, appliers) })
	fmt.Fprintf(progress, "      reads flat out (%d readers, %.0f/s made): %.0f applied/s\n", appliers, res.FlatOut.Reads.PerS, res.FlatOut.Rate)
	if res.NoReads.Rate > 0 {
		res.FlatOutRatio = res.FlatOut.Rate / res.NoReads.Rate
	}
	return res
}
