package replay

import (
	"fmt"
	"maps"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"time"

	"github.com/gpuscaler/gpuscaler/cmd/gpuscaler/internal/inference"
	"github.com/gpuscaler/gpuscaler/cmd/gpuscaler/internal/kedarules"
	"github.com/gpuscaler/gpuscaler/cmd/gpuscaler/internal/traces"
	"github.com/gpuscaler/gpuscaler/scaler"
)

// PolicyDemandSweep names the frontier of queue-demand's targetWait in a scenario where
// the recommended configuration is another.
const PolicyDemandSweep = "gpuscaler-demand"

// Scenario is a replay's services, cluster and policies.
type Scenario struct {
	Trace string
	// Recommends says what the policy "gpuscaler" is in this scenario.
	Recommends string
	Services   []inference.Service
	Config     inference.Config
	Policies   []inference.Policy
	Sweeps     []inference.Policy
	// Tail is how long the replay goes on after the last request, for every policy to
	// scale down.
	Tail time.Duration
}

// Reverse plays the scenario's requests backwards in time: one that arrived d before
// the last request now arrives d after the first, with the same service time. The
// traffic keeps its rate, mix and bursts, and its rises become falls and its falls
// rises: the same statistics in an order no setting was tuned on. A sharp fall, which
// costs a scaler nothing, becomes a sharp rise, which it must meet within a cold start.
func (sc *Scenario) Reverse() {
	first, last := time.Duration(math.MaxInt64), time.Duration(0)
	for _, svc := range sc.Services {
		if n := len(svc.Requests); n > 0 {
			first, last = min(first, svc.Requests[0].At), max(last, svc.Requests[n-1].At)
		}
	}
	for _, svc := range sc.Services {
		reqs := svc.Requests
		slices.Reverse(reqs)
		for i := range reqs {
			reqs[i].At = first + last - reqs[i].At
		}
	}
}

// SetHPATolerance models a cluster whose HPAs tolerate tol both ways rather than the
// default 10%, and has every queue-demand trigger of the scenario repeat it
// (scaleUpTolerance), as docs/triggers.md asks of a user of such a cluster.
func (sc *Scenario) SetHPATolerance(tol float64) {
	sc.Config.Tolerances = &kedarules.Tolerances{ScaleDown: tol, ScaleUp: tol}
	for _, ps := range [][]inference.Policy{sc.Policies, sc.Sweeps} {
		for i := range ps {
			if _, demand := ps[i].Metadata[scaler.KeyTargetWait]; demand {
				md := maps.Clone(ps[i].Metadata)
				md[scaler.KeyScaleUpTolerance] = strconv.FormatFloat(tol, 'g', -1, 64)
				ps[i].Metadata = md
			}
		}
	}
}

// kedaDefaults is a ScaledObject left at KEDA's defaults, with the HPA
// kube-controller-manager runs by default.
func kedaDefaults(load *traces.Durations, seed uint64) inference.Config {
	return inference.Config{
		MinReplicas:     0,
		PollingInterval: 30 * time.Second,
		Cooldown:        300 * time.Second,
		HPASync:         15 * time.Second,
		ScaleDownWindow: 300 * time.Second,
		ReportInterval:  time.Second,
		Load:            func(r *rand.Rand) time.Duration { return load.Sample(r) },
		Seed:            seed,
	}
}

// GenTD26 is the scale-to-zero scenario: one Deployment per model checkpoint, each at
// KEDA's defaults (minReplicaCount 0, maxReplicaCount 8, pollingInterval 30s,
// cooldownPeriod 300s), the HPA's 15s sync and default behaviour, one request at a time
// per replica, the requests' real execution times, and model loads drawn from the
// system's real load latencies. The recommended policy's cooldown is swept from 60s to
// 1h.
func GenTD26(reqs []traces.GenTD26Request, load *traces.Durations, seed uint64) (*Scenario, error) {
	if len(reqs) == 0 {
		return nil, fmt.Errorf("GenTD26: no requests")
	}
	start := reqs[0].At
	byCkpt := map[string][]inference.Request{}
	for _, r := range reqs {
		byCkpt[r.Checkpoint] = append(byCkpt[r.Checkpoint], inference.Request{At: r.At.Sub(start), Service: r.Exec})
	}
	var services []inference.Service
	for _, name := range slices.Sorted(maps.Keys(byCkpt)) {
		services = append(services, inference.Service{Name: name, Requests: byCkpt[name]})
	}
	cfg := kedaDefaults(load, seed)
	cfg.Concurrency, cfg.MaxReplicas = 1, 8
	sc := &Scenario{Trace: "gentd26", Services: services, Config: cfg, Tail: time.Hour,
		Recommends: "queue-backlog, queueTarget 1 (the replica's concurrency), pushed activation"}
	rec := inference.BacklogPolicy(inference.PolicyRecommends, 1, true)
	rec.Setting = "cooldownPeriod=" + inference.RecommendedCooldown.String()
	sc.Policies = []inference.Policy{
		{Name: inference.PolicyAlwaysOn, Kind: inference.KindAlwaysOn},
		{Name: inference.PolicySeeds, Kind: inference.KindGPUUtil},
		inference.BacklogPolicy(inference.PolicyKEDAPoll, 1, false),
		inference.BacklogPolicy(inference.PolicyBacklog, 1, true),
		rec,
	}
	for _, c := range []time.Duration{time.Minute, 2 * time.Minute, 5 * time.Minute, 10 * time.Minute, 20 * time.Minute, 30 * time.Minute, time.Hour} {
		p := inference.BacklogPolicy(inference.PolicyRecommends, 1, true)
		p.Setting, p.Cooldown = "cooldownPeriod="+c.String(), c
		sc.Sweeps = append(sc.Sweeps, p)
	}
	// queue-demand over its knob, at the default cooldown, so its frontier compares.
	for _, w := range []time.Duration{30 * time.Second, 2 * time.Minute, 10 * time.Minute, time.Hour} {
		p := inference.DemandPolicy(w, 1, 0, "targetWait="+w.String())
		p.Name = PolicyDemandSweep
		sc.Sweeps = append(sc.Sweeps, p)
	}
	return sc, nil
}

// LLMServiceModel turns an LLM request's tokens into seconds of service on one replica.
// The default (DefaultLLMServiceModel) stands for Llama 3.1 8B served by vLLM on one
// A100-80GB at up to 8 requests at once.
type LLMServiceModel struct {
	Concurrency    int
	Overhead       time.Duration // per request: scheduling, tokenisation
	PerPromptToken time.Duration // prefill
	PerOutputToken time.Duration // decode, at the model's concurrency
}

// DefaultLLMServiceModel: Llama 3.1 8B, vLLM, one A100-80GB SXM, 8 requests at once.
// Prefill about 4,000 prompt tokens/s per request and 30 ms per output token at that
// batch are in the range public vLLM benchmarks on that GPU report (Lambda's
// vllm-benchmark, A100-80GB; Ori's Llama 3.1 8B vLLM benchmark); it is a model, not a
// measurement, which is why replay runs it at ×0.5 and ×2 speed too.
var DefaultLLMServiceModel = LLMServiceModel{Concurrency: 8, Overhead: 25 * time.Millisecond,
	PerPromptToken: 250 * time.Microsecond, PerOutputToken: 30 * time.Millisecond}

// Service returns how long a request of ctx prompt and gen output tokens takes, at speed
// times the model's speed.
func (m LLMServiceModel) Service(ctx, gen int, speed float64) time.Duration {
	d := m.Overhead + time.Duration(ctx)*m.PerPromptToken + time.Duration(gen)*m.PerOutputToken
	return time.Duration(float64(d) / speed)
}

// LLMRequest is one request of a dense LLM trace: when it arrived, from the trace's
// start, and its prompt and output tokens.
type LLMRequest struct {
	At             time.Duration
	Prompt, Output int
}

// AzureLLM is the scale-out scenario on Azure's conversation hour (see LLM).
func AzureLLM(reqs []traces.AzureLLMRequest, model LLMServiceModel, speed float64, load *traces.Durations, seed uint64) (*Scenario, error) {
	if len(reqs) == 0 {
		return nil, fmt.Errorf("Azure LLM: no requests")
	}
	llm := make([]LLMRequest, len(reqs))
	for i, r := range reqs {
		llm[i] = LLMRequest{At: r.At.Sub(reqs[0].At), Prompt: r.ContextTokens, Output: r.GeneratedTokens}
	}
	return LLM(FormatAzureLLM, llm, model, speed, load, seed)
}

// Mooncake is the scale-out scenario on Mooncake's conversation hour (see LLM): another
// service, with long contexts, and arrivals recorded in steps of about 3 s.
func Mooncake(reqs []traces.MooncakeRequest, model LLMServiceModel, speed float64, load *traces.Durations, seed uint64) (*Scenario, error) {
	if len(reqs) == 0 {
		return nil, fmt.Errorf("Mooncake: no requests")
	}
	llm := make([]LLMRequest, len(reqs))
	for i, r := range reqs {
		llm[i] = LLMRequest{At: r.At - reqs[0].At, Prompt: r.InputTokens, Output: r.OutputTokens}
	}
	return LLM(FormatMooncake, llm, model, speed, load, seed)
}

// LLM is the scale-out scenario of a dense LLM trace: one service taking the trace's
// requests, their service times from model at speed, KEDA's defaults with
// maxReplicaCount 32. The backlog metric is swept over queueTarget 1 to 64 and
// queue-demand over targetWait.
func LLM(trace string, reqs []LLMRequest, model LLMServiceModel, speed float64, load *traces.Durations, seed uint64) (*Scenario, error) {
	if len(reqs) == 0 {
		return nil, fmt.Errorf("%s: no requests", trace)
	}
	if speed <= 0 {
		return nil, fmt.Errorf("--service-speed %g: want above 0", speed)
	}
	svc := inference.Service{Name: "llm"}
	for _, r := range reqs {
		svc.Requests = append(svc.Requests, inference.Request{At: r.At, Service: model.Service(r.Prompt, r.Output, speed)})
	}
	cfg := kedaDefaults(load, seed)
	cfg.Concurrency, cfg.MaxReplicas = model.Concurrency, 32
	// The hour is cut from a service that ran before it and after it: the wake from zero
	// replicas at its start is the cut's, so its first five minutes are run but not
	// measured, and so is the scale-down from the stop at its end, which the service
	// never saw: GPU-hours run to the last request's arrival.
	cfg.WarmUp, cfg.CutEnd = 5*time.Minute, true
	sc := &Scenario{Trace: trace, Services: []inference.Service{svc}, Config: cfg, Tail: 15 * time.Minute,
		Recommends: fmt.Sprintf("queue-demand, targetWait %s, concurrency %d, pushed activation", inference.RecommendedTargetWait, model.Concurrency)}
	c := model.Concurrency
	sc.Policies = []inference.Policy{
		{Name: inference.PolicyAlwaysOn, Kind: inference.KindAlwaysOn},
		{Name: inference.PolicySeeds, Kind: inference.KindGPUUtil},
		inference.BacklogPolicy(inference.PolicyKEDAPoll, c, false),
		inference.BacklogPolicy(inference.PolicyBacklog, c, true),
		inference.DemandPolicy(inference.RecommendedTargetWait, c, 0, "targetWait="+inference.RecommendedTargetWait.String()),
	}
	for _, q := range QueueTargetSweep {
		sc.Sweeps = append(sc.Sweeps, inference.BacklogPolicy(inference.PolicyBacklog, q, true))
	}
	for _, w := range TargetWaitSweep() {
		sc.Sweeps = append(sc.Sweeps, inference.DemandPolicy(w, c, 0, "targetWait="+w.String()))
	}
	return sc, nil
}

// QueueTargetSweep is the settings of queueTarget the dense LLM scenarios sweep: 1 to
// 64, doubling.
var QueueTargetSweep = []int{1, 2, 4, 8, 16, 32, 64}

// TargetWaitSweep is the settings of targetWait that the Azure LLM scenario sweeps: 10 ms,
// then twelve a decade, the E12 series of preferred numbers (1, 1.2, 1.5, … 8.2), from
// 100 ms to 10 min. A frontier is only as fine as its settings: the realised p99 wait
// moves in steps as the HPA's tolerance holds or lets go of a replica, so a coarse sweep
// (1-2-5 a decade, as before) could step over the setting that matches a backlog point.
// Evenly spaced on a log scale, every decade is measured alike, so no region is
// sampled more finely than another to find a lucky point.
func TargetWaitSweep() []time.Duration {
	e12 := []time.Duration{10, 12, 15, 18, 22, 27, 33, 39, 47, 56, 68, 82}
	ws := []time.Duration{10 * time.Millisecond}
	for decade := 100 * time.Millisecond; decade < 10*time.Minute; decade *= 10 {
		for _, x := range e12 {
			if w := x * decade / 10; w < 10*time.Minute {
				ws = append(ws, w)
			}
		}
	}
	return append(ws, 10*time.Minute)
}
