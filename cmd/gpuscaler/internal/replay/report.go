package replay

import (
	"fmt"
	"io"
	"math"
	"strings"
	"text/tabwriter"

	"github.com/gpuscaler/gpuscaler/cmd/gpuscaler/internal/inference"
)

// Attribution is the line every output of a replay carries: the traces are published
// under CC BY 4.0 (shared/testdata/traces/README.md).
var Attribution = map[string]string{
	"gentd26":   "GenTD26: alibaba/clusterdata cluster-trace-v2026-GenAI, CC BY 4.0",
	"azure-llm": "Azure LLM inference trace 2023 (conversation): Azure/AzurePublicDataset, Patel et al., \"Splitwise\", ISCA 2024, CC BY 4.0",
	"openb":     "openb: alibaba/clusterdata cluster-trace-gpu-v2023, Weng et al., \"Beware of Fragmentation\", USENIX ATC 2023, CC BY 4.0",
}

// Target is one of issue 14's targets, judged on this replay.
type Target struct {
	Name string `json:"name"`
	// Measured says what was measured against it.
	Measured string `json:"measured"`
	Met      bool   `json:"met"`
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
	case "azure-llm":
		backlog, demand := res.Frontiers[inference.PolicyBacklog], res.Frontiers[inference.PolicyRecommends]
		var missed []string
		best, bestAt := 0.0, ""
		for _, b := range backlog {
			dominated := false
			for _, d := range demand {
				if d.GPUHours <= b.GPUHours && d.WaitP99 <= b.WaitP99 {
					dominated = true
					if cut := 1 - d.GPUHours/b.GPUHours; cut > best {
						best, bestAt = cut, fmt.Sprintf("%s against %s", d.Setting, b.Setting)
					}
				}
			}
			if !dominated {
				missed = append(missed, b.Setting)
			}
		}
		m := "every backlog point"
		if len(missed) > 0 {
			m = "not matched: " + strings.Join(missed, ", ")
		}
		out = append(out, Target{Name: "for every gpuscaler-backlog point, a gpuscaler point with no more GPU-hours and no worse p99 wait",
			Measured: m, Met: len(missed) == 0})
		m = "none at no worse p99"
		if bestAt != "" {
			m = fmt.Sprintf("%.0f%% fewer (%s)", 100*best, bestAt)
		}
		out = append(out, Target{Name: "for some gpuscaler-backlog point, a gpuscaler point with ≥ 20% fewer GPU-hours at no worse p99 wait",
			Measured: m, Met: best >= 0.20})
	}
	return out
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
	fmt.Fprintln(w, "\ntargets (issue 14):")
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
