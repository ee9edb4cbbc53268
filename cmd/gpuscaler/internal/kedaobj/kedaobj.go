// Package kedaobj reads the triggers of KEDA ScaledObjects and ScaledJobs from YAML or
// JSON, for commands that act on one as KEDA would: `gpuscaler explain --file`. It also
// names the settings of the object that change what gpuscaler's answers make KEDA and
// the HPA do (Warnings), since the scaler itself never sees them.
//
// It reads only what those commands need, under the field names KEDA's types give them
// (github.com/kedacore/keda/v2/apis/keda/v1alpha1: ObjectMeta, spec.triggers of
// ScaleTriggers, spec.fallback, spec.advanced.scalingModifiers, spec.cooldownPeriod,
// spec.pollingInterval, spec.advanced.horizontalPodAutoscalerConfig.behavior.scaleUp.tolerance,
// a ScaledJob's spec.minReplicaCount and spec.scalingStrategy). Decoding with KEDA's own
// Go types would pull controller-runtime, KEDA's webhooks and an expression engine into
// the binary: 16 MB more, measured on a client-go program, for a dozen fields.
// test/manifests checks this reading against KEDA's types on every example the project
// ships.
package kedaobj

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"

	"github.com/gpuscaler/gpuscaler/scaler/demand"
)

// Trigger is one trigger of a ScaledObject or ScaledJob.
type Trigger struct {
	Kind      string            `json:"kind"`
	Namespace string            `json:"namespace"`
	Name      string            `json:"name"`
	Index     int               `json:"trigger"` // its place in spec.triggers
	Type      string            `json:"type"`
	TrigName  string            `json:"triggerName,omitempty"`
	Metadata  map[string]string `json:"metadata"`
	// Warnings name the object's settings that change what the scaler's answers do (see
	// warnings), one sentence each.
	Warnings []string `json:"warnings,omitempty"`
}

// object is what is read of one document.
type object struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name      string `json:"name"`
		Namespace string `json:"namespace"`
	} `json:"metadata"`
	Spec struct {
		Triggers []struct {
			Type       string            `json:"type"`
			Name       string            `json:"name"`
			MetricType string            `json:"metricType"`
			Metadata   map[string]string `json:"metadata"`
		} `json:"triggers"`
		PollingInterval *int32 `json:"pollingInterval"`
		CooldownPeriod  *int32 `json:"cooldownPeriod"`
		MinReplicaCount *int32 `json:"minReplicaCount"`
		ScalingStrategy struct {
			Strategy string `json:"strategy"`
		} `json:"scalingStrategy"`
		Fallback *struct {
			FailureThreshold int32  `json:"failureThreshold"`
			Replicas         int32  `json:"replicas"`
			Behavior         string `json:"behavior"`
		} `json:"fallback"`
		Advanced *struct {
			ScalingModifiers *struct {
				Formula          string `json:"formula"`
				Target           string `json:"target"`
				ActivationTarget string `json:"activationTarget"`
				MetricType       string `json:"metricType"`
			} `json:"scalingModifiers"`
			HorizontalPodAutoscalerConfig *struct {
				Behavior *struct {
					ScaleUp *struct {
						Tolerance *resource.Quantity `json:"tolerance"`
					} `json:"scaleUp"`
				} `json:"behavior"`
			} `json:"horizontalPodAutoscalerConfig"`
		} `json:"advanced"`
	} `json:"spec"`
}

// External returns the external and external-push triggers (the ones an external scaler
// answers) of every keda.sh ScaledObject and ScaledJob in data, a YAML stream of one or
// more documents, or JSON. Documents of other kinds are skipped, so a file holding a
// Deployment beside its ScaledObject reads as the ScaledObject; namespace fills in
// objects without one ("default" when it is empty too). It fails when data holds no
// ScaledObject or ScaledJob, or one without an external trigger.
func External(data []byte, namespace string) ([]Trigger, error) {
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	var (
		out    []Trigger
		others []string
	)
	for doc := 1; ; doc++ {
		var o object
		if err := dec.Decode(&o); err != nil {
			if errors.Is(err, io.EOF) {
				break
			}
			return nil, fmt.Errorf("document %d: %w", doc, err)
		}
		if o.Kind == "" && o.APIVersion == "" {
			continue // an empty document, or a comment
		}
		group, _, _ := strings.Cut(o.APIVersion, "/")
		if group != "keda.sh" || (o.Kind != "ScaledObject" && o.Kind != "ScaledJob") {
			others = append(others, o.Kind+" ("+o.APIVersion+")")
			continue
		}
		ns := o.Metadata.Namespace
		if ns == "" {
			ns = namespace
		}
		if ns == "" {
			ns = "default"
		}
		found := false
		for i, tr := range o.Spec.Triggers {
			if tr.Type != "external" && tr.Type != "external-push" {
				continue
			}
			found = true
			out = append(out, Trigger{
				Kind: o.Kind, Namespace: ns, Name: o.Metadata.Name, Index: i, Type: tr.Type, TrigName: tr.Name, Metadata: tr.Metadata,
				Warnings: o.warnings(tr.MetricType, tr.Metadata),
			})
		}
		if !found {
			return nil, fmt.Errorf("document %d: %s %s/%s has no external or external-push trigger; an external scaler answers only those", doc, o.Kind, ns, o.Metadata.Name)
		}
	}
	if len(out) == 0 {
		found := "no document"
		if len(others) > 0 {
			found = strings.Join(others, ", ")
		}
		return nil, fmt.Errorf("no keda.sh/v1alpha1 ScaledObject or ScaledJob in it (found %s)", found)
	}
	return out, nil
}

// pushWarning names a pushInterval longer than the ScaledObject's cooldownPeriod. The
// scaler holds an activation within pushInterval of its last push, counting on KEDA not
// to scale to zero until cooldownPeriod after that push; with a shorter cooldown, a
// workload can reach zero in between and its next activation is pushed only when the
// interval has passed. 30s is the scaler's default.
func (o *object) pushWarning(md map[string]string) string {
	if o.Kind != "ScaledObject" || (!given(md, "queue") && !given(md, "stream")) || md["pushIntervalFromEnv"] != "" {
		return ""
	}
	push := 30 * time.Second
	if v := strings.TrimSpace(md["pushInterval"]); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			return "" // the scaler refuses it, naming the key
		}
		push = d
	}
	cooldown := time.Duration(defaultCooldownPeriod) * time.Second
	if o.Spec.CooldownPeriod != nil {
		cooldown = time.Duration(*o.Spec.CooldownPeriod) * time.Second
	}
	if push <= cooldown {
		return ""
	}
	return fmt.Sprintf("pushInterval %s is longer than cooldownPeriod %s: KEDA can scale the workload to zero within pushInterval of a push, and a request then waits up to pushInterval for its wake; set the trigger's pushInterval to %s or less.", push, cooldown, cooldown)
}

// modifiers reports whether the object sets scalingModifiers (KEDA's IsUsingModifiers).
func (o *object) modifiers() bool {
	a := o.Spec.Advanced
	return a != nil && a.ScalingModifiers != nil && (a.ScalingModifiers.Formula != "" || a.ScalingModifiers.Target != "")
}

// positiveInt reports whether v is a whole number above 0, as HasValidFallback parses a
// scalingModifiers target.
func positiveInt(v string) bool {
	n, err := strconv.ParseInt(v, 10, 64)
	return err == nil && n > 0
}

// defaultTolerance is the HPA's default tolerance, and the trigger's scaleUpTolerance
// unless it gives one (demand.HPATolerance, 0.1).
var defaultTolerance = *resource.NewMilliQuantity(int64(demand.HPATolerance*1000), resource.DecimalSI)

// toleranceWarning names a scale-up tolerance of the ScaledObject's HPA that its
// queue-demand trigger does not repeat. A wait missed now raises the metric just past the
// trigger's scaleUpTolerance of the replicas serving (demand.Demand): where the HPA
// tolerates more, it leaves the raised metric as it is and the queue stands; where less,
// the metric is raised further than the HPA needs. The scaler cannot see the HPA. An HPA
// with no tolerance of its own has the cluster's, which no object shows: then only a
// trigger that gives one is named. Both are Kubernetes quantities, compared as such:
// "0.3" and "300m" are one tolerance, whose floats differ in their last bit.
func (o *object) toleranceWarning(md map[string]string) string {
	if o.Kind != "ScaledObject" || !given(md, "targetWait") || md["scaleUpToleranceFromEnv"] != "" {
		return ""
	}
	trigger, givenByTrigger := defaultTolerance, strings.TrimSpace(md["scaleUpTolerance"]) != ""
	if givenByTrigger {
		q, err := resource.ParseQuantity(strings.TrimSpace(md["scaleUpTolerance"]))
		if err != nil {
			return "" // the scaler refuses it, naming the key
		}
		trigger = q
	}
	var hpa *resource.Quantity
	if a := o.Spec.Advanced; a != nil && a.HorizontalPodAutoscalerConfig != nil && a.HorizontalPodAutoscalerConfig.Behavior != nil &&
		a.HorizontalPodAutoscalerConfig.Behavior.ScaleUp != nil {
		hpa = a.HorizontalPodAutoscalerConfig.Behavior.ScaleUp.Tolerance
	}
	pct := func(q resource.Quantity) string {
		return strconv.FormatFloat(100*q.AsApproximateFloat64(), 'g', 3, 64) + "%"
	}
	switch {
	case hpa == nil && givenByTrigger && trigger.Cmp(defaultTolerance) != 0:
		return fmt.Sprintf("scaleUpTolerance %s: the ScaledObject's HPA sets no scale-up tolerance of its own (advanced.horizontalPodAutoscalerConfig.behavior.scaleUp.tolerance), so it has the cluster's, 10%% unless the cluster sets another; the trigger's is right only where the cluster's is %s.", md["scaleUpTolerance"], pct(trigger))
	case hpa == nil || hpa.Cmp(trigger) == 0:
		return ""
	case hpa.Cmp(resource.MustParse("1")) > 0:
		// Kubernetes takes any tolerance of 0 or more; the trigger's key stops at 1,
		// where a percentage written as a number ("10" for 10%) is likelier than meant.
		return fmt.Sprintf("advanced.horizontalPodAutoscalerConfig.behavior.scaleUp.tolerance %s: the HPA adds replicas only once the metric is more than %s times those running, and a wait missed now raises queue-demand past at most 2 times (scaleUpTolerance takes 0 to 1): with this HPA, targetWait is not kept on a rise. Was it meant as a percentage (%s%%)?", hpa.String(), strconv.FormatFloat(1+hpa.AsApproximateFloat64(), 'g', 3, 64), hpa.String())
	}
	effect := "a wait missed now raises the metric past the trigger's only, which the HPA leaves as it is, and the queue stands"
	if hpa.Cmp(trigger) < 0 {
		effect = "a wait missed now raises the metric further past the HPA's tolerance than it needs, which adds more than one replica where they are many"
	}
	return fmt.Sprintf("advanced.horizontalPodAutoscalerConfig.behavior.scaleUp.tolerance: the HPA tolerates %s scaling up and the trigger's scaleUpTolerance is %s; %s: give the trigger scaleUpTolerance: %q (the scaler cannot see the HPA; on Kubernetes 1.33 and 1.34 the HPA reads its own only with the HPAConfigurableTolerance feature gate on).", pct(*hpa), pct(trigger), effect, hpa.String())
}

// given reports whether a trigger sets key, directly or as keyFromEnv.
func given(md map[string]string, key string) bool {
	return md[key] != "" || md[key+"FromEnv"] != ""
}

// KEDA's defaults (apis/keda/v1alpha1/scaledobject_types.go).
const (
	defaultPollingInterval = 30  // s
	defaultCooldownPeriod  = 300 // s
)

// warnings names the settings of o that change what a trigger's answers do, as the KEDA
// the project tests against (v2.21.0) applies them; metricType and md are the trigger's
// own. gpuscaler's metrics are totals for the whole workload under an AverageValue
// target, its IsActive is the activation decision, and a capacityAware cap is made for
// the ScaledJob's default strategy and minReplicaCount: each setting below breaks one.
func (o *object) warnings(metricType string, md map[string]string) []string {
	var w []string
	if capacityAware, _ := strconv.ParseBool(md["capacityAware"]); capacityAware && o.Kind == "ScaledJob" {
		w = append(w, o.capacityWarnings(md)...)
	}
	if w1 := o.pushWarning(md); w1 != "" {
		w = append(w, w1)
	}
	if w1 := o.toleranceWarning(md); w1 != "" {
		w = append(w, w1)
	}
	if o.Kind == "ScaledObject" && given(md, "podSelector") && !given(md, "queue") && !given(md, "stream") && !o.modifiers() {
		// The scaler answers such a trigger active while it can judge its GPUs (at zero
		// pods it has none to wake on), and KEDA counts a ScaledObject active when any
		// trigger is (pkg/scaling/scale_handler.go, getScaledObjectState).
		if len(o.Spec.Triggers) > 1 {
			w = append(w, "only podSelector in this trigger: gpuscaler answers it active always (at zero pods it would have no GPUs to wake on), and KEDA counts the ScaledObject active when any trigger is, so it never scales to zero whatever its other triggers say; to scale to zero, give the queue and the podSelector in one trigger.")
		} else {
			w = append(w, "only podSelector: gpuscaler answers it active always (at zero pods it would have no GPUs to wake on), so KEDA keeps at least 1 replica; to scale to zero, give a queue or stream in the same trigger.")
		}
	}
	if metricType == "Value" {
		if o.Kind == "ScaledJob" {
			// pkg/scaling/scaledjob/metrics.go, getTargetAverageValue: a target without
			// an AverageValue counts as 0, so no Job is ever asked for.
			w = append(w, "metricType Value: KEDA reads a ScaledJob's target from AverageValue only, takes it as 0, and creates no Jobs; leave metricType out (AverageValue).")
		} else {
			// kube-controller-manager, pkg/controller/podautoscaler/replica_calculator.go,
			// GetExternalMetricReplicas: value/target × ready pods.
			w = append(w, "metricType Value: the HPA multiplies value/target by the ready pods, but gpuscaler's metrics are already totals for the whole workload, so replicas run away to maxReplicaCount; leave metricType out (AverageValue).")
		}
	}
	if o.modifiers() {
		a := o.Spec.Advanced
		// pkg/scaling/scale_handler.go, getScaledObjectState: with modifiers the
		// ScaledObject is active when the formula's value exceeds activationTarget.
		at := a.ScalingModifiers.ActivationTarget
		if at == "" {
			at = "0"
		}
		w = append(w, fmt.Sprintf("scalingModifiers: KEDA decides activation on the formula's value > activationTarget (%s), not on gpuscaler's IsActive, so activationQueueDepth and activationGpuUtil are not applied, and a formula that reads above %s while the workload idles keeps it from zero.", at, at))
		if a.ScalingModifiers.MetricType == "Value" {
			w = append(w, "scalingModifiers.metricType Value: the HPA multiplies the formula's value/target by the ready pods; gpuscaler's metrics are totals for the whole workload, so replicas run away; leave it out (AverageValue).")
		}
	}
	if f := o.Spec.Fallback; f != nil && o.Kind == "ScaledObject" {
		polling, cooldown := int32(defaultPollingInterval), int32(defaultCooldownPeriod)
		if o.Spec.PollingInterval != nil {
			polling = *o.Spec.PollingInterval
		}
		if o.Spec.CooldownPeriod != nil {
			cooldown = *o.Spec.CooldownPeriod
		}
		// pkg/fallback/fallback.go GetMetricsWithFallback and scale_handler.go
		// isActiveOrFallback (keda#7244): past failureThreshold failures a failing
		// trigger reads fallback.replicas × target, with no error, and counts as active.
		// doFallback: static (the default) sets fallback.replicas; the others start
		// from the current replicas.
		after := fmt.Sprintf("sets %d replicas", f.Replicas)
		switch f.Behavior {
		case "currentReplicas":
			after = "keeps the current replicas"
		case "currentReplicasIfHigher":
			after = fmt.Sprintf("keeps the current replicas, or sets %d if fewer", f.Replicas)
		case "currentReplicasIfLower":
			after = fmt.Sprintf("keeps the current replicas, or sets %d if more", f.Replicas)
		}
		if f.Replicas == 0 && (f.Behavior == "" || f.Behavior == "static" || f.Behavior == "currentReplicasIfLower") {
			after = "reads a metric of 0, so the HPA goes to its minimum, 1, whatever the load"
		}
		// HasValidFallback refuses a fallback beside scalingModifiers whose target is not
		// a whole number above 0; behavior scalingModifiers hands the formula a
		// placeholder of -1 (for its ?? operator) and does not count as active.
		switch {
		case o.modifiers() && !positiveInt(o.Spec.Advanced.ScalingModifiers.Target):
			w = append(w, "fallback: KEDA never applies it here, since scalingModifiers.target is not a whole number above 0 (HasValidFallback); a failing trigger is treated as with no fallback.")
		case f.Behavior == "scalingModifiers":
			w = append(w, fmt.Sprintf("fallback behavior scalingModifiers: after %d failures KEDA hands the formula the failing metric as missing (-1, for its ?? operator); the trigger does not count as active, and the formula decides.", f.FailureThreshold))
		default:
			w = append(w, fmt.Sprintf("fallback: while the scaler answers Unavailable (missing data), after %d failures KEDA counts the trigger active and %s; a workload at zero is woken to 1 or more.", f.FailureThreshold, after))
		}
		// scale_scaledobjects.go RequestScale: an erroring, inactive trigger is held
		// where it is, except with fallback.replicas 0, which is taken as idle.
		if f.Replicas == 0 {
			w = append(w, "fallback.replicas 0: until the failures pass failureThreshold, KEDA takes the failing trigger as idle, not held, and scales to zero once cooldownPeriod has passed; use 1 or more, or leave fallback out (then KEDA holds the replicas as they are).")
			if int64(f.FailureThreshold+1)*int64(polling) >= int64(cooldown) {
				w = append(w, fmt.Sprintf("fallback.replicas 0 with failureThreshold %d and pollingInterval %ds against cooldownPeriod %ds: missing data can scale the workload to zero before the fallback applies.", f.FailureThreshold, polling, cooldown))
			}
		}
	}
	return w
}

// capacityWarnings names a ScaledJob's settings that a capacityAware trigger's cap must
// be told of or made for. KEDA's executor hands its scaling strategy the unfinished Jobs
// less minReplicaCount, and its default strategy creates ⌈value/target⌉ less those
// (pkg/scaling/executor/scale_jobs.go, getScalingDecision, defaultScalingStrategy).
func (o *object) capacityWarnings(md map[string]string) []string {
	var w []string
	spec := int32(0)
	if o.Spec.MinReplicaCount != nil {
		spec = *o.Spec.MinReplicaCount
	}
	given := strings.TrimSpace(md["minReplicaCount"])
	if given == "" {
		given = "0"
	}
	// Compared as numbers ("02" is 2); a value from the environment is not known here,
	// and one that is not a number the scaler refuses, naming the key.
	if n, err := strconv.Atoi(given); err == nil && md["minReplicaCountFromEnv"] == "" && n != int(spec) {
		effect := "Fewer there creates a Job beyond what fits for each busy standby Job."
		if n > int(spec) {
			effect = "More there leaves out Jobs that would fit."
		}
		w = append(w, fmt.Sprintf("minReplicaCount: the ScaledJob's is %d and the capacityAware trigger's %s; KEDA never subtracts the standby Jobs, so the cap must leave out the same number: give the trigger minReplicaCount: %q (the scaler cannot see the ScaledJob). %s", spec, given, strconv.Itoa(int(spec)), effect))
	}
	if s := o.Spec.ScalingStrategy.Strategy; s != "" && s != "default" {
		w = append(w, fmt.Sprintf("scalingStrategy %s: capacityAware's cap is made for the default strategy, which subtracts the running Jobs; %s does not as default does, and creates Jobs beyond what fits (a Job too many for each running beyond minReplicaCount under accurate and eager). Use default.", s, s))
	}
	return w
}
