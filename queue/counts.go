package queue

import "math"

// MaxCount is the largest waiting or in-flight count a Reporter holds; counts saturate
// there instead of wrapping around. Both counts share one 64-bit word so that every
// change is one atomic step (see counts).
const MaxCount = math.MaxUint32

// counts is a queue's waiting and in-flight counts packed into one word, waiting in the
// high 32 bits, so that one atomic load reads a pair that existed together and one
// compare-and-swap moves an item from waiting to in flight: a report never sees an item
// in neither or in both.
type counts uint64

func packCounts(waiting, inFlight uint64) counts {
	return counts(min(waiting, MaxCount)<<32 | min(inFlight, MaxCount))
}

func (c counts) waiting() uint64  { return uint64(c) >> 32 }
func (c counts) inFlight() uint64 { return uint64(c) & MaxCount }

// empty reports whether the queue holds nothing, waiting or in flight.
func (c counts) empty() bool { return c == 0 }

// backlog returns waiting plus in flight.
func (c counts) backlog() uint64 { return c.waiting() + c.inFlight() }

// enqueued returns c with n more items waiting.
func (c counts) enqueued(n uint64) counts {
	return packCounts(satAdd(c.waiting(), n), c.inFlight())
}

// started returns c with n items moved from waiting to in flight. Items started beyond
// those waiting (never reported as enqueued) still count in flight.
func (c counts) started(n uint64) counts {
	return packCounts(satSub(c.waiting(), n), satAdd(c.inFlight(), n))
}

// finished returns c with n fewer items in flight, stopping at 0.
func (c counts) finished(n uint64) counts {
	return packCounts(c.waiting(), satSub(c.inFlight(), n))
}

// dropped returns c with n fewer items waiting, stopping at 0.
func (c counts) dropped(n uint64) counts {
	return packCounts(satSub(c.waiting(), n), c.inFlight())
}

// count turns a caller's int into a count: negative is 0, and anything above MaxCount is
// MaxCount, which keeps the 32-bit sums below from overflowing.
func count(n int) uint64 {
	if n <= 0 {
		return 0
	}
	return min(uint64(n), MaxCount)
}

// satAdd adds two counts of at most MaxCount, saturating at MaxCount.
func satAdd(a, b uint64) uint64 { return min(a+b, MaxCount) }

// satSub subtracts, stopping at 0.
func satSub(a, b uint64) uint64 {
	if b >= a {
		return 0
	}
	return a - b
}
