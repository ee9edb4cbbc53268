package testkit

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"
)

// Condition is what Eventually waits for: a func() bool, or a func(ctx) error whose error
// says why it does not hold yet. ctx ends at the deadline, so a condition that calls an
// API never outlives the wait.
type Condition interface {
	func() bool | func(ctx context.Context) error
}

// Eventually polls cond until it holds, and fails the test if it does not hold within
// timeout. The failure names the wait (the caller's source line) and, for a func(ctx)
// error, the last reason cond gave. Polls start every 5 ms and back off to every 100 ms,
// so a quick condition is seen quickly and a slow one (an API server) is not hammered.
func Eventually[C Condition](t testing.TB, timeout time.Duration, cond C) {
	t.Helper()
	check := conditionFunc(cond)
	parent := t.Context()
	if parent.Err() != nil {
		parent = context.Background() // in a t.Cleanup, where the test's context has ended
	}
	ctx, cancel := context.WithTimeout(parent, timeout)
	defer cancel()
	var last error
	for interval := 5 * time.Millisecond; ; interval = min(2*interval, 100*time.Millisecond) {
		err := check(ctx)
		if err == nil {
			return
		}
		if last == nil || ctx.Err() == nil || !errors.Is(err, ctx.Err()) {
			last = err // a call cut off by the deadline says less than the reason before it
		}
		select {
		case <-ctx.Done():
			t.Fatalf("waited %s for %s\n  last: %v", timeout, caller(2), last)
			return
		case <-time.After(interval):
		}
	}
}

// errFalse is a func() bool condition's reason: it names nothing more than the wait.
var errFalse = errors.New("the condition was false")

func conditionFunc[C Condition](cond C) func(context.Context) error {
	switch c := any(cond).(type) {
	case func() bool:
		return func(context.Context) error {
			if c() {
				return nil
			}
			return errFalse
		}
	case func(context.Context) error:
		return c
	}
	panic("unreachable: Condition has two types")
}

// caller describes the source line skip frames up: file:line, the comment lines just
// above the call (where a wait says what it is for), and the call itself up to where its
// parentheses close (three lines at most), so a failure says what it waited for.
func caller(skip int) string {
	_, file, line, ok := runtime.Caller(skip)
	if !ok {
		return "a condition"
	}
	where := fmt.Sprintf("%s:%d", file[strings.LastIndexByte(file, '/')+1:], line)
	src, err := os.ReadFile(file)
	if err != nil {
		return where // built with -trimpath, or moved: the place alone
	}
	lines := strings.Split(string(src), "\n")
	if line > len(lines) {
		return where
	}
	var intent []string
	for i := line - 2; i >= 0 && strings.HasPrefix(strings.TrimSpace(lines[i]), "//"); i-- {
		intent = append([]string{strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(lines[i]), "//"))}, intent...)
	}
	if len(intent) > 0 {
		where += " (" + strings.Join(intent, " ") + ")"
	}
	var call strings.Builder
	depth := 0
	for i := line - 1; i < len(lines) && i < line+2; i++ {
		text := strings.TrimSpace(lines[i])
		if call.Len() > 0 {
			call.WriteByte(' ')
		}
		call.WriteString(text)
		depth += strings.Count(text, "(") - strings.Count(text, ")")
		if depth <= 0 {
			break
		}
	}
	s := call.String()
	if len(s) > 240 {
		s = s[:240] + "…"
	}
	return where + ": " + s
}

// Check is a func(ctx) error condition's answer: nil when ok, else the reason, formatted
// as fmt.Errorf would (so `return testkit.Check(n == want, "%d Jobs", n)`).
func Check(ok bool, format string, args ...any) error {
	if ok {
		return nil
	}
	return fmt.Errorf(format, args...)
}
