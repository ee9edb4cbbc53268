package inference

import (
	"math"
	"testing"
)

func TestQuantile(t *testing.T) {
	hundred := make([]float64, 100) // 1, 2, …, 100
	for i := range hundred {
		hundred[i] = float64(i + 1)
	}
	for name, tc := range map[string]struct {
		values []float64
		q      float64
		want   float64
	}{
		// Nearest rank: rank ceil(q·n), from 1.
		"p50 of 1..100":        {hundred, 0.5, 50},
		"p99 of 1..100":        {hundred, 0.99, 99},
		"p99.9 of 1..100":      {hundred, 0.999, 100},
		"p0 is the smallest":   {hundred, 0, 1},
		"p100 is the largest":  {hundred, 1, 100},
		"p50 of four":          {[]float64{1, 2, 3, 4}, 0.5, 2},
		"p51 of four":          {[]float64{1, 2, 3, 4}, 0.51, 3},
		"p99 of three":         {[]float64{10, 20, 30}, 0.99, 30},
		"one value":            {[]float64{7}, 0.5, 7},
		"q below 0 is clamped": {[]float64{1, 2}, -1, 1},
		"q above 1 is clamped": {[]float64{1, 2}, 2, 2},
		"never interpolates":   {[]float64{0, 10}, 0.6, 10},
	} {
		t.Run(name, func(t *testing.T) {
			if got := Quantile(tc.values, tc.q); got != tc.want {
				t.Errorf("Quantile(%v…, %v) = %v, want %v", tc.values[:min(len(tc.values), 4)], tc.q, got, tc.want)
			}
		})
	}
	if got := Quantile(nil, 0.5); !math.IsNaN(got) {
		t.Errorf("quantile of nothing = %v, want NaN", got)
	}
}

// TestQuantileEveryRank checks the rank against counting, for every n to 1000 and the
// quantiles a report shows: the value returned has at least q·n values at or below it,
// and the value before it fewer.
func TestQuantileEveryRank(t *testing.T) {
	for n := 1; n <= 1000; n++ {
		values := make([]float64, n)
		for i := range values {
			values[i] = float64(i + 1) // value i+1 has i+1 values at or below it
		}
		for _, q := range []float64{0.5, 0.9, 0.95, 0.99, 0.999} {
			got := Quantile(values, q)
			if got < q*float64(n)-1e-9 || got-1 >= q*float64(n)-1e-9 {
				t.Fatalf("n %d, q %v: got rank %v, want the smallest rank r with r ≥ q·n = %v", n, q, got, q*float64(n))
			}
		}
	}
}

func TestMean(t *testing.T) {
	if got := Mean([]float64{1, 2, 3, 10}); got != 4 {
		t.Errorf("Mean = %v, want 4", got)
	}
	if got := Mean(nil); !math.IsNaN(got) {
		t.Errorf("Mean of nothing = %v, want NaN", got)
	}
}
