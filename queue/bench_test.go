package queue

import (
	"testing"

	"github.com/gpuscaler/gpuscaler/internal/natstest"
)

// benchReporter returns a Reporter publishing to a real embedded NATS server, as in use.
func benchReporter(b *testing.B) *Reporter {
	b.Helper()
	ns := natstest.Start(b, "", "")
	return newReporter(b, natstest.Connect(b, ns.ClientURL()).Conn, "ml", "jobs", Config{})
}

// BenchmarkEnqueued is the request path's cost of counting one arrival.
func BenchmarkEnqueued(b *testing.B) {
	r := benchReporter(b)
	b.ReportAllocs()
	for b.Loop() {
		r.Enqueued(1)
	}
}

// BenchmarkEnqueuedParallel counts arrivals from every CPU at once, all on one queue:
// the contended case.
func BenchmarkEnqueuedParallel(b *testing.B) {
	r := benchReporter(b)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			r.Enqueued(1)
		}
	})
}

// BenchmarkItemLifecycle is one item's whole life, Enqueued, Started and Finished, on a
// queue that empties after each: every op wakes the Reporter's goroutine, the most
// expensive path.
func BenchmarkItemLifecycle(b *testing.B) {
	r := benchReporter(b)
	b.ReportAllocs()
	for b.Loop() {
		r.Enqueued(1)
		r.Started(1)
		r.Finished(1)
	}
}

// BenchmarkItemLifecycleParallel is BenchmarkItemLifecycle from every CPU at once.
func BenchmarkItemLifecycleParallel(b *testing.B) {
	r := benchReporter(b)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			r.Enqueued(1)
			r.Started(1)
			r.Finished(1)
		}
	})
}
