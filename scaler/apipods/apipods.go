// Package apipods is the scaler's view of the cluster's pods from the Kubernetes API:
// which node each is bound to, its uid, its labels and its CPU and memory requests, kept
// by one watch of every pod, and each Node's allocatable CPU and memory, kept by a watch
// of every Node. The scaler believes a node's report only of the pods this places on
// that node, matches podSelectors against the labels held here, and takes a node's CPU
// and memory from here rather than from the node (scaler.PodDirectory), so the
// collectors need not read pods at all. It reads through the dynamic client, so the
// binary links no Go types of the API groups, and each object is reduced as it arrives
// to the few fields the scaler uses: the watch holds a few hundred bytes per pod, never
// a pod's spec (its env, args, images).
package apipods

import (
	"context"
	"fmt"
	"log/slog"
	"sync"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/gpuscaler/gpuscaler/internal/kuberesources"
	gpuscalerv1 "github.com/gpuscaler/gpuscaler/proto/gpuscaler/v1"
	"github.com/gpuscaler/gpuscaler/scaler"
)

// PodsResource and NodesResource are what the directory lists and watches: RBAC list and
// watch on pods and nodes, cluster-wide.
var (
	PodsResource  = schema.GroupVersionResource{Version: "v1", Resource: "pods"}
	NodesResource = schema.GroupVersionResource{Version: "v1", Resource: "nodes"}
)

// InCluster is the kubeconfig that means the pod's own service account.
const InCluster = "in-cluster"

// NewClient returns a dynamic client for the Kubernetes API: from the pod's service
// account when kubeconfig is InCluster, else from the kubeconfig file.
func NewClient(kubeconfig string) (dynamic.Interface, error) {
	var (
		cfg *rest.Config
		err error
	)
	if kubeconfig == InCluster {
		if cfg, err = rest.InClusterConfig(); err != nil {
			return nil, fmt.Errorf("kubernetes in-cluster config (outside a pod, pass a kubeconfig file): %w", err)
		}
	} else if cfg, err = clientcmd.BuildConfigFromFlags("", kubeconfig); err != nil {
		return nil, fmt.Errorf("kubeconfig %s: %w", kubeconfig, err)
	}
	cfg.UserAgent = "gpuscaler-scaler"
	client, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client for %s: %w", cfg.Host, err)
	}
	return client, nil
}

// Directory is a scaler.PodDirectory of every pod in the cluster, kept by a client-go
// informer. Until its first list it knows no pod and says it has not synced; without
// access it keeps trying, and says so once in the log. Its methods are safe for
// concurrent use and never wait on the network.
type Directory struct {
	informer cache.SharedIndexInformer // pods, indexed by node
	nodes    cache.SharedIndexInformer
}

// byNode indexes pods by the node they are bound to.
const byNode = "node"

var _ scaler.PodDirectory = (*Directory)(nil)

// New makes a Directory of the pods and Nodes read through client. It does nothing
// until Run.
func New(client dynamic.Interface, log *slog.Logger) *Directory {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	pods := watchAll(client, PodsResource, slimPod, log,
		"cannot list or watch pods in the Kubernetes API; until it can, podSelector and capacityAware triggers that read pods are Unavailable (RBAC: list and watch on pods, cluster-wide)")
	_ = pods.AddIndexers(cache.Indexers{byNode: func(obj any) ([]string, error) {
		if p, ok := obj.(*pod); ok && p.node != "" {
			return []string{p.node}, nil
		}
		return nil, nil
	}})
	nodes := watchAll(client, NodesResource, slimNode, log,
		"cannot list or watch Nodes in the Kubernetes API; until it can, each node's CPU and memory are what its collector reports, if anything (RBAC: list and watch on nodes)")
	return &Directory{informer: pods, nodes: nodes}
}

// watchAll is an informer of every object of resource r, each passed through slim as it
// arrives. The first error of its list or watch (no access, mostly) is logged once, with
// warning; it keeps trying.
func watchAll(client dynamic.Interface, r schema.GroupVersionResource, slim cache.TransformFunc, log *slog.Logger, warning string) cache.SharedIndexInformer {
	objs := client.Resource(r).Namespace(metav1.NamespaceAll)
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			return objs.List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			return objs.Watch(ctx, o)
		},
	}
	inf := cache.NewSharedIndexInformer(cache.ToListWatcherWithWatchListSemantics(lw, client),
		&unstructured.Unstructured{}, 0, cache.Indexers{})
	// Both must be set before the informer starts; they fail only after.
	_ = inf.SetTransform(slim)
	var once sync.Once
	_ = inf.SetWatchErrorHandlerWithContext(func(_ context.Context, _ *cache.Reflector, err error) {
		once.Do(func() { log.Warn(warning, "err", err) })
	})
	return inf
}

// Run follows the pods until ctx ends, then returns nil. Call it once.
func (d *Directory) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	wg.Go(func() { d.nodes.RunWithContext(ctx) })
	d.informer.RunWithContext(ctx)
	wg.Wait()
	return nil
}

// Synced reports whether every pod has been listed once.
func (d *Directory) Synced() bool { return d.informer.HasSynced() }

// Pod returns what the API holds of pod namespace/name.
func (d *Directory) Pod(namespace, name string) (scaler.APIPod, bool) {
	obj, ok, err := d.informer.GetIndexer().GetByKey(namespace + "/" + name)
	if err != nil || !ok {
		return scaler.APIPod{}, false
	}
	p, ok := obj.(*pod)
	if !ok {
		return scaler.APIPod{}, false
	}
	return scaler.APIPod{UID: string(p.UID), Node: p.node, Labels: p.Labels}, true
}

// NodeResources returns what the scheduler weighs a new pod's CPU and memory requests
// against on node: its Node's allocatable, and the requests of its pods that have not
// finished. False while either is unknown: before the first lists, without a Node or
// its allocatable, or while one of its pods' requests cannot be read.
func (d *Directory) NodeResources(node string) (*gpuscalerv1.NodeResources, bool) {
	if !d.informer.HasSynced() || !d.nodes.HasSynced() {
		return nil, false
	}
	obj, ok, err := d.nodes.GetIndexer().GetByKey(node)
	if err != nil || !ok {
		return nil, false
	}
	n, ok := obj.(*nodeObj)
	if !ok || !n.known {
		return nil, false
	}
	pods, err := d.informer.GetIndexer().ByIndex(byNode, node)
	if err != nil {
		return nil, false
	}
	var cpu, mem int64
	for _, obj := range pods {
		p, ok := obj.(*pod)
		switch {
		case !ok || p.badRequests:
			return nil, false
		case p.finished:
			continue
		}
		cpu, mem = cpu+p.cpu, mem+p.memory
	}
	if cpu > gpuscalerv1.MaxNodeCPUMillis || mem > gpuscalerv1.MaxNodeMemoryBytes {
		return nil, false
	}
	return &gpuscalerv1.NodeResources{
		CpuAllocatableMillis: uint64(n.cpu), MemoryAllocatableBytes: uint64(n.memory),
		CpuRequestedMillis: uint64(cpu), MemoryRequestedBytes: uint64(mem),
	}, true
}

// pod is what the directory keeps of a pod: its name, namespace, uid, labels and
// resource version (ObjectMeta, the rest left empty), the node it is bound to, and its
// requests as the scheduler counts them (kuberesources.PodRequests).
type pod struct {
	metav1.TypeMeta
	metav1.ObjectMeta
	node        string
	cpu, memory int64
	// badRequests: the pod's requests could not be read; finished: its phase is
	// Succeeded or Failed, and the scheduler no longer counts them.
	badRequests, finished bool
}

// DeepCopyObject makes pod a runtime.Object, as an informer's store wants. Nothing
// changes a pod once made, so the copy shares its labels.
func (p *pod) DeepCopyObject() runtime.Object {
	c := *p
	return &c
}

// slimPod reduces an object the pod watch delivers to a pod; anything else (a tombstone
// of a deleted object) passes as it is.
func slimPod(obj any) (any, error) {
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return obj, nil
	}
	node, _, _ := unstructured.NestedString(u.Object, "spec", "nodeName")
	phase, _, _ := unstructured.NestedString(u.Object, "status", "phase")
	p := &pod{
		TypeMeta: metav1.TypeMeta{APIVersion: u.GetAPIVersion(), Kind: u.GetKind()},
		ObjectMeta: metav1.ObjectMeta{
			Name: u.GetName(), Namespace: u.GetNamespace(), UID: u.GetUID(),
			ResourceVersion: u.GetResourceVersion(), Labels: u.GetLabels(),
		},
		node:     node,
		finished: phase == "Succeeded" || phase == "Failed",
	}
	var err error
	if p.cpu, p.memory, err = kuberesources.PodRequests(u); err != nil {
		p.badRequests = true
	}
	return p, nil
}

// nodeObj is what the directory keeps of a Node: its name and allocatable CPU
// (millicores) and memory (bytes), known when the Node gives both.
type nodeObj struct {
	metav1.TypeMeta
	metav1.ObjectMeta
	cpu, memory int64
	known       bool
}

// DeepCopyObject makes nodeObj a runtime.Object; nothing changes one once made.
func (n *nodeObj) DeepCopyObject() runtime.Object {
	c := *n
	return &c
}

// slimNode reduces an object the Node watch delivers to a nodeObj; anything else passes
// as it is.
func slimNode(obj any) (any, error) {
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return obj, nil
	}
	n := &nodeObj{
		TypeMeta:   metav1.TypeMeta{APIVersion: u.GetAPIVersion(), Kind: u.GetKind()},
		ObjectMeta: metav1.ObjectMeta{Name: u.GetName(), UID: u.GetUID(), ResourceVersion: u.GetResourceVersion()},
	}
	n.cpu, n.memory, n.known = kuberesources.NodeAllocatable(u)
	return n, nil
}
