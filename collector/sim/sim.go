// Package sim is the collector's "sim" GPU source: a simulated GPU node (Node) whose
// GPUs, MIG slices, pods and load come from a configuration (Config, which
// examples/simulated-node documents) and may change while it runs, for the demo, replay,
// tests and clusters without GPUs. A Node plays the kubelet and the Kubernetes API too;
// Cluster makes it follow a real cluster's pods instead, serving the kubelet's
// pod-resources API for fake nodes (kwok). It imports nothing of the collector's: a Node
// is a collector.Source, Attributor and PodDirectory by their methods alone.
package sim

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"io"
	"maps"
	"math"
	"net/http"
	"os"
	"slices"
	"sync"

	"google.golang.org/protobuf/proto"
	"k8s.io/apimachinery/pkg/api/resource"
	"sigs.k8s.io/yaml"

	"github.com/gpuscaler/gpuscaler/collector/attribution"
	"github.com/gpuscaler/gpuscaler/collector/mig"
	gpuscalerv1 "github.com/gpuscaler/gpuscaler/proto/gpuscaler/v1"
)

// Config describes a simulated GPU node: its GPUs, their MIG slices, the pods holding
// them and how busy those pods are. It reads from YAML or JSON:
//
//	gpus: 8
//	model: NVIDIA H100 80GB HBM3
//	mig:                      # GPU index → its slices, in MIG mode
//	  7: [1g.10gb, 1g.10gb, 3g.40gb]
//	pods:
//	  - {namespace: ml, name: llm-0, labels: {app: llm}, ownerKind: Deployment, ownerName: llm, gpus: ["0", "1"], util: 80}
//	  - {namespace: ml, name: tiny-0, labels: {app: tiny}, gpus: ["7/0"]}  # slice 0 of GPU 7
//	util: 50                  # default utilisation of pods that set none
//	jitter: 5                 # ± percent of noise, deterministic with seed
//	replicas: 4               # time-slicing: each whole GPU offered as 4 replicas
//
// Users read every key in examples/simulated-node/README.md, which a test keeps in step
// with these fields.
//
// With replicas above 1, each whole GPU is offered as that many devices "<uuid>::<n>",
// as NVIDIA's device plugin does for time-slicing and MPS; up to that many pods may name
// the same GPU, and it runs at the sum of their utilisations (at most 100%).
type Config struct {
	GPUs      int              `json:"gpus"`
	Model     string           `json:"model,omitempty"`
	MemoryGiB int              `json:"memoryGiB,omitempty"`
	MIG       map[int][]string `json:"mig,omitempty"`
	Pods      []Pod            `json:"pods,omitempty"`
	Util      float64          `json:"util,omitempty"`
	Jitter    float64          `json:"jitter,omitempty"`
	Seed      uint64           `json:"seed,omitempty"`
	// NodeLabels are the simulated node's Kubernetes labels, for capacity nodeSelectors.
	NodeLabels map[string]string `json:"nodeLabels,omitempty"`
	// Unschedulable cordons the simulated node, and Taints taint it (NoSchedule and
	// NoExecute only: the effects that keep a pod off), as its Node would say: capacity
	// leaves out a node the scheduler would place no Job on. On a node whose pods come
	// from the cluster (--sim-from-cluster), the Node object says this instead.
	Unschedulable bool    `json:"unschedulable,omitempty"`
	Taints        []Taint `json:"taints,omitempty"`
	// Replicas shares each whole GPU among up to this many pods (time-slicing); 0 or 1
	// does not share.
	Replicas int `json:"replicas,omitempty"`
	// Resources is the simulated node's CPU and memory, for capacity triggers with
	// cpuPerReplica or memoryPerReplica; nil reports none (unknown). On a node whose pods
	// come from the cluster (--sim-from-cluster), the Node's status.allocatable and its
	// pods' requests say this instead.
	Resources *Resources `json:"resources,omitempty"`
}

// Resources is a simulated node's CPU and memory, as Kubernetes quantities ("192",
// "191500m", "2Ti"): allocatable, and requested by the pods bound to it besides the
// configured pods, whose own cpu and memory add to it (none when empty).
type Resources struct {
	CPU             string `json:"cpu"`
	Memory          string `json:"memory"`
	CPURequested    string `json:"cpuRequested,omitempty"`
	MemoryRequested string `json:"memoryRequested,omitempty"`
}

// report returns r as a NodeReport carries it, or why it cannot.
func (r *Resources) report(pods []Pod) (*gpuscalerv1.NodeResources, error) {
	if r == nil {
		return nil, nil
	}
	type field struct {
		name, q  string
		milli    bool
		optional bool
		sum      int // the index in v it adds to
	}
	fields := []field{
		{"resources.cpu", r.CPU, true, false, 0}, {"resources.memory", r.Memory, false, false, 1},
		{"resources.cpuRequested", r.CPURequested, true, true, 2}, {"resources.memoryRequested", r.MemoryRequested, false, true, 3},
	}
	for i, p := range pods {
		fields = append(fields, field{fmt.Sprintf("pods[%d].cpu", i), p.CPU, true, true, 2}, field{fmt.Sprintf("pods[%d].memory", i), p.Memory, false, true, 3})
	}
	var v [4]int64
	for _, f := range fields {
		if f.q == "" && f.optional {
			continue
		}
		q, err := resource.ParseQuantity(f.q)
		// Bounded here so that the sums cannot overflow; Validate bounds them again.
		if err != nil || q.Sign() < 0 || q.Cmp(*resource.NewQuantity(gpuscalerv1.MaxNodeMemoryBytes, resource.BinarySI)) > 0 {
			return nil, fmt.Errorf("simulation: %s %q: want a Kubernetes quantity, 0 to 1Pi", f.name, f.q)
		}
		n := q.Value()
		if f.milli {
			n = q.MilliValue()
		}
		v[f.sum] += n
	}
	res := &gpuscalerv1.NodeResources{CpuAllocatableMillis: uint64(v[0]), MemoryAllocatableBytes: uint64(v[1]), CpuRequestedMillis: uint64(v[2]), MemoryRequestedBytes: uint64(v[3])}
	if err := (&gpuscalerv1.NodeReport{Node: "node", Resources: res}).Validate(); err != nil {
		return nil, fmt.Errorf("simulation: %w", err)
	}
	return res, nil
}

// Taint is a taint of the simulated node, as a Node's spec.taints holds it.
type Taint struct {
	Key    string `json:"key"`
	Value  string `json:"value,omitempty"`
	Effect string `json:"effect"`
}

// Pod is a simulated pod and the devices it holds: "3" is GPU 3, "7/1" is slice 1 of
// GPU 7 (in MIG mode).
type Pod struct {
	Namespace string            `json:"namespace"`
	Name      string            `json:"name"`
	Container string            `json:"container,omitempty"`
	Labels    map[string]string `json:"labels,omitempty"`
	OwnerKind string            `json:"ownerKind,omitempty"`
	OwnerName string            `json:"ownerName,omitempty"`
	GPUs      []string          `json:"gpus"`
	// Util is this pod's utilisation in percent; nil uses the node's.
	Util *float64 `json:"util,omitempty"`
	// CPU and Memory are the pod's requests, Kubernetes quantities ("8", "64Gi"): they add
	// to the node's cpuRequested and memoryRequested (see Resources). Empty: none.
	CPU    string `json:"cpu,omitempty"`
	Memory string `json:"memory,omitempty"`

	// uid is the pod's real UID, for a pod that comes from the cluster (Cluster);
	// configured pods get a made-up one.
	uid string
}

// LoadConfig reads a Config from a YAML or JSON file.
func LoadConfig(path string) (Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return Config{}, err
	}
	var c Config
	if err := yaml.UnmarshalStrict(data, &c); err != nil {
		return Config{}, fmt.Errorf("simulation config %s: %w", path, err)
	}
	return c, nil
}

// Node is a simulated GPU node: a collector.Source whose readings follow the configured
// load, a collector.Attributor that hands the devices to the configured pods, and a
// collector.PodDirectory that knows them. Its pods and load can change while it runs (SetConfig, or PUT on its
// Handler), which is how the demo moves a workload. It is safe for concurrent use.
type Node struct {
	node string
	mu   sync.Mutex // guards cfg, devices, holders and tick
	cfg  Config
	// devices lists the node's devices in a fixed order, and holders who holds each, in
	// the order of the configuration (replica n of a shared GPU goes to its n-th pod).
	devices []device
	holders map[string][]*Pod
	uids    map[*Pod]string // each configured pod's UID, made once
	tick    uint64
	// fromCluster says the pods come from the cluster (Cluster), not the
	// configuration.
	fromCluster bool
	// resources is what cfg.Resources gives, as reports carry it; nil when unknown.
	// Replaced whole, never changed.
	resources *gpuscalerv1.NodeResources
}

type device struct {
	gpu     int
	slice   int // -1 for a whole GPU
	uuid    string
	id      string // the device plugin id: the GPU UUID, or the MIG device's UUID
	profile string
	memory  uint64 // bytes
}

// New builds a simulated node named node.
func New(node string, cfg Config) (*Node, error) {
	s := &Node{node: node}
	if err := s.SetConfig(cfg); err != nil {
		return nil, err
	}
	return s, nil
}

// SetConfig replaces the node's GPUs, pods and load. On a node whose pods come from the
// cluster (Cluster), the configuration may not name pods, nor change the GPUs the
// kubelet hands out; the cluster's pods are kept.
func (s *Node) SetConfig(cfg Config) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	cfg = cfg.withDefaults()
	if s.fromCluster {
		if len(cfg.Pods) > 0 {
			return fmt.Errorf("simulation: pods come from the cluster (--sim-from-cluster): configure gpus, util, jitter and the rest, not pods")
		}
		old := s.cfg
		if cfg.GPUs != old.GPUs || cfg.Replicas != old.Replicas || cfg.MemoryGiB != old.MemoryGiB || !maps.EqualFunc(cfg.MIG, old.MIG, slices.Equal) {
			return fmt.Errorf("simulation: pods come from the cluster (--sim-from-cluster) and hold this node's devices: gpus, mig, replicas and memoryGiB cannot change while it runs")
		}
		cfg.Pods = old.Pods
	}
	return s.setLocked(cfg)
}

// withDefaults fills in what cfg leaves out.
func (cfg Config) withDefaults() Config {
	if cfg.GPUs <= 0 {
		cfg.GPUs = 8
	}
	if cfg.Model == "" {
		cfg.Model = "Simulated NVIDIA H100 80GB HBM3"
	}
	if cfg.MemoryGiB <= 0 {
		cfg.MemoryGiB = 80
	}
	return cfg
}

// setLocked checks cfg and makes it the node's. s.mu must be held.
func (s *Node) setLocked(cfg Config) error {
	cfg = cfg.withDefaults()
	if cfg.GPUs > gpuscalerv1.MaxGPUs {
		return fmt.Errorf("simulation: %d GPUs, at most %d", cfg.GPUs, gpuscalerv1.MaxGPUs)
	}
	if err := (&gpuscalerv1.NodeReport{Node: s.node, Scheduling: cfg.scheduling()}).Validate(); err != nil {
		return fmt.Errorf("simulation: unschedulable and taints: %w", err)
	}
	resources, err := cfg.Resources.report(cfg.Pods)
	if err != nil {
		return err
	}
	devices := make([]device, 0, cfg.GPUs)
	byName := map[string]int{}
	for i := range cfg.GPUs {
		uuid := uuidOf("GPU", s.node, i, -1)
		slices := cfg.MIG[i]
		if len(slices) == 0 {
			byName[fmt.Sprint(i)] = len(devices)
			devices = append(devices, device{gpu: i, slice: -1, uuid: uuid, id: uuid, memory: uint64(cfg.MemoryGiB) << 30})
			continue
		}
		for k, profile := range slices {
			gb, err := migMemoryGB(profile)
			if err != nil {
				return fmt.Errorf("simulation: GPU %d slice %d: %w", i, k, err)
			}
			byName[fmt.Sprintf("%d/%d", i, k)] = len(devices)
			devices = append(devices, device{gpu: i, slice: k, uuid: uuid, id: uuidOf("MIG", s.node, i, k), profile: profile, memory: uint64(gb) << 30})
		}
	}
	if cfg.Replicas < 0 || cfg.Replicas > gpuscalerv1.MaxPodsPerGPU {
		return fmt.Errorf("simulation: replicas %d: want 0 to %d", cfg.Replicas, gpuscalerv1.MaxPodsPerGPU)
	}
	if n := max(cfg.Replicas, 1) * len(devices); n > gpuscalerv1.MaxDevices {
		return fmt.Errorf("simulation: %d devices with replicas %d, more than a report holds (%d)", n, cfg.Replicas, gpuscalerv1.MaxDevices)
	}
	for g := range cfg.MIG {
		if g < 0 || g >= cfg.GPUs {
			return fmt.Errorf("simulation: MIG slices for GPU %d, which this node of %d GPUs does not have", g, cfg.GPUs)
		}
	}
	holders := map[string][]*Pod{}
	for i := range cfg.Pods {
		p := &cfg.Pods[i]
		if err := gpuscalerv1.ValidateNamespace(p.Namespace); err != nil || p.Name == "" {
			return fmt.Errorf("simulation: pod %q/%q: want a namespace and a name", p.Namespace, p.Name)
		}
		for _, name := range p.GPUs {
			d, ok := byName[name]
			if !ok {
				return fmt.Errorf("simulation: pod %s/%s holds device %q, which this node does not have (want a GPU index, or GPU/slice in MIG mode)", p.Namespace, p.Name, name)
			}
			id := devices[d].id
			others := holders[id]
			switch {
			case slices.Contains(others, p):
				return fmt.Errorf("simulation: pod %s/%s names device %q twice", p.Namespace, p.Name, name)
			case len(others) > 0 && (devices[d].slice >= 0 || cfg.Replicas < 2):
				return fmt.Errorf("simulation: device %q is held by both %s/%s and %s/%s (set replicas to share whole GPUs)", name, others[0].Namespace, others[0].Name, p.Namespace, p.Name)
			case len(others) >= cfg.Replicas && cfg.Replicas >= 2:
				return fmt.Errorf("simulation: GPU %q is shared by more than its %d replicas", name, cfg.Replicas)
			}
			holders[id] = append(others, p)
		}
	}
	uids := make(map[*Pod]string, len(cfg.Pods))
	for i := range cfg.Pods {
		uids[&cfg.Pods[i]] = cmp.Or(cfg.Pods[i].uid, uuidOf("pod", s.node, i, -1))
	}
	s.cfg, s.devices, s.holders, s.uids, s.resources = cfg, devices, holders, uids, resources
	return nil
}

// Labels returns the simulated node's labels, as the Collector's NodeLabels wants them.
func (s *Node) Labels() map[string]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cfg.NodeLabels
}

// Scheduling returns whether the scheduler places pods on the simulated node, as the
// Collector's NodeScheduling wants it: a simulated node always knows.
func (s *Node) Scheduling() *gpuscalerv1.NodeScheduling {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cfg.scheduling()
}

// Resources returns the simulated node's CPU and memory, as the Collector's
// NodeResources wants them: nil when the configuration gives none. The result is not
// changed afterwards: callers must not change it either.
func (s *Node) Resources() *gpuscalerv1.NodeResources {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.resources
}

func (cfg Config) scheduling() *gpuscalerv1.NodeScheduling {
	sch := &gpuscalerv1.NodeScheduling{Unschedulable: cfg.Unschedulable}
	for _, t := range cfg.Taints {
		sch.Taints = append(sch.Taints, &gpuscalerv1.Taint{Key: t.Key, Value: t.Value, Effect: t.Effect})
	}
	return sch
}

// Config returns the current configuration.
func (s *Node) Config() Config {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cfg
}

func (s *Node) Name() string { return "sim" }

// Collect returns each device's readings: a held device runs at its pod's utilisation
// (or the node's) plus deterministic noise, a free one idles.
func (s *Node) Collect(ctx context.Context) ([]*gpuscalerv1.GPUSample, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.tick++
	out := make([]*gpuscalerv1.GPUSample, 0, len(s.devices))
	for _, d := range s.devices {
		util := 0.0
		memShare := 0.01
		if pods := s.holders[d.id]; len(pods) > 0 {
			for _, p := range pods {
				util += s.podUtil(p)
			}
			util = min(100, util)
			memShare = 0.3 + 0.6*util/100
		}
		util = min(100, max(0, util+s.cfg.Jitter*s.noise(d, 0)))
		g := &gpuscalerv1.GPUSample{
			Uuid:               d.uuid,
			Index:              uint32(d.gpu),
			Model:              s.cfg.Model,
			GpuUtil:            proto.Float64(math.Round(util*10) / 10),
			SmActive:           proto.Float64(math.Round(util*8) / 10),
			TensorActive:       proto.Float64(math.Round(util*5) / 10),
			FbUsedBytes:        proto.Uint64(uint64(float64(d.memory) * min(1, max(0, memShare+0.02*s.noise(d, 1))))),
			FbTotalBytes:       proto.Uint64(d.memory),
			PowerWatts:         proto.Float64(math.Round(70 + 6*util)),
			TemperatureCelsius: proto.Float64(math.Round(32 + 0.4*util)),
		}
		if d.slice >= 0 {
			g.MigProfile, g.MigInstanceId, g.DeviceId = d.profile, proto.Uint32(uint32(d.slice+1)), d.id
		}
		out = append(out, g)
	}
	return out, nil
}

// podUtil is a pod's configured utilisation, or the node's. s.mu must be held.
func (s *Node) podUtil(p *Pod) float64 {
	if p.Util != nil {
		return *p.Util
	}
	return s.cfg.Util
}

// PodUsage gives each pod's own utilisation of a shared GPU, as NVML's per-process
// samples would: its configured figure, without noise.
func (s *Node) PodUsage() map[string]map[string]float64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]map[string]float64{}
	for _, d := range s.devices {
		pods := s.holders[d.id]
		if len(pods) < 2 {
			continue
		}
		m := make(map[string]float64, len(pods))
		for _, p := range pods {
			m[s.podUID(p)] = min(100, s.podUtil(p))
		}
		out[d.id] = m
	}
	return out
}

// podUID is a configured pod's UID. s.mu must be held.
func (s *Node) podUID(p *Pod) string { return s.uids[p] }

// noise is a deterministic value in [-1, 1] for a device, a channel and the current tick.
func (s *Node) noise(d device, channel uint64) float64 {
	h := fnv.New64a()
	fmt.Fprintf(h, "%d/%s/%d/%d", s.cfg.Seed, d.id, channel, s.tick)
	return float64(h.Sum64()%20001)/10000 - 1
}

// Allocation hands the devices to the configured pods, as a kubelet would report it.
func (s *Node) Allocation(ctx context.Context) (*attribution.Allocation, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	a := &attribution.Allocation{Holders: map[string][]attribution.Holder{}}
	for _, d := range s.devices {
		pods := s.holders[d.id]
		for n, o := range s.offersOf(d) {
			dev := &gpuscalerv1.Device{Id: o.id, Resource: o.resource, MigProfile: d.profile}
			a.Allocatable = append(a.Allocatable, dev)
			if n >= len(pods) {
				continue
			}
			p := pods[n]
			a.Allocated = append(a.Allocated, dev)
			container := p.Container
			if container == "" {
				container = "main"
			}
			a.Holders[dev.Id] = []attribution.Holder{{Namespace: p.Namespace, Pod: p.Name, Container: container}}
		}
	}
	return a, nil
}

// offersOf lists what the device plugin offers of d: the device, or with time-slicing
// (replicas above 1) each of its replicas. s.mu must be held.
func (s *Node) offersOf(d device) []offer {
	o := offer{id: d.id, resource: "nvidia.com/gpu", device: fmt.Sprint(d.gpu), gpu: d.gpu}
	if d.profile != "" {
		o.resource, o.device = mig.ResourcePrefix+d.profile, fmt.Sprintf("%d/%d", d.gpu, d.slice)
	}
	if d.slice >= 0 || s.cfg.Replicas < 2 {
		return []offer{o}
	}
	out := make([]offer, s.cfg.Replicas)
	for n := range out {
		out[n] = o
		// NVIDIA/k8s-device-plugin internal/rm/devices.go NewAnnotatedID.
		out[n].id = fmt.Sprintf("%s::%d", d.id, n)
	}
	return out
}

// offers lists every device the simulated device plugin offers.
func (s *Node) offers() []offer {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []offer
	for _, d := range s.devices {
		out = append(out, s.offersOf(d)...)
	}
	return out
}

// setClusterPods makes pods, which come from the cluster (Cluster), the node's pods.
func (s *Node) setClusterPods(pods []Pod) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	cfg := s.cfg
	cfg.Pods = pods
	return s.setLocked(cfg)
}

// Pod returns a configured pod's labels and owner.
func (s *Node) Pod(namespace, name string) (attribution.PodInfo, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	i := slices.IndexFunc(s.cfg.Pods, func(p Pod) bool { return p.Namespace == namespace && p.Name == name })
	if i < 0 {
		return attribution.PodInfo{}, false
	}
	p := s.cfg.Pods[i]
	return attribution.PodInfo{UID: s.podUID(&s.cfg.Pods[i]), Labels: p.Labels, OwnerKind: p.OwnerKind, OwnerName: p.OwnerName}, true
}

// Close does nothing: the simulation holds nothing.
func (s *Node) Close() error { return nil }

// Handler serves the configuration: GET returns it as JSON, PUT replaces it with the
// YAML or JSON in the body (a bad one changes nothing and answers 400 with the reason).
func (s *Node) Handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.Method {
		case http.MethodGet:
			w.Header().Set("Content-Type", "application/json")
			_ = json.NewEncoder(w).Encode(s.Config())
		case http.MethodPut:
			data, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			var c Config
			if err := yaml.UnmarshalStrict(data, &c); err != nil {
				http.Error(w, "simulation config: "+err.Error(), http.StatusBadRequest)
				return
			}
			if err := s.SetConfig(c); err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			w.WriteHeader(http.StatusNoContent)
		default:
			w.Header().Set("Allow", "GET, PUT")
			http.Error(w, "GET or PUT", http.StatusMethodNotAllowed)
		}
	})
}

// uuidOf makes a stable UUID-shaped id for a simulated device.
func uuidOf(prefix, node string, gpu, slice int) string {
	h := fnv.New128a()
	fmt.Fprintf(h, "%s/%d/%d", node, gpu, slice)
	b := h.Sum(nil)
	return fmt.Sprintf("%s-%x-%x-%x-%x-%x", prefix, b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

// migMemoryGB reads the memory of a MIG profile name: 10 for "1g.10gb", "1c.3g.40gb"
// or "1g.10gb+me".
func migMemoryGB(profile string) (int, error) {
	var slices, gb int
	p := profile
	if i := len(p) - len("+me"); i > 0 && p[i:] == "+me" {
		p = p[:i]
	}
	if _, err := fmt.Sscanf(p, "%dg.%dgb", &slices, &gb); err != nil {
		var c int
		if _, err := fmt.Sscanf(p, "%dc.%dg.%dgb", &c, &slices, &gb); err != nil {
			return 0, fmt.Errorf("MIG profile %q: want a name such as 1g.10gb", profile)
		}
	}
	if slices <= 0 || gb <= 0 {
		return 0, fmt.Errorf("MIG profile %q: want a name such as 1g.10gb", profile)
	}
	return gb, nil
}
