package svgchart

import (
	"math"
	"slices"
	"testing"
)

// TestNiceAxis: the axis ends at the first round tick at or above the peak, in at most
// five intervals; counts get whole steps, seconds may get tenths.
func TestNiceAxis(t *testing.T) {
	for name, tc := range map[string]struct {
		peak      float64
		whole     bool
		max, step float64
	}{
		"nothing":              {0, true, 1, 1},
		"negative":             {-3, false, 1, 1},
		"not a number":         {math.NaN(), false, 1, 1},
		"infinite":             {math.Inf(1), true, 1, 1},
		"a count below one":    {0.3, true, 1, 1},
		"one":                  {1, true, 1, 1},
		"seven":                {7, true, 8, 2},
		"ten":                  {10, true, 10, 2},
		"eleven":               {11, true, 15, 5},
		"210, not 500":         {210, true, 250, 50},
		"1000":                 {1000, true, 1000, 200},
		"1001":                 {1001, true, 1250, 250},
		"seconds below one":    {0.3, false, 0.3, 0.1},
		"seconds at 0.31":      {0.31, false, 0.4, 0.1},
		"seconds at 2.4":       {2.4, false, 2.5, 0.5},
		"seconds at 12":        {12, false, 12.5, 2.5},
		"seconds at 12, whole": {12, true, 15, 5},
		"hundreds of seconds":  {431.7, false, 500, 100},
	} {
		got := NiceAxis(tc.peak, tc.whole)
		if math.Abs(got.Max-tc.max) > 1e-9 || math.Abs(got.Step-tc.step) > 1e-9 {
			t.Errorf("%s: NiceAxis(%v, %v) = 0 to %v by %v, want 0 to %v by %v", name, tc.peak, tc.whole, got.Max, got.Step, tc.max, tc.step)
		}
		if tc.peak > 0 && !math.IsInf(tc.peak, 0) && (got.Max < tc.peak || got.Max/got.Step > maxIntervals+1e-9) {
			t.Errorf("%s: NiceAxis(%v) = 0 to %v by %v: want the peak covered in at most %d intervals", name, tc.peak, got.Max, got.Step, maxIntervals)
		}
	}
}

// TestTicks: ticks from 0 to the axis' end, read as a person would write them.
func TestTicks(t *testing.T) {
	for _, tc := range []struct {
		axis Axis
		want []float64
	}{
		{Axis{Max: 0.3, Step: 0.1}, []float64{0, 0.1, 0.2, 0.3}},
		{Axis{Max: 12.5, Step: 2.5}, []float64{0, 2.5, 5, 7.5, 10, 12.5}},
		{Axis{Max: 250, Step: 50}, []float64{0, 50, 100, 150, 200, 250}},
		{Axis{}, []float64{0}},
	} {
		if got := tc.axis.Ticks(); !slices.Equal(got, tc.want) {
			t.Errorf("%+v.Ticks() = %v, want %v", tc.axis, got, tc.want)
		}
	}
}

func TestNiceCeil(t *testing.T) {
	for _, tc := range []struct{ v, want float64 }{
		{0, 1}, {-1, 1}, {0.7, 1}, {1, 1}, {1.2, 2}, {2, 2}, {3, 5}, {7, 10}, {10, 10}, {22.5, 50}, {0.03, 0.05},
	} {
		if got := NiceCeil(tc.v); math.Abs(got-tc.want) > 1e-12 {
			t.Errorf("NiceCeil(%v) = %v, want %v", tc.v, got, tc.want)
		}
	}
}
