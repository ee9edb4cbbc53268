package scaler

import (
	"sync"
	"time"
)

// callRecorder remembers, for each trigger KEDA asked about recently, the last call of
// each kind and its answer: what the status page shows. It is bounded, since every
// ScaledObject in the cluster may call: at most max triggers, the least recently called
// evicted first, and a trigger not called for idleAfter is dropped unless a stream of it
// is still open. It is cheap on the answering path: once a trigger has its row,
// recording a call takes a clock reading, a lock and a map lookup, and allocates nothing.
// A nil *callRecorder records nothing.
type callRecorder struct {
	now       func() time.Time
	max       int
	idleAfter time.Duration

	mu     sync.Mutex // guards rows, the list through them, every row's fields and lastID
	rows   map[callKey]*triggerCalls
	lastID uint64
	newest *triggerCalls // the rows from the most to the least recently called
	oldest *triggerCalls
}

// Bounds of the call recorder the scaler runs with. A row is a few hundred bytes besides
// the parsed trigger it points to, which the trigger cache holds anyway.
const (
	defaultCallRows      = 1000
	defaultCallIdleAfter = 10 * time.Minute
)

func newCallRecorder(now func() time.Time, max int, idleAfter time.Duration) *callRecorder {
	return &callRecorder{now: now, max: max, idleAfter: idleAfter, rows: make(map[callKey]*triggerCalls)}
}

// callKey names a trigger: the ScaledObject or ScaledJob that holds it, and its parsed
// metadata (with its namespace) as the trigger cache keeps it. A ScaledObject with two
// gpuscaler triggers has two rows. The zero key is no trigger: a call without a
// ScaledObjectRef, or a server without a trigger cache, records nothing.
type callKey struct {
	entry *cachedTrigger
	name  string
}

// call is one call and its answer; a zero at means none was made.
type call struct {
	at     time.Time
	active bool    // what IsActive or a stream answered
	value  float64 // what GetMetrics answered
	err    error   // the gRPC status the call failed with
}

// maxMetricCalls is how many GetMetrics names a row keeps, in the order first called: a
// trigger's three metrics and one more, which the last of any further names takes.
const maxMetricCalls = 4

// metricCall is the last GetMetrics call of one metric name.
type metricCall struct {
	name string
	call
}

// triggerCalls is one trigger's row: the last call of each kind.
type triggerCalls struct {
	id           uint64 // for the status page's links; never reused by this process
	key          callKey
	newer, older *triggerCalls
	last         time.Time // the last call of any kind

	isActive call
	spec     call
	metrics  [maxMetricCalls]metricCall
	// StreamIsActive: the streams open now, when the last one opened, its last message
	// (at, active) and how the last one ended (at, err: nil when cleanly).
	streamsOpen int
	opened      time.Time
	sent        call
	ended       call
	// held is when a stream last held an activation back (pushInterval), and how many
	// it has held since this row was made.
	held      time.Time
	heldCount int
}

// row returns k's row, made and put first, or nil for the zero key. It sweeps idle rows
// and evicts the oldest before making one. r.mu must be held.
func (r *callRecorder) row(k callKey, now time.Time) *triggerCalls {
	if k.entry == nil {
		return nil
	}
	t := r.rows[k]
	if t == nil {
		r.sweep(now)
		if len(r.rows) >= r.max && r.oldest != nil {
			r.remove(r.oldest)
		}
		r.lastID++
		t = &triggerCalls{id: r.lastID, key: k}
		r.rows[k] = t
	} else {
		r.unlink(t)
	}
	t.last = now
	t.older = r.newest
	if r.newest != nil {
		r.newest.newer = t
	}
	r.newest = t
	if r.oldest == nil {
		r.oldest = t
	}
	return t
}

// sweep drops the rows not called for idleAfter and with no stream open. Rows are in
// order of their last call, so it stops at the first one called since. r.mu must be held.
func (r *callRecorder) sweep(now time.Time) {
	cutoff := now.Add(-r.idleAfter)
	for t := r.oldest; t != nil && t.last.Before(cutoff); {
		newer := t.newer
		if t.streamsOpen == 0 {
			r.remove(t)
		}
		t = newer
	}
}

func (r *callRecorder) remove(t *triggerCalls) {
	r.unlink(t)
	delete(r.rows, t.key)
}

func (r *callRecorder) unlink(t *triggerCalls) {
	if t.newer != nil {
		t.newer.older = t.older
	} else {
		r.newest = t.older
	}
	if t.older != nil {
		t.older.newer = t.newer
	} else {
		r.oldest = t.newer
	}
	t.newer, t.older = nil, nil
}

func (r *callRecorder) isActive(k callKey, active bool, err error) {
	if r == nil || k.entry == nil {
		return
	}
	now := r.now()
	r.mu.Lock()
	r.row(k, now).isActive = call{at: now, active: active, err: err}
	r.mu.Unlock()
}

func (r *callRecorder) metricSpec(k callKey, err error) {
	if r == nil || k.entry == nil {
		return
	}
	now := r.now()
	r.mu.Lock()
	r.row(k, now).spec = call{at: now, err: err}
	r.mu.Unlock()
}

func (r *callRecorder) metric(k callKey, name string, value float64, err error) {
	if r == nil || k.entry == nil {
		return
	}
	now := r.now()
	r.mu.Lock()
	t := r.row(k, now)
	i := 0
	for i < maxMetricCalls-1 && t.metrics[i].name != name && t.metrics[i].name != "" {
		i++
	}
	t.metrics[i] = metricCall{name: name, call: call{at: now, value: value, err: err}}
	r.mu.Unlock()
}

// streamOpened records a StreamIsActive stream that opened and sent its first message.
func (r *callRecorder) streamOpened(k callKey, active bool) {
	if r == nil || k.entry == nil {
		return
	}
	now := r.now()
	r.mu.Lock()
	t := r.row(k, now)
	t.streamsOpen++
	t.opened = now
	t.sent = call{at: now, active: active}
	r.mu.Unlock()
}

// streamSent records an activation a stream pushed after its first message.
func (r *callRecorder) streamSent(k callKey) {
	if r == nil || k.entry == nil {
		return
	}
	now := r.now()
	r.mu.Lock()
	r.row(k, now).sent = call{at: now, active: true}
	r.mu.Unlock()
}

// streamHeld records an activation a stream did not push: it had pushed one less than
// the trigger's pushInterval ago.
func (r *callRecorder) streamHeld(k callKey) {
	if r == nil || k.entry == nil {
		return
	}
	now := r.now()
	r.mu.Lock()
	t := r.row(k, now)
	t.held = now
	t.heldCount++
	r.mu.Unlock()
}

// streamEnded records how a stream ended: err nil when cleanly. wasOpen says it had
// opened (streamOpened); a stream refused before it opened only records its error.
func (r *callRecorder) streamEnded(k callKey, wasOpen bool, err error) {
	if r == nil || k.entry == nil {
		return
	}
	now := r.now()
	r.mu.Lock()
	t := r.row(k, now)
	// A row evicted and made anew while its stream was open starts at zero open.
	if wasOpen && t.streamsOpen > 0 {
		t.streamsOpen--
	}
	t.ended = call{at: now, err: err}
	r.mu.Unlock()
}

// snapshot copies the rows not idle, most recently called first, with the time it was
// taken. The copies share the recorder's parsed triggers and errors, which never change.
func (r *callRecorder) snapshot() ([]triggerCalls, time.Time) {
	if r == nil {
		return nil, time.Time{}
	}
	now := r.now()
	r.mu.Lock()
	defer r.mu.Unlock()
	r.sweep(now)
	rows := make([]triggerCalls, 0, len(r.rows))
	for t := r.newest; t != nil; t = t.older {
		c := *t
		c.newer, c.older = nil, nil
		rows = append(rows, c)
	}
	return rows, now
}

// byID returns the row with the given id, as snapshot copies it, unless it is gone. It
// walks the rows: it serves a page, not KEDA.
func (r *callRecorder) byID(id uint64) (triggerCalls, bool) {
	if r == nil {
		return triggerCalls{}, false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for t := r.newest; t != nil; t = t.older {
		if t.id == id {
			c := *t
			c.newer, c.older = nil, nil
			return c, true
		}
	}
	return triggerCalls{}, false
}
