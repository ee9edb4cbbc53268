// Package testkit holds the helpers every gpuscaler test suite shares, in the main module
// and in the test modules: waiting for a condition with a deadline and a reason (never
// sleeping a fixed time and hoping), running a server until it is ready and stopping it
// cleanly, a test CA, and a buffer a command may write while a test reads it. It is a
// module of its own that needs the standard library only, so requiring it lifts no
// dependency. Only tests, and test helpers such as scaler/scalertest, import it.
package testkit

import (
	"bytes"
	"net"
	"sync"
	"testing"
)

// SyncBuffer is a bytes.Buffer safe for concurrent writers and readers.
type SyncBuffer struct {
	mu sync.Mutex // guards b
	b  bytes.Buffer
}

func (b *SyncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

// String returns everything written so far.
func (b *SyncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// FreeAddr returns a loopback address nothing listened on at the time of the call.
func FreeAddr(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}
