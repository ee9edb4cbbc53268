package queue

import (
	"testing"
	"time"

	"github.com/gpuscaler/gpuscaler/internal/natstest"

	"github.com/nats-io/nats.go"

	gpuscalerv1 "github.com/gpuscaler/gpuscaler/proto/gpuscaler/v1"
	"github.com/gpuscaler/gpuscaler/test/testkit"
)

// newReporter starts a Reporter for ns/q on nc and closes it at cleanup.
func newReporter(t testing.TB, nc *nats.Conn, ns, q string, cfg Config) *Reporter {
	t.Helper()
	if cfg.Log == nil {
		cfg.Log = testkit.Logger(t)
	}
	r, err := NewReporter(nc, ns, q, cfg)
	if err != nil {
		t.Fatalf("NewReporter: %v", err)
	}
	t.Cleanup(func() { _ = r.Close() })
	return r
}

// reportStream is a core NATS subscription to one queue's reports.
type reportStream struct {
	t    *testing.T
	msgs chan *nats.Msg
}

// subscribe subscribes to the subjects of every producer of ns/q on its own connection
// to url, and returns once the server has the subscription, so no report published
// afterwards is missed.
func subscribe(t *testing.T, url, ns, q string) *reportStream {
	t.Helper()
	if _, err := gpuscalerv1.QueueSubject(ns, q, "p"); err != nil {
		t.Fatal(err)
	}
	subject := gpuscalerv1.QueueSubjectPrefix + ns + "." + q + ".*"
	nc := natstest.Connect(t, url)
	s := &reportStream{t: t, msgs: make(chan *nats.Msg, 1<<16)}
	sub, err := nc.ChanSubscribe(subject, s.msgs)
	if err != nil {
		t.Fatalf("subscribe %s: %v", subject, err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	if err := nc.FlushTimeout(5 * time.Second); err != nil {
		t.Fatalf("flush subscription: %v", err)
	}
	return s
}

// next returns the next report, failing the test if none comes within 10s.
func (s *reportStream) next() *gpuscalerv1.QueueReport {
	s.t.Helper()
	select {
	case m := <-s.msgs:
		ev, err := gpuscalerv1.Decode(m.Subject, m.Data)
		if err != nil {
			s.t.Fatalf("report on %s: %v", m.Subject, err)
		}
		return ev.Queue
	case <-time.After(10 * time.Second):
		s.t.Fatal("no report within 10s")
		return nil
	}
}

// until reads reports until one satisfies cond, and returns them all, that one last. It
// fails the test if none does within 20s.
func (s *reportStream) until(cond func(*gpuscalerv1.QueueReport) bool) []*gpuscalerv1.QueueReport {
	s.t.Helper()
	var got []*gpuscalerv1.QueueReport
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		r := s.next()
		got = append(got, r)
		if cond(r) {
			return got
		}
	}
	s.t.Fatalf("no wanted report within 20s; the last of %d was %v", len(got), got[len(got)-1])
	return nil
}
