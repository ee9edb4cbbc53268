package scaler

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/gpuscaler/gpuscaler/internal/natstest"
	"github.com/gpuscaler/gpuscaler/test/testkit"
)

// TestConnStatusFollowsAPlainConn checks the ConnHealth a scaler built over a plain
// *nats.Conn uses: no problem while connected, then a problem and a growing DownFor once
// the server is gone.
func TestConnStatusFollowsAPlainConn(t *testing.T) {
	ns := natstest.Start(t, testkit.FreeAddr(t), "")
	nc, err := nats.Connect(ns.ClientURL(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatalf("connect NATS: %v", err)
	}
	t.Cleanup(nc.Close)
	c := &connStatus{nc: nc}
	if down, problem := c.DownFor(), c.Problem(); down != 0 || problem != nil {
		t.Fatalf("connected: got DownFor %s and Problem %v, want 0 and nil", down, problem)
	}
	ns.Shutdown()
	testkit.Eventually(t, 5*time.Second, func() bool { return c.Problem() != nil })
	first := c.DownFor()
	testkit.Eventually(t, 5*time.Second, func() bool { return c.DownFor() > first })
	t.Logf("problem: %v", c.Problem())
	if err := c.Explain(nats.ErrTimeout); err != nats.ErrTimeout {
		t.Errorf("Explain(%v) = %v, want it unchanged", nats.ErrTimeout, err)
	}
}
