package traces

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"time"
)

// Durations is an empirical distribution of durations, such as measured model load
// latencies. It is immutable; it is safe for concurrent use, given a *rand.Rand per
// goroutine.
type Durations struct {
	sorted []time.Duration // ascending, never empty
}

// NewDurations returns the distribution of ds, which it copies. It fails when ds is empty.
func NewDurations(ds []time.Duration) (*Durations, error) {
	if len(ds) == 0 {
		return nil, errors.New("traces: a distribution of no durations")
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return &Durations{sorted: s}, nil
}

// Sample draws one of the observed values, each equally likely (the inverse CDF of the
// empirical distribution, no interpolation), using only r: the same r state gives the
// same value.
func (d *Durations) Sample(r *rand.Rand) time.Duration {
	return d.sorted[r.IntN(len(d.sorted))]
}

// Quantile returns the q-quantile by nearest rank: the smallest observed value with at
// least a share q of the values at or below it (the least value for q = 0). It panics
// if q is not within [0, 1].
func (d *Durations) Quantile(q float64) time.Duration {
	if !(q >= 0 && q <= 1) {
		panic(fmt.Sprintf("traces: quantile %v outside [0, 1]", q))
	}
	rank := q * float64(len(d.sorted))
	if k := math.Round(rank); math.Abs(rank-k) < 1e-9 {
		rank = k // 0.07*100 is 7.000000000000001 in floating point: still rank 7, not 8
	}
	return d.sorted[max(int(math.Ceil(rank)), 1)-1]
}

// Len returns how many values it holds.
func (d *Durations) Len() int { return len(d.sorted) }
