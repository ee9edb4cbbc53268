package cluster

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// Kwok is kwok's controller, the kubelet of the suite's fake GPU nodes: it keeps them
// Ready and moves the pods the scheduler binds to them through the stages below. No
// container runs; a collector per node (gpuscaler collector --sim-from-cluster) hands
// out their GPUs as the kubelet would.
type Kwok struct {
	*Process
	kube kubernetes.Interface
}

// The kwok annotation that marks a node as kwok's (the convention kwokctl uses), and the
// taint that keeps every other pod of the suite off the fake nodes.
const (
	KwokNodeAnnotation = "kwok.x-k8s.io/node"
	KwokTaintKey       = "kwok.x-k8s.io/node"
)

// ModelLoadAnnotation on a pod sets how long it stays Running but not Ready, its model
// loading: a Go duration ("3s"); none is Ready at once.
const ModelLoadAnnotation = "e2e.gpuscaler.dev/model-load"

// podStages are the suite's pod stages: a pod bound to a fake node is Running at once,
// and Ready after its ModelLoadAnnotation. They follow kwok's own general stages
// (kustomize/stage/pod/general: pod-create, pod-ready), which go from Pending to Running
// and Ready in one step; a model server is Running, then Ready once its model is loaded.
var podStages = `apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: pod-running
spec:
  resourceRef: {apiGroup: v1, kind: Pod}
  selector:
    matchExpressions:
    - {key: '.metadata.deletionTimestamp', operator: DoesNotExist}
    - {key: '.status.podIP', operator: DoesNotExist}
  next:
    statusTemplate: |
      {{ $now := Now }}
      conditions:
      - {type: Initialized, status: "True", lastTransitionTime: {{ $now | Quote }}}
      - {type: Ready, status: "False", reason: ContainersNotReady, lastTransitionTime: {{ $now | Quote }}}
      - {type: ContainersReady, status: "False", reason: ContainersNotReady, lastTransitionTime: {{ $now | Quote }}}
      containerStatuses:
      {{ range .spec.containers }}
      - image: {{ .image | Quote }}
        name: {{ .name | Quote }}
        ready: false
        started: true
        restartCount: 0
        state: {running: {startedAt: {{ $now | Quote }}}}
      {{ end }}
      hostIP: {{ NodeIPWith .spec.nodeName | Quote }}
      podIP: {{ PodIPWith .spec.nodeName ( or .spec.hostNetwork false ) ( or .metadata.uid "" ) ( or .metadata.name "" ) ( or .metadata.namespace "" ) | Quote }}
      phase: Running
      startTime: {{ $now | Quote }}
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: pod-ready-after-model-load
spec:
  resourceRef: {apiGroup: v1, kind: Pod}
  selector:
    matchExpressions:
    - {key: '.metadata.deletionTimestamp', operator: DoesNotExist}
    - {key: '.status.phase', operator: In, values: ['Running']}
    - {key: '.status.conditions.[] | select( .type == "Ready" ) | .status', operator: In, values: ['False']}
  delay:
    durationMilliseconds: 0
    durationFrom:
      expressionFrom: '.metadata.annotations["` + ModelLoadAnnotation + `"]'
  next:
    statusTemplate: |
      {{ $now := Now }}
      conditions:
      - {type: Ready, status: "True", lastTransitionTime: {{ $now | Quote }}}
      - {type: ContainersReady, status: "True", lastTransitionTime: {{ $now | Quote }}}
      containerStatuses:
      {{ range .spec.containers }}
      - image: {{ .image | Quote }}
        name: {{ .name | Quote }}
        ready: true
        started: true
        restartCount: 0
        state: {running: {startedAt: {{ $now | Quote }}}}
      {{ end }}
`

// kwokStages are the files of kwok's own stages the suite uses as published, from its
// module: nodes initialised (Ready, keeping the allocatable the suite gives them) and
// heartbeating, a Job's pod completing once Ready (after
// pod-complete.stage.kwok.x-k8s.io/delay), and a deleted pod going at once.
var kwokStages = []string{
	"kustomize/stage/node/fast/node-initialize.yaml",
	"kustomize/stage/node/heartbeat/node-heartbeat.yaml",
	"kustomize/stage/pod/general/pod-complete.yaml",
	"kustomize/stage/pod/fast/pod-delete.yaml",
}

// StartKwok writes the stages and starts kwok managing the nodes annotated
// KwokNodeAnnotation=fake. moduleDir is sigs.k8s.io/kwok in the module cache.
func StartKwok(ctx context.Context, ps *Procs, cp *ControlPlane, bin, moduleDir, dir string) (*Kwok, error) {
	docs := []string{podStages}
	for _, f := range kwokStages {
		data, err := os.ReadFile(filepath.Join(moduleDir, f))
		if err != nil {
			return nil, fmt.Errorf("kwok's stage %s: %w", f, err)
		}
		docs = append(docs, string(data))
	}
	work := filepath.Join(dir, "kwok")
	config, err := writeFile(work, "stages.yaml", []byte(strings.Join(docs, "\n---\n")))
	if err != nil {
		return nil, err
	}
	kc, err := kubernetes.NewForConfig(cp.Config)
	if err != nil {
		return nil, err
	}
	k := &Kwok{kube: kc}
	k.Process, err = ps.Start("kwok", bin, []string{
		"--kubeconfig=" + cp.Kubeconfig,
		"--config=" + config,
		"--manage-nodes-with-annotation-selector=" + KwokNodeAnnotation + "=fake",
		"--cidr=10.244.0.0/16",
		"--node-ip=10.0.0.1",
		"--v=1",
	}, "KWOK_WORKDIR="+work) // and not ~/.kwok, whose kwok.yaml it would read too
	if err != nil {
		return nil, err
	}
	return k, nil
}

// GPUNode is a fake node's shape.
type GPUNode struct {
	Name   string
	GPUs   int
	Labels map[string]string
}

// AddNode creates a fake node with GPUs nvidia.com/gpu allocatable (and CPU, memory and
// pods to spare), its labels and the kwok taint, and waits until kwok has made it Ready
// and the node lifecycle controller has lifted the not-ready taint, so the scheduler
// places pods on it.
func (k *Kwok) AddNode(ctx context.Context, n GPUNode) error {
	res := corev1.ResourceList{
		corev1.ResourceCPU:    resource.MustParse("64"),
		corev1.ResourceMemory: resource.MustParse("512Gi"),
		corev1.ResourcePods:   resource.MustParse("110"),
		"nvidia.com/gpu":      *resource.NewQuantity(int64(n.GPUs), resource.DecimalSI),
	}
	labels := map[string]string{"type": "kwok", "kubernetes.io/hostname": n.Name}
	for key, v := range n.Labels {
		labels[key] = v
	}
	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: n.Name, Labels: labels, Annotations: map[string]string{KwokNodeAnnotation: "fake"}},
		Spec:       corev1.NodeSpec{Taints: []corev1.Taint{{Key: KwokTaintKey, Value: "fake", Effect: corev1.TaintEffectNoSchedule}}},
		// The API keeps a Node's status on create, and kwok's node-initialize keeps
		// the allocatable it finds.
		Status: corev1.NodeStatus{Capacity: res, Allocatable: res},
	}
	if _, err := k.kube.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create node %s: %w", n.Name, err)
	}
	return Eventually(ctx, 2*time.Minute, 100*time.Millisecond, "node "+n.Name+" Ready and schedulable", k.Process, func(ctx context.Context) (bool, error) {
		got, err := k.kube.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
		if err != nil {
			return false, Retry(err)
		}
		ready := false
		for _, c := range got.Status.Conditions {
			if c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue {
				ready = true
			}
		}
		if !ready {
			return false, Retry(fmt.Errorf("not Ready yet"))
		}
		for _, t := range got.Spec.Taints {
			if t.Key != KwokTaintKey {
				return false, Retry(fmt.Errorf("taint %s:%s", t.Key, t.Effect))
			}
		}
		return true, nil
	})
}

// Toleration lets a pod onto the fake nodes.
var Toleration = corev1.Toleration{Key: KwokTaintKey, Operator: corev1.TolerationOpEqual, Value: "fake", Effect: corev1.TaintEffectNoSchedule}
