// Package kuberesources reads the CPU and memory the Kubernetes scheduler weighs from
// objects as the API serves them (unstructured): a pod's requests, a Node's allocatable.
// The collector (of its own node) and the scaler (of every node, when it watches the API
// itself) count them the same way through it.
package kuberesources

import (
	"errors"
	"fmt"

	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	gpuscalerv1 "github.com/gpuscaler/gpuscaler/proto/gpuscaler/v1"
)

// NodeAllocatable reads a Node's status.allocatable cpu (millicores, rounded up) and
// memory (bytes); ok is false unless it gives both as quantities within a NodeReport's
// bounds, so that what it returns never makes a report invalid.
func NodeAllocatable(u *unstructured.Unstructured) (cpuMillis, memoryBytes int64, ok bool) {
	l, err := resourcesIn(u.Object, "status", "allocatable")
	if err != nil || l.cpu == nil || l.memory == nil ||
		*l.cpu > gpuscalerv1.MaxNodeCPUMillis || *l.memory > gpuscalerv1.MaxNodeMemoryBytes {
		return 0, 0, false
	}
	return *l.cpu, *l.memory, true
}

// errPodSpec reports a pod whose spec is not what Kubernetes serves.
var errPodSpec = errors.New("unexpected pod spec")

// cpuMem is a pod's CPU (millicores) and memory (bytes) requests.
type cpuMem struct{ cpu, memory int64 }

func (r *cpuMem) add(o cpuMem) { r.cpu, r.memory = r.cpu+o.cpu, r.memory+o.memory }
func (r *cpuMem) atLeast(o cpuMem) {
	r.cpu, r.memory = max(r.cpu, o.cpu), max(r.memory, o.memory)
}

// PodRequests computes a pod's CPU (millicores, rounded up as Quantity.MilliValue
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
func PodRequests(u *unstructured.Unstructured) (cpuMillis, memoryBytes int64, err error) {
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
	podLevel, err := resourcesIn(u.Object, "spec", "resources", "requests")
	if err != nil {
		return 0, 0, fmt.Errorf("spec.resources.requests: %w", err)
	}
	if podLevel.cpu != nil {
		total.cpu = *podLevel.cpu
	}
	if podLevel.memory != nil {
		total.memory = *podLevel.memory
	}
	overhead, err := resourcesIn(u.Object, "spec", "overhead")
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
	r, err := resourcesIn(m, "resources", "requests")
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

// resourcesIn reads the cpu and memory of the ResourceList at path in obj: quantities, as
// JSON carries them (strings), parsed by resource.ParseQuantity. Other resources are
// not read. A quantity that does not parse, or a negative one (which API validation
// refuses), is an error.
func resourcesIn(obj map[string]any, path ...string) (resourceList, error) {
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
