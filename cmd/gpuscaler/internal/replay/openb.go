package replay

import (
	"cmp"
	"container/heap"
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/gpuscaler/gpuscaler/cmd/gpuscaler/internal/inference"
	"github.com/gpuscaler/gpuscaler/cmd/gpuscaler/internal/kedarules"
	"github.com/gpuscaler/gpuscaler/cmd/gpuscaler/internal/traces"
	"github.com/gpuscaler/gpuscaler/collector"
	"github.com/gpuscaler/gpuscaler/collector/sim"
	pb "github.com/gpuscaler/gpuscaler/proto/externalscaler"
	gpuscalerv1 "github.com/gpuscaler/gpuscaler/proto/gpuscaler/v1"
	"github.com/gpuscaler/gpuscaler/scaler"
)

// The openb scenario replays Alibaba's openb GPU-cluster trace (internal/traces,
// ReadOpenBPods and ReadOpenBNodes) as queue-driven batch Jobs: every GPU task of the
// trace is an item put on a queue at its creation time, KEDA ScaledJobs create Jobs for
// the queues' backlog, and the cluster's scheduler places each Job's Pod on the trace's
// nodes. The Pod takes the head item of its queue when it starts and runs for that task's
// real run time. It answers what a ScaledJob user asks: how long Jobs wait, how many Pods
// sit Pending and for how many GPU-hours, and how much of the cluster is allocated, for a
// plain ScaledJob against one with capacityAware.
//
// Everything the scaler sees is built by the product's own parts and goes through its own
// decision code: NodeReports by a collector.Collector over a collector/sim Node that holds the
// node's Pods (encoded and decoded as the scaler's NATS follower decodes them),
// QueueReports as the producer API (queue) fills them, a scaler.State on the
// replay's virtual clock, and KEDA's questions (GetMetricSpec, IsActive, GetMetrics) asked
// of scaler.NewLocalServer. KEDA's rule for the Jobs to create is kedarules.JobsToCreate.

// Defaults of OpenBConfig: KEDA's defaults for a ScaledJob.
const (
	DefaultOpenBPollingInterval = 30 * time.Second
	DefaultOpenBMaxReplicaCount = 100
)

// DefaultOpenBNodes is the number of the trace's nodes OpenBConfig.Nodes replays on by
// default: an evenly spaced sample of 12 nodes, with 56 GPUs (five 8-GPU G2 nodes, a
// 4-GPU and four 2-GPU T4 nodes, two 2-GPU P100 nodes). On all 1,213 nodes (6,212 GPUs)
// the trace never runs short of GPUs, so no policy can make a difference there: the trace
// is a sample of the cluster's tasks (its authors replay it by packing tasks, not by their
// times), and by its own times at most 71 of its GPUs are in use at once. On the sample
// the peaks outgrow the cluster (56 GPUs, 79% of that peak), so Pods would go Pending,
// while the median task still waits no longer than a poll.
const DefaultOpenBNodes = 12

// OpenBConfig configures the openb replay. The zero value replays every GPU task on
// DefaultOpenBNodes nodes with KEDA's defaults.
type OpenBConfig struct {
	// PollingInterval is the ScaledJobs' pollingInterval [DefaultOpenBPollingInterval].
	PollingInterval time.Duration
	// MaxReplicaCount is the ScaledJobs' maxReplicaCount: the most Jobs of one ScaledJob
	// not finished at once [DefaultOpenBMaxReplicaCount].
	MaxReplicaCount int
	// Seed draws each ScaledJob's polling phase: KEDA starts a ScaledJob's polling loop
	// when it reconciles it, at no particular moment. The same seed gives the same result.
	Seed uint64
	// Limit replays only the first Limit replayable GPU tasks, by creation time (0: all).
	Limit int
	// Nodes replays on an evenly spaced sample of this many of the trace's n GPU nodes, in
	// the file's order: nodes i·n/Nodes for i from 0 [DefaultOpenBNodes]. n or more
	// replays on every node.
	Nodes int
	// Progress, when set, is told the tasks finished over both policies and their total,
	// now and then and at the end. Calls never overlap; done only grows.
	Progress func(done, total int)
}

func (c OpenBConfig) withDefaults() (OpenBConfig, error) {
	switch {
	case c.PollingInterval < 0:
		return c, fmt.Errorf("openb: polling interval %s: want a positive duration, or 0 for %s", c.PollingInterval, DefaultOpenBPollingInterval)
	case c.PollingInterval == 0:
		c.PollingInterval = DefaultOpenBPollingInterval
	}
	switch {
	case c.MaxReplicaCount < 0:
		return c, fmt.Errorf("openb: maxReplicaCount %d: want a positive number, or 0 for %d", c.MaxReplicaCount, DefaultOpenBMaxReplicaCount)
	case c.MaxReplicaCount == 0:
		c.MaxReplicaCount = DefaultOpenBMaxReplicaCount
	}
	if c.Limit < 0 {
		return c, fmt.Errorf("openb: limit %d: want a number of tasks, or 0 for all", c.Limit)
	}
	switch {
	case c.Nodes < 0:
		return c, fmt.Errorf("openb: nodes %d: want a number of nodes, or 0 for %d", c.Nodes, DefaultOpenBNodes)
	case c.Nodes == 0:
		c.Nodes = DefaultOpenBNodes
	}
	return c, nil
}

// OpenBResult is what the openb replay measured, one OpenBPolicy per policy, all on the
// same tasks and nodes.
type OpenBResult struct {
	// Jobs is the number of tasks replayed.
	Jobs int `json:"jobs"`
	// Nodes and GPUs are the replayed cluster's.
	Nodes int `json:"nodes"`
	GPUs  int `json:"gpus"`
	// Span runs from the first replayed task's creation to the last Job's end under
	// whichever policy ends last: every policy's GPU allocation is over this one span.
	Span time.Duration `json:"span_ns"`
	// Skipped counts, by reason, the tasks created before the last replayed one that were
	// not replayed: "cpu_only" (num_gpu 0), "never_scheduled" (no scheduled_time, so no
	// run time: the trace's Pending tasks), "no_node_fits" (more GPUs of the models it
	// allows than any replayed node has).
	Skipped map[string]int `json:"skipped"`
	// Policies holds gpuscaler-backlog (a plain ScaledJob) and gpuscaler (capacityAware),
	// in that order.
	Policies []OpenBPolicy `json:"policies"`
}

// OpenBPolicy is one policy's figures. Times are in seconds, GPU-hours in hours of one GPU.
type OpenBPolicy struct {
	Name          string `json:"name"`
	CapacityAware bool   `json:"capacity_aware"`
	// Jobs is the number of Jobs KEDA created.
	Jobs int `json:"jobs"`
	// EmptyJobs counts Jobs whose Pod found its queue empty when it started and exited at
	// once, holding its GPUs for no time.
	EmptyJobs int `json:"empty_jobs"`
	// JobWait… are the time from a task's creation (put on its queue) to the start of the
	// Pod that took it: p50, p99 (nearest rank) and mean.
	JobWaitP50  float64 `json:"job_wait_p50_s"`
	JobWaitP99  float64 `json:"job_wait_p99_s"`
	JobWaitMean float64 `json:"job_wait_mean_s"`
	// PendingJobsMax is the most Pods Pending at once: created, not placed for want of
	// free GPUs.
	PendingJobsMax int `json:"pending_jobs_max"`
	// PendingGPUHours sums, over Pods, the GPUs each asked for times the time it was
	// Pending: what a cluster autoscaler would be asked to add, and the quota held by
	// Pods that do nothing.
	PendingGPUHours float64 `json:"pending_gpu_hours"`
	// GPUHours is what the Jobs held: GPUs times the time from their Pod's start to its end.
	GPUHours float64 `json:"gpu_hours"`
	// GPUAllocation is GPUHours over the replayed cluster's GPUs times the result's Span.
	GPUAllocation float64 `json:"gpu_allocation"`
	// Timeline is the queues' and Pods' counts over time, for a chart, at most
	// openBTimelinePoints points.
	Timeline []OpenBPoint `json:"-"`
}

// OpenBPoint is the counts at a time in the replay, summed over the queues. A Timeline
// keeps a point whenever a count changed; when that makes more than openBTimelinePoints,
// it is cut into that many equal stretches of time, and each stretch keeps one point
// holding the most of each count within it, at the time of its first change.
type OpenBPoint struct {
	// At is the time since the trace's start.
	At time.Duration
	// Waiting counts the items no Pod has taken; Running the Pods running; Pending the Pods
	// waiting for GPUs.
	Waiting, Running, Pending int
}

// openBTimelinePoints bounds a Timeline: about the pixels across a chart.
const openBTimelinePoints = 2000

// Names the replay gives what it models.
const (
	openBNamespace  = "openb"
	openBModelLabel = "gpu-model" // node label: the trace's GPU model
	openBProducer   = "replay-openb"
)

// openBEpoch anchors the trace's times, which count from its start, on the scaler's clock.
// Any time would do; the scaler only compares times.
var openBEpoch = time.Date(2023, time.January, 1, 0, 0, 0, 0, time.UTC)

// openBPolicies are the policies compared, in the order of OpenBResult.Policies.
var openBPolicies = []struct {
	name          string
	capacityAware bool
}{{"gpuscaler-backlog", false}, {"gpuscaler", true}}

// OpenB replays the GPU tasks of pods on nodes (as ReadOpenBPods and ReadOpenBNodes read
// them) under each policy, and measures what each costs and makes users wait.
//
// The model, and why:
//   - A ScaledJob's Pods request nvidia.com/gpu, which the device plugin hands out in whole
//     GPUs: a task that shares a GPU in the trace (gpu_milli < 1000) takes one whole GPU
//     here. A Job needs num_gpu GPUs on one node.
//   - One queue and one ScaledJob per distinct (num_gpu, gpu_spec), the same for both
//     policies: capacityAware needs gpusPerReplica, and a ScaledJob has one; a task with a
//     gpu_spec may only run on nodes of those models, so its ScaledJob's capacityAware
//     trigger counts free GPUs on those nodes alone (nodeSelector "gpu-model in (…)", the
//     node label a collector reports from the node list's model). Its Pods carry the same
//     constraint as a node affinity. Every trigger has queueTarget 1: a Job per task.
//   - Polls: each ScaledJob is polled every PollingInterval, at a phase drawn from Seed.
//     A poll asks the scaler GetMetricSpec, IsActive and GetMetrics, and creates
//     kedarules.JobsToCreate Jobs. Polls at which the queue has nothing waiting are not
//     made: then the backlog is the items in flight, each held by a Job not finished, so
//     KEDA's rule creates nothing, whatever the scaler answers.
//   - Scheduler: a new Pod is placed at once if it fits, else it waits Pending. Pending
//     Pods are placed in creation order, each on the lowest-numbered node of an allowed
//     model with num_gpu free GPUs, whenever GPUs are freed; one that does not fit does not
//     hold up those behind it, as kube-scheduler's queue does not.
//   - A Pod that starts takes the head item of its queue and runs for that task's run time
//     in the trace (deletion_time − scheduled_time; a task still running when the trace
//     ended runs to the trace's end), then frees its GPUs. A Pod that finds its queue
//     empty exits at once (OpenBPolicy.EmptyJobs). Containers start at once.
//   - Reports: a node's collector report is applied the moment its Pods change, and a
//     queue's report the moment its counts change (both report within a second in a
//     cluster). Neither says anything new in between, so the replay skips their
//     one-second heartbeats; instead, just before a read, it re-applies every last report
//     the read looks at that is within a second of staleAfter old: the queue's before each
//     poll, and every node's before a capacityAware poll (a plain trigger reads no node).
//     So the scaler never finds a report stale, as in a healthy cluster. A re-applied
//     report is the last one again; a real heartbeat would carry a new sequence number
//     and fresh utilisation samples, which the scaler's answers here do not read. The
//     triggers' staleAfter could not outlast the replay (the scaler takes at most
//     scaler.DefaultStreamMaxAge, 15m), so they set that most: no answer depends on it,
//     and at the default 30s nearly every poll would need all 1,213 nodes' heartbeats.
//   - At one instant, Jobs finishing come first, then Pending Pods placed on the GPUs they
//     freed, then tasks arriving, then polls, ScaledJob by ScaledJob, each followed by
//     placing the Pods it created.
//
// The policies run concurrently, each on its own State. The result depends only on the
// input and the config: the same input and Seed give the same result.
func OpenB(ctx context.Context, pods []traces.OpenBPod, nodes []traces.OpenBNode, cfg OpenBConfig) (*OpenBResult, error) {
	in, err := newOpenBInput(pods, nodes, cfg)
	if err != nil {
		return nil, err
	}
	res, _, err := in.replay(ctx)
	return res, err
}

// openBInput is what both policies replay: the cluster, the tasks and the ScaledJobs.
type openBInput struct {
	cfg     OpenBConfig
	nodes   []traces.OpenBNode // GPU nodes replayed, in the file's order
	models  []string           // the nodes' models, sorted
	tasks   []openBTask        // by creation
	groups  []openBGroupSpec   // by name
	phases  []time.Duration    // each group's polling phase
	start   time.Duration      // the first task's creation
	skipped map[string]int     // as OpenBResult.Skipped
	// pollAlways makes every poll, also those at which nothing waits, until every task is
	// done: tests check that skipping those changes nothing.
	pollAlways bool
}

type openBTask struct {
	name    string
	gpus    int
	created time.Duration
	run     time.Duration
	group   int // index in openBInput.groups
}

// openBGroupSpec is one queue and the ScaledJob that drains it: the tasks of one num_gpu
// and one gpu_spec.
type openBGroupSpec struct {
	name   string   // the queue's and the ScaledJob's name
	gpus   int      // GPUs per Job
	models []string // models the Jobs may run on; nil: any
}

// replay runs every policy on in, concurrently, and returns the result and each policy's
// record of what happened, for tests.
func (in *openBInput) replay(ctx context.Context) (*OpenBResult, []*openBRecord, error) {
	progress := newProgress(in.cfg.Progress, len(openBPolicies)*len(in.tasks))
	runs := make([]*openBRun, len(openBPolicies))
	g, gctx := errgroup.WithContext(ctx)
	for i, p := range openBPolicies {
		g.Go(func() error {
			r, err := newOpenBRun(gctx, in, p.capacityAware, progress)
			if err != nil {
				return fmt.Errorf("openb %s: %w", p.name, err)
			}
			if err := r.run(gctx); err != nil {
				return fmt.Errorf("openb %s: %w", p.name, err)
			}
			runs[i] = r
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return nil, nil, err
	}
	progress.finish()

	res := &OpenBResult{Jobs: len(in.tasks), Nodes: len(in.nodes), Skipped: in.skipped}
	for _, n := range in.nodes {
		res.GPUs += n.GPUs
	}
	end := in.start
	for _, r := range runs {
		end = max(end, r.rec.end)
	}
	res.Span = end - in.start
	records := make([]*openBRecord, len(runs))
	for i, r := range runs {
		res.Policies = append(res.Policies, r.summary(openBPolicies[i].name, res.GPUs, res.Span))
		records[i] = r.rec
	}
	return res, records, nil
}

// newOpenBInput picks the nodes and tasks to replay and groups the tasks into queues.
func newOpenBInput(pods []traces.OpenBPod, nodes []traces.OpenBNode, cfg OpenBConfig) (*openBInput, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	in := &openBInput{cfg: cfg}
	var gpuNodes []traces.OpenBNode
	for _, n := range nodes {
		if n.GPUs > 0 {
			gpuNodes = append(gpuNodes, n)
		}
	}
	if cfg.Nodes > 0 && cfg.Nodes < len(gpuNodes) {
		for i := range cfg.Nodes {
			in.nodes = append(in.nodes, gpuNodes[i*len(gpuNodes)/cfg.Nodes])
		}
	} else {
		in.nodes = gpuNodes
	}
	if len(in.nodes) == 0 {
		return nil, errors.New("openb: no node with GPUs to replay on")
	}
	mostGPUs := map[string]int{} // model → the most GPUs of one node
	for _, n := range in.nodes {
		if _, ok := mostGPUs[n.Model]; !ok {
			in.models = append(in.models, n.Model)
		}
		mostGPUs[n.Model] = max(mostGPUs[n.Model], n.GPUs)
	}
	slices.Sort(in.models)

	order := make([]int, len(pods)) // pods by creation, stably: the caller's slice may not be
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(pods[a].Created, pods[b].Created) })
	skipped := map[string]int{"cpu_only": 0, "never_scheduled": 0, "no_node_fits": 0}
	groupOf := map[string]int{}
	for _, i := range order {
		if cfg.Limit > 0 && len(in.tasks) == cfg.Limit {
			break
		}
		p := &pods[i]
		run, scheduled := p.RunTime()
		models := p.GPUModels()
		switch {
		case p.NumGPU <= 0:
			skipped["cpu_only"]++
			continue
		case !scheduled || run < 0:
			skipped["never_scheduled"]++
			continue
		case !fitsSomeNode(p.NumGPU, models, mostGPUs):
			skipped["no_node_fits"]++
			continue
		}
		key := fmt.Sprint(p.NumGPU, models)
		g, ok := groupOf[key]
		if !ok {
			spec := openBGroupSpec{name: openBGroupName(p.NumGPU, models), gpus: p.NumGPU, models: models}
			if k := slices.IndexFunc(in.groups, func(o openBGroupSpec) bool { return o.name == spec.name }); k >= 0 {
				return nil, fmt.Errorf("openb: task %s: GPU models %q and %q make the same queue name %s", p.Name, models, in.groups[k].models, spec.name)
			}
			g = len(in.groups)
			groupOf[key] = g
			in.groups = append(in.groups, spec)
		}
		in.tasks = append(in.tasks, openBTask{name: p.Name, gpus: p.NumGPU, created: p.Created, run: run, group: g})
	}
	if len(in.tasks) == 0 {
		return nil, fmt.Errorf("openb: no GPU task to replay among %d tasks (skipped: %v)", len(pods), skipped)
	}
	// Groups by name, so their order, and the phases drawn for them, do not depend on
	// which task came first.
	byName := slices.Clone(in.groups)
	slices.SortFunc(byName, func(a, b openBGroupSpec) int { return cmp.Compare(a.name, b.name) })
	for i := range in.tasks {
		in.tasks[i].group = slices.IndexFunc(byName, func(g openBGroupSpec) bool { return g.name == in.groups[in.tasks[i].group].name })
	}
	in.groups = byName
	rng := rand.New(rand.NewPCG(cfg.Seed, 0x6f70656e62)) // "openb"
	// Phases in whole milliseconds, for readable waits.
	for range in.groups {
		in.phases = append(in.phases, time.Duration(rng.Int64N(max(cfg.PollingInterval.Milliseconds(), 1)))*time.Millisecond)
	}
	in.start = in.tasks[0].created
	in.skipped = skipped
	return in, nil
}

// fitsSomeNode reports whether a node of one of models (any, when nil) has gpus GPUs.
func fitsSomeNode(gpus int, models []string, mostGPUs map[string]int) bool {
	if models == nil {
		for _, n := range mostGPUs {
			if n >= gpus {
				return true
			}
		}
		return false
	}
	for _, m := range models {
		if mostGPUs[m] >= gpus {
			return true
		}
	}
	return false
}

// openBGroupName names the queue and ScaledJob of tasks of gpus GPUs on models:
// "openb-gpu1", "openb-gpu2-v100m16-v100m32".
func openBGroupName(gpus int, models []string) string {
	name := "openb-gpu" + strconv.Itoa(gpus)
	for _, m := range models {
		name += "-" + strings.ToLower(m)
	}
	return name
}

// trigger is the ScaledJob's trigger metadata under a policy.
func (g openBGroupSpec) trigger(capacityAware bool) map[string]string {
	md := map[string]string{
		scaler.KeyQueue:       g.name,
		scaler.KeyQueueTarget: "1",
		scaler.KeyStaleAfter:  scaler.DefaultStreamMaxAge.String(),
	}
	if capacityAware {
		md[scaler.KeyCapacityAware] = "true"
		md[scaler.KeyGPUsPerReplica] = strconv.Itoa(g.gpus)
		if g.models != nil {
			md[scaler.KeyNodeSelector] = openBModelLabel + " in (" + strings.Join(g.models, ",") + ")"
		}
	}
	return md
}

// openBRecord is what happened in one policy's replay, for tests to check.
type openBRecord struct {
	jobs []*openBJob // every Job, in creation order
	// heldGPUSeconds integrates the GPUs held over time, as the nodes' bookkeeping counts
	// them (not the Jobs').
	heldGPUSeconds float64
	end            time.Duration // when the last Job ended
}

// openBJob is one Job and its Pod.
type openBJob struct {
	seq     int
	name    string
	group   int
	created time.Duration // by KEDA, at a poll
	placed  bool
	start   time.Duration // placed and started
	end     time.Duration
	node    int   // index of the node its Pod ran on
	devices []int // the GPUs it held there
	task    int   // index of the task it ran; -1 when it found its queue empty
}

// openBRun is one policy's replay. Only its goroutine touches it.
type openBRun struct {
	in            *openBInput
	capacityAware bool
	progress      *progress
	stale         time.Duration // the triggers' staleAfter

	now    time.Duration
	clock  time.Time // openBEpoch + now, what the State reads
	state  *scaler.State
	server *scaler.Server

	nodes   []*openBNode
	free    [][]int // free[model][f]: nodes of that model index with f free GPUs
	held    int     // GPUs held now
	groups  []*openBGroup
	pending []*openBJob // Pods Pending, in creation order
	running openBHeap   // Jobs running, by end
	next    int         // the next task to arrive

	rec         *openBRecord
	waits       []float64 // seconds, per task started
	pendingGPUs float64   // GPU-seconds Pending
	pendingMost int
	timeline    []OpenBPoint
	emptyJobs   int
	gpuSeconds  float64
	dirtyNodes  []*openBNode
	dirtyQueues []*openBGroup
}

type openBNode struct {
	index   int
	name    string
	model   int // index in openBInput.models
	holders []*openBJob
	nFree   int
	sim     *sim.Node
	simCfg  sim.Config
	col     *collector.Collector
	subject string
	last    gpuscalerv1.Event // the last report applied
	stored  time.Duration     // when it was applied
	dirty   bool
}

type openBGroup struct {
	index    int // in openBRun.groups
	spec     openBGroupSpec
	allowed  []int // model indexes the Jobs may use; nil: any
	ref      *pb.ScaledObjectRef
	subject  string
	phase    time.Duration
	items    []int // tasks waiting, oldest first, from head
	head     int
	inFlight int
	arrivals uint64
	seq      uint64
	stored   time.Duration // when its last report was applied
	dirty    bool
	jobs     int // Jobs not finished: Pending or running
	polling  bool
	nextPoll time.Duration
}

func (g *openBGroup) waiting() int { return len(g.items) - g.head }

func newOpenBRun(ctx context.Context, in *openBInput, capacityAware bool, p *progress) (*openBRun, error) {
	r := &openBRun{in: in, capacityAware: capacityAware, progress: p, rec: &openBRecord{}, now: in.start}
	r.clock = openBEpoch.Add(r.now)
	r.state = scaler.NewState(func() time.Time { return r.clock })
	r.server = scaler.NewLocalServer(r.state)
	r.stale = scaler.DefaultStreamMaxAge
	maxGPUs := 0
	for _, n := range in.nodes {
		maxGPUs = max(maxGPUs, n.GPUs)
	}
	r.free = make([][]int, len(in.models))
	for m := range r.free {
		r.free[m] = make([]int, maxGPUs+1)
	}
	for i, n := range in.nodes {
		model, _ := slices.BinarySearch(in.models, n.Model)
		labels := map[string]string{openBModelLabel: n.Model}
		cfg := sim.Config{GPUs: n.GPUs, Model: n.Model, NodeLabels: labels}
		simNode, err := sim.New(n.Name, cfg)
		if err != nil {
			return nil, fmt.Errorf("node %s: %w", n.Name, err)
		}
		// No NATS: the replay takes the collector's reports and applies them itself.
		col, err := collector.New(collector.Config{Node: n.Name, CollectorID: openBProducer, NodeLabels: simNode.Labels},
			simNode, simNode, simNode, nil, nil, prometheus.NewRegistry())
		if err != nil {
			return nil, err
		}
		subject, err := gpuscalerv1.NodeSubject(n.Name)
		if err != nil {
			return nil, err
		}
		node := &openBNode{index: i, name: n.Name, model: model, holders: make([]*openBJob, n.GPUs), nFree: n.GPUs,
			sim: simNode, simCfg: cfg, col: col, subject: subject, dirty: true}
		r.nodes = append(r.nodes, node)
		r.dirtyNodes = append(r.dirtyNodes, node)
		r.free[model][n.GPUs]++
	}
	for i, spec := range in.groups {
		subject, err := gpuscalerv1.QueueSubject(openBNamespace, spec.name, openBProducer)
		if err != nil {
			return nil, err
		}
		g := &openBGroup{index: i, spec: spec, subject: subject, phase: in.phases[i], dirty: true,
			ref: &pb.ScaledObjectRef{Namespace: openBNamespace, Name: spec.name, ScalerMetadata: spec.trigger(capacityAware)}}
		for _, m := range spec.models {
			if k, ok := slices.BinarySearch(in.models, m); ok {
				g.allowed = append(g.allowed, k)
			}
		}
		if spec.models != nil && g.allowed == nil {
			g.allowed = []int{} // none of its models is replayed: fitsSomeNode kept it out
		}
		r.groups = append(r.groups, g)
		r.dirtyQueues = append(r.dirtyQueues, g)
	}
	// Every collector and producer reports when it starts.
	if err := r.flush(ctx); err != nil {
		return nil, err
	}
	return r, nil
}

// run replays every task to its end.
func (r *openBRun) run(ctx context.Context) error {
	for steps := 0; ; steps++ {
		if steps%1024 == 0 {
			if err := ctx.Err(); err != nil {
				return err
			}
		}
		t, ok := r.nextEvent()
		if !ok {
			break
		}
		r.advance(t)
		for len(r.running) > 0 && r.running[0].end == t {
			r.complete(heap.Pop(&r.running).(*openBJob))
		}
		r.schedule()
		for r.next < len(r.in.tasks) && r.in.tasks[r.next].created == t {
			r.arrive(r.next)
			r.next++
		}
		for _, g := range r.groups {
			if g.polling && g.nextPoll == t {
				if err := r.poll(ctx, g); err != nil {
					return err
				}
			}
		}
		if err := r.flush(ctx); err != nil {
			return err
		}
		r.note()
	}
	if len(r.pending) > 0 || r.next < len(r.in.tasks) {
		return fmt.Errorf("stopped at %s with %d Pods Pending and %d tasks not arrived", r.now, len(r.pending), len(r.in.tasks)-r.next)
	}
	for _, g := range r.groups {
		if g.waiting() > 0 || g.inFlight > 0 || g.jobs > 0 {
			return fmt.Errorf("stopped at %s with queue %s holding %d waiting, %d in flight, %d Jobs", r.now, g.spec.name, g.waiting(), g.inFlight, g.jobs)
		}
	}
	return nil
}

// nextEvent returns the time of the next completion, arrival or poll; false when none is left.
func (r *openBRun) nextEvent() (time.Duration, bool) {
	t, ok := time.Duration(math.MaxInt64), false
	if len(r.running) > 0 {
		t, ok = r.running[0].end, true
	}
	if r.next < len(r.in.tasks) {
		t, ok = min(t, r.in.tasks[r.next].created), true
	}
	for _, g := range r.groups {
		if g.polling {
			t, ok = min(t, g.nextPoll), true
		}
	}
	return t, ok
}

// advance moves the clock to t, integrating the GPUs held until then.
func (r *openBRun) advance(t time.Duration) {
	r.rec.heldGPUSeconds += float64(r.held) * (t - r.now).Seconds()
	r.now = t
	r.clock = openBEpoch.Add(t)
}

// arrive puts task i on its queue, and starts its ScaledJob polling if it was not.
func (r *openBRun) arrive(i int) {
	g := r.groups[r.in.tasks[i].group]
	g.items = append(g.items, i)
	g.arrivals++
	r.dirtyQueue(g)
	if !g.polling { // its next tick: the first phase + k·interval at or after now
		g.polling = true
		g.nextPoll = g.phase
		if since := r.now - g.phase; since > 0 {
			every := r.in.cfg.PollingInterval
			g.nextPoll += (since + every - 1) / every * every
		}
	}
}

// poll is one KEDA poll of g's ScaledJob: what KEDA asks the scaler, and the Jobs its
// default scaling strategy creates.
func (r *openBRun) poll(ctx context.Context, g *openBGroup) error {
	if err := r.flush(ctx); err != nil { // what changed earlier in this instant
		return err
	}
	if err := r.heartbeat(ctx, g); err != nil {
		return err
	}
	spec, err := r.server.GetMetricSpec(ctx, g.ref)
	if err != nil {
		return fmt.Errorf("poll of %s at %s: GetMetricSpec: %w", g.spec.name, r.now, err)
	}
	first := spec.GetMetricSpecs()[0]
	active, err := r.server.IsActive(ctx, g.ref)
	if err != nil {
		return fmt.Errorf("poll of %s at %s: IsActive: %w", g.spec.name, r.now, err)
	}
	m, err := r.server.GetMetrics(ctx, &pb.GetMetricsRequest{ScaledObjectRef: g.ref, MetricName: first.GetMetricName()})
	if err != nil {
		return fmt.Errorf("poll of %s at %s: GetMetrics: %w", g.spec.name, r.now, err)
	}
	value := m.GetMetricValues()[0].GetMetricValueFloat()
	n := kedarules.JobsToCreate(active.GetResult(), value, first.GetTargetSizeFloat(), r.in.cfg.MaxReplicaCount, g.jobs)
	for range n {
		j := &openBJob{seq: len(r.rec.jobs), group: g.index, created: r.now, node: -1, task: -1}
		j.name = fmt.Sprintf("%s-%d", g.spec.name, j.seq)
		r.rec.jobs = append(r.rec.jobs, j)
		r.pending = append(r.pending, j)
		g.jobs++
	}
	r.schedule()
	g.nextPoll = r.now + r.in.cfg.PollingInterval
	g.polling = g.waiting() > 0 || r.in.pollAlways && !r.finished()
	return nil
}

// finished reports whether every task has arrived and every Job has ended.
func (r *openBRun) finished() bool {
	if r.next < len(r.in.tasks) || len(r.pending) > 0 || len(r.running) > 0 {
		return false
	}
	for _, g := range r.groups {
		if g.waiting() > 0 {
			return false
		}
	}
	return true
}

// heartbeat re-applies, as their collectors' and producer's heartbeats would, the last
// reports that g's trigger reads and that are within a second of staleAfter old.
func (r *openBRun) heartbeat(ctx context.Context, g *openBGroup) error {
	if r.now-g.stored >= r.stale-time.Second {
		if err := r.applyQueue(g); err != nil {
			return err
		}
	}
	if !r.capacityAware {
		return nil
	}
	for _, n := range r.nodes {
		if r.now-n.stored >= r.stale-time.Second {
			if err := r.state.Apply(n.last, r.clock); err != nil {
				return fmt.Errorf("node %s: %w", n.name, err)
			}
			n.stored = r.now
		}
	}
	return nil
}

// schedule places Pending Pods, in creation order, where they fit.
func (r *openBRun) schedule() {
	kept := r.pending[:0]
	for _, j := range r.pending {
		g := r.groups[j.group]
		if n := r.fit(g.spec.gpus, g.allowed); n != nil {
			r.start(j, n)
		} else {
			kept = append(kept, j)
		}
	}
	clear(r.pending[len(kept):])
	r.pending = kept
}

// fit returns the lowest-numbered node of an allowed model (any, when nil) with gpus
// free GPUs, or nil. The count of nodes by model and free GPUs answers "none" without a
// walk over the nodes, which is what most Pending Pods hear while GPUs are scarce.
func (r *openBRun) fit(gpus int, allowed []int) *openBNode {
	has := func(m int) bool {
		return gpus < len(r.free[m]) && slices.ContainsFunc(r.free[m][gpus:], func(k int) bool { return k > 0 })
	}
	found := false
	if allowed == nil {
		for m := range r.free {
			found = found || has(m)
		}
	} else {
		found = slices.ContainsFunc(allowed, has)
	}
	if !found {
		return nil
	}
	for _, n := range r.nodes {
		if n.nFree >= gpus && (allowed == nil || slices.Contains(allowed, n.model)) {
			return n
		}
	}
	return nil
}

// start places j's Pod on n and starts it: it takes the head item of its queue, or,
// finding none, exits at once, before its GPUs show in any report.
func (r *openBRun) start(j *openBJob, n *openBNode) {
	g := r.groups[j.group]
	j.placed, j.start, j.node = true, r.now, n.index
	r.pendingGPUs += float64(g.spec.gpus) * (r.now - j.created).Seconds()
	if g.waiting() == 0 {
		j.end = r.now
		r.emptyJobs++
		g.jobs--
		r.rec.end = max(r.rec.end, r.now)
		return
	}
	r.take(n, j, g.spec.gpus)
	j.task = g.items[g.head]
	g.head++
	if g.head > 1024 && g.head*2 > len(g.items) { // drop what was taken
		g.items = slices.Delete(g.items, 0, g.head)
		g.head = 0
	}
	g.inFlight++
	r.dirtyQueue(g)
	task := r.in.tasks[j.task]
	r.waits = append(r.waits, (r.now - task.created).Seconds())
	j.end = r.now + task.run
	heap.Push(&r.running, j)
}

// complete ends a running Job: its item is done and its GPUs free.
func (r *openBRun) complete(j *openBJob) {
	g := r.groups[j.group]
	g.inFlight--
	g.jobs--
	r.dirtyQueue(g)
	r.release(r.nodes[j.node], j)
	r.gpuSeconds += float64(len(j.devices)) * (j.end - j.start).Seconds()
	r.rec.end = max(r.rec.end, r.now)
	r.progress.add(1)
}

// take gives j gpus of n's free GPUs, the lowest-numbered first.
func (r *openBRun) take(n *openBNode, j *openBJob, gpus int) {
	r.setFree(n, n.nFree-gpus)
	for i := range n.holders {
		if len(j.devices) < gpus && n.holders[i] == nil {
			n.holders[i] = j
			j.devices = append(j.devices, i)
		}
	}
	r.held += gpus
	r.dirtyNode(n)
}

// release frees j's GPUs on n.
func (r *openBRun) release(n *openBNode, j *openBJob) {
	for _, i := range j.devices {
		n.holders[i] = nil
	}
	r.setFree(n, n.nFree+len(j.devices))
	r.held -= len(j.devices)
	r.dirtyNode(n)
}

func (r *openBRun) setFree(n *openBNode, free int) {
	r.free[n.model][n.nFree]--
	n.nFree = free
	r.free[n.model][n.nFree]++
}

func (r *openBRun) dirtyNode(n *openBNode) {
	if !n.dirty {
		n.dirty = true
		r.dirtyNodes = append(r.dirtyNodes, n)
	}
}

func (r *openBRun) dirtyQueue(g *openBGroup) {
	if !g.dirty {
		g.dirty = true
		r.dirtyQueues = append(r.dirtyQueues, g)
	}
}

// flush applies a new report of every node whose Pods changed and every queue whose
// counts changed.
func (r *openBRun) flush(ctx context.Context) error {
	for _, n := range r.dirtyNodes {
		n.dirty = false
		if err := r.applyNode(ctx, n); err != nil {
			return fmt.Errorf("node %s at %s: %w", n.name, r.now, err)
		}
	}
	r.dirtyNodes = r.dirtyNodes[:0]
	for _, g := range r.dirtyQueues {
		g.dirty = false
		if err := r.applyQueue(g); err != nil {
			return fmt.Errorf("queue %s at %s: %w", g.spec.name, r.now, err)
		}
	}
	r.dirtyQueues = r.dirtyQueues[:0]
	return nil
}

// applyNode hands the node's Pods to its simulator, has its collector build a report,
// and applies it as the scaler's NATS follower would: encoded, decoded, validated.
func (r *openBRun) applyNode(ctx context.Context, n *openBNode) error {
	var pods []sim.Pod
	for i, j := range n.holders {
		if j == nil {
			continue
		}
		k := slices.IndexFunc(pods, func(p sim.Pod) bool { return p.Name == j.name })
		if k < 0 {
			pods = append(pods, sim.Pod{Namespace: openBNamespace, Name: j.name, OwnerKind: "Job", OwnerName: j.name,
				Labels: map[string]string{"scaledjob.keda.sh/name": r.groups[j.group].spec.name}})
			k = len(pods) - 1
		}
		pods[k].GPUs = append(pods[k].GPUs, strconv.Itoa(i))
	}
	n.simCfg.Pods = pods
	if err := n.sim.SetConfig(n.simCfg); err != nil {
		return err
	}
	report, err := n.col.Report(ctx)
	if err != nil {
		return err
	}
	ev, err := reencode(n.subject, report.MarshalVT)
	if err != nil {
		return err
	}
	n.last, n.stored = ev, r.now
	return r.state.Apply(ev, r.clock)
}

// applyQueue applies a report of g's counts, filled as the producer API fills one.
func (r *openBRun) applyQueue(g *openBGroup) error {
	g.seq++
	report := &gpuscalerv1.QueueReport{
		Namespace:  openBNamespace,
		Queue:      g.spec.name,
		ProducerId: openBProducer,
		ObservedAt: timestamppb.New(r.clock),
		Waiting:    uint64(g.waiting()),
		InFlight:   uint64(g.inFlight),
		Arrivals:   g.arrivals,
		Sequence:   g.seq,
	}
	g.arrivals = 0
	ev, err := reencode(g.subject, report.MarshalVT)
	if err != nil {
		return err
	}
	g.stored = r.now
	return r.state.Apply(ev, r.clock)
}

// reencode encodes a report and decodes it from its subject, as the scaler receives it.
func reencode(subject string, marshal func() ([]byte, error)) (gpuscalerv1.Event, error) {
	data, err := marshal()
	if err != nil {
		return gpuscalerv1.Event{}, err
	}
	return gpuscalerv1.Decode(subject, data)
}

// note records the instant's Pending count and, when a count changed, a timeline point.
func (r *openBRun) note() {
	r.pendingMost = max(r.pendingMost, len(r.pending))
	p := OpenBPoint{At: r.now, Pending: len(r.pending), Running: len(r.running)}
	for _, g := range r.groups {
		p.Waiting += g.waiting()
	}
	if k := len(r.timeline); k == 0 || r.timeline[k-1].Waiting != p.Waiting || r.timeline[k-1].Running != p.Running || r.timeline[k-1].Pending != p.Pending {
		r.timeline = append(r.timeline, p)
	}
}

// summary returns the policy's figures over a cluster of gpus GPUs and span.
func (r *openBRun) summary(name string, gpus int, span time.Duration) OpenBPolicy {
	waits := slices.Clone(r.waits)
	slices.Sort(waits)
	p := OpenBPolicy{
		Name:            name,
		CapacityAware:   r.capacityAware,
		Jobs:            len(r.rec.jobs),
		EmptyJobs:       r.emptyJobs,
		JobWaitP50:      inference.Quantile(waits, 0.5),
		JobWaitP99:      inference.Quantile(waits, 0.99),
		JobWaitMean:     inference.Mean(waits),
		PendingJobsMax:  r.pendingMost,
		PendingGPUHours: r.pendingGPUs / 3600,
		GPUHours:        r.gpuSeconds / 3600,
		Timeline:        thin(r.timeline, openBTimelinePoints),
	}
	if gpus > 0 && span > 0 {
		p.GPUAllocation = r.gpuSeconds / (float64(gpus) * span.Seconds())
	}
	return p
}

// thin cuts points into at most limit equal stretches of time, each kept as one point
// with the most of each count in it, at the time of the stretch's first point.
func thin(points []OpenBPoint, limit int) []OpenBPoint {
	if len(points) <= limit {
		return points
	}
	first, last := points[0].At, points[len(points)-1].At
	width := (last-first)/time.Duration(limit) + 1
	var out []OpenBPoint
	for _, p := range points {
		k := len(out) - 1
		if k >= 0 && (p.At-first)/width == (out[k].At-first)/width {
			out[k].Waiting = max(out[k].Waiting, p.Waiting)
			out[k].Running = max(out[k].Running, p.Running)
			out[k].Pending = max(out[k].Pending, p.Pending)
			continue
		}
		out = append(out, p)
	}
	return out
}

// openBHeap holds running Jobs by end, then creation.
type openBHeap []*openBJob

func (h openBHeap) Len() int { return len(h) }
func (h openBHeap) Less(a, b int) bool {
	return h[a].end < h[b].end || h[a].end == h[b].end && h[a].seq < h[b].seq
}
func (h openBHeap) Swap(a, b int) { h[a], h[b] = h[b], h[a] }
func (h *openBHeap) Push(x any)   { *h = append(*h, x.(*openBJob)) }
func (h *openBHeap) Pop() any {
	old := *h
	j := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	return j
}

// progress tells OpenBConfig.Progress how far the policies, running concurrently, are.
type progress struct {
	f           func(done, total int)
	total, step int
	mu          sync.Mutex // guards done and told, and serialises calls to f
	done, told  int
}

func newProgress(f func(done, total int), total int) *progress {
	return &progress{f: f, total: total, step: max(1, total/200)}
}

// add counts n tasks done, and tells f when a step has passed since it last did.
func (p *progress) add(n int) {
	if p.f == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.done += n
	if p.done-p.told >= p.step {
		p.told = p.done
		p.f(p.done, p.total)
	}
}

// finish tells f the end, if it has not heard it.
func (p *progress) finish() {
	if p.f == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.told != p.done || p.done == 0 {
		p.told = p.done
		p.f(p.done, p.total)
	}
}
