package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"golang.org/x/sync/errgroup"
	"k8s.io/client-go/dynamic"

	"github.com/gpuscaler/gpuscaler/collector/kube"
	"github.com/gpuscaler/gpuscaler/gateway"
	"github.com/gpuscaler/gpuscaler/internal/natsconn"
	gpuscalerv1 "github.com/gpuscaler/gpuscaler/proto/gpuscaler/v1"
	"github.com/gpuscaler/gpuscaler/queue"
)

const gatewayAbout = `
The front door of a namespace's HTTP inference Services (vLLM, SGLang, TGI, any
OpenAI-compatible API). Each route of --routes sends the requests it matches to a Service
of the namespace (or a URL) and counts them in a queue: waiting until forwarded, in
flight until the response's last byte. Each replica reports its share as a producer of
its own (gpuscaler.v1.queue.<ns>.<queue>.<producer>); the scaler sums the live ones.
While a route's Service has no ready endpoint (EndpointSlices, watched), requests are
held, which wakes a workload scaled to zero, until one is ready or the route's
holdTimeout passes (then 503, Retry-After and an OpenAI-style JSON error). Streams are
passed through as written; a client that leaves cancels its upstream request.

The routes file (YAML; reloaded when it changes, a broken one is logged and the last good
routes stay):

  routes:
  - name: llm                               # unique
    host: llm.example.com                   # optional: exact, or *.example.com
    pathPrefix: /v1                         # optional, default /; longest prefix wins
    header: {name: X-Model, value: llama}   # optional; preferred over no header
    service: {name: llm-server, port: 8000} # a Service in --namespace
    queue: llm-requests                     # the queue a ScaledObject's trigger reads
    holdTimeout: 5m                         # how long a request may wait for a replica
    concurrency: 4                          # optional: per replica; forwards to endpoints
                                            # directly and holds what exceeds it
  - name: dev
    url: http://127.0.0.1:8000              # instead of service, outside a cluster
    healthPath: /health                     # ready when it answers 2xx (default /health)
    queue: dev
    holdTimeout: 30s

Example:
  gpuscaler gateway --routes /etc/gpuscaler/routes.yaml --nats-url nats://nats:4222 \
      --nats-token-file /var/run/secrets/gpuscaler/token`

func runGateway(ctx context.Context, args []string, env envFunc, stdout, stderr io.Writer) error {
	natsOpts := natsconn.Options{URLs: natsconn.DefaultURL}
	cfg := gateway.Config{
		MaxHeld:          gateway.DefaultMaxHeld,
		MaxHeldBytes:     gateway.DefaultMaxHeldBytes,
		MaxBodyBytes:     gateway.DefaultMaxBodyBytes,
		MaxHeaderBytes:   gateway.DefaultMaxHeaderBytes,
		FirstByteTimeout: gateway.DefaultFirstByteTimeout,
		IdleTimeout:      gateway.DefaultIdleTimeout,
		ShutdownGrace:    gateway.DefaultShutdownGrace,
	}
	var (
		listen, httpAddr, kubeconfig, producerID string
		reportInterval                           = queue.DefaultInterval
	)
	fs := newFlagSet("gateway", "gateway --routes FILE [flags]", gatewayAbout, stdout)
	fs.StringVar(&cfg.RoutesFile, "routes", "", "the routes file (YAML, above); required")
	fs.StringVar(&listen, "listen", ":8080", "where clients connect")
	fs.StringVar(&httpAddr, "http-addr", ":9091", `address of /metrics, /healthz and /readyz; "-" turns HTTP off`)
	fs.StringVar(&cfg.Namespace, "namespace", "", "the gateway's namespace, where its routes' Services are and its queues count; empty reads $POD_NAMESPACE, then the pod's service account namespace file")
	fs.StringVar(&kubeconfig, "kubeconfig", "", `kubeconfig for the Kubernetes API (EndpointSlices); empty uses the in-cluster config, "none" does without (url routes only)`)
	fs.IntVar(&cfg.MaxHeld, "max-held", cfg.MaxHeld, "requests one route may hold; more get 503 overflow")
	fs.Int64Var(&cfg.MaxHeldBytes, "max-held-bytes", cfg.MaxHeldBytes, "request body bytes one route may hold; more get 503 overflow")
	fs.Int64Var(&cfg.MaxBodyBytes, "max-body-bytes", cfg.MaxBodyBytes, "largest request body; larger gets 413")
	fs.IntVar(&cfg.MaxHeaderBytes, "max-header-bytes", cfg.MaxHeaderBytes, "largest request header; larger gets 431")
	fs.DurationVar(&cfg.FirstByteTimeout, "first-byte-timeout", cfg.FirstByteTimeout, "how long a forwarded request may wait for its response header (a long prompt takes long to its first token)")
	fs.DurationVar(&cfg.IdleTimeout, "idle-timeout", cfg.IdleTimeout, "how long a response may send nothing; a stream has no total time limit")
	fs.DurationVar(&cfg.ShutdownGrace, "shutdown-grace", cfg.ShutdownGrace, "on SIGTERM, how long requests in flight and held may finish")
	fs.DurationVar(&reportInterval, "report-interval", reportInterval, "time between a queue's heartbeat reports")
	fs.StringVar(&producerID, "producer-id", "", "names this gateway in its queue reports, different for each replica; empty reads $POD_NAME, then the host name")
	serviceAddrs := serviceAddresses{}
	fs.Var(serviceAddrs, "service-address", "NAME:PORT=HOST:PORT, repeatable (or comma-separated): send the traffic of Service NAME's port PORT to HOST:PORT instead of its cluster DNS name, for a gateway running outside the cluster, e.g. with kubectl port-forward; readiness still comes from the Service's EndpointSlices")
	natsFlags(fs, &natsOpts, "comma-separated NATS URLs")
	newLogger := logFlags(fs, stderr, "info")
	if err := parseFlags(fs, args, env); err != nil {
		return err
	}
	log, err := newLogger()
	if err != nil {
		return err
	}
	if cfg.RoutesFile == "" {
		return usageError{errors.New("--routes is required")}
	}
	if err := firstErr(
		positive("max-held", cfg.MaxHeld, "a number of requests, 1 or more"),
		positive("max-held-bytes", cfg.MaxHeldBytes, "a number of bytes, 1 or more"),
		positive("max-body-bytes", cfg.MaxBodyBytes, "a number of bytes, 1 or more"),
		positive("max-header-bytes", cfg.MaxHeaderBytes, "a number of bytes, 1 or more"),
		positive("first-byte-timeout", cfg.FirstByteTimeout, "a positive duration"),
		positive("idle-timeout", cfg.IdleTimeout, "a positive duration"),
		positive("shutdown-grace", cfg.ShutdownGrace, "a positive duration"),
		positive("report-interval", reportInterval, "a positive duration"),
	); err != nil {
		return err
	}
	cfg.Namespace = firstOf(cfg.Namespace, envOr(env, "POD_NAMESPACE"), serviceAccountNamespace())
	if cfg.Namespace == "" {
		return usageError{errors.New("--namespace: not given, no $POD_NAMESPACE, and no service account namespace file: say which namespace the gateway serves")}
	}
	if err := gpuscalerv1.ValidateNamespace(cfg.Namespace); err != nil {
		return usageError{fmt.Errorf("--namespace %q: %w", cfg.Namespace, err)}
	}
	if producerID != "" {
		if err := gpuscalerv1.ValidateProducerID(producerID); err != nil {
			return usageError{fmt.Errorf("--producer-id %q: %w", producerID, err)}
		}
	} else {
		producerID = gpuscalerv1.ProducerID(firstOf(envOr(env, "POD_NAME"), hostname()))
	}
	log = log.With("namespace", cfg.Namespace)

	if kubeconfig != "none" {
		rc, err := kube.RESTConfig(kubeconfig)
		if err != nil {
			return err
		}
		if cfg.Kube, err = dynamic.NewForConfig(rc); err != nil {
			return fmt.Errorf("kubernetes client for %s: %w", rc.Host, err)
		}
	}

	if len(serviceAddrs) > 0 {
		cfg.ServiceAddr = serviceAddrs.lookup
	}

	var nc *natsconn.Conn // connected below, before Run makes the first counter
	cfg.NewCounter = func(q string) (gateway.Counter, error) {
		r, err := queue.NewReporter(nc.Conn, cfg.Namespace, q, queue.Config{
			Interval:   reportInterval,
			ProducerID: producerID,
			Log:        log.With("component", "queue-reporter"),
		})
		if err != nil {
			return nil, err
		}
		return r, nil
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	cfg.Log, cfg.Registerer = log.With("component", "gateway"), reg
	gw, err := gateway.New(cfg)
	if err != nil {
		return err
	}

	natsOpts.Name = "gpuscaler-gateway-" + cfg.Namespace
	natsOpts.Log = log.With("component", "nats")
	natsOpts.RetryInitialConnect = true
	// Replies come back below the namespace's own inbox prefix, the only ones a
	// producer may read where the bus enforces tenancy.
	natsOpts.InboxPrefix = gpuscalerv1.InboxPrefix(cfg.Namespace)
	if nc, err = natsconn.Connect(ctx, natsOpts); err != nil {
		return err
	}
	defer nc.Close()
	lis, err := net.Listen("tcp", listen)
	if err != nil {
		return fmt.Errorf("gateway listener: %w", err)
	}
	g, ctx := errgroup.WithContext(ctx)
	if err := serveMetricsAndProbes(ctx, g, httpAddr, reg, log, gw.Ready, nil); err != nil {
		lis.Close()
		return err
	}
	g.Go(func() error { return gw.Run(ctx, lis) })
	return g.Wait()
}

// serviceAddresses is --service-address: where the traffic of a Service's port goes,
// by "name:port", instead of the Service's cluster DNS name.
type serviceAddresses map[string]string

func (s serviceAddresses) String() string {
	var parts []string
	for k, v := range s {
		parts = append(parts, k+"="+v)
	}
	slices.Sort(parts)
	return strings.Join(parts, ",")
}

// Set adds one NAME:PORT=HOST:PORT, or several separated by commas (as an environment
// variable gives them).
func (s serviceAddresses) Set(v string) error {
	for item := range strings.SplitSeq(v, ",") {
		svc, addr, ok := strings.Cut(strings.TrimSpace(item), "=")
		if !ok {
			return fmt.Errorf("%q: want NAME:PORT=HOST:PORT", item)
		}
		name, port, err := net.SplitHostPort(svc)
		if err != nil || name == "" || parsePort(port) == 0 {
			return fmt.Errorf("%q: want a Service's NAME:PORT before '=', such as llm-server:8000", item)
		}
		host, hostPort, err := net.SplitHostPort(addr)
		if err != nil || host == "" || parsePort(hostPort) == 0 {
			return fmt.Errorf("%q: want HOST:PORT after '=', such as 127.0.0.1:8000", item)
		}
		key := serviceKey(name, parsePort(port))
		if _, dup := s[key]; dup {
			return fmt.Errorf("%q: %s is mapped twice", item, svc)
		}
		s[key] = addr
	}
	return nil
}

// lookup is gateway.Config.ServiceAddr: the mapped address, or the Service's cluster
// DNS name.
func (s serviceAddresses) lookup(name, namespace string, port int) string {
	if addr, ok := s[serviceKey(name, port)]; ok {
		return addr
	}
	return gateway.ClusterServiceAddr(name, namespace, port)
}

func serviceKey(name string, port int) string { return name + ":" + strconv.Itoa(port) }

// parsePort returns the TCP port p names, or 0 when it names none.
func parsePort(p string) int {
	n, err := strconv.Atoi(p)
	if err != nil || n < 1 || n > 65535 {
		return 0
	}
	return n
}

// serviceAccountNamespace returns the namespace of the pod's service account, or "".
func serviceAccountNamespace() string {
	b, err := os.ReadFile("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}
