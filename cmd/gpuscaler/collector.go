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
	natsOpts := natsconn.Options{URLs: natsconn.DefaultURL}
	var (
		cfg            collector.Config
		srcCfg         = collector.SourceConfig{Kind: "auto"}
		httpAddr       string
		simGPUs        int
		simConfigFile  string
		simSeed        uint64
		simFromCluster bool
		socket         string
		resources      string
		kubeconfig     string
	)
	fs := newFlagSet("collector", "collector [flags]", collectorAbout, stdout)
	fs.StringVar(&cfg.Node, "node", "", "this node's Kubernetes name; empty reads $NODE_NAME (the downward API), then the host name")
	fs.DurationVar(&cfg.Interval, "interval", time.Second, "time between reports")
	fs.StringVar(&cfg.CollectorID, "collector-id", "", "names this collector in its reports; empty reads $POD_NAME, then the host name")
	fs.StringVar(&srcCfg.Kind, "source", "auto", "GPU source: "+strings.Join(collector.SourceKinds, ", "))
	fs.StringVar(&srcCfg.DCGMAddr, "dcgm-addr", "", "a standalone nv-hostengine (host:port, or a unix socket path); empty runs DCGM's embedded host engine")
	fs.StringVar(&srcCfg.NVML.ProcRoot, "proc-root", "/proc", "the host's /proc, where NVML's per-process GPU use finds each process's pod (NVML reports host PIDs): "+
		"/proc when the collector runs with hostPID: true, else a hostPath mount of the host's /proc")
	fs.StringVar(&srcCfg.ExporterURL, "exporter-url", "http://localhost:9400/metrics", "the dcgm-exporter /metrics URL the exporter source scrapes")
	fs.IntVar(&simGPUs, "sim-gpus", 8, "GPUs of the simulated node, when --sim-config does not say")
	fs.StringVar(&simConfigFile, "sim-config", "", "YAML or JSON describing the simulated node's GPUs, MIG slices, time-slicing replicas, pods, load and node labels")
	fs.Uint64Var(&simSeed, "sim-seed", 1, "seed of the simulated readings' noise")
	fs.BoolVar(&simFromCluster, "sim-from-cluster", false, "sim: the pods the scheduler bound to --node hold the simulated GPUs, handed out as the kubelet's device manager would "+
		"and served on --pod-resources-socket as the kubelet's pod-resources API, which the collector then reads as on a real node; "+
		"for fake nodes (kwok) that no kubelet runs. Needs the Kubernetes API (--kubeconfig), and --sim-config without pods")
	fs.StringVar(&socket, "pod-resources-socket", "/var/lib/kubelet/pod-resources/kubelet.sock", "the kubelet's pod-resources API socket")
	fs.StringVar(&resources, "resources", strings.Join(kubelet.DefaultPodResources, ","), "comma-separated extended resources that are GPUs (shared replicas and MIG slices included); a trailing * matches a prefix")
	fs.StringVar(&kubeconfig, "kubeconfig", "", `kubeconfig for the Kubernetes API; empty uses the in-cluster config, "none" does without`)
	fs.StringVar(&httpAddr, "http-addr", ":8081", `address of /metrics, /healthz and /readyz; "-" turns HTTP off`)
	natsFlags(fs, &natsOpts, "comma-separated NATS URLs")
	newLogger := logFlags(fs, stderr, "info")
	if err := parseFlags(fs, args, env); err != nil {
		return err
	}
	log, err := newLogger()
	if err != nil {
		return err
	}
	if err := positive("interval", cfg.Interval, "a positive duration"); err != nil {
		return err
	}
	if err := positive("sim-gpus", simGPUs, "a number of GPUs, 1 or more"); err != nil {
		return err
	}
	switch {
	case simFromCluster && srcCfg.Kind != "sim":
		return usageError{fmt.Errorf("--sim-from-cluster: only with --source sim (got --source %s): on a real node the kubelet hands out the GPUs", srcCfg.Kind)}
	case simFromCluster && kubeconfig == "none":
		return usageError{fmt.Errorf("--sim-from-cluster: the node's pods come from the Kubernetes API, and --kubeconfig none turns it off")}
	}
	cfg.Node = firstOf(cfg.Node, envOr(env, "NODE_NAME"), hostname())
	cfg.CollectorID = firstOf(cfg.CollectorID, envOr(env, "POD_NAME"), hostname())
	srcCfg.Every = cfg.Interval

	var simNode *sim.Node
	if srcCfg.Kind == "sim" {
		simCfg := sim.Config{GPUs: simGPUs, Util: 50, Jitter: 5}
		if simConfigFile != "" {
			if simCfg, err = sim.LoadConfig(simConfigFile); err != nil {
				return err
			}
		}
		if simCfg.Seed == 0 {
			simCfg.Seed = simSeed
		}
		if simNode, err = sim.New(cfg.Node, simCfg); err != nil {
			return err
		}
		srcCfg.Sim = simNode
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	srcCfg.Log, srcCfg.Registerer = log.With("component", "source"), reg
	src, err := collector.OpenSource(srcCfg)
	if err != nil {
		return err
	}
	defer src.Close()
	log.Info("reading GPUs", "source", src.Name(), "node", cfg.Node, "interval", cfg.Interval)

	g, ctx := errgroup.WithContext(ctx)
	var (
		attrib collector.Attributor
		pods   collector.PodDirectory
	)
	if simNode != nil && !simFromCluster {
		attrib, pods, cfg.NodeLabels, cfg.NodeScheduling, cfg.NodeResources = simNode, simNode, simNode.Labels, simNode.Scheduling, simNode.Resources
	} else {
		if simFromCluster {
			rc, err := kube.RESTConfig(kubeconfig)
			if err != nil {
				return err
			}
			dyn, err := dynamic.NewForConfig(rc)
			if err != nil {
				return fmt.Errorf("kubernetes client for %s: %w", rc.Host, err)
			}
			simKubelet, err := sim.NewCluster(simNode, sim.ClusterConfig{Node: cfg.Node, Socket: socket, Client: dyn, Log: log.With("component", "sim-kubelet")})
			if err != nil {
				return err
			}
			g.Go(func() error { return simKubelet.Run(ctx) })
		}
		pr, err := kubelet.NewPodResources(kubelet.PodResourcesConfig{Socket: socket, Resources: splitList(resources), Log: log.With("component", "pod-resources")})
		if err != nil {
			return err
		}
		defer pr.Close()
		attrib = pr
		if kubeconfig != "none" {
			client, err := kube.NewMetadataClient(kubeconfig)
			if err != nil {
				log.Warn("no Kubernetes API access: reports will carry namespace/pod/container without labels or owners, no node labels, not whether the node is cordoned or tainted (capacity counts its GPUs as placeable), and not its CPU and memory (capacity counts it on its GPUs alone); podSelector triggers over this node's pods answer Unavailable", "err", err)
			} else {
				dir := kube.NewPodDirectory(client, cfg.Node, log.With("component", "pods"))
				pods = dir
				g.Go(func() error { return dir.Run(ctx) })
				// The Node's spec (cordon, taints) and status (allocatable), and the
				// pods' requests, are not in their metadata: the dynamic client reads
				// them, which links no typed API.
				rc, err := kube.RESTConfig(kubeconfig)
				if err != nil {
					return err
				}
				dyn, err := dynamic.NewForConfig(rc)
				if err != nil {
					return fmt.Errorf("kubernetes client for %s: %w", rc.Host, err)
				}
				node := kube.NewNodeWatch(dyn, cfg.Node, log.With("component", "node"))
				requests := kube.NewPodRequests(dyn, cfg.Node, log.With("component", "pod-requests"))
				cfg.NodeLabels, cfg.NodeScheduling = node.Labels, node.Scheduling
				cfg.NodeResources = kube.NodeResourcesOf(node.Allocatable, requests.Requested)
				g.Go(func() error { return node.Run(ctx) })
				g.Go(func() error { return requests.Run(ctx) })
			}
		}
	}

	natsOpts.Name = "gpuscaler-collector-" + cfg.Node
	natsOpts.Log = log.With("component", "nats")
	natsOpts.RetryInitialConnect = true
	nc, err := natsconn.Connect(ctx, natsOpts)
	if err != nil {
		return err
	}
	defer nc.Close()

	cfg.NATSProblem = nc.Problem
	c, err := collector.New(cfg, src, attrib, pods, nc.Conn, log.With("component", "collector"), reg)
	if err != nil {
		return err
	}
	err = serveMetricsAndProbes(ctx, g, httpAddr, reg, log, func() error {
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
