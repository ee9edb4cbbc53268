package scaler

import (
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/grpc/codes"

	"github.com/gpuscaler/gpuscaler/internal/natstest"
	pb "github.com/gpuscaler/gpuscaler/proto/externalscaler"
	gpuscalerv1 "github.com/gpuscaler/gpuscaler/proto/gpuscaler/v1"
	"github.com/gpuscaler/gpuscaler/test/testkit"
)

// TestClockSkewMeasuredBeforeReady: the scaler reads the NATS server's clock from the
// answer to its stream create or update request, before its replay, so its very first
// answers judge reports' ages on the server's clock. nats-server stamps that answer's
// stream info (TimeStamp in jsStreamCreateRequest and jsStreamUpdateRequest,
// server/jetstream_api.go). The watchdog, which reads the clock too, is kept quiet:
// without the first reading the scaler judged on its own clock for its first 5 s.
func TestClockSkewMeasuredBeforeReady(t *testing.T) {
	const queue = "jobs"
	subject, err := gpuscalerv1.QueueSubject("ml", queue, "p")
	if err != nil {
		t.Fatal(err)
	}
	skewed := func(d time.Duration) func() time.Time { return func() time.Time { return time.Now().Add(d) } }
	getBacklog := func(s *testScaler, staleAfter string) (*pb.GetMetricsResponse, error) {
		r := ref("ml", "llm", map[string]string{"queue": queue, "staleAfter": staleAfter})
		return s.client.GetMetrics(t.Context(), &pb.GetMetricsRequest{ScaledObjectRef: r, MetricName: MetricQueueBacklog})
	}

	// The stream exists, holding a report stored just now: the scaler updates the stream.
	t.Run("local clock 40s ahead, fresh report replayed", func(t *testing.T) {
		ns := natstest.Start(t, "", "")
		pub := newPublisher(t, ns.ClientURL())
		createStream(t, pub.js)
		pub.queue("ml", queue, 3, 0)
		s := startScaler(t, ns.ClientURL(), Config{Now: skewed(40 * time.Second), streamCheckEvery: time.Hour})
		resp, err := getBacklog(s, "30s")
		if err != nil {
			t.Fatalf("first GetMetrics after Ready: %v, want backlog 3 (the report is fresh on the server's clock)", err)
		}
		if got := resp.GetMetricValues()[0].GetMetricValueFloat(); got != 3 {
			t.Fatalf("backlog %v, want 3", got)
		}
	})

	// No stream yet: the scaler creates it, and a report comes after Ready.
	t.Run("local clock 40s ahead, stream created", func(t *testing.T) {
		ns := natstest.Start(t, "", "")
		s := startScaler(t, ns.ClientURL(), Config{Now: skewed(40 * time.Second), streamCheckEvery: time.Hour})
		newPublisher(t, ns.ClientURL()).queue("ml", queue, 2, 0)
		testkit.Eventually(t, 5*time.Second, func() bool { _, _, q := s.State().Size(); return q == 1 })
		if _, err := getBacklog(s, "30s"); err != nil {
			t.Fatalf("GetMetrics on a report stored just now: %v, want backlog 2", err)
		}
	})

	// A dead producer's last report, older than staleAfter on the server's clock, would
	// read fresh on a clock 40 s behind.
	t.Run("local clock 40s behind, dead producer's report", func(t *testing.T) {
		ns := natstest.Start(t, "", "")
		pub := newPublisher(t, ns.ClientURL())
		createStream(t, pub.js)
		pub.queue("ml", queue, 3, 0)
		// Wait, by the server's own clock, until the report is older than staleAfter 1s.
		testkit.Eventually(t, 5*time.Second, func() bool { return serverAge(t, pub.js, subject) > 1500*time.Millisecond })
		s := startScaler(t, ns.ClientURL(), Config{Now: skewed(-40 * time.Second), streamCheckEvery: time.Hour})
		_, err := getBacklog(s, "1s")
		wantCode(t, err, codes.Unavailable, "queue ml/jobs last reported at", "longer than staleAfter 1s")
	})
}

// createStream creates the node and queue streams as a scaler with default settings would.
func createStream(t *testing.T, js jetstream.JetStream) {
	t.Helper()
	cfg := StreamConfig{}.withDefaults()
	for _, stream := range []jetstream.StreamConfig{cfg.nodeStream(), cfg.queueStream()} {
		if _, err := js.CreateStream(t.Context(), stream); err != nil {
			t.Fatalf("create stream %s: %v", stream.Name, err)
		}
	}
}

// serverAge is how long ago, on the NATS server's clock, the stream stored subject's last
// report.
func serverAge(t *testing.T, js jetstream.JetStream, subject string) time.Duration {
	t.Helper()
	stream := gpuscalerv1.StreamName
	if strings.HasPrefix(subject, gpuscalerv1.QueueSubjectPrefix) {
		stream = gpuscalerv1.QueueStreamName
	}
	s, err := js.Stream(t.Context(), stream)
	if err != nil {
		t.Fatal(err)
	}
	msg, err := s.GetLastMsgForSubject(t.Context(), subject)
	if err != nil {
		t.Fatal(err)
	}
	now := s.CachedInfo().TimeStamp
	if now.IsZero() {
		t.Fatal("stream info carries no server time")
	}
	return now.Sub(msg.Time)
}

// TestClockUnstampedServer: a server that sends no time (nats-server before 2.10) leaves
// the skew as it was, and the scaler says once that it judges ages on its own clock.
func TestClockUnstampedServer(t *testing.T) {
	log, buf := testkit.BufferLogger()
	local := time.Unix(1_000_000, 0)
	f := &follower{clock: &natsClock{local: func() time.Time { return local }}, log: log}
	f.observeClock(local.Add(-time.Minute), local)
	for range 3 {
		f.observeClock(time.Time{}, local)
	}
	if got := f.clock.Skew(); got != -time.Minute {
		t.Fatalf("skew after unstamped answers %s, want -1m0s, the last measured", got)
	}
	if n := testkit.CountLines(buf.String(), "does not send its time"); n != 1 {
		t.Fatalf("%d warnings about an unstamped server, want 1:\n%s", n, buf.String())
	}
}
