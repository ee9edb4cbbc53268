package gateway

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/tools/cache"
)

// EndpointSlicesResource is the resource the gateway watches: discovery.k8s.io/v1
// EndpointSlices, read through the dynamic client. client-go's typed clientset and
// informers would link every API group's types into the one gpuscaler binary, the node
// collector's included (collectors' TestBinaryLinksNoTypedClient).
var EndpointSlicesResource = schema.GroupVersionResource{Group: "discovery.k8s.io", Version: "v1", Resource: "endpointslices"}

// labelServiceName is the label an EndpointSlice names its Service by
// (discoveryv1.LabelServiceName).
const labelServiceName = "kubernetes.io/service-name"

// byService indexes the slices by the Service they belong to.
const byService = "service"

// endpointSlice is what the gateway reads of a discovery.k8s.io/v1 EndpointSlice
// (k8s.io/api/discovery/v1 types.go, the same JSON names).
type endpointSlice struct {
	Endpoints []sliceEndpoint `json:"endpoints"`
	Ports     []struct {
		Port     *int32  `json:"port"`
		Protocol *string `json:"protocol"`
	} `json:"ports"`
}

// sliceWatcher follows the EndpointSlices of one namespace and says which endpoints of
// a Service port are ready.
type sliceWatcher struct {
	informer cache.SharedIndexInformer
}

// newSliceWatcher watches namespace ns's EndpointSlices through client, calling
// onChange with the Service name of every slice added, changed or deleted, and whether
// it is one of the slices' first read (the informer's initial list).
func newSliceWatcher(client dynamic.Interface, ns string, onChange func(service string, initial bool)) (*sliceWatcher, error) {
	res := client.Resource(EndpointSlicesResource).Namespace(ns)
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
			return res.List(ctx, opts)
		},
		WatchFuncWithContext: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
			return res.Watch(ctx, opts)
		},
	}
	// With the client's word on whether it serves watch-list streams (client-go's fakes
	// do not), so the reflector does not wait for one that never comes.
	informer := cache.NewSharedIndexInformer(cache.ToListWatcherWithWatchListSemantics(lw, client), &unstructured.Unstructured{}, 0, cache.Indexers{
		byService: func(obj any) ([]string, error) {
			if u, ok := obj.(*unstructured.Unstructured); ok {
				if name := u.GetLabels()[labelServiceName]; name != "" {
					return []string{name}, nil
				}
			}
			return nil, nil
		},
	})
	changed := func(obj any, initial bool) {
		if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = d.Obj
		}
		if u, ok := obj.(*unstructured.Unstructured); ok {
			if name := u.GetLabels()[labelServiceName]; name != "" {
				onChange(name, initial)
			}
		}
	}
	if _, err := informer.AddEventHandler(cache.ResourceEventHandlerDetailedFuncs{
		AddFunc:    changed,
		UpdateFunc: func(_, obj any) { changed(obj, false) },
		DeleteFunc: func(obj any) { changed(obj, false) },
	}); err != nil {
		return nil, err
	}
	return &sliceWatcher{informer: informer}, nil
}

// run follows the slices until ctx ends.
func (w *sliceWatcher) run(ctx context.Context) { w.informer.RunWithContext(ctx) }

func (w *sliceWatcher) synced() bool { return w.informer.HasSynced() }

// endpoints returns the ready addresses (ip:port) of Service service's port, and
// whether the Service has no EndpointSlice at all.
//
// A slice lists target ports, not the Service's ports, and this watcher does not read
// Services: a slice port matches when its number is the route's port, or when it is
// the slice's only port (a one-port Service whose targetPort differs).
func (w *sliceWatcher) endpoints(service string, port int) (addrs []string, noSlices bool) {
	noSlices = w.each(service, port, func(e *sliceEndpoint, target int) {
		if e.ready() {
			addrs = append(addrs, net.JoinHostPort(e.Addresses[0], strconv.Itoa(target)))
		}
	})
	slices.Sort(addrs)
	return slices.Compact(addrs), noSlices
}

// states returns every endpoint of Service service's port, ready or not, for the cold
// start measurement (see coldStarts); one per pod.
func (w *sliceWatcher) states(service string, port int) []endpointState {
	var out []endpointState
	w.each(service, port, func(e *sliceEndpoint, _ int) {
		key := e.Addresses[0]
		if e.TargetRef != nil && e.TargetRef.UID != "" {
			key = e.TargetRef.UID
		}
		out = append(out, endpointState{key: key, ready: e.ready()})
	})
	return out
}

// each calls f with every endpoint that has an address on Service service's port (see
// endpoints), and the target port it matched; it reports whether the Service has no
// EndpointSlice at all.
func (w *sliceWatcher) each(service string, port int, f func(e *sliceEndpoint, target int)) (noSlices bool) {
	objs, err := w.informer.GetIndexer().ByIndex(byService, service)
	if err != nil || len(objs) == 0 {
		return true
	}
	for _, obj := range objs {
		s, err := decodeSlice(obj)
		if err != nil {
			continue // the API server validated it; a slice that does not decode offers nothing
		}
		target := -1
		for _, p := range s.Ports {
			if p.Port == nil || (p.Protocol != nil && *p.Protocol != "TCP") {
				continue
			}
			if int(*p.Port) == port || len(s.Ports) == 1 {
				target = int(*p.Port)
				break
			}
		}
		if target < 0 {
			continue
		}
		for i := range s.Endpoints {
			if e := &s.Endpoints[i]; len(e.Addresses) > 0 {
				f(e, target)
			}
		}
	}
	return false
}

// sliceEndpoint is one endpoint of an EndpointSlice: its addresses, its ready
// condition, and the pod it stands for (targetRef).
type sliceEndpoint struct {
	Addresses  []string `json:"addresses"`
	Conditions struct {
		Ready *bool `json:"ready"`
	} `json:"conditions"`
	TargetRef *struct {
		UID string `json:"uid"`
	} `json:"targetRef"`
}

// ready reports whether the endpoint takes requests. A nil ready is an unknown state,
// which consumers should read as ready (k8s.io/api/discovery/v1
// EndpointConditions.Ready).
func (e *sliceEndpoint) ready() bool {
	return e.Conditions.Ready == nil || *e.Conditions.Ready
}

// decodeSlice reads what the gateway needs of an EndpointSlice the informer holds.
func decodeSlice(obj any) (*endpointSlice, error) {
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return nil, fmt.Errorf("an EndpointSlice of type %T", obj)
	}
	s := new(endpointSlice)
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.UnstructuredContent(), s); err != nil {
		return nil, err
	}
	return s, nil
}

// probeURL follows a URL backend's readiness until s's context ends: GET healthURL
// answering 2xx means ready. It probes every heldEvery while s holds requests (at once
// when one starts being held), and every idleEvery otherwise.
func probeURL(s *routeState, client *http.Client, healthURL, host string, heldEvery, idleEvery time.Duration) {
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-timer.C:
		case <-s.wake:
		}
		var eps []string
		if probe(s.ctx, client, healthURL, max(heldEvery, time.Second)) {
			eps = []string{host}
		}
		s.setEndpoints(eps, false)
		every := idleEvery
		if s.heldNow() > 0 {
			every = heldEvery
		}
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
		timer.Reset(every)
	}
}

// probe reports whether GET url answers 2xx within timeout.
func probe(ctx context.Context, client *http.Client, url string, timeout time.Duration) bool {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return false
	}
	resp, err := client.Do(req)
	if err != nil {
		return false
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	return resp.StatusCode >= 200 && resp.StatusCode < 300
}
