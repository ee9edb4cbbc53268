package main

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"golang.org/x/sync/errgroup"

	"github.com/gpuscaler/gpuscaler/internal/embedded"
	"github.com/gpuscaler/gpuscaler/internal/natsconn"
	gpuscalerv1 "github.com/gpuscaler/gpuscaler/proto/gpuscaler/v1"
	"github.com/gpuscaler/gpuscaler/scaler"
	"github.com/gpuscaler/gpuscaler/scaler/apipods"
)

const scalerAbout = `
Runs the KEDA external scaler. It keeps the latest report of every GPU node and queue
from the GPUSCALER and GPUSCALER_QUEUES JetStream streams (creating or updating them), and
serves KEDA's ExternalScaler gRPC service: IsActive, StreamIsActive, GetMetricSpec,
GetMetrics.

With no --nats-url it starts an embedded NATS server with JetStream, which collectors and
producers reach at --embedded-nats-addr. That bus checks no identities: anyone who reaches
it speaks for every namespace and node, so it is for development only. Point a ScaledObject trigger at it with
  type: external-push
  metadata: {scalerAddress: <host>:9090, queue: <name>}`

func runScaler(ctx context.Context, args []string, env envFunc, stdout, stderr io.Writer) error {
	var (
		cfg            scaler.Config
		natsOpts       natsconn.Options
		embeddedAddr   string
		dataDir        string
		streamMaxAge   = scaler.DefaultStreamMaxAge
		tombstoneTTL   = scaler.DefaultNodeTombstoneTTL
		staleAfter     = scaler.DefaultStaleAfter
		streamReplica  = 1
		streamMemory   bool
		streamBytes    int64 = scaler.DefaultStreamMaxBytes
		queueBytes     int64 = scaler.DefaultQueueStreamMaxBytes
		maxConsumers         = scaler.DefaultMaxFollowedConsumers
		maxQueuesPerNS       = scaler.DefaultMaxQueuesPerNamespace
		maxProducers         = scaler.DefaultMaxProducersPerQueue
		kubeconfig           = kubeconfigNone
	)
	fs := newFlagSet("scaler", "scaler [flags]", scalerAbout, stdout)
	fs.StringVar(&cfg.GRPCAddr, "grpc-addr", ":9090", "address of the gRPC ExternalScaler service KEDA calls")
	fs.StringVar(&cfg.HTTPAddr, "http-addr", ":8080", `address of /metrics, /healthz, /readyz and /status; "-" turns HTTP off`)
	statusPage := fs.Bool("status-page", false, "serve the status page, /status on --http-addr: the triggers KEDA asked about with their answers, every queue, node and GPU and the pods holding them, to whoever reaches --http-addr (so keep that port private)")
	fs.StringVar(&cfg.TLS.CertFile, "tls-cert", "", "PEM certificate of the gRPC server (TLS when set)")
	fs.StringVar(&cfg.TLS.KeyFile, "tls-key", "", "PEM key of --tls-cert")
	fs.StringVar(&cfg.TLS.ClientCAFile, "tls-client-ca", "", "PEM CA bundle; when set, clients must present a certificate it signed (mutual TLS)")
	fs.DurationVar(&cfg.ConsumerRefresh, "consumer-refresh", scaler.DefaultConsumerRefresh, "how often the info of a JetStream consumer named by stream+consumer triggers is fetched, however many triggers share it")
	fs.IntVar(&maxConsumers, "max-followed-consumers", maxConsumers, "how many JetStream consumers stream+consumer triggers can make the scaler follow at once; a trigger naming one more is refused (ResourceExhausted) until one no trigger has read for "+scaler.ConsumerIdleAfter.String()+" is dropped; 0 follows none")
	fs.Var((*namespaceList)(&cfg.JetStreamNamespaces), "jetstream-namespaces", jetStreamNamespacesHelp+": stream+consumer triggers of such a namespace read that account, and wake at the next --consumer-refresh rather than on the first message")
	fs.IntVar(&maxQueuesPerNS, "max-queues-per-namespace", maxQueuesPerNS, "how many queues the scaler tracks per namespace; a report of a new queue past it is dropped, counted (reason queue_limit) and logged with its namespace, until queues silent for --stream-max-age are forgotten; 0 sets no limit")
	fs.IntVar(&maxProducers, "max-producers-per-queue", maxProducers, "how many producers the scaler tracks per queue (a queue reads the sum of its live producers' shares: the replicas of a gateway, say); a report of a new producer past it is dropped, counted (reason producer_limit) and logged, until one stops or falls silent for --stream-max-age; 0 sets no limit")
	fs.DurationVar(&cfg.MaxConnectionAge, "max-connection-age", scaler.DefaultMaxConnectionAge, "how long a KEDA connection lives before the scaler asks for a new one, so KEDA resolves the address again and reaches replicas added since; open streams are not cut")
	fs.DurationVar(&staleAfter, "stale-after", staleAfter, "staleAfter of triggers that set none, and how long NATS may be down before /readyz fails")
	fs.DurationVar(&streamMaxAge, "stream-max-age", streamMaxAge, "how long the stream keeps a node's or queue's last report, and the scaler remembers it")
	fs.DurationVar(&tombstoneTTL, "node-tombstone-ttl", tombstoneTTL, "how long a node forgotten after --stream-max-age keeps the podSelector triggers that selected its pods, and select no live pod, Unavailable rather than reading them as idle; 0 keeps none")
	fs.Int64Var(&streamBytes, "stream-max-bytes", streamBytes, "bound on the size of stream "+gpuscalerv1.StreamName+", the nodes' reports; past it the reports of the nodes silent longest go first")
	fs.Int64Var(&queueBytes, "queue-stream-max-bytes", queueBytes, "bound on the size of stream "+gpuscalerv1.QueueStreamName+", the queues' reports, which no node report shares; past it the reports of the queue producers silent longest go first")
	fs.IntVar(&streamReplica, "stream-replicas", streamReplica, "replicas of the "+gpuscalerv1.StreamName+" and "+gpuscalerv1.QueueStreamName+" streams in a clustered NATS")
	fs.BoolVar(&streamMemory, "stream-memory", false, "keep the "+gpuscalerv1.StreamName+" and "+gpuscalerv1.QueueStreamName+" streams in memory rather than on disk")
	fs.StringVar(&kubeconfig, "kubeconfig", kubeconfig, `the Kubernetes API the scaler checks node reports against: "in-cluster" (the pod's service account; RBAC list and watch on pods and nodes) or a kubeconfig file. `+
		`A node is then believed only of the pods the API places on it, podSelector matches the API's labels, and a node's CPU and memory are the API's; until the pods are listed, triggers that read pods are Unavailable. `+
		`"none" believes every node's report of which pods hold its GPUs, for development`)
	natsFlags(fs, &natsOpts, "comma-separated NATS URLs; empty starts an embedded NATS server")
	fs.StringVar(&embeddedAddr, "embedded-nats-addr", "127.0.0.1:4222", "where the embedded NATS server listens for collectors and producers")
	fs.StringVar(&dataDir, "data-dir", "", "JetStream store of the embedded NATS server; empty means a temporary directory")
	newLogger := logFlags(fs, stderr, "info")
	if err := parseFlags(fs, args, env); err != nil {
		return err
	}
	log, err := newLogger()
	if err != nil {
		return err
	}
	if err := firstErr(
		positive("stale-after", staleAfter, "a duration from 1s to 24h"),
		positive("stream-max-age", streamMaxAge, "a duration longer than --stale-after"),
		positive("stream-max-bytes", streamBytes, "a size in bytes"),
		positive("queue-stream-max-bytes", queueBytes, "a size in bytes"),
		positive("stream-replicas", streamReplica, "1 or more replicas"),
		positive("consumer-refresh", cfg.ConsumerRefresh, "a positive duration"),
		positive("max-connection-age", cfg.MaxConnectionAge, "a positive duration"),
	); err != nil {
		return err
	}
	cfg.StaleAfter = staleAfter
	cfg.NoStatusPage = !*statusPage
	if cfg.NodeTombstoneTTL, err = zeroMeansOff("node-tombstone-ttl", tombstoneTTL, "a duration, or 0 to keep no tombstones"); err != nil {
		return err
	}
	if cfg.MaxFollowedConsumers, err = zeroMeansOff("max-followed-consumers", maxConsumers, "a number of consumers, or 0 to follow none"); err != nil {
		return err
	}
	if cfg.MaxQueuesPerNamespace, err = zeroMeansOff("max-queues-per-namespace", maxQueuesPerNS, "a number of queues, or 0 for no limit"); err != nil {
		return err
	}
	if cfg.MaxProducersPerQueue, err = zeroMeansOff("max-producers-per-queue", maxProducers, "a number of producers, or 0 for no limit"); err != nil {
		return err
	}
	cfg.Stream = scaler.StreamConfig{MaxAge: streamMaxAge, MaxBytes: streamBytes, QueueMaxBytes: queueBytes, Replicas: streamReplica, Memory: streamMemory}
	if natsOpts.URLs == "" {
		if f := natsClientFlag(natsOpts); f != "" {
			return usageError{fmt.Errorf("--%s needs --nats-url: without it the scaler runs an embedded NATS server and connects to it in process, with no TLS and no identities", f)}
		}
	}

	natsOpts.Name = "gpuscaler-scaler"
	natsOpts.Log = log.With("component", "nats")
	natsOpts.RetryInitialConnect = true
	publishURL := natsOpts.URLs
	if natsOpts.URLs == "" {
		ns, err := embedded.Start(embedded.Options{Addr: embeddedAddr, StoreDir: dataDir, Log: log.With("component", "embedded-nats")})
		if err != nil {
			return err
		}
		defer ns.Shutdown()
		natsOpts.InProcess = ns.Server
		publishURL = ns.ClientURL()
		log.Info("started embedded NATS with JetStream", "url", publishURL, "storeDir", ns.StoreDir())
		log.Warn(openBusWarning, "url", publishURL)
	}
	nc, err := natsconn.Connect(ctx, natsOpts)
	if err != nil {
		return err
	}
	defer nc.Close()

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	cfg.NATSHealth = nc
	var pods *apipods.Directory
	if kubeconfig != kubeconfigNone {
		client, err := apipods.NewClient(kubeconfig)
		if err != nil {
			return err
		}
		pods = apipods.New(client, log.With("component", "pods"))
		cfg.Pods = pods
	} else {
		log.Warn("no Kubernetes API (--kubeconfig none): every node's report of which pods hold its GPUs, and their labels, is believed as it comes, " +
			"so whoever may publish a node's reports can speak for any namespace's pods; see the threat model in deploy/README.md")
	}
	s, err := scaler.New(cfg, nc.Conn, log, reg)
	if err != nil {
		return err
	}
	go func() {
		select {
		case <-s.Ready():
			log.Info("ready", "grpcAddr", s.GRPCAddr().String(),
				"try", "gpuscaler publish queue --namespace default --queue demo --waiting 3"+urlHint(publishURL))
		case <-ctx.Done():
		}
	}()
	if pods == nil {
		return s.Run(ctx)
	}
	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error { return pods.Run(ctx) })
	g.Go(func() error { return s.Run(ctx) })
	return g.Wait()
}

// kubeconfigNone is the scaler's --kubeconfig that gives it no Kubernetes API.
const kubeconfigNone = "none"

// openBusWarning is logged once when the scaler starts the embedded NATS server.
const openBusWarning = "the embedded NATS server is an open bus, for development only: any client that can reach its address " +
	"can publish reports for any namespace and node, and use the JetStream API. On a shared cluster give --nats-url a NATS server " +
	"that checks identities; see the threat model in deploy/README.md"

// urlHint returns the --nats-url flag a publisher needs to reach urls, or nothing when
// the default reaches it.
func urlHint(urls string) string {
	if urls == "" || urls == natsconn.DefaultURL {
		return ""
	}
	return " --nats-url " + urls
}

// natsClientFlag names a flag that says how to authenticate to NATS or speak TLS with
// it, set in o, or returns "". Those flags apply to the NATS at --nats-url; with the
// embedded server they would be ignored, and a connection the user meant to secure would
// be neither, silently.
func natsClientFlag(o natsconn.Options) string {
	for _, f := range []struct{ name, value string }{
		{"nats-user", o.User}, {"nats-password", o.Password}, {"nats-token", o.Token}, {"nats-token-file", o.TokenFile},
		{"nats-nkey-seed", o.NKeySeedFile}, {"nats-creds", o.CredsFile},
		{"nats-tls-ca", o.TLSCAFile}, {"nats-tls-cert", o.TLSCertFile}, {"nats-tls-key", o.TLSKeyFile},
	} {
		if f.value != "" {
			return f.name
		}
	}
	return ""
}

// zeroMeansOff reads a flag whose 0 turns its feature off, for a scaler.Config field
// where 0 means the default and a negative value means off: 0 becomes -1, a negative
// value is a usage error saying want.
func zeroMeansOff[T int | time.Duration](flag string, v T, want string) (T, error) {
	switch {
	case v < 0:
		return 0, usageError{fmt.Errorf("--%s %v: want %s", flag, v, want)}
	case v == 0:
		return -1, nil
	}
	return v, nil
}
