package testkit

import (
	"context"
	"sync"
	"testing"
	"time"
)

// StopTimeout is how long a server started by Start has to return once its context ends.
const StopTimeout = 10 * time.Second

// Start runs a server the way its binary would: run(ctx) in a goroutine until ctx ends.
// It waits until ready is closed, failing the test if run returns first or ready does not
// close within timeout; with a nil ready (a server the test expects never to be ready,
// say without its NATS) it returns at once. The returned stop (also called at cleanup;
// calling it again, from any goroutine, does nothing) ends ctx and fails the test unless
// run returns nil within StopTimeout: a server that stops dirty or hangs on a clean stop
// is a defect worth a failure.
func Start(t testing.TB, name string, timeout time.Duration, ready <-chan struct{}, run func(ctx context.Context) error) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx) }()
	var once sync.Once
	stop = func() {
		t.Helper()
		once.Do(func() { stopAndWait(t, name, cancel, done) })
	}
	t.Cleanup(stop)
	if ready == nil {
		return stop
	}
	select {
	case <-ready:
		return stop
	case err := <-done:
		once.Do(cancel) // run has returned: nothing to wait for at stop
		t.Fatalf("%s stopped before it was ready: %v", name, err)
	case <-time.After(timeout):
		t.Fatalf("%s not ready within %s", name, timeout)
	}
	return stop
}

// stopAndWait ends run's context and fails the test unless run returns nil within
// StopTimeout.
func stopAndWait(t testing.TB, name string, cancel context.CancelFunc, done <-chan error) {
	t.Helper()
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("%s returned %v, want nil on a clean stop", name, err)
		}
	case <-time.After(StopTimeout):
		t.Errorf("%s did not stop within %s", name, StopTimeout)
	}
}
