package gateway

import (
	"context"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	discoverylisters "k8s.io/client-go/listers/discovery/v1"
	"k8s.io/client-go/tools/cache"
)

// sliceWatcher follows the EndpointSlices of one namespace and says which endpoints of
// a Service port are ready.
type sliceWatcher struct {
	factory  informers.SharedInformerFactory
	informer cache.SharedIndexInformer
	lister   discoverylisters.EndpointSliceLister
	ns       string
}

// newSliceWatcher watches namespace ns's EndpointSlices through client, calling
// onChange with the Service name of every slice added, changed or deleted.
func newSliceWatcher(client kubernetes.Interface, ns string, onChange func(service string)) (*sliceWatcher, error) {
	factory := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithNamespace(ns))
	si := factory.Discovery().V1().EndpointSlices()
	w := &sliceWatcher{factory: factory, informer: si.Informer(), lister: si.Lister(), ns: ns}
	changed := func(obj any) {
		if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = d.Obj
		}
		if s, ok := obj.(*discoveryv1.EndpointSlice); ok {
			if name := s.Labels[discoveryv1.LabelServiceName]; name != "" {
				onChange(name)
			}
		}
	}
	_, err := w.informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    changed,
		UpdateFunc: func(_, obj any) { changed(obj) },
		DeleteFunc: changed,
	})
	return w, err
}

// run follows the slices until ctx ends.
func (w *sliceWatcher) run(ctx context.Context) {
	w.factory.Start(ctx.Done())
	<-ctx.Done()
	w.factory.Shutdown()
}

func (w *sliceWatcher) synced() bool { return w.informer.HasSynced() }

// endpoints returns the ready addresses (ip:port) of Service service's port, and
// whether the Service has no EndpointSlice at all.
//
// A slice lists target ports, not the Service's ports, and this watcher does not read
// Services: a slice port matches when its number is the route's port, or when it is
// the slice's only port (a one-port Service whose targetPort differs).
func (w *sliceWatcher) endpoints(service string, port int) (addrs []string, noSlices bool) {
	list, err := w.lister.EndpointSlices(w.ns).List(labels.SelectorFromSet(labels.Set{discoveryv1.LabelServiceName: service}))
	if err != nil || len(list) == 0 {
		return nil, true
	}
	for _, s := range list {
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
		for _, e := range s.Endpoints {
			// A nil ready is an unknown state, which consumers should read as ready
			// (k8s.io/api/discovery/v1 EndpointConditions.Ready).
			if (e.Conditions.Ready != nil && !*e.Conditions.Ready) || len(e.Addresses) == 0 {
				continue
			}
			addrs = append(addrs, net.JoinHostPort(e.Addresses[0], strconv.Itoa(target)))
		}
	}
	slices.Sort(addrs)
	return slices.Compact(addrs), false
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
