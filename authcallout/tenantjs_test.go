package authcallout

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/gpuscaler/gpuscaler/internal/natsconn"
	gpuscalerv1 "github.com/gpuscaler/gpuscaler/proto/gpuscaler/v1"
	"github.com/gpuscaler/gpuscaler/test/testkit"
)

// TestTenantJetStream: a namespace listed for JetStream keeps a work queue in an account
// of its own, which the scaler reads through its import of the account's consumer info,
// and no other tenant sees, touches or reaches from it; nor can it reach another account
// but through its own queue subjects.
func TestTenantJetStream(t *testing.T) {
	b := startBus(t, busOptions{jetStreamNamespaces: []string{"team-a", "team-b"}})
	ctx := t.Context()
	scaler, _ := b.mustConnect(t, natsconn.Options{Name: "scaler", Token: b.token(t, scalerSA)})
	a, aErrs := b.mustConnect(t, natsconn.Options{Name: "team-a", Token: b.token(t, tenantA)})
	bConn, _ := b.mustConnect(t, natsconn.Options{Name: "team-b", Token: b.token(t, tenantB)})

	// Team a's work queue, in its own account, as examples/training-queue makes it.
	ajs, err := jetstream.New(a.Conn)
	if err != nil {
		t.Fatal(err)
	}
	stream, err := ajs.CreateStream(ctx, jetstream.StreamConfig{Name: "TRAINING", Subjects: []string{"training.jobs"}, Retention: jetstream.WorkQueuePolicy})
	if err != nil {
		t.Fatalf("a producer of a JetStream namespace cannot create a stream in its account: %v", err)
	}
	if _, err := stream.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "trainers", AckPolicy: jetstream.AckExplicitPolicy}); err != nil {
		t.Fatalf("create consumer: %v", err)
	}
	for range 3 {
		if _, err := ajs.Publish(ctx, "training.jobs", []byte("job")); err != nil {
			t.Fatal(err)
		}
	}

	consumerInfo := func(t *testing.T, namespace string) (*jetstream.ConsumerInfo, error) {
		t.Helper()
		api, err := gpuscalerv1.TenantJetStreamAPI(namespace)
		if err != nil {
			t.Fatal(err)
		}
		js, err := jetstream.NewWithAPIPrefix(scaler.Conn, api)
		if err != nil {
			t.Fatal(err)
		}
		short, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		c, err := js.Consumer(short, "TRAINING", "trainers")
		if err != nil {
			return nil, err
		}
		return c.CachedInfo(), nil
	}

	t.Run("the scaler reads the consumer through its namespace's prefix", func(t *testing.T) {
		// A publish is acknowledged once the stream stores it; the consumer counts it
		// pending a moment later (nats-server signals its consumers after the store),
		// which under load can be after the acknowledgement has come back.
		testkit.Eventually(t, 5*time.Second, func(context.Context) error {
			info, err := consumerInfo(t, "team-a")
			if err != nil {
				return fmt.Errorf("consumer info through %s: %w", "team-a", err)
			}
			return testkit.Check(info.NumPending == 3, "got %d pending, want the 3 published", info.NumPending)
		})
	})
	t.Run("another namespace's prefix finds no such stream", func(t *testing.T) {
		if _, err := consumerInfo(t, "team-b"); !errors.Is(err, jetstream.ErrStreamNotFound) {
			t.Fatalf("got %v through team-b's prefix, want stream not found", err)
		}
		// Nor does the scaler's own account hold it.
		js, _ := jetstream.New(scaler.Conn)
		if _, err := js.Consumer(ctx, "TRAINING", "trainers"); !errors.Is(err, jetstream.ErrStreamNotFound) {
			t.Fatalf("got %v in the scaler's account, want stream not found", err)
		}
	})
	t.Run("another tenant neither sees nor touches it", func(t *testing.T) {
		bjs, err := jetstream.New(bConn.Conn)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := bjs.Stream(ctx, "TRAINING"); !errors.Is(err, jetstream.ErrStreamNotFound) {
			t.Fatalf("team-b looked up TRAINING: %v, want stream not found", err)
		}
		if err := bjs.DeleteStream(ctx, "TRAINING"); !errors.Is(err, jetstream.ErrStreamNotFound) {
			t.Fatalf("team-b deleted TRAINING: %v, want stream not found", err)
		}
		if err := bConn.Publish("training.jobs", []byte("not a's")); err != nil {
			t.Fatal(err)
		}
		// Team a's own stream is where team b could reach it, if anywhere: that API
		// belongs to team a's account, imported by the scaler's alone.
		api, _ := gpuscalerv1.TenantJetStreamAPI("team-a")
		if _, err := bConn.Request(api+".CONSUMER.INFO.TRAINING.trainers", nil, 500*time.Millisecond); !errors.Is(err, nats.ErrNoResponders) {
			t.Fatalf("team-b asked for team-a's consumer info through the scaler's prefix: %v, want no responders", err)
		}
		if err := bConn.Flush(); err != nil {
			t.Fatal(err)
		}
		info, err := stream.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if info.State.Msgs != 3 {
			t.Fatalf("TRAINING holds %d messages, want team-a's 3", info.State.Msgs)
		}
	})
	t.Run("nothing published inside reaches another account but its own queue subjects", func(t *testing.T) {
		reports, others := subscribeAll(t, scaler.Conn), subscribeAll(t, bConn.Conn)
		api, _ := gpuscalerv1.TenantJetStreamAPI("team-b")
		attempts := []string{
			"gpuscaler.v1.queue.team-b.jobs.p", // another namespace's queue
			"gpuscaler.v1.queue.team-a.jobs.p.deeper",
			"gpuscaler.v1.queue.team-a",
			"gpuscaler.v1.node.node-a",
			"$JS.API.STREAM.PURGE." + gpuscalerv1.StreamName, // its own account's API
			"$JS.API.STREAM.DELETE.TRAINING",                 // its own, and stays its own
			api + ".CONSUMER.INFO.TRAINING.trainers",
			"training.jobs",
			"_INBOX.x",
			"_R_.x.y", // where a service import's replies are mapped
			"$SYS.REQ.USER.AUTH",
			"gpuscaler.v1.queue.team-a.jobs.p", // its own queue: this one arrives
		}
		for _, s := range attempts {
			if s == "$JS.API.STREAM.DELETE.TRAINING" {
				continue // keep the stream for the checks below
			}
			if err := a.Publish(s, []byte("x")); err != nil {
				t.Fatal(err)
			}
		}
		if err := a.Flush(); err != nil {
			t.Fatal(err)
		}
		m, err := next(reports, 5*time.Second)
		if err != nil || m.Subject != "gpuscaler.v1.queue.team-a.jobs.p" {
			t.Fatalf("the scaler's account got %v (%v), want team-a's own queue report first", m, err)
		}
		if m, err := next(reports, 300*time.Millisecond); err == nil {
			t.Fatalf("the scaler's account got %s from inside team-a's account", m.Subject)
		}
		if m, err := nextNotOwn(others, 300*time.Millisecond, "team-b"); err == nil {
			t.Fatalf("team-b's account got %s from inside team-a's account: %s", m.Subject, m.Data)
		}
		if s := aErrs.String(); testkit.CountLines(s, "Violation") != 0 {
			t.Fatalf("team-a was refused inside its own account: %s", s)
		}
	})
	t.Run("a tenant answering the scaler's requests answers for itself alone", func(t *testing.T) {
		// Team a may subscribe to its own account's JetStream API and answer the
		// scaler's consumer info requests there itself: its own triggers then read what
		// it says, as they read what it publishes. The answers go back to the request
		// alone; team b's consumer info is still its own account's.
		forged, err := a.Subscribe("$JS.API.CONSUMER.INFO.>", func(m *nats.Msg) {
			m.Respond([]byte(`{"type":"io.nats.jetstream.api.v1.consumer_info_response","stream_name":"TRAINING","name":"trainers","num_pending":1000000}`))
		})
		if err != nil {
			t.Fatal(err)
		}
		defer forged.Unsubscribe()
		if err := a.Flush(); err != nil {
			t.Fatal(err)
		}
		audits := subscribe(t, bConn.Conn, "$JS.EVENT.ADVISORY.API")
		if _, err := consumerInfo(t, "team-b"); !errors.Is(err, jetstream.ErrStreamNotFound) {
			t.Fatalf("got %v through team-b's prefix while team-a answers its own, want stream not found", err)
		}
		// The server audits that request in team-b's account after answering it: wait for
		// the audit, so that it is not read below as coming from team-a's.
		if _, err := next(audits, 5*time.Second); err != nil {
			t.Fatalf("no audit of the scaler's request in team-b's account: %v", err)
		}
		// (Team b sees the scaler's requests to its own account, not team a's.)
		others := subscribeAll(t, bConn.Conn)
		if _, err := consumerInfo(t, "team-a"); err != nil {
			t.Fatalf("consumer info through team-a's prefix: %v", err)
		}
		if m, err := next(others, 300*time.Millisecond); err == nil {
			t.Fatalf("team-b's account got %s while team-a answered the scaler", m.Subject)
		}
	})
	t.Run("the server's monitoring answers it about its own account alone", func(t *testing.T) {
		// An account may ask the server about its own connections (nats-server imports
		// these into every account); the answer lists team-a's connection and no other.
		for _, subject := range []string{"$SYS.REQ.SERVER.PING.CONNZ", "$SYS.REQ.ACCOUNT.PING.CONNZ"} {
			m, err := a.Request(subject, []byte(`{}`), 2*time.Second)
			if err != nil {
				t.Fatalf("%s: %v", subject, err)
			}
			if !strings.Contains(string(m.Data), `"name":"team-a"`) {
				t.Errorf("%s: got no team-a connection in\n%s", subject, m.Data)
			}
			for _, other := range []string{`"name":"scaler"`, `"name":"team-b"`, "GPUSCALER_NS_team-b", `"account":"GPUSCALER"`} {
				if strings.Contains(string(m.Data), other) {
					t.Errorf("%s answered team-a with %s:\n%s", subject, other, m.Data)
				}
			}
		}
	})
	t.Run("its JetStream is bounded by the account's limits", func(t *testing.T) {
		bjs, err := jetstream.New(bConn.Conn)
		if err != nil {
			t.Fatal(err)
		}
		n := DefaultTenantJetStream.MaxStreams
		for i := range n {
			if _, err := bjs.CreateStream(ctx, jetstream.StreamConfig{Name: fmt.Sprintf("S%d", i), Subjects: []string{fmt.Sprintf("s.%d", i)}}); err != nil {
				t.Fatalf("stream %d of %d: %v", i+1, n, err)
			}
		}
		if _, err := bjs.CreateStream(ctx, jetstream.StreamConfig{Name: "ONE_MORE", Subjects: []string{"s.more"}}); err == nil || !strings.Contains(err.Error(), "maximum number of streams") {
			t.Fatalf("stream %d: %v, want the account's maximum number of streams", n+1, err)
		}
		if _, err := bjs.CreateStream(ctx, jetstream.StreamConfig{Name: "S0", Subjects: []string{"s.0"}, MaxBytes: 2 * DefaultTenantJetStream.MaxFile}); err == nil {
			t.Fatal("a stream larger than the account's store")
		}
	})
	t.Run("a namespace not listed has no JetStream", func(t *testing.T) {
		c, cErrs := b.mustConnect(t, natsconn.Options{Name: "team-c", Token: b.token(t, serviceAccount("team-c", "inference", "", "", ""))})
		if err := c.Publish("$JS.API.INFO", nil); err != nil {
			t.Fatal(err)
		}
		c.Flush()
		cErrs.waitFor(t, `Permissions Violation for Publish to \"$JS.API.INFO\"`)
	})
}

// subscribeAll subscribes nc to everything its account carries, once the server has
// the subscription.
func subscribeAll(t *testing.T, nc *nats.Conn) *nats.Subscription {
	t.Helper()
	return subscribe(t, nc, ">")
}

// subscribe subscribes nc to subject, and returns once the server has the subscription.
func subscribe(t *testing.T, nc *nats.Conn, subject string) *nats.Subscription {
	t.Helper()
	sub, err := nc.SubscribeSync(subject)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sub.Unsubscribe() })
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return sub
}

// nextNotOwn is next, passing over the JetStream API audits of requests made by the
// connection named own in its own account (nats-server's sendAPIResponse and
// sendAPIErrResponse audit a request after answering it, so the audit of a request
// made before a subscription can arrive after it). An audit names the requesting
// client: {"client": {"acc": "GPUSCALER_NS_team-b", "name": "team-b", ...}, ...}.
func nextNotOwn(sub *nats.Subscription, d time.Duration, own string) (*nats.Msg, error) {
	deadline := time.Now().Add(d)
	for {
		m, err := next(sub, time.Until(deadline))
		if err != nil {
			return nil, err
		}
		var audit struct {
			Client struct {
				Name string `json:"name"`
			} `json:"client"`
		}
		if m.Subject == "$JS.EVENT.ADVISORY.API" && json.Unmarshal(m.Data, &audit) == nil && audit.Client.Name == own {
			continue
		}
		return m, nil
	}
}
