package scaler

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	gpuscalerv1 "github.com/gpuscaler/gpuscaler/proto/gpuscaler/v1"
)

// StreamConfig shapes the GPUSCALER stream the scaler creates or updates at start.
type StreamConfig struct {
	// MaxAge is how long a report is kept after its last update: a node or queue silent
	// that long is forgotten, by the stream and by the scaler. Default 15m.
	MaxAge time.Duration
	// Replicas of the stream in a clustered NATS. Default 1.
	Replicas int
	// Memory keeps the stream in memory instead of on disk: faster, lost when NATS restarts.
	Memory bool
}

// DefaultStreamMaxAge is StreamConfig.MaxAge's default.
const DefaultStreamMaxAge = 15 * time.Minute

func (c StreamConfig) withDefaults() StreamConfig {
	if c.MaxAge <= 0 {
		c.MaxAge = DefaultStreamMaxAge
	}
	if c.Replicas <= 0 {
		c.Replicas = 1
	}
	return c
}

// jetStreamConfig is the stream as DESIGN.md fixes it: every gpuscaler subject, only the
// latest message per subject, expiring after MaxAge.
func (c StreamConfig) jetStreamConfig() jetstream.StreamConfig {
	storage := jetstream.FileStorage
	if c.Memory {
		storage = jetstream.MemoryStorage
	}
	return jetstream.StreamConfig{
		Name:              gpuscalerv1.StreamName,
		Description:       "gpuscaler: the latest report of every GPU node and queue",
		Subjects:          []string{gpuscalerv1.SubjectAll},
		MaxMsgsPerSubject: 1,
		MaxAge:            c.MaxAge,
		Discard:           jetstream.DiscardOld,
		Storage:           storage,
		Replicas:          c.Replicas,
		// No publisher sets message ids; the window must not exceed MaxAge.
		Duplicates: min(c.MaxAge, 2*time.Minute),
	}
}

// follower keeps a State in step with the GPUSCALER stream: it reads the last message of
// every subject, then follows new ones as they are stored, through one ordered consumer
// (so there is neither a gap nor an overlap between the replay and the live part).
type follower struct {
	js      jetstream.JetStream
	stream  StreamConfig
	state   *State
	metrics *metrics
	log     *slog.Logger
	drops   *logLimiter

	// ready is called once, when the first replay has caught up with the stream.
	ready     func()
	replaying atomic.Bool
	// lastConsumerSeq is the consumer sequence of the last message handed to the shards.
	lastConsumerSeq atomic.Uint64
	replayStart     time.Time
	replayed        atomic.Uint64
	// shards decode and apply messages; see startShards. They and the consumer's handler
	// stop with runCtx, the context run was given.
	shards []chan shardItem
	runCtx context.Context
}

// shardItem is a stored message for a shard to decode and apply, or, when sync is set, a
// marker the shard closes once everything queued before it is applied.
type shardItem struct {
	subject string
	data    []byte
	stored  time.Time
	sync    chan struct{}
}

// run follows the stream until ctx ends, starting again (stream set-up included) after a
// failure such as the stream being deleted, with back-off from 1 s up to 30 s.
func (f *follower) run(ctx context.Context) error {
	f.replaying.Store(true)
	f.replayStart = time.Now()
	f.runCtx = ctx
	f.startShards(ctx, runtime.GOMAXPROCS(0))
	wait := time.Second
	for {
		err := f.follow(ctx)
		if ctx.Err() != nil {
			return nil
		}
		f.log.Warn("following the stream failed; starting again", "stream", gpuscalerv1.StreamName, "err", err, "retryIn", wait)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
		wait = min(2*wait, 30*time.Second)
	}
}

// follow sets up the stream and the consumer and handles messages until ctx ends or the
// consumer fails for good.
func (f *follower) follow(ctx context.Context) error {
	setupCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := f.js.CreateOrUpdateStream(setupCtx, f.stream.jetStreamConfig()); err != nil {
		return fmt.Errorf("create or update stream %s: %w", gpuscalerv1.StreamName, err)
	}
	cons, err := f.js.OrderedConsumer(setupCtx, gpuscalerv1.StreamName, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{gpuscalerv1.SubjectAll},
		DeliverPolicy:  jetstream.DeliverLastPerSubjectPolicy,
	})
	if err != nil {
		return fmt.Errorf("create consumer on stream %s: %w", gpuscalerv1.StreamName, err)
	}
	fatal := make(chan error, 1)
	cc, err := cons.Consume(f.handle,
		jetstream.PullMaxMessages(2000),
		jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) {
			if errors.Is(err, jetstream.ErrStreamNotFound) {
				select {
				case fatal <- err:
				default:
				}
				return
			}
			f.log.Debug("consumer", "err", err)
		}))
	if err != nil {
		return fmt.Errorf("consume stream %s: %w", gpuscalerv1.StreamName, err)
	}
	defer cc.Stop()

	if f.replaying.Load() {
		if err := f.awaitReplay(ctx, cons); err != nil {
			return err
		}
	}
	select {
	case <-ctx.Done():
		return nil
	case err := <-fatal:
		return err
	}
}

// awaitReplay covers what handle cannot see: an empty stream, or a replay whose last
// message expired before delivery. The consumer has caught up when the server has
// nothing more to deliver and all it delivered was handled.
func (f *follower) awaitReplay(ctx context.Context, cons jetstream.Consumer) error {
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for f.replaying.Load() {
		infoCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
		info, err := cons.Info(infoCtx)
		cancel()
		if err == nil && info.NumPending == 0 && info.Delivered.Consumer <= f.lastConsumerSeq.Load() {
			f.replayDone(ctx)
			return nil
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
	return nil
}

// handle hands one stored message to its shard. It runs on the consumer's one goroutine,
// in stream order.
func (f *follower) handle(msg jetstream.Msg) {
	meta, err := msg.Metadata()
	if err != nil {
		f.drop(msg.Subject(), "unknown", "metadata", err)
		return
	}
	select {
	case f.shards[shardOf(msg.Subject(), len(f.shards))] <- shardItem{subject: msg.Subject(), data: msg.Data(), stored: meta.Timestamp}:
	case <-f.runCtx.Done():
		return
	}
	f.lastConsumerSeq.Store(meta.Sequence.Consumer)
	if f.replaying.Load() {
		f.replayed.Add(1)
		if meta.NumPending == 0 {
			f.replayDone(f.runCtx)
		}
	}
}

// startShards starts n goroutines that decode and apply messages until ctx ends. Decoding
// is most of the work: on one goroutine it caps a scaler near 20,000 NodeReports/s on a
// 2-core machine. Every message of a subject goes to the same shard, so each node's and
// queue's reports are applied in the order NATS stored them.
func (f *follower) startShards(ctx context.Context, n int) {
	f.shards = make([]chan shardItem, max(n, 1))
	for i := range f.shards {
		ch := make(chan shardItem, 1024)
		f.shards[i] = ch
		go func() {
			for {
				select {
				case <-ctx.Done():
					return
				case it := <-ch:
					if it.sync != nil {
						close(it.sync)
						continue
					}
					f.apply(it)
				}
			}
		}()
	}
}

// shardOf maps a subject to one of n shards (FNV-1a).
func shardOf(subject string, n int) int {
	h := uint32(2166136261)
	for i := 0; i < len(subject); i++ {
		h = (h ^ uint32(subject[i])) * 16777619
	}
	return int(h % uint32(n))
}

// apply decodes one message and applies it, or counts and drops it.
func (f *follower) apply(it shardItem) {
	ev, err := gpuscalerv1.Decode(it.subject, it.data)
	kind := ev.Subject.Kind.String()
	f.metrics.eventsReceived.WithLabelValues(kind).Inc()
	switch {
	case err == nil:
		f.state.Apply(ev, it.stored)
	case errors.Is(err, gpuscalerv1.ErrInvalidSubject):
		f.drop(it.subject, kind, "subject", err)
	case errors.Is(err, gpuscalerv1.ErrUndecodable):
		f.drop(it.subject, kind, "decode", err)
	default:
		f.drop(it.subject, kind, "invalid", err)
	}
}

// syncShards returns once every message handed to a shard before the call is applied.
func (f *follower) syncShards(ctx context.Context) {
	for _, ch := range f.shards {
		done := make(chan struct{})
		select {
		case ch <- shardItem{sync: done}:
		case <-ctx.Done():
			return
		}
		select {
		case <-done:
		case <-ctx.Done():
			return
		}
	}
}

func (f *follower) replayDone(ctx context.Context) {
	if !f.replaying.Load() {
		return
	}
	f.syncShards(ctx) // ready means applied, not merely received
	if !f.replaying.CompareAndSwap(true, false) {
		return
	}
	took := time.Since(f.replayStart)
	f.metrics.replayDuration.Set(took.Seconds())
	f.metrics.replayMessages.Set(float64(f.replayed.Load()))
	nodes, gpus, queues := f.state.Size()
	f.log.Info("state restored from NATS", "messages", f.replayed.Load(), "took", took.Round(time.Millisecond),
		"nodes", nodes, "gpus", gpus, "queues", queues)
	f.ready()
}

// drop counts a malformed message and logs it at most once a minute per subject.
func (f *follower) drop(subject, kind, reason string, err error) {
	f.metrics.eventsDropped.WithLabelValues(kind, reason).Inc()
	if f.drops.allow(subject) {
		f.log.Warn("dropped malformed event (logged once a minute per subject)", "subject", subject, "reason", reason, "err", err)
	}
}

// logLimiter lets one log line through per key per period.
type logLimiter struct {
	period time.Duration
	mu     sync.Mutex // guards last
	last   map[string]time.Time
}

func newLogLimiter(period time.Duration) *logLimiter {
	return &logLimiter{period: period, last: make(map[string]time.Time)}
}

func (l *logLimiter) allow(key string) bool {
	now := time.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	if t, ok := l.last[key]; ok && now.Sub(t) < l.period {
		return false
	}
	if len(l.last) >= 10_000 { // a flood of distinct subjects must not grow this without bound
		for k, t := range l.last {
			if now.Sub(t) >= l.period {
				delete(l.last, k)
			}
		}
		if len(l.last) >= 10_000 {
			return false
		}
	}
	l.last[key] = now
	return true
}
