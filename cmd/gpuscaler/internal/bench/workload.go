package bench

import (
	"fmt"
	"math/rand/v2"
	"strconv"

	"google.golang.org/protobuf/proto"

	pb "github.com/gpuscaler/gpuscaler/proto/externalscaler"
	gpuscalerv1 "github.com/gpuscaler/gpuscaler/proto/gpuscaler/v1"
	"github.com/gpuscaler/gpuscaler/scaler"
)

// BigNamespace is the namespace whose pods hold Config.BigNamespaceGPUs GPUs.
const BigNamespace = "bench-big"

// Label keys of the big namespace's pods, beside "app" and "pod-template-hash".
const (
	labelComponent = "app.kubernetes.io/component"
	labelTeam      = "team"
)

// bigAppSizes are the GPUs one app of the big namespace holds, drawn uniformly: from a pair
// of inference replicas to a 64-GPU training run, about 20 on average, so 7,000 GPUs make
// some 350 apps.
var bigAppSizes = []int{2, 4, 4, 8, 8, 8, 16, 16, 24, 32, 48, 64}

// bigApp is one workload of the big namespace.
type bigApp struct {
	name      string
	team      string
	component string // "inference" or "training"
	gpus      int
}

// workload is the simulated cluster: who holds which GPU, and the triggers read against
// it. Every GPU but the last of each node is held by a pod. Without a big namespace the
// held GPUs go round-robin to 100 apps over 50 namespaces (bench-ns-00 to -49), one GPU
// per app and node. With one, whole nodes spread evenly over the cluster (one in ten at
// 10,000 nodes and 7,000 GPUs) are given to BigNamespace, where apps of bigAppSizes GPUs
// fill them in turn, a pod per app and node holding that app's GPUs on the node, as
// multi-GPU pods do; the other nodes keep the round-robin.
type workload struct {
	cfg  Config
	apps []bigApp
	// bigGPUs[i] is how many of node i's held GPUs belong to the big namespace.
	bigGPUs []int
}

// heldPerNode is how many GPUs of a node pods hold: all but one, which stays free.
func heldPerNode(cfg Config) int { return max(cfg.GPUsPerNode-1, 0) }

// newWorkload lays the cluster out. It fails when the nodes' pods hold fewer GPUs than the
// big namespace should.
func newWorkload(cfg Config) (*workload, error) {
	w := &workload{cfg: cfg, bigGPUs: make([]int, cfg.Nodes)}
	b, held := cfg.BigNamespaceGPUs, heldPerNode(cfg)
	if b <= 0 {
		return w, nil
	}
	if b > cfg.Nodes*held {
		return nil, fmt.Errorf("a namespace of %d GPUs: the %d nodes' pods hold only %d (%d GPUs a node, one free)",
			b, cfg.Nodes, cfg.Nodes*held, cfg.GPUsPerNode)
	}
	bigNodes := (b + held - 1) / held
	stride := cfg.Nodes / bigNodes
	for k := range bigNodes {
		w.bigGPUs[k*stride] = min(held, b-k*held)
	}
	rng := rand.New(rand.NewPCG(cfg.Seed, 1))
	for sum := 0; sum < b; {
		k := len(w.apps)
		a := bigApp{team: fmt.Sprintf("team-%02d", k%12), component: "inference", gpus: bigAppSizes[rng.IntN(len(bigAppSizes))]}
		prefix := "serve"
		if k%5 == 0 { // independent of the team (k%12), so every team runs both kinds
			a.component, prefix = "training", "train"
		}
		a.name = fmt.Sprintf("%s-%03d", prefix, k)
		a.gpus = min(a.gpus, b-sum)
		sum += a.gpus
		w.apps = append(w.apps, a)
	}
	return w, nil
}

// node is one simulated node's report, marshalled once.
type node struct {
	subject string
	data    []byte
}

// nodeReports builds every node's report: realistic GPU readings, seven GPUs in eight
// held by pods with a few labels each.
func (w *workload) nodeReports() []node {
	cfg := w.cfg
	rng := rand.New(rand.NewPCG(cfg.Seed, 0))
	out := make([]node, cfg.Nodes)
	cur, curLeft := 0, 0 // the big namespace's app being placed, and its GPUs still to place
	if len(w.apps) > 0 {
		curLeft = w.apps[0].gpus
	}
	for i := range out {
		out[i] = w.nodeReport(i, rng, func(g int) *gpuscalerv1.PodRef {
			if g >= w.bigGPUs[i] {
				return smallPod(cfg, i, g)
			}
			if curLeft == 0 {
				cur++
				curLeft = w.apps[cur].gpus
			}
			curLeft--
			a := w.apps[cur]
			return &gpuscalerv1.PodRef{
				Namespace: BigNamespace, Name: fmt.Sprintf("%s-%05d", a.name, i), Container: "main",
				Labels:    map[string]string{"app": a.name, labelTeam: a.team, labelComponent: a.component, "pod-template-hash": fmt.Sprintf("%08x", uint32(cur)*2654435761)},
				OwnerKind: map[string]string{"inference": "Deployment", "training": "Job"}[a.component], OwnerName: a.name,
			}
		})
	}
	return out
}

// moreNodeReports builds the reports of nodes from to to-1, beyond the workload's
// cfg.Nodes: nodes laid out as the round-robin ones, as a larger --nodes would have them
// (the big namespace is filled within the first cfg.Nodes).
func (w *workload) moreNodeReports(from, to int) []node {
	rng := rand.New(rand.NewPCG(w.cfg.Seed, uint64(from)))
	out := make([]node, 0, max(to-from, 0))
	for i := from; i < to; i++ {
		out = append(out, w.nodeReport(i, rng, func(g int) *gpuscalerv1.PodRef { return smallPod(w.cfg, i, g) }))
	}
	return out
}

// nodeReport builds node i's report, its held GPUs' pods given by pod.
func (w *workload) nodeReport(i int, rng *rand.Rand, pod func(g int) *gpuscalerv1.PodRef) node {
	cfg := w.cfg
	r := &gpuscalerv1.NodeReport{Node: fmt.Sprintf("bench-node-%05d", i), Source: "sim", CollectorId: "bench", Sequence: 1}
	for g := range cfg.GPUsPerNode {
		uuid := fmt.Sprintf("GPU-%08x-%04x", i, g)
		s := &gpuscalerv1.GPUSample{
			Uuid: uuid, Index: uint32(g), Model: "NVIDIA H100 80GB HBM3",
			GpuUtil: proto.Float64(float64(rng.IntN(101))), SmActive: proto.Float64(float64(rng.IntN(101))),
			TensorActive: proto.Float64(float64(rng.IntN(101))),
			FbUsedBytes:  proto.Uint64(uint64(rng.IntN(80)) << 30), FbTotalBytes: proto.Uint64(80 << 30),
			PowerWatts: proto.Float64(300 + float64(rng.IntN(400))), TemperatureCelsius: proto.Float64(40 + float64(rng.IntN(40))),
		}
		r.Allocatable = append(r.Allocatable, &gpuscalerv1.Device{Id: uuid, Resource: "nvidia.com/gpu"})
		if g < cfg.GPUsPerNode-1 { // the last GPU of a node stays free
			s.Pod = pod(g)
			r.Allocated = append(r.Allocated, &gpuscalerv1.Device{Id: uuid, Resource: "nvidia.com/gpu"})
		}
		r.Gpus = append(r.Gpus, s)
	}
	subject, _ := gpuscalerv1.NodeSubject(r.GetNode())
	data, _ := proto.Marshal(r)
	return node{subject, data}
}

// smallPod is the pod of the round-robin layout holding GPU g of node i: one of 100 apps
// over 50 namespaces.
func smallPod(cfg Config, i, g int) *gpuscalerv1.PodRef {
	app := (i*cfg.GPUsPerNode + g) % 100
	return &gpuscalerv1.PodRef{
		Namespace: fmt.Sprintf("bench-ns-%02d", app%50), Name: fmt.Sprintf("svc-%02d-%05d", app, i), Container: "main",
		Labels:    map[string]string{"app": fmt.Sprintf("svc-%02d", app), "tier": "gpu", "pod-template-hash": "7d4b9c8f6"},
		OwnerKind: "Deployment", OwnerName: fmt.Sprintf("svc-%02d", app),
	}
}

// Kinds of trigger, for the GetMetrics figures.
const (
	kindQueue    = iota // a queue trigger
	kindGPU             // a podSelector trigger in one of the 50 small namespaces
	kindGPUBig          // a podSelector trigger in the big namespace
	triggerKinds        // how many kinds there are
)

// trigger is one ScaledObject trigger the bench reads, as KEDA would send it.
type trigger struct {
	kind   int
	ref    *pb.ScaledObjectRef
	metric string
	// queue and waiting are a queue trigger's queue and the backlog its producer reports.
	queue   string
	waiting uint64
}

// triggers returns cfg.Triggers triggers: even ones are queue triggers, each with its
// own queue; odd ones podSelector GPU triggers. Without a big namespace those select one
// app of the 50 small namespaces. With one, every other podSelector trigger reads the big
// namespace instead, selecting in turn one app (app=), one app and its component, two
// apps (app in (…)), or a team's whole share (team=…,component notin (batch)): about a
// quarter of all reads walk the big namespace.
func (w *workload) triggers() []trigger {
	out := make([]trigger, w.cfg.Triggers)
	for i := range out {
		name := "so-" + strconv.Itoa(i)
		if i%2 == 0 {
			q := "metric-" + strconv.Itoa(i)
			out[i] = trigger{kind: kindQueue, ref: queueRef(name, q), metric: scaler.MetricQueueBacklog, queue: q, waiting: uint64(i)}
			continue
		}
		t := trigger{kind: kindGPU, metric: scaler.MetricGPUUtil}
		ns := ""
		var selector string
		if k := i / 2; len(w.apps) > 0 && k%2 == 0 {
			j := k / 2
			a, next := w.apps[j%len(w.apps)], w.apps[(j+1)%len(w.apps)]
			t.kind, ns = kindGPUBig, BigNamespace
			switch (j + j/len(w.apps)) % 4 {
			case 0:
				selector = "app=" + a.name
			case 1:
				selector = "app=" + a.name + "," + labelComponent + "=" + a.component
			case 2:
				selector = "app in (" + a.name + "," + next.name + ")"
			default:
				selector = labelTeam + "=" + a.team + "," + labelComponent + " notin (batch)"
			}
		} else {
			app := i % 100
			ns = fmt.Sprintf("bench-ns-%02d", app%50)
			selector = fmt.Sprintf("app=svc-%02d,tier=gpu", app)
		}
		t.ref = &pb.ScaledObjectRef{Name: name, Namespace: ns, ScalerMetadata: map[string]string{
			"scalerAddress": "bench", scaler.KeyPodSelector: selector, scaler.KeyGPUUtilTarget: "60"}}
		out[i] = t
	}
	return out
}

// queueNamespace holds every queue of the bench.
const queueNamespace = "bench-q"

// queueReport marshals a QueueReport for namespace bench-q.
func queueReport(queue string, waiting uint64) (string, []byte) {
	subject, _ := gpuscalerv1.QueueSubject(queueNamespace, queue, "bench")
	data, _ := proto.Marshal(&gpuscalerv1.QueueReport{Namespace: queueNamespace, Queue: queue, Waiting: waiting, ProducerId: "bench"})
	return subject, data
}

func queueRef(name, queue string) *pb.ScaledObjectRef {
	return &pb.ScaledObjectRef{Name: name, Namespace: queueNamespace, ScalerMetadata: map[string]string{"scalerAddress": "bench", scaler.KeyQueue: queue}}
}
