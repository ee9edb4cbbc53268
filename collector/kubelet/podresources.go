// Package kubelet is the collector's kubelet side: PodResources asks the kubelet's
// pod-resources API which devices the node can hand out and which pod holds each (the
// collector's Attributor), and package cgroup (kubelet/cgroup) finds the pod of a host
// process through the cgroup the kubelet gave it. It imports nothing of the collector's:
// PodResources answers with attribution.Allocation, which collector.Attributor wants.
package kubelet

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/gpuscaler/gpuscaler/collector/attribution"
	"github.com/gpuscaler/gpuscaler/collector/deviceid"
	"github.com/gpuscaler/gpuscaler/collector/mig"
	gpuscalerv1 "github.com/gpuscaler/gpuscaler/proto/gpuscaler/v1"
)

// Defaults of PodResourcesConfig.
const (
	DefaultPodResourcesSocket  = "/var/lib/kubelet/pod-resources/kubelet.sock"
	DefaultPodResourcesTimeout = 5 * time.Second
)

// DefaultPodResources are the resources counted when PodResourcesConfig.Resources is
// empty: whole NVIDIA GPUs, their shared replicas under the name the device plugin's
// renameByDefault gives them (nvidia.com/gpu.shared; NVIDIA/k8s-device-plugin
// api/config/v1/resources.go DefaultSharedRename), and MIG slices offered under the
// "mixed" strategy, shared or not (nvidia.com/mig-1g.10gb, nvidia.com/mig-1g.10gb.shared).
var DefaultPodResources = []string{"nvidia.com/gpu", "nvidia.com/gpu.shared", "nvidia.com/mig-*"}

// podResourcesMaxMsg bounds a kubelet answer. gRPC's default of 4 MiB can be too
// little for List on a node with many pods (each reports its CPU ids and memory too);
// dcgm-exporter reads the same API with 16 MiB.
const podResourcesMaxMsg = 16 << 20

// ErrNoPodResourcesSocket reports that the kubelet's pod-resources socket is not where
// the collector looks for it: usually the hostPath volume is missing or points elsewhere.
var ErrNoPodResourcesSocket = errors.New("kubelet pod-resources socket not found")

// PodResourcesConfig tunes PodResources. The zero value reads the kubelet's default
// socket, counts DefaultPodResources, gives each call 5 s and logs nothing.
type PodResourcesConfig struct {
	// Socket is the path of the kubelet's pod-resources socket, as mounted into the
	// collector (--pod-resources-socket). Empty means DefaultPodResourcesSocket.
	Socket string
	// Resources are the extended resources counted, as patterns: a name matches a
	// pattern equal to it, or one ending in "*" that it starts with (the part before the
	// "*"). A "*" anywhere else is an error. Empty means DefaultPodResources.
	Resources []string
	// Timeout bounds each call to the kubelet. Zero means DefaultPodResourcesTimeout;
	// negative is an error.
	Timeout time.Duration
	// Log receives the notice, given once, that the kubelet cannot list allocatable
	// devices. Nil discards it.
	Log *slog.Logger
}

// PodResources is the Attributor that asks the kubelet, through its pod-resources API
// (v1), which devices the node can hand out and which container holds each. It is safe
// for concurrent use.
type PodResources struct {
	socket    string
	resources resourceMatcher
	timeout   time.Duration
	log       *slog.Logger

	conn   *grpc.ClientConn
	client podresourcesv1.PodResourcesListerClient

	// listOnly is set once the kubelet has said it does not serve
	// GetAllocatableResources; it is not asked again.
	listOnly     atomic.Bool
	listOnlyOnce sync.Once // logs the degraded mode once
}

// NewPodResources makes a PodResources for the kubelet socket in cfg. It does not
// connect: the kubelet is first asked by Allocation, and a missing socket is reported
// there, on every call, so the collector keeps publishing GPU samples and picks the
// socket up when it appears (a kubelet restart re-creates it). Close it when done.
func NewPodResources(cfg PodResourcesConfig) (*PodResources, error) {
	socket := cfg.Socket
	if socket == "" {
		socket = DefaultPodResourcesSocket
	}
	socket, err := filepath.Abs(socket)
	if err != nil {
		return nil, fmt.Errorf("pod-resources socket %q: %w", cfg.Socket, err)
	}
	patterns := cfg.Resources
	if len(patterns) == 0 {
		patterns = DefaultPodResources
	}
	match, err := newResourceMatcher(patterns)
	if err != nil {
		return nil, err
	}
	switch {
	case cfg.Timeout < 0:
		return nil, fmt.Errorf("pod-resources timeout %s: want a positive duration, or 0 for %s", cfg.Timeout, DefaultPodResourcesTimeout)
	case cfg.Timeout == 0:
		cfg.Timeout = DefaultPodResourcesTimeout
	}
	log := cfg.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	// The kubelet serves plain gRPC on a root-owned unix socket: file permissions are
	// the access control, so there is nothing for TLS to add.
	conn, err := grpc.NewClient("unix://"+socket,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(podResourcesMaxMsg)),
		// gRPC's default reconnect back-off grows to 2 minutes; the socket is local and a
		// restarted kubelet is back in seconds, so retry soon.
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 500 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 5 * time.Second},
			MinConnectTimeout: cfg.Timeout,
		}),
	)
	if err != nil {
		return nil, fmt.Errorf("pod-resources socket %s: %w", socket, err)
	}
	return &PodResources{
		socket:    socket,
		resources: match,
		timeout:   cfg.Timeout,
		log:       log.With("socket", socket),
		conn:      conn,
		client:    podresourcesv1.NewPodResourcesListerClient(conn),
	}, nil
}

// Close closes the connection to the kubelet. Allocation must not be called after.
func (p *PodResources) Close() error {
	return p.conn.Close()
}

// Allocation asks the kubelet for the node's allocatable devices and for the devices
// each container holds, keeping only the counted resources.
//
// A device that a container holds but the kubelet no longer lists as allocatable (its
// device plugin marked it unhealthy or went away while the pod kept it) is still
// allocated: the pod has it and may be using it. It is added to Allocatable too, so that
// Allocated stays a subset of Allocatable and free = allocatable - allocated counts it
// on neither side, instead of going negative or hiding a held device.
//
// A kubelet that does not serve GetAllocatableResources (before Kubernetes 1.23, or
// with the KubeletPodResourcesGetAllocatable feature gate off) is asked for List only,
// said once in the log: Allocatable then holds only the allocated devices, so the node
// reads as having no free device rather than as having free devices nobody can see.
func (p *PodResources) Allocation(ctx context.Context) (*attribution.Allocation, error) {
	var allocatable []*podresourcesv1.ContainerDevices
	if !p.listOnly.Load() {
		resp, err := p.getAllocatable(ctx)
		switch {
		case err == nil:
			allocatable = resp.GetDevices()
		case allocatableUnsupported(err):
			p.listOnly.Store(true)
			p.listOnlyOnce.Do(func() {
				p.log.Warn("the kubelet does not list allocatable devices (GetAllocatableResources); reporting allocated devices only, so the node shows no free device",
					"err", err)
			})
		default:
			return nil, err
		}
	}
	list, err := p.list(ctx)
	if err != nil {
		return nil, err
	}
	return buildAllocation(allocatable, list.GetPodResources(), p.resources), nil
}

func (p *PodResources) getAllocatable(ctx context.Context) (*podresourcesv1.AllocatableResourcesResponse, error) {
	ctx, cancel, own := p.callContext(ctx)
	defer cancel()
	resp, err := p.client.GetAllocatableResources(ctx, &podresourcesv1.AllocatableResourcesRequest{})
	if err != nil {
		return nil, p.callError("GetAllocatableResources", err, own)
	}
	return resp, nil
}

func (p *PodResources) list(ctx context.Context) (*podresourcesv1.ListPodResourcesResponse, error) {
	ctx, cancel, own := p.callContext(ctx)
	defer cancel()
	resp, err := p.client.List(ctx, &podresourcesv1.ListPodResourcesRequest{})
	if err != nil {
		return nil, p.callError("List", err, own)
	}
	return resp, nil
}

// callContext bounds a call by the Timeout, and says whether the Timeout ends it first
// rather than a deadline of ctx. Decided before the call, since a timed-out call can
// come back (the kubelet gets the deadline too) before the client's own timer fires.
func (p *PodResources) callContext(ctx context.Context) (_ context.Context, _ context.CancelFunc, ownDeadline bool) {
	deadline, ok := ctx.Deadline()
	ownDeadline = !ok || time.Until(deadline) > p.timeout
	ctx, cancel := context.WithTimeout(ctx, p.timeout)
	return ctx, cancel, ownDeadline
}

// callError says what failed and what to check. The gRPC status stays reachable through
// the wrapping (status.Code, errors.Is for context errors).
func (p *PodResources) callError(method string, err error, ownDeadline bool) error {
	switch status.Code(err) {
	case codes.Unavailable:
		if _, serr := os.Stat(p.socket); errors.Is(serr, fs.ErrNotExist) {
			return fmt.Errorf("%w: %s does not exist: is the kubelet's pod-resources socket mounted at %s? (a hostPath volume of /var/lib/kubelet/pod-resources)",
				ErrNoPodResourcesSocket, p.socket, p.socket)
		}
		return fmt.Errorf("kubelet pod-resources %s at %s: %w (is the kubelet running, and may the collector open its root-owned socket?)", method, p.socket, err)
	case codes.DeadlineExceeded:
		// Say so only when this call's own timeout ran out, not the caller's deadline.
		if ownDeadline {
			return fmt.Errorf("kubelet pod-resources %s at %s: no answer within %s: %w", method, p.socket, p.timeout, err)
		}
	}
	return fmt.Errorf("kubelet pod-resources %s at %s: %w", method, p.socket, err)
}

// allocatableUnsupported tells whether err says the kubelet does not serve
// GetAllocatableResources: Unimplemented from a kubelet older than the method, or the
// plain error that kubelets 1.21 to 1.27 return when its feature gate is off.
func allocatableUnsupported(err error) bool {
	st, _ := status.FromError(err)
	return st.Code() == codes.Unimplemented ||
		(st.Code() == codes.Unknown && strings.Contains(st.Message(), "GetAllocatableResources disabled"))
}

// buildAllocation joins the kubelet's allocatable devices and its per-container
// assignments into an Allocation, keeping only the resources match counts, and the GPUs
// of NVIDIA's DRA driver that claims give containers. Allocatable and Allocated are
// sorted by resource, then id; Allocated holds the same *Device values as Allocatable.
// A device held by several containers of one pod (the kubelet hands an init container's
// devices on to the app containers of its pod) is held once by that pod, in the first
// container listed: the kubelet lists regular containers before sidecars. A device that
// several pods hold (which a device plugin does not do, but a kubelet's list may show
// across a pod's restart) lists every pod.
func buildAllocation(allocatable []*podresourcesv1.ContainerDevices, pods []*podresourcesv1.PodResources, match resourceMatcher) *attribution.Allocation {
	a := &attribution.Allocation{Holders: map[string][]attribution.Holder{}}
	byID := map[string]*gpuscalerv1.Device{}
	add := func(resource, id string) *gpuscalerv1.Device {
		if d, ok := byID[id]; ok {
			return d
		}
		d := &gpuscalerv1.Device{Id: id, Resource: resource, MigProfile: migProfile(resource)}
		byID[id] = d
		a.Allocatable = append(a.Allocatable, d)
		return d
	}
	for _, cd := range allocatable {
		if !match.matches(cd.GetResourceName()) {
			continue
		}
		for _, id := range cd.GetDeviceIds() {
			add(cd.GetResourceName(), id)
		}
	}
	type claimKey struct{ pod, device string }
	claimed := map[claimKey]bool{}
	for _, pod := range pods {
		for _, c := range pod.GetContainers() {
			h := attribution.Holder{Namespace: pod.GetNamespace(), Pod: pod.GetName(), Container: c.GetName()}
			for _, cd := range c.GetDevices() {
				if !match.matches(cd.GetResourceName()) {
					continue
				}
				for _, id := range cd.GetDeviceIds() {
					holders, held := a.Holders[id]
					if slices.ContainsFunc(holders, func(o attribution.Holder) bool { return samePod(h, o) }) {
						continue
					}
					a.Holders[id] = append(holders, h)
					if !held {
						a.Allocated = append(a.Allocated, add(cd.GetResourceName(), id))
					}
				}
			}
			for _, dr := range c.GetDynamicResources() {
				for _, cr := range dr.GetClaimResources() {
					if cr.GetDriverName() != deviceid.NVIDIADRADriver || cr.GetDeviceName() == "" {
						continue // not a GPU: NICs, compute-domain channels, …
					}
					cl := attribution.Claim{Driver: cr.GetDriverName(), Pool: cr.GetPoolName(), Device: cr.GetDeviceName(), Holder: h}
					k := claimKey{pod.GetNamespace() + "/" + pod.GetName(), cl.ID()}
					if claimed[k] {
						continue
					}
					claimed[k] = true
					a.Claims = append(a.Claims, cl)
				}
			}
		}
	}
	byResourceID := func(x, y *gpuscalerv1.Device) int {
		return cmp.Or(cmp.Compare(x.GetResource(), y.GetResource()), cmp.Compare(x.GetId(), y.GetId()))
	}
	slices.SortFunc(a.Allocatable, byResourceID)
	slices.SortFunc(a.Allocated, byResourceID)
	return a
}

// migProfile is the MIG profile a resource name offers ("1g.10gb" for
// nvidia.com/mig-1g.10gb and nvidia.com/mig-1g.10gb.shared), or "" for any other
// resource.
func migProfile(resource string) string {
	if !strings.HasPrefix(resource, mig.ResourcePrefix) {
		return ""
	}
	return (&gpuscalerv1.Device{Resource: resource}).Profile()
}

// samePod reports whether h and o are holds of one pod.
func samePod(h, o attribution.Holder) bool { return h.Namespace == o.Namespace && h.Pod == o.Pod }

// resourceMatcher says whether a resource name is counted: equal to one of exact, or
// starting with one of prefixes.
type resourceMatcher struct {
	exact    map[string]bool
	prefixes []string
}

func newResourceMatcher(patterns []string) (resourceMatcher, error) {
	m := resourceMatcher{exact: map[string]bool{}}
	for _, p := range patterns {
		prefix, wildcard := strings.CutSuffix(p, "*")
		switch {
		case p == "" || prefix == "":
			return m, fmt.Errorf("pod-resources resource pattern %q: want a resource name such as nvidia.com/gpu, or a prefix ending in * such as nvidia.com/mig-*", p)
		case strings.Contains(prefix, "*"):
			return m, fmt.Errorf("pod-resources resource pattern %q: a * may only end the pattern", p)
		case wildcard:
			m.prefixes = append(m.prefixes, prefix)
		default:
			m.exact[p] = true
		}
	}
	return m, nil
}

func (m resourceMatcher) matches(resource string) bool {
	if m.exact[resource] {
		return true
	}
	for _, p := range m.prefixes {
		if strings.HasPrefix(resource, p) {
			return true
		}
	}
	return false
}
