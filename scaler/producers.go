package scaler

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	gpuscalerv1 "github.com/gpuscaler/gpuscaler/proto/gpuscaler/v1"
	"github.com/gpuscaler/gpuscaler/scaler/demand"
)

// A queue may have several producers (the replicas of a gateway, workers that each hold a
// share of it). Each reports its own share on a subject of its own, and the stream keeps
// the last report of each; the queue reads the sum over its live producers. A producer
// is live while its last report is within the trigger's staleAfter and did not say it
// stopped. With no live producer the queue is unknown (Unavailable), never 0.

// queueEntry is what the state holds of one queue: the last report of each producer that
// has not stopped. A producer that stops leaves it at once; the entry is forgotten, with
// its producers, when its newest report is older than the stream keeps reports.
type queueEntry struct {
	namespace, queue string
	producers        map[string]*producerEntry
	// newest is when NATS stored the newest report of any producer, stopped ones too.
	newest time.Time
	// stopped is the producer whose report last said it stopped, and when NATS stored
	// it: what an error names when no producer is left.
	stopped   string
	stoppedAt time.Time
}

// producerEntry is one producer's last report of a queue.
type producerEntry struct {
	report *gpuscalerv1.QueueReport
	stored time.Time
	// demand is the producer's traffic: as its last report measured it, or, for a
	// producer that does not measure, as the differences between its reports so far
	// tell it.
	demand demand.Estimate
	// silent is set by MarkSilentProducers once the report is older than the scaler's
	// default staleAfter, so a producer's falling silent is counted and logged once.
	silent bool
}

// DefaultMaxProducersPerQueue bounds the producers the state tracks per queue. A gateway
// runs a few replicas, and a producer that crashed stays until the stream forgets its
// last report, so the bound leaves room for many rollouts while a tenant inventing
// producer ids stops at a few hundred KiB per queue.
const DefaultMaxProducersPerQueue = 64

// ErrProducerLimit refuses a report of a new producer of a queue that has as many
// producers as the limit allows.
var ErrProducerLimit = errors.New("producer limit of the queue reached")

// SetMaxProducersPerQueue sets how many producers the state tracks per queue; zero or
// less sets no limit. The default is DefaultMaxProducersPerQueue.
func (s *State) SetMaxProducersPerQueue(n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.maxProducersPerQueue = n
}

// ProducerLeft is a producer that no longer counts in its queue's reading: it stopped
// cleanly (Stopped), or its last report grew older than the scaler's default staleAfter.
type ProducerLeft struct {
	Namespace, Queue, Producer string
	Stopped                    bool
	// Stored is when NATS stored its last report; Backlog is the share that report held.
	Stored  time.Time
	Backlog uint64
}

// SetProducerLeftHook sets a function told of every ProducerLeft, after the state is
// unlocked; nil sets none. It is called on the goroutine that applied the report, or that
// called MarkSilentProducers.
func (s *State) SetProducerLeftHook(f func(ProducerLeft)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.onProducerLeft = f
}

// applyQueue records producer r's report of its queue.
func (s *State) applyQueue(r *gpuscalerv1.QueueReport, stored time.Time) error {
	k := queueKey{r.GetNamespace(), r.GetQueue()}
	id := r.GetProducerId()
	var left *ProducerLeft
	var hook func(ProducerLeft)
	defer func() { // runs after the deferred unlock below: no one waits on s.mu for it
		if left != nil && hook != nil {
			hook(*left)
		}
	}()
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.queues[k]
	if e == nil {
		if s.atQueueLimit(k.namespace) {
			return fmt.Errorf("%w: report for queue %s/%s dropped: namespace %s has %d queues, as many as --max-queues-per-namespace allows",
				ErrQueueLimit, k.namespace, k.queue, k.namespace, s.queuesPerNS[k.namespace])
		}
		e = &queueEntry{namespace: k.namespace, queue: k.queue, producers: make(map[string]*producerEntry)}
		s.queues[k] = e
		s.queuesPerNS[k.namespace]++
	}
	old := e.producers[id]
	if old == nil && !r.GetStopped() && s.maxProducersPerQueue > 0 && len(e.producers) >= s.maxProducersPerQueue {
		return fmt.Errorf("%w: report of producer %q of queue %s/%s dropped: the queue has %d producers, as many as --max-producers-per-queue allows, until one stops or is forgotten",
			ErrProducerLimit, id, k.namespace, k.queue, len(e.producers))
	}
	if stored.After(e.newest) {
		e.newest = stored
	}
	if r.GetStopped() {
		delete(e.producers, id)
		e.stopped, e.stoppedAt = id, stored
		if old != nil && !old.silent {
			left, hook = &ProducerLeft{Namespace: k.namespace, Queue: k.queue, Producer: id, Stopped: true, Stored: stored, Backlog: old.report.Backlog()}, s.onProducerLeft
		}
	} else {
		e.producers[id] = &producerEntry{report: r, stored: stored, demand: old.nextDemand(r, stored)}
		if e.stopped == id { // it reports again: no longer the one that stopped
			e.stopped, e.stoppedAt = "", time.Time{}
		}
	}
	for w := range s.queueWatch[k] {
		q := e.sum(stored, w.staleAfter)
		w.notify(q.waiting + q.inFlight)
	}
	return nil
}

// nextDemand is the producer's traffic estimate once report r, stored at stored, follows
// old (nil: the producer's first report since this scaler started). A report that carries
// the producer's own measure of its traffic says it all, so a replica that just started
// holds the same estimate as one that read every report; otherwise it is folded from the
// differences between r and old's report.
func (old *producerEntry) nextDemand(r *gpuscalerv1.QueueReport, stored time.Time) demand.Estimate {
	if t := r.GetTraffic(); t != nil {
		return demand.FromTraffic(t)
	}
	if old == nil {
		return demand.Estimate{}
	}
	return old.demand.Next(old.report, r, stored.Sub(old.stored))
}

// live reports whether p counts in its queue's reading at now, for staleAfter.
func (p *producerEntry) live(now time.Time, staleAfter time.Duration) bool {
	return now.Sub(p.stored) <= staleAfter
}

// queueSum is a queue's reading: the sums over its live producers.
type queueSum struct {
	live int
	// measuring is how many of them report their own measure of their traffic.
	measuring         int
	waiting, inFlight float64
	demand            demand.Estimate
	// coldStart is the largest cold start the live producers measured, in seconds (0:
	// none), and coldStartBy the producer that did (the first by id, on a tie).
	coldStart   float64
	coldStartBy string
	// oldestWait is how long the oldest waiting item has waited: the longest a live
	// producer with items waiting measured, plus the time since its report.
	oldestWait time.Duration
}

// sum adds up the producers live at now, for staleAfter.
func (e *queueEntry) sum(now time.Time, staleAfter time.Duration) queueSum {
	var q queueSum
	for id, p := range e.producers {
		if !p.live(now, staleAfter) {
			continue
		}
		if c := measuredColdStart(p.report.GetColdStartSeconds()); c > q.coldStart || c > 0 && c == q.coldStart && id < q.coldStartBy {
			q.coldStart, q.coldStartBy = c, id
		}
		if q.live++; q.live == 1 {
			q.demand = p.demand // one producer's estimate as it is
		} else {
			q.demand = q.demand.Add(p.demand)
		}
		if p.report.GetTraffic() != nil {
			q.measuring++
		}
		q.waiting += float64(p.report.GetWaiting())
		q.inFlight += float64(p.report.GetInFlight())
		if w := p.report.GetTraffic().GetOldestWaitSeconds(); w > 0 && p.report.GetWaiting() > 0 {
			q.oldestWait = max(q.oldestWait, time.Duration(w*float64(time.Second))+max(0, now.Sub(p.stored)))
		}
	}
	return q
}

// unavailable explains why e has no live producer at now, for staleAfter.
func (e *queueEntry) unavailable(now time.Time, staleAfter time.Duration) error {
	var newest *producerEntry
	var id string
	for pid, p := range e.producers {
		if newest == nil || p.stored.After(newest.stored) {
			newest, id = p, pid
		}
	}
	stopped := !e.stoppedAt.IsZero() && (newest == nil || e.stoppedAt.After(newest.stored))
	if stopped {
		return fmt.Errorf("%w: queue %s/%s has no live producer: its last, %q, stopped at %s, %s ago; is anything producing it now?",
			ErrUnavailable, e.namespace, e.queue, e.stopped, stamp(e.stoppedAt), now.Sub(e.stoppedAt).Round(time.Second))
	}
	if newest == nil {
		return fmt.Errorf("%w: queue %s/%s has no live producer; is its producer running and publishing to NATS?",
			ErrUnavailable, e.namespace, e.queue)
	}
	return fmt.Errorf("%w: queue %s/%s last reported at %s, %s ago, longer than staleAfter %s (producer %q, the newest of %d); is its producer running?",
		ErrUnavailable, e.namespace, e.queue, stamp(newest.stored), now.Sub(newest.stored).Round(time.Second), staleAfter, id, len(e.producers))
}

// MarkSilentProducers marks the producers whose last report NATS stored before cutoff
// (now less the scaler's default staleAfter) as silent, and tells the ProducerLeft hook
// of each, once. A silent producer that reports again counts again. It returns how many
// it marked.
func (s *State) MarkSilentProducers(cutoff time.Time) int {
	var left []ProducerLeft
	s.mu.Lock()
	for _, e := range s.queues {
		for id, p := range e.producers {
			if !p.silent && p.stored.Before(cutoff) {
				p.silent = true
				left = append(left, ProducerLeft{Namespace: e.namespace, Queue: e.queue, Producer: id, Stored: p.stored, Backlog: p.report.Backlog()})
			}
		}
	}
	hook := s.onProducerLeft
	s.mu.Unlock()
	if hook != nil {
		for _, l := range left {
			hook(l)
		}
	}
	return len(left)
}

// forgetQueues drops the producers whose last report NATS stored before cutoff, and the
// queues left with none whose newest report is that old too. s.mu must be held. It
// returns how many queues it dropped.
func (s *State) forgetQueues(cutoff time.Time) int {
	n := 0
	for k, e := range s.queues {
		for id, p := range e.producers {
			if p.stored.Before(cutoff) {
				delete(e.producers, id)
			}
		}
		if len(e.producers) == 0 && e.newest.Before(cutoff) {
			delete(s.queues, k)
			if s.queuesPerNS[k.namespace]--; s.queuesPerNS[k.namespace] <= 0 {
				delete(s.queuesPerNS, k.namespace)
			}
			n++
		}
	}
	return n
}

// status is what e holds at now: the sums over the producers live for staleAfter, and
// every producer's last report.
func (e *queueEntry) status(now time.Time, staleAfter time.Duration) *gpuscalerv1.QueueStatus {
	q := e.sum(now, staleAfter)
	st := &gpuscalerv1.QueueStatus{
		Namespace:          e.namespace,
		Queue:              e.queue,
		Waiting:            clampInt64(uint64(q.waiting)),
		InFlight:           clampInt64(uint64(q.inFlight)),
		Backlog:            clampInt64(uint64(q.waiting + q.inFlight)),
		Stored:             timestamppb.New(e.newest),
		Age:                durationpb.New(now.Sub(e.newest)),
		Stale:              q.live == 0,
		ArrivalRate:        q.demand.Arrivals,
		ServiceSeconds:     q.demand.Service,
		ArrivalDispersion:  q.demand.Dispersion,
		ArrivalTrend:       q.demand.Trend,
		ArrivalLevel:       q.demand.Level,
		LevelWindowSeconds: q.demand.LevelWindow,
		OldestWaitSeconds:  q.oldestWait.Seconds(),
		MeasuringProducers: int32(q.measuring),
		ColdStart:          q.producerColdStart().proto(),
	}
	for id, p := range e.producers {
		st.Producers = append(st.Producers, &gpuscalerv1.ProducerStatus{
			ProducerId: id,
			Waiting:    clampInt64(p.report.GetWaiting()),
			InFlight:   clampInt64(p.report.GetInFlight()),
			Stored:     timestamppb.New(p.stored),
			Age:        durationpb.New(now.Sub(p.stored)),
			Stale:      !p.live(now, staleAfter),
			Measured:   p.report.GetTraffic() != nil,
			// Read as the sum reads it: a figure the scaler does not take shows as none.
			ColdStartSeconds: measuredColdStart(p.report.GetColdStartSeconds()),
		})
	}
	if e.stopped != "" {
		st.Producers = append(st.Producers, &gpuscalerv1.ProducerStatus{
			ProducerId: e.stopped,
			Stored:     timestamppb.New(e.stoppedAt),
			Age:        durationpb.New(now.Sub(e.stoppedAt)),
			Stopped:    true,
		})
	}
	slices.SortFunc(st.Producers, func(a, b *gpuscalerv1.ProducerStatus) int {
		return cmp.Or(strings.Compare(a.ProducerId, b.ProducerId), boolCompare(a.Stopped, b.Stopped))
	})
	return st
}

func boolCompare(a, b bool) int {
	switch {
	case a == b:
		return 0
	case !a:
		return -1
	default:
		return 1
	}
}
