package collector

import (
	"time"

	"google.golang.org/protobuf/proto"

	gpuscalerv1 "github.com/gpuscaler/gpuscaler/proto/gpuscaler/v1"
)

// BusyUtil is the utilisation, in percent, above which a pod's GPU counts as busy: the
// end of its cold start. A GPU whose model is loading reads near 0 (copying weights into
// its memory runs no kernel, which is what utilisation counts), as does a loaded model
// with nothing to do, while serving a batch or an inference engine's warm-up at the end
// of its load (vLLM's profile run and CUDA graph capture) reads tens of percent in a
// one-second sample. 10% is above the blips of a CUDA context being set up and well
// below any batch.
const BusyUtil = 10.0

// coldStarts measures, for each pod holding GPUs, the time from when the collector
// first saw it hold its devices to its GPUs' first report above BusyUtil: the pod's
// cold start (docs/collector.md, "Cold starts"). The kubelet hands a pod its devices
// when it admits the pod, before its images are pulled, so the figure counts the pull,
// the engine's start and the model's load. It is owned by the goroutine that calls
// Collector.Report.
type coldStarts struct {
	// first: no report was made yet. The pods of the first report were there before the
	// collector (it restarted under them), so their start was not seen.
	first bool
	pods  map[string]*podStart // by pod UID, or namespace/name without one
}

// podStart is what coldStarts holds of one pod.
type podStart struct {
	// since is when the pod was first seen holding devices; zero when its start was not
	// seen (in the collector's first report, or first seen busy), or it was idle longer
	// than a cold start can be: it is not measured.
	since time.Time
	// seconds is its cold start, once measured; nil before.
	seconds *float64
	// seen marks the pods of the report being made; fresh those it holds for the first
	// time.
	seen, fresh bool
}

func newColdStarts() *coldStarts {
	return &coldStarts{first: true, pods: map[string]*podStart{}}
}

// stamp measures the pods of r, a report made at now, and sets each PodRef's
// ColdStartSeconds where its pod's cold start is known. A pod's GPUs are busy when any
// of them is: its own utilisation of a device (PodRef.gpu_util) where measured, else the
// device's. Pods no longer in a report are forgotten.
func (c *coldStarts) stamp(r *gpuscalerv1.NodeReport, now time.Time) {
	busy := map[*podStart]bool{}
	for _, g := range r.GetGpus() {
		for _, p := range g.Pods() {
			s := c.pod(p, now)
			util := p.GpuUtil
			if util == nil {
				util = g.GpuUtil
			}
			if util != nil && *util > BusyUtil {
				busy[s] = true
			}
		}
	}
	for _, s := range c.pods {
		switch {
		case !s.seen || s.seconds != nil || s.since.IsZero():
		case busy[s] && s.fresh:
			s.since = time.Time{} // busy when first seen: its start was not seen
		case now.Sub(s.since) > gpuscalerv1.MaxColdStartSeconds*time.Second:
			// Idle this long, it was not loading all the while; and a figure this large
			// would make the report invalid, whether it is busy now or not.
			s.since = time.Time{}
		case busy[s]:
			s.seconds = proto.Float64(now.Sub(s.since).Seconds())
		}
	}
	for _, g := range r.GetGpus() {
		for _, p := range g.Pods() {
			if s := c.pods[podKey(p)]; s.seconds != nil {
				p.ColdStartSeconds = proto.Float64(*s.seconds)
			}
		}
	}
	for k, s := range c.pods {
		if !s.seen {
			delete(c.pods, k)
		}
		s.seen, s.fresh = false, false
	}
	c.first = false
}

// pod returns p's state, made when p is first seen, and marks it seen.
func (c *coldStarts) pod(p *gpuscalerv1.PodRef, now time.Time) *podStart {
	k := podKey(p)
	s := c.pods[k]
	if s == nil {
		s = &podStart{fresh: true}
		if !c.first {
			s.since = now
		}
		c.pods[k] = s
	}
	s.seen = true
	return s
}

func podKey(p *gpuscalerv1.PodRef) string {
	if uid := p.GetUid(); uid != "" {
		return uid
	}
	return p.GetNamespace() + "/" + p.GetName()
}
