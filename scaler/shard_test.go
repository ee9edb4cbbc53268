package scaler

import (
	"fmt"
	"testing"

	gpuscalerv1 "github.com/gpuscaler/gpuscaler/proto/gpuscaler/v1"
)

// TestQueueReportsHaveTheirOwnShard checks that queue reports, which wake workloads, are
// applied by a shard no node report goes to, so they never wait behind node reports; and
// that every report of one subject goes to one shard, so it is applied in order.
func TestQueueReportsHaveTheirOwnShard(t *testing.T) {
	for _, cpus := range []int{1, 2, 16} {
		f := &follower{shards: make([]chan shardItem, cpus+1)}
		queueShard := -1
		for i := range 200 {
			q, _ := gpuscalerv1.QueueSubject(fmt.Sprintf("ns-%d", i%7), fmt.Sprintf("q-%d", i), "p")
			n, _ := gpuscalerv1.NodeSubject(fmt.Sprintf("gpu-node-%d", i))
			qs, ns := f.shardFor(q), f.shardFor(n)
			if queueShard < 0 {
				queueShard = qs
			}
			if qs != queueShard || ns == queueShard || ns < 0 || ns >= len(f.shards) {
				t.Fatalf("%d CPUs: queue %s to shard %d, node %s to shard %d; want every queue to one shard of its own", cpus, q, qs, n, ns)
			}
			if f.shardFor(n) != ns || f.shardFor(q) != qs {
				t.Fatalf("%d CPUs: one subject went to two shards", cpus)
			}
		}
	}
}
