package demo

import (
	"fmt"
	"slices"

	"github.com/gpuscaler/gpuscaler/collector/sim"
)

// cluster is the simulated cluster's scheduler: which pod holds which GPU on which node.
// Each node is a sim.Node whose pods and their load the demo sets every step, so its
// collector publishes real NodeReports, attributed, to the real scaler. Only the demo's
// world goroutine touches a cluster.
type cluster struct {
	nodes []*simNode
}

type simNode struct {
	name string
	pool string // the node's "pool" label: inference or training
	sim  *sim.Node
	cfg  sim.Config
	// holder[i] is the pod holding GPU i, nil when it is free.
	holder []*pod
}

// pod is a pod holding GPUs: an inference replica or a training Job.
type pod struct {
	namespace, name string
	labels          map[string]string
	ownerKind       string
	ownerName       string
	gpus            int
	pool            string // nodeSelector pool=<pool>
	node            *simNode
	util            float64 // percent, set by the workload each step
}

func newCluster(nodes, gpusPerNode int, seed uint64) (*cluster, error) {
	c := &cluster{}
	for i := range nodes {
		pool := "inference"
		if i >= (nodes+1)/2 {
			pool = "training"
		}
		name := fmt.Sprintf("gpu-node-%d", i)
		cfg := sim.Config{GPUs: gpusPerNode, Jitter: 3, Seed: seed + uint64(i)}
		simulated, err := sim.New(name, cfg)
		if err != nil {
			return nil, err
		}
		c.nodes = append(c.nodes, &simNode{name: name, pool: pool, sim: simulated, cfg: cfg, holder: make([]*pod, gpusPerNode)})
	}
	return c, nil
}

// place binds p to the first node of its pool with p.gpus free GPUs, as the scheduler
// would; it returns false when none has room (the pod stays Pending).
func (c *cluster) place(p *pod) bool {
	for _, n := range c.nodes {
		if n.pool != p.pool || n.free() < p.gpus {
			continue
		}
		need := p.gpus
		for i := range n.holder {
			if need > 0 && n.holder[i] == nil {
				n.holder[i], need = p, need-1
			}
		}
		p.node = n
		return true
	}
	return false
}

// release frees p's GPUs.
func (c *cluster) release(p *pod) {
	if p.node == nil {
		return
	}
	for i, h := range p.node.holder {
		if h == p {
			p.node.holder[i] = nil
		}
	}
	p.node = nil
}

func (n *simNode) free() int {
	free := 0
	for _, h := range n.holder {
		if h == nil {
			free++
		}
	}
	return free
}

// free counts the free GPUs of a pool.
func (c *cluster) free(pool string) int {
	free := 0
	for _, n := range c.nodes {
		if n.pool == pool {
			free += n.free()
		}
	}
	return free
}

// gpus counts the GPUs of a pool.
func (c *cluster) gpus(pool string) int {
	total := 0
	for _, n := range c.nodes {
		if n.pool == pool {
			total += len(n.holder)
		}
	}
	return total
}

// sync hands every node's pods and their load to its simulator, for its next report.
func (c *cluster) sync() error {
	for _, n := range c.nodes {
		var pods []sim.Pod
		for i, h := range n.holder {
			if h == nil {
				continue
			}
			k := slices.IndexFunc(pods, func(p sim.Pod) bool { return p.Name == h.name && p.Namespace == h.namespace })
			if k < 0 {
				util := h.util
				pods = append(pods, sim.Pod{Namespace: h.namespace, Name: h.name, Labels: h.labels,
					OwnerKind: h.ownerKind, OwnerName: h.ownerName, Util: &util})
				k = len(pods) - 1
			}
			pods[k].GPUs = append(pods[k].GPUs, fmt.Sprint(i))
		}
		n.cfg.Pods = pods
		if err := n.sim.SetConfig(n.cfg); err != nil {
			return fmt.Errorf("node %s: %w", n.name, err)
		}
	}
	return nil
}
