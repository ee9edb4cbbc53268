package collector

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/gpuscaler/gpuscaler/collector/attribution"
	gpuscalerv1 "github.com/gpuscaler/gpuscaler/proto/gpuscaler/v1"
)

// Config is the collector's configuration. Node is required; the rest has defaults.
type Config struct {
	// Node is the Kubernetes node name the reports are about.
	Node string
	// Interval between reports. Default 1s.
	Interval time.Duration
	// CollectorID identifies this collector process in its reports (its pod name, say).
	CollectorID string
	// NodeLabels returns the node's Kubernetes labels for each report (nodeSelector of
	// capacity triggers); nil reports none.
	NodeLabels func() map[string]string
	// NodeScheduling returns whether the scheduler places pods on the node (its cordon
	// and NoSchedule/NoExecute taints) for each report, nil when unknown; nil reports
	// none, which the scaler reads as unknown.
	NodeScheduling func() *gpuscalerv1.NodeScheduling
	// NodeResources returns the node's allocatable CPU and memory and its pods' requests
	// (see kube.NodeResourcesOf) for each report, nil when unknown; nil reports none, which
	// the scaler reads as unknown.
	NodeResources func() *gpuscalerv1.NodeResources
	// NATSProblem says why NATS cannot take a report now, nil when it can: where the
	// connection tries to go, since when, and why it fails (natsconn.Conn.Problem). Nil
	// asks the connection only whether it is connected.
	NATSProblem func() error
	// Now is the clock the pods' cold starts are measured by; nil means time.Now.
	Now func() time.Time
}

// Collector reads the node's GPUs every interval, attributes them to pods and publishes
// a NodeReport. Run it once.
type Collector struct {
	cfg     Config
	subject string
	source  Source
	attrib  Attributor   // nil: the source's own pod labels only
	pods    PodDirectory // nil: no pod labels or owners
	nc      *nats.Conn
	log     *slog.Logger
	metrics *collectorMetrics

	seq       uint64
	published atomic.Int64 // unix nanoseconds of the last publish, 0 before one
	// pending is the newest report not yet published because NATS was disconnected; it
	// replaces any older one (old GPU samples are worth nothing).
	pendingMu sync.Mutex
	pending   []byte
	// warned remembers the problems logged once, by kind.
	warned sync.Map
	// starts measures the pods' cold starts; owned by Report's caller.
	starts *coldStarts
}

// New builds a collector for cfg.Node that reads src, attributes with attrib and pods
// (either may be nil), and publishes on nc. Its metrics are registered on reg.
func New(cfg Config, src Source, attrib Attributor, pods PodDirectory, nc *nats.Conn, log *slog.Logger, reg prometheus.Registerer) (*Collector, error) {
	subject, err := gpuscalerv1.NodeSubject(cfg.Node)
	if err != nil {
		return nil, fmt.Errorf("collector: %w", err)
	}
	if cfg.Interval <= 0 {
		cfg.Interval = time.Second
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	c := &Collector{cfg: cfg, subject: subject, source: src, attrib: attrib, pods: pods, nc: nc, log: log, starts: newColdStarts()}
	c.metrics = newCollectorMetrics(reg, src.Name(), nc.IsConnected, c.lastPublish)
	return c, nil
}

// Run reports every interval until ctx ends. It returns nil then.
func (c *Collector) Run(ctx context.Context) error {
	tick := time.NewTicker(c.cfg.Interval)
	defer tick.Stop()
	retry := time.NewTicker(100 * time.Millisecond) // sends a held report once NATS is back
	defer retry.Stop()
	c.cycle(ctx)
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
			c.cycle(ctx)
		case <-retry.C:
			c.flushPending()
		}
	}
}

// cycle collects, attributes and publishes one report.
func (c *Collector) cycle(parent context.Context) {
	ctx, cancel := context.WithTimeout(parent, c.cfg.Interval)
	defer cancel()
	report, err := c.Report(ctx)
	if err != nil {
		if parent.Err() == nil { // not a shutdown
			c.warnEvery("collect", err)
		}
		return
	}
	data, err := report.MarshalVT()
	if err != nil {
		c.log.Error("encode NodeReport", "err", err)
		return
	}
	c.pendingMu.Lock()
	unpublished := c.pending != nil
	c.pending = data
	c.pendingMu.Unlock()
	if unpublished {
		// The previous report waited a whole interval: say so now, not only once
		// readiness gives up after three.
		c.metrics.errors.WithLabelValues("publish").Inc()
		c.warnEvery("publish", fmt.Errorf("cannot publish: the report made %s ago was not published, and a newer one replaces it: %w",
			c.cfg.Interval, c.notPublishing()))
	}
	c.flushPending()
}

// notPublishing says why the held report is not published.
func (c *Collector) notPublishing() error {
	if c.cfg.NATSProblem != nil {
		if err := c.cfg.NATSProblem(); err != nil {
			return err
		}
	}
	if !c.nc.IsConnected() {
		return errors.New("NATS is not connected")
	}
	return errors.New("NATS did not take it")
}

// Report reads the GPUs and builds one NodeReport, attributed and validated. Run calls
// it each interval; it is not safe to call concurrently with Run or itself.
func (c *Collector) Report(ctx context.Context) (*gpuscalerv1.NodeReport, error) {
	start := time.Now()
	samples, err := c.source.Collect(ctx)
	c.metrics.collectDuration.Observe(time.Since(start).Seconds())
	if err != nil {
		c.metrics.errors.WithLabelValues("source").Inc()
		return nil, fmt.Errorf("read GPUs through %s: %w", c.source.Name(), err)
	}
	c.seq++
	r := &gpuscalerv1.NodeReport{
		Node:        c.cfg.Node,
		ObservedAt:  timestamppb.New(start),
		Sequence:    c.seq,
		CollectorId: c.cfg.CollectorID,
		Source:      c.source.Name(),
		Gpus:        samples,
	}
	if c.cfg.NodeLabels != nil {
		r.NodeLabels = c.cfg.NodeLabels()
	}
	if c.cfg.NodeScheduling != nil {
		r.Scheduling = c.cfg.NodeScheduling()
	}
	if c.cfg.NodeResources != nil {
		r.Resources = c.cfg.NodeResources()
	}
	if err := c.attribute(ctx, r); err != nil {
		return nil, err
	}
	c.starts.stamp(r, c.cfg.Now())
	if err := r.Validate(); err != nil {
		c.metrics.errors.WithLabelValues("invalid").Inc()
		return nil, err
	}
	c.metrics.devices.Set(float64(len(r.GetGpus())))
	return r, nil
}

// attribute fills each sample's pods, the report's allocatable, allocated and
// unattributed devices from the kubelet (see attribution.Attribute); then the
// pods' labels and owners from the pod directory, and their own use of shared devices
// from the source when it measures that. A pod whose labels the directory does not know
// is marked LabelsUnknown: the scaler cannot tell whether a podSelector selects it.
//
// When the kubelet cannot be asked, the report stands on the source's own pod names
// (dcgm-exporter's labels) if it gave any; a source that names no pod (DCGM, NVML) would
// give a report whose busy GPUs look free and unheld, so the cycle fails instead: the
// node's last report goes stale, and the scaler answers Unavailable for its pods.
func (c *Collector) attribute(ctx context.Context, r *gpuscalerv1.NodeReport) error {
	if c.attrib != nil {
		alloc, err := c.attrib.Allocation(ctx)
		if err != nil {
			c.metrics.errors.WithLabelValues("attribution").Inc()
			if !slices.ContainsFunc(r.GetGpus(), func(g *gpuscalerv1.GPUSample) bool { return g.GetPod() != nil }) {
				return fmt.Errorf("attribute GPUs to pods: %w", err)
			}
			c.warnEvery("attribution", fmt.Errorf("%w; reports carry the GPU source's own pod names", err))
		} else {
			for _, id := range attribution.Attribute(r, alloc) {
				c.metrics.errors.WithLabelValues("attribution").Inc()
				c.warnEvery("attribution-id:"+id, fmt.Errorf("device id %q is in no form the collector knows; its pod's GPU readings are reported unknown", id))
			}
			for _, u := range r.GetUnattributed() {
				c.warnEvery("unattributed:"+u.GetId(), fmt.Errorf("device %s (%s) of pod %s/%s matches no GPU the source measured: %s",
					u.GetId(), u.GetResource(), u.GetPod().GetNamespace(), u.GetPod().GetName(), u.GetReason()))
			}
		}
	}
	var usage map[string]map[string]float64
	if u, ok := c.source.(PodUsageSource); ok {
		usage = u.PodUsage()
	}
	for _, g := range r.GetGpus() {
		pods := g.Pods()
		for _, p := range pods {
			c.describe(p)
		}
		// A pod's own figure is kept only when every pod of the device has one: a
		// partial split would pass for the whole device's use.
		if m, ok := usage[g.DeviceID()]; ok && len(pods) > 0 && !slices.ContainsFunc(pods, func(p *gpuscalerv1.PodRef) bool { return p.GetUid() == "" }) {
			for _, p := range pods {
				p.GpuUtil = proto.Float64(min(100, max(0, m[p.GetUid()])))
			}
		}
	}
	for _, u := range r.GetUnattributed() {
		c.describe(u.GetPod())
	}
	return nil
}

// describe fills a pod's UID, labels and owner from the pod directory, or marks its
// labels unknown.
func (c *Collector) describe(p *gpuscalerv1.PodRef) {
	if c.pods != nil {
		if info, ok := c.pods.Pod(p.GetNamespace(), p.GetName()); ok {
			p.Uid, p.Labels, p.OwnerKind, p.OwnerName = info.UID, info.Labels, info.OwnerKind, info.OwnerName
			return
		}
	}
	p.LabelsUnknown = len(p.GetLabels()) == 0
}

// flushPending publishes the held report if NATS is connected.
func (c *Collector) flushPending() {
	c.pendingMu.Lock()
	defer c.pendingMu.Unlock()
	if c.pending == nil || !c.nc.IsConnected() {
		return
	}
	if err := c.nc.Publish(c.subject, c.pending); err != nil {
		c.metrics.errors.WithLabelValues("publish").Inc()
		c.warnEvery("publish", err)
		return
	}
	c.pending = nil
	c.published.Store(time.Now().UnixNano())
	c.metrics.published.Inc()
}

func (c *Collector) lastPublish() time.Time {
	if n := c.published.Load(); n != 0 {
		return time.Unix(0, n)
	}
	return time.Time{}
}

// Ready says why the collector is not ready, or nil: it must have published within the
// last three intervals.
func (c *Collector) Ready() error {
	last := c.lastPublish()
	if last.IsZero() {
		return errors.New("no report published yet")
	}
	if age := time.Since(last); age > 3*c.cfg.Interval {
		return fmt.Errorf("last report published %s ago", age.Round(time.Second))
	}
	return nil
}

// warnEvery logs a problem of a kind at most once a minute.
func (c *Collector) warnEvery(kind string, err error) {
	now := time.Now()
	if last, ok := c.warned.Load(kind); ok && now.Sub(last.(time.Time)) < time.Minute {
		return
	}
	c.warned.Store(kind, now)
	c.log.Warn("collector problem (logged at most once a minute)", "stage", kind, "err", err)
}

// collectorMetrics are the collector's own metrics, named gpuscaler_collector_<what>.
type collectorMetrics struct {
	collectDuration prometheus.Observer
	errors          *prometheus.CounterVec
	published       prometheus.Counter
	devices         prometheus.Gauge
}

func newCollectorMetrics(reg prometheus.Registerer, source string, connected func() bool, last func() time.Time) *collectorMetrics {
	duration := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "gpuscaler_collector_collect_duration_seconds",
		Help:    "Time to read the GPUs once, by source.",
		Buckets: prometheus.ExponentialBuckets(100e-6, 3, 10), // 100µs … 2s
	}, []string{"source"})
	errs := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "gpuscaler_collector_errors_total",
		Help: "Failures by source and stage (source, attribution, invalid, publish).",
	}, []string{"source", "stage"})
	m := &collectorMetrics{
		collectDuration: duration.WithLabelValues(source),
		errors:          errs.MustCurryWith(prometheus.Labels{"source": source}),
		published: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "gpuscaler_collector_reports_published_total",
			Help: "NodeReports published.",
		}),
		devices: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "gpuscaler_collector_devices",
			Help: "GPUs and MIG instances in the last report.",
		}),
	}
	for _, stage := range []string{"source", "attribution", "invalid", "publish"} {
		m.errors.WithLabelValues(stage)
	}
	reg.MustRegister(duration, errs, m.published, m.devices,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "gpuscaler_collector_last_publish_timestamp_seconds",
			Help: "When the last NodeReport was published, in seconds since the epoch; 0 before one.",
		}, func() float64 {
			if t := last(); !t.IsZero() {
				return float64(t.UnixNano()) / 1e9
			}
			return 0
		}),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "gpuscaler_collector_nats_connected",
			Help: "1 while the NATS connection is up.",
		}, func() float64 {
			if connected() {
				return 1
			}
			return 0
		}),
	)
	return m
}
