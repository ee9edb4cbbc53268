package inference

import (
	"context"
	"math"
	"math/rand/v2"
	"testing"
	"time"
)

// TestPushWakesAtOnce: one request after a long idle. Pushed, the replica is asked for
// the moment the producer reports it and serves after its model load; polled, only at
// KEDA's next poll. Loads take 10s, polls come every 30s from 0.
func TestPushWakesAtOnce(t *testing.T) {
	cfg := Config{Concurrency: 1, MaxReplicas: 4, PollingInterval: 30 * time.Second, Cooldown: 300 * time.Second,
		HPASync: 15 * time.Second, ScaleDownWindow: 300 * time.Second, ReportInterval: time.Second,
		Load: func(*rand.Rand) time.Duration { return 10 * time.Second }}
	svc := Service{Name: "s", Requests: []Request{{At: 100 * time.Second, Service: 5 * time.Second}}}
	for _, tc := range []struct {
		p    Policy
		wait float64
	}{
		{BacklogPolicy(PolicyBacklog, 1, true), 10},   // pushed at 100s, ready at 110s
		{BacklogPolicy(PolicyKEDAPoll, 1, false), 30}, // polled at 120s, ready at 130s
	} {
		run, err := newSim(cfg, tc.p, svc, time.Hour, math.MaxInt64, newTimeline(time.Hour)).play(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if run.waits[0] != tc.wait || run.cold != 1 {
			t.Errorf("%s: waited %g s (cold %d), want %g s after a cold start", tc.p.Name, run.waits[0], run.cold, tc.wait)
		}
		// The replica lives from the activation to cooldownPeriod after the queue
		// empties, rounded up to the poll that sees it: from 100s (or 120s) to the
		// first poll at least 300s after the last active poll.
		if run.gpuSeconds < 300 || run.gpuSeconds > 400 {
			t.Errorf("%s: %g GPU-seconds, want a cooldown's worth, 300 to 400", tc.p.Name, run.gpuSeconds)
		}
	}
}

// TestPeakReplicas: always-on holds the most requests in service at once if each
// started on arrival, concurrency to a replica, at most the maximum.
func TestPeakReplicas(t *testing.T) {
	reqs := []Request{{0, 10 * time.Second}, {time.Second, 10 * time.Second}, {2 * time.Second, time.Second}, {20 * time.Second, time.Second}}
	for _, tc := range []struct{ c, max, want int }{{1, 8, 3}, {2, 8, 2}, {1, 2, 2}, {8, 8, 1}} {
		if got := peakReplicas(reqs, tc.c, tc.max); got != tc.want {
			t.Errorf("peakReplicas(concurrency %d, max %d) = %d, want %d", tc.c, tc.max, got, tc.want)
		}
	}
}

// TestCutEndPaysToTheLastArrival: requests at 60 s and 200 s, the first 30 s a warm-up.
// Cut at both ends, always-on (one replica) pays from 30 s to 200 s, and the pushed
// backlog's replica, asked for at 60 s, from 60 s to 200 s, though both run on to
// serve the last request and scale down. Not cut at the end, they pay for that too.
func TestCutEndPaysToTheLastArrival(t *testing.T) {
	cfg := Config{Concurrency: 1, MaxReplicas: 4, PollingInterval: 30 * time.Second, Cooldown: 300 * time.Second,
		HPASync: 15 * time.Second, ScaleDownWindow: 300 * time.Second, ReportInterval: time.Second,
		Load: func(*rand.Rand) time.Duration { return 10 * time.Second }, WarmUp: 30 * time.Second, CutEnd: true}
	svc := Service{Name: "s", Requests: []Request{{At: time.Minute, Service: 5 * time.Second}, {At: 200 * time.Second, Service: 5 * time.Second}}}
	policies := []Policy{{Name: PolicyAlwaysOn, Kind: KindAlwaysOn}, BacklogPolicy(PolicyBacklog, 1, true)}
	for _, tc := range []struct {
		cut        bool
		on, scaled float64 // GPU-seconds
	}{
		{true, 170, 140},
		// Always-on to the end of the 10-minute tail; the scaled replica until KEDA's
		// cooldown takes it to zero at 360 s, 300 s after it last saw work (the push at
		// 60 s: the second request came and went between polls).
		{false, 770, 300},
	} {
		cfg.CutEnd = tc.cut
		res, err := Run(t.Context(), []Service{svc}, cfg, policies, nil, 10*time.Minute, nil)
		if err != nil {
			t.Fatal(err)
		}
		on, scaled := res.Policies[0].GPUHours*3600, res.Policies[1].GPUHours*3600
		if math.Abs(on-tc.on) > 1e-6 {
			t.Errorf("CutEnd %t: always-on paid %g GPU-seconds, want %g", tc.cut, on, tc.on)
		}
		if math.Abs(scaled-tc.scaled) > 1e-6 {
			t.Errorf("CutEnd %t: the pushed backlog paid %g GPU-seconds, want %g", tc.cut, scaled, tc.scaled)
		}
	}
}
