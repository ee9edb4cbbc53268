package scaler

import (
	"time"
)

// SetProducerConflictHook sets a function told of every ProducerConflict, after the
// report is applied and the state unlocked; nil sets none. It is called on the goroutine
// applying the report.
func (s *State) SetProducerConflictHook(f func(ProducerConflict)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.onProducerConflict = f
}

// QueuesWithProducerConflict reports how many queues had a ProducerConflict within
// producerConflictWindow before now.
func (s *State) QueuesWithProducerConflict() int {
	s.mu.RLock()
	defer s.mu.RUnlock()
	since := s.now().Add(-producerConflictWindow)
	n := 0
	for _, e := range s.queues {
		if !e.conflicted.IsZero() && !e.conflicted.Before(since) {
			n++
		}
	}
	return n
}

// succeed carries the producer history of old, the queue's entry e replaces (nil for a
// new queue), over to e, and returns the ProducerConflict e's report makes, or nil.
func (e *queueEntry) succeed(old *queueEntry) *ProducerConflict {
	if old == nil {
		return nil
	}
	e.producers, e.conflicted = old.producers, old.conflicted
	p, other := e.report.GetProducerId(), old.report.GetProducerId()
	if p == other {
		return nil
	}
	var conflict bool
	if e.producers, conflict = e.producers.see(p, other, old.stored, e.stored); !conflict {
		return nil
	}
	e.conflicted = e.stored
	return &ProducerConflict{Namespace: e.report.GetNamespace(), Queue: e.report.GetQueue(), Producer: p, Other: other,
		Backlog: e.report.Backlog(), OtherBacklog: old.report.Backlog()}
}

// ProducerConflict is a queue report from one producer that replaced a report of another
// while the two were reporting the same queue by turns: the backlog then flaps between
// their figures, as the scaler keeps only the latest report per queue.
type ProducerConflict struct {
	Namespace, Queue string
	// Producer sent the report just applied, of Backlog; Other sent the one it
	// replaced, of OtherBacklog.
	Producer, Other       string
	Backlog, OtherBacklog uint64
}

// producerConflictWindow is how recently a producer must have reported for a report of
// it, replacing another's, to be a conflict, and how long a queue counts as having one
// after its last. Producers report every few seconds (well within staleAfter, 30s by
// default), so two live ones take turns well within it. A producer that restarts takes
// a new id (collectors/queue makes one per Reporter) and its old id never reports again,
// so a restart is never a conflict, however short the window.
const producerConflictWindow = time.Minute

// maxProducersRemembered bounds the producer ids a queue's history holds. More producers
// than this reporting one queue within producerConflictWindow are a conflict in
// themselves: no producer restarts that often.
const maxProducersRemembered = 8

// producerHistory is when each producer that reported a queue lately last did so. Only
// the goroutine applying the queue's reports uses it, under State.mu; it exists only for
// queues that have had more than one producer.
type producerHistory []producerSeen

type producerSeen struct {
	id   string
	last time.Time // when NATS stored its last report
}

// see records that producer reported at stored, replacing a report of cur (who reported
// last at curStored), and reports whether that is a conflict: producer reported within
// producerConflictWindow before cur took over, or too many producers reported lately.
// A history of nil is empty; see returns the history to keep.
func (h producerHistory) see(producer, cur string, curStored, stored time.Time) (producerHistory, bool) {
	h = h.record(cur, curStored)
	since := stored.Add(-producerConflictWindow)
	conflict := false
	i := h.index(producer)
	switch {
	case i >= 0:
		conflict = !h[i].last.Before(since)
		h[i].last = stored
	default:
		h = h.forget(since)
		if len(h) >= maxProducersRemembered {
			conflict = true
			h = h.forget(h.oldest().Add(time.Nanosecond))
		}
		h = append(h, producerSeen{producer, stored})
	}
	return h, conflict
}

// record sets id's last report to at.
func (h producerHistory) record(id string, at time.Time) producerHistory {
	if i := h.index(id); i >= 0 {
		h[i].last = at
		return h
	}
	return append(h, producerSeen{id, at})
}

func (h producerHistory) index(id string) int {
	for i, p := range h {
		if p.id == id {
			return i
		}
	}
	return -1
}

// forget drops the producers that last reported before cutoff.
func (h producerHistory) forget(cutoff time.Time) producerHistory {
	kept := h[:0]
	for _, p := range h {
		if !p.last.Before(cutoff) {
			kept = append(kept, p)
		}
	}
	return kept
}

func (h producerHistory) oldest() time.Time {
	t := h[0].last
	for _, p := range h[1:] {
		if p.last.Before(t) {
			t = p.last
		}
	}
	return t
}
