package testkit

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

func TestOpenLoop(t *testing.T) {
	var calls atomic.Int64
	lat, err := OpenLoop(t.Context(), 1000, 50, func(context.Context) error { calls.Add(1); return nil })
	if err != nil || len(lat) != 50 || calls.Load() != 50 {
		t.Fatalf("got %d latencies, %d calls, error %v; want 50, 50, none", len(lat), calls.Load(), err)
	}
	for i := 1; i < len(lat); i++ {
		if lat[i] < lat[i-1] {
			t.Fatalf("latencies not sorted: %v", lat)
		}
	}
	_, err = OpenLoop(t.Context(), 1000, 10, func(context.Context) error {
		if calls.Add(1)%2 == 0 {
			return errors.New("status 503")
		}
		return nil
	})
	if err == nil || !strings.Contains(err.Error(), "5 of 10 calls failed, the first: status 503") {
		t.Fatalf("half the calls failing: got %v", err)
	}
}

func TestClosedLoop(t *testing.T) {
	rate, err := ClosedLoop(t.Context(), 2, 50*time.Millisecond, func(context.Context) error { time.Sleep(time.Millisecond); return nil })
	if err != nil || rate <= 0 {
		t.Fatalf("got %v a second, error %v; want a rate and none", rate, err)
	}
	if _, err := ClosedLoop(t.Context(), 2, time.Second, func(context.Context) error { return errors.New("refused") }); err == nil || err.Error() != "refused" {
		t.Fatalf("every call failing: got %v, want refused", err)
	}
}
