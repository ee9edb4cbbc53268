// Package queue is gpuscaler's queue-producer API: a Reporter that a program holding a
// queue of work (requests for an inference server, jobs for training) updates as items
// arrive, start and finish, and that publishes the queue's state to NATS as the
// QueueReport events the scaler reads (gpuscaler.v1.queue.<namespace>.<queue>.<producer>).
//
// A Reporter publishes at once when a queue it last reported empty gets work, which is
// what wakes a workload scaled to zero, and every interval otherwise, empty or not, as a
// heartbeat: the scaler reads silence as "the producer is gone", never as "the queue is
// empty". The counting methods cost a few atomic operations and never wait on NATS, so
// they belong on a request path; one background goroutine per Reporter does the
// publishing.
//
// A queue may have many producers (the replicas of a gateway, workers that each hold a
// share of it): each runs its own Reporter, with an id of its own, on a subject of its
// own, and the scaler reads the queue as the sum of the live ones. A Reporter that is
// closed says so in its last report, and its share leaves the sum at once; one that
// falls silent leaves it after the trigger's staleAfter. While no producer of a queue is
// live the scaler knows nothing of it, and says so rather than read 0.
//
// A Reporter measures its share of the queue's traffic where it is exact, as it sees every
// item arrive, start and finish: the arrivals, completions and drops since it started, the
// item-seconds in flight, and its own windowed estimates of the arrival rate and the
// service time (scaler/demand, the same arithmetic the scaler uses). Every report carries
// them (QueueReport.traffic), so every scaler replica, one that restarted a second ago
// included, reads the same figures.
//
// `gpuscaler publish queue` is the shell equivalent of one report. The package meets the
// scaler in the event contract (proto/gpuscaler/v1) and in scaler/demand, the estimator
// both sides share (pure arithmetic over the contract); it imports nothing else of it.
package queue

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"google.golang.org/protobuf/types/known/timestamppb"

	gpuscalerv1 "github.com/gpuscaler/gpuscaler/proto/gpuscaler/v1"
	"github.com/gpuscaler/gpuscaler/scaler/demand"
)

// Defaults for the zero Config.
const (
	DefaultInterval     = time.Second
	DefaultFlushTimeout = 2 * time.Second
)

// reconnectPoll is how often a report that is due looks again whether NATS is
// connected. A Reporter cannot hook the connection's reconnect callback without taking
// it from the program that owns the connection, so it looks.
const reconnectPoll = 100 * time.Millisecond

// Config tunes a Reporter. The zero value reports every second, under a producer id made
// from the host name, and logs nothing.
type Config struct {
	// Interval is the time between heartbeat reports. Keep it well below the staleAfter
	// of the triggers that read the queue (default 30s). Zero means DefaultInterval;
	// negative is an error.
	Interval time.Duration
	// ProducerID names the producer in every report and in its subject: one NATS
	// subject token (gpuscalerv1.ValidateProducerID; gpuscalerv1.ProducerID makes one of
	// a pod or host name). Each producer of a queue needs its own. Empty means the host
	// name and a random suffix, new for each Reporter, so a restarted producer, whose
	// sequence numbers start again at 1, is told apart from its predecessor.
	ProducerID string
	// FlushTimeout bounds how long Close waits for NATS to confirm the final report.
	// Zero means DefaultFlushTimeout; negative is an error.
	FlushTimeout time.Duration
	// Log receives connection changes and publish errors. Nil discards them.
	Log *slog.Logger
}

// Reporter reports one queue's state to NATS. Its methods are safe for concurrent use,
// and Enqueued, Started, Finished, Dropped and Set never block, on NATS or on each
// other: they update counters and at most wake the Reporter's goroutine, without
// allocating.
//
// It publishes a report when it starts, at once when the queue goes from empty to
// non-empty while the last report showed it empty, every Config.Interval after the
// previous report, and from Close. Reports are numbered 1, 2, 3… in the order they are
// published. While NATS is not connected, reports wait; the first one after it
// connects again carries the counts of that moment, and all the arrivals since the last
// report sent.
//
// Each call changes the waiting and in-flight counts together in one atomic step, so a
// report never shows an item moving from waiting to in flight as in neither, nor an
// empty queue that never was. The counts hold at most MaxCount each and never go
// below 0: finishing more items than are in flight, or starting more than are waiting,
// saturates instead of wrapping around. So count an item as Enqueued before a worker can
// take it (before putting it where workers look), as with sync.WaitGroup's Add before
// go: a Started that comes first finds nothing waiting, and the item then stays counted
// as waiting after it has gone.
type Reporter struct {
	// counts holds the packed waiting and in-flight counts; every method updates it
	// atomically.
	counts atomic.Uint64
	// arrivals counts the items enqueued since the Reporter started, dropped those that
	// left the queue unserved.
	arrivals atomic.Uint64
	dropped  atomic.Uint64
	// busy integrates the items in flight over time and counts completions: Started and
	// Finished change it after they change counts. Set does not (see set).
	busy busy
	// set is true once Set was called: the Reporter then knows neither arrivals nor
	// completions for sure, and its reports carry no traffic.
	set atomic.Bool
	// epoch is when the Reporter started; busy's times are nanoseconds since, read
	// from the monotonic clock.
	epoch time.Time
	// coldStart holds the latest measured cold start, in seconds, as float64 bits.
	coldStart atomic.Uint64
	// wake tells the goroutine that the queue went from empty to non-empty.
	wake chan struct{}
	// heldReports counts the times a due report waited for NATS to connect; tests read it.
	heldReports atomic.Uint64

	nc      *nats.Conn
	subject string
	cfg     Config
	log     *slog.Logger

	cancel context.CancelFunc
	done   chan struct{} // closed when the goroutine has returned

	// Owned by the goroutine, then by Close once done is closed.
	msg         gpuscalerv1.QueueReport
	observedAt  timestamppb.Timestamp
	traffic     gpuscalerv1.QueueTraffic
	buf         []byte
	lastBacklog uint64 // backlog in the last report published
	failing     bool   // the last publish failed; logged once per run of failures
	held        bool   // a report is held back while NATS is not connected; logged once
	// sent is the arrivals and drops totals in the last report published: the report's
	// arrivals and dropped are the totals less these.
	sent struct{ arrivals, dropped uint64 }
	// The traffic measured up to the last report attempted, published or not: the
	// totals and the estimate, and busy's integral and its time then.
	account  demand.Measure
	integral int64
	at       int64

	closeOnce sync.Once
	closeErr  error
}

// NewReporter starts a Reporter for queue name in namespace, publishing on nc. The
// names and the producer id must make a valid subject (gpuscalerv1.QueueSubject); the
// error then wraps gpuscalerv1.ErrInvalidName. It publishes its first report at once,
// so the scaler knows the producer is there, and runs until Close.
//
// The Reporter does not own nc: close nc after the Reporter.
func NewReporter(nc *nats.Conn, namespace, name string, cfg Config) (*Reporter, error) {
	if nc == nil {
		return nil, errors.New("queue reporter: NATS connection is nil")
	}
	if cfg.ProducerID == "" {
		cfg.ProducerID = defaultProducerID()
	}
	subject, err := gpuscalerv1.QueueSubject(namespace, name, cfg.ProducerID)
	if err != nil {
		return nil, fmt.Errorf("queue reporter: %w", err)
	}
	switch {
	case cfg.Interval < 0:
		return nil, fmt.Errorf("queue reporter: interval %s: want a positive duration, or 0 for %s", cfg.Interval, DefaultInterval)
	case cfg.Interval == 0:
		cfg.Interval = DefaultInterval
	}
	switch {
	case cfg.FlushTimeout < 0:
		return nil, fmt.Errorf("queue reporter: flush timeout %s: want a positive duration, or 0 for %s", cfg.FlushTimeout, DefaultFlushTimeout)
	case cfg.FlushTimeout == 0:
		cfg.FlushTimeout = DefaultFlushTimeout
	}
	log := cfg.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &Reporter{
		epoch:   time.Now(),
		wake:    make(chan struct{}, 1),
		nc:      nc,
		subject: subject,
		cfg:     cfg,
		log:     log.With("component", "queue-reporter", "namespace", namespace, "queue", name, "producer", cfg.ProducerID),
		cancel:  cancel,
		done:    make(chan struct{}),
	}
	r.msg = gpuscalerv1.QueueReport{
		Namespace:  namespace,
		Queue:      name,
		ProducerId: cfg.ProducerID,
		ObservedAt: &r.observedAt,
	}
	go r.run(ctx)
	return r, nil
}

// Enqueued records n items added to the queue: n more waiting, and n more arrivals in
// the next report. If the queue was empty, the Reporter publishes without waiting for
// the interval. n ≤ 0 does nothing.
func (r *Reporter) Enqueued(n int) {
	k := count(n)
	if k == 0 {
		return
	}
	old, c := r.update(func(c counts) counts { return c.enqueued(k) })
	// Before the wake-up, so the report it brings includes them.
	r.arrivals.Add(k)
	if old.empty() && !c.empty() {
		r.wakeUp()
	}
}

// Started records n items taken from the queue for processing: n fewer waiting (not
// below 0) and n more in flight, in one step. n ≤ 0 does nothing.
func (r *Reporter) Started(n int) {
	k := count(n)
	if k == 0 {
		return
	}
	old, c := r.update(func(c counts) counts { return c.started(k) })
	r.busy.change(int64(c.inFlight())-int64(old.inFlight()), 0, r.now())
	if old.empty() && !c.empty() {
		r.wakeUp() // started without being enqueued
	}
}

// Finished records n items done, failed or abandoned once started: n fewer in flight,
// not below 0, and n more completions (those that were in flight). n ≤ 0 does nothing.
// An item that leaves before it started is Dropped: a completion counts towards the
// service time.
func (r *Reporter) Finished(n int) {
	k := count(n)
	if k == 0 {
		return
	}
	old, c := r.update(func(c counts) counts { return c.finished(k) }) // never makes a queue non-empty
	done := old.inFlight() - c.inFlight()
	r.busy.change(-int64(done), done, r.now())
}

// Dropped records n waiting items that left the queue without being served (a hold that
// timed out, a client that went away, an overflow refused): n fewer waiting, not below
// 0, and n more drops in the next report. Drops are reported apart from completions, so
// the scaler's service-time estimate is not fooled by items that never ran. Count an
// item refused at once as Enqueued, then Dropped: it was demand. n ≤ 0 does nothing.
func (r *Reporter) Dropped(n int) {
	k := count(n)
	if k == 0 {
		return
	}
	r.update(func(c counts) counts { return c.dropped(k) }) // never makes a queue non-empty
	r.dropped.Add(k)
}

// ColdStart records d as how long a new replica of the workload took to serve, as this
// producer last measured it (a gateway: a backend from first seen not ready to ready).
// Every later report carries it, until a new figure replaces it, so the scaler knows it
// when the workload is at zero and no replica is starting. d ≤ 0 clears it: not
// measured. It is one atomic store, without allocating.
func (r *Reporter) ColdStart(d time.Duration) {
	r.coldStart.Store(math.Float64bits(max(d, 0).Seconds()))
}

// Set replaces both counts, for a program that reads its queue's length rather than
// counting changes. Negative counts are 0. It leaves arrivals alone: only Enqueued
// counts them. Such a program does not tell the Reporter when items finish, so once Set
// is called the Reporter measures no traffic: its reports carry none, and the scaler
// estimates the queue's traffic from the differences between them, as for any producer
// that does not measure.
func (r *Reporter) Set(waiting, inFlight int) {
	c := packCounts(count(waiting), count(inFlight))
	r.set.Store(true)
	if old := counts(r.counts.Swap(uint64(c))); old.empty() && !c.empty() {
		r.wakeUp()
	}
}

// update applies f to the counts atomically, and returns the counts before and after.
// The closures above capture only an integer and are inlined, so this does not
// allocate.
func (r *Reporter) update(f func(counts) counts) (old, c counts) {
	for {
		old := r.counts.Load()
		c := f(counts(old))
		if r.counts.CompareAndSwap(old, uint64(c)) {
			return counts(old), c
		}
	}
}

// now is the time since the Reporter started, in nanoseconds, from the monotonic clock.
func (r *Reporter) now() int64 { return int64(time.Since(r.epoch)) }

func (r *Reporter) wakeUp() {
	select {
	case r.wake <- struct{}{}:
	default: // a wake-up is pending already
	}
}

// Close stops the Reporter: it publishes a final report of the current counts, marked
// stopped, so that the scaler leaves this producer's share out of the queue at once, and
// waits up to Config.FlushTimeout for NATS to confirm it. It returns an error if the report
// could not be sent or confirmed; one wrapping nats.ErrDisconnected when NATS was not
// connected. Close is safe to call more than once, and concurrently; every call returns
// the first one's result. After Close the counting methods still work but nothing is
// published any more. Close does not close the NATS connection.
func (r *Reporter) Close() error {
	r.closeOnce.Do(func() {
		r.cancel()
		<-r.done
		r.closeErr = r.final()
	})
	return r.closeErr
}

func (r *Reporter) final() error {
	if !r.nc.IsConnected() {
		return fmt.Errorf("queue reporter %s: final report not sent, NATS connection is %s: %w", r.subject, r.nc.Status(), nats.ErrDisconnected)
	}
	r.msg.Stopped = true
	if err := r.publish(counts(r.counts.Load())); err != nil {
		return fmt.Errorf("queue reporter %s: final report: %w", r.subject, err)
	}
	if err := r.nc.FlushTimeout(r.cfg.FlushTimeout); err != nil {
		return fmt.Errorf("queue reporter %s: flush final report: %w", r.subject, err)
	}
	return nil
}

// run publishes a report when one is due and NATS is connected: at start, every
// interval after the last report, and at once when the queue goes from empty to
// non-empty while the last report showed it empty. A report that comes due while NATS
// is not connected waits, polling the connection, and then carries the counts of the
// moment it is sent: old counts are worth nothing, and publishing into nats.go's
// reconnect buffer would only replay them.
func (r *Reporter) run(ctx context.Context) {
	defer close(r.done)
	timer := time.NewTimer(0) // the first report, at once
	defer timer.Stop()
	for {
		var c counts
		select {
		case <-ctx.Done():
			return
		case <-r.wake:
			// Only a queue that the last report showed empty needs reporting before the
			// next heartbeat. The report carries the counts read here, which show work,
			// so however often the queue drains and fills again before the heartbeat,
			// this happens at most once: a busy queue does not flood NATS.
			if c = counts(r.counts.Load()); r.lastBacklog > 0 || c.empty() {
				continue
			}
		case <-timer.C:
			c = counts(r.counts.Load())
		}
		if !r.nc.IsConnected() {
			if !r.held {
				r.held = true
				r.log.Info("NATS not connected; holding reports until it is", "status", r.nc.Status().String())
			}
			r.heldReports.Add(1)
			timer.Reset(min(reconnectPoll, r.cfg.Interval))
			continue
		}
		if r.held {
			r.held = false
			r.log.Info("NATS connected; reporting again")
		}
		if err := r.publish(c); err != nil {
			if !r.failing {
				r.failing = true
				r.log.Warn("publish queue report", "subject", r.subject, "err", err)
			}
		} else if r.failing {
			r.failing = false
			r.log.Info("publishing queue reports again", "subject", r.subject)
		}
		timer.Reset(r.cfg.Interval)
	}
}

// publish sends one report of counts c, with the arrivals and drops counted since the
// last report published, and the traffic measured up to now. On failure the sequence
// number is kept for the next report, which counts the arrivals and drops of this one
// too; the traffic's totals never go back.
func (r *Reporter) publish(c counts) error {
	arrivals, dropped := r.arrivals.Load(), r.dropped.Load()
	now := time.Now()
	r.observedAt.Seconds, r.observedAt.Nanos = now.Unix(), int32(now.Nanosecond())
	r.msg.Waiting, r.msg.InFlight = c.waiting(), c.inFlight()
	r.msg.Arrivals, r.msg.Dropped = arrivals-r.sent.arrivals, dropped-r.sent.dropped
	r.measure(arrivals, dropped)
	r.account.Oldest(time.Duration(r.at), c.waiting(), &r.traffic)
	if r.set.Load() {
		r.msg.Traffic = nil
	} else {
		r.msg.Traffic = &r.traffic
	}
	r.msg.ColdStartSeconds = math.Float64frombits(r.coldStart.Load())
	r.msg.Sequence++
	size := r.msg.SizeVT()
	if cap(r.buf) < size {
		r.buf = make([]byte, size)
	}
	r.buf = r.buf[:size]
	_, err := r.msg.MarshalToSizedBufferVT(r.buf)
	if err == nil {
		// Publish copies the bytes into the connection's buffer, so r.buf is free again.
		err = r.nc.Publish(r.subject, r.buf)
	}
	if err != nil {
		r.msg.Sequence--
		return err
	}
	r.sent.arrivals, r.sent.dropped = arrivals, dropped
	r.lastBacklog = c.backlog()
	return nil
}

// measure folds the interval since the last report attempted into the Reporter's
// estimate, with the arrivals and drops totals read for this report, and fills r.traffic.
func (r *Reporter) measure(arrivals, dropped uint64) {
	integral, completions, at := r.busy.read(r.now)
	totals := demand.Totals{
		Arrivals:    arrivals,
		Completions: completions,
		Dropped:     dropped,
		// The integral wraps around in 64 bits; the difference of two is exact.
		Busy: r.account.Totals.Busy + float64(integral-r.integral)/float64(time.Second),
	}
	r.account.Report(totals, time.Duration(at-r.at), &r.traffic)
	r.integral, r.at = integral, at
}

// defaultProducerID returns the host name, made a valid producer id, with a random
// suffix.
func defaultProducerID() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "producer"
	}
	return gpuscalerv1.ProducerID(fmt.Sprintf("%.100s-%06x", host, rand.Uint32()&0xffffff))
}
