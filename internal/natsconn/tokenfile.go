package natsconn

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"
)

// defaultTokenFileCheck is how often a token file is read for a change. The kubelet
// rewrites a projected token at 80% of its life (at least 10 minutes), so a change is
// seen minutes before the token expires.
const defaultTokenFileCheck = 10 * time.Second

// tokenFile is a token read from a file at every connect, and watched for a change.
type tokenFile struct {
	path string
	log  *slog.Logger

	mu   sync.Mutex // guards sent
	sent []byte     // the token given at the last connect
}

// newTokenFile checks that path holds a token now, so a missing mount fails at start with
// its name rather than as an authorization error from the server.
func newTokenFile(path string, log *slog.Logger) (*tokenFile, error) {
	tok, err := readToken(path)
	if err != nil {
		return nil, err
	}
	return &tokenFile{path: path, log: log, sent: tok}, nil
}

func readToken(path string) ([]byte, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("NATS token file: %w", err)
	}
	tok := bytes.TrimSpace(data)
	if len(tok) == 0 {
		return nil, fmt.Errorf("NATS token file %s is empty", path)
	}
	return tok, nil
}

// token is nats.go's TokenHandler: it runs at every connect and reconnect. When the file
// cannot be read it sends the token it sent last, and the server decides.
func (t *tokenFile) token() string {
	tok, err := readToken(t.path)
	t.mu.Lock()
	defer t.mu.Unlock()
	if err != nil {
		t.log.Warn("cannot read the NATS token file; connecting with the token read before", "err", err)
		return string(t.sent)
	}
	t.sent = tok
	return string(tok)
}

// changed reports whether the file now holds a token other than the one last sent.
func (t *tokenFile) changed() bool {
	tok, err := readToken(t.path)
	if err != nil {
		return false
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	return !bytes.Equal(tok, t.sent)
}

// watch reconnects c whenever the token file changes, until c is closed. It first
// flushes, so every publish made so far has reached the server; publishes made during the
// reconnect are buffered and sent once the server has admitted the new token.
func (t *tokenFile) watch(c *Conn, every time.Duration) {
	if every <= 0 {
		every = defaultTokenFileCheck
	}
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		select {
		case <-c.closed:
			return
		case <-tick.C:
		}
		if !c.IsConnected() || !t.changed() {
			continue // a reconnect in progress reads the file itself
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err := c.FlushWithContext(ctx)
		cancel()
		if err != nil {
			t.log.Warn("NATS token file changed; flush before reconnecting failed, reconnecting anyway", "err", err)
		}
		t.log.Info("NATS token file changed; reconnecting to authenticate with the new token", "file", t.path)
		if err := c.ForceReconnect(); err != nil {
			t.log.Warn("cannot reconnect with the new NATS token", "err", err)
		}
	}
}
