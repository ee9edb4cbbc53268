package inference

import "time"

// timelineBins is how many intervals a timeline splits the replay into: enough for a
// chart's width, few enough to keep per service and policy.
const timelineBins = 720

// timeline is one run's course over the replay, in equal bins: the replicas held (their
// average over the bin), the backlog (its most in the bin) and the longest wait of a
// request that arrived in the bin.
type timeline struct {
	bin      time.Duration
	replicas []float64 // replica-seconds, then the average once finished
	backlogs []int
	waits    []float64
}

func newTimeline(end time.Duration) *timeline {
	bin := max((end+timelineBins-1)/timelineBins, time.Second)
	return &timeline{bin: bin,
		replicas: make([]float64, timelineBins),
		backlogs: make([]int, timelineBins),
		waits:    make([]float64, timelineBins),
	}
}

func (t *timeline) index(at time.Duration) int {
	return min(int(at/t.bin), timelineBins-1)
}

// hold records n replicas held from from to to.
func (t *timeline) hold(from, to time.Duration, n int) {
	if n == 0 {
		return
	}
	for from < to {
		i := t.index(from)
		edge := min(time.Duration(i+1)*t.bin, to)
		if i == timelineBins-1 {
			edge = to
		}
		t.replicas[i] += float64(n) * (edge - from).Seconds()
		from = edge
	}
}

func (t *timeline) backlog(at time.Duration, n int) {
	if i := t.index(at); n > t.backlogs[i] {
		t.backlogs[i] = n
	}
}

func (t *timeline) wait(arrived time.Duration, seconds float64) {
	if i := t.index(arrived); seconds > t.waits[i] {
		t.waits[i] = seconds
	}
}

// add sums o into t: replicas and backlogs add up across services, waits take the
// longest.
func (t *timeline) add(o *timeline) {
	for i := range timelineBins {
		t.replicas[i] += o.replicas[i]
		t.backlogs[i] += o.backlogs[i]
		t.waits[i] = max(t.waits[i], o.waits[i])
	}
}

// Timeline is a policy's course over the replay, for a chart: at each Start + i·Bin,
// the replicas held on average across the bin, the most items queued, and the longest
// wait of a request that arrived in it.
type Timeline struct {
	Bin      time.Duration
	Replicas []float64
	Backlog  []int
	Wait     []float64
}

func (t *timeline) export() Timeline {
	out := Timeline{Bin: t.bin, Replicas: make([]float64, timelineBins), Backlog: t.backlogs, Wait: t.waits}
	for i, v := range t.replicas {
		out.Replicas[i] = v / t.bin.Seconds()
	}
	return out
}
