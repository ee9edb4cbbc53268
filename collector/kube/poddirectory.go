// Package kube is the collector's Kubernetes side: what it reads of the API server
// rather than of the kubelet. PodDirectory knows the labels and owners of the node's
// pods (the metadata client), NodeWatch follows the node's own Node (labels, cordon,
// taints, allocatable CPU and memory), and PodRequests sums the CPU and memory requests
// of the node's unfinished pods (the dynamic client). RESTConfig and NewMetadataClient
// make the clients, in the cluster or from a kubeconfig. It imports nothing of the
// collector's: PodDirectory answers with attribution.PodInfo, which collector.PodDirectory
// wants.
package kube

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"sync"
	"sync/atomic"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/tools/cache"

	"github.com/gpuscaler/gpuscaler/collector/attribution"
)

const (
	// defaultOwnerTTL is how long the owner of a ReplicaSet or Job, once looked up, is
	// trusted before it is looked up again. A ReplicaSet's Deployment and a Job's CronJob
	// do not change in practice; the TTL bounds what a rare adoption or orphaning costs.
	// It is also the informer's resync period, so that every pod passes the event
	// handler once per TTL and the owners of long-lived pods are refreshed.
	defaultOwnerTTL = 10 * time.Minute
	// ownerRetry is how long a failed owner lookup stands before it is tried again.
	ownerRetry = time.Minute
	// ownerLookupTimeout bounds each owner lookup.
	ownerLookupTimeout = 5 * time.Second
	// probeTimeout bounds the first list of pods, which tells whether the API can be
	// read at all.
	probeTimeout = 10 * time.Second
	// shutdownWait bounds how long Run waits for the informer to stop.
	shutdownWait = 2 * time.Second
)

// PodsResource is read, as every resource here, through the metadata client: only labels
// and owner references are needed, and the client needs no Go types of the API groups,
// so the binary links and initialises none of them.
var PodsResource = schema.GroupVersionResource{Version: "v1", Resource: "pods"}

// ownerLookups are the kinds of pod controller whose own controller is looked up, and
// the resource read to do it: a ReplicaSet's Deployment, a Job's CronJob.
var ownerLookups = map[string]schema.GroupVersionResource{
	"ReplicaSet": {Group: "apps", Version: "v1", Resource: "replicasets"},
	"Job":        {Group: "batch", Version: "v1", Resource: "jobs"},
}

// PodDirectory is the PodDirectory of a node's pods, kept by a client-go informer that
// lists and watches the metadata only (PartialObjectMetadata) of the pods with
// spec.nodeName equal to the node: no cluster-wide watch, no specs or statuses. It needs
// get, list and watch on pods, and get on ReplicaSets (apps) and Jobs (batch) to name a
// Deployment or CronJob as a pod's owner.
//
// Without access to the API (no RBAC, no route to the API server) it keeps trying in the
// background, says so once in the log, and knows no pod: reports then carry the
// namespace, pod and container the kubelet gives, without labels or owner.
//
// Pod never waits on the network. Its methods are safe for concurrent use.
type PodDirectory struct {
	client   metadata.Interface
	node     string
	selector string // spec.nodeName=<node>
	log      *slog.Logger
	informer cache.SharedIndexInformer // of *metav1.PartialObjectMetadata, slimmed
	ownerTTL time.Duration

	running  atomic.Bool // Run was called
	apiError atomic.Bool // the pods could not be read before the first sync; logged once

	mu sync.Mutex // guards the fields below
	// owners holds the looked-up owners of ReplicaSets and Jobs. Written only by the
	// event handler (one goroutine), read by Pod.
	owners       map[ownerKey]ownerEntry
	lastSweep    time.Time
	lookupWarned map[string]bool // ReplicaSet or Job kinds whose failed lookup was logged
	registration cache.ResourceEventHandlerRegistration
}

// ownerKey names a pod's controller whose own controller is looked up.
type ownerKey struct {
	Namespace, Kind, Name string
}

// ownerEntry is the top-level owner found for an ownerKey.
type ownerEntry struct {
	Kind, Name string
	expires    time.Time // looked up again after this
	seen       time.Time // last seen owning a pod; forgotten after two TTLs unseen
}

// NewPodDirectory makes a PodDirectory for the pods of node, read through client. It
// does nothing until Run.
func NewPodDirectory(client metadata.Interface, node string, log *slog.Logger) *PodDirectory {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	d := &PodDirectory{
		client:       client,
		node:         node,
		selector:     fields.OneTermEqualSelector("spec.nodeName", node).String(),
		log:          log.With("node", node),
		ownerTTL:     defaultOwnerTTL,
		owners:       map[ownerKey]ownerEntry{},
		lookupWarned: map[string]bool{},
	}
	pods := client.Resource(PodsResource).Namespace(metav1.NamespaceAll)
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.FieldSelector = d.selector
			return pods.List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.FieldSelector = d.selector
			return pods.Watch(ctx, o)
		},
	}
	// As client-go's own metadata informer does: the reflector streams its initial list
	// (WatchListClient) only from a client that can.
	d.informer = cache.NewSharedIndexInformer(cache.ToListWatcherWithWatchListSemantics(lw, client),
		&metav1.PartialObjectMetadata{}, defaultOwnerTTL, cache.Indexers{})
	// Both must be set before the informer starts; they fail only after.
	_ = d.informer.SetTransform(slimPod)
	_ = d.informer.SetWatchErrorHandlerWithContext(func(_ context.Context, _ *cache.Reflector, err error) {
		d.watchError(err)
	})
	return d
}

// Run reads the node's pods and follows them until ctx ends, then returns nil. Call it
// once.
func (d *PodDirectory) Run(ctx context.Context) error {
	if !d.running.CompareAndSwap(false, true) {
		return errors.New("pod directory: Run called twice")
	}
	reg, err := d.informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { d.podSeen(ctx, obj) },
		UpdateFunc: func(_, obj any) { d.podSeen(ctx, obj) },
	})
	if err != nil {
		return fmt.Errorf("pod directory: %w", err)
	}
	d.mu.Lock()
	d.registration = reg
	d.mu.Unlock()

	d.probe(ctx)
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		d.informer.RunWithContext(ctx)
	}()
	defer d.shutdown(stopped)
	if cache.WaitForCacheSync(ctx.Done(), reg.HasSynced) {
		d.log.Info("pod directory synced", "pods", len(d.informer.GetIndexer().ListKeys()))
		<-ctx.Done()
	}
	return nil
}

// shutdown waits for the informer, which ends with Run's context and closes stopped, but
// not for long: while the API server refuses connections, client-go's reflector backs
// off (up to 30 s) without watching the context, and a collector told to stop should not
// wait for that.
func (d *PodDirectory) shutdown(stopped <-chan struct{}) {
	t := time.NewTimer(shutdownWait)
	defer t.Stop()
	select {
	case <-stopped:
	case <-t.C:
		d.log.Debug("pod informer still backing off; not waiting for it to stop")
	}
}

// probe lists one pod of the node, to learn at once whether the API can be read. The
// informer cannot always say: when it streams its initial list (client-go's
// WatchListClient), it retries a refused connection without calling its error handler.
func (d *PodDirectory) probe(ctx context.Context) {
	pctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	_, err := d.client.Resource(PodsResource).List(pctx, metav1.ListOptions{FieldSelector: d.selector, Limit: 1})
	if err != nil && ctx.Err() == nil {
		d.cannotRead(err)
	}
}

// cannotRead says, once, that the pods cannot be read.
func (d *PodDirectory) cannotRead(err error) {
	if !d.apiError.CompareAndSwap(false, true) {
		d.log.Debug("reading pods from the Kubernetes API failed; retrying", "err", err)
		return
	}
	args := []any{"err", err}
	if apierrors.IsForbidden(err) {
		args = append(args, "hint", "the collector's service account needs get, list and watch on pods")
	}
	d.log.Warn("cannot read pods from the Kubernetes API; reports will carry namespace/pod/container without labels", args...)
}

// Synced reports whether the node's pods have been read, and the owners of those then
// present looked up.
func (d *PodDirectory) Synced() bool {
	d.mu.Lock()
	reg := d.registration
	d.mu.Unlock()
	return reg != nil && reg.HasSynced()
}

// Pod returns the labels and owner of the pod namespace/name, if it is on the node. The
// owner is a ReplicaSet's Deployment and a Job's CronJob once looked up, which happens
// when the informer delivers the pod; until then, or if the lookup failed, it is the
// ReplicaSet or Job itself. The labels are the caller's to keep.
func (d *PodDirectory) Pod(namespace, name string) (attribution.PodInfo, bool) {
	obj, ok, err := d.informer.GetIndexer().GetByKey(namespace + "/" + name)
	if err != nil || !ok {
		return attribution.PodInfo{}, false
	}
	pod, ok := obj.(*metav1.PartialObjectMetadata)
	if !ok {
		return attribution.PodInfo{}, false
	}
	info := attribution.PodInfo{UID: string(pod.UID), Labels: maps.Clone(pod.Labels)}
	ref := metav1.GetControllerOf(pod)
	if ref == nil {
		return info, true
	}
	info.OwnerKind, info.OwnerName = ref.Kind, ref.Name
	if key, ok := lookedUpOwner(pod.Namespace, ref); ok {
		d.mu.Lock()
		e, ok := d.owners[key]
		d.mu.Unlock()
		if ok {
			info.OwnerKind, info.OwnerName = e.Kind, e.Name
		}
	}
	return info, true
}

// lookedUpOwner returns the key under which the owner of ref, a pod's controller, is
// looked up: ReplicaSets (apps) and Jobs (batch), as ownerLookups says. Any other
// controller is the top-level owner itself.
func lookedUpOwner(namespace string, ref *metav1.OwnerReference) (ownerKey, bool) {
	gv, err := schema.ParseGroupVersion(ref.APIVersion)
	if err != nil {
		return ownerKey{}, false
	}
	if r, ok := ownerLookups[ref.Kind]; !ok || r.Group != gv.Group {
		return ownerKey{}, false
	}
	return ownerKey{Namespace: namespace, Kind: ref.Kind, Name: ref.Name}, true
}

// podSeen looks up the owner of the pod's ReplicaSet or Job unless it is known and
// fresh. The informer calls it for each pod added or updated, and for every pod once
// per resync period, one call at a time.
func (d *PodDirectory) podSeen(ctx context.Context, obj any) {
	pod, ok := obj.(*metav1.PartialObjectMetadata)
	if !ok {
		return
	}
	ref := metav1.GetControllerOf(pod)
	if ref == nil {
		return
	}
	key, ok := lookedUpOwner(pod.Namespace, ref)
	if !ok {
		return
	}
	now := time.Now()
	d.mu.Lock()
	e, known := d.owners[key]
	if known {
		e.seen = now
		d.owners[key] = e
	}
	d.mu.Unlock()
	if known && now.Before(e.expires) {
		return
	}

	top, err := d.lookupOwner(ctx, key, ref.UID)
	switch {
	case err == nil && top != nil:
		e = ownerEntry{Kind: top.Kind, Name: top.Name}
	case err == nil:
		// A ReplicaSet or Job nobody controls is the top-level owner.
		e = ownerEntry{Kind: ref.Kind, Name: ref.Name}
	case ctx.Err() != nil:
		return
	default:
		d.lookupFailed(key, err)
		if !known || apierrors.IsNotFound(err) || errors.Is(err, errOwnerReplaced) {
			e = ownerEntry{Kind: ref.Kind, Name: ref.Name}
		}
		// Else the owner found before stands until the retry.
	}
	e.expires, e.seen = now.Add(d.ownerTTL), now
	if err != nil {
		e.expires = now.Add(ownerRetry)
	}

	d.mu.Lock()
	defer d.mu.Unlock()
	d.owners[key] = e
	if now.Sub(d.lastSweep) > d.ownerTTL {
		for k, e := range d.owners {
			if now.Sub(e.seen) > 2*d.ownerTTL {
				delete(d.owners, k)
			}
		}
		d.lastSweep = now
	}
}

// errOwnerReplaced reports that a pod's ReplicaSet or Job was deleted and another made
// under the same name.
var errOwnerReplaced = errors.New("replaced by another object of the same name")

// lookupOwner returns the controller of the ReplicaSet or Job key, or nil if it has
// none.
func (d *PodDirectory) lookupOwner(ctx context.Context, key ownerKey, uid types.UID) (*metav1.OwnerReference, error) {
	ctx, cancel := context.WithTimeout(ctx, ownerLookupTimeout)
	defer cancel()
	obj, err := d.client.Resource(ownerLookups[key.Kind]).Namespace(key.Namespace).Get(ctx, key.Name, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	if uid != "" && obj.GetUID() != uid {
		return nil, errOwnerReplaced
	}
	return metav1.GetControllerOf(obj), nil
}

// lookupFailed logs a failed owner lookup: once per kind as a warning, since a missing
// RBAC rule fails every lookup alike, and at debug level after.
func (d *PodDirectory) lookupFailed(key ownerKey, err error) {
	d.mu.Lock()
	warned := d.lookupWarned[key.Kind]
	d.lookupWarned[key.Kind] = true
	d.mu.Unlock()
	logf := d.log.Debug
	if !warned && !apierrors.IsNotFound(err) && !errors.Is(err, errOwnerReplaced) {
		logf = d.log.Warn
	}
	args := []any{"namespace", key.Namespace, "name", key.Name, "err", err}
	if apierrors.IsForbidden(err) {
		r := ownerLookups[key.Kind]
		args = append(args, "hint", "the collector's service account needs get on "+r.Resource+" ("+r.Group+")")
	}
	logf("cannot look up the owner of a pod's "+key.Kind+"; reporting the "+key.Kind+" as the pod's owner", args...)
}

// watchError is the informer's handler for failed lists and watches, which the informer
// retries with back-off. Before the first sync, a failure is logged as a warning unless
// one was (by the probe, or before); after it, the informer goes on serving the pods it
// has.
func (d *PodDirectory) watchError(err error) {
	switch {
	// A watch ends so, and is resumed, in normal operation. Compared as values, as
	// client-go's default handler does: a failed list wraps io.EOF too (an API server
	// that hangs up), and that is a failure.
	case err == io.EOF, err == io.ErrUnexpectedEOF, apierrors.IsResourceExpired(err), apierrors.IsGone(err):
		d.log.Debug("pod watch closed; resuming", "err", err)
	case !d.informer.HasSynced():
		d.cannotRead(err)
	default:
		d.log.Debug("reading pods from the Kubernetes API failed; retrying", "err", err)
	}
}

// slimPod keeps of a pod's metadata only what Pod reads, so the informer's cache holds a
// few hundred bytes per pod rather than its annotations and managed fields too.
func slimPod(obj any) (any, error) {
	pod, ok := obj.(*metav1.PartialObjectMetadata)
	if !ok {
		return obj, nil
	}
	return &metav1.PartialObjectMetadata{
		ObjectMeta: metav1.ObjectMeta{
			Namespace:       pod.Namespace,
			Name:            pod.Name,
			UID:             pod.UID,
			ResourceVersion: pod.ResourceVersion,
			Labels:          pod.Labels,
			OwnerReferences: pod.OwnerReferences,
		},
	}, nil
}
