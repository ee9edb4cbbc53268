package kube

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"sync"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/tools/cache"

	"github.com/gpuscaler/gpuscaler/internal/kuberesources"
	gpuscalerv1 "github.com/gpuscaler/gpuscaler/proto/gpuscaler/v1"
)

var nodesResource = schema.GroupVersionResource{Version: "v1", Resource: "nodes"}

// NodeWatch follows this node's Node object, through a watch of it alone (the field
// selector metadata.name=<node>; RBAC: list and watch nodes): its labels, which capacity
// triggers' nodeSelector matches, and whether the scheduler places new pods on it (its
// cordon and NoSchedule/NoExecute taints), which capacity counts. A watch, not a poll:
// a drained node must leave capacity within a report, not minutes later. It keeps only
// those fields of the Node. Without access it says so once and reports neither: labels
// empty, scheduling unknown. It is safe for concurrent use.
type NodeWatch struct {
	node     string
	log      *slog.Logger
	informer cache.SharedIndexInformer

	mu         sync.Mutex // guards the fields below
	labels     map[string]string
	scheduling *gpuscalerv1.NodeScheduling // nil: unknown
	// allocatable is the Node's status.allocatable cpu (millicores) and memory (bytes);
	// nil when unknown.
	allocatable *[2]int64
	specWarned  bool // a spec that could not be read was logged
}

// NewNodeWatch makes a NodeWatch of node, read through client. It does nothing until Run.
func NewNodeWatch(client dynamic.Interface, node string, log *slog.Logger) *NodeWatch {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	n := &NodeWatch{node: node, log: log.With("node", node)}
	selector := fields.OneTermEqualSelector("metadata.name", node).String()
	n.informer = fieldInformer(client.Resource(nodesResource), client, selector, slimNode, n.log,
		"cannot read this node from the Kubernetes API; capacity triggers with a nodeSelector will not count its GPUs, and count them whether or not it is cordoned or tainted")
	return n
}

// Run follows the Node until ctx ends, then returns nil. Call it once.
func (n *NodeWatch) Run(ctx context.Context) error {
	seen := func(obj any) {
		u, ok := obj.(*unstructured.Unstructured)
		if !ok || u.GetName() != n.node {
			return
		}
		s, err := parseNodeScheduling(u)
		n.mu.Lock()
		defer n.mu.Unlock()
		n.labels = u.GetLabels()
		if err != nil && !n.specWarned {
			n.specWarned = true
			n.log.Warn("this node's spec does not say plainly whether the scheduler places pods on it; capacity counts its GPUs as it did without it", "err", err)
		}
		n.scheduling = s
		n.allocatable = parseNodeAllocatable(u)
	}
	if _, err := n.informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    seen,
		UpdateFunc: func(_, obj any) { seen(obj) },
		// A deleted Node takes no pod (the scheduler places only on Nodes it lists):
		// reported as cordoned, not as unknown, which capacity counts as placeable.
		DeleteFunc: func(any) {
			n.mu.Lock()
			defer n.mu.Unlock()
			n.labels, n.allocatable = nil, nil
			n.scheduling = &gpuscalerv1.NodeScheduling{Unschedulable: true}
		},
	}); err != nil {
		return fmt.Errorf("node watch: %w", err)
	}
	n.informer.RunWithContext(ctx)
	return nil
}

// Labels returns a copy of the node's labels, nil before they are read.
func (n *NodeWatch) Labels() map[string]string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return maps.Clone(n.labels)
}

// Scheduling returns whether the scheduler places pods on the node, nil when unknown
// (not yet read, or unreadable). The result is not changed afterwards: callers must not
// change it either.
func (n *NodeWatch) Scheduling() *gpuscalerv1.NodeScheduling {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.scheduling
}

// Allocatable returns the Node's status.allocatable cpu (millicores) and memory (bytes),
// what the scheduler weighs pods' requests against; ok is false when unknown (not yet
// read, unreadable, or not given).
func (n *NodeWatch) Allocatable() (cpuMillis, memoryBytes int64, ok bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.allocatable == nil {
		return 0, 0, false
	}
	return n.allocatable[0], n.allocatable[1], true
}

// slimNode keeps of a Node its name, labels, spec.unschedulable and spec.taints, and
// status.allocatable's cpu and memory: the rest of a Node's status (images, conditions,
// addresses) is most of its size, and the informer would hold it all.
func slimNode(obj any) (any, error) {
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return obj, nil
	}
	slim := &unstructured.Unstructured{Object: map[string]any{"apiVersion": u.GetAPIVersion(), "kind": u.GetKind()}}
	slim.SetName(u.GetName())
	slim.SetResourceVersion(u.GetResourceVersion())
	slim.SetLabels(u.GetLabels())
	if spec, ok := u.Object["spec"].(map[string]any); ok {
		keep := map[string]any{}
		for _, k := range []string{"unschedulable", "taints"} {
			if v, ok := spec[k]; ok {
				keep[k] = v
			}
		}
		slim.Object["spec"] = keep
	}
	if alloc, ok, _ := unstructured.NestedMap(u.Object, "status", "allocatable"); ok {
		keep := map[string]any{}
		for _, k := range []string{"cpu", "memory"} {
			if v, ok := alloc[k]; ok {
				keep[k] = v
			}
		}
		slim.Object["status"] = map[string]any{"allocatable": keep}
	}
	return slim, nil
}

// parseNodeAllocatable reads a Node's status.allocatable cpu and memory
// (kuberesources.NodeAllocatable): nil unless both are known and within a report's bounds.
func parseNodeAllocatable(u *unstructured.Unstructured) *[2]int64 {
	cpu, mem, ok := kuberesources.NodeAllocatable(u)
	if !ok {
		return nil
	}
	return &[2]int64{cpu, mem}
}

// errNodeSpec reports a Node whose spec is not what Kubernetes serves.
var errNodeSpec = errors.New("unexpected node spec")

// parseNodeScheduling reads what of a Node decides whether the scheduler places new pods
// on it: spec.unschedulable, and the taints of effect NoSchedule or NoExecute (the
// TaintToleration filter's, kubernetes pkg/scheduler/framework/plugins/tainttoleration;
// PreferNoSchedule keeps no pod off). What it returns passes the NodeReport's
// validation; a spec that would not (which Kubernetes' own validation rules out) is an
// error, and the node's scheduling unknown, never a node without the taint.
func parseNodeScheduling(u *unstructured.Unstructured) (*gpuscalerv1.NodeScheduling, error) {
	s := &gpuscalerv1.NodeScheduling{}
	unschedulable, _, err := unstructured.NestedBool(u.Object, "spec", "unschedulable")
	if err != nil {
		return nil, fmt.Errorf("%w: spec.unschedulable: %w", errNodeSpec, err)
	}
	s.Unschedulable = unschedulable
	taints, _, err := unstructured.NestedSlice(u.Object, "spec", "taints")
	if err != nil {
		return nil, fmt.Errorf("%w: spec.taints: %w", errNodeSpec, err)
	}
	for i, t := range taints {
		m, ok := t.(map[string]any)
		if !ok {
			return nil, fmt.Errorf("%w: spec.taints[%d] is a %T", errNodeSpec, i, t)
		}
		var field [3]string
		for j, name := range []string{"key", "value", "effect"} {
			v, _, err := unstructured.NestedString(m, name)
			if err != nil {
				return nil, fmt.Errorf("%w: spec.taints[%d].%s: %w", errNodeSpec, i, name, err)
			}
			field[j] = v
		}
		if field[2] == "PreferNoSchedule" {
			continue
		}
		s.Taints = append(s.Taints, &gpuscalerv1.Taint{Key: field[0], Value: field[1], Effect: field[2]})
	}
	if err := (&gpuscalerv1.NodeReport{Node: "node", Scheduling: s}).Validate(); err != nil {
		return nil, fmt.Errorf("%w: %w", errNodeSpec, err)
	}
	return s, nil
}
