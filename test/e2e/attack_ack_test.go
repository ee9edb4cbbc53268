package e2e

import (
	"context"
	"fmt"
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
