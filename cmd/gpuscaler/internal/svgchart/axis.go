// Package svgchart holds what the SVG charts of gpuscaler's applications (the demo's
// timeline, replay's policy comparison) share: value axes and time steps that land on
// round numbers. It draws nothing itself; each chart lays itself out. It imports nothing
// of gpuscaler's.
package svgchart

import "math"

// Axis is a value axis from 0 to Max, with a tick every Step.
type Axis struct{ Max, Step float64 }

// maxIntervals is the most intervals NiceAxis splits an axis into.
const maxIntervals = 5

// NiceAxis returns the axis for values up to peak: the fewest ticks, at most five
// intervals, a step of 1, 2, 2.5 or 5 times a power of ten, ending at the first tick at or
// above the peak. A peak of 210 gets 0 to 250 by 50, not 0 to 500. With whole set the
// values are counts and the step is a whole number (so 0, 2.5, 5 never appears, and a peak
// below 1 gets 0 to 1 by 1); without it a peak of 0.3 gets 0 to 0.3 by 0.1. A peak of 0
// or less, or not a number, gets 0 to 1 by 1.
func NiceAxis(peak float64, whole bool) Axis {
	if peak <= 0 || math.IsNaN(peak) || math.IsInf(peak, 0) {
		return Axis{Max: 1, Step: 1}
	}
	p := math.Pow(10, math.Floor(math.Log10(peak/maxIntervals)))
	if whole {
		p = max(1, p)
	}
	for {
		for _, m := range []float64{1, 2, 2.5, 5} {
			step := m * p
			if whole && step != math.Trunc(step) {
				continue
			}
			// Rounding: 0.3/0.1 is 2.9999999999999996, and a peak a hair above a
			// tick because of it is at the tick.
			if n := math.Ceil(peak/step - 1e-9); n <= maxIntervals {
				return Axis{Max: n * step, Step: step}
			}
		}
		p *= 10
	}
}

// Ticks returns the axis' tick values from 0 to Max, each rounded to the step's
// precision so that 0.1·3 reads 0.3.
func (a Axis) Ticks() []float64 {
	if a.Step <= 0 || a.Max <= 0 {
		return []float64{0}
	}
	var out []float64
	for k := 0; ; k++ {
		v := a.Step * float64(k)
		if v > a.Max+a.Step/1e6 {
			return out
		}
		out = append(out, round(v, a.Step))
	}
}

// round rounds v to the precision of step: to a whole number for a step of 1 or more,
// to a tenth for a step of 0.1 to 1, and so on, with one digit more for a step of 2.5
// times a power of ten.
func round(v, step float64) float64 {
	digits := max(0, 1-math.Floor(math.Log10(step)))
	scale := math.Pow(10, digits)
	return math.Round(v*scale) / scale
}

// NiceCeil rounds v up to 1, 2 or 5 times a power of ten; 0 or less gives 1.
func NiceCeil(v float64) float64 {
	if v <= 0 || math.IsNaN(v) || math.IsInf(v, 0) {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5} {
		if v <= m*p*(1+1e-12) {
			return m * p
		}
	}
	return 10 * p
}
