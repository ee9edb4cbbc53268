package replay

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/gpuscaler/gpuscaler/cmd/gpuscaler/internal/inference"
)

// Attribution is the line every output of a replay carries: the traces are published
// under CC BY 4.0 (shared/testdata/traces/README.md).
var Attribution = map[string]string{
	"gentd26":   "GenTD26: alibaba/clusterdata cluster-trace-v2026-GenAI, CC BY 4.0",
	"azure-llm": "Azure LLM inference trace 2023 (conversation): Azure/AzurePublicDataset, Patel et al., \"Splitwise\", ISCA 2024, CC BY 4.0",
	"mooncake":  "Mooncake trace (conversation): kvcache-ai/Mooncake, Qin et al., \"Mooncake\", FAST 2025, Apache License 2.0",
	"openb":     "openb: alibaba/clusterdata cluster-trace-gpu-v2023, Weng et al., \"Beware of Fragmentation\", USENIX ATC 2023, CC BY 4.0",
}

// Target is one of the targets of issue 14 (GenTD26, openb) or 26 (the dense traces),
// judged on this replay.
type Target struct {
	Name string `json:"name"`
	// Measured says what was measured against it.
	Measured string `json:"measured"`
	Met      bool   `json:"met"`
	// Excess is, for the dense traces' ratio targets (frontier, honoured, efficient,
	// monotonic), how far the settings that miss are beyond the bound, summed: each
	// setting's ratio less the bound, so 0.039 for a point 8.9% dearer where 5% is
	// allowed. 0 when met, and for beaten. A count of misses flips on a run's noise at
	// the bound; this says by how much, so two metrics can be told apart
	// (hack/replay-matrix.py sums it over the runs).
	Excess float64 `json:"excess,omitempty"`
}

// InferenceTargets judges the scale-to-zero targets (GenTD26) or the scale-out ones
// (Azure LLM) on res.
func InferenceTargets(trace string, res *inference.Result) []Target {
	by := map[string]inference.PolicyResult{}
	for _, p := range res.Policies {
		by[p.Name] = p
	}
	var out []Target
	switch trace {
	case "gentd26":
		rec, on, poll := by[inference.PolicyRecommends], by[inference.PolicyAlwaysOn], by[inference.PolicyKEDAPoll]
		share := rec.GPUHours / on.GPUHours
		out = append(out, Target{Name: "gpuscaler spends ≤ 10% of the GPU-hours of always-on",
			Measured: fmt.Sprintf("%.1f%% (%.0f of %.0f GPU-hours)", 100*share, rec.GPUHours, on.GPUHours), Met: share <= 0.10})
		cut := 1 - rec.WaitP99/poll.WaitP99
		out = append(out, Target{Name: "gpuscaler's p99 wait ≥ 25% below keda-poll-backlog's, at no more GPU-hours",
			Measured: fmt.Sprintf("p99 %.1f s against %.1f s (%.0f%% below), %.0f against %.0f GPU-hours", rec.WaitP99, poll.WaitP99, 100*cut, rec.GPUHours, poll.GPUHours),
			Met:      cut >= 0.25 && rec.GPUHours <= poll.GPUHours})
		pts := res.Frontiers[inference.PolicyRecommends]
		onFrontier := true
		for _, p := range pts {
			if p.GPUHours <= rec.GPUHours && p.ColdStartFraction <= rec.ColdStartFraction &&
				(p.GPUHours < rec.GPUHours || p.ColdStartFraction < rec.ColdStartFraction) {
				onFrontier = false
			}
		}
		out = append(out, Target{Name: "the recommended cooldown sits on the cooldownPeriod frontier (GPU-hours against cold-start fraction)",
			Measured: fmt.Sprintf("%s: %.0f GPU-hours, cold-start fraction %.3f", rec.Setting, rec.GPUHours, rec.ColdStartFraction), Met: onFrontier})
	case "azure-llm", "mooncake":
		out = append(out, DenseTargets(res)...)
	}
	return out
}

// The bounds of the dense traces' targets (issue 26).
const (
	// frontierCost and frontierWait: a queue-demand point matches a backlog point with
	// at most 2% more GPU-hours at a p99 wait no more than 0.5 s longer.
	frontierCost = 1.02
	frontierWait = 0.5
	// beaten: at least one backlog point is beaten by this share of its GPU-hours, at no
	// worse p99 wait.
	beaten = 0.20
	// honoured: the realised p99 wait is at most this many times targetWait, for every
	// targetWait from honouredFrom to honouredTo.
	honoured                 = 1.2
	honouredFrom, honouredTo = 5 * time.Second, 60 * time.Second
	// efficient: at each such targetWait, at most this many times the GPU-hours of the
	// cheapest swept point, of either metric, whose p99 wait is within it.
	efficient = 1.05
	// monotonic: a longer targetWait costs at most this many times a shorter one's
	// GPU-hours.
	monotonic = 1.02
)

// DenseTargets judges queue-demand against queue-backlog on a dense trace's replay
// (Azure LLM, Mooncake): the frontier, the wait honoured, its price, and monotony.
func DenseTargets(res *inference.Result) []Target {
	backlog, demand := res.Frontiers[inference.PolicyBacklog], res.Frontiers[inference.PolicyRecommends]
	var alwaysOn float64
	for _, p := range res.Policies {
		if p.Name == inference.PolicyAlwaysOn {
			alwaysOn = p.WaitP99
		}
	}
	// Frontier: every backlog point matched, within the bounds.
	var missed []string
	worst, excess := 0.0, 0.0
	best, bestAt := 0.0, ""
	for _, b := range backlog {
		cheapest := math.Inf(1)
		for _, d := range demand {
			if d.WaitP99 <= b.WaitP99+frontierWait {
				cheapest = min(cheapest, d.GPUHours)
			}
			if d.WaitP99 <= b.WaitP99 {
				if cut := 1 - d.GPUHours/b.GPUHours; cut > best {
					best, bestAt = cut, fmt.Sprintf("%s against %s", d.Setting, b.Setting)
				}
			}
		}
		switch {
		case math.IsInf(cheapest, 1):
			missed = append(missed, fmt.Sprintf("%s (no point within %s of its p99 %s)", b.Setting, secs(frontierWait), secs(b.WaitP99)))
		case cheapest > frontierCost*b.GPUHours:
			missed = append(missed, fmt.Sprintf("%s (%s)", b.Setting, more(cheapest/b.GPUHours)))
			excess += cheapest/b.GPUHours - frontierCost
		}
		if !math.IsInf(cheapest, 1) {
			worst = max(worst, cheapest/b.GPUHours)
		}
	}
	m := fmt.Sprintf("every backlog point, at most %s", more(worst))
	if len(missed) > 0 {
		m = "not matched: " + strings.Join(missed, ", ")
	}
	out := []Target{{Name: "frontier: for every gpuscaler-backlog point, a gpuscaler point with ≤ 2% more GPU-hours at a p99 wait ≤ 0.5 s longer",
		Measured: m, Met: len(missed) == 0, Excess: excess}}
	m = "none at no worse p99"
	if bestAt != "" {
		m = fmt.Sprintf("%.0f%% fewer (%s)", 100*best, bestAt)
	}
	out = append(out, Target{Name: "beaten: for some gpuscaler-backlog point, a gpuscaler point with ≥ 20% fewer GPU-hours at no worse p99 wait",
		Measured: m, Met: best >= beaten})

	// Honoured and efficient, for each targetWait in range.
	var late, dear, unachievable []string
	worstLate, worstDear := 0.0, 0.0
	var lateBy, dearBy float64
	for _, d := range demand {
		w, ok := targetWaitOf(d.Setting)
		if !ok || w < honouredFrom || w > honouredTo {
			continue
		}
		if alwaysOn > honoured*w.Seconds() {
			unachievable = append(unachievable, d.Setting)
			continue
		}
		worstLate = max(worstLate, d.WaitP99/w.Seconds())
		if d.WaitP99 > honoured*w.Seconds() {
			late = append(late, fmt.Sprintf("%s (p99 %s)", d.Setting, secs(d.WaitP99)))
			lateBy += d.WaitP99/w.Seconds() - honoured
		}
		cheapest := math.Inf(1)
		for _, p := range slices.Concat(backlog, demand) {
			if p.WaitP99 <= w.Seconds() {
				cheapest = min(cheapest, p.GPUHours)
			}
		}
		if math.IsInf(cheapest, 1) {
			continue
		}
		worstDear = max(worstDear, d.GPUHours/cheapest)
		if d.GPUHours > efficient*cheapest {
			dear = append(dear, fmt.Sprintf("%s (%s)", d.Setting, more(d.GPUHours/cheapest)))
			dearBy += d.GPUHours/cheapest - efficient
		}
	}
	m = fmt.Sprintf("every targetWait, p99 at most %.2f × targetWait", worstLate)
	if len(late) > 0 {
		m = "over: " + strings.Join(late, ", ")
	}
	if len(unachievable) > 0 {
		m += "; unachievable even always-on at the peak: " + strings.Join(unachievable, ", ")
	}
	out = append(out, Target{Name: "honoured: for every targetWait from 5 s to 60 s, a p99 wait ≤ 1.2 × targetWait",
		Measured: m, Met: len(late) == 0, Excess: lateBy})
	m = fmt.Sprintf("every targetWait, at most %s", more(worstDear))
	if len(dear) > 0 {
		m = "dearer: " + strings.Join(dear, ", ")
	}
	out = append(out, Target{Name: "efficient: at each such targetWait, ≤ 1.05 × the GPU-hours of the cheapest swept point with a p99 wait within it",
		Measured: m, Met: len(dear) == 0, Excess: dearBy})

	// Monotonic: over the whole sweep, each setting against every shorter one, in
	// whatever order the sweep ran.
	// A setting dearer than several shorter ones adds its largest rise to the excess.
	var rises []string
	worstRise, risesBy := 0.0, 0.0
	for _, d := range demand {
		w, ok := targetWaitOf(d.Setting)
		if !ok {
			continue
		}
		rise := 0.0
		for _, e := range demand {
			if v, ok := targetWaitOf(e.Setting); ok && v < w {
				worstRise = max(worstRise, d.GPUHours/e.GPUHours)
				if d.GPUHours > monotonic*e.GPUHours {
					rises = append(rises, fmt.Sprintf("%s over %s (%s)", d.Setting, e.Setting, more(d.GPUHours/e.GPUHours)))
					rise = max(rise, d.GPUHours/e.GPUHours-monotonic)
				}
			}
		}
		risesBy += rise
	}
	m = fmt.Sprintf("no longer targetWait costs more than %s", more(max(worstRise, 1)))
	if len(rises) > 0 {
		m = strings.Join(rises, ", ")
	}
	out = append(out, Target{Name: "monotonic: a longer targetWait never costs > 2% more GPU-hours",
		Measured: m, Met: len(rises) == 0, Excess: risesBy})
	return out
}

// targetWaitOf reads the targetWait of a queue-demand point's setting.
func targetWaitOf(setting string) (time.Duration, bool) {
	v, ok := strings.CutPrefix(setting, "targetWait=")
	if !ok {
		return 0, false
	}
	w, err := time.ParseDuration(v)
	return w, err == nil
}

// more says a ratio of GPU-hours as more or fewer, in percent.
func more(ratio float64) string {
	if ratio >= 1 {
		return fmt.Sprintf("%+.1f%% GPU-hours", 100*(ratio-1))
	}
	return fmt.Sprintf("%.1f%% fewer GPU-hours", 100*(1-ratio))
}

// OpenBTargets judges the ScaledJob comparison on res: capacityAware leaves no more Pods
// Pending than a plain ScaledJob.
func OpenBTargets(res *OpenBResult) []Target {
	var plain, aware *OpenBPolicy
	for i := range res.Policies {
		if res.Policies[i].CapacityAware {
			aware = &res.Policies[i]
		} else {
			plain = &res.Policies[i]
		}
	}
	if plain == nil || aware == nil {
		return nil
	}
	return []Target{{Name: "capacityAware leaves no more Pods Pending than a plain ScaledJob",
		Measured: fmt.Sprintf("at most %d Pending (%.0f GPU-hours) against %d (%.0f GPU-hours)", aware.PendingJobsMax, aware.PendingGPUHours, plain.PendingJobsMax, plain.PendingGPUHours),
		Met:      aware.PendingJobsMax <= plain.PendingJobsMax && aware.PendingGPUHours <= plain.PendingGPUHours}}
}

// WriteInferenceTable prints the policies, the frontiers and the targets.
func WriteInferenceTable(w io.Writer, res *inference.Result, targets []Target) error {
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "policy\tsetting\tGPU-hours\twait p50\tp99\tmean\tcold starts\tmax replicas")
	for _, p := range res.Policies {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%.1f%%\t%d\n", p.Name, or(p.Setting, "-"), hours(p.GPUHours),
			secs(p.WaitP50), secs(p.WaitP99), secs(p.WaitMean), 100*p.ColdStartFraction, p.MaxReplicas)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, name := range []string{inference.PolicyBacklog, inference.PolicyRecommends, PolicyDemandSweep} {
		pts := res.Frontiers[name]
		if len(pts) == 0 {
			continue
		}
		fmt.Fprintf(w, "\nfrontier of %s:\n", name)
		fmt.Fprintln(tw, "setting\tGPU-hours\twait p99\tmean\tcold starts")
		for _, p := range pts {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%.1f%%\n", p.Setting, hours(p.GPUHours), secs(p.WaitP99), secs(p.WaitMean), 100*p.ColdStartFraction)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	return writeTargets(w, targets)
}

// WriteOpenBTable prints the ScaledJob policies and the target.
func WriteOpenBTable(w io.Writer, res *OpenBResult, targets []Target) error {
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "policy\tcapacityAware\tjob wait p50\tp99\tmean\tPending at most\tPending GPU-hours\tGPU-hours\tallocation")
	for _, p := range res.Policies {
		fmt.Fprintf(tw, "%s\t%t\t%s\t%s\t%s\t%d\t%s\t%s\t%.1f%%\n", p.Name, p.CapacityAware, secs(p.JobWaitP50), secs(p.JobWaitP99),
			secs(p.JobWaitMean), p.PendingJobsMax, hours(p.PendingGPUHours), hours(p.GPUHours), 100*p.GPUAllocation)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	return writeTargets(w, targets)
}

func writeTargets(w io.Writer, targets []Target) error {
	if len(targets) == 0 {
		return nil
	}
	fmt.Fprintln(w, "\ntargets:")
	for _, t := range targets {
		mark := "missed"
		if t.Met {
			mark = "met"
		}
		if _, err := fmt.Fprintf(w, "  %-6s %s: %s\n", mark, t.Name, t.Measured); err != nil {
			return err
		}
	}
	return nil
}

func or(s, alt string) string {
	if s == "" {
		return alt
	}
	return s
}

func hours(h float64) string {
	if h >= 100 {
		return fmt.Sprintf("%.0f", h)
	}
	return fmt.Sprintf("%.2f", h)
}

func secs(s float64) string {
	switch {
	case math.IsNaN(s):
		return "-"
	case s >= 3600:
		return fmt.Sprintf("%.1f h", s/3600)
	case s >= 100:
		return fmt.Sprintf("%.0f s", s)
	}
	return fmt.Sprintf("%.1f s", s)
}
