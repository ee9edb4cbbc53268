package testkit

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// failed records what a helper reported, so these tests can check a failure's message
// without failing themselves.
type failed struct {
	testing.TB
	msg string
}

func (f *failed) Fatalf(format string, args ...any) {
	f.msg = sprintf(format, args...)
	panic(f) // Fatalf must not return; the test recovers it
}

func (f *failed) Errorf(format string, args ...any) { f.msg = sprintf(format, args...) }

func (f *failed) Helper() {}

func catch(t *testing.T, fn func(tb testing.TB)) string {
	t.Helper()
	f := &failed{TB: t}
	func() {
		defer func() {
			if r := recover(); r != nil && r != any(f) {
				panic(r)
			}
		}()
		fn(f)
	}()
	return f.msg
}

func TestEventuallyReturnsOnceTheConditionHolds(t *testing.T) {
	var n atomic.Int32
	msg := catch(t, func(tb testing.TB) {
		Eventually(tb, 5*time.Second, func() bool { return n.Add(1) == 3 })
	})
	if msg != "" || n.Load() != 3 {
		t.Fatalf("got failure %q after %d polls, want none after 3", msg, n.Load())
	}
}

// TestEventuallySaysWhatAndWhy: a failure names the wait by its source line and the
// comment above it, and gives the condition's last reason; the reason a call cut off by the deadline gives (context
// deadline exceeded) does not hide the one before it.
func TestEventuallySaysWhatAndWhy(t *testing.T) {
	msg := catch(t, func(tb testing.TB) {
		// The backlog reaches 8.
		Eventually(tb, 50*time.Millisecond, func(ctx context.Context) error {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(time.Millisecond):
				return errors.New("backlog 3, want 8")
			}
		})
	})
	for _, want := range []string{"waited 50ms for wait_test.go:", "(The backlog reaches 8.): Eventually(tb, 50*time.Millisecond, func(ctx context.Context) error {", "last: backlog 3, want 8"} {
		if !strings.Contains(msg, want) {
			t.Errorf("failure %q does not contain %q", msg, want)
		}
	}
	msg = catch(t, func(tb testing.TB) { Eventually(tb, 20*time.Millisecond, func() bool { return false }) })
	if !strings.Contains(msg, "func() bool { return false }") || !strings.Contains(msg, errFalse.Error()) {
		t.Errorf("failure %q names neither the condition nor that it was false", msg)
	}
}

func TestStart(t *testing.T) {
	ready := make(chan struct{})
	var stoppedClean atomic.Bool
	stop := Start(t, "server", 5*time.Second, ready, func(ctx context.Context) error {
		close(ready)
		<-ctx.Done()
		stoppedClean.Store(true)
		return nil
	})
	stop()
	stop() // again: nothing
	if !stoppedClean.Load() {
		t.Fatal("stop returned before run did")
	}

	msg := catch(t, func(tb testing.TB) {
		Start(tb, "broken", 5*time.Second, make(chan struct{}), func(context.Context) error { return errors.New("port in use") })
	})
	if !strings.Contains(msg, "broken stopped before it was ready: port in use") {
		t.Errorf("a server that fails at start: got %q", msg)
	}
	msg = catch(t, func(tb testing.TB) {
		stop := Start(tb, "dirty", 5*time.Second, closed(), func(ctx context.Context) error { <-ctx.Done(); return errors.New("lost data") })
		stop()
	})
	if !strings.Contains(msg, "dirty returned lost data, want nil on a clean stop") {
		t.Errorf("a server that stops dirty: got %q", msg)
	}
}

func closed() chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}

var sprintf = fmt.Sprintf

func TestCheck(t *testing.T) {
	if err := Check(true, "%d Jobs", 3); err != nil {
		t.Errorf("Check(true) = %v, want nil", err)
	}
	if err := Check(false, "%d Jobs", 3); err == nil || err.Error() != "3 Jobs" {
		t.Errorf("Check(false) = %v, want the reason 3 Jobs", err)
	}
}

// TestEventuallyInCleanup: in a t.Cleanup the test's context has ended; a wait there
// still waits rather than fail at once.
func TestEventuallyInCleanup(t *testing.T) {
	t.Run("sub", func(t *testing.T) {
		var n atomic.Int32
		t.Cleanup(func() {
			Eventually(t, 5*time.Second, func() bool { return n.Add(1) == 3 })
		})
	})
}
