package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"golang.org/x/sync/errgroup"
	"k8s.io/client-go/dynamic"

	"github.com/gpuscaler/gpuscaler/collector"
	"github.com/gpuscaler/gpuscaler/collector/kube"
	"github.com/gpuscaler/gpuscaler/collector/kubelet"
	"github.com/gpuscaler/gpuscaler/collector/sim"
	"github.com/gpuscaler/gpuscaler/internal/natsconn"
	"github.com/gpuscaler/gpuscaler/internal/serve"
)

const collectorAbout = `
Runs on every GPU node (a DaemonSet). Every --interval it reads the node's GPUs, works out
which pod holds each device and how many are free (the kubelet's pod-resources API), adds
the pods' labels and owners (the Kubernetes API: metadata only, of this node's pods only)
and whether the scheduler places pods on the node (a watch of its own Node: its labels,
cordon and taints), and publishes a NodeReport on gpuscaler.v1.node.<node>.

GPU sources (--source):
  auto      DCGM (embedded, or --dcgm-addr), else NVML; fails saying what it tried
  dcgm      DCGM field watches through go-dcgm; libdcgm is loaded from the host
  nvml      NVML, for nodes without DCGM
  exporter  scrape an existing dcgm-exporter (--exporter-url); its pod labels are used
            when the kubelet's socket is not reachable
  sim       simulated GPUs and the pods holding them (--sim-gpus, --sim-config); change
            them while it runs with PUT /sim on --http-addr. With --sim-from-cluster the
            pods come from the cluster instead: for end-to-end tests on fake nodes
            (kwok), the collector plays the kubelet too

Without Kubernetes API access it still publishes, with namespace/pod/container only.`

func runCollector(ctx context.Context, args []string, env envFunc, stdout, stderr io.Writer) error {
	f, log, err := parseCollectorFlags(args, env, stdout, stderr)
	if err != nil {
		return err
	}
	simNode, err := f.simulatedNode()
	if err != nil {
		return err
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	src, err := f.openSource(simNode, log, reg)
	if err != nil {
		return err
	}
	defer src.Close()
	log.Info("reading GPUs", "source", src.Name(), "node", f.cfg.Node, "interval", f.cfg.Interval)

	g, ctx := errgroup.WithContext(ctx)
	var (
		attrib collector.Attributor
		pods   collector.PodDirectory
	)
	if simNode != nil && !f.simFromCluster {
		// The simulated node plays the kubelet and the Kubernetes API too.
		attrib, pods = simNode, simNode
		f.cfg.NodeLabels, f.cfg.NodeScheduling, f.cfg.NodeResources = simNode.Labels, simNode.Scheduling, simNode.Resources
	} else {
		pr, err := f.startKubelet(ctx, g, simNode, log)
		if err != nil {
			return err
		}
		defer pr.Close()
		attrib = pr
		if pods, err = f.startKubeSide(ctx, g, log); err != nil {
			return err
		}
	}
	return f.publish(ctx, g, src, attrib, pods, simNode, reg, log)
}

// collectorFlags is the collector's command line, parsed.
type collectorFlags struct {
	cfg            collector.Config
	src            collector.SourceConfig
	nats           natsconn.Options
	httpAddr       string
	simGPUs        int
	simConfigFile  string
	simSeed        uint64
	simFromCluster bool
	socket         string
	resources      string
	kubeconfig     string
	readPods       bool
}

// parseCollectorFlags reads the collector's flags (and $NODE_NAME, $POD_NAME for what
// they leave empty), checks them, and makes the logger they ask for.
func parseCollectorFlags(args []string, env envFunc, stdout, stderr io.Writer) (*collectorFlags, *slog.Logger, error) {
	f := &collectorFlags{src: collector.SourceConfig{Kind: "auto"}, nats: natsconn.Options{URLs: natsconn.DefaultURL}}
	cfg, srcCfg := &f.cfg, &f.src
	fs := newFlagSet("collector", "collector [flags]", collectorAbout, stdout)
	fs.StringVar(&cfg.Node, "node", "", "this node's Kubernetes name; empty reads $NODE_NAME (the downward API), then the host name")
	fs.DurationVar(&cfg.Interval, "interval", time.Second, "time between reports")
	fs.StringVar(&cfg.CollectorID, "collector-id", "", "names this collector in its reports; empty reads $POD_NAME, then the host name")
	fs.StringVar(&srcCfg.Kind, "source", "auto", "GPU source: "+strings.Join(collector.SourceKinds, ", "))
	fs.StringVar(&srcCfg.DCGMAddr, "dcgm-addr", "", "a standalone nv-hostengine (host:port, or a unix socket path); empty runs DCGM's embedded host engine")
	fs.StringVar(&srcCfg.NVML.ProcRoot, "proc-root", "/proc", "the host's /proc, where NVML's per-process GPU use finds each process's pod (NVML reports host PIDs): "+
		"/proc when the collector runs with hostPID: true, else a hostPath mount of the host's /proc")
	fs.StringVar(&srcCfg.ExporterURL, "exporter-url", "http://localhost:9400/metrics", "the dcgm-exporter /metrics URL the exporter source scrapes")
	fs.IntVar(&f.simGPUs, "sim-gpus", 8, "GPUs of the simulated node, when --sim-config does not say")
	fs.StringVar(&f.simConfigFile, "sim-config", "", "YAML or JSON describing the simulated node's GPUs, MIG slices, time-slicing replicas, pods, load and node labels")
	fs.Uint64Var(&f.simSeed, "sim-seed", 1, "seed of the simulated readings' noise")
	fs.BoolVar(&f.simFromCluster, "sim-from-cluster", false, "sim: the pods the scheduler bound to --node hold the simulated GPUs, handed out as the kubelet's device manager would "+
		"and served on --pod-resources-socket as the kubelet's pod-resources API, which the collector then reads as on a real node; "+
		"for fake nodes (kwok) that no kubelet runs. Needs the Kubernetes API (--kubeconfig), and --sim-config without pods")
	fs.StringVar(&f.socket, "pod-resources-socket", "/var/lib/kubelet/pod-resources/kubelet.sock", "the kubelet's pod-resources API socket")
	fs.StringVar(&f.resources, "resources", strings.Join(kubelet.DefaultPodResources, ","), "comma-separated extended resources that are GPUs (shared replicas and MIG slices included); a trailing * matches a prefix")
	fs.StringVar(&f.kubeconfig, "kubeconfig", "", `kubeconfig for the Kubernetes API; empty uses the in-cluster config, "none" does without`)
	fs.BoolVar(&f.readPods, "read-pods", true, "read this node's pods from the Kubernetes API: their labels and owners, and their CPU and memory requests (RBAC: get, list, watch on pods, get on replicasets and jobs). "+
		"false when the scaler runs with --kubeconfig, which takes labels and requests from its own watch: the collector then reads no pod, only its Node; "+
		"but then it knows no pod's UID, so the NVML source's per-pod use of a shared GPU (--proc-root) goes unused and the GPU's figures are split evenly among its pods")
	fs.StringVar(&f.httpAddr, "http-addr", ":8081", `address of /metrics, /healthz and /readyz; "-" turns HTTP off`)
	natsFlags(fs, &f.nats, "comma-separated NATS URLs")
	newLogger := logFlags(fs, stderr, "info")
	if err := parseFlags(fs, args, env); err != nil {
		return nil, nil, err
	}
	log, err := newLogger()
	if err != nil {
		return nil, nil, err
	}
	if err := positive("interval", cfg.Interval, "a positive duration"); err != nil {
		return nil, nil, err
	}
	if err := positive("sim-gpus", f.simGPUs, "a number of GPUs, 1 or more"); err != nil {
		return nil, nil, err
	}
	switch {
	case f.simFromCluster && srcCfg.Kind != "sim":
		return nil, nil, usageError{fmt.Errorf("--sim-from-cluster: only with --source sim (got --source %s): on a real node the kubelet hands out the GPUs", srcCfg.Kind)}
	case f.simFromCluster && f.kubeconfig == "none":
		return nil, nil, usageError{fmt.Errorf("--sim-from-cluster: the node's pods come from the Kubernetes API, and --kubeconfig none turns it off")}
	}
	cfg.Node = firstOf(cfg.Node, envOr(env, "NODE_NAME"), hostname())
	cfg.CollectorID = firstOf(cfg.CollectorID, envOr(env, "POD_NAME"), hostname())
	srcCfg.Every = cfg.Interval
	return f, log, nil
}

// simulatedNode is the simulated node --source sim reads (--sim-config, or --sim-gpus
// free GPUs); nil for any other source.
func (f *collectorFlags) simulatedNode() (*sim.Node, error) {
	if f.src.Kind != "sim" {
		return nil, nil
	}
	simCfg := sim.Config{GPUs: f.simGPUs, Util: 50, Jitter: 5}
	if f.simConfigFile != "" {
		var err error
		if simCfg, err = sim.LoadConfig(f.simConfigFile); err != nil {
			return nil, err
		}
	}
	if simCfg.Seed == 0 {
		simCfg.Seed = f.simSeed
	}
	return sim.New(f.cfg.Node, simCfg)
}

// openSource opens the GPU source --source names, its notices going to log and its
// metrics to reg.
func (f *collectorFlags) openSource(simNode *sim.Node, log *slog.Logger, reg prometheus.Registerer) (collector.Source, error) {
	if simNode != nil {
		f.src.Sim = simNode
	}
	f.src.Log, f.src.Registerer = log.With("component", "source"), reg
	return collector.OpenSource(f.src)
}

// startKubelet returns the kubelet's pod-resources API, the collector's Attributor:
// played by the simulated node (--sim-from-cluster), in g, until ctx ends.
func (f *collectorFlags) startKubelet(ctx context.Context, g *errgroup.Group, simNode *sim.Node, log *slog.Logger) (*kubelet.PodResources, error) {
	if f.simFromCluster {
		if err := f.startSimKubelet(ctx, g, simNode, log); err != nil {
			return nil, err
		}
	}
	return kubelet.NewPodResources(kubelet.PodResourcesConfig{Socket: f.socket, Resources: splitList(f.resources), Log: log.With("component", "pod-resources")})
}

// startSimKubelet makes the simulated node's pods those the scheduler bound to the
// node, and serves the kubelet's pod-resources API for them (--sim-from-cluster).
func (f *collectorFlags) startSimKubelet(ctx context.Context, g *errgroup.Group, simNode *sim.Node, log *slog.Logger) error {
	dyn, err := dynamicClient(f.kubeconfig)
	if err != nil {
		return err
	}
	simKubelet, err := sim.NewCluster(simNode, sim.ClusterConfig{Node: f.cfg.Node, Socket: f.socket, Client: dyn, Log: log.With("component", "sim-kubelet")})
	if err != nil {
		return err
	}
	g.Go(func() error { return simKubelet.Run(ctx) })
	return nil
}

// startKubeSide starts, in g, what the collector reads of the Kubernetes API: its pods'
// labels and owners (the PodDirectory it returns), its own Node and its pods' requests
// (into f.cfg); with --read-pods=false, its Node alone. With --kubeconfig none, or
// without access (it warns), it returns no directory: the reports carry less, but the
// collector runs.
func (f *collectorFlags) startKubeSide(ctx context.Context, g *errgroup.Group, log *slog.Logger) (collector.PodDirectory, error) {
	if f.kubeconfig == "none" {
		return nil, nil
	}
	client, err := kube.NewMetadataClient(f.kubeconfig)
	if err != nil {
		log.Warn("no Kubernetes API access: reports will carry namespace/pod/container without labels or owners, no node labels, not whether the node is cordoned or tainted (capacity counts its GPUs as placeable), and not its CPU and memory (capacity counts it on its GPUs alone); podSelector triggers over this node's pods answer Unavailable", "err", err)
		return nil, nil
	}
	// The Node's spec (cordon, taints) and status (allocatable), and the pods'
	// requests, are not in their metadata: the dynamic client reads them, which links
	// no typed API.
	dyn, err := dynamicClient(f.kubeconfig)
	if err != nil {
		return nil, err
	}
	node := kube.NewNodeWatch(dyn, f.cfg.Node, log.With("component", "node"))
	f.cfg.NodeLabels, f.cfg.NodeScheduling = node.Labels, node.Scheduling
	g.Go(func() error { return node.Run(ctx) })
	if !f.readPods {
		log.Info("reading no pod from the Kubernetes API (--read-pods=false): reports name this node's pods without labels or owners, and carry no CPU and memory; " +
			"a scaler with --kubeconfig takes them from its own watch")
		return nil, nil
	}
	dir := kube.NewPodDirectory(client, f.cfg.Node, log.With("component", "pods"))
	g.Go(func() error { return dir.Run(ctx) })
	requests := kube.NewPodRequests(dyn, f.cfg.Node, log.With("component", "pod-requests"))
	f.cfg.NodeResources = kube.NodeResourcesOf(node.Allocatable, requests.Requested)
	g.Go(func() error { return requests.Run(ctx) })
	return dir, nil
}

// dynamicClient is a dynamic client of the Kubernetes API kubeconfig names (empty: the
// in-cluster config).
func dynamicClient(kubeconfig string) (dynamic.Interface, error) {
	rc, err := kube.RESTConfig(kubeconfig)
	if err != nil {
		return nil, err
	}
	dyn, err := dynamic.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client for %s: %w", rc.Host, err)
	}
	return dyn, nil
}

// publish connects to NATS and runs the collector, reports going out every interval,
// with /metrics, the probes and (for a simulated node) /sim served on --http-addr, until
// ctx ends or a part fails.
func (f *collectorFlags) publish(ctx context.Context, g *errgroup.Group, src collector.Source, attrib collector.Attributor, pods collector.PodDirectory,
	simNode *sim.Node, reg *prometheus.Registry, log *slog.Logger) error {
	f.nats.Name = "gpuscaler-collector-" + f.cfg.Node
	f.nats.Log = log.With("component", "nats")
	f.nats.RetryInitialConnect = true
	nc, err := natsconn.Connect(ctx, f.nats)
	if err != nil {
		return err
	}
	defer nc.Close()

	f.cfg.NATSProblem = nc.Problem
	c, err := collector.New(f.cfg, src, attrib, pods, nc.Conn, log.With("component", "collector"), reg)
	if err != nil {
		return err
	}
	err = serveMetricsAndProbes(ctx, g, f.httpAddr, reg, log, func() error {
		if err := nc.Problem(); err != nil {
			return err
		}
		return c.Ready()
	}, func(mux *http.ServeMux) {
		if simNode != nil {
			mux.Handle("/sim", simNode.Handler())
		}
	})
	if err != nil {
		return err
	}
	g.Go(func() error { return c.Run(ctx) })
	return g.Wait()
}

func firstOf(values ...string) string {
	for _, v := range values {
		if v != "" {
			return v
		}
	}
	return ""
}

func envOr(env envFunc, name string) string {
	v, _ := env(name)
	return v
}

func hostname() string {
	h, _ := os.Hostname()
	return strings.ToLower(h)
}

func splitList(s string) []string {
	var out []string
	for part := range strings.SplitSeq(s, ",") {
		if part = strings.TrimSpace(part); part != "" {
			out = append(out, part)
		}
	}
	return out
}

// serveMetricsAndProbes serves /metrics from reg and /healthz and /readyz (ready says
// whether the part is ready) on httpAddr, plus what more adds, in g until ctx ends; "-"
// turns HTTP off.
func serveMetricsAndProbes(ctx context.Context, g *errgroup.Group, httpAddr string, reg *prometheus.Registry, log *slog.Logger,
	ready func() error, more func(*http.ServeMux)) error {
	if httpAddr == "-" {
		return nil
	}
	lis, err := net.Listen("tcp", httpAddr)
	if err != nil {
		return fmt.Errorf("HTTP listener: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	serve.Probes(mux, ready)
	if more != nil {
		more(mux)
	}
	log.Info("serving metrics and probes", "httpAddr", lis.Addr().String())
	g.Go(func() error { return serve.HTTP(ctx, lis, mux) })
	return nil
}
