// Package metadata parses the trigger metadata of KEDA ScaledObjects and ScaledJobs that
// consult gpuscaler (DESIGN.md, "The KEDA contract") into a Trigger. It is the scaler's
// parser of outside input, kept in a package of its own, with few dependencies, so that
// its fuzz target runs fast: Go's fuzzer follows the coverage of every package a test
// binary links, and the scaler's links gRPC, NATS and Prometheus.
package metadata

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"

	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/labels"

	gpuscalerv1 "github.com/gpuscaler/gpuscaler/proto/gpuscaler/v1"
	"github.com/gpuscaler/gpuscaler/scaler/demand"
)

// Trigger-metadata keys, as a ScaledObject's or ScaledJob's trigger spells them (see
// DESIGN.md, "The KEDA contract"). KEDA passes the trigger's whole metadata map; a key
// written <key>FromEnv arrives with the value KEDA resolved from the workload's
// environment and counts as <key>.
const (
	KeyQueue                = "queue"
	KeyQueueTarget          = "queueTarget"
	KeyActivationQueueDepth = "activationQueueDepth"
	KeyPodSelector          = "podSelector"
	KeyGPUUtilTarget        = "gpuUtilTarget"
	KeyActivationGPUUtil    = "activationGpuUtil"
	KeyGPUMemoryTarget      = "gpuMemoryTarget"
	KeyGPUsPerReplica       = "gpusPerReplica"
	KeyCapacityAware        = "capacityAware"
	KeyCapacityHeadroom     = "capacityHeadroom"
	KeyMinReplicaCount      = "minReplicaCount"
	KeyNodeSelector         = "nodeSelector"
	KeyTolerations          = "tolerations"
	KeyStaleAfter           = "staleAfter"
	KeyStream               = "stream"
	KeyConsumer             = "consumer"
	KeyTargetWait           = "targetWait"
	KeyConcurrency          = "concurrency"
	KeyColdStart            = "coldStart"
	KeyScaleUpTolerance     = "scaleUpTolerance"
	KeyPushInterval         = "pushInterval"
	KeyCPUPerReplica        = "cpuPerReplica"
	KeyMemoryPerReplica     = "memoryPerReplica"
)

// Defaults of the optional keys.
const (
	DefaultQueueTarget          = 1.0
	DefaultActivationQueueDepth = 0.0
	DefaultActivationGPUUtil    = 0.0
	DefaultStaleAfter           = 30 * time.Second
	// DefaultPushInterval is KEDA's default pollingInterval (defaultPollingInterval in
	// apis/keda/v1alpha1/withtriggers_types.go): pushes then write a ScaledObject's
	// status no more often than the polls of an active trigger do, and it is below KEDA's
	// default cooldownPeriod (defaultCooldownPeriod, 300 s, in
	// pkg/scaling/executor/scale_executor.go), which a pushInterval must not exceed (see
	// Trigger.PushInterval).
	DefaultPushInterval = 30 * time.Second
)

// Metric names, as GetMetricSpec returns them. KEDA prefixes each with "s<trigger index>-"
// for the HPA and strips the prefix again before GetMetrics.
const (
	MetricQueueBacklog = "queue-backlog"
	MetricGPUUtil      = "gpu-util"
	MetricGPUMemory    = "gpu-memory"
	// MetricQueueDemand is the replicas a queue's demand needs (see DESIGN.md), given
	// instead of queue-backlog when the trigger sets targetWait. Its target is 1: the
	// HPA's ceil(value / 1) is the replica count.
	MetricQueueDemand = "queue-demand"
)

// Bounds of targets. KEDA hands a target to the HPA in milli-units (int64(v*1000)), so a
// target below a thousandth would reach the HPA as 0, and one above 1e15 would overflow.
const (
	minTarget   = 0.001
	maxTarget   = 1e15
	emptyKeyTag = "(empty key)"
)

// MaxStaleAfter bounds staleAfter, and the scaler's default for it.
const MaxStaleAfter = 24 * time.Hour

// Bounds of coldStart. A replica of a GPU workload takes seconds at least (a container
// start, a model's weights read into GPU memory: 23 to 90 s in the traces and models the
// project measured), and a figure over an hour is a mistake in units rather than a load.
const (
	MinColdStart = time.Second
	MaxColdStart = gpuscalerv1.MaxColdStartSeconds * time.Second
)

// fromEnvSuffix marks a key whose value KEDA resolved from the workload's environment.
const fromEnvSuffix = "FromEnv"

// kedaKeys are keys KEDA itself reads from an external trigger's metadata and passes on
// with the rest; they are not ours to judge.
var kedaKeys = []string{"scalerAddress", "enableTLS", "unsafeSsl", "caCert", "tlsClientCert", "tlsClientKey"}

// knownKeys lists every key gpuscaler reads, in the order errors list them.
var knownKeys = []string{
	KeyQueue, KeyQueueTarget, KeyActivationQueueDepth,
	KeyPodSelector, KeyGPUUtilTarget, KeyActivationGPUUtil, KeyGPUMemoryTarget, KeyGPUsPerReplica,
	KeyCapacityAware, KeyCapacityHeadroom, KeyMinReplicaCount, KeyNodeSelector, KeyTolerations, KeyCPUPerReplica, KeyMemoryPerReplica,
	KeyStaleAfter, KeyStream, KeyConsumer, KeyTargetWait, KeyConcurrency, KeyColdStart, KeyScaleUpTolerance, KeyPushInterval,
}

// Keys returns every key gpuscaler reads, in the order errors list them.
func Keys() []string { return slices.Clone(knownKeys) }

// ErrInvalid reports trigger metadata gpuscaler cannot act on. The gRPC server
// answers it with InvalidArgument.
var ErrInvalid = errors.New("invalid trigger metadata")

// Error names the key, the value and what was expected.
type Error struct {
	Key   string
	Value string
	Want  string
}

func (e *Error) Error() string {
	return fmt.Sprintf("trigger metadata %s=%q: want %s", e.Key, e.Value, e.Want)
}

// Is makes errors.Is(err, ErrInvalid) true.
func (e *Error) Is(target error) bool { return target == ErrInvalid }

// Trigger is one parsed trigger: what to measure for a ScaledObject or ScaledJob, in its
// namespace. A zero field means the key was not given. Triggers are immutable once parsed.
type Trigger struct {
	// Namespace of the ScaledObject; queues and pods are looked up in it alone.
	Namespace string

	// Queue names a queue reported by producers; empty when not used.
	Queue                string
	QueueTarget          float64
	ActivationQueueDepth float64
	// TargetWait, when set, makes the queue's metric queue-demand: the replicas that
	// serve the queue's arrivals and start the items waiting within TargetWait.
	// Concurrency is the items one replica serves at once (1 unless given).
	TargetWait  time.Duration
	Concurrency int
	// ColdStart is how long a new replica takes to serve, as the trigger states it; 0
	// when not given, and then the scaler uses a measured figure where it has one (a
	// producer's, then the collector's). A stated figure wins over a measured one: the
	// author knows what a first start costs (an image pull, a node brought up) that no
	// measurement of an earlier start saw.
	ColdStart time.Duration
	// ScaleUpTolerance repeats the HPA's tolerance for scaling up, which the scaler
	// cannot see: the cluster's (10% by default) or the ScaledObject's
	// advanced.horizontalPodAutoscalerConfig.behavior.scaleUp.tolerance. A wait missed
	// now goes just past it (demand.Demand). demand.HPATolerance unless given.
	ScaleUpTolerance float64

	// PodSelector selects the workload's pods; their GPUs are the workload's. Nil when
	// the trigger measures no GPUs. With CapacityAware it selects the Jobs' pods, and
	// those holding devices are the running Jobs the cap counts; it gives no GPU metric
	// or activity then.
	PodSelector       labels.Selector
	GPUUtilTarget     float64 // 0 when not given
	ActivationGPUUtil float64
	GPUMemoryTarget   float64 // 0 when not given
	// ActivateOnUtil says the GPU part is active when the average utilisation is above
	// ActivationGPUUtil: true when gpuUtilTarget or activationGpuUtil is given to a
	// trigger with a queue or stream. Otherwise (a gpuMemoryTarget trigger) the GPU part
	// is active while the workload holds GPUs, which needs no utilisation figure a source
	// may not have. A trigger with only podSelector is always active (see GPUOnly).
	ActivateOnUtil bool

	// GPUsPerReplica is the number of GPUs one replica holds; 0 means use the observed
	// number (GPUs per pod), else 1. GPUProfile is set instead when the key names a MIG
	// profile ("1g.10gb"): one such slice per replica.
	GPUsPerReplica int
	GPUProfile     string

	// CapacityAware caps the backlog at what free GPUs can place now, plus
	// CapacityHeadroom replicas (to let pending Jobs call for new nodes).
	CapacityAware    bool
	CapacityHeadroom int
	// MinReplicaCount repeats the ScaledJob's spec.minReplicaCount, which the scaler
	// cannot see: KEDA leaves that many unfinished Jobs out of those its scaling
	// strategy subtracts, so the cap must leave them out too.
	MinReplicaCount int
	NodeSelector    labels.Selector // nil means every node
	// Tolerations are the taints the Jobs tolerate: a node whose NoSchedule or NoExecute
	// taints they do not all tolerate, or a cordoned one unless they tolerate
	// node.kubernetes.io/unschedulable, is not counted. Nil tolerates none (but the
	// taint of the GPU resource the Jobs ask for; see the scaler's capacity).
	Tolerations []Toleration
	// CPUPerReplica (millicores) and MemoryPerReplica (bytes) are what one Job requests of
	// a node's CPU and memory, which the scaler cannot see: a node counts no more Jobs
	// than its free CPU and memory take, where it reports them. 0: not given, the node
	// counts on its devices alone.
	CPUPerReplica    int64
	MemoryPerReplica int64

	StaleAfter time.Duration

	// Stream and Consumer name a JetStream work queue followed directly.
	Stream   string
	Consumer string

	// PushInterval is the least time between two activations StreamIsActive pushes; an
	// activation within it of the last push is left to KEDA's polls. KEDA answers every
	// push with a status write, and a push buys nothing while replicas are up. It is
	// sound while it is at most the ScaledObject's cooldownPeriod: a push sets
	// lastActiveTime, and KEDA scales to zero only a cooldownPeriod after that
	// (scaleToZeroOrIdle in pkg/scaling/executor/scale_scaledobjects.go), so within
	// PushInterval of a push the workload has not been scaled to zero. 0 pushes every
	// activation.
	PushInterval time.Duration
}

// MetricSpec is one metric a trigger gives and its per-replica target.
type MetricSpec struct {
	Name   string
	Target float64
}

// MetricSpecs returns the trigger's metrics in a fixed order: queue-backlog first, because
// a ScaledJob acts on the first metric only.
func (t *Trigger) MetricSpecs() []MetricSpec {
	var specs []MetricSpec
	switch {
	case t.TargetWait > 0:
		specs = append(specs, MetricSpec{Name: MetricQueueDemand, Target: 1})
	case t.Queue != "" || t.Stream != "":
		specs = append(specs, MetricSpec{Name: MetricQueueBacklog, Target: t.QueueTarget})
	}
	if t.GPUUtilTarget > 0 {
		specs = append(specs, MetricSpec{Name: MetricGPUUtil, Target: t.GPUUtilTarget})
	}
	if t.GPUMemoryTarget > 0 {
		specs = append(specs, MetricSpec{Name: MetricGPUMemory, Target: t.GPUMemoryTarget})
	}
	return specs
}

// ParseTrigger parses a trigger's metadata for a ScaledObject in namespace. defaultStaleAfter
// applies when the trigger gives no staleAfter (DefaultStaleAfter when zero). Every error
// is a *Error.
func ParseTrigger(namespace string, metadata map[string]string, defaultStaleAfter time.Duration) (*Trigger, error) {
	if err := gpuscalerv1.ValidateNamespace(namespace); err != nil {
		return nil, &Error{Key: "namespace", Value: namespace, Want: "the ScaledObject's namespace, a DNS-1123 label"}
	}
	md, written, err := resolveKeys(metadata)
	if err != nil {
		return nil, err
	}
	if defaultStaleAfter <= 0 {
		defaultStaleAfter = DefaultStaleAfter
	}
	t := &Trigger{
		Namespace:            namespace,
		QueueTarget:          DefaultQueueTarget,
		ActivationQueueDepth: DefaultActivationQueueDepth,
		ActivationGPUUtil:    DefaultActivationGPUUtil,
		StaleAfter:           defaultStaleAfter,
		Concurrency:          1,
		ScaleUpTolerance:     demand.HPATolerance,
		PushInterval:         DefaultPushInterval,
	}
	p := parser{md: md, written: written}
	t.Queue = p.name(KeyQueue, gpuscalerv1.ValidateQueueName, "a queue name: no '.', '*', '>' or white space")
	p.float(KeyQueueTarget, &t.QueueTarget, minTarget, maxTarget, "a number from 0.001 to 1e15")
	p.float(KeyActivationQueueDepth, &t.ActivationQueueDepth, 0, maxTarget, "a number from 0 to 1e15")
	t.PodSelector = p.selector(KeyPodSelector)
	p.float(KeyGPUUtilTarget, &t.GPUUtilTarget, minTarget, 100, "a percentage from 0.001 to 100")
	p.float(KeyActivationGPUUtil, &t.ActivationGPUUtil, 0, 100, "a percentage from 0 to 100")
	p.float(KeyGPUMemoryTarget, &t.GPUMemoryTarget, minTarget, 100, "a percentage from 0.001 to 100")
	t.GPUsPerReplica, t.GPUProfile = p.gpusPerReplica(KeyGPUsPerReplica)
	p.bool(KeyCapacityAware, &t.CapacityAware)
	p.whole(KeyCapacityHeadroom, &t.CapacityHeadroom, 0, 1_000_000)
	p.whole(KeyMinReplicaCount, &t.MinReplicaCount, 0, 1_000_000)
	t.NodeSelector = p.selector(KeyNodeSelector)
	t.Tolerations = p.tolerations(KeyTolerations)
	t.CPUPerReplica = p.quantity(KeyCPUPerReplica, resource.NewQuantity(maxCPUCores, resource.DecimalSI), true,
		"a Kubernetes quantity of CPU from 1m to 1048576, such as \"8\" or \"500m\"")
	t.MemoryPerReplica = p.quantity(KeyMemoryPerReplica, resource.NewQuantity(gpuscalerv1.MaxNodeMemoryBytes, resource.BinarySI), false,
		"a Kubernetes quantity of memory from 1 byte to 1Pi, such as \"64Gi\" or \"500M\"")
	p.duration(KeyStaleAfter, &t.StaleAfter)
	t.Stream = p.name(KeyStream, validateJetStreamName, "a JetStream stream name: no '.', '*', '>', '/', '\\' or white space")
	t.Consumer = p.name(KeyConsumer, validateJetStreamName, "a JetStream consumer name: no '.', '*', '>', '/', '\\' or white space")
	p.durationIn(KeyTargetWait, &t.TargetWait, 10*time.Millisecond, MaxStaleAfter, `a duration from 10ms to 24h, such as "30s"`)
	p.whole(KeyConcurrency, &t.Concurrency, 1, 1_000_000)
	p.durationIn(KeyColdStart, &t.ColdStart, MinColdStart, MaxColdStart, `a duration from 1s to 1h, such as "45s"`)
	p.share(KeyScaleUpTolerance, &t.ScaleUpTolerance, `a share from 0 to 1, a Kubernetes quantity as an HPA's tolerance is written, such as "0.05" or "50m"`)
	p.durationIn(KeyPushInterval, &t.PushInterval, 0, MaxStaleAfter, `a duration from 0s to 24h, such as "30s"; at most the ScaledObject's cooldownPeriod`)
	if p.err != nil {
		return nil, p.err
	}
	if err := t.checkCombination(md, written); err != nil {
		return nil, err
	}
	_, activationGiven := md[KeyActivationGPUUtil]
	t.ActivateOnUtil = (t.GPUUtilTarget > 0 || activationGiven) && !t.GPUOnly()
	return t, nil
}

// GPUOnly reports a trigger with podSelector and neither queue nor stream. Such a trigger
// is always active when its data can be judged: at zero replicas there are no GPUs to
// read, so an inactive one could never wake its workload again, and KEDA, which scales to
// zero on an inactive trigger once cooldownPeriod has passed, would leave it at zero for
// good. Always active, KEDA keeps the workload at one replica at least, as it refuses
// scale to zero for cpu and memory triggers alone.
func (t *Trigger) GPUOnly() bool {
	return t.PodSelector != nil && t.Queue == "" && t.Stream == ""
}

// checkCombination checks the keys make sense together. written maps each key to the
// name the trigger gave it (queueFromEnv, say), which errors use.
func (t *Trigger) checkCombination(md, written map[string]string) error {
	fail := func(key, want string) error {
		name := written[key]
		if name == "" {
			name = key
		}
		return &Error{Key: name, Value: md[key], Want: want}
	}
	if (t.Stream == "") != (t.Consumer == "") {
		if t.Stream == "" {
			return fail(KeyStream, "stream and consumer given together")
		}
		return fail(KeyConsumer, "stream and consumer given together")
	}
	if t.Queue == "" && t.Stream == "" && t.PodSelector == nil {
		return fail(KeyQueue, "one of queue, stream with consumer, or podSelector")
	}
	if t.Queue != "" && t.Stream != "" {
		return fail(KeyStream, "either queue or stream with consumer, not both")
	}
	if t.CapacityAware && t.Queue == "" && t.Stream == "" {
		return fail(KeyCapacityAware, "a queue or stream: capacity caps a backlog")
	}
	switch {
	case t.PodSelector == nil:
		for _, k := range []string{KeyGPUUtilTarget, KeyActivationGPUUtil, KeyGPUMemoryTarget} {
			if _, ok := md[k]; ok {
				return fail(k, "podSelector set too: it says whose GPUs to measure")
			}
		}
	case t.CapacityAware:
		// podSelector selects the Jobs' pods, to count those holding GPUs as running
		// Jobs. KEDA sums a ScaledJob's first metric but divides by the average target of
		// all its metrics, so a ScaledJob trigger must give one metric; and activity on
		// the Jobs' own GPUs would ask for Jobs because Jobs run.
		for _, k := range []string{KeyGPUUtilTarget, KeyActivationGPUUtil, KeyGPUMemoryTarget} {
			if _, ok := md[k]; ok {
				return fail(k, "no capacityAware too: a ScaledJob trigger must give exactly one metric, and with capacityAware podSelector only counts the Jobs holding GPUs")
			}
		}
	case t.GPUUtilTarget == 0 && t.GPUMemoryTarget == 0:
		return fail(KeyPodSelector, "gpuUtilTarget or gpuMemoryTarget set too: the metric to scale on")
	}
	// A key that shapes nothing the trigger gives would be accepted and ignored, and the
	// workload would scale in a way its author did not write.
	if _, ok := md[KeyActivationGPUUtil]; ok && t.GPUOnly() {
		return fail(KeyActivationGPUUtil, "queue, or stream with consumer, set too: a trigger with only podSelector is always active, since at zero replicas it has no GPUs to read and could never wake the workload again; activationGpuUtil would change nothing")
	}
	if t.Queue == "" && t.Stream == "" {
		for _, k := range []string{KeyQueueTarget, KeyActivationQueueDepth} {
			if _, ok := md[k]; ok {
				return fail(k, "queue, or stream with consumer, set too: "+k+" applies to a backlog, and a trigger with only podSelector measures none")
			}
		}
	}
	if _, ok := md[KeyPushInterval]; ok {
		switch {
		case t.Queue == "" && t.Stream == "":
			return fail(KeyPushInterval, "queue, or stream with consumer, set too: it spaces the pushes of a backlog's activations, and a trigger with only podSelector pushes none")
		case t.CapacityAware:
			return fail(KeyPushInterval, `no capacityAware "true" too: capacityAware is for ScaledJobs, and KEDA pushes nothing for a ScaledJob`)
		}
	}
	for _, k := range []string{KeyNodeSelector, KeyTolerations, KeyCapacityHeadroom, KeyMinReplicaCount, KeyCPUPerReplica, KeyMemoryPerReplica} {
		if _, ok := md[k]; ok && !t.CapacityAware {
			return fail(k, "capacityAware \"true\" too: "+k+" shapes the capacity cap")
		}
	}
	if err := t.checkDemand(md, fail); err != nil {
		return err
	}
	_, perReplicaGiven := md[KeyGPUsPerReplica]
	// The cap counts the Jobs that free GPUs can take. Taking 1 GPU per Job when none is
	// given would, for an 8-GPU Job, create 8 times the Jobs that fit, all but one in 8
	// Pending; nothing observed can say what a Job not yet created will ask for.
	if t.CapacityAware && !perReplicaGiven {
		return fail(KeyCapacityAware, `gpusPerReplica set too: the cap counts the Jobs free GPUs can take, so it needs the GPUs one Job asks for (a number, or a MIG profile such as "1g.10gb"); taking 1 for an 8-GPU Job would create 8 times the Jobs that fit`)
	}
	if perReplicaGiven && t.PodSelector == nil && !t.CapacityAware {
		return fail(KeyGPUsPerReplica, `podSelector or capacityAware "true" set too: gpusPerReplica divides the GPU metrics or sizes the capacity cap, and this trigger has neither`)
	}
	return nil
}

// checkDemand checks the keys of the demand metric (targetWait, concurrency, coldStart,
// scaleUpTolerance) against the rest of the trigger.
func (t *Trigger) checkDemand(md map[string]string, fail func(key, want string) error) error {
	_, waitGiven := md[KeyTargetWait]
	if !waitGiven {
		if _, ok := md[KeyConcurrency]; ok {
			return fail(KeyConcurrency, "targetWait set too: concurrency sizes the queue-demand metric, which targetWait asks for")
		}
		if _, ok := md[KeyColdStart]; ok {
			return fail(KeyColdStart, "targetWait set too: coldStart shapes the queue-demand metric, which targetWait asks for; queue-backlog does not read it")
		}
		if _, ok := md[KeyScaleUpTolerance]; ok {
			return fail(KeyScaleUpTolerance, "targetWait set too: the queue-demand metric goes past the HPA's tolerance when a wait is missed; queue-backlog does not read it")
		}
		return nil
	}
	switch {
	case t.Queue == "":
		// A JetStream consumer gives pending counts, not the arrivals and completions
		// the demand is measured from.
		return fail(KeyTargetWait, "queue set too: the demand is measured from a producer's reports of arrivals, waiting and in-flight items")
	case t.CapacityAware:
		return fail(KeyTargetWait, `no capacityAware "true" too: a ScaledJob creates one Job per item of backlog, so it scales on queue-backlog`)
	}
	if _, ok := md[KeyQueueTarget]; ok {
		return fail(KeyQueueTarget, "no targetWait too: queueTarget divides queue-backlog, and targetWait replaces it with queue-demand, whose target is 1 replica")
	}
	return nil
}

// resolveKeys folds <key>FromEnv into <key>, drops KEDA's own keys and rejects keys
// gpuscaler does not know, naming the likely intended one. It returns the metadata by
// key and, for keys written otherwise (queueFromEnv), the name the trigger used. Keys are
// judged in sorted order, so the same metadata always gives the same error.
func resolveKeys(metadata map[string]string) (md, written map[string]string, err error) {
	md = make(map[string]string, len(metadata))
	written = make(map[string]string)
	for _, k := range slices.Sorted(maps.Keys(metadata)) {
		v := metadata[k]
		if slices.Contains(kedaKeys, k) {
			continue
		}
		if k == "" {
			return nil, nil, &Error{Key: emptyKeyTag, Value: v, Want: "a key name; one of " + strings.Join(knownKeys, ", ")}
		}
		key := k
		if base, ok := strings.CutSuffix(k, fromEnvSuffix); ok && slices.Contains(knownKeys, base) {
			if _, both := metadata[base]; both {
				return nil, nil, &Error{Key: k, Value: v, Want: fmt.Sprintf("either %s or %s, not both", base, k)}
			}
			key = base
			written[key] = k
		}
		if !slices.Contains(knownKeys, key) {
			want := "one of " + strings.Join(knownKeys, ", ")
			if guess := closestKey(key); guess != "" {
				want = fmt.Sprintf("a known key; did you mean %q? (known: %s)", guess, strings.Join(knownKeys, ", "))
			}
			return nil, nil, &Error{Key: k, Value: v, Want: want}
		}
		md[key] = v
	}
	return md, written, nil
}

// closestKey returns the known key nearest to key by edit distance, ignoring case, when
// it is close enough to be a typo.
func closestKey(key string) string {
	best, bestDist := "", 4
	for _, k := range knownKeys {
		if d := editDistance(strings.ToLower(key), strings.ToLower(k)); d < bestDist {
			best, bestDist = k, d
		}
	}
	return best
}

// editDistance is the Levenshtein distance between a and b, in bytes.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// parser reads keys from resolved metadata and keeps the first error.
type parser struct {
	md      map[string]string
	written map[string]string // key → the name the trigger gave it, where different
	err     error
}

func (p *parser) get(key string) (string, bool) {
	if p.err != nil {
		return "", false
	}
	v, ok := p.md[key]
	return v, ok
}

func (p *parser) fail(key, value, want string) {
	if p.err == nil {
		if w, ok := p.written[key]; ok {
			key = w
		}
		p.err = &Error{Key: key, Value: value, Want: want}
	}
}

func (p *parser) name(key string, validate func(string) error, want string) string {
	v, ok := p.get(key)
	if !ok {
		return ""
	}
	if err := validate(v); err != nil {
		p.fail(key, v, want)
		return ""
	}
	return v
}

// float parses a decimal number from lo to hi into dst. Hexadecimal, NaN and infinities
// are refused: strconv.ParseFloat takes them, a person writing metadata does not mean them.
func (p *parser) float(key string, dst *float64, lo, hi float64, want string) {
	v, ok := p.get(key)
	if !ok {
		return
	}
	s := strings.TrimSpace(v)
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || strings.ContainsAny(s, "xXpP_") || math.IsNaN(f) || math.IsInf(f, 0) || f > hi || f < lo {
		p.fail(key, v, want)
		return
	}
	*dst = f
}

// whole parses a whole number from lo to hi into dst.
func (p *parser) whole(key string, dst *int, lo, hi int) {
	v, ok := p.get(key)
	if !ok {
		return
	}
	n, err := strconv.Atoi(strings.TrimSpace(v))
	if err != nil || n < lo || n > hi {
		p.fail(key, v, fmt.Sprintf("a whole number from %d to %d", lo, hi))
		return
	}
	*dst = n
}

// maxCPUCores bounds cpuPerReplica: a node's largest CPU (gpuscalerv1.MaxNodeCPUMillis).
const maxCPUCores = gpuscalerv1.MaxNodeCPUMillis / 1000

// quantity parses a Kubernetes quantity ("8", "500m", "64Gi"), as a pod's requests are
// written (k8s.io/apimachinery resource.ParseQuantity), above 0 and at most most: in
// millicores when milli, rounded up as the scheduler rounds a request
// (Quantity.MilliValue), else in whole units, rounded up (Quantity.Value). 0 when the key
// is not given.
func (p *parser) quantity(key string, most *resource.Quantity, milli bool, want string) int64 {
	v, ok := p.get(key)
	if !ok {
		return 0
	}
	q, err := resource.ParseQuantity(strings.TrimSpace(v))
	if err != nil || q.Sign() <= 0 || q.Cmp(*most) > 0 {
		p.fail(key, v, want)
		return 0
	}
	if milli {
		return q.MilliValue()
	}
	return q.Value()
}

// share parses a share from 0 to 1 into dst, written as a Kubernetes quantity ("0.05",
// "50m"), as the HPA's behavior.scaleUp.tolerance is, so that the value the ScaledObject
// gives its HPA can be repeated as it is. Kubernetes takes a tolerance above 1 too; here
// "10" is likelier a percentage written as a number than an HPA meant to act only once
// the metric is eleven times the replicas, so it is refused.
func (p *parser) share(key string, dst *float64, want string) {
	v, ok := p.get(key)
	if !ok {
		return
	}
	q, err := resource.ParseQuantity(strings.TrimSpace(v))
	if err != nil || q.Sign() < 0 || q.Cmp(resource.MustParse("1")) > 0 {
		p.fail(key, v, want)
		return
	}
	*dst = q.AsApproximateFloat64()
}

func (p *parser) bool(key string, dst *bool) {
	v, ok := p.get(key)
	if !ok {
		return
	}
	b, err := strconv.ParseBool(strings.TrimSpace(v))
	if err != nil {
		p.fail(key, v, `"true" or "false"`)
		return
	}
	*dst = b
}

func (p *parser) duration(key string, dst *time.Duration) {
	p.durationIn(key, dst, time.Second, MaxStaleAfter, `a duration from 1s to 24h, such as "30s" or "2m"`)
}

func (p *parser) durationIn(key string, dst *time.Duration, lo, hi time.Duration, want string) {
	v, ok := p.get(key)
	if !ok {
		return
	}
	d, err := time.ParseDuration(strings.TrimSpace(v))
	if err != nil || d < lo || d > hi {
		p.fail(key, v, want)
		return
	}
	*dst = d
}

func (p *parser) selector(key string) labels.Selector {
	v, ok := p.get(key)
	if !ok {
		return nil
	}
	const example = `a non-empty Kubernetes label selector, such as "app=llm,tier in (gpu)"`
	// labels.Parse stops at a NUL byte: "\x00app=llm" would parse as the empty selector,
	// which selects everything. Control characters are never part of a selector.
	if strings.TrimSpace(v) == "" || strings.ContainsFunc(v, unicode.IsControl) {
		p.fail(key, v, example)
		return nil
	}
	sel, err := labels.Parse(v)
	if err != nil {
		p.fail(key, v, fmt.Sprintf("a Kubernetes label selector (%v)", err))
		return nil
	}
	if sel.Empty() {
		p.fail(key, v, example)
		return nil
	}
	return sel
}

func (p *parser) tolerations(key string) []Toleration {
	v, ok := p.get(key)
	if !ok {
		return nil
	}
	tols, err := ParseTolerations(v)
	if err != nil {
		var me *Error
		_ = errors.As(err, &me)
		p.fail(key, v, me.Want)
		return nil
	}
	return tols
}

// migProfile matches MIG profile names: 1g.10gb, 3g.40gb, 1g.10gb+me, 1c.3g.40gb.
var migProfile = regexp.MustCompile(`^([1-9][0-9]*c\.)?[1-9][0-9]*g\.[1-9][0-9]*gb(\+[a-z]+)?$`)

func (p *parser) gpusPerReplica(key string) (int, string) {
	v, ok := p.get(key)
	if !ok {
		return 0, ""
	}
	s := strings.TrimSpace(v)
	if migProfile.MatchString(s) {
		return 1, s
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 || n > 1024 {
		p.fail(key, v, `a whole number of GPUs from 1 to 1024, or a MIG profile such as "1g.10gb"`)
		return 0, ""
	}
	return n, ""
}

// validateJetStreamName checks a stream or consumer name as the NATS server does.
func validateJetStreamName(name string) error {
	if name == "" || len(name) > 255 || strings.ContainsAny(name, ".*>/\\") || strings.ContainsFunc(name, func(r rune) bool {
		return r <= ' ' || r == 0x7f
	}) {
		return errors.New("invalid JetStream name")
	}
	return nil
}
