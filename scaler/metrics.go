package scaler

import (
	"context"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"

	gpuscalerv1 "github.com/gpuscaler/gpuscaler/proto/gpuscaler/v1"
)

// metrics are the scaler's own Prometheus metrics, named gpuscaler_scaler_<what>_<unit>.
type metrics struct {
	eventsReceived    *prometheus.CounterVec
	eventsDropped     *prometheus.CounterVec
	streamsOpen       prometheus.Gauge
	activationsPushed prometheus.Counter
	activationsHeld   prometheus.Counter
	rpcDuration       *prometheus.HistogramVec
	replayDuration    prometheus.Gauge
	replayMessages    prometheus.Gauge
	consumersFollowed prometheus.Gauge
	consumersRefused  prometheus.Counter
	producersLeft     *prometheus.CounterVec
	consumerStalls    prometheus.Counter
	claimsDropped     *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer, state *State, natsConnected, ready, following func() bool, skew func() time.Duration) *metrics {
	m := &metrics{
		eventsReceived: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gpuscaler_scaler_events_received_total",
			Help: "Events read from NATS, by kind (node, queue; unknown when the subject is not a gpuscaler subject).",
		}, []string{"kind"}),
		eventsDropped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gpuscaler_scaler_events_dropped_total",
			Help: "Events dropped, by kind and reason: malformed (subject, decode, invalid, mismatch: naming another node or queue than their subject, metadata), queue_limit: a new queue in a namespace with --max-queues-per-namespace queues, or producer_limit: a new producer of a queue with --max-producers-per-queue producers.",
		}, []string{"kind", "reason"}),
		streamsOpen: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "gpuscaler_scaler_streams_open",
			Help: "StreamIsActive streams open now.",
		}),
		activationsPushed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "gpuscaler_scaler_activations_pushed_total",
			Help: "Activations (true) pushed to StreamIsActive streams after the first message.",
		}),
		activationsHeld: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "gpuscaler_scaler_activations_held_total",
			Help: "Activations StreamIsActive did not push because it had sent true less than the trigger's pushInterval ago; KEDA's polls see them.",
		}),
		rpcDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "gpuscaler_scaler_rpc_duration_seconds",
			Help:    "Latency of unary ExternalScaler calls, by method and gRPC code.",
			Buckets: prometheus.ExponentialBuckets(50e-6, 2.5, 12), // 50µs … ~1.2s
		}, []string{"method", "code"}),
		replayDuration: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "gpuscaler_scaler_replay_duration_seconds",
			Help: "Time from start to the state being restored from the stream.",
		}),
		replayMessages: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "gpuscaler_scaler_replay_messages",
			Help: "Messages read while restoring the state at start.",
		}),
		consumersFollowed: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "gpuscaler_scaler_consumers_followed",
			Help: "JetStream consumers followed now for stream+consumer triggers (at most --max-followed-consumers).",
		}),
		consumersRefused: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "gpuscaler_scaler_consumers_refused_total",
			Help: "Calls refused (ResourceExhausted) because their trigger named a JetStream consumer not followed while --max-followed-consumers were.",
		}),
		producersLeft: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gpuscaler_scaler_queue_producers_left_total",
			Help: "Queue producers whose share left their queue's reading, by reason: stopped (its last report said so) or silent (no report for --stale-after). Each is logged.",
		}, []string{"reason"}),
		consumerStalls: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "gpuscaler_scaler_stream_consumer_stalls_total",
			Help: "Times the stream held messages newer than the last one read for 2 s while nothing was read (a consumer lost with its NATS server, or stuck recreating itself): the scaler then makes a new consumer, resuming after the last message read.",
		}),
		claimsDropped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gpuscaler_scaler_pod_claims_dropped_total",
			Help: "Pods named in node reports and dropped from them because the Kubernetes API does not place them on that node (--kubeconfig set), by reason: unknown_pod (no such pod), other_node (bound to another node, or to none), other_uid (another pod of that name). Logged once a minute per node.",
		}, []string{"reason"}),
	}
	for _, reason := range []string{ClaimUnknownPod, ClaimOtherNode, ClaimOtherUID} {
		m.claimsDropped.WithLabelValues(reason)
	}
	for _, k := range []gpuscalerv1.SubjectKind{gpuscalerv1.KindNode, gpuscalerv1.KindQueue} {
		m.eventsReceived.WithLabelValues(k.String())
	}
	reg.MustRegister(m.eventsReceived, m.eventsDropped, m.streamsOpen, m.activationsPushed, m.activationsHeld,
		m.rpcDuration, m.replayDuration, m.replayMessages, m.consumersFollowed, m.consumersRefused,
		m.producersLeft, m.consumerStalls, m.claimsDropped,
		stateCollector{state},
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "gpuscaler_scaler_nats_connected",
			Help: "1 while the NATS connection is up.",
		}, func() float64 { return boolFloat(natsConnected()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "gpuscaler_scaler_ready",
			Help: "1 once the state is restored from NATS.",
		}, func() float64 { return boolFloat(ready()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "gpuscaler_scaler_stream_following",
			Help: "1 while the scaler follows both its streams, GPUSCALER and GPUSCALER_QUEUES; 0 while it sets one up again.",
		}, func() float64 { return boolFloat(following()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "gpuscaler_scaler_nats_clock_skew_seconds",
			Help: "The NATS server's clock minus this process's, as last measured; reports are judged by NATS's clock.",
		}, func() float64 { return skew().Seconds() }),
	)
	return m
}

// unaryInterceptor records each unary call's latency by method and code.
func (m *metrics) unaryInterceptor(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	start := time.Now()
	resp, err := handler(ctx, req)
	method := info.FullMethod[strings.LastIndexByte(info.FullMethod, '/')+1:]
	m.rpcDuration.WithLabelValues(method, status.Code(err).String()).Observe(time.Since(start).Seconds())
	return resp, err
}

// stateCollector reports the state's size at scrape time, under one lock.
type stateCollector struct{ state *State }

var (
	stateEntriesDesc = prometheus.NewDesc("gpuscaler_scaler_state_entries",
		"Entries the scaler holds, by kind (node, gpu, queue; node_tombstone: forgotten nodes whose pods keep their triggers Unavailable; selection: podSelectors kept up to date for the triggers that read them; node_pool: nodeSelectors kept for capacityAware triggers).", []string{"kind"}, nil)
	namespacesAtQueueLimitDesc = prometheus.NewDesc("gpuscaler_scaler_namespaces_at_queue_limit",
		"Namespaces with as many queues as --max-queues-per-namespace allows; reports of their new queues are dropped, and logged naming the namespace.", nil, nil)
)

func (c stateCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- stateEntriesDesc
	ch <- namespacesAtQueueLimitDesc
}

func (c stateCollector) Collect(ch chan<- prometheus.Metric) {
	nodes, gpus, queues := c.state.Size()
	ch <- prometheus.MustNewConstMetric(stateEntriesDesc, prometheus.GaugeValue, float64(nodes), "node")
	ch <- prometheus.MustNewConstMetric(stateEntriesDesc, prometheus.GaugeValue, float64(gpus), "gpu")
	ch <- prometheus.MustNewConstMetric(stateEntriesDesc, prometheus.GaugeValue, float64(queues), "queue")
	ch <- prometheus.MustNewConstMetric(stateEntriesDesc, prometheus.GaugeValue, float64(c.state.Tombstones()), "node_tombstone")
	selections, pools := c.state.Aggregates()
	ch <- prometheus.MustNewConstMetric(stateEntriesDesc, prometheus.GaugeValue, float64(selections), "selection")
	ch <- prometheus.MustNewConstMetric(stateEntriesDesc, prometheus.GaugeValue, float64(pools), "node_pool")
	ch <- prometheus.MustNewConstMetric(namespacesAtQueueLimitDesc, prometheus.GaugeValue, float64(c.state.NamespacesAtQueueLimit()))
}

func boolFloat(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
