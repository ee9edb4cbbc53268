package authcallout

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/crypto/bcrypt"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpuscaler/gpuscaler/internal/natsconn"
	gpuscalerv1 "github.com/gpuscaler/gpuscaler/proto/gpuscaler/v1"
	"github.com/gpuscaler/gpuscaler/test/testkit"
)

var (
	scalerSA   = serviceAccount("gpuscaler", "gpuscaler-scaler", "gpuscaler-scaler-7d9f", "uid-scaler", "node-a")
	collectorA = serviceAccount("gpuscaler", "gpuscaler-collector", "gpuscaler-collector-x1", "uid-col-a", "node-a")
	tenantA    = serviceAccount("team-a", "inference", "inference-0", "uid-a", "node-a")
	tenantB    = serviceAccount("team-b", "inference", "inference-0", "uid-b", "node-b")
	plainUser  = authUser("jane@example.com")
)

func authUser(name string) (u userInfo) { u.Username = name; return u }

// TestTenantsSpeakOnlyForThemselves runs the attacks of issue 10 against a real
// nats-server whose clients the callout admits: each is refused by the server, and the
// legitimate traffic next to it arrives.
func TestTenantsSpeakOnlyForThemselves(t *testing.T) {
	b := startBus(t, busOptions{})
	scaler, _ := b.mustConnect(t, natsconn.Options{Name: "scaler", Token: b.token(t, scalerSA)})
	reports, err := scaler.SubscribeSync(gpuscalerv1.SubjectAll)
	if err != nil {
		t.Fatal(err)
	}
	js, err := jetstream.New(scaler.Conn)
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	if _, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{Name: gpuscalerv1.StreamName, Subjects: []string{gpuscalerv1.SubjectAll}, MaxMsgsPerSubject: 1}); err != nil {
		t.Fatalf("the scaler cannot create its stream: %v", err)
	}
	if err := scaler.Flush(); err != nil {
		t.Fatal(err)
	}

	a, aErrs := b.mustConnect(t, natsconn.Options{Name: "tenant-a", Token: b.token(t, tenantA)})
	collector, colErrs := b.mustConnect(t, natsconn.Options{Name: "collector", Token: b.token(t, collectorA)})

	// expect checks that the scaler receives exactly the subjects in want, in order, and
	// nothing else, within a second of the last.
	expect := func(t *testing.T, want ...string) {
		t.Helper()
		for _, w := range want {
			m, err := next(reports, 5*time.Second)
			if err != nil {
				t.Fatalf("scaler: want a message on %s: %v", w, err)
			}
			if m.Subject != w {
				t.Fatalf("scaler got a message on %s, want %s: the bus let a forged report through", m.Subject, w)
			}
		}
		if m, err := next(reports, 300*time.Millisecond); err == nil {
			t.Fatalf("scaler got an unexpected message on %s: the bus let a forged report through", m.Subject)
		}
	}

	t.Run("a tenant in a publishes for b", func(t *testing.T) {
		for _, s := range []string{"gpuscaler.v1.queue.team-b.x.p", "gpuscaler.v1.queue.team-a", "gpuscaler.v1.queue.team-a.jobs", "gpuscaler.v1.queue.team-a.jobs.p.deeper", "gpuscaler.v1.node.node-a", "gpuscaler.v1.queue.team-b.x.y"} {
			if err := a.Publish(s, []byte("forged")); err != nil {
				t.Fatal(err)
			}
		}
		if err := a.Publish("gpuscaler.v1.queue.team-a.jobs.p", []byte("mine")); err != nil {
			t.Fatal(err)
		}
		if err := a.Flush(); err != nil {
			t.Fatal(err)
		}
		expect(t, "gpuscaler.v1.queue.team-a.jobs.p")
		aErrs.waitFor(t, `Permissions Violation for Publish to \"gpuscaler.v1.queue.team-b.x.p\"`)
	})
	t.Run("a collector publishes another node's report", func(t *testing.T) {
		for _, s := range []string{"gpuscaler.v1.node.node-b", "gpuscaler.v1.queue.gpuscaler.x", "gpuscaler.v1.node.node-a", "gpuscaler.v1.node.node-a.x"} {
			if err := collector.Publish(s, []byte("r")); err != nil {
				t.Fatal(err)
			}
		}
		if err := collector.Flush(); err != nil {
			t.Fatal(err)
		}
		expect(t, "gpuscaler.v1.node.node-a")
		colErrs.waitFor(t, `Permissions Violation for Publish to \"gpuscaler.v1.node.node-b\"`)
	})
	t.Run("a tenant reads the bus", func(t *testing.T) {
		for _, s := range []string{gpuscalerv1.SubjectAll, "gpuscaler.v1.queue.team-b.>", "_INBOX.>", ">"} {
			if _, err := a.SubscribeSync(s); err != nil {
				t.Fatal(err)
			}
			aErrs.waitFor(t, "Permissions Violation for Subscription to \\\""+s+"\\\"")
		}
	})
	t.Run("a tenant deletes or purges the stream", func(t *testing.T) {
		// Publish a report the attack would erase.
		if err := a.Publish("gpuscaler.v1.queue.team-a.kept.p", []byte("kept")); err != nil {
			t.Fatal(err)
		}
		expect(t, "gpuscaler.v1.queue.team-a.kept.p")
		for _, api := range []string{"STREAM.DELETE", "STREAM.PURGE", "STREAM.UPDATE", "CONSUMER.CREATE"} {
			if err := a.Publish("$JS.API."+api+"."+gpuscalerv1.StreamName, []byte(`{}`)); err != nil {
				t.Fatal(err)
			}
			aErrs.waitFor(t, `Permissions Violation for Publish to \"$JS.API.`+api+"."+gpuscalerv1.StreamName+`\"`)
		}
		// And through the JetStream client, as an attacker would: the request never
		// reaches the API (the tenant may not even read the reply).
		ajs, err := jetstream.New(a.Conn)
		if err != nil {
			t.Fatal(err)
		}
		short, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		if err := ajs.DeleteStream(short, gpuscalerv1.StreamName); err == nil {
			t.Fatal("a tenant deleted the GPUSCALER stream")
		}
		info, err := js.Stream(ctx, gpuscalerv1.StreamName)
		if err != nil {
			t.Fatalf("stream gone after the attack: %v", err)
		}
		if n := info.CachedInfo().State.Msgs; n < 3 {
			t.Fatalf("stream holds %d messages after the attack, want the 3 published", n)
		}
	})
	t.Run("the scaler keeps its stream", func(t *testing.T) {
		// The scaler may not delete or purge it either: nothing on the bus needs to.
		short, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		st, err := js.Stream(ctx, gpuscalerv1.StreamName)
		if err != nil {
			t.Fatal(err)
		}
		if err := st.Purge(short); err == nil {
			t.Fatal("the scaler purged the stream; its permissions should not allow it")
		}
	})
}

// TestProducerGetsItsAck: gpuscaler publish waits for the stream's ack, which comes back
// on the namespace's own inbox, the one a producer may read.
func TestProducerGetsItsAck(t *testing.T) {
	b := startBus(t, busOptions{})
	scaler, _ := b.mustConnect(t, natsconn.Options{Name: "scaler", Token: b.token(t, scalerSA)})
	js, _ := jetstream.New(scaler.Conn)
	if _, err := js.CreateOrUpdateStream(t.Context(), jetstream.StreamConfig{Name: gpuscalerv1.StreamName, Subjects: []string{gpuscalerv1.SubjectAll}}); err != nil {
		t.Fatal(err)
	}
	a, _ := b.mustConnect(t, natsconn.Options{Name: "tenant-a", Token: b.token(t, tenantA), InboxPrefix: gpuscalerv1.InboxPrefix("team-a")})
	ajs, _ := jetstream.New(a.Conn)
	ack, err := ajs.Publish(t.Context(), "gpuscaler.v1.queue.team-a.jobs.p", []byte("x"))
	if err != nil {
		t.Fatalf("producer publish with ack: %v", err)
	}
	if ack.Stream != gpuscalerv1.StreamName {
		t.Fatalf("ack from stream %q", ack.Stream)
	}
	// With another namespace's inbox prefix, the ack cannot be read.
	spy, spyErrs := b.mustConnect(t, natsconn.Options{Name: "tenant-a-spy", Token: b.token(t, tenantA), InboxPrefix: gpuscalerv1.InboxPrefix("team-b")})
	sjs, _ := jetstream.New(spy.Conn)
	short, cancel := context.WithTimeout(t.Context(), time.Second)
	defer cancel()
	if _, err := sjs.Publish(short, "gpuscaler.v1.queue.team-a.jobs.p", []byte("x")); err == nil {
		t.Fatal("a producer read replies below another namespace's inbox")
	}
	spyErrs.waitFor(t, "Permissions Violation for Subscription to")
}

// TestRefusals: every credential that must not get in is refused by the server, and the
// callout says why in its log and metrics.
func TestRefusals(t *testing.T) {
	hash, err := bcrypt.GenerateFromPassword([]byte("right"), bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	static := map[string]staticUser{"ci": {hash: hash, id: Identity{Role: RoleProducer, Name: "static:ci", Namespace: "team-a"}}}
	b := startBus(t, busOptions{static: static})
	revoked := b.token(t, tenantA)
	b.api.revoke(revoked)

	tests := map[string]struct {
		opts   natsconn.Options
		reason string
		says   string
	}{
		"expired token": {
			opts:   natsconn.Options{Token: b.api.issue(t, tenantA, testAudience, time.Now().Add(-time.Minute))},
			reason: "expired", says: "ServiceAccount token expired at",
		},
		"token for another audience": {
			opts:   natsconn.Options{Token: b.api.issue(t, tenantA, "https://kubernetes.default.svc", time.Now().Add(time.Hour))},
			reason: "wrong_audience", says: `is for audience "https://kubernetes.default.svc", want "gpuscaler-nats"`,
		},
		"revoked token": {
			opts: natsconn.Options{Token: revoked}, reason: "rejected", says: "token has been invalidated",
		},
		"not a token": {
			opts: natsconn.Options{Token: "hunter2"}, reason: "malformed_token", says: "not a Kubernetes ServiceAccount token",
		},
		"a ServiceAccount not listed": {
			opts:   natsconn.Options{Token: b.token(t, serviceAccount("gpuscaler", "intruder", "p", "u", "node-a"))},
			reason: "", says: "",
		},
		"a user, not a ServiceAccount": {
			opts: natsconn.Options{Token: b.token(t, plainUser)}, reason: "not_service_account", says: `token is for "jane@example.com", not a ServiceAccount`,
		},
		"a collector token bound to no pod": {
			opts:   natsconn.Options{Token: b.token(t, serviceAccount("gpuscaler", "gpuscaler-collector", "", "", ""))},
			reason: "no_node", says: "is not bound to a pod",
		},
		"a collector token without a node claim, pod lookup off": {
			opts:   natsconn.Options{Token: b.token(t, serviceAccount("gpuscaler", "gpuscaler-collector", "c-1", "u-1", ""))},
			reason: "no_node", says: "run the callout with --pod-lookup",
		},
		"no credentials": {
			opts: natsconn.Options{}, reason: "no_credentials", says: "no credentials",
		},
		"static user, wrong password": {
			opts: natsconn.Options{User: "ci", Password: "wrong"}, reason: "bad_password", says: `user "ci": unknown user or wrong password`,
		},
		"unknown static user": {
			opts: natsconn.Options{User: "nobody", Password: "right"}, reason: "bad_password", says: `user "nobody": unknown user or wrong password`,
		},
	}
	// Every ServiceAccount may produce for its own namespace by default ("*/*"), so an
	// unlisted one needs a narrower list: its own bus.
	narrow := startBus(t, busOptions{producers: "team-a/inference"})
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			bb := b
			if tc.reason == "" {
				bb, tc.reason, tc.says = narrow, "not_listed", "ServiceAccount gpuscaler/intruder is not among"
				tc.opts.Token = bb.token(t, serviceAccount("gpuscaler", "intruder", "p", "u", "node-a"))
			}
			before := bb.decisions("unknown", "denied", tc.reason)
			tc.opts.Name = name
			_, _, err := bb.connect(t, tc.opts)
			if err == nil {
				t.Fatal("connected; want the server to refuse")
			}
			if !strings.Contains(strings.ToLower(err.Error()), "authorization violation") {
				t.Fatalf("got %v, want an authorization violation", err)
			}
			if got := bb.decisions("unknown", "denied", tc.reason); got < before+1 {
				t.Fatalf("gpuscaler_auth_callout_decisions_total{result=denied,reason=%s} = %v, want at least %v", tc.reason, got, before+1)
			}
			if log := strings.ReplaceAll(bb.log.String(), `\"`, `"`); !strings.Contains(log, tc.says) {
				t.Fatalf("callout log does not say %q:\n%s", tc.says, log)
			}
		})
	}
	t.Run("static user, right password", func(t *testing.T) {
		nc, errs := b.mustConnect(t, natsconn.Options{Name: "ci", User: "ci", Password: "right"})
		if err := nc.Publish("gpuscaler.v1.queue.team-b.x.p", nil); err != nil {
			t.Fatal(err)
		}
		errs.waitFor(t, `Permissions Violation for Publish to \"gpuscaler.v1.queue.team-b.x.p\"`)
	})
}

// TestCollectorNodeFromPod: without a node claim, --pod-lookup takes the node from the
// pod the token is bound to, checked by uid; a stale uid or a gone pod is refused.
func TestCollectorNodeFromPod(t *testing.T) {
	b := startBus(t, busOptions{podLookup: true})
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "gpuscaler", Name: "gpuscaler-collector-x1", UID: types.UID("uid-1")},
		Spec:       corev1.PodSpec{NodeName: "gpu-7.example.internal"},
	}
	if _, err := b.kube.CoreV1().Pods("gpuscaler").Create(t.Context(), pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	scaler, _ := b.mustConnect(t, natsconn.Options{Name: "scaler", Token: b.token(t, scalerSA)})
	sub, _ := scaler.SubscribeSync("gpuscaler.v1.node.>")
	scaler.Flush()

	c, errs := b.mustConnect(t, natsconn.Options{Name: "c", Token: b.token(t, serviceAccount("gpuscaler", "gpuscaler-collector", "gpuscaler-collector-x1", "uid-1", ""))})
	own, _ := gpuscalerv1.NodeSubject("gpu-7.example.internal")
	c.Publish("gpuscaler.v1.node.node-a", nil)
	c.Publish(own, nil)
	c.Flush()
	m, err := next(sub, 5*time.Second)
	if err != nil || m.Subject != own {
		t.Fatalf("got %v %v, want the collector's own node subject %s", m, err, own)
	}
	errs.waitFor(t, `Permissions Violation for Publish to \"gpuscaler.v1.node.node-a\"`)

	for name, user := range map[string]userInfo{
		"stale uid":   serviceAccount("gpuscaler", "gpuscaler-collector", "gpuscaler-collector-x1", "uid-old", ""),
		"pod is gone": serviceAccount("gpuscaler", "gpuscaler-collector", "gpuscaler-collector-gone", "uid-2", ""),
	} {
		if _, _, err := b.connect(t, natsconn.Options{Name: name, Token: b.token(t, user)}); err == nil {
			t.Errorf("%s: connected; want refused", name)
		}
	}
	if got := b.decisions("unknown", "denied", "no_node"); got != 2 {
		t.Fatalf("no_node refusals = %v, want 2", got)
	}
}

// TestIssuedUserExpiresWithItsToken: the user lives no longer than the token (nor
// --user-max-ttl), so a revoked identity is out when its token would have expired.
func TestIssuedUserExpiresWithItsToken(t *testing.T) {
	b := startBus(t, busOptions{maxTTL: time.Hour})
	exp := time.Now().Add(2 * time.Second).Truncate(time.Second).Add(time.Second)
	closed := make(chan struct{})
	asyncErr := make(chan error, 8)
	nc, err := nats.Connect(b.url, nats.Token(b.api.issue(t, tenantA, testAudience, exp)), nats.NoReconnect(),
		nats.ClosedHandler(func(*nats.Conn) { close(closed) }),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { asyncErr <- err }))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("the connection outlived its token by 7s")
	}
	select {
	case err := <-asyncErr:
		if !errors.Is(err, nats.ErrAuthExpired) {
			t.Fatalf("server said %v, want %v", err, nats.ErrAuthExpired)
		}
	default:
		t.Fatalf("closed (last error %v) without the server's authentication-expired error", nc.LastError())
	}
}

// TestReconnectStorm: after a NATS restart every client reconnects at once, and the
// server gives up on a request after its auth timeout (2 s). With reviews taking 500 ms,
// twelve clients connecting together all get in only if the callout answers them side
// by side; one at a time, the later ones would wait 6 s.
func TestReconnectStorm(t *testing.T) {
	b := startBus(t, busOptions{reviewDelay: 500 * time.Millisecond})
	tokens := make([]string, 12)
	for i := range tokens {
		tokens[i] = b.token(t, tenantA)
	}
	errs := make(chan error, len(tokens))
	for _, tok := range tokens {
		go func() {
			nc, err := nats.Connect(b.url, nats.Token(tok), nats.Timeout(10*time.Second))
			if err == nil {
				nc.Close()
			}
			errs <- err
		}()
	}
	for range tokens {
		if err := <-errs; err != nil {
			t.Errorf("a client of the storm was refused: %v", err)
		}
	}
}

// TestAttackAckOverwrite: a producer may publish its own queue subjects and name any
// reply subject. JetStream publishes its ack ({"stream":"GPUSCALER","seq":N}) to that
// reply; were the reply delivered in the stream's account, the stream, which captures
// gpuscaler.v1.>, would store the ack over the subject it names: another node's
// report, another namespace's queue. Each role has an account of its own
// (NATSConfig), so the ack returns to the producer's account only; the stream keeps
// what the collector and the other tenant published.
func TestAttackAckOverwrite(t *testing.T) {
	b := startBus(t, busOptions{})
	scaler, _ := b.mustConnect(t, natsconn.Options{Name: "scaler", Token: b.token(t, scalerSA)})
	js, _ := jetstream.New(scaler.Conn)
	stream, err := js.CreateOrUpdateStream(t.Context(), jetstream.StreamConfig{Name: gpuscalerv1.StreamName, Subjects: []string{gpuscalerv1.SubjectAll}, MaxMsgsPerSubject: 1})
	if err != nil {
		t.Fatal(err)
	}
	// The victims' reports, stored. A collector publishes without waiting for an ack (it
	// may read nothing), so the wait is for the stream to hold its report.
	const nodeSubject, victimQueue = "gpuscaler.v1.node.node-a", "gpuscaler.v1.queue.team-b.jobs.p"
	collector, _ := b.mustConnect(t, natsconn.Options{Name: "collector", Token: b.token(t, collectorA)})
	if err := collector.Publish(nodeSubject, []byte("node report")); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 5*time.Second, func(ctx context.Context) error {
		_, err := stream.GetLastMsgForSubject(ctx, nodeSubject)
		return err
	})
	teamB, _ := b.mustConnect(t, natsconn.Options{Name: "team-b", Token: b.token(t, tenantB), InboxPrefix: gpuscalerv1.InboxPrefix("team-b")})
	bjs, _ := jetstream.New(teamB.Conn)
	if _, err := bjs.Publish(t.Context(), victimQueue, []byte("team-b's queue")); err != nil {
		t.Fatal(err)
	}

	attacker, attackerErrs := b.mustConnect(t, natsconn.Options{Name: "team-a", Token: b.token(t, tenantA), InboxPrefix: gpuscalerv1.InboxPrefix("team-a")})
	for _, target := range []string{nodeSubject, victimQueue} {
		if err := attacker.PublishMsg(&nats.Msg{Subject: "gpuscaler.v1.queue.team-a.jobs.p", Reply: target, Data: []byte("x")}); err != nil {
			t.Fatal(err)
		}
	}
	// A collector may name a reply as well: its own node's report, acked onto a queue.
	if err := collector.PublishMsg(&nats.Msg{Subject: nodeSubject, Reply: victimQueue, Data: []byte("node report")}); err != nil {
		t.Fatal(err)
	}
	if err := collector.Flush(); err != nil {
		t.Fatal(err)
	}
	// The attacker's own report is stored: the stream has seen both attacks, and acked
	// them (the third message), before the checks below.
	if err := attacker.Flush(); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 5*time.Second, func(ctx context.Context) error {
		_, err := stream.GetLastMsgForSubject(ctx, "gpuscaler.v1.queue.team-a.jobs.p")
		return err
	})
	for subject, want := range map[string]string{nodeSubject: "node report", victimQueue: "team-b's queue"} {
		m, err := stream.GetLastMsgForSubject(t.Context(), subject)
		if err != nil {
			t.Fatalf("%s: %v", subject, err)
		}
		if string(m.Data) != want {
			t.Errorf("%s holds %q, want %q: a producer's reply subject wrote into the stream", subject, m.Data, want)
		}
	}
	if testkit.CountLines(attackerErrs.String(), "Violation") != 0 {
		t.Errorf("the attacker's publish was refused (%s): the attack was not tried", attackerErrs)
	}
}

// TestAccountLimitsHold: the limits a producer's account sets are applied by the server
// to clients the callout admits, where limits in the issued user are not
// (nats-server#5002): a message larger than a queue report, a subscription past the
// bound, a connection past the account's.
func TestAccountLimitsHold(t *testing.T) {
	b := startBus(t, busOptions{producerLimits: Limits{MaxConnections: 2, MaxSubscriptions: 3, MaxPayload: 1024}})
	opts := natsconn.Options{Name: "team-a", Token: b.token(t, tenantA), InboxPrefix: gpuscalerv1.InboxPrefix("team-a")}

	nc, errs := b.mustConnect(t, opts)
	for i := range 4 {
		if _, err := nc.SubscribeSync(fmt.Sprintf("%s.%d", gpuscalerv1.InboxPrefix("team-a"), i)); err != nil {
			t.Fatal(err)
		}
	}
	nc.Flush()
	errs.waitFor(t, "maximum subscriptions exceeded")

	// The server tells the client its account's bound once it is admitted (nats.go
	// then refuses larger messages itself); a client that sends one anyway is
	// disconnected (client.go, processPub, against the limit applyAccountLimits set).
	big, bigErrs := b.mustConnect(t, opts)
	if err := big.Publish("gpuscaler.v1.queue.team-a.jobs.p", make([]byte, 1025)); errors.Is(err, nats.ErrMaxPayload) {
		if got := big.MaxPayload(); got != 1024 {
			t.Fatalf("the client refused the message at max payload %d, want the account's 1024", got)
		}
		big.Close()
	} else if err != nil {
		t.Fatal(err)
	} else {
		big.Flush()
		bigErrs.waitFor(t, "Maximum Payload Violation")
		testkit.Eventually(t, 5*time.Second, func() bool { return big.IsClosed() })
	}

	// That connection is closed; a second joins beside the first, and a third is
	// refused.
	b.mustConnect(t, opts)
	if _, _, err := b.connect(t, opts); err == nil {
		t.Fatal("a third connection joined an account limited to two")
	} else if !strings.Contains(strings.ToLower(err.Error()), "maximum") {
		t.Fatalf("third connection: %v, want the account's maximum connections", err)
	}
}
