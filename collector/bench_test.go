package collector

import (
	"context"
	"fmt"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpuscaler/gpuscaler/collector/sim"
	"github.com/gpuscaler/gpuscaler/internal/natstest"
)

// BenchmarkCycle is one collection and publish for a simulated 8-GPU node: read the GPUs,
// attribute them, add pod labels, validate, encode, publish to a real NATS server. At
// 1 Hz, 1% of a core is 10 ms a cycle.
func BenchmarkCycle(b *testing.B) {
	cfg := sim.Config{GPUs: 8, Util: 60, Jitter: 5}
	for i := range 6 { // six pods hold a GPU each, two GPUs are free
		cfg.Pods = append(cfg.Pods, sim.Pod{Namespace: "ml", Name: "llm-" + string(rune('a'+i)), GPUs: []string{string(rune('0' + i))},
			Labels: map[string]string{"app": "llm", "tier": "gpu", "pod-template-hash": "7d4b9c8f6"}, OwnerKind: "Deployment", OwnerName: "llm"})
	}
	benchCycle(b, cfg)
}

// BenchmarkCycleTimeSliced is BenchmarkCycle on a node whose 8 GPUs are each offered as 4
// time-slicing replicas: 32 devices, 28 held by 28 pods (every GPU shared by 3 or 4), each
// pod's own utilisation measured.
func BenchmarkCycleTimeSliced(b *testing.B) {
	cfg := sim.Config{GPUs: 8, Util: 20, Jitter: 5, Replicas: 4}
	for i := range 28 {
		cfg.Pods = append(cfg.Pods, sim.Pod{Namespace: "ml", Name: fmt.Sprintf("llm-%02d", i), GPUs: []string{fmt.Sprint(i % 8)},
			Labels: map[string]string{"app": "llm", "tier": "gpu", "pod-template-hash": "7d4b9c8f6"}, OwnerKind: "Deployment", OwnerName: "llm"})
	}
	benchCycle(b, cfg)
}

func benchCycle(b *testing.B, cfg sim.Config) {
	ns := natstest.Start(b, "", "")
	simulated, err := sim.New("bench-node", cfg)
	if err != nil {
		b.Fatal(err)
	}
	c, err := New(Config{Node: "bench-node", CollectorID: "bench"}, simulated, simulated, simulated, natstest.Connect(b, ns.ClientURL()).Conn, nil, prometheus.NewRegistry())
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		c.cycle(ctx)
	}
	b.StopTimer()
	if c.Ready() != nil {
		b.Fatalf("the collector did not publish: %v", c.Ready())
	}
}
