package demo

import (
	"fmt"
	"math"
	"math/rand/v2"
	"time"

	"github.com/gpuscaler/gpuscaler/queue"
)

// The two workloads: an inference service that scales to zero on a request queue, and a
// training ScaledJob fed by a job queue. Both are stepped by the world goroutine only.

// Inference service parameters: a vLLM-style server batching Concurrency requests at a
// time on one GPU, each taking ServiceTime.
const (
	inferenceNS       = "inference"
	inferenceName     = "llm"
	inferenceQueue    = "requests"
	concurrency       = 4 // requests a replica serves at once, and the trigger's concurrency
	serviceTime       = time.Second
	gpuUtilTarget     = 80
	activationGPUUtil = 20
	trainingNS        = "training"
	trainingName      = "trainer"
	trainingQueue     = "jobs"
	gpusPerJob        = 4
	trainingMaxJobs   = 16
	burstRate         = 20.0 // requests per second
	sustainedRate     = 8.0
	trainingBatchLen  = 6 // jobs submitted at once
	// loadingUtil is a replica's GPU utilisation while it loads its model: memory, hardly
	// any compute.
	loadingUtil = 2
)

// backlogQueueTarget is the queueTarget of the queue-backlog trigger the demo ran before
// it moved to queue-demand: one replica's concurrency. The summary replays it as a
// baseline.
const backlogQueueTarget = concurrency

// phase is one stretch of the inference load profile.
type phase struct {
	name  string
	until float64 // fraction of the run
	rate  float64 // requests per second
}

// profile is the load: idle → burst → sustained → idle.
var profile = []phase{
	{"idle", 0.08, 0},
	{"burst", 0.30, burstRate},
	{"sustained", 0.55, sustainedRate},
	{"idle", 1, 0},
}

// burstReplicas is how many replicas the burst's mean arrival rate keeps busy: the size
// of a fair always-on service.
func burstReplicas() int {
	return int(math.Ceil(burstRate * serviceTime.Seconds() / concurrency))
}

func phaseAt(frac float64) phase {
	for _, p := range profile {
		if frac < p.until {
			return p
		}
	}
	return profile[len(profile)-1]
}

// poisson draws from a Poisson distribution of mean lambda (Knuth's method; the demo's
// means are small).
func poisson(rng *rand.Rand, lambda float64) int {
	if lambda <= 0 {
		return 0
	}
	l, k, p := math.Exp(-lambda), 0, 1.0
	for {
		p *= rng.Float64()
		if p <= l {
			return k
		}
		k++
	}
}

// replica is one pod of the inference Deployment.
type replica struct {
	*pod
	readyAt     time.Time // when its model is loaded; zero until it is placed
	terminating bool      // scaled down: takes no new requests, leaves when idle
	inflight    []serving // the requests it serves, in the order they started
}

// serving is a request a replica serves: when it completes, and its index in
// inference.requests.
type serving struct {
	done time.Time
	req  int
}

// request is one request the service started to serve: when it arrived and started, and
// how long it held its replica's slot. That is the drawn service time until it completes,
// then the time it really held the slot, up to the step that saw it done.
type request struct {
	arrived, started time.Time
	service          time.Duration
}

func (r *replica) ready(now time.Time) bool {
	return r.node != nil && !r.readyAt.IsZero() && !now.Before(r.readyAt)
}

// inferenceService is the scale-to-zero service and its request queue.
type inferenceService struct {
	reporter *queue.Reporter
	startup  time.Duration
	rng      *rand.Rand
	replicas []*replica
	waiting  []time.Time // arrival times, oldest first
	serial   int

	served int
	waits  []time.Duration // queue wait of each served request
	// requests are those started, in the order they started, for the summary's replay.
	requests []request
	// cold counts the requests that waited for a model load: the replica that took them
	// was not ready when they arrived.
	cold int
}

// backlog is waiting + in flight, what the producer reports.
func (w *inferenceService) backlog() int {
	n := len(w.waiting)
	for _, r := range w.replicas {
		n += len(r.inflight)
	}
	return n
}

// desired is the replica count KEDA and the HPA set: terminating pods do not count.
func (w *inferenceService) desired() int {
	n := 0
	for _, r := range w.replicas {
		if !r.terminating {
			n++
		}
	}
	return n
}

func (w *inferenceService) readyCount(now time.Time) int {
	n := 0
	for _, r := range w.replicas {
		if !r.terminating && r.ready(now) {
			n++
		}
	}
	return n
}

// scale sets the Deployment's replicas: new pods are created (and scheduled when a GPU is
// free); surplus pods, not-ready ones first, stop taking requests and leave once idle.
func (w *inferenceService) scale(c *cluster, to int) {
	for cur := w.desired(); cur < to; cur++ {
		w.serial++
		p := &pod{namespace: inferenceNS, name: fmt.Sprintf("%s-%05d", inferenceName, w.serial),
			labels: map[string]string{"app": inferenceName}, ownerKind: "Deployment", ownerName: inferenceName,
			gpus: 1, pool: "inference"}
		w.replicas = append(w.replicas, &replica{pod: p})
	}
	for cur := w.desired(); cur > to; cur-- {
		victim := -1
		for i, r := range w.replicas { // the newest not-ready pod, else the newest ready one
			if r.terminating {
				continue
			}
			if victim < 0 || r.readyAt.IsZero() || (!w.replicas[victim].readyAt.IsZero() && r.readyAt.After(w.replicas[victim].readyAt)) {
				victim = i
			}
		}
		w.replicas[victim].terminating = true
	}
}

// step advances the service to now: requests arrive at the phase's rate, replicas start,
// serve and finish requests, and the producer's Reporter hears of each change.
func (w *inferenceService) step(c *cluster, now time.Time, dt time.Duration, rate float64) (arrived int) {
	arrived = poisson(w.rng, rate*dt.Seconds())
	for range arrived {
		w.waiting = append(w.waiting, now)
	}
	if arrived > 0 {
		w.reporter.Enqueued(arrived)
	}
	kept := w.replicas[:0]
	for _, r := range w.replicas {
		if r.node == nil && !r.terminating && c.place(r.pod) {
			r.readyAt = now.Add(w.startup)
		}
		done := 0
		for len(r.inflight) > 0 && !now.Before(r.inflight[0].done) {
			q := &w.requests[r.inflight[0].req]
			q.service = now.Sub(q.started)
			r.inflight, done = r.inflight[1:], done+1
		}
		if done > 0 {
			w.reporter.Finished(done)
			w.served += done
		}
		if r.terminating && len(r.inflight) == 0 {
			c.release(r.pod)
			continue
		}
		if !r.terminating && r.ready(now) {
			take := min(concurrency-len(r.inflight), len(w.waiting))
			for i := range take {
				arrived := w.waiting[i]
				w.waits = append(w.waits, now.Sub(arrived))
				if r.readyAt.After(arrived) {
					w.cold++
				}
				jitter := 0.8 + 0.4*w.rng.Float64()
				service := time.Duration(float64(serviceTime) * jitter)
				r.inflight = append(r.inflight, serving{done: now.Add(service), req: len(w.requests)})
				w.requests = append(w.requests, request{arrived: arrived, started: now, service: service})
			}
			if take > 0 {
				w.waiting = w.waiting[take:]
				w.reporter.Started(take)
			}
		}
		switch {
		case r.node == nil:
		case !r.ready(now):
			r.util = loadingUtil
		default:
			r.util = 3 + 92*float64(len(r.inflight))/concurrency
		}
		kept = append(kept, r)
	}
	w.replicas = kept
	return arrived
}

// gpusHeld counts the GPUs the service's pods hold, terminating ones included.
func (w *inferenceService) gpusHeld() int {
	n := 0
	for _, r := range w.replicas {
		if r.node != nil {
			n += r.gpus
		}
	}
	return n
}

// servingUtil is the average GPU utilisation of the replicas that serve: placed, model
// loaded, draining ones included while they finish their requests. Replicas still loading
// are left out: their GPUs idle by design, and averaging them in makes a busy service
// look idle the moment the HPA adds replicas. ok is false when none serves.
func (w *inferenceService) servingUtil(now time.Time) (util float64, ok bool) {
	sum, n := 0.0, 0
	for _, r := range w.replicas {
		if r.ready(now) {
			sum += r.util * float64(r.gpus)
			n += r.gpus
		}
	}
	if n == 0 {
		return 0, false
	}
	return sum / float64(n), true
}

// job is one training Job.
type job struct {
	*pod
	doneAt time.Time // zero while Pending
}

// training is the job queue and the Jobs KEDA created from it.
type training struct {
	reporter *queue.Reporter
	runFor   time.Duration
	waiting  int
	jobs     []*job
	serial   int

	submitted, finished, created, maxRunning, maxPending int
	// noWork counts Jobs that found the queue empty and exited: KEDA created them on a
	// backlog report older than the last Jobs' completion.
	noWork int
}

func (t *training) submit(n int) {
	t.waiting += n
	t.submitted += n
	t.reporter.Enqueued(n)
}

// create adds n Jobs, as KEDA does.
func (t *training) create(n int) {
	for range n {
		t.serial++
		t.created++
		t.jobs = append(t.jobs, &job{pod: &pod{namespace: trainingNS, name: fmt.Sprintf("%s-%05d", trainingName, t.serial),
			labels: map[string]string{"app": trainingName}, ownerKind: "Job", ownerName: fmt.Sprintf("%s-%05d", trainingName, t.serial),
			gpus: gpusPerJob, pool: "training", util: 96}})
	}
}

// step schedules pending Jobs, starts them (each takes one item off the queue) and
// finishes those whose time is up.
func (t *training) step(c *cluster, now time.Time) {
	kept := t.jobs[:0]
	for _, j := range t.jobs {
		if j.doneAt.IsZero() && t.waiting == 0 {
			t.noWork++
			continue // no item left for it: the Job's pod exits at once
		}
		if j.doneAt.IsZero() && c.place(j.pod) {
			j.doneAt = now.Add(t.runFor)
			t.waiting--
			t.reporter.Started(1)
		}
		if !j.doneAt.IsZero() && !now.Before(j.doneAt) {
			c.release(j.pod)
			t.reporter.Finished(1)
			t.finished++
			continue
		}
		kept = append(kept, j)
	}
	t.jobs = kept
	running, pending := t.counts()
	t.maxRunning, t.maxPending = max(t.maxRunning, running), max(t.maxPending, pending)
}

func (t *training) counts() (running, pending int) {
	for _, j := range t.jobs {
		if j.doneAt.IsZero() {
			pending++
		} else {
			running++
		}
	}
	return running, pending
}
