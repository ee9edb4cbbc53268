package scaler

import (
	"fmt"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	pb "github.com/gpuscaler/gpuscaler/proto/externalscaler"
	gpuscalerv1 "github.com/gpuscaler/gpuscaler/proto/gpuscaler/v1"
)

// benchState is a state like gpuscaler bench's: 1,000 nodes × 8 GPUs, seven held by pods
// of 100 apps over 50 namespaces, one free; and 1,000 queues.
func benchState(b *testing.B) *State {
	b.Helper()
	s := NewState(nil)
	now := time.Now()
	for i := range 1000 {
		s.Apply(gpuscalerv1.Event{Node: benchNodeReport(i)}, now)
		if err := s.Apply(queueEvent("ml", fmt.Sprintf("q-%d", i), uint64(i), 0), now); err != nil {
			b.Fatal(err) // 1,000 queues in one namespace: as many as the default limit allows
		}
	}
	return s
}

func BenchmarkParseTrigger(b *testing.B) {
	md := map[string]string{"scalerAddress": "gpuscaler:9090", "queue": "jobs", "queueTarget": "5",
		"podSelector": "app=svc-01,tier=gpu", "gpuUtilTarget": "60"}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := ParseTrigger("ml", md, 0); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkReadQueue(b *testing.B) {
	s := benchState(b)
	tr, _ := ParseTrigger("ml", map[string]string{"queue": "q-500"}, 0)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := s.Read(tr).Metric(MetricQueueBacklog); err != nil {
			b.Fatal(err)
		}
	}
}

// benchNodeReport is node i's report in benchState.
func benchNodeReport(i int) *gpuscalerv1.NodeReport {
	r := &gpuscalerv1.NodeReport{Node: fmt.Sprintf("node-%04d", i), Source: "sim"}
	for g := range 8 {
		smp := &gpuscalerv1.GPUSample{Uuid: fmt.Sprintf("GPU-%d-%d", i, g), GpuUtil: proto.Float64(float64(g * 10)),
			FbUsedBytes: proto.Uint64(1 << 30), FbTotalBytes: proto.Uint64(80 << 30)}
		if g != 7 {
			app := (i*8 + g) % 100
			smp.Pod = &gpuscalerv1.PodRef{Namespace: fmt.Sprintf("ns-%02d", app%50), Name: fmt.Sprintf("svc-%02d-%d", app, i),
				Labels: map[string]string{"app": fmt.Sprintf("svc-%02d", app), "tier": "gpu", "pod-template-hash": "7d4b9c8f6"}}
		}
		r.Gpus = append(r.Gpus, smp)
	}
	return r
}

// BenchmarkReadGPU reads one app's GPUs: about 56 GPUs on 56 nodes among 1,000.
func BenchmarkReadGPU(b *testing.B) {
	s := benchState(b)
	tr, _ := ParseTrigger("ns-01", map[string]string{"podSelector": "app=svc-01,tier=gpu", "gpuUtilTarget": "60"}, 0)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := s.Read(tr).Metric(MetricGPUUtil); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkApplyNode(b *testing.B) {
	s := benchState(b)
	ev := gpuscalerv1.Event{Node: benchNodeReport(1)}
	now := time.Now()
	b.ReportAllocs()
	for b.Loop() {
		s.Apply(ev, now)
	}
}

// bigNamespaceState is issue 12's large case: 1,000 nodes × 8 GPUs, 7,000 of them held
// by pods of 700 apps of 10 GPUs in one namespace, each app spread over 10 nodes, and a
// selection read for each app (so the applier keeps them up to date).
func bigNamespaceState(b *testing.B) (*State, []*Trigger, []gpuscalerv1.Event) {
	b.Helper()
	s := NewState(nil)
	now := time.Now()
	events := make([]gpuscalerv1.Event, 1000)
	for i := range events {
		r := &gpuscalerv1.NodeReport{Node: fmt.Sprintf("node-%04d", i), Source: "sim"}
		for g := range 8 {
			smp := &gpuscalerv1.GPUSample{Uuid: fmt.Sprintf("GPU-%d-%d", i, g), GpuUtil: proto.Float64(float64(g * 10)),
				FbUsedBytes: proto.Uint64(1 << 30), FbTotalBytes: proto.Uint64(80 << 30)}
			if gpu := i*8 + g; gpu < 7000 {
				app := gpu % 700
				smp.Pod = &gpuscalerv1.PodRef{Namespace: "big", Name: fmt.Sprintf("svc-%03d-%d", app, i),
					Labels: map[string]string{"app": fmt.Sprintf("svc-%03d", app), "tier": "gpu", "pod-template-hash": "7d4b9c8f6"}}
			}
			r.Gpus = append(r.Gpus, smp)
		}
		events[i] = gpuscalerv1.Event{Node: r}
		s.Apply(events[i], now)
	}
	triggers := make([]*Trigger, 700)
	for app := range triggers {
		triggers[app], _ = ParseTrigger("big", map[string]string{"podSelector": fmt.Sprintf("app=svc-%03d,tier=gpu", app), "gpuUtilTarget": "60"}, 0)
		if _, err := s.Read(triggers[app]).Metric(MetricGPUUtil); err != nil {
			b.Fatal(err)
		}
	}
	return s, triggers, events
}

// BenchmarkReadGPUBigNamespace reads one app of 10 GPUs in a namespace of 7,000.
func BenchmarkReadGPUBigNamespace(b *testing.B) {
	s, triggers, _ := bigNamespaceState(b)
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		if _, err := s.Read(triggers[i%len(triggers)]).Metric(MetricGPUUtil); err != nil {
			b.Fatal(err)
		}
		i++
	}
}

// BenchmarkApplyNodeBigNamespace applies reports of nodes whose 8 GPUs are held by pods
// of 8 apps, each app's selection kept up to date.
func BenchmarkApplyNodeBigNamespace(b *testing.B) {
	s, _, events := bigNamespaceState(b)
	now := time.Now()
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		s.Apply(events[i%875], now)
		i++
	}
}

// BenchmarkApplyWhileReading applies reports as BenchmarkApplyNodeBigNamespace does while
// another goroutine reads the apps' triggers flat out: reads must not slow the applier
// down beyond the CPU they take.
func BenchmarkApplyWhileReading(b *testing.B) {
	s, triggers, events := bigNamespaceState(b)
	stop := make(chan struct{})
	done := make(chan int)
	go func() {
		n := 0
		for {
			select {
			case <-stop:
				done <- n
				return
			default:
			}
			s.Read(triggers[n%len(triggers)])
			n++
		}
	}()
	now := time.Now()
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		s.Apply(events[i%875], now)
		i++
	}
	close(stop)
	b.ReportMetric(float64(<-done)/b.Elapsed().Seconds(), "reads/s")
}

// benchServer is a ready Server over benchState with the trigger cache and call recorder
// the scaler runs with, answering as the gRPC handlers do (without the transport).
func benchServer(b *testing.B) *Server {
	b.Helper()
	srv := readyServer(benchState(b))
	srv.triggers = newTriggerCache(defaultTriggerCacheSize)
	srv.calls = newCallRecorder(time.Now, defaultCallRows, defaultCallIdleAfter)
	return srv
}

// BenchmarkGetMetrics is one GetMetrics call of a queue trigger as KEDA makes it, from
// the parsed-trigger cache to the response.
func BenchmarkGetMetrics(b *testing.B) {
	srv := benchServer(b)
	req := &pb.GetMetricsRequest{ScaledObjectRef: ref("ml", "svc", map[string]string{"queue": "q-500"}), MetricName: MetricQueueBacklog}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := srv.GetMetrics(b.Context(), req); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkGetMetricsGPU is BenchmarkGetMetrics for one app's GPUs (as BenchmarkReadGPU).
func BenchmarkGetMetricsGPU(b *testing.B) {
	srv := benchServer(b)
	req := &pb.GetMetricsRequest{ScaledObjectRef: ref("ns-01", "svc-01", map[string]string{"podSelector": "app=svc-01,tier=gpu", "gpuUtilTarget": "60"}), MetricName: MetricGPUUtil}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := srv.GetMetrics(b.Context(), req); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkIsActive is one IsActive call of a queue trigger as KEDA makes it, through
// the same read as BenchmarkGetMetrics.
func BenchmarkIsActive(b *testing.B) {
	srv := benchServer(b)
	r := ref("ml", "svc", map[string]string{"queue": "q-500"})
	b.ReportAllocs()
	for b.Loop() {
		if _, err := srv.IsActive(b.Context(), r); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkApplyNodeChecked is BenchmarkApplyNode with every pod the report names looked
// up in a PodDirectory (claims.go), as a scaler with --kubeconfig does.
func BenchmarkApplyNodeChecked(b *testing.B) {
	s := benchState(b)
	r := benchNodeReport(1)
	pods := newAPIPods(true)
	for _, g := range r.GetGpus() {
		for i := range g.NumPods() {
			p := g.PodAt(i)
			pods.put(p.GetNamespace(), p.GetName(), "", r.GetNode(), p.GetLabels())
		}
	}
	s.SetPodDirectory(pods, nil)
	ev := gpuscalerv1.Event{Node: r}
	now := time.Now()
	b.ReportAllocs()
	for b.Loop() {
		s.Apply(ev, now)
	}
}
