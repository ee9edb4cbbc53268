package scaler

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	"github.com/gpuscaler/gpuscaler/internal/natstest"
	pb "github.com/gpuscaler/gpuscaler/proto/externalscaler"
	gpuscalerv1 "github.com/gpuscaler/gpuscaler/proto/gpuscaler/v1"
	"github.com/gpuscaler/gpuscaler/test/testkit"
)

// maxQueueReport is a valid QueueReport of namespace/queue from producer, padded with an
// unknown field (which decoders skip) to MaxQueueReportBytes: the most a producer may
// store per subject.
func maxQueueReport(t testing.TB, namespace, queue, producer string) []byte {
	t.Helper()
	data, err := proto.Marshal(&gpuscalerv1.QueueReport{Namespace: namespace, Queue: queue, ProducerId: producer, Waiting: 1})
	if err != nil {
		t.Fatal(err)
	}
	data = append(data, 15<<3|2, 0, 0) // field 15, bytes, of a two-byte length filled in below
	n := gpuscalerv1.MaxQueueReportBytes - len(data)
	data[len(data)-2], data[len(data)-1] = byte(n)|0x80, byte(n>>7)
	return append(data, make([]byte, n)...)
}

// flood publishes reports of invented queues in namespace, each as large as a queue
// report may be, until it has sent bytes, and waits for the streams to answer them all.
// It returns how many the streams took.
func flood(t testing.TB, js jetstream.JetStream, namespace string, bytes int) int {
	t.Helper()
	var futures []jetstream.PubAckFuture
	for i := 0; i*gpuscalerv1.MaxQueueReportBytes < bytes; i++ {
		queue := fmt.Sprintf("invented-%06d", i)
		subject, err := gpuscalerv1.QueueSubject(namespace, queue, "p")
		if err != nil {
			t.Fatal(err)
		}
		f, err := js.PublishAsync(subject, maxQueueReport(t, namespace, queue, "p"))
		if err != nil {
			t.Fatalf("publish %s: %v", subject, err)
		}
		futures = append(futures, f)
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-time.After(30 * time.Second):
		t.Fatalf("the streams answered %d of %d reports in 30s", len(futures)-js.PublishAsyncPending(), len(futures))
	}
	taken := 0
	for _, f := range futures {
		select {
		case <-f.Ok():
			taken++
		case err := <-f.Err():
			t.Fatalf("flood report refused: %v", err)
		}
	}
	return taken
}

// TestAttackEviction is issue 28's eviction attack: a producer, who may publish only
// queue reports of its own namespace, publishes as many of the largest queue reports as
// it may to invented queues, past every byte limit. Before the queue reports had a stream
// of their own, with a bound on their size, this evicted the oldest reports first: the
// silent nodes' last reports, which are their tombstones, so a replica restarted after the
// flood no longer knew that a forgotten node had held a workload's pods and read the
// workload as idle. Now every node report stays where producers cannot reach it, and the
// restarted replica makes the same tombstones as the one that ran through the flood.
func TestAttackEviction(t *testing.T) {
	const limit = 1 << 20 // each stream's MaxBytes
	ns := natstest.Start(t, "", "")
	cfg := Config{
		StaleAfter:       time.Second,
		Stream:           StreamConfig{MaxAge: 2 * time.Second, MaxBytes: limit, QueueMaxBytes: limit},
		NodeTombstoneTTL: time.Hour,
	}
	first := startScaler(t, ns.ClientURL(), cfg)
	pub := newPublisher(t, ns.ClientURL())
	// A live node keeps reporting throughout, as a cluster's nodes do.
	live, _ := proto.Marshal(&gpuscalerv1.NodeReport{Node: "live", Gpus: []*gpuscalerv1.GPUSample{gpu("GPU-live", "", "", nil, 0, 0, 80)}})
	nc := natstest.Connect(t, ns.ClientURL())
	go func() {
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			_ = nc.Publish("gpuscaler.v1.node.live", live)
			select {
			case <-t.Context().Done():
				return
			case <-tick.C:
			}
		}
	}()
	const dead = 10
	for i := range dead {
		pub.node(&gpuscalerv1.NodeReport{Node: fmt.Sprintf("dead-%d", i),
			Gpus: []*gpuscalerv1.GPUSample{gpu(fmt.Sprintf("GPU-%d", i), "ml", fmt.Sprintf("llm-%d", i), llm, 90, 40, 80)}})
	}
	// Silent past MaxAge, the nodes are forgotten, their pods kept as tombstones.
	testkit.Eventually(t, 10*time.Second, func() bool { return first.State().Tombstones() == dead })
	gpuUtil := func(s *testScaler) error {
		_, err := s.client.GetMetrics(t.Context(), &pb.GetMetricsRequest{
			ScaledObjectRef: ref("ml", "llm", map[string]string{"podSelector": "app=llm", "gpuUtilTarget": "50"}), MetricName: "gpu-util"})
		return err
	}
	want := gpuUtil(first)
	wantCode(t, want, codes.Unavailable, "forgotten")

	taken := flood(t, pub.js, "attacker", 4*limit)
	queues, err := pub.js.Stream(t.Context(), gpuscalerv1.QueueStreamName)
	if err != nil {
		t.Fatal(err)
	}
	// The flood went past the queue stream's limit, which dropped the oldest queue
	// reports: the attack ran in full.
	if kept := queues.CachedInfo().State.Msgs; kept >= uint64(taken) || queues.CachedInfo().State.Bytes > limit {
		t.Fatalf("the queue stream keeps %d of the %d reports taken, in %d bytes; want some dropped, and at most %d bytes",
			kept, taken, queues.CachedInfo().State.Bytes, limit)
	}

	nodes := nodeSubjectsStored(t, pub.js)
	if len(nodes) != dead+1 {
		t.Errorf("after the flood the streams hold %d node reports, want all %d: %v", len(nodes), dead+1, nodes)
	}
	first.stop()
	second := startScaler(t, ns.ClientURL(), cfg)
	if got := second.State().Tombstones(); got != dead {
		t.Errorf("the replica restarted after the flood has %d tombstones, want %d as the one that ran through it", got, dead)
	}
	got := gpuUtil(second)
	if got == nil || got.Error() != want.Error() {
		t.Fatalf("restarted replica's gpu-util: %v\nwant as the replica that ran through the flood: %v", got, want)
	}
}

// nodeSubjectsStored returns the node subjects whose reports the streams hold, with how
// many messages each.
func nodeSubjectsStored(t testing.TB, js jetstream.JetStream) map[string]uint64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, err := js.Stream(ctx, gpuscalerv1.StreamName)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx, jetstream.WithSubjectFilter("gpuscaler.v1.node.>"))
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Subjects
}
