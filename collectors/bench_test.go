package collectors

import (
	"context"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpuscaler/gpuscaler/internal/natstest"
)

// BenchmarkCycle is one collection and publish for a simulated 8-GPU node: read the GPUs,
// attribute them, add pod labels, validate, encode, publish to a real NATS server. At
// 1 Hz, 1% of a core is 10 ms a cycle.
func BenchmarkCycle(b *testing.B) {
	ns := natstest.Start(b, "", "")
	cfg := SimConfig{GPUs: 8, Util: 60, Jitter: 5}
	for i := range 6 { // six pods hold a GPU each, two GPUs are free
		cfg.Pods = append(cfg.Pods, SimPod{Namespace: "ml", Name: "llm-" + string(rune('a'+i)), GPUs: []string{string(rune('0' + i))},
			Labels: map[string]string{"app": "llm", "tier": "gpu", "pod-template-hash": "7d4b9c8f6"}, OwnerKind: "Deployment", OwnerName: "llm"})
	}
	sim, err := NewSim("bench-node", cfg)
	if err != nil {
		b.Fatal(err)
	}
	c, err := New(Config{Node: "bench-node", CollectorID: "bench"}, sim, sim, sim, natstest.Connect(b, ns.ClientURL()).Conn, nil, prometheus.NewRegistry())
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
