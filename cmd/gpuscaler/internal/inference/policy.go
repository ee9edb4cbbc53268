package inference

import (
	"strconv"
	"time"

	"github.com/gpuscaler/gpuscaler/scaler"
)

// The policy names, as the output spells them.
const (
	PolicyAlwaysOn   = "always-on"
	PolicySeeds      = "seeds-hpa-gpu-util"
	PolicyKEDAPoll   = "keda-poll-backlog"
	PolicyBacklog    = "gpuscaler-backlog"
	PolicyRecommends = "gpuscaler"
)

// The configurations docs/triggers.md recommends, which replay measures as the policy
// "gpuscaler", with pushed activation (external-push) and KEDA's default cooldownPeriod,
// 300s, the baselines' own:
//   - a service that stays up and scales out (Azure LLM): queue-demand, targetWait
//     RecommendedTargetWait, the p99 wait its users accept once warm;
//   - a service that scales to zero on sparse traffic (GenTD26): queue-backlog with
//     queueTarget the replica's concurrency. There the model load sets the p99 whatever
//     the metric, and queue-demand, which provisions for the minute's rate a burst
//     raises, holds more replicas than the burst's items (replay shows it in the
//     frontier "gpuscaler-demand").
const (
	RecommendedTargetWait = 10 * time.Second
	RecommendedCooldown   = 300 * time.Second
)

// Policy is one way of scaling a service.
type Policy struct {
	// Name is the policy's name in the output (always-on, seeds-hpa-gpu-util,
	// keda-poll-backlog, gpuscaler-backlog, gpuscaler).
	Name string
	// Setting is the knob's value this run uses, for frontiers ("queueTarget=16").
	Setting string
	// Kind says who decides the replicas.
	Kind PolicyKind
	// Metadata is the gpuscaler trigger's metadata (KindScaler), without the queue,
	// which the replay sets per service.
	Metadata map[string]string
	// Push activates from zero on the report that shows work, as StreamIsActive does;
	// otherwise only at KEDA's polls.
	Push bool
	// Cooldown, when not zero, replaces the scenario's cooldownPeriod.
	Cooldown time.Duration
}

// PolicyKind says who decides a policy's replicas.
type PolicyKind int

const (
	// KindScaler: KEDA and the HPA on the gpuscaler trigger's answers.
	KindScaler PolicyKind = iota
	// KindAlwaysOn: a fixed number of replicas, the peak the service needs.
	KindAlwaysOn
	// KindGPUUtil: the HPA on average GPU utilisation through dcgm-exporter,
	// Prometheus and prometheus-adapter (see gpuUtilLag).
	KindGPUUtil
)

// BacklogPolicy is queue-backlog at queueTarget q; push says whether activation is
// pushed (gpuscaler) or polled (KEDA's own queue scalers).
func BacklogPolicy(name string, q int, push bool) Policy {
	return Policy{Name: name, Setting: "queueTarget=" + strconv.Itoa(q), Kind: KindScaler, Push: push,
		Metadata: map[string]string{scaler.KeyQueueTarget: strconv.Itoa(q)}}
}

// DemandPolicy is queue-demand at targetWait w, pushed.
func DemandPolicy(w time.Duration, concurrency int, cooldown time.Duration, setting string) Policy {
	md := map[string]string{scaler.KeyTargetWait: w.String()}
	if concurrency > 1 {
		md[scaler.KeyConcurrency] = strconv.Itoa(concurrency)
	}
	return Policy{Name: PolicyRecommends, Setting: setting, Kind: KindScaler, Push: true, Cooldown: cooldown, Metadata: md}
}
