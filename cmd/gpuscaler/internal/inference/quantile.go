package inference

import "math"

// Quantile returns the q-quantile of sorted (ascending) by the nearest-rank method: the
// smallest value with at least a q share of the values at or below it, the value of rank
// ceil(q·n), counting from 1. It is always one of the values, never an interpolation, so
// "p99 wait 41 s" means a task really waited 41 s. q is clamped to [0, 1]; q of 0 gives
// the smallest value. With no values it returns NaN: there is no such wait.
func Quantile(sorted []float64, q float64) float64 {
	n := len(sorted)
	if n == 0 {
		return math.NaN()
	}
	rank := int(math.Ceil(min(max(q, 0), 1) * float64(n)))
	return sorted[min(max(rank, 1), n)-1]
}

// mean returns the arithmetic mean of values, NaN with none.
func Mean(values []float64) float64 {
	if len(values) == 0 {
		return math.NaN()
	}
	sum := 0.0
	for _, v := range values {
		sum += v
	}
	return sum / float64(len(values))
}
