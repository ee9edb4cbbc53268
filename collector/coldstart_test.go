package collector

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpuscaler/gpuscaler/collector/sim"
	"github.com/gpuscaler/gpuscaler/internal/natstest"
	gpuscalerv1 "github.com/gpuscaler/gpuscaler/proto/gpuscaler/v1"
)

// TestColdStartFromDevicesToBusy runs a collector over a simulated node, report by
// report on a clock the test moves: a pod's cold start is the time from the report that
// first shows it holding GPUs to the first that shows them above BusyUtil, carried in
// every later report of the pod. A pod in the collector's first report, or first seen
// busy, started unseen and is not measured; nor is one idle longer than an hour.
func TestColdStartFromDevicesToBusy(t *testing.T) {
	ns := natstest.Start(t, "", "")
	at := time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC)
	old := sim.Pod{Namespace: "ml", Name: "old", GPUs: []string{"0"}, Util: pct(0)}
	pods := []sim.Pod{old}
	node, err := sim.New("n1", sim.Config{GPUs: 4, Pods: pods})
	if err != nil {
		t.Fatal(err)
	}
	c, err := New(Config{Node: "n1", Now: func() time.Time { return at }}, node, node, node, natstest.Connect(t, ns.ClientURL()).Conn, nil, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	// step moves the clock by d, sets the pods' utilisation, and returns each pod's cold
	// start in the report made then (-1: none).
	step := func(d time.Duration, utils ...float64) map[string]float64 {
		t.Helper()
		at = at.Add(d)
		for i := range pods {
			pods[i].Util = pct(utils[i])
		}
		if err := node.SetConfig(sim.Config{GPUs: 4, Pods: pods}); err != nil {
			t.Fatal(err)
		}
		r, err := c.Report(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]float64{}
		for _, g := range r.GetGpus() {
			for _, p := range g.Pods() {
				got[p.GetName()] = -1
				if p.ColdStartSeconds != nil {
					got[p.GetName()] = p.GetColdStartSeconds()
				}
			}
		}
		return got
	}
	want := func(got map[string]float64, name string, seconds float64) {
		t.Helper()
		if got[name] != seconds {
			t.Errorf("at %s: pod %s cold start %g, want %g (-1: none); all %v", at.Format(time.TimeOnly), name, got[name], seconds, got)
		}
	}

	want(step(0, 0), "old", -1) // the first report: old was there before the collector
	pods = append(pods,
		sim.Pod{Namespace: "ml", Name: "llm-0", GPUs: []string{"1", "2"}, Util: pct(0)},
		sim.Pod{Namespace: "ml", Name: "busy", GPUs: []string{"3"}, Util: pct(90)})
	got := step(time.Second, 0, 0, 90)
	want(got, "llm-0", -1)
	want(got, "busy", -1)
	want(step(30*time.Second, 0, BusyUtil, 90), "llm-0", -1) // at BusyUtil, not above it
	got = step(15*time.Second, 50, BusyUtil+1, 90)
	want(got, "llm-0", 45)
	want(got, "old", -1)  // busy now, but its start was not seen
	want(got, "busy", -1) // first seen busy
	want(step(time.Minute, 0, 0, 0), "llm-0", 45)

	// A pod that leaves and comes back (a new pod in the same place, which the
	// simulator gives the same UID) is measured anew.
	pods = pods[:1]
	step(time.Second, 0)
	pods = append(pods, sim.Pod{Namespace: "ml", Name: "llm-0", GPUs: []string{"1"}, Util: pct(0)})
	step(time.Second, 0, 0)
	want(step(20*time.Second, 0, 80), "llm-0", 20)

	// Idle longer than an hour: not loading all that time, not measured.
	pods = pods[:1]
	step(time.Second, 0)
	pods = append(pods, sim.Pod{Namespace: "ml", Name: "idle", GPUs: []string{"2"}, Util: pct(0)})
	step(time.Second, 0, 0)
	step(time.Hour+time.Second, 0, 0)
	want(step(time.Second, 0, 80), "idle", -1)
}

// TestColdStartValidates checks a measured figure is one the scaler takes.
func TestColdStartValidates(t *testing.T) {
	p, s, r, at := idlePodSeen()
	r.Gpus[0].GpuUtil = pct(100)
	s.stamp(r, at.Add(59*time.Minute))
	if p.GetColdStartSeconds() != 59*60 {
		t.Fatalf("cold start %v, want 3540", p.ColdStartSeconds)
	}
	if err := r.Validate(); err != nil {
		t.Fatal(err)
	}
}

func pct(v float64) *float64 { return &v }

// idlePodSeen returns a pod on one idle GPU, the cold starts of a collector past its
// first report, and the report, which that collector has stamped at the time returned:
// the pod was seen then, idle, so its start is measured from there.
func idlePodSeen() (*gpuscalerv1.PodRef, *coldStarts, *gpuscalerv1.NodeReport, time.Time) {
	p := &gpuscalerv1.PodRef{Namespace: "ml", Name: "llm-0"}
	s := newColdStarts()
	s.first = false
	r := &gpuscalerv1.NodeReport{Node: "n1", Gpus: []*gpuscalerv1.GPUSample{{Uuid: "GPU-0", GpuUtil: pct(0), Pod: p}}}
	at := time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC)
	s.stamp(r, at)
	return p, s, r, at
}

// TestColdStartPastAnHourIsNone: a pod idle for just under an hour and busy just after
// it is not measured, rather than stamped with a figure PodRef's validation refuses,
// which would make every report of the node invalid for as long as the pod lives.
func TestColdStartPastAnHourIsNone(t *testing.T) {
	p, s, r, at := idlePodSeen()
	s.stamp(r, at.Add(3599*time.Second))
	r.Gpus[0].GpuUtil = pct(100)
	s.stamp(r, at.Add(3601*time.Second))
	if p.ColdStartSeconds != nil {
		t.Errorf("cold start %v after an hour and a second, want none", *p.ColdStartSeconds)
	}
	if err := r.Validate(); err != nil {
		t.Fatal(err)
	}
}
