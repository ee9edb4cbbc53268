package scaler

// GPU truth in the scaler: shared devices, pods whose labels or devices the collector
// could not resolve, unhealthy GPUs, and nodes forgotten while holding pods. Each case
// that would otherwise read as a silent zero must answer Unavailable.

import (
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	"github.com/gpuscaler/gpuscaler/internal/natstest"

	gpuscalerv1 "github.com/gpuscaler/gpuscaler/proto/gpuscaler/v1"
)

var llm = map[string]string{"app": "llm"}

// sharedGPU is one device at util percent, 40/80 GiB used, held by the given pods
// (namespace/name, labels llm unless the name starts with "other").
func sharedGPU(uuid string, util float64, pods ...*gpuscalerv1.PodRef) *gpuscalerv1.GPUSample {
	g := gpu(uuid, "", "", nil, util, 40, 80)
	g.Shared = len(pods) > 1
	if len(pods) > 0 {
		g.Pod, g.OtherPods = pods[0], pods[1:]
	}
	return g
}

func podRef(ns, name string, lbls map[string]string) *gpuscalerv1.PodRef {
	return &gpuscalerv1.PodRef{Namespace: ns, Name: name, Labels: lbls}
}

func TestSharedGPUMaths(t *testing.T) {
	other := map[string]string{"app": "other"}
	withUtil := func(p *gpuscalerv1.PodRef, u float64) *gpuscalerv1.PodRef { p.GpuUtil = proto.Float64(u); return p }
	tests := map[string]struct {
		gpus              []*gpuscalerv1.GPUSample
		md                map[string]string
		wantUtil, wantMem float64
		wantActive        bool
	}{
		// Four time-sliced pods of one workload on one GPU at 90%: the GPU counts once,
		// each pod a quarter of it. gpu-util = 90 / (1 GPU / 4 pods) = 360, so the HPA asks
		// ceil(360/70) = 6 pods: as many as 4 × 90/70 rounds up to, exactly what it would
		// ask of 4 whole-GPU pods at 90%.
		"one workload, four pods time-sliced on one GPU": {
			gpus: []*gpuscalerv1.GPUSample{sharedGPU("GPU-1", 90,
				podRef("ml", "llm-0", llm), podRef("ml", "llm-1", llm), podRef("ml", "llm-2", llm), podRef("ml", "llm-3", llm))},
			md:       map[string]string{"queue": "idle", "podSelector": "app=llm", "gpuUtilTarget": "70", "gpuMemoryTarget": "60", "activationGpuUtil": "80"},
			wantUtil: 360, wantMem: 200, wantActive: true,
		},
		// The same GPU shared with another workload, without per-pod figures: each of the
		// two pods is half the device and half its figures, so this workload sees a GPU at
		// 90% on average, held by one pod with half a GPU.
		"two workloads on one GPU, device figure split": {
			gpus:     []*gpuscalerv1.GPUSample{sharedGPU("GPU-1", 90, podRef("ml", "llm-0", llm), podRef("ml", "other-0", other))},
			md:       map[string]string{"queue": "idle", "podSelector": "app=llm", "gpuUtilTarget": "70", "gpuMemoryTarget": "60", "activationGpuUtil": "80"},
			wantUtil: 90, wantMem: 50, wantActive: true,
		},
		// With NVML's per-process figures this workload's pod used 20 of the GPU's 90%:
		// on its half GPU that is 40% on average, below the activation threshold.
		"two workloads on one GPU, measured per pod": {
			gpus: []*gpuscalerv1.GPUSample{sharedGPU("GPU-1", 90,
				withUtil(podRef("ml", "llm-0", llm), 20), withUtil(podRef("ml", "other-0", other), 70))},
			md:       map[string]string{"queue": "idle", "podSelector": "app=llm", "gpuUtilTarget": "70", "gpuMemoryTarget": "60", "activationGpuUtil": "80"},
			wantUtil: 40, wantMem: 50, wantActive: false,
		},
		// A per-pod figure missing for one pod: the device figure is split instead.
		"per-pod figures incomplete: device figure split": {
			gpus: []*gpuscalerv1.GPUSample{sharedGPU("GPU-1", 90,
				withUtil(podRef("ml", "llm-0", llm), 20), podRef("ml", "other-0", other))},
			md:       map[string]string{"podSelector": "app=llm", "gpuUtilTarget": "70", "gpuMemoryTarget": "60"},
			wantUtil: 90, wantMem: 50, wantActive: true,
		},
		// gpusPerReplica set: the sum over the workload's share of GPUs, divided by it.
		"gpusPerReplica given": {
			gpus: []*gpuscalerv1.GPUSample{sharedGPU("GPU-1", 80, podRef("ml", "llm-0", llm), podRef("ml", "llm-1", llm)),
				sharedGPU("GPU-2", 40, podRef("ml", "llm-2", llm), podRef("ml", "llm-3", llm))},
			md:       map[string]string{"podSelector": "app=llm", "gpuUtilTarget": "70", "gpuMemoryTarget": "60", "gpusPerReplica": "1"},
			wantUtil: 120, wantMem: 100, wantActive: true,
		},
		// A whole GPU per pod reads as it always did.
		"whole GPUs": {
			gpus: []*gpuscalerv1.GPUSample{gpu("GPU-1", "ml", "llm-0", llm, 90, 40, 80), gpu("GPU-2", "ml", "llm-1", llm, 30, 20, 80)},
			md:   map[string]string{"queue": "idle", "podSelector": "app=llm", "gpuUtilTarget": "70", "gpuMemoryTarget": "60", "activationGpuUtil": "50"},
			// 120 over 2 GPUs, 1 per pod; memory 50% + 25%.
			wantUtil: 120, wantMem: 75, wantActive: true,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			s := NewState(newFakeClock(t0).Now)
			s.Apply(nodeEvent("n1", tc.gpus...), t0)
			// Triggers with activationGpuUtil have a queue, idle: the GPU part decides.
			s.Apply(queueEvent("ml", "idle", 0, 0), t0)
			r := read(t, s, mustTrigger(t, "ml", tc.md))
			wantMetric(t, r, MetricGPUUtil, tc.wantUtil)
			wantMetric(t, r, MetricGPUMemory, tc.wantMem)
			if active, err := r.Active(); err != nil || active != tc.wantActive {
				t.Fatalf("Active() = %v, %v; want %v", active, err, tc.wantActive)
			}
		})
	}
}

func TestUnknownIsNeverZero(t *testing.T) {
	// With a queue, idle: Active is the GPU part's judgement, which needs utilisation (a
	// trigger with only podSelector is always active, TestGPUOnlyTriggerNeverLetsKEDAScaleToZero).
	md := map[string]string{"queue": "idle", "podSelector": "app=llm", "gpuUtilTarget": "70"}
	tests := map[string]struct {
		report func() *gpuscalerv1.NodeReport
		want   []string // in the error; none: no error
	}{
		"labels unknown": {
			report: func() *gpuscalerv1.NodeReport {
				p := podRef("ml", "llm-0", nil)
				p.LabelsUnknown = true
				return &gpuscalerv1.NodeReport{Node: "n1", Gpus: []*gpuscalerv1.GPUSample{sharedGPU("GPU-1", 90, p)}}
			},
			want: []string{"pod ml/llm-0 on node n1 holds GPU GPU-1", "could not read the pod's labels"},
		},
		"labels unknown in another namespace do not matter": {
			report: func() *gpuscalerv1.NodeReport {
				p := podRef("web", "x", nil)
				p.LabelsUnknown = true
				return &gpuscalerv1.NodeReport{Node: "n1", Gpus: []*gpuscalerv1.GPUSample{sharedGPU("GPU-1", 90, p), sharedGPU("GPU-2", 90, podRef("ml", "llm-0", llm))}}
			},
		},
		"an unattributed device of a selected pod": {
			report: func() *gpuscalerv1.NodeReport {
				return &gpuscalerv1.NodeReport{Node: "n1", Gpus: []*gpuscalerv1.GPUSample{sharedGPU("GPU-1", 90)},
					Unattributed: []*gpuscalerv1.UnattributedDevice{{Id: "nvidia7", Resource: "nvidia.com/gpu", Pod: podRef("ml", "llm-0", llm), Reason: "no GPU sample is the GPU minor number the device id names"}}}
			},
			want: []string{"pod ml/llm-0 on node n1 holds device nvidia7", "no GPU sample is the GPU minor number"},
		},
		"an unattributed device of a pod whose labels are unknown": {
			report: func() *gpuscalerv1.NodeReport {
				p := podRef("ml", "llm-0", nil)
				p.LabelsUnknown = true
				return &gpuscalerv1.NodeReport{Node: "n1",
					Unattributed: []*gpuscalerv1.UnattributedDevice{{Id: "weird", Resource: "nvidia.com/gpu", Pod: p, Reason: "device id in no known form"}}}
			},
			want: []string{"holds device weird", "no known form"},
		},
		"an unattributed device of a pod the selector does not select": {
			report: func() *gpuscalerv1.NodeReport {
				return &gpuscalerv1.NodeReport{Node: "n1", Gpus: []*gpuscalerv1.GPUSample{sharedGPU("GPU-1", 90, podRef("ml", "llm-0", llm))},
					Unattributed: []*gpuscalerv1.UnattributedDevice{{Id: "weird", Resource: "nvidia.com/gpu", Pod: podRef("ml", "batch", map[string]string{"app": "batch"}), Reason: "x"}}}
			},
		},
		"an unhealthy GPU without readings": {
			report: func() *gpuscalerv1.NodeReport {
				g := sharedGPU("GPU-1", 0, podRef("ml", "llm-0", llm))
				g.GpuUtil, g.Unhealthy, g.LastXid = nil, "GPU is lost (ERROR_GPU_IS_LOST)", 79
				return &gpuscalerv1.NodeReport{Node: "n1", Gpus: []*gpuscalerv1.GPUSample{g}}
			},
			want: []string{"GPU GPU-1 on node n1 (pod ml/llm-0) reports no utilisation", "unhealthy: GPU is lost"},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			s := NewState(newFakeClock(t0).Now)
			r := tc.report()
			if err := r.Validate(); err != nil {
				t.Fatalf("test report invalid: %v", err)
			}
			s.Apply(gpuscalerv1.Event{Subject: gpuscalerv1.Subject{Kind: gpuscalerv1.KindNode, Node: r.GetNode()}, Node: r}, t0)
			s.Apply(queueEvent("ml", "idle", 0, 0), t0)
			reading := read(t, s, mustTrigger(t, "ml", md))
			_, metricErr := reading.Metric(MetricGPUUtil)
			_, activeErr := reading.Active()
			if len(tc.want) == 0 {
				if metricErr != nil || activeErr != nil {
					t.Fatalf("errors %v, %v; want none", metricErr, activeErr)
				}
				return
			}
			wantUnavailable(t, metricErr, tc.want...)
			wantUnavailable(t, activeErr, tc.want...)
		})
	}
}

func TestUnhealthyDeviceIsNeverFree(t *testing.T) {
	s := NewState(newFakeClock(t0).Now)
	r := &gpuscalerv1.NodeReport{Node: "n1", Source: "nvml",
		Allocatable: []*gpuscalerv1.Device{
			{Id: "GPU-1", Resource: "nvidia.com/gpu"}, {Id: "GPU-2", Resource: "nvidia.com/gpu", Unhealthy: true}, {Id: "GPU-3", Resource: "nvidia.com/gpu"},
		},
		Allocated: []*gpuscalerv1.Device{{Id: "GPU-3", Resource: "nvidia.com/gpu"}},
	}
	s.Apply(gpuscalerv1.Event{Subject: gpuscalerv1.Subject{Kind: gpuscalerv1.KindNode, Node: "n1"}, Node: r}, t0)
	tr := mustTrigger(t, "ml", map[string]string{"queue": "jobs", "capacityAware": "true", "gpusPerReplica": "1"})
	if slots, err := s.capacity(tr); err != nil || slots != 1 {
		t.Fatalf("capacity = %d, %v; want 1 (GPU-2 is unhealthy, GPU-3 allocated)", slots, err)
	}
}

// TestCapacityOfSharedGPUs: replicas offered under the plain resource name are what a Job
// asking for nvidia.com/gpu gets, one each; replicas renamed nvidia.com/gpu.shared (the
// device plugin's renameByDefault) are a resource such a Job cannot use.
func TestCapacityOfSharedGPUs(t *testing.T) {
	var allocatable []*gpuscalerv1.Device
	for n := range 4 {
		allocatable = append(allocatable,
			&gpuscalerv1.Device{Id: fmt.Sprintf("GPU-1::%d", n), Resource: "nvidia.com/gpu"},
			&gpuscalerv1.Device{Id: fmt.Sprintf("GPU-2::%d", n), Resource: "nvidia.com/gpu.shared"},
			&gpuscalerv1.Device{Id: fmt.Sprintf("MIG-3::%d", n), Resource: "nvidia.com/mig-1g.10gb.shared"})
	}
	s := NewState(newFakeClock(t0).Now)
	r := &gpuscalerv1.NodeReport{Node: "n1", Allocatable: allocatable, Allocated: allocatable[:1]}
	s.Apply(gpuscalerv1.Event{Subject: gpuscalerv1.Subject{Kind: gpuscalerv1.KindNode, Node: "n1"}, Node: r}, t0)
	for profile, want := range map[string]int{"1": 3, "1g.10gb": 0} {
		tr := mustTrigger(t, "ml", map[string]string{"queue": "jobs", "capacityAware": "true", "gpusPerReplica": profile})
		if slots, err := s.capacity(tr); err != nil || slots != want {
			t.Errorf("gpusPerReplica %s: capacity = %d, %v; want %d", profile, slots, err, want)
		}
	}
}

func TestForgottenNodeTombstone(t *testing.T) {
	md := map[string]string{"podSelector": "app=llm", "gpuUtilTarget": "70"}
	setup := func(t *testing.T, ttl time.Duration) (*State, *fakeClock, *Trigger) {
		clock := newFakeClock(t0)
		s := NewState(clock.Now)
		s.SetNodeTombstoneTTL(ttl)
		s.Apply(nodeEvent("dead", gpu("GPU-1", "ml", "llm-0", llm, 90, 40, 80)), t0)
		s.Apply(nodeEvent("idle", gpu("GPU-9", "", "", nil, 0, 0, 80)), t0)
		clock.Advance(20 * time.Minute)
		s.Apply(nodeEvent("idle", gpu("GPU-9", "", "", nil, 0, 0, 80)), clock.Now())
		if n := s.Forget(clock.Now().Add(-15 * time.Minute)); n != 1 {
			t.Fatalf("Forget dropped %d entries, want 1", n)
		}
		return s, clock, mustTrigger(t, "ml", md)
	}
	t.Run("a forgotten node's pods keep the trigger Unavailable", func(t *testing.T) {
		s, _, tr := setup(t, time.Hour)
		_, err := read(t, s, tr).Metric(MetricGPUUtil)
		wantUnavailable(t, err, "node dead last reported at 2026-11-22T10:00:00Z and was forgotten at 2026-11-22T10:15:00Z", "GPU-1 of pod ml/llm-0")
		_, err = read(t, s, tr).Active()
		wantUnavailable(t, err, "forgotten")
		if s.Tombstones() != 1 {
			t.Fatalf("Tombstones() = %d, want 1", s.Tombstones())
		}
	})
	t.Run("a replica that restarts and replays the stream makes the same tombstone", func(t *testing.T) {
		s, _, tr := setup(t, time.Hour)
		_, want := read(t, s, tr).Metric(MetricGPUUtil)
		clock := newFakeClock(t0.Add(20 * time.Minute))
		restarted := NewState(clock.Now)
		restarted.Apply(nodeEvent("dead", gpu("GPU-1", "ml", "llm-0", llm, 90, 40, 80)), t0) // the report the stream kept
		restarted.Apply(nodeEvent("idle", gpu("GPU-9", "", "", nil, 0, 0, 80)), clock.Now())
		restarted.Forget(clock.Now().Add(-15 * time.Minute))
		if _, got := read(t, restarted, tr).Metric(MetricGPUUtil); got == nil || got.Error() != want.Error() {
			t.Fatalf("restarted replica: %v\nwant as the replica that ran all along: %v", got, want)
		}
		// Past the TTL the stream has dropped the report; one still replayed makes none.
		clock.Advance(time.Hour)
		late := NewState(clock.Now)
		late.Apply(nodeEvent("dead", gpu("GPU-1", "ml", "llm-0", llm, 90, 40, 80)), t0)
		late.Forget(clock.Now().Add(-15 * time.Minute))
		if late.Tombstones() != 0 {
			t.Fatalf("a report past MaxAge and the TTL made a tombstone")
		}
	})
	t.Run("cleared when the node reports again", func(t *testing.T) {
		s, clock, tr := setup(t, time.Hour)
		s.Apply(nodeEvent("dead", gpu("GPU-1", "", "", nil, 0, 0, 80)), clock.Now())
		r := read(t, s, tr)
		wantMetric(t, r, MetricGPUUtil, 0)
		if s.Tombstones() != 0 {
			t.Fatalf("Tombstones() = %d, want 0", s.Tombstones())
		}
	})
	t.Run("a selected pod on a live node is read instead", func(t *testing.T) {
		s, clock, tr := setup(t, time.Hour)
		s.Apply(nodeEvent("new", gpu("GPU-5", "ml", "llm-1", llm, 60, 40, 80)), clock.Now())
		wantMetric(t, read(t, s, tr), MetricGPUUtil, 60)
	})
	t.Run("another workload's trigger is unaffected", func(t *testing.T) {
		s, _, _ := setup(t, time.Hour)
		wantMetric(t, read(t, s, mustTrigger(t, "ml", map[string]string{"podSelector": "app=other", "gpuUtilTarget": "70"})), MetricGPUUtil, 0)
	})
	t.Run("expires after the TTL", func(t *testing.T) {
		s, clock, tr := setup(t, time.Hour)
		clock.Advance(time.Hour)
		s.Apply(nodeEvent("idle", gpu("GPU-9", "", "", nil, 0, 0, 80)), clock.Now())
		s.Forget(clock.Now().Add(-15 * time.Minute))
		wantMetric(t, read(t, s, tr), MetricGPUUtil, 0)
		if s.Tombstones() != 0 {
			t.Fatalf("Tombstones() = %d, want 0", s.Tombstones())
		}
	})
	t.Run("no tombstones when turned off", func(t *testing.T) {
		s, _, tr := setup(t, 0)
		wantMetric(t, read(t, s, tr), MetricGPUUtil, 0)
	})
	t.Run("bounded: the oldest go first", func(t *testing.T) {
		clock := newFakeClock(t0)
		s := NewState(clock.Now)
		s.maxTombstones = 20
		for i := range s.maxTombstones + 10 {
			s.Apply(nodeEvent(fmt.Sprintf("n%05d", i), gpu(fmt.Sprintf("GPU-%d", i), "ml", "p", llm, 1, 1, 2)), clock.Now())
			clock.Advance(time.Millisecond)
			s.Forget(clock.Now())
		}
		if got := s.Tombstones(); got != s.maxTombstones {
			t.Fatalf("Tombstones() = %d, want %d", got, s.maxTombstones)
		}
		s.Apply(nodeEvent("live", gpu("GPU-x", "", "", nil, 0, 0, 80)), clock.Now())
		_, err := read(t, s, mustTrigger(t, "ml", md)).Metric(MetricGPUUtil)
		wantUnavailable(t, err, "node n00010 ") // the oldest kept, by node name
	})
}

// TestStreamKeepsTombstones: the stream keeps reports for --stream-max-age plus the
// tombstone TTL, so a replica that starts after a node was forgotten still reads its
// last report and makes the same tombstone.
func TestStreamKeepsTombstones(t *testing.T) {
	for name, tc := range map[string]struct {
		ttl, want time.Duration
	}{
		"default TTL":   {ttl: 0, want: 10*time.Minute + DefaultNodeTombstoneTTL},
		"TTL 30m":       {ttl: 30 * time.Minute, want: 40 * time.Minute},
		"no tombstones": {ttl: -1, want: 10 * time.Minute},
	} {
		t.Run(name, func(t *testing.T) {
			ns := natstest.Start(t, "", "")
			startScaler(t, ns.ClientURL(), Config{Stream: StreamConfig{MaxAge: 10 * time.Minute}, NodeTombstoneTTL: tc.ttl})
			js, err := jetstream.New(natstest.Connect(t, ns.ClientURL()).Conn)
			if err != nil {
				t.Fatal(err)
			}
			st, err := js.Stream(t.Context(), gpuscalerv1.StreamName)
			if err != nil {
				t.Fatal(err)
			}
			if got := st.CachedInfo().Config.MaxAge; got != tc.want {
				t.Fatalf("stream MaxAge %s, want %s", got, tc.want)
			}
		})
	}
}
