// Package bench measures a whole scaler in one process: an embedded NATS server, the
// scaler with its gRPC server on loopback, simulated GPU nodes publishing NodeReports in
// the background, queue producers and a gRPC client, all as in production but on one
// machine. `gpuscaler bench` runs it and the README's performance section quotes it.
//
// It measures what a user feels: the time from a QueueReport's publication to
// StreamIsActive delivering true to the client, GetMetrics latency across many triggers,
// the highest NodeReport rate the scaler absorbs without falling behind, and the memory
// each tracked GPU costs.
package bench

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"

	"github.com/gpuscaler/gpuscaler/internal/embedded"
	"github.com/gpuscaler/gpuscaler/internal/natsconn"
	pb "github.com/gpuscaler/gpuscaler/proto/externalscaler"
	gpuscalerv1 "github.com/gpuscaler/gpuscaler/proto/gpuscaler/v1"
	"github.com/gpuscaler/gpuscaler/scaler"
)

// Config sizes the run. The zero value of a field means its default, in brackets.
type Config struct {
	// Nodes publishing NodeReports in the background [1000], each with GPUsPerNode GPUs
	// [8], every NodeInterval [1s].
	Nodes        int
	GPUsPerNode  int
	NodeInterval time.Duration
	// Activations measured, one queue and one open StreamIsActive stream each [1000].
	Activations int
	// Triggers asked GetMetrics [1000], half queue triggers and half podSelector GPU
	// triggers, over Calls calls in all [20000].
	Triggers int
	Calls    int
	// Rates tried, in NodeReports per second, each for StepDuration [3s], until one is not
	// absorbed [10000, 20000, 30000, 40000, 60000, 80000].
	Rates        []int
	StepDuration time.Duration
	// MemoryNodes are decoded into a fresh state to weigh one GPU [10000].
	MemoryNodes int
	// Seed makes the simulated utilisation repeatable [1].
	Seed uint64
	// StreamMemory keeps the GPUSCALER stream in memory instead of on disk.
	StreamMemory bool
	// Log receives the scaler's and the NATS server's logs [discarded].
	Log *slog.Logger
}

func (c Config) withDefaults() Config {
	def := func(v *int, d int) {
		if *v <= 0 {
			*v = d
		}
	}
	def(&c.Nodes, 1000)
	def(&c.GPUsPerNode, 8)
	def(&c.Activations, 1000)
	def(&c.Triggers, 1000)
	def(&c.Calls, 20000)
	def(&c.MemoryNodes, 10000)
	if c.NodeInterval <= 0 {
		c.NodeInterval = time.Second
	}
	if c.StepDuration <= 0 {
		c.StepDuration = 3 * time.Second
	}
	if len(c.Rates) == 0 {
		c.Rates = []int{10000, 20000, 30000, 40000, 60000, 80000}
	}
	if c.Seed == 0 {
		c.Seed = 1
	}
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	return c
}

// Latency summarises measured durations, in milliseconds.
type Latency struct {
	Count int     `json:"count"`
	P50   float64 `json:"p50_ms"`
	P90   float64 `json:"p90_ms"`
	P99   float64 `json:"p99_ms"`
	Max   float64 `json:"max_ms"`
}

// RateStep is one step of the absorption test.
type RateStep struct {
	Offered   int     `json:"offered_per_s"`
	Published int     `json:"published"`
	Applied   int     `json:"applied"`
	Rate      float64 `json:"applied_per_s"`
	KeptUp    bool    `json:"kept_up"`
}

// Result is what a run measured.
type Result struct {
	Machine struct {
		CPUs      int    `json:"cpus"`
		CPU       string `json:"cpu"`
		GoVersion string `json:"go_version"`
		Platform  string `json:"platform"`
	} `json:"machine"`
	Config struct {
		Nodes        int    `json:"nodes"`
		GPUsPerNode  int    `json:"gpus_per_node"`
		NodeInterval string `json:"node_interval"`
		Triggers     int    `json:"triggers"`
	} `json:"config"`
	Activation          Latency    `json:"activation"`
	GetMetrics          Latency    `json:"get_metrics"`
	GetMetricsQueue     Latency    `json:"get_metrics_queue"`
	GetMetricsGPU       Latency    `json:"get_metrics_gpu"`
	Absorb              []RateStep `json:"absorb"`
	MaxAbsorbedPerS     int        `json:"max_absorbed_node_reports_per_s"`
	HeapBytesPerGPU     float64    `json:"heap_bytes_per_gpu"`
	RSSBytesPerGPU      float64    `json:"rss_bytes_per_gpu"`
	NodeReportBytes     int        `json:"node_report_bytes"`
	BackgroundReportsPS float64    `json:"background_node_reports_per_s"`
}

// Targets are the figures the scaler is held to on a 2-core machine.
var Targets = struct {
	ActivationP99 time.Duration
	GetMetricsP99 time.Duration
	AbsorbPerS    int
}{5 * time.Millisecond, time.Millisecond, 20000}

// Run measures and reports progress to progress. It returns when done or ctx ends.
func Run(ctx context.Context, cfg Config, progress io.Writer) (*Result, error) {
	cfg = cfg.withDefaults()
	res := &Result{}
	res.Machine.CPUs = runtime.GOMAXPROCS(0)
	res.Machine.CPU = cpuModel()
	res.Machine.GoVersion = runtime.Version()
	res.Machine.Platform = runtime.GOOS + "/" + runtime.GOARCH
	res.Config.Nodes, res.Config.GPUsPerNode = cfg.Nodes, cfg.GPUsPerNode
	res.Config.NodeInterval, res.Config.Triggers = cfg.NodeInterval.String(), cfg.Triggers

	step := func(n int, what string) { fmt.Fprintf(progress, "[%d/5] %s\n", n, what) }

	step(1, fmt.Sprintf("weighing the state: %d nodes × %d GPUs decoded and applied", cfg.MemoryNodes, cfg.GPUsPerNode))
	res.HeapBytesPerGPU, res.RSSBytesPerGPU = weighState(cfg)

	ns, err := embedded.Start(embedded.Options{Log: cfg.Log.With("component", "embedded-nats")})
	if err != nil {
		return nil, err
	}
	defer ns.Shutdown()
	scalerConn, err := natsconn.Connect(ctx, natsconn.Options{URLs: ns.ClientURL(), Name: "bench-scaler"})
	if err != nil {
		return nil, err
	}
	defer scalerConn.Close()
	s, err := scaler.New(scaler.Config{GRPCAddr: "127.0.0.1:0", HTTPAddr: "-", Stream: scaler.StreamConfig{Memory: cfg.StreamMemory},
		// Every queue of the bench is in one namespace, more of them than the default
		// per-namespace limit allows (--activations plus half --triggers).
		MaxQueuesPerNamespace: -1}, scalerConn, cfg.Log, prometheus.NewRegistry())
	if err != nil {
		return nil, err
	}
	runCtx, stopScaler := context.WithCancel(ctx)
	defer stopScaler()
	scalerDone := make(chan error, 1)
	go func() { scalerDone <- s.Run(runCtx) }()
	defer func() { stopScaler(); <-scalerDone }()
	select {
	case <-s.Ready():
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	conn, err := grpc.NewClient(s.GRPCAddr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	client := pb.NewExternalScalerClient(conn)

	pubs, err := newPublishers(ctx, ns.ClientURL(), 2)
	if err != nil {
		return nil, err
	}
	defer pubs.close()
	nodes := makeNodeReports(cfg)
	res.NodeReportBytes = len(nodes[0].data)

	// Every node reports once, so the state is full before anything is measured.
	for i := range nodes {
		pubs.publish(i, nodes[i].subject, nodes[i].data)
	}
	pubs.flush()
	if err := waitFor(ctx, 10*time.Second, func() bool { n, _, _ := s.State().Size(); return n == cfg.Nodes }); err != nil {
		return nil, fmt.Errorf("state did not reach %d nodes: %w", cfg.Nodes, err)
	}

	bgCtx, stopBackground := context.WithCancel(ctx)
	bgRate := float64(cfg.Nodes) / cfg.NodeInterval.Seconds()
	bgDone := make(chan int, 1)
	go func() { bgDone <- pubs.atRate(bgCtx, nodes, bgRate) }()
	bgStart := time.Now()

	step(2, fmt.Sprintf("activation latency: %d queues at zero, one StreamIsActive each; QueueReport → true, with %.0f NodeReports/s in the background", cfg.Activations, bgRate))
	if res.Activation, err = measureActivation(ctx, client, pubs, cfg.Activations); err != nil {
		stopBackground()
		return nil, fmt.Errorf("activation: %w", err)
	}

	step(3, fmt.Sprintf("GetMetrics latency: %d calls over %d triggers (queue and GPU)", cfg.Calls, cfg.Triggers))
	if res.GetMetrics, res.GetMetricsQueue, res.GetMetricsGPU, err = measureGetMetrics(ctx, client, pubs, cfg); err != nil {
		stopBackground()
		return nil, fmt.Errorf("GetMetrics: %w", err)
	}
	stopBackground()
	res.BackgroundReportsPS = float64(<-bgDone) / time.Since(bgStart).Seconds()

	step(4, fmt.Sprintf("NodeReport absorption: rates %v per second, %s each", cfg.Rates, cfg.StepDuration))
	res.Absorb = measureAbsorb(ctx, s.State(), pubs, nodes, cfg, progress)
	for _, r := range res.Absorb {
		if r.KeptUp {
			res.MaxAbsorbedPerS = r.Offered
		}
	}
	step(5, "done")
	return res, ctx.Err()
}

// node is one simulated node's report, marshalled once.
type node struct {
	subject string
	data    []byte
}

// makeNodeReports builds realistic reports: GPUs held by pods of 50 namespaces and 100
// apps with a few labels each, one GPU in eight free.
func makeNodeReports(cfg Config) []node {
	rng := rand.New(rand.NewPCG(cfg.Seed, 0))
	out := make([]node, cfg.Nodes)
	for i := range out {
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
			if g != cfg.GPUsPerNode-1 {
				app := (i*cfg.GPUsPerNode + g) % 100
				s.Pod = &gpuscalerv1.PodRef{
					Namespace: fmt.Sprintf("bench-ns-%02d", app%50), Name: fmt.Sprintf("svc-%02d-%05d", app, i), Container: "main",
					Labels:    map[string]string{"app": fmt.Sprintf("svc-%02d", app), "tier": "gpu", "pod-template-hash": "7d4b9c8f6"},
					OwnerKind: "Deployment", OwnerName: fmt.Sprintf("svc-%02d", app),
				}
				r.Allocated = append(r.Allocated, &gpuscalerv1.Device{Id: uuid, Resource: "nvidia.com/gpu"})
			}
			r.Gpus = append(r.Gpus, s)
		}
		subject, _ := gpuscalerv1.NodeSubject(r.GetNode())
		data, _ := proto.Marshal(r)
		out[i] = node{subject, data}
	}
	return out
}

// publishers spread publications over a few NATS connections, as many producers would.
type publishers struct{ conns []*nats.Conn }

func newPublishers(ctx context.Context, url string, n int) (*publishers, error) {
	p := &publishers{}
	for i := range n {
		c, err := natsconn.Connect(ctx, natsconn.Options{URLs: url, Name: "bench-publisher-" + strconv.Itoa(i)})
		if err != nil {
			p.close()
			return nil, err
		}
		p.conns = append(p.conns, c.Conn)
	}
	return p, nil
}

func (p *publishers) publish(i int, subject string, data []byte) {
	_ = p.conns[i%len(p.conns)].Publish(subject, data)
}

func (p *publishers) flush() {
	for _, c := range p.conns {
		_ = c.Flush()
	}
}

func (p *publishers) close() {
	for _, c := range p.conns {
		c.Close()
	}
}

// atRate publishes the nodes' reports round-robin at rate per second until ctx ends, in
// small batches every 2 ms, and returns how many it published.
func (p *publishers) atRate(ctx context.Context, nodes []node, rate float64) int {
	const tick = 2 * time.Millisecond
	t := time.NewTicker(tick)
	defer t.Stop()
	start, sent := time.Now(), 0
	for {
		select {
		case <-ctx.Done():
			p.flush()
			return sent
		case now := <-t.C:
			due := int(rate * now.Sub(start).Seconds())
			for ; sent < due; sent++ {
				n := nodes[sent%len(nodes)]
				p.publish(sent, n.subject, n.data)
			}
		}
	}
}

// queueReport marshals a QueueReport for namespace bench-q.
func queueReport(queue string, waiting uint64) (string, []byte) {
	subject, _ := gpuscalerv1.QueueSubject("bench-q", queue)
	data, _ := proto.Marshal(&gpuscalerv1.QueueReport{Namespace: "bench-q", Queue: queue, Waiting: waiting, ProducerId: "bench"})
	return subject, data
}

func queueRef(name, queue string) *pb.ScaledObjectRef {
	return &pb.ScaledObjectRef{Name: name, Namespace: "bench-q", ScalerMetadata: map[string]string{"scalerAddress": "bench", "queue": queue}}
}

// measureActivation opens one stream per queue with every queue at zero, then, one at a
// time, publishes a QueueReport of one waiting item and times it until that stream says true.
func measureActivation(ctx context.Context, client pb.ExternalScalerClient, pubs *publishers, n int) (Latency, error) {
	streamCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	for i := range n {
		subject, data := queueReport("act-"+strconv.Itoa(i), 0)
		pubs.publish(i, subject, data)
	}
	pubs.flush()
	if err := waitFor(ctx, 10*time.Second, func() bool {
		resp, err := client.IsActive(ctx, queueRef("act", "act-"+strconv.Itoa(n-1)))
		return err == nil && !resp.GetResult()
	}); err != nil {
		return Latency{}, err
	}
	recv := make([]chan bool, n)
	for i := range n {
		stream, err := client.StreamIsActive(streamCtx, queueRef("act-"+strconv.Itoa(i), "act-"+strconv.Itoa(i)))
		if err != nil {
			return Latency{}, err
		}
		recv[i] = make(chan bool, 4)
		go func(ch chan<- bool) {
			for {
				resp, err := stream.Recv()
				if err != nil {
					close(ch)
					return
				}
				ch <- resp.GetResult()
			}
		}(recv[i])
	}
	for i := range n {
		if v, err := receive(ctx, recv[i]); err != nil || v {
			return Latency{}, fmt.Errorf("stream %d opened with %v, %v; want false", i, v, err)
		}
	}
	times := make([]time.Duration, 0, n)
	for i := range n {
		subject, data := queueReport("act-"+strconv.Itoa(i), 1)
		start := time.Now()
		pubs.publish(i, subject, data)
		if v, err := receive(ctx, recv[i]); err != nil || !v {
			return Latency{}, fmt.Errorf("stream %d: got %v, %v; want true", i, v, err)
		}
		times = append(times, time.Since(start))
	}
	return summarise(times), nil
}

func receive(ctx context.Context, ch <-chan bool) (bool, error) {
	select {
	case v, ok := <-ch:
		if !ok {
			return false, fmt.Errorf("stream ended")
		}
		return v, nil
	case <-time.After(5 * time.Second):
		return false, fmt.Errorf("no message within 5s")
	case <-ctx.Done():
		return false, ctx.Err()
	}
}

// measureGetMetrics asks GetMetrics for half queue triggers (each with its own queue) and
// half podSelector GPU triggers over the background nodes' pods, round-robin.
func measureGetMetrics(ctx context.Context, client pb.ExternalScalerClient, pubs *publishers, cfg Config) (all, queue, gpu Latency, err error) {
	reqs := make([]*pb.GetMetricsRequest, cfg.Triggers)
	for i := range reqs {
		if i%2 == 0 {
			q := "metric-" + strconv.Itoa(i)
			subject, data := queueReport(q, uint64(i))
			pubs.publish(i, subject, data)
			reqs[i] = &pb.GetMetricsRequest{ScaledObjectRef: queueRef("so-"+strconv.Itoa(i), q), MetricName: scaler.MetricQueueBacklog}
			continue
		}
		app := i % 100
		reqs[i] = &pb.GetMetricsRequest{MetricName: scaler.MetricGPUUtil, ScaledObjectRef: &pb.ScaledObjectRef{
			Name: "so-" + strconv.Itoa(i), Namespace: fmt.Sprintf("bench-ns-%02d", app%50),
			ScalerMetadata: map[string]string{"scalerAddress": "bench", "podSelector": fmt.Sprintf("app=svc-%02d,tier=gpu", app), "gpuUtilTarget": "60"},
		}}
	}
	pubs.flush()
	if err := waitFor(ctx, 10*time.Second, func() bool {
		_, err := client.GetMetrics(ctx, reqs[len(reqs)-2+len(reqs)%2])
		return err == nil
	}); err != nil {
		return all, queue, gpu, err
	}
	for _, r := range reqs { // every trigger answers, and warms its connection path
		if _, err := client.GetMetrics(ctx, r); err != nil {
			return all, queue, gpu, fmt.Errorf("trigger %s: %w", r.GetScaledObjectRef().GetName(), err)
		}
	}
	times := make([]time.Duration, 0, cfg.Calls)
	byKind := [2][]time.Duration{}
	for i := range cfg.Calls {
		start := time.Now()
		if _, err := client.GetMetrics(ctx, reqs[i%len(reqs)]); err != nil {
			return all, queue, gpu, err
		}
		d := time.Since(start)
		times = append(times, d)
		byKind[i%2] = append(byKind[i%2], d)
	}
	return summarise(times), summarise(byKind[0]), summarise(byKind[1]), nil
}

// measureAbsorb offers NodeReports at rising rates. A rate is absorbed when, within one
// second of the step's end, the scaler has applied every report published in it.
func measureAbsorb(ctx context.Context, state *scaler.State, pubs *publishers, nodes []node, cfg Config, progress io.Writer) []RateStep {
	var steps []RateStep
	for _, rate := range cfg.Rates {
		before := state.Applied()
		stepCtx, cancel := context.WithTimeout(ctx, cfg.StepDuration)
		start := time.Now()
		published := pubs.atRate(stepCtx, nodes, float64(rate))
		cancel()
		_ = waitFor(ctx, time.Second, func() bool { return state.Applied()-before >= uint64(published) })
		applied := int(state.Applied() - before)
		st := RateStep{
			Offered: rate, Published: published, Applied: applied,
			Rate:   float64(applied) / time.Since(start).Seconds(),
			KeptUp: applied >= published,
		}
		steps = append(steps, st)
		fmt.Fprintf(progress, "      %6d/s offered: %d published, %d applied (%.0f/s) %s\n", rate, published, applied, st.Rate, map[bool]string{true: "kept up", false: "fell behind"}[st.KeptUp])
		// Let a backlog drain before the next step, so steps do not bleed into each other.
		_ = waitFor(ctx, 30*time.Second, func() bool { return state.Applied()-before >= uint64(published) })
		if !st.KeptUp || ctx.Err() != nil {
			break
		}
	}
	return steps
}

// weighState measures the heap and resident memory one GPU costs in the scaler's state:
// MemoryNodes reports, decoded as the scaler decodes them, applied to a fresh State.
func weighState(cfg Config) (heapPerGPU, rssPerGPU float64) {
	c := cfg
	c.Nodes = cfg.MemoryNodes
	nodes := makeNodeReports(c)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	rssBefore := rss()
	state := scaler.NewState(nil)
	now := time.Now()
	for _, n := range nodes {
		ev, err := gpuscalerv1.Decode(n.subject, n.data)
		if err != nil {
			panic(err) // the reports were built valid; anything else is a bug here
		}
		state.Apply(ev, now)
	}
	nodes = nil
	runtime.GC()
	runtime.ReadMemStats(&after)
	gpus := float64(c.Nodes * c.GPUsPerNode)
	heapPerGPU = float64(after.HeapAlloc-before.HeapAlloc) / gpus
	rssPerGPU = float64(rss()-rssBefore) / gpus
	runtime.KeepAlive(state)
	return heapPerGPU, rssPerGPU
}

func summarise(d []time.Duration) Latency {
	if len(d) == 0 {
		return Latency{}
	}
	slices.Sort(d)
	ms := func(x time.Duration) float64 { return float64(x.Microseconds()) / 1000 }
	q := func(p float64) time.Duration {
		i := int(p*float64(len(d))+0.999999) - 1
		return d[min(max(i, 0), len(d)-1)]
	}
	return Latency{Count: len(d), P50: ms(q(0.50)), P90: ms(q(0.90)), P99: ms(q(0.99)), Max: ms(d[len(d)-1])}
}

func waitFor(ctx context.Context, timeout time.Duration, cond func() bool) error {
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			return fmt.Errorf("not within %s", timeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(2 * time.Millisecond):
		}
	}
	return nil
}

// rss returns the process's resident set size in bytes (Linux), or 0.
func rss() int64 {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb << 10
		}
	}
	return 0
}

func cpuModel() string {
	data, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return runtime.GOARCH
	}
	for line := range strings.SplitSeq(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "model name"); ok {
			return strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(v), ":"))
		}
	}
	return runtime.GOARCH
}

// Table writes the result as a human-readable table, with each target and whether it is met.
func (r *Result) Table(w io.Writer) {
	mark := func(ok bool) string {
		if ok {
			return "met"
		}
		return "MISSED"
	}
	fmt.Fprintf(w, "\ngpuscaler bench: %d CPUs (%s), %s %s\n", r.Machine.CPUs, r.Machine.CPU, r.Machine.GoVersion, r.Machine.Platform)
	fmt.Fprintf(w, "background: %d nodes × %d GPUs, a NodeReport (%d bytes) per node every %s: %.0f reports/s measured\n\n",
		r.Config.Nodes, r.Config.GPUsPerNode, r.NodeReportBytes, r.Config.NodeInterval, r.BackgroundReportsPS)
	tw := func(what, got, target, verdict string) {
		fmt.Fprintf(w, "  %-44s %-26s %-14s %s\n", what, got, target, verdict)
	}
	tw("measure", "result", "target", "")
	tw(fmt.Sprintf("activation, publish → StreamIsActive (n=%d)", r.Activation.Count),
		fmt.Sprintf("p50 %.2f  p99 %.2f  max %.2f ms", r.Activation.P50, r.Activation.P99, r.Activation.Max),
		fmt.Sprintf("p99 ≤ %d ms", Targets.ActivationP99.Milliseconds()), mark(r.Activation.P99 <= float64(Targets.ActivationP99.Milliseconds())))
	tw(fmt.Sprintf("GetMetrics, %d triggers (n=%d)", r.Config.Triggers, r.GetMetrics.Count),
		fmt.Sprintf("p50 %.3f  p99 %.3f  max %.2f ms", r.GetMetrics.P50, r.GetMetrics.P99, r.GetMetrics.Max),
		fmt.Sprintf("p99 ≤ %d ms", Targets.GetMetricsP99.Milliseconds()), mark(r.GetMetrics.P99 <= float64(Targets.GetMetricsP99.Milliseconds())))
	tw("  of which queue triggers", fmt.Sprintf("p50 %.3f  p99 %.3f ms", r.GetMetricsQueue.P50, r.GetMetricsQueue.P99), "", "")
	tw("  of which podSelector GPU triggers", fmt.Sprintf("p50 %.3f  p99 %.3f ms", r.GetMetricsGPU.P50, r.GetMetricsGPU.P99), "", "")
	absorbVerdict := mark(r.MaxAbsorbedPerS >= Targets.AbsorbPerS)
	if r.MaxAbsorbedPerS < Targets.AbsorbPerS && len(r.Absorb) > 0 && r.Absorb[len(r.Absorb)-1].KeptUp {
		absorbVerdict = "not tried (every rate offered was absorbed)"
	}
	tw("NodeReports absorbed without falling behind", fmt.Sprintf("%d/s (%d GPU samples/s)", r.MaxAbsorbedPerS, r.MaxAbsorbedPerS*r.Config.GPUsPerNode),
		fmt.Sprintf("≥ %d/s", Targets.AbsorbPerS), absorbVerdict)
	tw("memory per tracked GPU", fmt.Sprintf("%.0f B heap, %.0f B RSS", r.HeapBytesPerGPU, r.RSSBytesPerGPU), "", "")
	fmt.Fprintln(w)
}

// Met reports whether every target was met.
func (r *Result) Met() bool {
	return r.Activation.P99 <= float64(Targets.ActivationP99.Milliseconds()) &&
		r.GetMetrics.P99 <= float64(Targets.GetMetricsP99.Milliseconds()) &&
		r.MaxAbsorbedPerS >= Targets.AbsorbPerS
}
