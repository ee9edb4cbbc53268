package scaler

import (
	"fmt"
	"runtime"
	"slices"
	"testing"

	"github.com/gpuscaler/gpuscaler/internal/natstest"
	gpuscalerv1 "github.com/gpuscaler/gpuscaler/proto/gpuscaler/v1"
)

// TestQueueReportsHaveTheirOwnShard checks that queue reports, which wake workloads, are
// read from a stream of their own and applied by a shard no node report goes to, so they
// never wait behind node reports; and that every report of one subject goes to one
// shard, so it is applied in order.
func TestQueueReportsHaveTheirOwnShard(t *testing.T) {
	ns := natstest.Start(t, "", "")
	s := startScaler(t, ns.ClientURL(), Config{})
	nodes, queues := s.followers[0], s.followers[1]
	if !slices.Equal(nodes.stream.Subjects, []string{gpuscalerv1.NodeSubjects}) || !slices.Equal(queues.stream.Subjects, []string{gpuscalerv1.QueueSubjects}) {
		t.Fatalf("followers read %v and %v, want %s and %s", nodes.stream.Subjects, queues.stream.Subjects, gpuscalerv1.NodeSubjects, gpuscalerv1.QueueSubjects)
	}
	if len(nodes.shards) != runtime.GOMAXPROCS(0) || len(queues.shards) != 1 {
		t.Fatalf("%d node shards and %d queue shards, want %d and 1", len(nodes.shards), len(queues.shards), runtime.GOMAXPROCS(0))
	}
	for _, cpus := range []int{1, 2, 16} {
		f := &follower{shards: make([]chan shardItem, cpus)}
		for i := range 200 {
			n, _ := gpuscalerv1.NodeSubject(fmt.Sprintf("gpu-node-%d", i))
			shard := f.shardFor(n)
			if shard < 0 || shard >= cpus || f.shardFor(n) != shard {
				t.Fatalf("%d shards: node %s to shard %d, then %d", cpus, n, shard, f.shardFor(n))
			}
		}
	}
}
