package cluster

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"sigs.k8s.io/yaml"

	"github.com/kedacore/keda/v2/pkg/scalers/externalscaler"
)

// Gpuscaler runs the product's binary as it runs in a cluster: the scaler, node
// collectors (sim source), gateways and one-shot queue reports.
type Gpuscaler struct {
	Bin     string
	NATSURL string
	procs   *Procs
	dir     string
}

// NewGpuscaler returns a runner of bin against the NATS server at natsURL; dir holds its
// files (simulation configs).
func NewGpuscaler(ps *Procs, bin, natsURL, dir string) *Gpuscaler {
	return &Gpuscaler{Bin: bin, NATSURL: natsURL, procs: ps, dir: dir}
}

// Scaler is a running gpuscaler scaler.
type Scaler struct {
	*Process
	// GRPCAddr is what triggers name as scalerAddress; HTTPAddr serves /metrics, /readyz.
	GRPCAddr, HTTPAddr string
}

// StartScaler starts `gpuscaler scaler` on NATS with extra flags and waits for /readyz.
func (g *Gpuscaler) StartScaler(ctx context.Context, extra ...string) (*Scaler, error) {
	return g.startScaler(ctx, "gpuscaler-scaler", append([]string{"--nats-url=" + g.NATSURL}, extra...))
}

// StartEmbeddedScaler starts `gpuscaler scaler` with no --nats-url, so that it runs its
// own NATS server, and returns it with a runner publishing to that server.
func StartEmbeddedScaler(ctx context.Context, ps *Procs, bin, dir string) (*Scaler, *Gpuscaler, error) {
	natsAddr, err := FreeAddr()
	if err != nil {
		return nil, nil, err
	}
	simDir := filepath.Join(dir, "sim-embedded")
	if err := os.MkdirAll(simDir, 0o755); err != nil {
		return nil, nil, err
	}
	g := NewGpuscaler(ps, bin, "nats://"+natsAddr, simDir)
	s, err := g.startScaler(ctx, "gpuscaler-scaler-embedded", []string{
		"--embedded-nats-addr=" + natsAddr,
		"--data-dir=" + filepath.Join(dir, "embedded-nats"),
	})
	if err != nil {
		return nil, nil, err
	}
	return s, g, nil
}

func (g *Gpuscaler) startScaler(ctx context.Context, name string, flags []string) (*Scaler, error) {
	grpcAddr, err := FreeAddr()
	if err != nil {
		return nil, err
	}
	httpAddr, err := FreeAddr()
	if err != nil {
		return nil, err
	}
	return g.startScalerAt(ctx, name, append([]string{"--grpc-addr=" + grpcAddr, "--http-addr=" + httpAddr}, flags...), grpcAddr)
}

// startScalerAt starts `gpuscaler scaler` with flags, which set --grpc-addr (grpcAddr)
// and --http-addr, and waits for /readyz.
func (g *Gpuscaler) startScalerAt(ctx context.Context, name string, flags []string, grpcAddr string) (*Scaler, error) {
	httpAddr := ""
	for _, f := range flags {
		if v, ok := strings.CutPrefix(f, "--http-addr="); ok {
			httpAddr = v
		}
	}
	args := append([]string{"scaler", "--log-level=debug"}, flags...)
	p, err := g.procs.Start(name, g.Bin, args)
	if err != nil {
		return nil, err
	}
	s := &Scaler{Process: p, GRPCAddr: grpcAddr, HTTPAddr: httpAddr}
	err = waitHTTPOK(ctx, time.Minute, 100*time.Millisecond, "gpuscaler scaler ready", p, "http://"+httpAddr+"/readyz")
	if err != nil {
		p.Stop()
		return nil, err
	}
	return s, nil
}

// SimNode describes a simulated GPU node (gpuscaler's --sim-config, see collector/sim.Config).
type SimNode struct {
	GPUs   int      `json:"gpus"`
	Pods   []SimPod `json:"pods,omitempty"`
	Util   float64  `json:"util,omitempty"`
	Jitter float64  `json:"jitter"`
}

// SimPod is a pod holding simulated GPUs ("0", "1", ...).
type SimPod struct {
	Namespace string            `json:"namespace"`
	Name      string            `json:"name"`
	Labels    map[string]string `json:"labels,omitempty"`
	OwnerKind string            `json:"ownerKind,omitempty"`
	OwnerName string            `json:"ownerName,omitempty"`
	GPUs      []string          `json:"gpus"`
	Util      *float64          `json:"util,omitempty"`
}

// Collector is a running gpuscaler collector with the sim source.
type Collector struct {
	*Process
	Node     string
	HTTPAddr string
}

// StartCollector starts `gpuscaler collector --source sim` for node, reporting every
// interval, with extra flags, and waits for its /readyz (a report went out).
func (g *Gpuscaler) StartCollector(ctx context.Context, node string, sim SimNode, interval time.Duration, extra ...string) (*Collector, error) {
	cfg, err := yaml.Marshal(sim)
	if err != nil {
		return nil, err
	}
	path := filepath.Join(g.dir, "sim-"+node+".yaml")
	if err := os.WriteFile(path, cfg, 0o644); err != nil {
		return nil, err
	}
	httpAddr, err := FreeAddr()
	if err != nil {
		return nil, err
	}
	p, err := g.procs.Start("gpuscaler-collector-"+node, g.Bin, append([]string{"collector",
		"--source=sim", "--sim-config=" + path, "--kubeconfig=none",
		"--node=" + node, "--collector-id=e2e-" + node,
		"--nats-url=" + g.NATSURL,
		"--http-addr=" + httpAddr,
		"--interval=" + interval.String(),
	}, extra...))
	if err != nil {
		return nil, err
	}
	c := &Collector{Process: p, Node: node, HTTPAddr: httpAddr}
	err = waitHTTPOK(ctx, 30*time.Second, 100*time.Millisecond, "collector "+node+" ready", p, "http://"+httpAddr+"/readyz")
	if err != nil {
		p.Stop()
		return nil, err
	}
	return c, nil
}

// StartClusterCollector starts `gpuscaler collector --source sim --sim-from-cluster` for a
// fake node: it plays the node's kubelet for its GPUs (the pods the scheduler bound to
// node hold them, and a pod-resources socket says so) and attributes them through that
// socket and the API, as on a real node. sim gives the GPUs and the load.
func (g *Gpuscaler) StartClusterCollector(ctx context.Context, node, kubeconfig string, sim SimNode, interval time.Duration) (*Collector, error) {
	// Extra flags come after StartCollector's own, and the last --kubeconfig counts.
	return g.StartCollector(ctx, node, sim, interval, "--sim-from-cluster", "--kubeconfig="+kubeconfig,
		"--pod-resources-socket="+filepath.Join(g.dir, "kubelet-"+node, "kubelet.sock"))
}

// GatewayOptions say how a `gpuscaler gateway` runs.
type GatewayOptions struct {
	// Namespace is the gateway's namespace: its routes' Services and queues.
	Namespace string
	// Kubeconfig reads the namespace's EndpointSlices.
	Kubeconfig string
	// Routes is the routes file's content (gateway.ParseRoutes).
	Routes string
	// ProducerID names this gateway in its queue reports; each replica has its own.
	ProducerID string
	// ServiceAddresses are --service-address values, NAME:PORT=HOST:PORT: where the
	// traffic of a Service's port goes instead of its cluster DNS name.
	ServiceAddresses []string
	// ReportInterval is the time between a queue's heartbeat reports.
	ReportInterval time.Duration
	// LogLevel is --log-level; empty is debug, every request logged.
	LogLevel string
}

// Gateway is a running gpuscaler gateway.
type Gateway struct {
	*Process
	// Addr is where clients connect; HTTPAddr serves /metrics and /readyz.
	Addr, HTTPAddr string
}

// StartGateway starts `gpuscaler gateway` on NATS with the routes of o, listening on a
// free loopback port, and waits for its /readyz: routes applied, EndpointSlices read.
// It lets requests finish for 2 s when stopped (SIGTERM).
func (g *Gpuscaler) StartGateway(ctx context.Context, o GatewayOptions) (*Gateway, error) {
	routes, err := writeFile(filepath.Join(g.dir, "gateway-"+o.ProducerID), "routes.yaml", []byte(o.Routes))
	if err != nil {
		return nil, err
	}
	addr, err := FreeAddr()
	if err != nil {
		return nil, err
	}
	httpAddr, err := FreeAddr()
	if err != nil {
		return nil, err
	}
	level := o.LogLevel
	if level == "" {
		level = "debug"
	}
	args := []string{"gateway", "--log-level=" + level,
		"--routes=" + routes,
		"--listen=" + addr, "--http-addr=" + httpAddr,
		"--namespace=" + o.Namespace, "--kubeconfig=" + o.Kubeconfig,
		"--nats-url=" + g.NATSURL,
		"--producer-id=" + o.ProducerID,
		"--report-interval=" + o.ReportInterval.String(),
		"--shutdown-grace=2s",
	}
	for _, a := range o.ServiceAddresses {
		args = append(args, "--service-address="+a)
	}
	p, err := g.procs.Start("gpuscaler-gateway-"+o.ProducerID, g.Bin, args)
	if err != nil {
		return nil, err
	}
	gw := &Gateway{Process: p, Addr: addr, HTTPAddr: httpAddr}
	if err := waitHTTPOK(ctx, 30*time.Second, 100*time.Millisecond, "gateway "+o.ProducerID+" ready", p, "http://"+httpAddr+"/readyz"); err != nil {
		p.Stop()
		return nil, err
	}
	return gw, nil
}

// Report is one QueueReport.
type Report struct {
	Waiting, InFlight, Arrivals uint64
}

// PublishQueue runs `gpuscaler publish queue`, which returns once the GPUSCALER stream
// has stored the report. It waits up to 20 s for that: a NATS cluster that lost the
// stream's leader elects another within its election timeout (4 to 9 s in nats-server).
func (g *Gpuscaler) PublishQueue(ctx context.Context, namespace, queue string, r Report) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, g.Bin, "publish", "queue",
		"--nats-url="+g.NATSURL, "--namespace="+namespace, "--queue="+queue,
		"--waiting="+strconv.FormatUint(r.Waiting, 10),
		"--in-flight="+strconv.FormatUint(r.InFlight, 10),
		"--arrivals="+strconv.FormatUint(r.Arrivals, 10),
		"--producer-id=e2e",
		"--timeout=20s",
	)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("gpuscaler publish queue %s/%s: %w: %s", namespace, queue, err, strings.TrimSpace(out.String()))
	}
	return nil
}

// SetSim replaces the simulated node's pods and load while the collector runs (PUT /sim).
func (c *Collector) SetSim(ctx context.Context, sim SimNode) error {
	body, err := yaml.Marshal(sim)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, "http://"+c.HTTPAddr+"/sim", bytes.NewReader(body))
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
		return fmt.Errorf("PUT /sim on %s: %s: %s", c.Node, resp.Status, msg)
	}
	return nil
}

// Gauge reads a metric without labels from the scaler's /metrics.
func (s *Scaler) Gauge(ctx context.Context, name string) (float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+s.HTTPAddr+"/metrics", nil)
	if err != nil {
		return 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, err
	}
	for line := range strings.SplitSeq(string(body), "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			return strconv.ParseFloat(strings.TrimSpace(v), 64)
		}
	}
	return 0, fmt.Errorf("no %s in %s/metrics", name, s.HTTPAddr)
}

// IsActive asks the scaler directly, with KEDA's generated externalscaler client, whether
// the trigger with metadata is active for a ScaledObject namespace/name. Tests use it to
// know the scaler has applied a report before they act on the cluster.
func (s *Scaler) IsActive(ctx context.Context, namespace, name string, metadata map[string]string) (bool, error) {
	conn, err := grpc.NewClient(s.GRPCAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return false, err
	}
	defer conn.Close()
	resp, err := externalscaler.NewExternalScalerClient(conn).IsActive(ctx, &externalscaler.ScaledObjectRef{
		Name: name, Namespace: namespace, ScalerMetadata: metadata,
	})
	if err != nil {
		return false, err
	}
	return resp.GetResult(), nil
}

// Metric asks the scaler directly for a trigger's metric (such as "queue-backlog"), as
// KEDA's GetMetrics call would.
func (s *Scaler) Metric(ctx context.Context, namespace, name string, metadata map[string]string, metric string) (float64, error) {
	conn, err := grpc.NewClient(s.GRPCAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	resp, err := externalscaler.NewExternalScalerClient(conn).GetMetrics(ctx, &externalscaler.GetMetricsRequest{
		ScaledObjectRef: &externalscaler.ScaledObjectRef{Name: name, Namespace: namespace, ScalerMetadata: metadata},
		MetricName:      metric,
	})
	if err != nil {
		return 0, err
	}
	for _, v := range resp.GetMetricValues() {
		if v.GetMetricName() == metric {
			return v.GetMetricValueFloat(), nil
		}
	}
	return 0, fmt.Errorf("no %s in the scaler's answer", metric)
}

// GPUHolders asks `gpuscaler explain` (against the scaler at addr) which pods hold the
// GPUs a podSelector trigger's figures come from: node → the pods holding its GPUs
// (one entry per GPU held).
func (g *Gpuscaler) GPUHolders(ctx context.Context, addr, namespace string, metadata map[string]string) (map[string][]string, error) {
	out, err := g.explain(ctx, addr, namespace, metadata)
	if err != nil {
		return nil, err
	}
	var results []struct {
		Explanation struct {
			Nodes []struct {
				Node string `json:"node"`
				GPUs []struct {
					Holds []struct {
						Namespace string `json:"namespace"`
						Pod       string `json:"pod"`
					} `json:"holds"`
				} `json:"gpus"`
			} `json:"nodes"`
		} `json:"explanation"`
	}
	if err := json.Unmarshal(out, &results); err != nil {
		return nil, fmt.Errorf("gpuscaler explain -o json: %w: %s", err, out)
	}
	holders := map[string][]string{}
	for _, r := range results {
		for _, n := range r.Explanation.Nodes {
			for _, gpu := range n.GPUs {
				for _, h := range gpu.Holds {
					holders[n.Node] = append(holders[n.Node], h.Namespace+"/"+h.Pod)
				}
			}
		}
	}
	return holders, nil
}

// Producer is one producer's last report of a queue, as `gpuscaler explain` shows it.
type Producer struct {
	ID       string `json:"producerId"`
	Waiting  uint64 `json:"waiting,string"`
	InFlight uint64 `json:"inFlight,string"`
	// Stale: older than the trigger's staleAfter; it no longer counts.
	Stale bool `json:"stale"`
}

// QueueProducers asks `gpuscaler explain` (against the scaler at addr) for the producers
// of a queue trigger's queue and their last reports, by producer id.
func (g *Gpuscaler) QueueProducers(ctx context.Context, addr, namespace string, metadata map[string]string) (map[string]Producer, error) {
	out, err := g.explain(ctx, addr, namespace, metadata)
	if err != nil {
		return nil, err
	}
	var results []struct {
		Explanation struct {
			Queue struct {
				Producers []Producer `json:"producers"`
			} `json:"queue"`
		} `json:"explanation"`
	}
	if err := json.Unmarshal(out, &results); err != nil {
		return nil, fmt.Errorf("gpuscaler explain -o json: %w: %s", err, out)
	}
	producers := map[string]Producer{}
	for _, r := range results {
		for _, p := range r.Explanation.Queue.Producers {
			producers[p.ID] = p
		}
	}
	return producers, nil
}

// explain runs `gpuscaler explain -o json` for a trigger's metadata against the scaler
// at addr.
func (g *Gpuscaler) explain(ctx context.Context, addr, namespace string, metadata map[string]string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	args := []string{"explain", "--scaler-address=" + addr, "--namespace=" + namespace, "--output=json"}
	for k, v := range metadata {
		args = append(args, "--metadata="+k+"="+v)
	}
	cmd := exec.CommandContext(ctx, g.Bin, args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("gpuscaler explain: %w: %s", err, strings.TrimSpace(stderr.String()))
	}
	return out, nil
}
