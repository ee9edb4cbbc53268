package e2e

import (
	"context"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/gpuscaler/gpuscaler/test/e2e/cluster"
	"github.com/gpuscaler/gpuscaler/test/testkit"
)

// TestAttackEviction is issue 28's eviction attack, end to end: the real binary, its
// embedded NATS storing on disk, real collectors. A producer publishes as many of the
// largest queue reports to invented queues as its streams take, past every byte limit
// (1 MiB here, for a short run: the same ratio as 4,096 reports of 256 KiB in 1 GiB).
// The nodes' reports, a forgotten node's tombstone among them, must survive it, so that
// the scaler restarted after the flood still knows the forgotten node held the
// workload's pods (Unavailable), rather than reading the workload as idle (0).
func TestAttackEviction(t *testing.T) {
	const limit = 1 << 20
	dir := t.TempDir()
	natsAddr, err := cluster.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	g := cluster.NewGpuscaler(env.Procs, env.G.Bin, "nats://"+natsAddr, dir)
	flags := []string{
		"--embedded-nats-addr=" + natsAddr, "--data-dir=" + filepath.Join(dir, "nats"),
		"--stale-after=1s", "--stream-max-age=3s", "--node-tombstone-ttl=1h",
		fmt.Sprintf("--stream-max-bytes=%d", limit), fmt.Sprintf("--queue-stream-max-bytes=%d", limit),
	}
	s := startAttackScaler(t, g, flags)

	ns := "attack-" + fmt.Sprint(time.Now().UnixNano()%100000)
	live, err := g.StartCollector(t.Context(), "live", cluster.SimNode{GPUs: 1}, 200*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(live.Stop)
	dead, err := g.StartCollector(t.Context(), "dead", cluster.SimNode{GPUs: 1, Pods: []cluster.SimPod{
		{Namespace: ns, Name: "llm-0", Labels: map[string]string{"app": "llm"}, GPUs: []string{"0"}, Util: f64p(90)},
	}}, 200*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	gpuUtil := func(s *cluster.Scaler) func(ctx context.Context) (float64, error) {
		return func(ctx context.Context) (float64, error) {
			return s.Metric(ctx, ns, "llm", map[string]string{"podSelector": "app=llm", "gpuUtilTarget": "50"}, "gpu-util")
		}
	}
	testkit.Eventually(t, 30*time.Second, func(ctx context.Context) error {
		v, err := gpuUtil(s)(ctx)
		return testkit.Check(err == nil && v == 90, "gpu-util %v (%v), want 90", v, err)
	})
	// The node falls silent; past --stream-max-age the scaler forgets it, keeping its pod
	// as a tombstone: the workload's GPU metrics answer Unavailable, not 0.
	dead.Stop()
	forgotten := func(s *cluster.Scaler) func(ctx context.Context) error {
		return func(ctx context.Context) error {
			v, err := gpuUtil(s)(ctx)
			return testkit.Check(err != nil && strings.Contains(err.Error(), "forgotten"), "gpu-util %v (%v), want Unavailable: node dead was forgotten", v, err)
		}
	}
	testkit.Eventually(t, 30*time.Second, forgotten(s))

	taken := floodQueues(t, "nats://"+natsAddr, "invented", 4*limit)
	t.Logf("the queue stream took %d reports of 1 KiB", taken)

	s.Stop()
	restarted := startAttackScaler(t, g, flags)
	if err := forgotten(restarted)(t.Context()); err != nil {
		t.Fatalf("the scaler restarted after the flood: %v", err)
	}
}

// startAttackScaler starts `gpuscaler scaler` with flags (its own embedded NATS) on free
// ports and waits for its /readyz: its replay is done.
func startAttackScaler(t *testing.T, g *cluster.Gpuscaler, flags []string) *cluster.Scaler {
	t.Helper()
	grpcAddr, err := cluster.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	httpAddr, err := cluster.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	args := append([]string{"scaler", "--log-level=debug", "--grpc-addr=" + grpcAddr, "--http-addr=" + httpAddr}, flags...)
	p, err := env.Procs.Start("gpuscaler-scaler-attack", g.Bin, args)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Stop)
	testkit.Eventually(t, time.Minute, func(ctx context.Context) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+httpAddr+"/readyz", nil)
		if err != nil {
			return err
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		resp.Body.Close()
		return testkit.Check(resp.StatusCode == http.StatusOK, "/readyz: %s\n%s", resp.Status, p.Tail(20))
	})
	return &cluster.Scaler{Process: p, GRPCAddr: grpcAddr, HTTPAddr: httpAddr}
}

// maxQueueReportBytes is the largest message the queue stream takes
// (gpuscalerv1.MaxQueueReportBytes; this module does not import gpuscaler).
const maxQueueReportBytes = 1 << 10

// floodQueues publishes, to the NATS at url, reports of invented queues of namespace,
// each padded to maxQueueReportBytes, until it has sent bytes, and waits for the stream
// to take them all. It returns how many it took.
func floodQueues(t *testing.T, url, namespace string, bytes int) int {
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	var futures []jetstream.PubAckFuture
	for i := 0; i*maxQueueReportBytes < bytes; i++ {
		queue := fmt.Sprintf("q%06d", i)
		// A QueueReport (namespace 1, queue 2, waiting 3, producer_id 7) and an unknown
		// field 15 padding it to the limit.
		var b []byte
		b = protowire.AppendTag(b, 1, protowire.BytesType)
		b = protowire.AppendString(b, namespace)
		b = protowire.AppendTag(b, 2, protowire.BytesType)
		b = protowire.AppendString(b, queue)
		b = protowire.AppendTag(b, 3, protowire.VarintType)
		b = protowire.AppendVarint(b, 1)
		b = protowire.AppendTag(b, 7, protowire.BytesType)
		b = protowire.AppendString(b, "p")
		b = protowire.AppendTag(b, 15, protowire.BytesType)
		pad := maxQueueReportBytes - len(b) - 2 // a two-byte length
		b = protowire.AppendBytes(b, make([]byte, pad))
		if len(b) != maxQueueReportBytes {
			t.Fatalf("flood report of %d bytes, want %d", len(b), maxQueueReportBytes)
		}
		f, err := js.PublishAsync("gpuscaler.v1.queue."+namespace+"."+queue+".p", b)
		if err != nil {
			t.Fatal(err)
		}
		futures = append(futures, f)
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-time.After(time.Minute):
		t.Fatalf("the stream answered %d of %d flood reports in a minute", len(futures)-js.PublishAsyncPending(), len(futures))
	}
	for _, f := range futures {
		select {
		case <-f.Ok():
		case err := <-f.Err():
			t.Fatalf("flood report refused: %v", err)
		}
	}
	return len(futures)
}
