package kedarules

import (
	"errors"
	"testing"
	"time"

	"github.com/gpuscaler/gpuscaler/scaler/demand"
)

func TestHPAProposal(t *testing.T) {
	for name, tc := range map[string]struct {
		current int
		m       Metric
		want    int
	}{
		"ceil of value over target":       {current: 1, m: Metric{Value: 37, Target: 4}, want: 10},
		"scale down":                      {current: 10, m: Metric{Value: 8, Target: 4}, want: 2},
		"within 10% tolerance: no change": {current: 4, m: Metric{Value: 17.5, Target: 4}, want: 4},
		"just outside tolerance":          {current: 4, m: Metric{Value: 17.7, Target: 4}, want: 5},
		"zero value":                      {current: 3, m: Metric{Value: 0, Target: 4}, want: 0},
		"no target: no opinion":           {current: 3, m: Metric{Value: 9, Target: 0}, want: 3},
		"at zero the HPA does not act":    {current: 0, m: Metric{Value: 9, Target: 1}, want: 0},
	} {
		t.Run(name, func(t *testing.T) {
			if got := HPAProposal(tc.current, tc.m); got != tc.want {
				t.Errorf("HPAProposal(%d, %+v) = %d, want %d", tc.current, tc.m, got, tc.want)
			}
		})
	}
}

// TestHPAProposalWithin: an HPA's own tolerances, each direction its own (Tolerances in
// pkg/controller/podautoscaler/replica_calculator.go, Kubernetes 1.33 on).
func TestHPAProposalWithin(t *testing.T) {
	for name, tc := range map[string]struct {
		current int
		value   float64
		tol     Tolerances
		want    int
	}{
		"none up: any rise adds a replica":       {current: 10, value: 10.01, tol: Tolerances{0.1, 0}, want: 11},
		"20% up: 11.9 is within":                 {current: 10, value: 11.9, tol: Tolerances{0.1, 0.2}, want: 10},
		"20% up: 12.1 is past":                   {current: 10, value: 12.1, tol: Tolerances{0.1, 0.2}, want: 13},
		"5% down: 18.5 of 20 is past":            {current: 20, value: 18.5, tol: Tolerances{0.05, 0.1}, want: 19},
		"10% down: 18.5 of 20 is within":         {current: 20, value: 18.5, tol: Tolerances{0.1, 0}, want: 20},
		"the defaults are HPAProposal's":         {current: 4, value: 4.4, tol: DefaultTolerances, want: 4},
		"at the bound: within, as the HPA keeps": {current: 4, value: 4.25, tol: Tolerances{0, 0.0625}, want: 4}, // exact in binary
	} {
		t.Run(name, func(t *testing.T) {
			if got := HPAProposalWithin(tc.current, Metric{Value: tc.value, Target: 1}, tc.tol); got != tc.want {
				t.Errorf("HPAProposalWithin(%d, %g, %+v) = %d, want %d", tc.current, tc.value, tc.tol, got, tc.want)
			}
		})
	}
}

// TestMissedWaitAddsAReplica: once a wait is missed the queue-demand metric goes past the
// HPA's tolerance for scaling up, so the HPA adds a replica, for an HPA with any
// tolerance the trigger repeats (scaleUpTolerance). Over a grid of replicas serving,
// loads and tolerances, every metric raised makes the HPA's published rule add one, as
// KEDA passes it on in thousandths, truncated (GenerateMetricInMili in KEDA's
// pkg/scalers/scaler.go, up to 2.17); and every metric the rule should raise is raised.
func TestMissedWaitAddsAReplica(t *testing.T) {
	for _, tol := range []float64{0, 0.05, 0.1, 0.2, 0.5, 1} {
		raised := 0
		for _, c := range []int{1, 8} {
			for r := 1; r <= 60; r++ {
				for load := 0.5; load <= 2.5; load += 0.01 {
					in := demand.Inputs{
						Traffic:     demand.Estimate{Arrivals: load * float64(r*c) / 10, Service: 10},
						Concurrency: c, TargetWait: 10 * time.Second, Waiting: float64(max(1, r*c/4)), InFlight: float64(r * c),
						Tolerance: tol,
					}
					plain := demand.Demand(in)
					in.OldestWait = in.TargetWait
					n := demand.Demand(in)
					value := float64(int64(n.Replicas*1000)) / 1000
					serving := float64(r)
					withinUp := plain.Replicas > serving && plain.Replicas <= serving*(1+tol)
					switch {
					case n.Missed && HPAProposalWithin(r, Metric{Value: value, Target: 1}, Tolerances{HPATolerance, tol}) <= r:
						t.Fatalf("tolerance %g, %d replicas of %d serving, load %.2f: raised to %g, which the HPA leaves as it is", tol, r, c, load, n.Replicas)
					case withinUp && plain.Most > serving*(1+tol)+0.01 && !n.Missed:
						t.Fatalf("tolerance %g, %d replicas of %d serving, load %.2f: %g is within the tolerance and not raised", tol, r, c, load, plain.Replicas)
					case n.Missed:
						raised++
					}
				}
			}
		}
		if tol > 0 && raised == 0 { // with none, no metric is within the tolerance to raise
			t.Errorf("tolerance %g: no metric of the grid raised; the grid tests nothing", tol)
		}
	}
}

// TestHPADesiredTolerances: an HPA given its own tolerances holds where the default
// would act, and acts past them.
func TestHPADesiredTolerances(t *testing.T) {
	now := time.Unix(0, 0)
	wide := HPA{Min: 1, Max: 100, Tolerances: &Tolerances{ScaleDown: 0.2, ScaleUp: 0.2}}
	def := HPA{Min: 1, Max: 100}
	if got, _ := def.Desired(now, 10, []Metric{{Name: "m", Value: 11.5, Target: 1}}); got != 12 {
		t.Errorf("default HPA at 11.5 of 10: %d, want 12", got)
	}
	if got, _ := wide.Desired(now, 10, []Metric{{Name: "m", Value: 11.5, Target: 1}}); got != 10 {
		t.Errorf("HPA tolerating 20%% at 11.5 of 10: %d, want 10", got)
	}
	if got, _ := wide.Desired(now.Add(15*time.Second), 10, []Metric{{Name: "m", Value: 12.5, Target: 1}}); got != 13 {
		t.Errorf("HPA tolerating 20%% at 12.5 of 10: %d, want 13", got)
	}
}

func TestHPADesired(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	t.Run("largest proposal wins", func(t *testing.T) {
		h := HPA{Min: 1, Max: 20}
		got, why := h.Desired(t0, 2, []Metric{{"queue-backlog", 12, 4}, {"gpu-util", 300, 80}})
		if got != 4 || why != "gpu-util 300/80" {
			t.Errorf("Desired = %d %q, want 4 %q", got, why, "gpu-util 300/80")
		}
	})
	t.Run("scale-up limited to double or +4", func(t *testing.T) {
		h := HPA{Min: 1, Max: 100}
		if got, _ := h.Desired(t0, 1, []Metric{{"queue-backlog", 400, 4}}); got != 5 {
			t.Errorf("from 1: %d, want 5 (1+4)", got)
		}
		if got, _ := h.Desired(t0, 10, []Metric{{"queue-backlog", 400, 4}}); got != 20 {
			t.Errorf("from 10: %d, want 20 (2×10)", got)
		}
	})
	t.Run("clamped to max and min", func(t *testing.T) {
		h := HPA{Min: 1, Max: 6}
		if got, _ := h.Desired(t0, 5, []Metric{{"queue-backlog", 400, 4}}); got != 6 {
			t.Errorf("above max: %d, want 6", got)
		}
		if got, _ := h.Desired(t0, 1, []Metric{{"queue-backlog", 0, 4}}); got != 1 {
			t.Errorf("below min: %d, want 1", got)
		}
	})
	t.Run("scale-down window holds the highest recent recommendation", func(t *testing.T) {
		h := HPA{Min: 1, Max: 20, ScaleDownWindow: 10 * time.Second}
		if got, _ := h.Desired(t0, 8, []Metric{{"queue-backlog", 32, 4}}); got != 8 {
			t.Fatalf("steady: %d, want 8", got)
		}
		if got, _ := h.Desired(t0.Add(5*time.Second), 8, []Metric{{"queue-backlog", 4, 4}}); got != 8 {
			t.Errorf("5s after a recommendation of 8: %d, want 8 (held)", got)
		}
		if got, _ := h.Desired(t0.Add(11*time.Second), 8, []Metric{{"queue-backlog", 4, 4}}); got != 1 {
			t.Errorf("11s after: %d, want 1", got)
		}
	})
	t.Run("no metric: no change", func(t *testing.T) {
		h := HPA{Min: 1, Max: 20}
		if got, _ := h.Desired(t0, 3, nil); got != 3 {
			t.Errorf("Desired with no metrics = %d, want 3", got)
		}
	})
}

func TestScaledObjectObserve(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	s := ScaledObject{Cooldown: 10 * time.Second}
	steps := []struct {
		at       time.Duration
		replicas int
		active   bool
		err      error
		want     int
		changed  bool
	}{
		{at: 0, replicas: 0, want: 0},                                                       // idle at zero stays there
		{at: 1 * time.Second, replicas: 0, active: true, want: 1, changed: true},            // activation from zero
		{at: 2 * time.Second, replicas: 3, active: true, want: 3},                           // the HPA owns 1..max
		{at: 5 * time.Second, replicas: 3, want: 3},                                         // inactive, cooling down
		{at: 20 * time.Second, replicas: 3, err: errors.New("Unavailable: stale"), want: 3}, // an error never scales to zero
		{at: 21 * time.Second, replicas: 3, want: 0, changed: true},                         // cooldown since 2s has passed
	}
	for _, st := range steps {
		got, why, changed := s.Observe(t0.Add(st.at), st.replicas, st.active, st.err)
		if got != st.want || changed != st.changed {
			t.Errorf("at %s (replicas %d, active %v, err %v): got %d changed %v (%q), want %d changed %v",
				st.at, st.replicas, st.active, st.err, got, changed, why, st.want, st.changed)
		}
	}
}

func TestJobsToCreate(t *testing.T) {
	for name, tc := range map[string]struct {
		active                  bool
		queue, target           float64
		maxReplicas, unfinished int
		want                    int
	}{
		"one Job per item":                  {true, 6, 1, 16, 0, 6},
		"minus unfinished Jobs":             {true, 6, 1, 16, 4, 2},
		"capped at maxReplicaCount":         {true, 40, 1, 16, 0, 16},
		"ceil of queue over target":         {true, 5, 2, 16, 0, 3},
		"more unfinished than wanted: none": {true, 2, 1, 16, 5, 0},
		"inactive: none":                    {false, 6, 1, 16, 0, 0},
	} {
		t.Run(name, func(t *testing.T) {
			if got := JobsToCreate(tc.active, tc.queue, tc.target, tc.maxReplicas, tc.unfinished); got != tc.want {
				t.Errorf("JobsToCreate = %d, want %d", got, tc.want)
			}
		})
	}
}
