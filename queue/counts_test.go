package queue

import (
	"sync"
	"sync/atomic"
	"testing"
)

func TestCountsArithmetic(t *testing.T) {
	for name, tc := range map[string]struct {
		start             counts
		op                func(counts) counts
		waiting, inFlight uint64
	}{
		"enqueue":                   {packCounts(1, 2), func(c counts) counts { return c.enqueued(3) }, 4, 2},
		"enqueue saturates":         {packCounts(MaxCount-1, 0), func(c counts) counts { return c.enqueued(5) }, MaxCount, 0},
		"enqueue the most":          {packCounts(MaxCount, MaxCount), func(c counts) counts { return c.enqueued(count(1 << 40)) }, MaxCount, MaxCount},
		"start moves":               {packCounts(5, 1), func(c counts) counts { return c.started(2) }, 3, 3},
		"start more than waiting":   {packCounts(1, 0), func(c counts) counts { return c.started(3) }, 0, 3},
		"start saturates in flight": {packCounts(1, MaxCount), func(c counts) counts { return c.started(1) }, 0, MaxCount},
		"finish":                    {packCounts(2, 3), func(c counts) counts { return c.finished(2) }, 2, 1},
		"finish more than started":  {packCounts(2, 3), func(c counts) counts { return c.finished(10) }, 2, 0},
		"finish the most":           {packCounts(MaxCount, MaxCount), func(c counts) counts { return c.finished(count(1 << 40)) }, MaxCount, 0},
		"pack clamps":               {0, func(counts) counts { return packCounts(1<<40, 1<<33) }, MaxCount, MaxCount},
	} {
		t.Run(name, func(t *testing.T) {
			c := tc.op(tc.start)
			if c.waiting() != tc.waiting || c.inFlight() != tc.inFlight {
				t.Errorf("got waiting %d, in flight %d; want %d, %d", c.waiting(), c.inFlight(), tc.waiting, tc.inFlight)
			}
		})
	}
}

func TestCount(t *testing.T) {
	for n, want := range map[int]uint64{-5: 0, 0: 0, 1: 1, MaxCount: MaxCount, MaxCount + 1: MaxCount, 1 << 62: MaxCount} {
		if got := count(n); got != want {
			t.Errorf("count(%d) = %d, want %d", n, got, want)
		}
	}
}

// TestStartedNeverTorn reads the counts as the Reporter's goroutine does, as fast as it
// can, while goroutines start items: the backlog never changes, so every read must show
// it whole. An item taken out of waiting before it is put in flight would show as a dip,
// and, on a queue of one item, as an empty queue that never was.
func TestStartedNeverTorn(t *testing.T) {
	const (
		backlog    = 1 << 30
		goroutines = 4
		reads      = 200_000
	)
	r := &Reporter{wake: make(chan struct{}, 1)}
	r.Enqueued(backlog)
	var (
		wg      sync.WaitGroup
		stop    atomic.Bool
		started atomic.Uint64
	)
	for range goroutines {
		wg.Go(func() {
			for !stop.Load() {
				r.Started(1)
				started.Add(1)
			}
		})
	}
	var last counts
	for i := range reads {
		c := counts(r.counts.Load())
		if c.backlog() != backlog || c.waiting() > last.waiting() && i > 0 || c.inFlight() < last.inFlight() {
			t.Fatalf("read %d: waiting %d, in flight %d after %d, %d; want a backlog of %d throughout, moving from waiting to in flight",
				i, c.waiting(), c.inFlight(), last.waiting(), last.inFlight(), backlog)
		}
		last = c
	}
	stop.Store(true)
	wg.Wait()
	if c, n := counts(r.counts.Load()), started.Load(); c.waiting() != backlog-n || c.inFlight() != n {
		t.Errorf("final counts: waiting %d, in flight %d; want %d, %d", c.waiting(), c.inFlight(), backlog-n, n)
	}
}

// TestCountsStayInBounds has goroutines move items through the queue while the counts
// are read as the Reporter's goroutine reads them: each goroutine holds at most one item
// beyond the base, waiting or in flight, so every read is within those bounds, and a
// queue that never empties sends no wake-up.
func TestCountsStayInBounds(t *testing.T) {
	const (
		base       = 3
		goroutines = 4
		reads      = 200_000
	)
	r := &Reporter{wake: make(chan struct{}, 1)}
	r.Enqueued(base)
	<-r.wake // the one empty-to-non-empty change
	var (
		wg   sync.WaitGroup
		stop atomic.Bool
	)
	for range goroutines {
		wg.Go(func() {
			for !stop.Load() {
				r.Enqueued(1)
				r.Started(1)
				r.Finished(1)
			}
		})
	}
	for i := range reads {
		c := counts(r.counts.Load())
		if b := c.backlog(); b < base || b > base+goroutines || c.inFlight() > goroutines {
			t.Fatalf("read %d: waiting %d, in flight %d; want a backlog from %d to %d, at most %d in flight",
				i, c.waiting(), c.inFlight(), base, base+goroutines, goroutines)
		}
	}
	stop.Store(true)
	wg.Wait()
	if c := counts(r.counts.Load()); c.waiting() != base || c.inFlight() != 0 {
		t.Errorf("final counts: waiting %d, in flight %d; want %d, 0", c.waiting(), c.inFlight(), base)
	}
	select {
	case <-r.wake:
		t.Error("a wake-up was sent although the queue never went empty")
	default:
	}
}
