package kube

import (
	"context"
	"log/slog"
	"sync"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/tools/cache"
)

// fieldInformer is an informer of the objects of resource r that selector (a field
// selector) picks, through the dynamic client, each object passed through transform as
// it arrives. The first error of its list or watch (no access, mostly) is logged once,
// with warning; the informer keeps trying.
func fieldInformer(r dynamic.ResourceInterface, client dynamic.Interface, selector string, transform cache.TransformFunc, log *slog.Logger, warning string) cache.SharedIndexInformer {
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.FieldSelector = selector
			return r.List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.FieldSelector = selector
			return r.Watch(ctx, o)
		},
	}
	// As client-go's own informers do: the reflector streams its initial list
	// (WatchListClient) only from a client that can.
	inf := cache.NewSharedIndexInformer(cache.ToListWatcherWithWatchListSemantics(lw, client),
		&unstructured.Unstructured{}, 0, cache.Indexers{})
	// Both must be set before the informer starts; they fail only after.
	_ = inf.SetTransform(transform)
	var once sync.Once
	_ = inf.SetWatchErrorHandlerWithContext(func(_ context.Context, _ *cache.Reflector, err error) {
		once.Do(func() { log.Warn(warning, "err", err) })
	})
	return inf
}
