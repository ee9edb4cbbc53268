package scaler

import (
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
)

// ConnHealth tells the scaler what a *nats.Conn does not: for how long the connection
// has been down, and why. The scaler's readiness fails once NATS has been down longer
// than Config.StaleAfter, and errors of operations that ran out of time while it was
// down say why it was. gpuscaler's own connection provides it; a program with a plain
// *nats.Conn may leave Config.NATSHealth nil.
type ConnHealth interface {
	// DownFor returns how long the connection has been down, 0 while it is connected.
	DownFor() time.Duration
	// Problem says why the connection is down, or nil while it is up.
	Problem() error
	// Explain returns err, from an operation on NATS, with the reason NATS cannot be
	// reached in front where that is why it failed; other errors as they are.
	Explain(err error) error
}

// connStatus is the ConnHealth of a plain *nats.Conn: down since the scaler first saw it
// so (the scaler looks every second), the reason nats.go's last error.
type connStatus struct {
	nc *nats.Conn

	mu        sync.Mutex // guards downSince
	downSince time.Time  // zero while connected, or not seen down yet
}

func (c *connStatus) DownFor() time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.nc.IsConnected() {
		c.downSince = time.Time{}
		return 0
	}
	if c.downSince.IsZero() {
		c.downSince = time.Now()
	}
	return time.Since(c.downSince)
}

func (c *connStatus) Problem() error {
	if c.nc.IsConnected() {
		return nil
	}
	if err := c.nc.LastError(); err != nil {
		return fmt.Errorf("not connected to NATS (%s): %w", c.nc.Status(), err)
	}
	return fmt.Errorf("not connected to NATS (%s)", c.nc.Status())
}

func (c *connStatus) Explain(err error) error { return err }
