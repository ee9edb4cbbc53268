// Package kuberesourcestest builds pods as the API server serves them, for the tests of
// what the scheduler counts of them (internal/kuberesources) and of the parts that watch
// them.
package kuberesourcestest

import "k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

// Container is a container of a test pod requesting cpu and memory (either may be
// empty: not requested); always makes it a restartable init container (a sidecar).
func Container(name, cpu, memory string, always bool) map[string]any {
	req := map[string]any{}
	if cpu != "" {
		req["cpu"] = cpu
	}
	if memory != "" {
		req["memory"] = memory
	}
	c := map[string]any{"name": name, "image": "x", "resources": map[string]any{"requests": req, "limits": map[string]any{"nvidia.com/gpu": "1"}}}
	if always {
		c["restartPolicy"] = "Always"
	}
	return c
}

// Pod is a pod as the API server serves it, bound to node, in phase.
func Pod(name, node, phase string, containers, inits []map[string]any, spec map[string]any) *unstructured.Unstructured {
	list := func(cs []map[string]any) []any {
		out := make([]any, len(cs))
		for i, c := range cs {
			out[i] = c
		}
		return out
	}
	s := map[string]any{"nodeName": node, "containers": list(containers)}
	if len(inits) > 0 {
		s["initContainers"] = list(inits)
	}
	for k, v := range spec {
		s[k] = v
	}
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "v1", "kind": "Pod",
		"metadata": map[string]any{"name": name, "namespace": "ml"},
		"spec":     s,
		"status":   map[string]any{"phase": phase},
	}}
}
