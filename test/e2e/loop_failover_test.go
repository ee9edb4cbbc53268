package e2e

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	kedav1alpha1 "github.com/kedacore/keda/v2/apis/keda/v1alpha1"

	"github.com/gpuscaler/gpuscaler/test/e2e/cluster"

	"github.com/gpuscaler/gpuscaler/test/testkit"
)

// (4) NATS loses a node. While reports flow and a workload runs at 2 replicas, the
// GPUSCALER_QUEUES stream's leader (one of three servers, the stream at replicas 3), which
// stores the reports that wake workloads, is killed: no leadership handed over, the
// others find it gone.
// Nothing decides wrong: the workload is not scaled to zero; a workload at zero still
// wakes by push (its pollingInterval is 30 s), and the delay is measured; the stream
// keeps every subject's last value; when the server is back it holds them all again.
// Then both scaler replicas restart, one by one, under load: both answer the same.
func TestLoopNATSLosesANode(t *testing.T) {
	ns := newNamespace(t, "loop-nats")
	pool := newGPUPool(t, "n-"+ns, 8)
	createGPUDeployment(t, ns, "inference", pool.name, 0, 1, time.Second)
	createGPUDeployment(t, ns, "sleeper", pool.name, 0, 1, time.Second)
	// The producers report before KEDA first asks (a queue never reported is an error,
	// which breaks KEDA's push stream for a while; see TestWakeAfterProducerOutage).
	dw := watchDeployments(t, ns, "inference", "sleeper")
	requests := startProducerOn(t, env.GCluster, ns, "requests", cluster.Report{Waiting: 8, Arrivals: 8})
	wake := startProducerOn(t, env.GCluster, ns, "wake", cluster.Report{})
	inferenceTrigger := loopTrigger("external-push", "queue", "requests", "queueTarget", "4")
	createScaledObject(t, scaledObject(ns, "inference", "inference", 0, 4, loopPolling, 5, inferenceTrigger))
	// Polled only every 30 s, KEDA's default: a wake within a second is the push.
	createScaledObject(t, scaledObject(ns, "sleeper", "sleeper", 0, 1, 30, 5, loopTrigger("external-push", "queue", "wake")))
	waitCondition(t, ns, "sleeper", kedav1alpha1.ConditionReady, metav1.ConditionTrue, "", 30*time.Second)
	dw.waitFor(t, "inference", 2, 60*time.Second)

	var info cluster.StreamInfo
	for _, name := range []string{nodeStream, queueStream} { // queueStream last: its leader is killed
		var err error
		if info, err = streamInfo(t.Context(), name, ""); err != nil {
			t.Fatal(err)
		}
		if got := len(info.Replicas) + 1; got != 3 {
			t.Fatalf("%s has %d replicas (leader %s, followers %v), want 3", name, got, info.Leader, info.Replicas)
		}
	}
	leader, err := env.NATSCluster.Node(info.Leader)
	if err != nil {
		t.Fatal(err)
	}
	// Every subject the streams hold now, whoever published it: each must keep a last
	// value through the outage.
	before, err := streamSubjects(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	requestsSubj, wakeSubj := "gpuscaler.v1.queue."+ns+".requests.e2e", "gpuscaler.v1.queue."+ns+".wake.e2e"
	for _, s := range []string{requestsSubj, wakeSubj, "gpuscaler.v1.node." + pool.name + "-0"} {
		if !slices.Contains(before, s) {
			t.Fatalf("the streams hold no %s before the outage: %v", s, before)
		}
	}

	// Watch for a scale to zero the whole time the server is away.
	watchdog := make(chan string, 1)
	stopWatch := make(chan struct{})
	go func() {
		for {
			select {
			case <-stopWatch:
				close(watchdog)
				return
			case <-time.After(200 * time.Millisecond):
			}
			if n, err := replicas(context.Background(), ns, "inference"); err == nil && n == 0 {
				watchdog <- "inference scaled to zero"
				close(watchdog)
				return
			}
		}
	}()

	t.Logf("killing %s, the queue stream's leader (the streams hold %d subjects)", leader.Name, len(before))
	killed := time.Now()
	env.NATSCluster.Kill(leader)
	// Work arrives for the workload at zero at once: the stream has no leader until the
	// others elect one, and the producer's report waits for it (publish retries until
	// the stream stores it).
	wake.Set(cluster.Report{Waiting: 1, Arrivals: 1})
	stored := time.Now()
	woke := dw.waitFor(t, "sleeper", 1, 25*time.Second)
	i, err := streamInfo(t.Context(), queueStream, leader.Name)
	if err != nil {
		t.Fatal(err)
	}
	if i.Leader == "" || i.Leader == leader.Name {
		t.Fatalf("the stream's leader after the kill: %q", i.Leader)
	}
	// The scaler sees the report as the new leader stores it, before the publish's
	// acknowledgement is back: woke may precede stored by a few milliseconds.
	recordFigure(t, "NATS failover: stream leader %s killed, work for a workload at zero reported at once → 1 replica %s after the kill (pushed; pollingInterval 30 s): the stream had no leader until %s was elected, and the producer's publish was acknowledged %s after the kill",
		leader.Name, woke.Sub(killed).Round(time.Millisecond), i.Leader, stored.Sub(killed).Round(time.Millisecond))
	requests.Set(cluster.Report{Waiting: 12, Arrivals: 4})
	dw.waitFor(t, "inference", 3, 60*time.Second) // ⌈12/4⌉ through the remaining servers

	// Every subject's last value is in the stream, read through the remaining servers.
	// The stream holds each subject's last value without the killed server.
	testkit.Eventually(t, 20*time.Second, lastValuesKept(before, map[string]uint64{requestsSubj: 12, wakeSubj: 1}))

	t.Logf("%s comes back", leader.Name)
	if err := env.NATSCluster.Restart(t.Context(), leader); err != nil {
		t.Fatal(err)
	}
	// The leader holds every subject again, in both streams.
	testkit.Eventually(t, 60*time.Second, func(ctx context.Context) error {
		var held int
		var report []string
		same := true
		for _, name := range []string{nodeStream, queueStream} {
			back, err := env.NATSCluster.Stream(ctx, leader, name)
			if err != nil {
				return err
			}
			held += back.Subjects
			report = append(report, fmt.Sprintf("%s: %s %d subjects", name, leader.Name, back.Subjects))
			for _, s := range env.NATSCluster.Servers {
				if s == leader {
					continue
				}
				o, err := env.NATSCluster.Stream(ctx, s, name)
				if err != nil {
					return err
				}
				same = same && o.Subjects == back.Subjects
				report = append(report, fmt.Sprintf("%s %d subjects", s.Name, o.Subjects))
			}
		}
		return testkit.Check(same && held >= len(before), "%s", strings.Join(report, ", "))
	})
	// Every subject's last value, with the server back.
	testkit.Eventually(t, 20*time.Second, lastValuesKept(before, map[string]uint64{requestsSubj: 12, wakeSubj: 1}))

	t.Log("both scaler replicas restart, one by one, under load")
	for i := range env.Scalers.Len() {
		env.Scalers.Stop(i)
		requests.Set(cluster.Report{Waiting: 16, Arrivals: 4})
		// The other replica answers alone.
		testkit.Eventually(t, 30*time.Second, backlogOn(ns, "inference", inferenceTrigger.Metadata, 16))
		if err := env.Scalers.Start(t.Context(), i); err != nil {
			t.Fatal(err)
		}
		// Both replicas answer the same.
		testkit.Eventually(t, 30*time.Second, sameAnswers(ns, "inference", inferenceTrigger.Metadata))
	}
	dw.waitFor(t, "inference", 4, 60*time.Second)
	close(stopWatch)
	if why, ok := <-watchdog; ok {
		t.Error(why)
	}
	waitCondition(t, ns, "inference", kedav1alpha1.ConditionReady, metav1.ConditionTrue, "", 30*time.Second)
}

// (5) Scaler rolling restart under KEDA. Two replicas behind the headless Service's name,
// as the chart deploys them. One stops mid-run: KEDA keeps getting answers from the
// other, its push included; the stopped one serves the same answers again once it has
// replayed the stream.
func TestLoopScalerRollingRestart(t *testing.T) {
	ns := newNamespace(t, "loop-roll")
	pool := newGPUPool(t, "r-"+ns, 8)
	createGPUDeployment(t, ns, "inference", pool.name, 0, 1, time.Second)
	p := startProducerOn(t, env.GCluster, ns, "requests", cluster.Report{})
	trigger := loopTrigger("external-push", "queue", "requests", "queueTarget", "4")
	so := createScaledObject(t, scaledObject(ns, "inference", "inference", 0, 4, 30, 5, trigger))
	dw := watchDeployments(t, ns, "inference")
	waitCondition(t, ns, "inference", kedav1alpha1.ConditionReady, metav1.ConditionTrue, "", 30*time.Second)
	consistently(t, 2*time.Second, "at zero with an empty queue", replicasAre(ns, "inference", 0))

	t.Log("replica 0 stops")
	env.Scalers.Stop(0)
	// KEDA's push stream on the stopped replica ends cleanly (the scaler closes its
	// streams with a nil error on shutdown) and KEDA opens it again within 2 s, now on
	// the replica the Service's name still resolves to. This test's is the only push
	// stream then.
	// KEDA's push stream open on replica 1.
	testkit.Eventually(t, 30*time.Second, func(ctx context.Context) error {
		n, err := env.Scalers.Replica(1).Gauge(ctx, "gpuscaler_scaler_streams_open")
		if err != nil {
			return err
		}
		return testkit.Check(n >= 1, "%g streams open", n)
	})
	sent := time.Now()
	p.Set(cluster.Report{Waiting: 8, Arrivals: 8})
	woke := dw.waitFor(t, "inference", 1, 25*time.Second)
	recordFigure(t, "scaler rolling restart: wake from zero with one of two replicas stopped, report stored → 1 replica %s (pushed; pollingInterval 30 s)", woke.Sub(sent).Round(time.Millisecond))
	dw.waitFor(t, "inference", 2, 60*time.Second)
	// The HPA reads gpuscaler's metric through the remaining replica.
	testkit.Eventually(t, 30*time.Second, func(ctx context.Context) error {
		v, conds, err := hpaMetric(ctx, ns, so.Status.HpaName, "s0-queue-backlog")
		if err != nil {
			return err
		}
		return testkit.Check(v == 4, "s0-queue-backlog %g per pod (%s)", v, conds)
	})
	waitCondition(t, ns, "inference", kedav1alpha1.ConditionReady, metav1.ConditionTrue, "", 10*time.Second)

	t.Log("replica 0 starts again and replays the stream")
	if err := env.Scalers.Start(t.Context(), 0); err != nil {
		t.Fatal(err)
	}
	// Both replicas answer the same.
	testkit.Eventually(t, 30*time.Second, sameAnswers(ns, "inference", trigger.Metadata))
	consistently(t, 3*time.Second, "held at 2 replicas", replicasAre(ns, "inference", 2))
}

// The streams the scaler keeps: node reports, and queue reports.
const (
	nodeStream  = "GPUSCALER"
	queueStream = "GPUSCALER_QUEUES"
)

// streamOf names the stream that keeps subject's reports.
func streamOf(subject string) string {
	if strings.HasPrefix(subject, "gpuscaler.v1.queue.") {
		return queueStream
	}
	return nodeStream
}

// streamSubjects lists the subjects the two streams hold, read through the NATS cluster.
func streamSubjects(ctx context.Context) ([]string, error) {
	var out []string
	for _, name := range []string{nodeStream, queueStream} {
		stream, done, err := openStream(ctx, name)
		if err != nil {
			return nil, err
		}
		info, err := stream.Info(ctx, jetstream.WithSubjectFilter(">"))
		done()
		if err != nil {
			return nil, err
		}
		for s := range info.State.Subjects {
			out = append(out, s)
		}
	}
	slices.Sort(out)
	return out, nil
}

// openStream opens the stream name through the NATS cluster; done closes the connection.
func openStream(ctx context.Context, name string) (jetstream.Stream, func(), error) {
	nc, err := nats.Connect(env.NATSCluster.URLs, nats.Timeout(5*time.Second))
	if err != nil {
		return nil, nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	stream, err := js.Stream(ctx, name)
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	return stream, nc.Close, nil
}

// lastValuesKept holds when the streams, read through the cluster, have a last message
// for every one of subjects, and the queue reports in waiting carry those counts. Each
// try has a few seconds: just after a server is killed, a request can go to it and wait
// for no answer, and a later try on a new connection is answered.
func lastValuesKept(subjects []string, waiting map[string]uint64) func(ctx context.Context) error {
	return func(ctx context.Context) error {
		ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		defer cancel()
		for _, subj := range subjects {
			stream, done, err := openStream(ctx, streamOf(subj))
			if err != nil {
				return err
			}
			m, err := stream.GetLastMsgForSubject(ctx, subj)
			done()
			if err != nil {
				return fmt.Errorf("%s: %v", subj, err)
			}
			if want, ok := waiting[subj]; ok {
				got, err := queueReportWaiting(m.Data)
				if err != nil || got != want {
					return fmt.Errorf("%s: waiting %d (%v), want %d", subj, got, err, want)
				}
			}
		}
		return nil
	}
}

// streamInfo reads the state of stream name from the first running server other than
// skip.
func streamInfo(ctx context.Context, name, skip string) (cluster.StreamInfo, error) {
	var errs []string
	for _, s := range env.NATSCluster.Servers {
		if s.Name == skip {
			continue
		}
		if exited, _ := s.Process().Exited(); exited {
			continue
		}
		info, err := env.NATSCluster.Stream(ctx, s, name)
		if err == nil {
			return info, nil
		}
		errs = append(errs, err.Error())
	}
	return cluster.StreamInfo{}, fmt.Errorf("no server told the state of stream %s: %s", name, strings.Join(errs, "; "))
}

// sameAnswers asks every running scaler replica IsActive and queue-backlog for a trigger
// and holds when all give the same.
func sameAnswers(ns, name string, meta map[string]string) func(ctx context.Context) error {
	return func(ctx context.Context) error {
		var answers []string
		for i := range env.Scalers.Len() {
			s := env.Scalers.Replica(i)
			if s == nil {
				return fmt.Errorf("replica %d not running", i)
			}
			active, err := s.IsActive(ctx, ns, name, meta)
			if err != nil {
				return fmt.Errorf("replica %d: %v", i, err)
			}
			v, err := s.Metric(ctx, ns, name, meta, "queue-backlog")
			if err != nil {
				return fmt.Errorf("replica %d: %v", i, err)
			}
			answers = append(answers, fmt.Sprintf("active %t, queue-backlog %g", active, v))
		}
		return testkit.Check(len(slices.Compact(slices.Clone(answers))) == 1, "%s", strings.Join(answers, " | "))
	}
}
