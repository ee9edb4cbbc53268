package queue_test

import (
	"fmt"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/gpuscaler/gpuscaler/internal/embedded"
	gpuscalerv1 "github.com/gpuscaler/gpuscaler/proto/gpuscaler/v1"
	"github.com/gpuscaler/gpuscaler/queue"
)

// A producer reports its queue as items arrive, start and finish: a report at start, one
// at once when the empty queue gets work, heartbeats every interval, and a last one from
// Close.
func ExampleReporter() {
	// A NATS server for the example to run against; in a cluster, the one the scaler reads.
	ns, err := embedded.Start(embedded.Options{})
	if err != nil {
		panic(err)
	}
	defer ns.Shutdown()
	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		panic(err)
	}
	defer nc.Close()

	// Watch this producer's subject of the queue. The scaler reads every producer's,
	// and sums the shares of the live ones.
	subject, _ := gpuscalerv1.QueueSubject("inference", "llm-requests", "gateway-0")
	sub, _ := nc.SubscribeSync(subject)
	_ = nc.Flush()

	r, err := queue.NewReporter(nc, "inference", "llm-requests", queue.Config{Interval: time.Minute, ProducerID: "gateway-0"})
	if err != nil {
		panic(err)
	}
	show(sub) // the first report, at start: the producer is there, its queue empty

	r.Enqueued(2) // two requests arrive: an empty queue is not, so this is reported at once
	show(sub)

	r.Started(1)                      // a worker takes one; the next heartbeat, or Close, reports it
	r.Dropped(1)                      // the other's client goes away before it starts: dropped, not completed
	if err := r.Close(); err != nil { // the last report says the producer stopped
		panic(err)
	}
	show(sub)
	// Output:
	// #1 waiting=0 in_flight=0 arrivals=0 dropped=0 stopped=false
	// #2 waiting=2 in_flight=0 arrivals=2 dropped=0 stopped=false
	// #3 waiting=0 in_flight=1 arrivals=0 dropped=1 stopped=true
}

// show prints the next report on sub.
func show(sub *nats.Subscription) {
	m, err := sub.NextMsg(5 * time.Second)
	if err != nil {
		panic(err)
	}
	ev, err := gpuscalerv1.Decode(m.Subject, m.Data)
	if err != nil {
		panic(err)
	}
	q := ev.Queue
	fmt.Printf("#%d waiting=%d in_flight=%d arrivals=%d dropped=%d stopped=%v\n",
		q.GetSequence(), q.GetWaiting(), q.GetInFlight(), q.GetArrivals(), q.GetDropped(), q.GetStopped())
}
