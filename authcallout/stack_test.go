package authcallout

import (
	"context"
	"encoding/binary"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/gpuscaler/gpuscaler/internal/natsconn"
	pb "github.com/gpuscaler/gpuscaler/proto/externalscaler"
	gpuscalerv1 "github.com/gpuscaler/gpuscaler/proto/gpuscaler/v1"
	"github.com/gpuscaler/gpuscaler/scaler"
	"github.com/gpuscaler/gpuscaler/scaler/scalertest"
	"github.com/gpuscaler/gpuscaler/test/testkit"
)

// writeToken writes tok to path the way the kubelet updates a projected volume: a new
// file renamed over the old, so a reader never sees half a token.
func writeToken(t testing.TB, path, tok string) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(tok), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// TestScalerOnACalloutBus runs the real scaler, a producer and a collector on a bus the
// callout guards, each with its own projected-token file: the scaler sets up its stream
// and answers KEDA from what the legitimate parts publish, and a forged report from
// another tenant changes nothing.
func TestScalerOnACalloutBus(t *testing.T) {
	b := startBus(t, busOptions{})
	dir := t.TempDir()
	file := func(name string, u userInfo) string {
		p := filepath.Join(dir, name)
		writeToken(t, p, b.token(t, u))
		return p
	}
	scalerConn, _ := b.mustConnect(t, natsconn.Options{Name: "scaler", TokenFile: file("scaler", scalerSA)})
	// A scaler that is never ready here lacks a permission on the callout bus.
	keda := scalertest.Client(t, scalertest.Run(t, scaler.Config{}, scalerConn))

	producer, _ := b.mustConnect(t, natsconn.Options{Name: "producer", TokenFile: file("producer", tenantA)})
	collector, _ := b.mustConnect(t, natsconn.Options{Name: "collector", TokenFile: file("collector", collectorA)})
	intruder, intruderErrs := b.mustConnect(t, natsconn.Options{Name: "intruder", TokenFile: file("intruder", tenantB)})

	queue := func(nc *natsconn.Conn, waiting uint64, seq uint64) {
		t.Helper()
		q := &gpuscalerv1.QueueReport{Namespace: "team-a", Queue: "jobs", Waiting: waiting, ObservedAt: timestamppb.Now(), ProducerId: nc.Opts.Name, Sequence: seq}
		data, _ := proto.Marshal(q)
		if err := nc.Publish("gpuscaler.v1.queue.team-a.jobs."+nc.Opts.Name, data); err != nil {
			t.Fatal(err)
		}
		nc.Flush()
	}
	queue(producer, 3, 1)
	node := &gpuscalerv1.NodeReport{Node: "node-a", ObservedAt: timestamppb.Now(), Sequence: 1, Source: "sim", CollectorId: "c",
		Gpus: []*gpuscalerv1.GPUSample{{Uuid: "GPU-1", GpuUtil: proto.Float64(70), Pod: &gpuscalerv1.PodRef{Namespace: "team-a", Name: "llm-0", Labels: map[string]string{"app": "llm"}}}}}
	data, _ := proto.Marshal(node)
	collector.Publish("gpuscaler.v1.node.node-a", data)
	collector.Flush()

	metric := func(md map[string]string, name string) (float64, error) {
		r := &pb.ScaledObjectRef{Name: "app", Namespace: "team-a", ScalerMetadata: md}
		resp, err := keda.GetMetrics(t.Context(), &pb.GetMetricsRequest{ScaledObjectRef: r, MetricName: name})
		if err != nil {
			return 0, err
		}
		return resp.GetMetricValues()[0].GetMetricValueFloat(), nil
	}
	wait := func(md map[string]string, name string, want float64) {
		t.Helper()
		testkit.Eventually(t, 10*time.Second, func(context.Context) error {
			got, err := metric(md, name)
			return testkit.Check(err == nil && got == want, "%s = %v (err %v), want %v", name, got, err, want)
		})
	}
	wait(map[string]string{"queue": "jobs"}, "queue-backlog", 3)
	wait(map[string]string{"podSelector": "app=llm", "gpuUtilTarget": "80"}, "gpu-util", 70)

	// team-b's identity publishes an empty queue for team-a: the server drops it.
	queue(intruder, 0, 2)
	queue(producer, 5, 3)
	wait(map[string]string{"queue": "jobs"}, "queue-backlog", 5)
	queue(intruder, 0, 4)
	// The server has refused both forged reports (it tells the intruder), so neither
	// reached the scaler.
	intruderErrs.waitForCount(t, `Permissions Violation for Publish to \"gpuscaler.v1.queue.team-a.jobs.intruder\"`, 2)
	if got, err := metric(map[string]string{"queue": "jobs"}, "queue-backlog"); err != nil || got != 5 {
		t.Fatalf("after a forged empty report, backlog = %v (err %v), want 5", got, err)
	}
}

// TestTokenRotationLosesNothing: a producer whose token file the kubelet rotates (three
// times, the first token expiring mid-run) reconnects on each new token and every one of
// its reports arrives, in order.
func TestTokenRotationLosesNothing(t *testing.T) {
	b := startBus(t, busOptions{})
	scalerConn, _ := b.mustConnect(t, natsconn.Options{Name: "scaler", Token: b.token(t, scalerSA)})
	sub, err := scalerConn.SubscribeSync("gpuscaler.v1.queue.team-a.seq.p")
	if err != nil {
		t.Fatal(err)
	}
	scalerConn.Flush()

	path := filepath.Join(t.TempDir(), "token")
	// The first token expires 3 s from now: only the rotation keeps the producer on.
	writeToken(t, path, b.api.issue(t, tenantA, testAudience, time.Now().Add(3*time.Second)))
	before := b.decisions("producer", "allowed", "")
	producer, _ := b.mustConnect(t, natsconn.Options{Name: "producer", TokenFile: path, TokenFileCheck: 20 * time.Millisecond})

	const n = 3000
	published := make(chan error, 1)
	go func() {
		buf := make([]byte, 8)
		for i := range uint64(n) {
			binary.BigEndian.PutUint64(buf, i)
			if err := producer.Publish("gpuscaler.v1.queue.team-a.seq.p", buf); err != nil {
				published <- err
				return
			}
			time.Sleep(time.Millisecond) // pacing: 3,000 reports over about 3 s, across three rotations
		}
		published <- producer.Flush()
	}()
	for range 3 {
		time.Sleep(700 * time.Millisecond) // pacing: the kubelet rotates the token while reports flow
		writeToken(t, path, b.token(t, tenantA))
	}
	if err := <-published; err != nil {
		t.Fatalf("publish: %v", err)
	}
	for i := range uint64(n) {
		m, err := next(sub, 5*time.Second)
		if err != nil {
			t.Fatalf("report %d of %d lost: %v", i, n, err)
		}
		if got := binary.BigEndian.Uint64(m.Data); got != i {
			t.Fatalf("got report %d, want %d: reports lost or reordered across a reconnect", got, i)
		}
	}
	if got := b.decisions("producer", "allowed", "") - before; got < 4 {
		t.Fatalf("producer admitted %v times, want 4 (the first token and three rotations)", got)
	}
}
