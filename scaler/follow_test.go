package scaler

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/protobuf/proto"

	"github.com/gpuscaler/gpuscaler/internal/natstest"
	pb "github.com/gpuscaler/gpuscaler/proto/externalscaler"
	gpuscalerv1 "github.com/gpuscaler/gpuscaler/proto/gpuscaler/v1"
	"github.com/gpuscaler/gpuscaler/test/testkit"
)

// TestOversizedQueueReportIsRefused: the queue stream stores nothing larger than a queue
// report needs, headers counted, while the node stream still takes a node report of up
// to MaxEventBytes.
func TestOversizedQueueReportIsRefused(t *testing.T) {
	ns := natstest.Start(t, "", "")
	startScaler(t, ns.ClientURL(), Config{})
	pub := newPublisher(t, ns.ClientURL())
	const subject = "gpuscaler.v1.queue.ml.jobs.p"
	pub.raw(subject, maxQueueReport(t, "ml", "jobs", "p"))

	refused := func(name string, msg *nats.Msg) {
		t.Helper()
		_, err := pub.js.PublishMsg(t.Context(), msg)
		var apiErr *jetstream.APIError
		if !errors.As(err, &apiErr) || apiErr.ErrorCode != 10054 { // JSStreamMessageExceedsMaximumErr
			t.Errorf("%s: publish = %v, want the stream to refuse it: message size exceeds maximum allowed", name, err)
		}
	}
	oversized := append(maxQueueReport(t, "ml", "jobs", "p"), 0)
	refused("one byte more", &nats.Msg{Subject: subject, Data: oversized})
	refused("the largest report with a header", &nats.Msg{Subject: subject, Data: maxQueueReport(t, "ml", "jobs", "p"), Header: nats.Header{"Pad": []string{"x"}}})

	// The node stream's bound is the one it had.
	big := make([]byte, gpuscalerv1.MaxEventBytes)
	pub.raw("gpuscaler.v1.node.n1", big)
	refused("a node message past MaxEventBytes", &nats.Msg{Subject: "gpuscaler.v1.node.n1", Data: append(big, 0)})
}

// TestUpgradeFromOneStream: a NATS where an earlier release made GPUSCALER capture every
// gpuscaler subject, holding node and queue reports. The scaler narrows GPUSCALER to the
// node subjects (the update must come before the queue stream can be made, its subjects
// overlapping), makes the queue stream, and replays the node reports; the queue reports
// left behind in GPUSCALER are never read as current, and are counted nowhere. A replica
// restarted after the upgrade replays the same.
func TestUpgradeFromOneStream(t *testing.T) {
	ns := natstest.Start(t, "", "")
	pub := newPublisher(t, ns.ClientURL())
	old := StreamConfig{}.withDefaults().nodeStream()
	old.Subjects = []string{gpuscalerv1.SubjectAll}
	old.Description = "gpuscaler: the latest report of every GPU node and queue"
	if _, err := pub.js.CreateStream(t.Context(), old); err != nil {
		t.Fatal(err)
	}
	pub.node(&gpuscalerv1.NodeReport{Node: "n1", Gpus: []*gpuscalerv1.GPUSample{gpu("GPU-1", "ml", "llm-0", llm, 75, 1, 80)}})
	pub.queue("ml", "jobs", 7, 0)  // left behind: the producer's next report goes to the queue stream
	pub.queue("ml", "stale", 4, 0) // the last message of the old stream

	cfg := Config{streamCheckEvery: 50 * time.Millisecond}
	first := startScaler(t, ns.ClientURL(), cfg)
	st, err := pub.js.Stream(t.Context(), gpuscalerv1.StreamName)
	if err != nil {
		t.Fatal(err)
	}
	if got := st.CachedInfo().Config.Subjects; !slices.Equal(got, []string{gpuscalerv1.NodeSubjects}) {
		t.Fatalf("stream %s captures %v after the upgrade, want %s", gpuscalerv1.StreamName, got, gpuscalerv1.NodeSubjects)
	}
	if got := st.CachedInfo().State.Msgs; got != 3 {
		t.Fatalf("stream %s holds %d messages after the upgrade, want the 3 it had", gpuscalerv1.StreamName, got)
	}
	check := func(s *testScaler) {
		t.Helper()
		if n, g, q := s.State().Size(); n != 1 || g != 1 || q != 0 {
			t.Fatalf("state after the upgrade: %d nodes, %d GPUs, %d queues; want the node and no queue of the old stream", n, g, q)
		}
		if got := testutil.ToFloat64(s.metrics.replayMessages); got != 1 {
			t.Fatalf("replayed %v messages, want 1: the node report", got)
		}
		if got := testutil.CollectAndCount(s.reg, "gpuscaler_scaler_events_dropped_total"); got != 0 {
			t.Fatalf("%d dropped-event series, want none: the old queue reports are not read", got)
		}
	}
	check(first)
	// The old stream's last message is a queue report, newer than any node report: the
	// stall check must compare what the consumer read with the last node report, or it
	// would take the consumer, which never delivers that queue report, for stalled.
	if got := st.CachedInfo().State.LastSeq; got != 3 {
		t.Fatalf("stream %s's last sequence %d, want 3", gpuscalerv1.StreamName, got)
	}
	if seq, err := first.followers[0].lastFollowed(t.Context(), st); err != nil || seq != 1 {
		t.Fatalf("the node follower's last message: sequence %d, %v; want 1, the node report", seq, err)
	}

	// The producer reports again, now to the queue stream; a restarted replica reads it.
	pub.queue("ml", "jobs", 2, 0)
	backlog := jobsBacklog(t, first)
	testkit.Eventually(t, 5*time.Second, func() bool { return backlog() == 2 })
	first.stop()
	second := startScaler(t, ns.ClientURL(), cfg)
	if got := jobsBacklog(t, second)(); got != 2 {
		t.Fatalf("restarted replica's backlog %v, want 2 from the queue stream, not 7 from the old one", got)
	}
	if n, _, q := second.State().Size(); n != 1 || q != 1 {
		t.Fatalf("restarted replica: %d nodes, %d queues; want 1 and 1", n, q)
	}
}

// TestReplaySurvivesJunk: whatever a stream holds on a node or queue subject, the replay
// counts and skips what it cannot use, applies the rest and makes the scaler ready. Here
// the junk is what an identity allowed to publish nothing but its own queue's reports
// can store: it sends a queue report with a node's subject as its reply subject, and the
// queue stream's acknowledgement, {"stream":"GPUSCALER_QUEUES","seq":N}, is published
// there and stored by the node stream as that node's last report (and the other way
// round); and plain garbage, on subjects of both kinds, which is each stream's last
// message, so the replay ends on junk.
func TestReplaySurvivesJunk(t *testing.T) {
	ns := natstest.Start(t, "", "")
	first := startScaler(t, ns.ClientURL(), Config{})
	pub := newPublisher(t, ns.ClientURL())
	pub.node(&gpuscalerv1.NodeReport{Node: "n1", Gpus: []*gpuscalerv1.GPUSample{gpu("GPU-1", "ml", "llm-0", llm, 75, 1, 80)}})
	pub.queue("ml", "jobs", 3, 0)

	nc := natstest.Connect(t, ns.ClientURL())
	report, _ := proto.Marshal(&gpuscalerv1.QueueReport{Namespace: "ml", Queue: "other", ProducerId: "p", Waiting: 1})
	node, _ := proto.Marshal(&gpuscalerv1.NodeReport{Node: "n2"})
	// The acks land on a node subject and on a queue subject.
	if err := nc.PublishRequest("gpuscaler.v1.queue.ml.other.p", "gpuscaler.v1.node.victim", report); err != nil {
		t.Fatal(err)
	}
	if err := nc.PublishRequest("gpuscaler.v1.node.n2", "gpuscaler.v1.queue.ml.victim.p", node); err != nil {
		t.Fatal(err)
	}
	last := func(stream, subject string) []byte {
		s, err := pub.js.Stream(t.Context(), stream)
		if err != nil {
			return nil
		}
		msg, err := s.GetLastMsgForSubject(t.Context(), subject)
		if err != nil {
			return nil
		}
		return msg.Data
	}
	testkit.Eventually(t, 5*time.Second, func() bool {
		return last(gpuscalerv1.StreamName, "gpuscaler.v1.node.victim") != nil && last(gpuscalerv1.QueueStreamName, "gpuscaler.v1.queue.ml.victim.p") != nil
	})
	if ack := last(gpuscalerv1.StreamName, "gpuscaler.v1.node.victim"); !strings.HasPrefix(string(ack), `{"stream":"GPUSCALER_QUEUES","seq":`) {
		t.Fatalf("node victim's last message %q, want the queue stream's ack", ack)
	}
	// Garbage last, so that each stream's replay ends on junk.
	pub.raw("gpuscaler.v1.queue.ml.garbage.p", []byte{0xff, 0xff, 0xff})
	pub.raw("gpuscaler.v1.node.garbage", []byte("\x0a\xff"))
	first.stop()

	second := startScaler(t, ns.ClientURL(), Config{})
	if got := jobsBacklog(t, second)(); got != 3 {
		t.Fatalf("backlog after a replay through junk %v, want 3", got)
	}
	if n, _, _ := second.State().Size(); n < 1 {
		t.Fatalf("no node after a replay through junk")
	}
	resp, err := second.client.GetMetrics(t.Context(), &pb.GetMetricsRequest{
		ScaledObjectRef: ref("ml", "llm", map[string]string{"podSelector": "app=llm", "gpuUtilTarget": "50"}), MetricName: "gpu-util"})
	if err != nil || resp.GetMetricValues()[0].GetMetricValueFloat() != 75 {
		t.Fatalf("gpu-util after a replay through junk = %v, %v; want 75", resp, err)
	}
	var dropped float64
	for _, kind := range []string{"node", "queue"} {
		dropped += testutil.ToFloat64(second.metrics.eventsDropped.WithLabelValues(kind, "decode"))
	}
	if dropped != 4 {
		t.Fatalf("%v undecodable reports counted, want 4 (two acks, two garbage)", dropped)
	}
}
