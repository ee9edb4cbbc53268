// Package natstest starts the real NATS pieces tests need: an embedded server with
// JetStream on a loopback port, and connections to it.
package natstest

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/gpuscaler/gpuscaler/internal/embedded"
	"github.com/gpuscaler/gpuscaler/internal/natsconn"
	"github.com/gpuscaler/gpuscaler/test/testkit"
)

// Start starts an embedded NATS server with JetStream on addr (a random loopback port
// when empty), storing in dir (a fresh t.TempDir() when empty). It shuts down at cleanup.
func Start(t testing.TB, addr, dir string) *embedded.Server {
	t.Helper()
	if dir == "" {
		dir = t.TempDir()
	}
	ns, err := embedded.Start(embedded.Options{Addr: addr, StoreDir: dir, Log: testkit.Logger(t)})
	if err != nil {
		t.Fatalf("start NATS: %v", err)
	}
	t.Cleanup(ns.Shutdown)
	return ns
}

// StartConfig starts an embedded NATS server on a free loopback port with the
// nats-server configuration text config (accounts, authorization) and a temporary store,
// and shuts it down at cleanup.
func StartConfig(t testing.TB, config string) *embedded.Server {
	t.Helper()
	ns, err := embedded.Start(embedded.Options{StoreDir: t.TempDir(), Log: testkit.Logger(t), Config: config})
	if err != nil {
		t.Fatalf("start NATS: %v", err)
	}
	t.Cleanup(ns.Shutdown)
	return ns
}

// Connect connects to url as a long-running part does, reconnecting forever, and
// closes the connection at cleanup.
func Connect(t testing.TB, url string) *natsconn.Conn {
	t.Helper()
	nc, err := natsconn.Connect(t.Context(), natsconn.Options{URLs: url, RetryInitialConnect: true, Log: testkit.Logger(t)})
	if err != nil {
		t.Fatalf("connect NATS: %v", err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// Subscribe subscribes nc to subject and returns its messages (up to 4096 unread), once
// the server has the subscription, so no message published afterwards is missed. It
// unsubscribes at cleanup.
func Subscribe(t testing.TB, nc *nats.Conn, subject string) <-chan *nats.Msg {
	t.Helper()
	msgs := make(chan *nats.Msg, 4096)
	sub, err := nc.ChanSubscribe(subject, msgs)
	if err != nil {
		t.Fatalf("subscribe %s: %v", subject, err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	if err := nc.FlushTimeout(5 * time.Second); err != nil {
		t.Fatalf("flush the subscription to %s: %v", subject, err)
	}
	return msgs
}
