package demand

import (
	"sort"
	"time"
)

// waitsKept is how many reports' arrivals Waits keeps: at a report a second, over a
// quarter of an hour of reports that saw arrivals. An item that has waited longer is
// told as waiting at least that long.
const waitsKept = 1024

// Waits tells how long the oldest item waiting in a producer's share of a queue has
// waited, from the producer's arrivals total at each of its reports. Items leave the
// waiting (start, or are dropped) in the order they arrived, so with arrived items of
// which waiting still wait, the oldest waiting one is arrival number
// arrived − waiting + 1. It arrived after the last report whose total was short of
// that number and by the first whose total reached it; Waits takes the arrivals between
// those two reports as spread evenly over the time between, so the wait it tells is
// within a report interval of the true one. Where items do not leave in order it is the
// wait of the item that would be oldest if they did, which is at most the oldest's. It
// keeps the last waitsKept reports that saw arrivals, in fixed arrays: it does not
// allocate. The zero value is ready to use.
type Waits struct {
	// Report i saw arrivals from[i] < number ≤ upto[i], which arrived after since[i]
	// and by at[i].
	since, at  [waitsKept]time.Duration
	from, upto [waitsKept]uint64
	// n is how many are kept, next where the next goes; total is the last report's
	// arrivals, seen its time, and started says there was one.
	n, next int
	total   uint64
	seen    time.Duration
	started bool
}

// Oldest records that arrived items had arrived by at, and returns how long the oldest
// of the waiting items among them had waited then; 0 when none waits. Call it with each
// report's figures, at and arrived never going back.
func (w *Waits) Oldest(at time.Duration, arrived, waiting uint64) time.Duration {
	if arrived > w.total {
		since := w.seen
		if !w.started {
			since = at // the first report: what it counts arrived by then
		}
		w.since[w.next], w.at[w.next], w.from[w.next], w.upto[w.next] = since, at, w.total, arrived
		w.next = (w.next + 1) % waitsKept
		w.n = min(w.n+1, waitsKept)
		w.total = arrived
	}
	w.seen, w.started = at, true
	if waiting == 0 || w.n == 0 {
		return 0
	}
	// The oldest waiting item is number first of the arrivals, counted from 1.
	first := w.total - min(waiting, w.total) + 1
	// The earliest kept report whose total reached it (totals rise with the index; the
	// newest's is the total, so there is one).
	i := w.index(sort.Search(w.n, func(j int) bool { return w.upto[w.index(j)] >= first }))
	if first <= w.from[i] {
		// It arrived before the earliest report kept: at least since then.
		return max(0, at-w.since[i])
	}
	share := (float64(first-w.from[i]) - 0.5) / float64(w.upto[i]-w.from[i])
	return max(0, at-w.since[i]-time.Duration(share*float64(w.at[i]-w.since[i])))
}

// index is where the i-th kept report, oldest first, is.
func (w *Waits) index(i int) int { return (w.next - w.n + i + 2*waitsKept) % waitsKept }
