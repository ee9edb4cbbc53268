package scaler

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	gpuscalerv1 "github.com/gpuscaler/gpuscaler/proto/gpuscaler/v1"
)

// StreamConfig shapes the two streams the scaler creates or updates at start: GPUSCALER,
// which keeps the nodes' reports, and GPUSCALER_QUEUES, which keeps the queues'. Each has
// limits of its own, so that the reports of queues, which any producer may invent, never
// evict a node's report or tombstone.
type StreamConfig struct {
	// MaxAge is how long a report is kept after its last update: a node or queue silent
	// that long is forgotten, by the stream and by the scaler, with the pods it held.
	// It must exceed every trigger's staleAfter. Default 15m.
	MaxAge time.Duration
	// MaxBytes bounds the node stream's size; past it the oldest reports (those of the
	// nodes silent longest) are dropped first. Only collectors publish there. Default
	// 1 GiB.
	MaxBytes int64
	// QueueMaxBytes bounds the queue stream's size; past it the reports of the queue
	// producers silent longest are dropped first. Each is at most
	// gpuscalerv1.MaxQueueReportBytes, so a producer inventing queues must store about
	// QueueMaxBytes/1.5 KiB reports to evict another's. Default 1 GiB.
	QueueMaxBytes int64
	// Replicas of the streams in a clustered NATS. Default 1.
	Replicas int
	// Memory keeps the streams in memory instead of on disk: faster, lost when NATS
	// restarts (the scaler then creates them again).
	Memory bool

	// tombstoneTTL is how much longer than MaxAge the stream keeps a report: the scaler
	// forgets a node after MaxAge, but its last report stays in the stream as its
	// tombstone for tombstoneTTL more, so every replica, restarted or not, derives the
	// same tombstones from the stream (State.Forget). Set by New from
	// Config.NodeTombstoneTTL.
	tombstoneTTL time.Duration
}

// Defaults of StreamConfig.
const (
	DefaultStreamMaxAge        = 15 * time.Minute
	DefaultStreamMaxBytes      = 1 << 30
	DefaultQueueStreamMaxBytes = 1 << 30
)

func (c StreamConfig) withDefaults() StreamConfig {
	if c.MaxAge <= 0 {
		c.MaxAge = DefaultStreamMaxAge
	}
	if c.MaxBytes <= 0 {
		c.MaxBytes = DefaultStreamMaxBytes
	}
	if c.QueueMaxBytes <= 0 {
		c.QueueMaxBytes = DefaultQueueStreamMaxBytes
	}
	if c.Replicas <= 0 {
		c.Replicas = 1
	}
	return c
}

// nodeStream is the node stream as DESIGN.md fixes it: every node's subject, only the
// latest message per subject, expiring after MaxAge and the tombstone TTL (a forgotten
// node's last report is its tombstone).
func (c StreamConfig) nodeStream() jetstream.StreamConfig {
	return c.stream(gpuscalerv1.StreamName, "gpuscaler: the latest report of every GPU node",
		gpuscalerv1.NodeSubjects, c.MaxAge+c.tombstoneTTL, c.MaxBytes, gpuscalerv1.MaxEventBytes)
}

// queueStream is the queue stream: every queue producer's subject, only the latest
// message per subject, expiring after MaxAge (a forgotten queue leaves nothing behind),
// no message larger than a queue report needs.
func (c StreamConfig) queueStream() jetstream.StreamConfig {
	return c.stream(gpuscalerv1.QueueStreamName, "gpuscaler: the latest report of every queue producer",
		gpuscalerv1.QueueSubjects, c.MaxAge, c.QueueMaxBytes, gpuscalerv1.MaxQueueReportBytes)
}

func (c StreamConfig) stream(name, description, subjects string, maxAge time.Duration, maxBytes int64, maxMsgSize int32) jetstream.StreamConfig {
	storage := jetstream.FileStorage
	if c.Memory {
		storage = jetstream.MemoryStorage
	}
	return jetstream.StreamConfig{
		Name:              name,
		Description:       description,
		Subjects:          []string{subjects},
		MaxMsgsPerSubject: 1,
		MaxAge:            maxAge,
		MaxBytes:          maxBytes,
		// Headers and payload together: nats-server refuses a message whose header and
		// data lengths add up to more (processJetStreamMsg, server/stream.go).
		MaxMsgSize: maxMsgSize,
		Discard:    jetstream.DiscardOld,
		Storage:    storage,
		Replicas:   c.Replicas,
		// No publisher sets message ids; the window must not exceed MaxAge.
		Duplicates: min(c.MaxAge, 2*time.Minute),
	}
}

// follower keeps a State in step with one stream: it reads the last message of every
// subject the stream captures, then follows new ones as they are stored, through one
// ordered consumer (so there is neither a gap nor an overlap between the replay and the
// live part). A watchdog checks the stream every few seconds: when it is gone or was
// created anew (NATS restarted with a memory stream, an operator deleted it) the follower
// sets the stream up again and replays. Setting the stream up reads the NATS server's
// clock, before the replay, and so does every check. The scaler runs one follower per
// stream, all applying to one State.
type follower struct {
	js jetstream.JetStream
	// stream is the stream this follower creates or updates and follows. Its consumer
	// reads stream.Subjects only: a stream made by an earlier release also holds
	// messages of other subjects, from before it was narrowed, which are not current.
	stream jetstream.StreamConfig
	// makeRoom, when set, is called when the stream cannot be created because its
	// subjects overlap another stream's: it narrows that stream (the queue follower's
	// narrows the node stream, which earlier releases made capture every subject).
	makeRoom func(context.Context) error
	// shardCount is how many shards decode and apply this stream's messages; 1 at least.
	shardCount int
	state      *State
	clock      *natsClock
	metrics    *metrics
	log        *slog.Logger
	drops      *logLimiter
	// explain adds to an error that ran out of time while NATS was down where NATS is
	// and why it cannot be reached (natsconn.Conn.Explain); nil adds nothing.
	explain func(error) error
	// checkEvery is the watchdog's period.
	checkEvery time.Duration

	// ready is called once, when the first replay has been applied, with the number of
	// messages it read and how long it took from run's start.
	ready     func(replayed uint64, took time.Duration)
	replaying atomic.Bool
	// lastStreamSeq is the stream sequence of the last message handed to the shards;
	// stream sequences, unlike consumer ones, survive a reset of the ordered consumer.
	lastStreamSeq atomic.Uint64
	// consumers counts the consumers follow has made; a message is handled only while
	// the consumer that delivered it is the newest (see follow, on a stalled one).
	consumers   atomic.Uint64
	replayStart time.Time
	replayed    atomic.Uint64

	// shards decode and apply messages; see startShards. They and the consumer's handler
	// stop with runCtx, the context run was given.
	shards []chan shardItem
	runCtx context.Context

	// resumeIn is when the stream was created whose follow ended on a stalled consumer:
	// the next follow, if it finds the same stream, resumes after the last message read
	// rather than at the latest message of each subject. Zero when the last follow did
	// not stall. Only run's goroutine touches it.
	resumeIn time.Time

	mu sync.Mutex // guards the fields below
	// failure is why the follower is not following now, nil while it is; failingSince
	// is when it stopped.
	failure      error
	failingSince time.Time
}

// shardItem is a stored message for a shard to decode and apply, or, when sync is set, a
// marker the shard closes once everything queued before it is applied.
type shardItem struct {
	subject string
	data    []byte
	stored  time.Time
	sync    chan struct{}
}

// errStreamChanged ends one follow when the stream it follows is gone or was replaced.
var errStreamChanged = errors.New("stream changed")

// errConsumerStalled ends one follow when the stream has held messages newer than the
// last one read for consumerStallAfter, none being read (stallWatch).
var errConsumerStalled = errors.New("consumer stalled")

// stallWatch tells a stalled consumer from an idle one, from what the follower reads:
// the sequence of the last message read and, when that does not move, the stream's
// state.
//
// nats.go's ordered consumer recreates itself when its connection comes back or its
// heartbeats stop (2 × 5 s), but each try waits up to 10 s for an answer and then backs
// off 1, 2, 4 … s, holding the consumer all the while. When a NATS server is killed,
// the consumer it hosted goes with it, and a try begun while the stream has no leader
// (4 to 9 s of election) can leave the scaler reading nothing for 20 s and more while
// the stream takes every report again: seen as a failed wake in the e2e NATS failover
// test. So the follower checks every second that nothing was read: then it asks the
// stream, and once the stream has held messages newer than the last one read for
// consumerStallAfter, it makes a new consumer itself.
type stallWatch struct {
	read    uint64    // the last message read, as last seen
	pending time.Time // since when the stream has held newer messages, nothing read; zero when not
}

// consumerStallAfter is how long the stream must hold messages newer than the last one
// read, none being read, before the consumer counts as stalled. A consumer that works
// takes a message within milliseconds of its being stored.
const consumerStallAfter = 2 * time.Second

// progressed reports whether a message was read since the last call, and starts over
// when one was.
func (w *stallWatch) progressed(read uint64) bool {
	if read == w.read {
		return false
	}
	w.read, w.pending = read, time.Time{}
	return true
}

// stalled reports whether the consumer is stalled at now, given the stream's message
// count and last sequence.
func (w *stallWatch) stalled(now time.Time, msgs, last uint64) bool {
	// A stream with messages always holds its last one: reports are never deleted one
	// by one, and MaxAge removes the oldest first. With no message, LastSeq stays where
	// the last one was, and there is nothing to read.
	if msgs == 0 || last <= w.read {
		w.pending = time.Time{}
		return false
	}
	if w.pending.IsZero() {
		w.pending = now
	}
	return now.Sub(w.pending) >= consumerStallAfter
}

// run follows the stream until ctx ends. After a failure it sets everything up again,
// waiting from 1 s up to 30 s between attempts (a follow that ran a minute resets the
// wait), and at once after a stalled consumer, since the stream answers.
func (f *follower) run(ctx context.Context) error {
	f.replaying.Store(true)
	f.replayStart = time.Now()
	f.runCtx = ctx
	f.setFailure(errors.New("connecting to the stream"))
	f.startShards(ctx, f.shardCount)
	wait := time.Second
	for {
		started := time.Now()
		err := f.follow(ctx)
		if ctx.Err() != nil {
			return nil
		}
		f.setFailure(err)
		if time.Since(started) > time.Minute {
			wait = time.Second
		}
		if errors.Is(err, errConsumerStalled) {
			f.metrics.consumerStalls.Inc()
			wait = 0 // the stream answers: no reason to wait
		}
		f.log.Warn("not following the stream; setting it up again", "err", err, "retryIn", wait)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
		wait = min(max(2*wait, time.Second), 30*time.Second)
	}
}

// follow sets up the stream and the consumer and handles messages until ctx ends or the
// watchdog finds the stream gone or replaced.
func (f *follower) follow(ctx context.Context) (err error) {
	if f.explain != nil {
		// "create or update stream GPUSCALER: context deadline exceeded" alone would not
		// say that nothing answers at the URL.
		defer func() { err = f.explain(err) }()
	}
	created, err := f.ensureStream(ctx)
	if err != nil {
		return err
	}
	setupCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	cfg := jetstream.OrderedConsumerConfig{
		FilterSubjects: f.stream.Subjects,
		DeliverPolicy:  jetstream.DeliverLastPerSubjectPolicy,
	}
	if read := f.lastStreamSeq.Load(); f.resumeIn.Equal(created) && read > 0 {
		// After a stall, in the same stream: what came after the last message read, as
		// nats.go's own reset resumes, so no report is applied twice.
		cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, read+1
	}
	f.resumeIn = time.Time{}
	cons, err := f.js.OrderedConsumer(setupCtx, f.stream.Name, cfg)
	if err != nil {
		return fmt.Errorf("create consumer on stream %s: %w", f.stream.Name, err)
	}
	// A stalled consumer is left to stop in the background (below), and nats.go may yet
	// deliver from it while the next one runs: only the newest consumer's messages are
	// handled, so none is applied twice or out of order.
	gen := f.consumers.Add(1)
	cc, err := cons.Consume(func(msg jetstream.Msg) {
		if f.consumers.Load() == gen {
			f.handle(msg)
		}
	},
		// Bound what the client buffers: 2000 reports or 32 MiB, whichever comes first.
		jetstream.PullMaxMessagesWithBytesLimit(2000, 32<<20),
		jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) {
			f.log.Debug("consumer", "err", err) // the ordered consumer recovers; the watchdog judges
		}))
	if err != nil {
		return fmt.Errorf("consume stream %s: %w", f.stream.Name, err)
	}
	defer func() {
		if !errors.Is(err, errConsumerStalled) {
			cc.Stop()
			return
		}
		// Stop takes the ordered consumer's lock, which nats.go holds through every try
		// of a reset (up to 10 s each): waiting on it delayed the new consumer by 3.7 s
		// in the e2e NATS failover test. The new one starts now; this one stops when
		// nats.go lets go, its messages ignored meanwhile.
		f.consumers.Add(1)
		go cc.Stop()
	}()
	f.setFailure(nil)

	watchdog := time.NewTicker(f.checkEvery)
	defer watchdog.Stop()
	stallCheck := time.NewTicker(min(f.checkEvery, time.Second))
	defer stallCheck.Stop()
	stall := stallWatch{read: f.lastStreamSeq.Load()}
	replay := time.NewTicker(50 * time.Millisecond)
	defer replay.Stop()
	var replayCheck atomic.Bool // a checkReplay is running
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-replay.C:
			if !f.replaying.Load() {
				replay.Stop()
				continue
			}
			// Not on this goroutine: the ordered consumer's Info waits on its lock, which
			// nats.go holds through every retry of a reset (10 s a try), and this loop
			// must keep watching for a stall meanwhile.
			if replayCheck.CompareAndSwap(false, true) {
				go func() {
					defer replayCheck.Store(false)
					f.checkReplay(ctx, cons)
				}()
			}
		case <-watchdog.C:
			if _, err := f.checkStream(ctx, created); errors.Is(err, errStreamChanged) {
				return err
			}
		case <-stallCheck.C:
			if stall.progressed(f.lastStreamSeq.Load()) {
				continue
			}
			stream, err := f.checkStream(ctx, created)
			if errors.Is(err, errStreamChanged) {
				return err
			}
			var state jetstream.StreamState
			if err == nil {
				state = stream.CachedInfo().State
				if state.LastSeq > stall.read {
					state.LastSeq, err = f.lastFollowed(ctx, stream)
				}
			}
			if err != nil || state.LastSeq > stall.read {
				f.log.Debug("nothing read for a second: asked the stream",
					"read", stall.read, "lastSeq", state.LastSeq, "msgs", state.Msgs, "err", err)
			}
			if err == nil && stall.stalled(time.Now(), state.Msgs, state.LastSeq) {
				f.resumeIn = created
				return fmt.Errorf("%w: stream %s has held messages up to %d for %s, none read since %d",
					errConsumerStalled, f.stream.Name, state.LastSeq, consumerStallAfter, stall.read)
			}
		}
	}
}

// ensureStream creates or updates the stream and returns when it was created. Where its
// subjects overlap another stream's (the node stream of an earlier release, which
// captured every gpuscaler subject), makeRoom narrows that one first. A stream that
// exists with a storage or a number of replicas an update may not change is updated with
// its own, with a warning: replicas started with other flags must not fight over it. One
// that cannot be updated even so is used as it is, with a warning, provided it captures
// the follower's subjects.
func (f *follower) ensureStream(ctx context.Context) (time.Time, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	want := f.stream
	sent := f.clock.local()
	s, err := f.js.CreateOrUpdateStream(ctx, want)
	if isSubjectOverlap(err) && f.makeRoom != nil {
		if roomErr := f.makeRoom(ctx); roomErr != nil {
			return time.Time{}, fmt.Errorf("create stream %s: its subjects %v overlap another stream's, which could not be narrowed: %w",
				want.Name, want.Subjects, roomErr)
		}
		sent = f.clock.local()
		s, err = f.js.CreateOrUpdateStream(ctx, want)
	}
	if err == nil {
		info := s.CachedInfo()
		f.observeClock(info.TimeStamp, sent)
		return info.Created, nil
	}
	sent = f.clock.local()
	existing, getErr := f.js.Stream(ctx, want.Name)
	if getErr != nil {
		if isSubjectOverlap(err) {
			return time.Time{}, fmt.Errorf("create or update stream %s: another stream captures some of its subjects %v: %w", want.Name, want.Subjects, err)
		}
		return time.Time{}, fmt.Errorf("create or update stream %s: %w", want.Name, err)
	}
	info := existing.CachedInfo()
	f.observeClock(info.TimeStamp, sent)
	if kept := info.Config; kept.Storage != want.Storage || kept.Replicas != want.Replicas {
		want.Storage, want.Replicas = kept.Storage, kept.Replicas
		sent = f.clock.local()
		if s, updateErr := f.js.UpdateStream(ctx, want); updateErr == nil {
			info := s.CachedInfo()
			f.observeClock(info.TimeStamp, sent)
			f.log.Warn("updated the existing stream keeping its storage and replicas: this scaler's differ and cannot be applied",
				"err", err, "storage", kept.Storage.String(), "replicas", kept.Replicas)
			return info.Created, nil
		}
	}
	if !captures(info.Config.Subjects, f.stream.Subjects[0]) {
		return time.Time{}, fmt.Errorf("stream %s exists with subjects %v, which do not capture %s, and cannot be updated: %w",
			want.Name, info.Config.Subjects, f.stream.Subjects[0], err)
	}
	f.log.Warn("using the existing stream as it is: its settings differ from this scaler's and cannot be updated",
		"err", err, "subjects", info.Config.Subjects, "storage", info.Config.Storage.String(), "replicas", info.Config.Replicas,
		"maxAge", info.Config.MaxAge, "maxMsgsPerSubject", info.Config.MaxMsgsPerSubject)
	return info.Created, nil
}

// jsErrSubjectOverlap is nats-server's JSStreamSubjectOverlapErr, "subjects overlap with
// an existing stream" (server/errors.json), which nats.go has no error value for.
const jsErrSubjectOverlap jetstream.ErrorCode = 10065

func isSubjectOverlap(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && apiErr.ErrorCode == jsErrSubjectOverlap
}

// captures reports whether a stream of the given subjects stores every message of
// subject, a gpuscaler wildcard (gpuscaler.v1.node.>): it names it, or a wildcard above
// it.
func captures(subjects []string, subject string) bool {
	return slices.Contains(subjects, subject) || slices.Contains(subjects, gpuscalerv1.SubjectAll) || slices.Contains(subjects, ">")
}

// observeClock reads the server's clock from the stream info of a request sent at sent,
// and answered now. ensureStream calls it with the answer to its create or update
// request, which comes before the replay and so before the scaler is ready: staleness is
// judged on the server's clock from the first answer on, not only after the watchdog's
// first check. nats-server stamps the stream info of those answers as it does that of a
// stream info request (TimeStamp: time.Now().UTC() in jsStreamCreateRequest and
// jsStreamUpdateRequest, server/jetstream_api.go, and in their clustered counterparts in
// server/jetstream_cluster.go). A server older than 2.10 sends no stamp (nats-server
// pull request 4133 added it), in reply to any request: the scaler then has no way to
// read the server's clock and judges on its own, as it says once.
func (f *follower) observeClock(server, sent time.Time) {
	received := f.clock.local()
	if f.clock.observe(server, sent, received) {
		return
	}
	if f.clock.unstamped.CompareAndSwap(false, true) {
		f.log.Warn("the NATS server does not send its time (nats-server before 2.10): reports' ages are judged on this machine's clock, which must then agree with the server's")
	}
}

// streamCheckTimeout bounds each request checkStream makes. The watchdog and the stall
// check both ask on the follow loop: a request sent while the stream has no leader goes
// unanswered, and a longer wait (5 s once) kept the stall check from running during a
// NATS failover, a wake 4 s late in the e2e test. A check that gets no answer changes
// nothing; the next second's may find a leader.
const streamCheckTimeout = time.Second

// checkStream is the watchdog: it fails with errStreamChanged when the stream is gone or
// is not the one being followed, and reads the server's clock on the way. It returns
// the stream, its info as fetched, waiting at most streamCheckTimeout for it.
func (f *follower) checkStream(ctx context.Context, created time.Time) (jetstream.Stream, error) {
	ctx, cancel := context.WithTimeout(ctx, streamCheckTimeout)
	defer cancel()
	sent := f.clock.local()
	s, err := f.js.Stream(ctx, f.stream.Name)
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound):
		return nil, fmt.Errorf("%w: stream %s is gone", errStreamChanged, f.stream.Name)
	case err != nil:
		return nil, err // NATS unreachable: the connection reconnects, and readiness watches it
	}
	info := s.CachedInfo()
	f.observeClock(info.TimeStamp, sent)
	if !info.Created.Equal(created) {
		return nil, fmt.Errorf("%w: stream %s was created anew at %s", errStreamChanged, f.stream.Name, stamp(info.Created))
	}
	return s, nil
}

// lastFollowed returns the sequence of stream's last message on the subjects the
// follower reads, 0 when it holds none, waiting at most streamCheckTimeout. The stream's
// own last sequence may be that of a message the consumer never delivers: one a stream
// of an earlier release stored on a subject it no longer captures.
func (f *follower) lastFollowed(ctx context.Context, stream jetstream.Stream) (uint64, error) {
	ctx, cancel := context.WithTimeout(ctx, streamCheckTimeout)
	defer cancel()
	msg, err := stream.GetLastMsgForSubject(ctx, f.stream.Subjects[0])
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
		return 0, nil
	case err != nil:
		return 0, err
	}
	return msg.Sequence, nil
}

// checkReplay covers what handle cannot see: an empty stream, or a replay whose last
// message expired before delivery. The consumer has caught up when the server has
// nothing more to deliver and all it delivered was handed to the shards.
func (f *follower) checkReplay(ctx context.Context, cons jetstream.Consumer) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	info, err := cons.Info(ctx)
	if err == nil && info.NumPending == 0 && info.Delivered.Stream <= f.lastStreamSeq.Load() {
		f.replayDone(ctx)
	}
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
	case f.shards[f.shardFor(msg.Subject())] <- shardItem{subject: msg.Subject(), data: msg.Data(), stored: meta.Timestamp}:
	case <-f.runCtx.Done():
		return
	}
	f.lastStreamSeq.Store(meta.Sequence.Stream)
	if f.replaying.Load() {
		f.replayed.Add(1)
		if meta.NumPending == 0 {
			f.replayDone(f.runCtx)
		}
	}
}

// shardFor returns the shard that applies subject's reports. Every message of a subject
// goes to the same shard, so each node's and queue's reports are applied in the order
// NATS stored them.
func (f *follower) shardFor(subject string) int {
	return shardOf(subject, len(f.shards))
}

// startShards starts n goroutines (one at least) which decode and apply messages until
// ctx ends. Each decodes node reports into memory it reuses (gpuscalerv1.NodeDecoder):
// decoding into fresh messages was two thirds of a report's cost, most of it allocation.
// Each shard buffers at most 256 messages of at most MaxEventBytes.
//
// The scaler gives the node stream's follower as many shards as it has CPUs, and the
// queue stream's one: a QueueReport is what wakes a workload at zero and takes a
// microsecond to apply, so it must not wait behind node reports, which take tens (with
// 10,000 nodes reporting, a queue report sharing their shards waited milliseconds).
func (f *follower) startShards(ctx context.Context, n int) {
	f.shards = make([]chan shardItem, max(n, 1))
	for i := range f.shards {
		ch := make(chan shardItem, 256)
		f.shards[i] = ch
		go func() {
			var dec gpuscalerv1.NodeDecoder
			for {
				select {
				case <-ctx.Done():
					return
				case it := <-ch:
					if it.sync != nil {
						close(it.sync)
						continue
					}
					f.apply(&dec, it)
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

// apply decodes one message with the shard's decoder and applies it, or counts and drops
// it. The state keeps nothing of the decoded report, which dec reuses for the next.
func (f *follower) apply(dec *gpuscalerv1.NodeDecoder, it shardItem) {
	ev, err := dec.Decode(it.subject, it.data)
	kind := ev.Subject.Kind.String()
	f.metrics.eventsReceived.WithLabelValues(kind).Inc()
	switch {
	case err == nil:
		if err := f.state.Apply(ev, it.stored); err != nil {
			f.refuse(ev.Subject.Namespace, kind, err)
		}
	case errors.Is(err, gpuscalerv1.ErrInvalidSubject):
		f.drop(it.subject, kind, "subject", err)
	case errors.Is(err, gpuscalerv1.ErrUndecodable):
		f.drop(it.subject, kind, "decode", err)
	case errors.Is(err, gpuscalerv1.ErrSubjectMismatch):
		f.drop(it.subject, kind, "mismatch", err)
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
	if ctx.Err() != nil || !f.replaying.CompareAndSwap(true, false) {
		return
	}
	took := time.Since(f.replayStart)
	f.log.Debug("stream replayed", "messages", f.replayed.Load(), "took", took.Round(time.Millisecond))
	f.ready(f.replayed.Load(), took)
}

func (f *follower) setFailure(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	switch {
	case err == nil:
		f.failure, f.failingSince = nil, time.Time{}
	case f.failure == nil:
		f.failure, f.failingSince = err, time.Now()
	default:
		f.failure = err
	}
}

// failing returns why the follower is not following, and since when; nil while it is.
func (f *follower) failing() (error, time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.failure, f.failingSince
}

// drop counts a malformed message and logs it at most once a minute per subject.
func (f *follower) drop(subject, kind, reason string, err error) {
	f.metrics.eventsDropped.WithLabelValues(kind, reason).Inc()
	if f.drops.allow(subject) {
		f.log.Warn("dropped malformed event (logged once a minute per subject)", "subject", subject, "reason", reason, "err", err)
	}
}

// refuse counts a report the state refused (a new queue past its namespace's limit, or a
// new producer past its queue's) and logs it at most once a minute per namespace. The
// metric has no namespace label: on an open bus a publisher picks namespaces at will,
// and each would be a time series.
func (f *follower) refuse(namespace, kind string, err error) {
	reason, what := "queue_limit", "dropped a report of a new queue: its namespace has as many queues as --max-queues-per-namespace allows (logged once a minute per namespace)"
	if errors.Is(err, ErrProducerLimit) {
		reason, what = "producer_limit", "dropped a report of a new producer: its queue has as many producers as --max-producers-per-queue allows (logged once a minute per namespace)"
	}
	f.metrics.eventsDropped.WithLabelValues(kind, reason).Inc()
	if f.drops.allow(reason + " " + namespace) { // no subject has a space: keys of their own
		f.log.Warn(what, "namespace", namespace, "err", err)
	}
}

// claimDropped counts a pod a node's report named that the Kubernetes API does not
// place on that node, and logs it at most once a minute per node. The metric has no node
// or namespace label: a compromised node picks the names at will.
func (f *follower) claimDropped(d DroppedClaim) {
	f.metrics.claimsDropped.WithLabelValues(d.Reason).Inc()
	if f.drops.allow("claim " + d.Node) { // no subject has a space: keys of their own
		f.log.Warn("dropped a pod from a node's report: the Kubernetes API does not place it on that node (logged once a minute per node)",
			"node", d.Node, "namespace", d.Namespace, "pod", d.Pod, "reason", d.Reason, "apiNode", d.APINode)
	}
}

// producerLeft counts a producer that no longer counts in its queue's reading, and logs
// it: at once for one that stopped cleanly, at most once a minute per queue for one that
// fell silent. The metric has no namespace or queue label: each would be a time series.
func (f *follower) producerLeft(l ProducerLeft) {
	if l.Stopped {
		f.metrics.producersLeft.WithLabelValues("stopped").Inc()
		f.log.Info("a queue producer stopped; its share leaves the queue's reading",
			"namespace", l.Namespace, "queue", l.Queue, "producer", l.Producer, "backlog", l.Backlog)
		return
	}
	f.metrics.producersLeft.WithLabelValues("silent").Inc()
	if f.drops.allow("silent " + l.Namespace + "/" + l.Queue) {
		f.log.Warn("a queue producer fell silent for longer than --stale-after; its share, as last reported, leaves the queue's reading (logged once a minute per queue)",
			"namespace", l.Namespace, "queue", l.Queue, "producer", l.Producer, "lastReport", stamp(l.Stored), "backlog", l.Backlog)
	}
}

// natsClock estimates how far the NATS server's clock is from this process's. Reports
// are judged by the time NATS stored them, so "now" must be NATS's now: a scaler whose
// clock ran 40 s ahead would otherwise find every report stale, and one running behind
// would find a dead producer's last report fresh.
type natsClock struct {
	local func() time.Time
	skew  atomic.Int64 // server minus local, nanoseconds
	// unstamped is set once the server was found to send no time, so that is said once.
	unstamped atomic.Bool
}

// observe records a server time read by a request sent and answered at the given local
// times, taking the server to have read its clock halfway through, and reports whether
// there was a time to record.
func (c *natsClock) observe(server, sent, received time.Time) bool {
	if server.IsZero() {
		return false
	}
	c.skew.Store(int64(server.Sub(sent.Add(received.Sub(sent) / 2))))
	return true
}

// Now is the NATS server's time, as best known.
func (c *natsClock) Now() time.Time { return c.local().Add(time.Duration(c.skew.Load())) }

// Skew is the server's clock minus this process's.
func (c *natsClock) Skew() time.Duration { return time.Duration(c.skew.Load()) }

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
