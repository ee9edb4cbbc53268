package kube

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/tools/cache"

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
	cpu, mem, err := podRequestsOf(u)
	if err != nil {
		slim.Object["requests"] = map[string]any{"error": err.Error()}
	} else {
		slim.Object["requests"] = map[string]any{"cpu": cpu, "memory": mem}
	}
	return slim, nil
}

// errPodSpec reports a pod whose spec is not what Kubernetes serves.
var errPodSpec = errors.New("unexpected pod spec")

// cpuMem is a pod's CPU (millicores) and memory (bytes) requests.
type cpuMem struct{ cpu, memory int64 }

func (r *cpuMem) add(o cpuMem) { r.cpu, r.memory = r.cpu+o.cpu, r.memory+o.memory }
func (r *cpuMem) atLeast(o cpuMem) {
	r.cpu, r.memory = max(r.cpu, o.cpu), max(r.memory, o.memory)
}

// podRequestsOf computes a pod's CPU (millicores, rounded up as Quantity.MilliValue
// rounds) and memory (bytes) requests as the scheduler does (k8s.io/component-helpers
// v0.36.4 resource/helpers.go, PodRequests and AggregateContainerRequests, called by
// kubernetes v1.36.4 pkg/scheduler/framework/types.go):
//   - the app containers' requests add up, and so do those of the restartable init
//     containers (restartPolicy Always: sidecars, which run beside them);
//   - each other init container runs alone beside the sidecars started before it: the
//     pod asks at least its request plus theirs;
//   - spec.resources.requests, where it gives cpu or memory (pod-level resources), takes
//     the place of the containers' figure for that resource;
//   - spec.overhead (the RuntimeClass's) adds to the whole.
//
// What it leaves out: during an in-place resize the scheduler takes the larger of the
// spec and what the kubelet allocated (UseStatusResources); here the spec alone counts.
func podRequestsOf(u *unstructured.Unstructured) (cpuMillis, memoryBytes int64, err error) {
	var apps, sidecars, inits cpuMem
	containers, _, err := unstructured.NestedSlice(u.Object, "spec", "containers")
	if err != nil {
		return 0, 0, fmt.Errorf("%w: spec.containers: %w", errPodSpec, err)
	}
	for i, c := range containers {
		r, _, err := containerRequests(c)
		if err != nil {
			return 0, 0, fmt.Errorf("spec.containers[%d]: %w", i, err)
		}
		apps.add(r)
	}
	initContainers, _, err := unstructured.NestedSlice(u.Object, "spec", "initContainers")
	if err != nil {
		return 0, 0, fmt.Errorf("%w: spec.initContainers: %w", errPodSpec, err)
	}
	for i, c := range initContainers {
		r, always, err := containerRequests(c)
		if err != nil {
			return 0, 0, fmt.Errorf("spec.initContainers[%d]: %w", i, err)
		}
		if always {
			sidecars.add(r)
			inits.atLeast(sidecars)
			continue
		}
		r.add(sidecars)
		inits.atLeast(r)
	}
	total := apps
	total.add(sidecars)
	total.atLeast(inits)
	podLevel, err := requestsIn(u.Object, "spec", "resources", "requests")
	if err != nil {
		return 0, 0, fmt.Errorf("spec.resources.requests: %w", err)
	}
	if podLevel.cpu != nil {
		total.cpu = *podLevel.cpu
	}
	if podLevel.memory != nil {
		total.memory = *podLevel.memory
	}
	overhead, err := requestsIn(u.Object, "spec", "overhead")
	if err != nil {
		return 0, 0, fmt.Errorf("spec.overhead: %w", err)
	}
	total.add(overhead.values())
	return total.cpu, total.memory, nil
}

// containerRequests returns a container's CPU and memory requests, and whether it is a
// restartable init container (restartPolicy Always).
func containerRequests(c any) (cpuMem, bool, error) {
	m, ok := c.(map[string]any)
	if !ok {
		return cpuMem{}, false, fmt.Errorf("%w: a %T, not a container", errPodSpec, c)
	}
	policy, _, err := unstructured.NestedString(m, "restartPolicy")
	if err != nil {
		return cpuMem{}, false, fmt.Errorf("%w: restartPolicy: %w", errPodSpec, err)
	}
	r, err := requestsIn(m, "resources", "requests")
	if err != nil {
		return cpuMem{}, false, fmt.Errorf("resources.requests: %w", err)
	}
	return r.values(), policy == "Always", nil
}

// resourceList is the cpu and memory of a ResourceList, nil where it gives none.
type resourceList struct{ cpu, memory *int64 }

func (l resourceList) values() cpuMem {
	var r cpuMem
	if l.cpu != nil {
		r.cpu = *l.cpu
	}
	if l.memory != nil {
		r.memory = *l.memory
	}
	return r
}

// requestsIn reads the cpu and memory of the ResourceList at path in obj: quantities, as
// JSON carries them (strings), parsed by resource.ParseQuantity. Other resources are
// not read. A quantity that does not parse, or a negative one (which API validation
// refuses), is an error.
func requestsIn(obj map[string]any, path ...string) (resourceList, error) {
	list, found, err := unstructured.NestedMap(obj, path...)
	if err != nil {
		return resourceList{}, fmt.Errorf("%w: %w", errPodSpec, err)
	}
	var l resourceList
	if !found {
		return l, nil
	}
	for name, dst := range map[string]**int64{"cpu": &l.cpu, "memory": &l.memory} {
		v, ok := list[name]
		if !ok {
			continue
		}
		s, ok := v.(string)
		if !ok {
			return resourceList{}, fmt.Errorf("%w: %s is a %T", errPodSpec, name, v)
		}
		q, err := resource.ParseQuantity(s)
		if err != nil || q.Sign() < 0 {
			return resourceList{}, fmt.Errorf("%w: %s %q is not a quantity", errPodSpec, name, s)
		}
		n := q.Value()
		if name == "cpu" {
			n = q.MilliValue()
		}
		*dst = &n
	}
	return l, nil
}
