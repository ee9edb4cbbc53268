package e2e

import (
	"context"
	"fmt"
	"io"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/gpuscaler/gpuscaler/test/e2e/cluster"
	"github.com/gpuscaler/gpuscaler/test/testkit"
)

// TestAttackAckOverwrite: a producer may publish its own namespace's queue subjects and
// name any reply subject. JetStream publishes its ack ({"stream":"GPUSCALER","seq":N})
// to that reply, and were the reply delivered where the stream listens, the stream
// (which captures gpuscaler.v1.>) would store the ack over the report of the subject the
// producer named: a node's, another namespace's queue. Live scaler replicas drop the
// junk, so the test restarts the scaler: a replica that starts after the attack must
// still know the node's pods and the other namespace's queue. On the chart's NATS
// configuration each role has an account of its own, and the ack goes back to the
// producer's account alone.
func TestAttackAckOverwrite(t *testing.T) {
	ctx := t.Context()
	b := startCalloutBus(t)
	g := cluster.NewGpuscaler(env.Procs, env.G.Bin, b.NATS.URL, b.dir)
	s, err := g.StartScaler(ctx, "--nats-token-file="+b.scalerToken)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)

	// The victims: the node's collector, and team-b's producer.
	sim := cluster.SimNode{GPUs: 1, Pods: []cluster.SimPod{{Namespace: b.teamA, Name: "inference-0", Labels: map[string]string{"app": "llm"}, GPUs: []string{"0"}, Util: f64p(40)}}}
	c, err := g.StartCollector(ctx, b.node, sim, time.Second, "--nats-token-file="+b.writeToken(t, "collector", b.collectorToken))
	if err != nil {
		t.Fatal(err)
	}
	teamBToken := b.writeToken(t, "team-b", tokenFor(t, b.teamB, "inference", natsAudience, nil))
	out, err := exec.CommandContext(ctx, env.G.Bin, "publish", "queue", "--nats-url="+b.NATS.URL, "--nats-token-file="+teamBToken,
		"--namespace="+b.teamB, "--queue=jobs", "--waiting=7", "--timeout=3s").CombinedOutput()
	if err != nil {
		t.Fatalf("team-b publishes its queue: %v\n%s", err, out)
	}
	gpuUtil := map[string]string{"podSelector": "app=llm", "gpuUtilTarget": "80"}
	// Both reports have reached the scaler.
	testkit.Eventually(t, 15*time.Second, func(ctx context.Context) error {
		v, err := s.Metric(ctx, b.teamA, "app", gpuUtil, "gpu-util")
		if err != nil || v != 40 {
			return fmt.Errorf("gpu-util %v, %v", v, err)
		}
		v, err = s.Metric(ctx, b.teamB, "app", map[string]string{"queue": "jobs"}, "queue-backlog")
		return testkit.Check(err == nil && v == 7, "team-b's backlog %v, %v", v, err)
	})
	// The node falls silent, so only its stored report, its tombstone-to-be, speaks
	// for it; with the collector running its next report would repair the damage.
	c.Kill()

	// The attack: team-a publishes its own queue, naming the victims' subjects as the
	// reply, so the stream's acks go there.
	nc, errs := connect(t, b.NATS.URL, nats.Token(tokenFor(t, b.teamA, "inference", natsAudience, b.producerPod)))
	for _, reply := range []string{"gpuscaler.v1.node." + b.node, "gpuscaler.v1.queue." + b.teamB + ".jobs.gpuscaler-publish"} {
		if err := nc.PublishMsg(&nats.Msg{Subject: "gpuscaler.v1.queue." + b.teamA + ".jobs.attacker", Reply: reply, Data: []byte{}}); err != nil {
			t.Fatal(err)
		}
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-errs:
		t.Fatalf("the attacker's publish was refused (%v): the attack was not tried", err)
	default:
	}
	// The attacker's own reports have reached the stream: the scaler drops them as
	// malformed queue reports, which they are (empty).
	testkit.Eventually(t, 10*time.Second, func(ctx context.Context) error {
		dropped := 0.0
		for line := range strings.SplitSeq(metricsText(ctx, "http://"+s.HTTPAddr+"/metrics"), "\n") {
			if rest, ok := strings.CutPrefix(line, `gpuscaler_scaler_events_dropped_total{kind="queue"`); ok {
				_, v, _ := strings.Cut(rest, " ")
				f, _ := strconv.ParseFloat(v, 64)
				dropped += f
			}
		}
		return testkit.Check(dropped >= 1, "the scaler dropped %v queue reports, want the attacker's", dropped)
	})

	// A replica that starts now replays the stream.
	s.Stop()
	s2, err := g.StartScaler(ctx, "--nats-token-file="+b.scalerToken)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s2.Stop)
	if v, err := s2.Metric(ctx, b.teamA, "app", gpuUtil, "gpu-util"); err != nil || v != 40 {
		t.Errorf("after the attack a new replica reads gpu-util %v (%v), want 40 from the node's stored report", v, err)
	}
	if v, err := s2.Metric(ctx, b.teamB, "app", map[string]string{"queue": "jobs"}, "queue-backlog"); err != nil || v != 7 {
		t.Errorf("after the attack a new replica reads team-b's backlog %v (%v), want 7", v, err)
	}
}

// TestAttackAccountLimits: a producer that opens subscriptions past its need or sends
// messages far larger than a queue report meets the limits of the producers' account,
// which the server applies to users the callout issues (limits inside an issued user it
// ignores in config mode: nats-server#5002). Both limits come from the chart's own
// configuration.
func TestAttackAccountLimits(t *testing.T) {
	b := startCalloutBus(t)
	token := nats.Token(tokenFor(t, b.teamA, "inference", natsAudience, b.producerPod))

	nc, errs := connect(t, b.NATS.URL, token)
	for i := range 17 {
		if _, err := nc.SubscribeSync(fmt.Sprintf("_INBOX.gpuscaler.%s.%d", b.teamA, i)); err != nil {
			t.Fatal(err)
		}
	}
	nc.Flush()
	waitErr(t, errs, "maximum subscriptions exceeded")

	// The server tells an admitted client its account's bound (nats.go then refuses a
	// larger message itself); a client that ignores it is disconnected.
	big, _ := connect(t, b.NATS.URL, token)
	testkit.Eventually(t, 5*time.Second, func() bool { return big.MaxPayload() == 1024 })
	raw, err := net.Dial("tcp", strings.TrimPrefix(b.NATS.URL, "nats://"))
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	// A client speaking the protocol by hand, which no client library's check stops.
	connectLine := fmt.Sprintf("CONNECT {\"auth_token\":%q,\"verbose\":false,\"pedantic\":false,\"protocol\":1}\r\nPING\r\n", tokenFor(t, b.teamA, "inference", natsAudience, b.producerPod))
	payload := make([]byte, 8192)
	fmt.Fprintf(raw, "%sPUB gpuscaler.v1.queue.%s.jobs.raw %d\r\n%s\r\n", connectLine, b.teamA, len(payload), payload)
	raw.SetReadDeadline(time.Now().Add(10 * time.Second))
	reply, _ := io.ReadAll(raw)
	if !strings.Contains(string(reply), "Maximum Payload Violation") {
		t.Fatalf("the server answered an 8 KiB message with %q, want a maximum payload violation", reply)
	}
}
