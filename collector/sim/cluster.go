package sim

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/tools/cache"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/gpuscaler/gpuscaler/collector/kube"
	"github.com/gpuscaler/gpuscaler/collector/mig"
)

// Cluster makes a simulated node follow a real cluster, for end-to-end tests on fake
// nodes (kwok) where no kubelet runs: the pods the scheduler bound to the node hold its
// simulated GPUs, handed out as the kubelet's device manager would, and a kubelet
// pod-resources API (v1) served on a unix socket says which container holds which
// device. The collector then attributes as on a real node, through that socket and the
// Kubernetes API; only the readings and the kubelet are simulated.
//
// A pod holds devices from when it is bound to the node until it ends (phase Succeeded
// or Failed) or is gone from the API, as the kubelet keeps a pod's devices until the pod
// is no longer active. Each container gets, for each GPU resource it asks for in its
// limits (nvidia.com/gpu, nvidia.com/mig-<profile>), that many free devices of the
// resource. The kubelet itself leaves the choice to the device plugin
// (devicesToAllocate in pkg/kubelet/cm/devicemanager/manager.go takes the plugin's
// GetPreferredAllocation, else any free devices); NVIDIA's plugin prefers GPUs joined by
// NVLink and, for time-sliced replicas, spreads them over the GPUs
// (internal/rm/nvml_manager.go, allocate.go). A simulated node has no links, so devices
// go to the least used GPU first, then the lowest index. A pod that does not fit is
// refused as the kubelet refuses it at admission: it holds nothing, and a warning says so.
//
// A GPU whose pods are not Ready yet (loading their model) reads as idle; a Ready pod's
// GPU runs at the node's utilisation (Config.Util, which PUT /sim changes).
type Cluster struct {
	sim    *Node
	node   string
	socket string
	client dynamic.Interface
	log    *slog.Logger

	mu sync.Mutex
	// held is each active pod's devices, by UID, once allocated; refused are the pods
	// that did not fit, warned about once.
	held    map[string]*clusterPod
	refused map[string]bool
	// list is what the pod-resources API answers, made on every change.
	list *podresourcesv1.ListPodResourcesResponse
}

// clusterPod is an active pod on the node and the devices each of its containers holds.
type clusterPod struct {
	namespace, name, uid string
	created              time.Time
	ready                bool
	containers           []string
	// requests are what a pod not yet admitted asks for, by container; devices what
	// each container holds once it is.
	requests map[string][]gpuRequest
	devices  map[string][]offer
}

// gpuRequest is count devices of a GPU resource, from a container's limits.
type gpuRequest struct {
	resource string
	count    int
}

// offer is a device the simulated node's device plugin offers: its id, its resource
// and the Pod name of the device it is on ("3", "7/1").
type offer struct {
	id, resource, device string
	gpu                  int
}

// ClusterConfig says which node a Cluster follows and where it serves the kubelet's
// pod-resources API.
type ClusterConfig struct {
	Node string
	// Socket is the path of the pod-resources socket to serve; the collector's
	// PodResources reads it (--pod-resources-socket).
	Socket string
	// Client reads the node's pods (get, list and watch on pods).
	Client dynamic.Interface
	Log    *slog.Logger
}

// NewCluster makes sim's pods come from the cluster. sim must not configure pods of
// its own.
func NewCluster(sim *Node, cfg ClusterConfig) (*Cluster, error) {
	switch {
	case cfg.Node == "":
		return nil, errors.New("simulation from the cluster: no node name")
	case cfg.Socket == "":
		return nil, errors.New("simulation from the cluster: no pod-resources socket path to serve")
	case cfg.Client == nil:
		return nil, errors.New("simulation from the cluster: no Kubernetes client: it reads the node's pods through the API")
	}
	sim.mu.Lock()
	defer sim.mu.Unlock()
	if len(sim.cfg.Pods) > 0 {
		return nil, fmt.Errorf("simulation from the cluster: the simulation configures %d pods of its own; the node's pods come from the cluster", len(sim.cfg.Pods))
	}
	sim.fromCluster = true
	log := cfg.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Cluster{sim: sim, node: cfg.Node, socket: cfg.Socket, client: cfg.Client, log: log,
		held: map[string]*clusterPod{}, refused: map[string]bool{}, list: &podresourcesv1.ListPodResourcesResponse{}}, nil
}

// Run serves the pod-resources API on the socket and follows the node's pods until ctx
// ends.
func (c *Cluster) Run(ctx context.Context) error {
	if err := os.MkdirAll(filepath.Dir(c.socket), 0o755); err != nil {
		return fmt.Errorf("simulated kubelet: %w", err)
	}
	// A socket left by an earlier run would make Listen fail; the kubelet removes its
	// own too.
	if err := os.Remove(c.socket); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("simulated kubelet: remove stale socket: %w", err)
	}
	lis, err := net.Listen("unix", c.socket)
	if err != nil {
		return fmt.Errorf("simulated kubelet: serve pod-resources on %s: %w", c.socket, err)
	}
	srv := grpc.NewServer()
	podresourcesv1.RegisterPodResourcesListerServer(srv, &kubeletServer{c: c})
	served := make(chan error, 1)
	go func() { served <- srv.Serve(lis) }()
	defer func() {
		srv.Stop()
		<-served
	}()

	pods := c.client.Resource(kube.PodsResource)
	selector := fields.OneTermEqualSelector("spec.nodeName", c.node).String()
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.FieldSelector = selector
			return pods.List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.FieldSelector = selector
			return pods.Watch(ctx, o)
		},
	}
	// As client-go's own informers do: the reflector streams its initial list
	// (WatchListClient) only from a client that can.
	inf := cache.NewSharedIndexInformer(cache.ToListWatcherWithWatchListSemantics(lw, c.client),
		&unstructured.Unstructured{}, 0, cache.Indexers{})
	changed := make(chan struct{}, 1)
	poke := func(any) {
		select {
		case changed <- struct{}{}:
		default:
		}
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    poke,
		UpdateFunc: func(_, o any) { poke(o) },
		DeleteFunc: poke,
	}); err != nil {
		return err
	}
	go inf.RunWithContext(ctx)
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		return nil // ctx ended first
	}
	c.log.Info("simulated kubelet: following the node's pods", "node", c.node, "pod-resources", c.socket)
	for {
		var objs []*unstructured.Unstructured
		for _, o := range inf.GetStore().List() {
			if u, ok := o.(*unstructured.Unstructured); ok {
				objs = append(objs, u)
			}
		}
		if err := c.Sync(objs); err != nil {
			c.log.Warn("simulated kubelet: cannot hand out the node's devices", "err", err)
		}
		select {
		case <-ctx.Done():
			return nil
		case err := <-served:
			return fmt.Errorf("simulated kubelet: pod-resources server: %w", err)
		case <-changed:
		}
	}
}

// Sync makes the devices follow pods, the node's pods as the API has them: pods that
// ended or are gone free theirs, new ones get theirs in the order they were created.
func (c *Cluster) Sync(pods []*unstructured.Unstructured) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	var active []*clusterPod
	for _, u := range pods {
		if u.GetNamespace() == "" || u.GetName() == "" {
			continue
		}
		if node, _, _ := unstructured.NestedString(u.Object, "spec", "nodeName"); node != c.node {
			continue
		}
		if phase, _, _ := unstructured.NestedString(u.Object, "status", "phase"); phase == "Succeeded" || phase == "Failed" {
			continue
		}
		p := &clusterPod{namespace: u.GetNamespace(), name: u.GetName(), uid: string(u.GetUID()),
			created: u.GetCreationTimestamp().Time, ready: podReady(u)}
		if old, ok := c.held[p.uid]; ok {
			p.containers, p.devices = old.containers, old.devices
		} else {
			p.containers, p.requests = podRequests(u)
		}
		active = append(active, p)
	}
	slices.SortFunc(active, func(a, b *clusterPod) int {
		return cmp.Or(a.created.Compare(b.created), cmp.Compare(a.namespace, b.namespace), cmp.Compare(a.name, b.name))
	})

	offers := c.sim.offers()
	used := map[string]bool{}
	perGPU := map[int]int{}
	for _, p := range active {
		if _, ok := c.held[p.uid]; !ok {
			continue
		}
		for _, ds := range p.devices {
			for _, d := range ds {
				used[d.id] = true
				perGPU[d.gpu]++
			}
		}
	}
	held := make(map[string]*clusterPod, len(active))
	for _, p := range active {
		if _, ok := c.held[p.uid]; ok || c.refused[p.uid] {
			held[p.uid] = p
			continue
		}
		if err := allocate(p, offers, used, perGPU); err != nil {
			c.refused[p.uid] = true
			c.log.Warn("simulated kubelet: pod refused at admission, as the kubelet would refuse it", "pod", p.namespace+"/"+p.name, "err", err)
		}
		held[p.uid] = p
	}
	for uid := range c.refused {
		if _, ok := held[uid]; !ok {
			delete(c.refused, uid)
		}
	}
	c.held = held
	return c.publish(active)
}

// allocate hands p's containers the devices they ask for, least used GPU first, then
// the lowest index, and marks them used; it hands out nothing when one does not fit.
func allocate(p *clusterPod, offers []offer, used map[string]bool, perGPU map[int]int) error {
	got := map[string][]offer{}
	taken := map[string]bool{}
	takenPerGPU := map[int]int{}
	for _, container := range p.containers {
		for _, req := range p.requests[container] {
			var free []offer
			for _, o := range offers {
				if o.resource == req.resource && !used[o.id] && !taken[o.id] {
					free = append(free, o)
				}
			}
			slices.SortStableFunc(free, func(a, b offer) int {
				return cmp.Or(cmp.Compare(perGPU[a.gpu]+takenPerGPU[a.gpu], perGPU[b.gpu]+takenPerGPU[b.gpu]), cmp.Compare(a.gpu, b.gpu))
			})
			if req.count > len(free) {
				return fmt.Errorf("container %s asks for %d %s, %d free", container, req.count, req.resource, len(free))
			}
			for _, o := range free[:req.count] {
				taken[o.id] = true
				takenPerGPU[o.gpu]++
				got[container] = append(got[container], o)
			}
		}
	}
	for id := range taken {
		used[id] = true
	}
	for g, n := range takenPerGPU {
		perGPU[g] += n
	}
	p.devices = got
	return nil
}

// podRequests reads u's containers and the GPU resources each asks for in its limits
// (where extended resources are set; requests equal them): nvidia.com/gpu and
// nvidia.com/mig-<profile>. Init containers are left out: the kubelet hands their
// devices on to the app containers.
func podRequests(u *unstructured.Unstructured) ([]string, map[string][]gpuRequest) {
	objs, _, _ := unstructured.NestedSlice(u.Object, "spec", "containers")
	var containers []string
	requests := map[string][]gpuRequest{}
	for _, obj := range objs {
		m, _ := obj.(map[string]any)
		name, _ := m["name"].(string)
		if name == "" {
			continue
		}
		containers = append(containers, name)
		limits, _, _ := unstructured.NestedMap(m, "resources", "limits")
		for _, r := range slices.Sorted(maps.Keys(limits)) {
			if r != "nvidia.com/gpu" && !strings.HasPrefix(r, mig.ResourcePrefix) {
				continue
			}
			q, err := resource.ParseQuantity(fmt.Sprint(limits[r]))
			if err != nil || q.Value() <= 0 {
				continue
			}
			requests[name] = append(requests[name], gpuRequest{resource: r, count: int(q.Value())})
		}
	}
	return containers, requests
}

// publish tells the simulation who holds what, and makes the pod-resources answer.
// c.mu must be held.
func (c *Cluster) publish(active []*clusterPod) error {
	idle := 0.0
	var pods []Pod
	list := &podresourcesv1.ListPodResourcesResponse{}
	for _, p := range active {
		pr := &podresourcesv1.PodResources{Name: p.name, Namespace: p.namespace}
		for _, container := range p.containers {
			cr := &podresourcesv1.ContainerResources{Name: container}
			var names []string
			for _, d := range p.devices[container] {
				// The kubelet lists each device in a ContainerDevices of its own
				// (containerDevicesFromResourceDeviceInstances, pkg/kubelet/cm).
				cr.Devices = append(cr.Devices, &podresourcesv1.ContainerDevices{ResourceName: d.resource, DeviceIds: []string{d.id}})
				if !slices.Contains(names, d.device) {
					names = append(names, d.device)
				}
			}
			pr.Containers = append(pr.Containers, cr)
			if len(names) == 0 {
				continue
			}
			sp := Pod{Namespace: p.namespace, Name: p.name, Container: container, GPUs: names, uid: p.uid}
			if !p.ready {
				sp.Util = &idle // loading its model
			}
			pods = append(pods, sp)
		}
		list.PodResources = append(list.PodResources, pr)
	}
	c.list = list
	return c.sim.setClusterPods(pods)
}

// podReady says u's Ready condition is True.
func podReady(u *unstructured.Unstructured) bool {
	conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
	for _, obj := range conds {
		if m, _ := obj.(map[string]any); m["type"] == "Ready" {
			return m["status"] == "True"
		}
	}
	return false
}

// kubeletServer serves the kubelet's pod-resources API (v1) for a Cluster.
type kubeletServer struct {
	podresourcesv1.UnimplementedPodResourcesListerServer
	c *Cluster
}

func (k *kubeletServer) List(context.Context, *podresourcesv1.ListPodResourcesRequest) (*podresourcesv1.ListPodResourcesResponse, error) {
	k.c.mu.Lock()
	defer k.c.mu.Unlock()
	return k.c.list, nil
}

func (k *kubeletServer) Get(_ context.Context, r *podresourcesv1.GetPodResourcesRequest) (*podresourcesv1.GetPodResourcesResponse, error) {
	k.c.mu.Lock()
	defer k.c.mu.Unlock()
	for _, p := range k.c.list.GetPodResources() {
		if p.GetNamespace() == r.GetPodNamespace() && p.GetName() == r.GetPodName() {
			return &podresourcesv1.GetPodResourcesResponse{PodResources: p}, nil
		}
	}
	return nil, status.Errorf(codes.NotFound, "pod %s/%s not found on node %s", r.GetPodNamespace(), r.GetPodName(), k.c.node)
}

func (k *kubeletServer) GetAllocatableResources(context.Context, *podresourcesv1.AllocatableResourcesRequest) (*podresourcesv1.AllocatableResourcesResponse, error) {
	resp := &podresourcesv1.AllocatableResourcesResponse{}
	for _, o := range k.c.sim.offers() {
		resp.Devices = append(resp.Devices, &podresourcesv1.ContainerDevices{ResourceName: o.resource, DeviceIds: []string{o.id}})
	}
	return resp, nil
}
