// Package apipods is the scaler's view of the cluster's pods from the Kubernetes API:
// which node each is bound to, its uid and its labels, kept by one watch of every pod.
// The scaler believes a node's report only of the pods this places on that node, and
// matches podSelectors against the labels held here (scaler.PodDirectory). It reads
// pods through the dynamic client, so the binary links no Go types of the API groups,
// and each pod is reduced as it arrives to the few fields the scaler uses: the watch
// holds a few hundred bytes per pod, never a pod's spec (its env, args, images).
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

	"github.com/gpuscaler/gpuscaler/scaler"
)

// PodsResource is what the directory lists and watches: RBAC list and watch on pods,
// cluster-wide.
var PodsResource = schema.GroupVersionResource{Version: "v1", Resource: "pods"}

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
	informer cache.SharedIndexInformer
}

var _ scaler.PodDirectory = (*Directory)(nil)

// New makes a Directory of the pods read through client. It does nothing until Run.
func New(client dynamic.Interface, log *slog.Logger) *Directory {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	pods := client.Resource(PodsResource).Namespace(metav1.NamespaceAll)
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			return pods.List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			return pods.Watch(ctx, o)
		},
	}
	inf := cache.NewSharedIndexInformer(cache.ToListWatcherWithWatchListSemantics(lw, client),
		&unstructured.Unstructured{}, 0, cache.Indexers{})
	// Both must be set before the informer starts; they fail only after.
	_ = inf.SetTransform(slim)
	var once sync.Once
	_ = inf.SetWatchErrorHandlerWithContext(func(_ context.Context, _ *cache.Reflector, err error) {
		once.Do(func() {
			log.Warn("cannot list or watch pods in the Kubernetes API; until it can, podSelector and capacityAware triggers that read pods are Unavailable (RBAC: list and watch on pods, cluster-wide)", "err", err)
		})
	})
	return &Directory{informer: inf}
}

// Run follows the pods until ctx ends, then returns nil. Call it once.
func (d *Directory) Run(ctx context.Context) error {
	d.informer.RunWithContext(ctx)
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

// pod is what the directory keeps of a pod: its name, namespace, uid, labels and
// resource version (ObjectMeta, the rest left empty), and the node it is bound to.
type pod struct {
	metav1.TypeMeta
	metav1.ObjectMeta
	node string
}

// DeepCopyObject makes pod a runtime.Object, as an informer's store wants. Nothing
// changes a pod once made, so the copy shares its labels.
func (p *pod) DeepCopyObject() runtime.Object {
	c := *p
	return &c
}

// slim reduces an object the watch delivers to a pod; anything else (a tombstone of a
// deleted object) passes as it is.
func slim(obj any) (any, error) {
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return obj, nil
	}
	node, _, _ := unstructured.NestedString(u.Object, "spec", "nodeName")
	return &pod{
		TypeMeta: metav1.TypeMeta{APIVersion: u.GetAPIVersion(), Kind: u.GetKind()},
		ObjectMeta: metav1.ObjectMeta{
			Name: u.GetName(), Namespace: u.GetNamespace(), UID: u.GetUID(),
			ResourceVersion: u.GetResourceVersion(), Labels: u.GetLabels(),
		},
		node: node,
	}, nil
}
