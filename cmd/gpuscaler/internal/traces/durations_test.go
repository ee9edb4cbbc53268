package traces

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

func TestNewDurations(t *testing.T) {
	if _, err := NewDurations(nil); err == nil {
		t.Error("got no error for no durations, want one")
	}
	ds := []time.Duration{3, 1, 2}
	d, err := NewDurations(ds)
	if err != nil {
		t.Fatal(err)
	}
	ds[0] = 100
	if d.Len() != 3 || d.Quantile(1) != 3 {
		t.Errorf("got %d values, largest %v; want 3, largest 3 (a copy, not the caller's slice)", d.Len(), d.Quantile(1))
	}
}

func TestDurationsQuantile(t *testing.T) {
	d, err := NewDurations([]time.Duration{10, 9, 8, 7, 6, 5, 4, 3, 2, 1})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		q    float64
		want time.Duration
	}{{0, 1}, {0.05, 1}, {0.1, 1}, {0.15, 2}, {0.3, 3}, {0.5, 5}, {0.51, 6}, {0.9, 9}, {0.99, 10}, {1, 10}} {
		if got := d.Quantile(c.q); got != c.want {
			t.Errorf("Quantile(%g): got %v, want %v", c.q, got, c.want)
		}
	}
	// 0.07*100 is 7.000000000000001 in floating point; nearest rank is still the 7th.
	hundred := make([]time.Duration, 100)
	for i := range hundred {
		hundred[i] = time.Duration(i + 1)
	}
	if d, err := NewDurations(hundred); err != nil {
		t.Fatal(err)
	} else if got := d.Quantile(0.07); got != 7 {
		t.Errorf("Quantile(0.07) of 1..100: got %v, want 7", got)
	}
	for _, q := range []float64{-0.1, 1.1, math.NaN()} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("Quantile(%g) did not panic", q)
				}
			}()
			d.Quantile(q)
		}()
	}
}

func TestDurationsSample(t *testing.T) {
	vals := []time.Duration{5 * time.Second, time.Second, 2 * time.Second, 2 * time.Second}
	d, err := NewDurations(vals)
	if err != nil {
		t.Fatal(err)
	}
	draw := func(seed uint64) []time.Duration {
		r := rand.New(rand.NewPCG(seed, seed))
		out := make([]time.Duration, 40_000)
		for i := range out {
			out[i] = d.Sample(r)
		}
		return out
	}
	a, b, c := draw(1), draw(1), draw(2)
	if !slices.Equal(a, b) {
		t.Error("two draws with seed 1 differ")
	}
	if slices.Equal(a, c) {
		t.Error("draws with seeds 1 and 2 are the same")
	}
	count := make(map[time.Duration]int)
	for _, s := range a {
		count[s]++
	}
	// Each observed value is equally likely: 2 s, seen twice, comes half the time.
	for v, want := range map[time.Duration]float64{time.Second: 0.25, 2 * time.Second: 0.5, 5 * time.Second: 0.25} {
		if got := float64(count[v]) / float64(len(a)); math.Abs(got-want) > 0.02 {
			t.Errorf("got %v in %.3f of draws, want %.2f", v, got, want)
		}
	}
	if len(count) != 3 {
		t.Errorf("got values %v, want only observed ones", count)
	}
}
