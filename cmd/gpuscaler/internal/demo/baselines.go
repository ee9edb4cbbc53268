package demo

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"time"

	"github.com/gpuscaler/gpuscaler/cmd/gpuscaler/internal/inference"
	"github.com/gpuscaler/gpuscaler/scaler"
)

// Baseline is one way of scaling the inference service, replayed on the requests the
// run served on a model of the demo's cluster (the inference package, which replay runs
// too): what it would have cost and made the same requests wait.
type Baseline struct {
	// Policy is replay's name for it: always-on, seeds-hpa-gpu-util, keda-poll-backlog,
	// gpuscaler-backlog or gpuscaler.
	Policy string `json:"policy"`
	// Setting says how it was set up, for a reader ("queueTarget=4, pushed").
	Setting string `json:"setting"`
	// PeakReplicas is the most replicas it held at once, leaving ones included.
	PeakReplicas int `json:"peak_replicas"`
	// PeakNeed, for always-on at the peak need, is the replicas that would serve every
	// request the moment it arrived: above PeakReplicas when the inference pool has
	// fewer GPUs, and requests then wait even always on.
	PeakNeed int `json:"peak_need,omitempty"`
	// GPUSeconds is the GPU time its replicas held, loading or serving, over the run
	// (and past its end until the last request is served, if later). A replica holds
	// one GPU.
	GPUSeconds float64 `json:"gpu_seconds"`
	// Waits are from a request's arrival to the start of its service, in seconds
	// (nearest rank).
	WaitP50 float64 `json:"wait_p50_s"`
	WaitP99 float64 `json:"wait_p99_s"`
	// ColdStartFraction is the share of requests taken by a replica that was still
	// loading its model when they arrived.
	ColdStartFraction float64 `json:"cold_start_fraction"`
}

// replayModel is the demo's cluster as replay models it: the inference service's
// concurrency, minReplicaCount 0 and maxReplicaCount its pool's GPUs, the run's KEDA and
// HPA clocks and producer heartbeat, and a model load of exactly Timing.Startup.
func replayModel(cfg Config, maxReplicas int) inference.Config {
	t := cfg.Timing
	startup := t.Startup
	return inference.Config{
		Concurrency: concurrency, MinReplicas: 0, MaxReplicas: maxReplicas,
		PollingInterval: t.PollingInterval, Cooldown: t.Cooldown, HPASync: t.HPASync, ScaleDownWindow: t.ScaleDownWindow,
		Load:           func(*rand.Rand) time.Duration { return startup },
		ReportInterval: t.QueueInterval,
		Seed:           cfg.Seed,
	}
}

// replayPolicies are the ways of scaling the service the summary compares, each as a user
// would set it up for the demo's service: always on at the replicas the requests need at
// their peak; the seeds' HPA on GPU utilisation through Prometheus; a queue-backlog
// trigger at the demo's former queueTarget, polled as KEDA's own queue scalers are and
// pushed as gpuscaler's is; and the demo's own queue-demand trigger.
func replayPolicies() []inference.Policy {
	backlog := map[string]string{scaler.KeyQueueTarget: strconv.Itoa(backlogQueueTarget)}
	q := "queueTarget=" + strconv.Itoa(backlogQueueTarget)
	return []inference.Policy{
		{Name: inference.PolicyAlwaysOn, Kind: inference.KindAlwaysOn},
		{Name: inference.PolicySeeds, Kind: inference.KindGPUUtil, Setting: "gpu-util 80%, Prometheus lag 0-60s"},
		{Name: inference.PolicyKEDAPoll, Kind: inference.KindScaler, Metadata: backlog, Setting: q + ", polled"},
		{Name: inference.PolicyBacklog, Kind: inference.KindScaler, Metadata: backlog, Push: true, Setting: q + ", pushed"},
		{Name: inference.PolicyRecommends, Kind: inference.KindScaler, Metadata: demandKeys(), Push: true, Setting: demandSetting()},
	}
}

// demandSetting names the queue-demand trigger's keys, as the summary prints them.
func demandSetting() string {
	md := demandKeys()
	return fmt.Sprintf("%s=%s, %s=%s", scaler.KeyTargetWait, md[scaler.KeyTargetWait], scaler.KeyConcurrency, md[scaler.KeyConcurrency])
}

// replayBaselines replays the requests the run started (arrival and service time since
// start) under every policy of replayPolicies, and always on at the replicas the burst's
// mean rate keeps busy, on replayModel over the run's elapsed time. It returns the
// baselines and how many requests it replayed. With no request there is nothing to
// compare: it returns none.
func replayBaselines(ctx context.Context, cfg Config, maxReplicas int, reqs []request, start time.Time, elapsed time.Duration) ([]Baseline, int, error) {
	if len(reqs) == 0 {
		return nil, 0, nil
	}
	svc := inference.Service{Name: inferenceName}
	for _, r := range reqs {
		svc.Requests = append(svc.Requests, inference.Request{At: r.arrived.Sub(start), Service: r.service})
	}
	// The queue is FIFO, so requests start in the order they arrived; replay wants that
	// order, so keep it whatever the queue does.
	slices.SortStableFunc(svc.Requests, func(a, b inference.Request) int { return int(a.At - b.At) })
	tail := max(elapsed-svc.Requests[len(svc.Requests)-1].At, 0) // the replay ends where the run did
	model := replayModel(cfg, maxReplicas)
	res, err := inference.Run(ctx, []inference.Service{svc}, model, replayPolicies(), nil, tail, nil)
	if err != nil {
		return nil, 0, fmt.Errorf("replay the run's requests: %w", err)
	}
	// A static deployment sized for the burst's mean rate: cheaper than the peak, and
	// requests wait whenever arrivals bunch up.
	model.MaxReplicas = min(burstReplicas(), maxReplicas)
	burst, err := inference.Run(ctx, []inference.Service{svc}, model,
		[]inference.Policy{{Name: inference.PolicyAlwaysOn, Kind: inference.KindAlwaysOn}}, nil, tail, nil)
	if err != nil {
		return nil, 0, fmt.Errorf("replay the run's requests: %w", err)
	}
	var out []Baseline
	for i, p := range res.Policies {
		b := baseline(p)
		if p.Name == inference.PolicyAlwaysOn {
			b.PeakNeed = inference.PeakNeed(svc.Requests, model.Concurrency)
			b.Setting = fmt.Sprintf("%d replicas, the peak need", b.PeakReplicas)
			if b.PeakNeed > b.PeakReplicas {
				b.Setting = fmt.Sprintf("%d replicas, all GPUs; need %d", b.PeakReplicas, b.PeakNeed)
			}
			out = append(out, b)
			b = baseline(burst.Policies[0])
			b.Setting = fmt.Sprintf("%d replicas, the burst's mean rate", b.PeakReplicas)
		} else {
			b.Setting = replayPolicies()[i].Setting
		}
		out = append(out, b)
	}
	return out, res.Requests, nil
}

func baseline(p inference.PolicyResult) Baseline {
	// replay counts MaxReplicas where it scales, which always-on never does: its
	// replicas are in its timeline, the same in every bin.
	peak := p.MaxReplicas
	for _, n := range p.Timeline.Replicas {
		peak = max(peak, int(math.Round(n)))
	}
	return Baseline{Policy: p.Name, PeakReplicas: peak, GPUSeconds: p.GPUHours * 3600,
		WaitP50: p.WaitP50, WaitP99: p.WaitP99, ColdStartFraction: p.ColdStartFraction}
}
