package testkit

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// OpenLoop calls do n times, rate a second, each call when its time comes whatever the
// others are doing (open loop: a slow answer does not slow the arrivals and so hide its
// own cost), and returns the calls' latencies, sorted. If any call fails it returns how
// many did and the first error.
func OpenLoop(ctx context.Context, rate, n int, do func(context.Context) error) ([]time.Duration, error) {
	lat := make([]time.Duration, n)
	var failed atomic.Int64
	var first atomic.Value
	var wg sync.WaitGroup
	start := time.Now()
	gap := time.Second / time.Duration(rate)
	for i := range n {
		if d := time.Until(start.Add(time.Duration(i) * gap)); d > 0 {
			time.Sleep(d) // the arrivals' own clock
		}
		wg.Go(func() {
			t0 := time.Now()
			if err := do(ctx); err != nil && failed.Add(1) == 1 {
				first.Store(err)
			}
			lat[i] = time.Since(t0)
		})
	}
	wg.Wait()
	if f := failed.Load(); f > 0 {
		return nil, fmt.Errorf("%d of %d calls failed, the first: %v", f, n, first.Load())
	}
	slices.Sort(lat)
	return lat, nil
}

// ClosedLoop runs workers clients that each call do back to back for d, and returns the
// calls answered a second. A failure stops its worker; the first is returned.
func ClosedLoop(ctx context.Context, workers int, d time.Duration, do func(context.Context) error) (float64, error) {
	var done atomic.Int64
	var first atomic.Value
	var wg sync.WaitGroup
	end := time.Now().Add(d)
	for range workers {
		wg.Go(func() {
			for time.Now().Before(end) {
				if err := do(ctx); err != nil {
					first.CompareAndSwap(nil, err)
					return
				}
				done.Add(1)
			}
		})
	}
	wg.Wait()
	if err, _ := first.Load().(error); err != nil {
		return 0, err
	}
	return float64(done.Load()) / d.Seconds(), nil
}
