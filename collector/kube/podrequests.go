package kube

import (
	"context"
	"log/slog"
	"sync"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/tools/cache"

	"github.com/gpuscaler/gpuscaler/internal/kuberesources"
	gpuscalerv1 "github.com/gpuscaler/gpuscaler/proto/gpuscaler/v1"
)

// PodRequests follows the CPU and memory requests of the pods bound to this node that
// have not finished: what the scheduler's NodeResourcesFit filter counts as taken on
// the node. It watches them through the dynamic client (the metadata client that
// PodDirectory reads labels through carries no spec), with the field selector the
// scheduler's own pod informer uses, spec.nodeName=<node> and phase neither Succeeded
// nor Failed (kubernetes v1.36.4 pkg/scheduler/scheduler.go, newPodInformer); RBAC: list
// and watch pods, which the pod directory needs already. Each pod is reduced to its
// requests as it arrives, so the informer holds a few words per pod. Without access, or
// with a pod whose requests cannot be read, the requests are unknown, never a smaller
// sum. It is safe for concurrent use.
type PodRequests struct {
	node     string
	log      *slog.Logger
	informer cache.SharedIndexInformer

	mu     sync.Mutex // guards the fields below
	badPod bool       // a pod whose requests could not be read was logged
}

// NewPodRequests makes a PodRequests of node's pods, read through client. It does
// nothing until Run.
func NewPodRequests(client dynamic.Interface, node string, log *slog.Logger) *PodRequests {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	w := &PodRequests{node: node, log: log.With("node", node)}
	pods := client.Resource(PodsResource).Namespace(metav1.NamespaceAll)
	selector := fields.AndSelectors(
		fields.OneTermEqualSelector("spec.nodeName", node),
		fields.OneTermNotEqualSelector("status.phase", "Succeeded"),
		fields.OneTermNotEqualSelector("status.phase", "Failed"),
	).String()
	w.informer = fieldInformer(pods, client, selector, slimPodRequests, w.log,
		"cannot read this node's pods' requests from the Kubernetes API; capacity triggers with cpuPerReplica or memoryPerReplica count this node on its GPUs alone")
	return w
}

// Run follows the pods until ctx ends, then returns nil. Call it once.
func (w *PodRequests) Run(ctx context.Context) error {
	w.informer.RunWithContext(ctx)
	return nil
}

// Requested returns the sum of the CPU (millicores) and memory (bytes) requests of the
// node's pods that have not finished; ok is false while they are unknown: before the
// first list, or while a pod's requests cannot be read.
func (w *PodRequests) Requested() (cpuMillis, memoryBytes int64, ok bool) {
	if !w.informer.HasSynced() {
		return 0, 0, false
	}
	for _, obj := range w.informer.GetStore().List() {
		u, isU := obj.(*unstructured.Unstructured)
		if !isU {
			return 0, 0, false
		}
		// The API server's field selector leaves other nodes' and finished pods out;
		// checked again here for a server (or a fake) that does not.
		if node, _, _ := unstructured.NestedString(u.Object, "spec", "nodeName"); node != w.node {
			continue
		}
		if phase, _, _ := unstructured.NestedString(u.Object, "status", "phase"); phase == "Succeeded" || phase == "Failed" {
			continue
		}
		if bad, _, _ := unstructured.NestedString(u.Object, "requests", "error"); bad != "" {
			w.mu.Lock()
			if !w.badPod {
				w.badPod = true
				w.log.Warn("a pod's requests cannot be read; capacity triggers with cpuPerReplica or memoryPerReplica count this node on its GPUs alone while it runs",
					"pod", u.GetNamespace()+"/"+u.GetName(), "err", bad)
			}
			w.mu.Unlock()
			return 0, 0, false
		}
		c, _, _ := unstructured.NestedInt64(u.Object, "requests", "cpu")
		m, _, _ := unstructured.NestedInt64(u.Object, "requests", "memory")
		cpuMillis, memoryBytes = cpuMillis+c, memoryBytes+m
	}
	return cpuMillis, memoryBytes, true
}

// NodeResourcesOf combines a Node's allocatable CPU and memory (NodeWatch.Allocatable)
// and its pods' requests (PodRequests.Requested) into what a NodeReport carries, for
// Config.NodeResources: nil, unknown, unless both are known and within a report's bounds.
func NodeResourcesOf(allocatable, requested func() (cpuMillis, memoryBytes int64, ok bool)) func() *gpuscalerv1.NodeResources {
	return func() *gpuscalerv1.NodeResources {
		ac, am, ok := allocatable()
		if !ok {
			return nil
		}
		rc, rm, ok := requested()
		if !ok {
			return nil
		}
		for _, v := range [...]struct{ v, most int64 }{
			{ac, gpuscalerv1.MaxNodeCPUMillis}, {am, gpuscalerv1.MaxNodeMemoryBytes},
			{rc, gpuscalerv1.MaxNodeCPUMillis}, {rm, gpuscalerv1.MaxNodeMemoryBytes},
		} {
			if v.v < 0 || v.v > v.most {
				return nil
			}
		}
		return &gpuscalerv1.NodeResources{
			CpuAllocatableMillis: uint64(ac), MemoryAllocatableBytes: uint64(am),
			CpuRequestedMillis: uint64(rc), MemoryRequestedBytes: uint64(rm),
		}
	}
}

// slimPodRequests reduces a pod to its name, namespace, node, phase and requests
// ("requests": {"cpu": millicores, "memory": bytes}, or {"error": why}).
func slimPodRequests(obj any) (any, error) {
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return obj, nil
	}
	slim := &unstructured.Unstructured{Object: map[string]any{"apiVersion": u.GetAPIVersion(), "kind": u.GetKind()}}
	slim.SetName(u.GetName())
	slim.SetNamespace(u.GetNamespace())
	slim.SetResourceVersion(u.GetResourceVersion())
	node, _, _ := unstructured.NestedString(u.Object, "spec", "nodeName")
	phase, _, _ := unstructured.NestedString(u.Object, "status", "phase")
	slim.Object["spec"] = map[string]any{"nodeName": node}
	slim.Object["status"] = map[string]any{"phase": phase}
	cpu, mem, err := kuberesources.PodRequests(u)
	if err != nil {
		slim.Object["requests"] = map[string]any{"error": err.Error()}
	} else {
		slim.Object["requests"] = map[string]any{"cpu": cpu, "memory": mem}
	}
	return slim, nil
}
