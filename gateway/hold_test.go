package gateway

import (
	"context"
	"testing"
	"time"

	"github.com/gpuscaler/gpuscaler/gateway/routes"
	"github.com/gpuscaler/gpuscaler/test/testkit"
)

// TestHeldFirstComeFirstServed: with concurrency 1 and one endpoint, held requests go
// in their order of arrival as the endpoint frees, and a newcomer does not pass them.
func TestHeldFirstComeFirstServed(t *testing.T) {
	r := &routes.Route{Name: "llm", ServiceName: "s", ServicePort: 80, Queue: "q", HoldTimeout: time.Minute, Concurrency: 1}
	s := newRouteState(t.Context(), r, nopCounter{}, "", newMetrics(nil))
	s.setEndpoints([]string{"10.0.0.1:80"}, false)
	lim := holdLimits{maxHeld: 10, maxHeldBytes: 1 << 20}
	deadline := time.Now().Add(time.Minute)
	nop := func(int) {}
	addr, err := s.acquire(t.Context(), 0, deadline, lim, nop)
	if err != nil || addr != "10.0.0.1:80" {
		t.Fatalf("first: got %q, %v", addr, err)
	}
	order := make(chan int, 3)
	for i := range 3 {
		go func() {
			if _, err := s.acquire(t.Context(), 0, deadline, lim, nop); err != nil {
				t.Error(err)
			}
			order <- i
		}()
		testkit.Eventually(t, 5*time.Second, func() bool { return s.heldNow() == i+1 })
	}
	for want := range 3 {
		s.release(addr)
		if got := <-order; got != want {
			t.Fatalf("released request %d, want %d", got, want)
		}
	}
}

// TestHeldLeavesTheLine: a held request whose client leaves leaves the line, and the
// next one gets the endpoint.
func TestHeldLeavesTheLine(t *testing.T) {
	r := &routes.Route{Name: "llm", URL: nil, ServiceName: "s", ServicePort: 80, Queue: "q", HoldTimeout: time.Minute}
	s := newRouteState(t.Context(), r, nopCounter{}, "s.ml.svc:80", newMetrics(nil))
	lim := holdLimits{maxHeld: 10, maxHeldBytes: 1 << 20}
	deadline := time.Now().Add(time.Minute)
	ctx, cancel := context.WithCancel(t.Context())
	gone := make(chan error, 1)
	go func() {
		_, err := s.acquire(ctx, 5, deadline, lim, func(int) {})
		gone <- err
	}()
	testkit.Eventually(t, 5*time.Second, func() bool { return s.heldNow() == 1 })
	cancel()
	if err := <-gone; err != errClientGone {
		t.Fatalf("got %v, want errClientGone", err)
	}
	s.mu.Lock()
	n, bytes := s.waiters.Len(), s.heldBytes
	s.mu.Unlock()
	if n != 0 || bytes != 0 {
		t.Errorf("got %d waiters and %d held bytes, want none", n, bytes)
	}
	s.setEndpoints([]string{"10.0.0.1:80"}, false)
	if addr, err := s.acquire(t.Context(), 0, deadline, lim, func(int) {}); err != nil || addr != "s.ml.svc:80" {
		t.Errorf("got %q, %v, want the Service's address", addr, err)
	}
}

// TestLeastInFlightFirst: with concurrency, each request goes to the ready endpoint with
// the fewest in flight, and what exceeds concurrency × endpoints is held.
func TestLeastInFlightFirst(t *testing.T) {
	r := &routes.Route{Name: "llm", ServiceName: "s", ServicePort: 80, Queue: "q", HoldTimeout: time.Minute, Concurrency: 2}
	s := newRouteState(t.Context(), r, nopCounter{}, "", newMetrics(nil))
	s.setEndpoints([]string{"a:80", "b:80"}, false)
	s.mu.Lock()
	defer s.mu.Unlock()
	var got []string
	for range 5 {
		addr, ok := s.tryAcquireLocked()
		if !ok {
			break
		}
		got = append(got, addr)
	}
	if want := []string{"a:80", "b:80", "a:80", "b:80"}; len(got) != len(want) || got[0] != want[0] || got[1] != want[1] || got[2] != want[2] || got[3] != want[3] {
		t.Errorf("got %q, want %q and then nothing (2 endpoints × concurrency 2)", got, want)
	}
}
