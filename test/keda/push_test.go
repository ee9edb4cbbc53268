package keda

import (
	"bytes"
	"slices"
	"strings"
	"testing"
	"time"
)

// pushTimeout is how long a push may take before the test gives up: generous, as the
// latency is measured and logged, not asserted.
const pushTimeout = 10 * time.Second

// receive returns the next activation KEDA's push scaler delivers.
func receive(t *testing.T, active <-chan bool) bool {
	t.Helper()
	select {
	case v, ok := <-active:
		if !ok {
			t.Fatal("Run closed its channel, want it running")
		}
		return v
	case <-time.After(pushTimeout):
		t.Fatalf("no activation from Run within %s", pushTimeout)
		return false
	}
}

// TestPushActivation runs KEDA's external-push scaler as the operator does (Run with an
// activity channel) and checks that a QueueReport making the queue active reaches the
// channel as true, again after every dip to empty; that no false is ever pushed after
// the first message, and nothing for reports that change no activity. It logs the
// latency from the moment NATS stored the report to the moment Run delivered true, over
// several rounds.
func TestPushActivation(t *testing.T) {
	s := startScaler(t)
	st := s.stream(t, queueStreamName)
	// pushInterval 0s: every activation is pushed, however soon after the last (the
	// default spaces them by 30 s; see the scaler's TestStreamIsActiveSpacesPushes).
	tr := trigger{namespace: "web", name: "inference", metadata: map[string]string{"queue": "requests", "queueTarget": "4", "pushInterval": "0s"}}
	active := s.push(t, tr)
	// Opened before the queue ever reported: the current state, which is not active.
	if got := receive(t, active); got {
		t.Fatalf("first message on a queue that never reported: got %t, want false", got)
	}

	const rounds = 10
	latencies := make([]time.Duration, 0, rounds)
	for round := range rounds {
		if round > 0 {
			// More work on an active queue, then none: neither pushes anything. A push
			// for either would be received below before the next report was stored.
			s.publishQueue(t, "web", "requests", 2, 0)
			s.publishQueue(t, "web", "requests", 0, 0)
			// The empty queue read before the next report: the stream keeps one report
			// per producer, and one replaced unread would leave no dip to wake from.
			waitMetric(t, s, tr, "s0-queue-backlog", 0)
		}
		cmd := s.publishQueueCmd(t.Context(), "web", "requests", 1, 0)
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		got := receive(t, active)
		at := time.Now()
		if err := cmd.Wait(); err != nil {
			t.Fatalf("round %d: %s: %v\n%s", round, strings.Join(cmd.Args, " "), err, out.String())
		}
		if !got {
			t.Fatalf("round %d: got %t pushed, want true (the scaler sends no false after the first message)", round, got)
		}
		msg, err := st.GetMsg(t.Context(), parsePublished(t, out.String()))
		if err != nil {
			t.Fatalf("round %d: the report's stream message: %v", round, err)
		}
		latency := at.Sub(msg.Time)
		if latency <= 0 {
			t.Fatalf("round %d: true received %v before the report that makes the queue active was stored: a push for an earlier report", round, -latency)
		}
		latencies = append(latencies, latency)
	}
	slices.Sort(latencies)
	t.Logf("push latency, report stored in NATS → true from KEDA's Run (n=%d): p50 %v, max %v, all %v",
		len(latencies), latencies[len(latencies)/2], latencies[len(latencies)-1], latencies)

	// A stream opened while the queue is active starts with true: a KEDA operator that
	// restarts, or reconnects to another replica, learns at once.
	tr.name = "inference-2"
	if got := receive(t, s.push(t, tr)); !got {
		t.Errorf("first message on an active queue: got %t, want true", got)
	}
}

// TestPushAcrossScalerRestart stops the scaler under KEDA's running push scaler and starts
// it again on the same address and NATS store, as a rolling update does. KEDA's Run
// reconnects on its own and gets true at once: the restarted scaler has read the last
// report of every queue back from the stream before it answers.
func TestPushAcrossScalerRestart(t *testing.T) {
	dataDir := t.TempDir()
	s := startScaler(t, "--data-dir", dataDir)
	tr := trigger{namespace: "web", name: "inference", metadata: map[string]string{"queue": "requests"}}
	s.publishQueue(t, "web", "requests", 2, 0)
	waitMetric(t, s, tr, "s0-queue-backlog", 2000)
	active := s.push(t, tr)
	if got := receive(t, active); !got {
		t.Fatalf("first message on an active queue: got %t, want true", got)
	}

	stopped := time.Now()
	if killed := s.stop(); killed || s.waitErr != nil {
		t.Fatalf("scaler stop: killed %t, exit %v; want a clean exit on SIGTERM", killed, s.waitErr)
	}
	startScaler(t, "--data-dir", dataDir, "--grpc-addr", s.grpcAddr)
	if got := receive(t, active); !got {
		t.Fatalf("first message after the restart: got %t, want true (the queue's report is still fresh)", got)
	}
	t.Logf("KEDA's push scaler got true from the restarted scaler %v after the old one was stopped (KEDA retries a stream after 2 s)",
		time.Since(stopped).Round(time.Millisecond))
}
