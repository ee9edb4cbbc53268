package scaler

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	gpuscalerv1 "github.com/gpuscaler/gpuscaler/proto/gpuscaler/v1"
)

// DefaultConsumerRefresh is how often a followed JetStream consumer's info is fetched.
const DefaultConsumerRefresh = time.Second

// ConsumerIdleAfter is how long a JetStream consumer no trigger has read or watched is
// still followed; then it is dropped and frees its place under the limit. KEDA reads
// each trigger every pollingInterval (30 s by default).
const ConsumerIdleAfter = 5 * time.Minute

// DefaultMaxFollowedConsumers bounds how many JetStream consumers stream+consumer triggers
// can make the scaler follow at once. Each costs a consumer info request per
// ConsumerRefresh against the NATS server's JetStream API, and a goroutine here: at this
// bound, 500 requests a second per replica, which took a third of one core for the
// scaler and an in-process NATS together on a 2-core machine. A cluster's ScaledObjects
// name tens of work queues, rarely hundreds; a flood of made-up names stops here.
const DefaultMaxFollowedConsumers = 500

// ErrConsumerLimit refuses a trigger naming a JetStream consumer the scaler does not
// follow yet while it follows as many as it may. The gRPC server answers it with
// ResourceExhausted.
var ErrConsumerLimit = errors.New("JetStream consumer limit reached")

// workQueues follows the JetStream consumers that stream+consumer triggers name, so that
// a work queue needs no producer code. A consumer's backlog is pending + ack pending, as
// KEDA's nats-jetstream scaler counts it, from consumer info fetched once per refresh
// however many triggers share the consumer. While the backlog is 0, a plain subscription
// to the consumer's subjects wakes its triggers on the first new message, without waiting
// for the next fetch; it is dropped once there is work, so a busy queue's traffic never
// reaches the scaler. It is safe for concurrent use.
//
// The triggers of a namespace with JetStream of its own (workQueueConfig.jetStreamNamespaces)
// name streams in that namespace's NATS account: their consumer info is fetched through
// the import of that account's JetStream API into the scaler's, under
// gpuscalerv1.TenantJetStreamAPI, and nothing else of that account reaches the scaler, so
// those queues wake on the next fetch, not on their first message.
type workQueues struct {
	js      jetstream.JetStream
	tenants map[string]jetstream.JetStream // by namespace; set at construction, read only
	nc      *nats.Conn
	cfg     workQueueConfig
	now     func() time.Time // the NATS clock, as the state's
	log     *slog.Logger
	ctx     context.Context // the refresh loops' lifetime
	metrics *metrics
	refusal *logLimiter // one refusal logged a minute

	mu     sync.Mutex // guards queues and the fields of every workQueue marked so
	queues map[wqKey]*workQueue
}

// workQueueConfig shapes workQueues; its zero value has the defaults.
type workQueueConfig struct {
	// refresh is how often a consumer's info is fetched. Default DefaultConsumerRefresh.
	refresh time.Duration
	// max bounds the consumers followed at once: 0 means DefaultMaxFollowedConsumers,
	// negative follows none.
	max int
	// idleAfter is how long a consumer no trigger has read or watched is still followed.
	// Default ConsumerIdleAfter.
	idleAfter time.Duration
	// local tells the time idleness is judged by; nil means time.Now.
	local func() time.Time
	// explain adds to a fetch error that ran out of time while NATS was down where NATS
	// is and why it cannot be reached (natsconn.Conn.Explain); nil adds nothing.
	explain func(error) error
	// jetStreamNamespaces keep their streams in NATS accounts of their own
	// (Config.JetStreamNamespaces).
	jetStreamNamespaces []string
}

func (c workQueueConfig) withDefaults() workQueueConfig {
	if c.refresh <= 0 {
		c.refresh = DefaultConsumerRefresh
	}
	switch {
	case c.max == 0:
		c.max = DefaultMaxFollowedConsumers
	case c.max < 0:
		c.max = 0
	}
	if c.idleAfter <= 0 {
		c.idleAfter = ConsumerIdleAfter
	}
	if c.local == nil {
		c.local = time.Now
	}
	return c
}

// wqKey names a followed consumer: its stream and name, and the namespace whose account
// holds it ("" for the scaler's own account).
type wqKey struct{ account, stream, consumer string }

// workQueue is one followed consumer.
type workQueue struct {
	key   wqKey
	first chan struct{} // closed once the first fetch has finished, whatever its outcome

	// Guarded by workQueues.mu:
	pending, ackPending uint64
	fetched             time.Time // NATS-clock time of the last successful fetch
	err                 error     // the last fetch's error; nil after a success
	gone                bool      // the last fetch found no such stream or consumer
	arrived             uint64    // messages seen on subs since the last fetch began
	subjects            []string  // the consumer's subjects, learnt at the first fetch
	subs                []*nats.Subscription
	watchers            map[*Watch]struct{}
	used                time.Time // last read or watch, by workQueueConfig.local
}

func newWorkQueues(ctx context.Context, js jetstream.JetStream, nc *nats.Conn, cfg workQueueConfig, now func() time.Time, log *slog.Logger, m *metrics) (*workQueues, error) {
	w := &workQueues{js: js, nc: nc, cfg: cfg.withDefaults(), now: now, log: log, ctx: ctx, metrics: m,
		refusal: newLogLimiter(time.Minute), queues: make(map[wqKey]*workQueue), tenants: map[string]jetstream.JetStream{}}
	for _, ns := range cfg.jetStreamNamespaces {
		api, err := gpuscalerv1.TenantJetStreamAPI(ns)
		if err != nil {
			return nil, fmt.Errorf("JetStream namespaces: %w", err)
		}
		if w.tenants[ns], err = jetstream.NewWithAPIPrefix(nc, api); err != nil {
			return nil, fmt.Errorf("JetStream of namespace %s: %w", ns, err)
		}
	}
	return w, nil
}

// keyOf returns the key of t's consumer: in its namespace's account where the namespace
// has one.
func (w *workQueues) keyOf(t *Trigger) wqKey {
	if _, ok := w.tenants[t.Namespace]; ok {
		return wqKey{t.Namespace, t.Stream, t.Consumer}
	}
	return wqKey{"", t.Stream, t.Consumer}
}

// jsOf returns the JetStream API that holds k's consumer.
func (w *workQueues) jsOf(k wqKey) jetstream.JetStream {
	if k.account != "" {
		return w.tenants[k.account]
	}
	return w.js
}

// track returns the followed consumer of t, following it from now on if it was not. A
// consumer not followed yet is refused with ErrConsumerLimit while as many are followed
// as the limit allows; those followed keep being answered, and a place frees when one
// falls idle.
func (w *workQueues) track(t *Trigger) (*workQueue, error) {
	k := w.keyOf(t)
	w.mu.Lock()
	defer w.mu.Unlock()
	q := w.queues[k]
	if q == nil {
		if len(w.queues) >= w.cfg.max {
			return nil, w.refuseLocked(t)
		}
		q = &workQueue{key: k, first: make(chan struct{}), watchers: make(map[*Watch]struct{})}
		w.queues[k] = q
		w.metrics.consumersFollowed.Set(float64(len(w.queues)))
		go w.loop(q)
	}
	q.used = w.cfg.local()
	return q, nil
}

// refuseLocked counts and logs a refused consumer and returns the error its trigger
// answers. w.mu must be held.
func (w *workQueues) refuseLocked(t *Trigger) error {
	w.metrics.consumersRefused.Inc()
	if w.refusal.allow("") {
		w.log.Warn("refused to follow another JetStream consumer: the scaler follows as many as --max-followed-consumers allows (one refusal logged a minute; gpuscaler_scaler_consumers_refused_total counts them all)",
			"namespace", t.Namespace, "stream", t.Stream, "consumer", t.Consumer, "followed", len(w.queues), "limit", w.cfg.max)
	}
	return fmt.Errorf("%w: not following JetStream stream %q, consumer %q: the scaler follows %d consumers, as many as --max-followed-consumers=%d allows; a consumer no trigger reads for %s frees its place",
		ErrConsumerLimit, t.Stream, t.Consumer, len(w.queues), w.cfg.max, w.cfg.idleAfter)
}

// loop fetches q's consumer info every refresh until ctx ends or q falls idle.
func (w *workQueues) loop(q *workQueue) {
	tick := time.NewTicker(w.cfg.refresh)
	defer tick.Stop()
	defer w.unsubscribe(q)
	for {
		w.fetch(q)
		select {
		case <-w.ctx.Done():
			return
		case <-tick.C:
		}
		if w.dropIfIdle(q) {
			return
		}
	}
}

// dropIfIdle stops following q when no trigger has read or watched it for idleAfter,
// freeing its place.
func (w *workQueues) dropIfIdle(q *workQueue) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(q.watchers) > 0 || w.cfg.local().Sub(q.used) < w.cfg.idleAfter {
		return false
	}
	delete(w.queues, q.key)
	w.metrics.consumersFollowed.Set(float64(len(w.queues)))
	return true
}

// fetch reads q's consumer info, updates its backlog and wakes its watchers. When the
// consumer is idle it subscribes to its subjects, and makes sure the server has the
// subscription before the first fetch counts as done, so a trigger read after it misses
// no message. A message stored between the info and the subscription waits for the next
// fetch.
func (w *workQueues) fetch(q *workQueue) {
	w.mu.Lock()
	arrivedBefore, subjects := q.arrived, q.subjects
	w.mu.Unlock()

	ctx, cancel := context.WithTimeout(w.ctx, 5*time.Second)
	defer cancel()
	cons, err := w.jsOf(q.key).Consumer(ctx, q.key.stream, q.key.consumer)
	var info *jetstream.ConsumerInfo
	if err == nil {
		info = cons.CachedInfo()
		// A namespace's own account sends the scaler nothing but consumer info: its
		// queues have no subjects to listen to, and wait for the next fetch.
		if subjects == nil && q.key.account == "" {
			subjects, err = w.subjectsOf(ctx, info)
		}
	}
	subscribed := w.record(q, info, subjects, arrivedBefore, err)
	if subscribed {
		if err := w.nc.FlushTimeout(2 * time.Second); err != nil {
			w.log.Debug("flush work-queue subscription", "stream", q.key.stream, "consumer", q.key.consumer, "err", err)
		}
	}
	select {
	case <-q.first:
	default:
		close(q.first)
	}
}

// record applies a fetch's outcome to q, and reports whether it subscribed to q's subjects.
func (w *workQueues) record(q *workQueue, info *jetstream.ConsumerInfo, subjects []string, arrivedBefore uint64, err error) (subscribed bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if err != nil {
		q.err = w.describe(q.key, err)
		q.gone = errors.Is(err, jetstream.ErrStreamNotFound) || errors.Is(err, jetstream.ErrConsumerNotFound)
		if q.gone {
			w.unsubscribeLocked(q)
		}
		return false
	}
	q.pending, q.ackPending = info.NumPending, uint64(info.NumAckPending)
	q.fetched, q.err, q.gone, q.subjects = w.now(), nil, false, subjects
	// Messages seen during the fetch may or may not be in its counts: keep them, since
	// counting one twice for a refresh is better than missing the one that wakes a queue.
	q.arrived -= arrivedBefore
	backlog := q.backlog()
	for wt := range q.watchers {
		wt.notify(float64(backlog))
	}
	if q.pending+q.ackPending > 0 {
		w.unsubscribeLocked(q)
		return false
	}
	return w.subscribeLocked(q)
}

// subjectsOf returns the subjects a consumer takes messages from: its filter, or its
// stream's subjects when it has none.
func (w *workQueues) subjectsOf(ctx context.Context, info *jetstream.ConsumerInfo) ([]string, error) {
	switch {
	case len(info.Config.FilterSubjects) > 0:
		return info.Config.FilterSubjects, nil
	case info.Config.FilterSubject != "":
		return []string{info.Config.FilterSubject}, nil
	}
	s, err := w.js.Stream(ctx, info.Stream)
	if err != nil {
		return nil, err
	}
	return s.CachedInfo().Config.Subjects, nil
}

// subscribeLocked listens for new messages on q's subjects, and reports whether it made
// a new subscription. w.mu must be held.
func (w *workQueues) subscribeLocked(q *workQueue) bool {
	if len(q.subs) > 0 {
		return false
	}
	for _, subject := range q.subjects {
		sub, err := w.nc.Subscribe(subject, func(*nats.Msg) { w.arrive(q) })
		if err != nil {
			w.log.Warn("cannot listen for new messages of a work queue; its triggers wake at the next consumer refresh",
				"stream", q.key.stream, "consumer", q.key.consumer, "subject", subject, "err", err)
			continue
		}
		q.subs = append(q.subs, sub)
	}
	return len(q.subs) > 0
}

func (w *workQueues) unsubscribe(q *workQueue) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.unsubscribeLocked(q)
}

func (w *workQueues) unsubscribeLocked(q *workQueue) {
	for _, sub := range q.subs {
		_ = sub.Unsubscribe()
	}
	q.subs = nil
}

// arrive counts a message published to an idle queue and wakes its triggers at once.
func (w *workQueues) arrive(q *workQueue) {
	w.mu.Lock()
	defer w.mu.Unlock()
	q.arrived++
	backlog := q.backlog()
	for wt := range q.watchers {
		wt.notify(float64(backlog))
	}
}

// backlog is the consumer's last counts plus what arrived since. w.mu must be held.
func (q *workQueue) backlog() uint64 { return q.pending + q.ackPending + q.arrived }

// describe turns a fetch error into the Unavailable error triggers report.
func (w *workQueues) describe(k wqKey, err error) error {
	where := ""
	if k.account != "" {
		where = fmt.Sprintf(" in namespace %s's NATS account", k.account)
	}
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound):
		return fmt.Errorf("%w: JetStream stream %q not found%s", ErrUnavailable, k.stream, where)
	case errors.Is(err, jetstream.ErrConsumerNotFound):
		return fmt.Errorf("%w: JetStream consumer %q not found on stream %q%s", ErrUnavailable, k.consumer, k.stream, where)
	default:
		if w.cfg.explain != nil {
			err = w.cfg.explain(err)
		}
		return fmt.Errorf("%w: consumer info for stream %q, consumer %q: %w", ErrUnavailable, k.stream, k.consumer, err)
	}
}

// read returns t's backlog: pending + ack pending (+ messages seen since the last fetch),
// with ack pending as the running part.
func (w *workQueues) read(t *Trigger) metricReading {
	q, err := w.track(t)
	if err != nil {
		return metricReading{defined: true, err: err}
	}
	select {
	case <-q.first:
	case <-time.After(5 * time.Second):
	}
	m := metricReading{defined: true}
	w.mu.Lock()
	defer w.mu.Unlock()
	now := w.now()
	switch {
	case q.fetched.IsZero():
		m.err = q.err
		if m.err == nil {
			m.err = fmt.Errorf("%w: no consumer info yet for stream %q, consumer %q", ErrUnavailable, t.Stream, t.Consumer)
		}
	case q.gone || (q.err != nil && now.Sub(q.fetched) > t.StaleAfter):
		m.err = fmt.Errorf("%w (last counts fetched at %s)", q.err, stamp(q.fetched))
	case now.Sub(q.fetched) > t.StaleAfter:
		m.err = fmt.Errorf("%w: consumer info for stream %q, consumer %q last fetched at %s, %s ago, longer than staleAfter %s",
			ErrUnavailable, t.Stream, t.Consumer, stamp(q.fetched), now.Sub(q.fetched).Round(time.Second), t.StaleAfter)
	default:
		m.value = float64(q.backlog())
		m.running = float64(q.ackPending)
		m.active = m.value > t.ActivationQueueDepth
	}
	return m
}

// watch registers wt for news of t's consumer until wt stops. It fails with
// ErrConsumerLimit as track does.
func (w *workQueues) watch(t *Trigger, wt *Watch) error {
	q, err := w.track(t)
	if err != nil {
		return err
	}
	w.mu.Lock()
	q.watchers[wt] = struct{}{}
	w.mu.Unlock()
	wt.onStop(func() {
		w.mu.Lock()
		defer w.mu.Unlock()
		delete(q.watchers, wt)
		q.used = w.cfg.local()
	})
	return nil
}
