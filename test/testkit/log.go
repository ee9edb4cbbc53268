package testkit

import (
	"log/slog"
	"os"
	"strings"
	"testing"
)

// Logger logs to stderr at debug level when the test runs with -v, and discards otherwise.
func Logger(t testing.TB) *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug})).With("test", t.Name())
	}
	return slog.New(slog.DiscardHandler)
}

// BufferLogger returns a logger writing text lines into the returned buffer.
func BufferLogger() (*slog.Logger, *SyncBuffer) {
	b := &SyncBuffer{}
	return slog.New(slog.NewTextHandler(b, nil)), b
}

// CountLines counts the lines of text that contain s.
func CountLines(text, s string) int {
	n := 0
	for line := range strings.SplitSeq(text, "\n") {
		if strings.Contains(line, s) {
			n++
		}
	}
	return n
}
