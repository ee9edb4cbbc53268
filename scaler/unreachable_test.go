package scaler

import (
	"context"
	"errors"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/gpuscaler/gpuscaler/internal/natsconn"
	"github.com/gpuscaler/gpuscaler/internal/natstest"
	"github.com/gpuscaler/gpuscaler/test/testkit"
)

// TestUnreachableNATSIsNamed runs a scaler whose NATS URL has nothing listening (a port
// listened on, then closed): /readyz must say at once where it tries and why it cannot,
// and not only that the scaler is restoring its state.
func TestUnreachableNATSIsNamed(t *testing.T) {
	url := "nats://" + testkit.FreeAddr(t)
	s := newScaler(t, url, Config{})
	var err error
	testkit.Eventually(t, 10*time.Second, func() bool {
		err = s.readiness()
		return err != nil && errors.Is(err, syscall.ECONNREFUSED)
	})
	for _, want := range []string{"restoring its state", "not connected to NATS at " + url, "nothing listens there", "connection refused"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("readiness: got %q, want it to contain %q", err, want)
		}
	}
}

// TestFollowExplainsATimeout: setting up the stream while nothing answers runs out of
// time; the error the follower logs and readiness reports names the URL and the cause
// rather than only "context deadline exceeded".
func TestFollowExplainsATimeout(t *testing.T) {
	url := "nats://" + testkit.FreeAddr(t)
	nc := natstest.Connect(t, url)
	testkit.Eventually(t, 10*time.Second, func() bool { return errors.Is(nc.Problem(), syscall.ECONNREFUSED) })
	js, err := jetstream.New(nc.Conn)
	if err != nil {
		t.Fatal(err)
	}
	f := &follower{js: js, stream: StreamConfig{}.withDefaults().nodeStream(), clock: &natsClock{local: time.Now}, log: testkit.Logger(t), explain: nc.Explain}
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	err = f.follow(ctx)
	if !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, natsconn.ErrNotConnected) {
		t.Fatalf("got %v, want a deadline exceeded explained as NATS not connected", err)
	}
	for _, want := range []string{"not connected to NATS at " + url, "connection refused", "create or update stream GPUSCALER: context deadline exceeded"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("got %q, want it to contain %q", err, want)
		}
	}
}

// TestWorkQueueErrorExplainsATimeout: a consumer's info fetched while nothing answers
// runs out of time; the Unavailable error KEDA gets names the URL and the cause.
func TestWorkQueueErrorExplainsATimeout(t *testing.T) {
	url := "nats://" + testkit.FreeAddr(t)
	nc := natstest.Connect(t, url)
	testkit.Eventually(t, 10*time.Second, func() bool { return errors.Is(nc.Problem(), syscall.ECONNREFUSED) })
	w := &workQueues{cfg: workQueueConfig{explain: nc.Explain}}
	err := w.describe(wqKey{stream: "JOBS", consumer: "workers"}, context.DeadlineExceeded)
	if !errors.Is(err, ErrUnavailable) || !errors.Is(err, natsconn.ErrNotConnected) {
		t.Fatalf("got %v, want Unavailable explained as NATS not connected", err)
	}
	for _, want := range []string{`stream "JOBS", consumer "workers"`, "not connected to NATS at " + url, "connection refused", "context deadline exceeded"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("got %q, want it to contain %q", err, want)
		}
	}
}
