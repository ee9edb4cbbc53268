package queue

import (
	"runtime"
	"sync/atomic"
)

// busy integrates a queue's items in flight over time, exactly, and counts its
// completions, for the traffic a Reporter measures: the busy item-seconds over the
// completions is the service time, by Little's law, with nothing guessed.
//
// The integral up to now is Σ −Δ·t + n·now, over every change Δ of the items in flight
// at t (nanoseconds since the Reporter started), n being the items in flight. A change
// and its time are two additions, to the sum and to n; a reader that saw one without
// the other would be off by Δ·t, which grows with the Reporter's age, so a reader must
// see whole changes only. Writers never wait: as client_golang's histograms do, each
// change writes to the shard the top bit of begun names, and the one reader (the
// Reporter's goroutine) flips that bit, waits for the changes begun before the flip to
// be done (a few atomic additions each), reads the shard they wrote, and folds it into
// the other.
//
// The sums wrap around in 64 bits, and so does the integral, so what comes out is exact
// as long as the item-nanoseconds between two reads fit 63 bits: 9.2·10⁹ item-seconds, a
// million items in flight for 100 days.
type busy struct {
	// begun counts the changes begun, in its low 63 bits; its top bit names the shard
	// they write.
	begun  atomic.Uint64
	shards [2]busyShard
}

type busyShard struct {
	// sum is Σ −Δ·t and n is ΣΔ, over the changes written here.
	sum, n      atomic.Int64
	completions atomic.Uint64
	// done counts the changes written here, whole.
	done atomic.Uint64
}

// change records that the items in flight changed by delta at t, completed of them
// having finished.
func (b *busy) change(delta int64, completed uint64, t int64) {
	s := &b.shards[b.begun.Add(1)>>63]
	s.sum.Add(-delta * t)
	s.n.Add(delta)
	if completed > 0 {
		s.completions.Add(completed)
	}
	s.done.Add(1)
}

// read returns the item-nanoseconds in flight from the start up to t (wrapping around
// in 64 bits) and the completions, over every change begun before the call, and t,
// which it reads from now once the changes begun after are left out. One goroutine at
// a time may read.
func (b *busy) read(now func() int64) (integral int64, completions uint64, t int64) {
	x := b.begun.Add(1 << 63)
	t = now()
	begun := x &^ (1 << 63)
	hot, cold := &b.shards[x>>63], &b.shards[x>>63^1]
	for cold.done.Load() != begun {
		runtime.Gosched() // a writer between its additions: a few nanoseconds
	}
	sum, n, c := cold.sum.Load(), cold.n.Load(), cold.completions.Load()
	hot.sum.Add(sum)
	hot.n.Add(n)
	hot.completions.Add(c)
	hot.done.Add(begun)
	cold.sum.Store(0)
	cold.n.Store(0)
	cold.completions.Store(0)
	cold.done.Store(0)
	return sum + n*t, c, t
}
