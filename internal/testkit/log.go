package testkit

import (
	"log/slog"
	"os"
	"testing"
)

// Logger logs to stderr at debug level when the test runs with -v, and discards otherwise.
func Logger(t testing.TB) *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug})).With("test", t.Name())
	}
	return slog.New(slog.DiscardHandler)
}
