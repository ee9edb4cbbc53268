package collectors

import (
	"context"
	"log/slog"
	"maps"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/metadata"
)

var nodesResource = schema.GroupVersionResource{Version: "v1", Resource: "nodes"}

// NodeLabels keeps this node's Kubernetes labels, read every refresh with a GET of the
// node's metadata (RBAC: get nodes). Capacity triggers' nodeSelector matches them. Without access
// it says so once and reports no labels. It is safe for concurrent use.
type NodeLabels struct {
	client  metadata.Interface
	node    string
	refresh time.Duration
	log     *slog.Logger

	mu     sync.Mutex // guards labels and warned
	labels map[string]string
	warned bool
}

// NewNodeLabels reads node's labels through client every refresh (default 5m) once Run.
func NewNodeLabels(client metadata.Interface, node string, refresh time.Duration, log *slog.Logger) *NodeLabels {
	if refresh <= 0 {
		refresh = 5 * time.Minute
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &NodeLabels{client: client, node: node, refresh: refresh, log: log}
}

// Run reads the labels now and every refresh until ctx ends.
func (n *NodeLabels) Run(ctx context.Context) error {
	tick := time.NewTicker(n.refresh)
	defer tick.Stop()
	for {
		n.read(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

func (n *NodeLabels) read(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	node, err := n.client.Resource(nodesResource).Get(ctx, n.node, metav1.GetOptions{})
	n.mu.Lock()
	defer n.mu.Unlock()
	if err != nil {
		if !n.warned && ctx.Err() == nil {
			n.warned = true
			n.log.Warn("cannot read this node's labels from the Kubernetes API; capacity triggers with a nodeSelector will not count its GPUs",
				"node", n.node, "err", err)
		}
		return
	}
	n.labels = node.GetLabels()
}

// Labels returns a copy of the labels last read, nil before any.
func (n *NodeLabels) Labels() map[string]string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return maps.Clone(n.labels)
}
