package authcallout

import (
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/gpuscaler/gpuscaler/internal/natsconn"
)

// BenchmarkReportRoundTrip times one report from a producer to the scaler's
// subscription, one at a time, on an open bus and on one the callout guards: what the
// server's permission checks add to the activation path (the bench's end-to-end figure
// is too noisy on a shared 2-core machine to see a difference this small).
func BenchmarkReportRoundTrip(b *testing.B) {
	const subject = "gpuscaler.v1.queue.team-a.jobs.p"
	run := func(b *testing.B, producer, scaler *nats.Conn) {
		sub, err := scaler.SubscribeSync(subject)
		if err != nil {
			b.Fatal(err)
		}
		if err := scaler.Flush(); err != nil {
			b.Fatal(err)
		}
		data := make([]byte, 64)
		b.ResetTimer()
		for b.Loop() {
			if err := producer.Publish(subject, data); err != nil {
				b.Fatal(err)
			}
			if _, err := sub.NextMsg(5 * time.Second); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.Run("open", func(b *testing.B) {
		opts := &server.Options{Host: "127.0.0.1", Port: -1, NoLog: true, NoSigs: true}
		srv, err := server.NewServer(opts)
		if err != nil {
			b.Fatal(err)
		}
		srv.Start()
		defer srv.Shutdown()
		if !srv.ReadyForConnections(10 * time.Second) {
			b.Fatal("not ready")
		}
		p, err := nats.Connect(srv.ClientURL())
		if err != nil {
			b.Fatal(err)
		}
		defer p.Close()
		s, err := nats.Connect(srv.ClientURL())
		if err != nil {
			b.Fatal(err)
		}
		defer s.Close()
		run(b, p, s)
	})
	b.Run("callout", func(b *testing.B) {
		bus := startBus(b, busOptions{})
		p, _ := bus.mustConnect(b, natsconn.Options{Name: "producer", Token: bus.token(b, tenantA)})
		s, _ := bus.mustConnect(b, natsconn.Options{Name: "scaler", Token: bus.token(b, scalerSA)})
		run(b, p.Conn, s.Conn)
	})
}
