// Package kedarules holds the rules KEDA and the Kubernetes HPA apply, as they publish
// them, so that a model of a cluster (gpuscaler demo, gpuscaler replay) moves replicas and
// creates Jobs as a real cluster would. Each rule is fed what the scaler answered.
package kedarules

import (
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/gpuscaler/gpuscaler/scaler/demand"
)

// HPATolerance is the HPA's default tolerance (--horizontal-pod-autoscaler-tolerance):
// within 10% of the target it leaves the replicas as they are. The queue-demand metric
// knows it too.
const HPATolerance = demand.HPATolerance

// Metric is one GetMetrics answer with its GetMetricSpec target, as the HPA sees an
// external metric with an AverageValue target.
type Metric struct {
	Name          string
	Value, Target float64
}

// Tolerances are the HPA's tolerances below and above the target, as the HPA controller
// keeps them (Tolerances in pkg/controller/podautoscaler/replica_calculator.go): the
// cluster's --horizontal-pod-autoscaler-tolerance for both, unless the HPA sets its own
// for a direction (behavior.scaleDown.tolerance, behavior.scaleUp.tolerance; Kubernetes
// 1.33 on, behind the HPAConfigurableTolerance feature gate).
type Tolerances struct{ ScaleDown, ScaleUp float64 }

// DefaultTolerances are the cluster's default, HPATolerance both ways.
var DefaultTolerances = Tolerances{HPATolerance, HPATolerance}

// within is Tolerances.isWithin: the replicas are left as they are while the ratio of
// the metric to its target is from 1 − ScaleDown to 1 + ScaleUp.
func (t Tolerances) within(ratio float64) bool {
	return 1-t.ScaleDown <= ratio && ratio <= 1+t.ScaleUp
}

// HPAProposal is the HPA's replica count for one AverageValue metric: ceil(value /
// target), unless current replicas are within the default tolerance of the target.
// current is at least 1: the HPA does not act on a workload at zero (KEDA does).
func HPAProposal(current int, m Metric) int { return HPAProposalWithin(current, m, DefaultTolerances) }

// HPAProposalWithin is HPAProposal for an HPA with the tolerances tol.
func HPAProposalWithin(current int, m Metric, tol Tolerances) int {
	if m.Target <= 0 || current < 1 {
		return current
	}
	if tol.within(m.Value / (m.Target * float64(current))) {
		return current
	}
	return int(math.Ceil(m.Value / m.Target))
}

// HPA is the horizontal pod autoscaler KEDA creates for a ScaledObject, with the
// behaviour a ScaledObject sets under advanced.horizontalPodAutoscalerConfig.
type HPA struct {
	// Min and Max replicas. KEDA sets the HPA's minimum to max(minReplicaCount, 1): below
	// one, KEDA itself scales.
	Min, Max int
	// ScaleDownWindow is scaleDown.stabilizationWindowSeconds: the HPA scales down only
	// to the highest recommendation it made within this window (default 300s).
	ScaleDownWindow time.Duration
	// ScaleUpWindow is scaleUp.stabilizationWindowSeconds (default 0).
	ScaleUpWindow time.Duration
	// Tolerances are the HPA's tolerances; nil: DefaultTolerances.
	Tolerances *Tolerances

	recs []recommendation // within the longer window, oldest first
}

type recommendation struct {
	at       time.Time
	replicas int
}

// Desired computes one HPA sync at now: the largest proposal over the metrics, held by
// the stabilization windows, limited by the default scale-up policies (at most double,
// or four pods more, per 15 s sync), and clamped to [Min, Max]. It returns the replica
// count and why. Metrics that failed are left out of metrics by the caller; with none
// left the HPA changes nothing.
func (h *HPA) Desired(now time.Time, current int, metrics []Metric) (int, string) {
	if len(metrics) == 0 {
		return current, "no metric"
	}
	tol := DefaultTolerances
	if h.Tolerances != nil {
		tol = *h.Tolerances
	}
	proposal, why := 0, ""
	for _, m := range metrics {
		p := HPAProposalWithin(current, m, tol)
		if p > proposal || why == "" {
			proposal = p
			why = fmt.Sprintf("%s %s/%s", m.Name, FmtNum(m.Value), FmtNum(m.Target))
		}
	}
	h.recs = append(h.recs, recommendation{now, proposal})
	keep := max(h.ScaleDownWindow, h.ScaleUpWindow)
	for len(h.recs) > 1 && now.Sub(h.recs[0].at) > keep {
		h.recs = h.recs[1:]
	}
	desired := proposal
	if proposal < current { // scale down to the highest recommendation in the window
		for _, r := range h.recs {
			if now.Sub(r.at) <= h.ScaleDownWindow {
				desired = max(desired, r.replicas)
			}
		}
		desired = min(desired, current)
	}
	if proposal > current && h.ScaleUpWindow > 0 { // scale up to the lowest in the window
		for _, r := range h.recs {
			if now.Sub(r.at) <= h.ScaleUpWindow {
				desired = min(desired, r.replicas)
			}
		}
		desired = max(desired, current)
	}
	if limit := max(2*current, current+4); desired > limit {
		desired = limit
		why += " (scale-up limit)"
	}
	desired = min(max(desired, h.Min), h.Max)
	if desired < proposal && proposal > current && desired == h.Max {
		why += fmt.Sprintf(" (capped at maxReplicaCount %d)", h.Max)
	}
	if desired > proposal && desired < current {
		why += " (held by the scale-down window)"
	}
	return desired, why
}

// ScaledObject is KEDA's activation rule for a ScaledObject with minReplicaCount 0: any
// active trigger takes it from zero to one, and it goes back to zero only when no trigger
// has been active for cooldownPeriod. A trigger error is neither: KEDA never scales to
// zero while a trigger fails.
type ScaledObject struct {
	Cooldown   time.Duration
	lastActive time.Time
}

// Observe records one activation answer at now (from a poll or a push) and returns the
// replica count KEDA sets, and why; changed is false when KEDA leaves the replicas alone.
func (s *ScaledObject) Observe(now time.Time, replicas int, active bool, err error) (next int, why string, changed bool) {
	switch {
	case err != nil:
		return replicas, "trigger error: " + FirstLine(err.Error()), false
	case active:
		s.lastActive = now
		if replicas == 0 {
			return 1, "active", true
		}
		return replicas, "", false
	case replicas > 0 && !s.lastActive.IsZero() && now.Sub(s.lastActive) >= s.Cooldown:
		return 0, fmt.Sprintf("inactive for cooldownPeriod %s", s.Cooldown), true
	}
	return replicas, "", false
}

// JobsToCreate is how many Jobs KEDA's ScaledJob creates on one poll with the default
// scaling strategy: maxScale = min(ceil(queueLength / target), maxReplicaCount), minus
// the Jobs not finished yet (pending ones included), never below zero
// (pkg/scaling/executor/scale_jobs.go). Nothing when no trigger is active.
func JobsToCreate(active bool, queueLength, target float64, maxReplicaCount, unfinished int) int {
	if !active || target <= 0 {
		return 0
	}
	maxScale := min(int(math.Ceil(queueLength/target)), maxReplicaCount)
	return max(0, maxScale-unfinished)
}

// FmtNum formats v as a whole number when it is one, else to one decimal.
func FmtNum(v float64) string {
	if v == math.Trunc(v) && math.Abs(v) < 1e12 {
		return fmt.Sprintf("%d", int64(v))
	}
	return fmt.Sprintf("%.1f", v)
}

// FirstLine returns s up to its first newline.
func FirstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}
