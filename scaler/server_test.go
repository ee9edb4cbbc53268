package scaler

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gpuscaler/gpuscaler/internal/natstest"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/gpuscaler/gpuscaler/test/testkit"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/stats"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	pb "github.com/gpuscaler/gpuscaler/proto/externalscaler"
	gpuscalerv1 "github.com/gpuscaler/gpuscaler/proto/gpuscaler/v1"
)

func wantCode(t *testing.T, err error, code codes.Code, contains ...string) {
	t.Helper()
	st, _ := status.FromError(err)
	if st.Code() != code {
		t.Fatalf("error %v, want code %v", err, code)
	}
	for _, c := range contains {
		if !strings.Contains(st.Message(), c) {
			t.Fatalf("message %q does not mention %q", st.Message(), c)
		}
	}
}

func TestGetMetricSpec(t *testing.T) {
	ns := natstest.Start(t, "", "")
	s := startScaler(t, ns.ClientURL(), Config{})
	resp, err := s.client.GetMetricSpec(t.Context(), ref("ml", "llm", map[string]string{
		"queue": "jobs", "queueTarget": "2.5",
		"podSelector": "app=llm", "gpuUtilTarget": "60", "gpuMemoryTarget": "0.4",
	}))
	if err != nil {
		t.Fatal(err)
	}
	want := []*pb.MetricSpec{
		{MetricName: "queue-backlog", TargetSize: 3, TargetSizeFloat: 2.5},
		{MetricName: "gpu-util", TargetSize: 60, TargetSizeFloat: 60},
		{MetricName: "gpu-memory", TargetSize: 1, TargetSizeFloat: 0.4}, // the int field never drops to 0
	}
	if len(resp.GetMetricSpecs()) != len(want) {
		t.Fatalf("got %d metric specs, want %d: %v", len(resp.GetMetricSpecs()), len(want), resp)
	}
	for i, w := range want {
		if !proto.Equal(resp.GetMetricSpecs()[i], w) {
			t.Errorf("spec %d = %v, want %v", i, resp.GetMetricSpecs()[i], w)
		}
	}
}

func TestInvalidMetadataIsInvalidArgument(t *testing.T) {
	ns := natstest.Start(t, "", "")
	s := startScaler(t, ns.ClientURL(), Config{})
	bad := ref("ml", "llm", map[string]string{"queue": "jobs", "queueTarget": "-3"})
	calls := map[string]func() error{
		"IsActive":      func() error { _, err := s.client.IsActive(t.Context(), bad); return err },
		"GetMetricSpec": func() error { _, err := s.client.GetMetricSpec(t.Context(), bad); return err },
		"GetMetrics": func() error {
			_, err := s.client.GetMetrics(t.Context(), &pb.GetMetricsRequest{ScaledObjectRef: bad, MetricName: "queue-backlog"})
			return err
		},
		"StreamIsActive": func() error {
			stream, err := s.client.StreamIsActive(t.Context(), bad)
			if err != nil {
				return err
			}
			_, err = stream.Recv()
			return err
		},
	}
	for name, call := range calls {
		t.Run(name, func(t *testing.T) {
			wantCode(t, call(), codes.InvalidArgument, `queueTarget="-3"`, "want a number from 0.001 to 1e15")
		})
	}
	t.Run("no ScaledObjectRef", func(t *testing.T) {
		_, err := s.client.GetMetrics(t.Context(), &pb.GetMetricsRequest{MetricName: "queue-backlog"})
		wantCode(t, err, codes.InvalidArgument, "scaledObjectRef is required")
	})
	t.Run("unknown metric", func(t *testing.T) {
		_, err := s.client.GetMetrics(t.Context(), &pb.GetMetricsRequest{
			ScaledObjectRef: ref("ml", "llm", map[string]string{"queue": "jobs"}), MetricName: "gpu-util"})
		wantCode(t, err, codes.NotFound, `no metric "gpu-util"`)
	})
}

func TestQueueEndToEnd(t *testing.T) {
	ns := natstest.Start(t, "", "")
	s := startScaler(t, ns.ClientURL(), Config{})
	pub := newPublisher(t, ns.ClientURL())
	r := ref("ml", "llm", map[string]string{"queue": "jobs", "queueTarget": "2"})

	_, err := s.client.IsActive(t.Context(), r)
	wantCode(t, err, codes.Unavailable, "no report for queue ml/jobs")

	pub.queue("ml", "jobs", 3, 2)
	testkit.Eventually(t, 5*time.Second, func() bool {
		resp, err := s.client.IsActive(t.Context(), r)
		return err == nil && resp.GetResult()
	})
	resp, err := s.client.GetMetrics(t.Context(), &pb.GetMetricsRequest{ScaledObjectRef: r, MetricName: "queue-backlog"})
	if err != nil {
		t.Fatal(err)
	}
	want := &pb.MetricValue{MetricName: "queue-backlog", MetricValue: 5, MetricValueFloat: 5}
	if len(resp.GetMetricValues()) != 1 || !proto.Equal(resp.GetMetricValues()[0], want) {
		t.Fatalf("GetMetrics = %v, want [%v]", resp, want)
	}

	pub.queue("ml", "jobs", 0, 0)
	testkit.Eventually(t, 5*time.Second, func() bool {
		resp, err := s.client.IsActive(t.Context(), r)
		return err == nil && !resp.GetResult()
	})
}

func TestGPUEndToEnd(t *testing.T) {
	ns := natstest.Start(t, "", "")
	s := startScaler(t, ns.ClientURL(), Config{})
	pub := newPublisher(t, ns.ClientURL())
	llm := map[string]string{"app": "llm"}
	pub.node(&gpuscalerv1.NodeReport{Node: "ip-10-0-0-1.ec2.internal", Gpus: []*gpuscalerv1.GPUSample{
		gpu("GPU-1", "ml", "llm-0", llm, 80, 60, 80),
		gpu("GPU-2", "ml", "llm-1", llm, 40, 20, 80),
		gpu("GPU-3", "other", "llm-0", llm, 100, 80, 80),
	}})
	r := ref("ml", "llm", map[string]string{"podSelector": "app=llm", "gpuUtilTarget": "50", "gpuMemoryTarget": "50"})
	metric := func(name string) (float64, error) {
		resp, err := s.client.GetMetrics(t.Context(), &pb.GetMetricsRequest{ScaledObjectRef: r, MetricName: name})
		if err != nil {
			return 0, err
		}
		return resp.GetMetricValues()[0].GetMetricValueFloat(), nil
	}
	testkit.Eventually(t, 5*time.Second, func() bool { v, err := metric("gpu-util"); return err == nil && v == 120 })
	if v, err := metric("gpu-memory"); err != nil || v != 100 { // 75% + 25%, one GPU per replica
		t.Fatalf("gpu-memory = %v, %v; want 100", v, err)
	}
	resp, err := s.client.IsActive(t.Context(), r)
	if err != nil || !resp.GetResult() {
		t.Fatalf("IsActive = %v, %v; want true", resp, err)
	}
}

func TestStreamIsActivePushesActivation(t *testing.T) {
	ns := natstest.Start(t, "", "")
	s := startScaler(t, ns.ClientURL(), Config{})
	pub := newPublisher(t, ns.ClientURL())
	pub.queue("ml", "jobs", 0, 0)
	testkit.Eventually(t, 5*time.Second, func() bool { _, _, q := s.State().Size(); return q == 1 })

	// pushInterval 0s: every activation is pushed (TestStreamIsActiveSpacesPushes spaces them).
	stream, err := s.client.StreamIsActive(t.Context(), ref("ml", "llm", map[string]string{"queue": "jobs", "pushInterval": "0s"}))
	if err != nil {
		t.Fatal(err)
	}
	msgs, errc := recvAll(stream)
	expectMsg(t, msgs, false) // the current state, sent when opened

	// applied publishes a report and waits until the scaler has applied it, but not until
	// the stream has looked: the stream keeps one message per subject, so a report
	// replaced before the scaler reads it is seen by no replica, and a dip nobody saw
	// cannot matter to KEDA, which scales to zero only after a whole cooldownPeriod.
	applied := func(ns string, waiting, inFlight uint64) {
		t.Helper()
		before := s.State().Applied()
		pub.queue(ns, "jobs", waiting, inFlight)
		testkit.Eventually(t, 5*time.Second, func() bool { return s.State().Applied() > before })
	}
	applied("ml", 1, 0)
	expectMsg(t, msgs, true)
	applied("ml", 2, 0) // still active: nothing to send
	applied("ml", 0, 0) // inactive: KEDA ignores false, so nothing is sent
	applied("ml", 0, 1) // active again, however soon after the dip: a new activation
	expectMsg(t, msgs, true)
	applied("other", 5, 0) // another namespace's queue of the same name
	applied("ml", 0, 0)
	applied("ml", 7, 0)
	expectMsg(t, msgs, true)
	if got := pushedAtLeast(t, s, 3); got != 3 {
		t.Fatalf("activations pushed = %v, want 3", got)
	}
	if got := testutil.ToFloat64(s.metrics.streamsOpen); got != 1 {
		t.Fatalf("streams open = %v, want 1", got)
	}

	s.stop()
	expectEOF(t, errc)
	for m := range msgs {
		t.Fatalf("stream sent %v after the last expected message", m)
	}
}

// TestGPUOnlyTriggerNeverLetsKEDAScaleToZero: a trigger with only podSelector, whose pods
// idle at 0 %, must not answer inactive. KEDA's executor (RequestScale in
// pkg/scaling/executor/scale_scaledobjects.go, v2.21.0) scales a ScaledObject with
// minReplicaCount 0 (KEDA's default) to zero once its triggers have been inactive for
// cooldownPeriod (scaleToZeroOrIdle), and at zero replicas the pods hold no GPUs, so the
// trigger could never be active again: a silent, permanent zero. Active at zero replicas,
// KEDA scales from zero to minReplicaCount or 1 (scaleFromZeroOrIdle), and never to zero;
// an error would keep it at zero, Ready=False, with no way back. So the trigger answers
// active whenever its GPUs can be judged, as KEDA refuses scale to zero for cpu and
// memory triggers alone (apis/keda/v1alpha1/scaledobject_webhook.go). Data that cannot be
// judged is still Unavailable; a trigger with a queue wakes from zero on the queue and
// keeps its GPU part's activity.
func TestGPUOnlyTriggerNeverLetsKEDAScaleToZero(t *testing.T) {
	ns := natstest.Start(t, "", "")
	s := startScaler(t, ns.ClientURL(), Config{})
	pub := newPublisher(t, ns.ClientURL())
	gpuOnly := ref("ml", "llm", map[string]string{"podSelector": "app=llm", "gpuUtilTarget": "60"})
	isActive := func(r *pb.ScaledObjectRef) (bool, error) {
		t.Helper()
		resp, err := s.client.IsActive(t.Context(), r)
		return resp.GetResult(), err
	}

	// No node has reported: unknown, never a silent inactive.
	_, err := isActive(gpuOnly)
	wantCode(t, err, codes.Unavailable, "no node report")

	applied := func(r *gpuscalerv1.NodeReport) {
		t.Helper()
		before := s.State().Applied()
		pub.node(r)
		testkit.Eventually(t, 5*time.Second, func() bool { return s.State().Applied() > before })
	}
	llm := map[string]string{"app": "llm"}
	applied(&gpuscalerv1.NodeReport{Node: "n1", Source: "sim", Gpus: []*gpuscalerv1.GPUSample{
		gpu("GPU-1", "ml", "llm-0", llm, 0, 60, 80), gpu("GPU-2", "ml", "llm-1", llm, 0, 60, 80)}})
	if active, err := isActive(gpuOnly); !active || err != nil {
		t.Fatalf("pods idle at 0%%: IsActive = %v, %v; want true: inactive lets KEDA scale to zero, and nothing wakes it", active, err)
	}
	resp, err := s.client.GetMetrics(t.Context(), &pb.GetMetricsRequest{ScaledObjectRef: gpuOnly, MetricName: MetricGPUUtil})
	if err != nil || resp.GetMetricValues()[0].GetMetricValueFloat() != 0 {
		t.Fatalf("gpu-util = %v, %v; want 0: the HPA still scales the idle pods down to KEDA's floor", resp, err)
	}
	// gpuscaler explain and the status page say why.
	explainer := gpuscalerv1.NewExplainerClient(s.conn)
	explain := func() *gpuscalerv1.Explanation {
		t.Helper()
		ex, err := explainer.Explain(t.Context(), &gpuscalerv1.ExplainRequest{Namespace: "ml", Name: "llm", Metadata: gpuOnly.ScalerMetadata})
		if err != nil {
			t.Fatal(err)
		}
		return ex
	}
	wantReason(t, explain(), "Active, always: a trigger with only podSelector", "KEDA therefore never scales this workload to zero")
	_, page := get(t, s, http.MethodGet, "/status/trigger?id=1")
	wantContains(t, "the trigger's status page", page, "Active, always: a trigger with only podSelector")

	// The workload at zero replicas: no pod holds a GPU.
	applied(&gpuscalerv1.NodeReport{Node: "n1", Source: "sim", Gpus: []*gpuscalerv1.GPUSample{gpu("GPU-1", "", "", nil, 0, 0, 80)}})
	if active, err := isActive(gpuOnly); !active || err != nil {
		t.Fatalf("no pod holds a GPU: IsActive = %v, %v; want true, so KEDA brings the workload back to one replica", active, err)
	}
	wantReason(t, explain(), "No pod in namespace ml holds a GPU", "The trigger answers active all the same")
	stream, err := s.client.StreamIsActive(t.Context(), gpuOnly)
	if err != nil {
		t.Fatal(err)
	}
	msgs, _ := recvAll(stream)
	expectMsg(t, msgs, true)

	// With a queue, idle, the trigger can wake from zero on the queue: it is inactive.
	pub.queue("ml", "jobs", 0, 0)
	combined := ref("ml", "llm", map[string]string{"queue": "jobs", "podSelector": "app=llm", "gpuUtilTarget": "60"})
	testkit.Eventually(t, 5*time.Second, func() bool {
		active, err := isActive(combined)
		return err == nil && !active
	})
}

// TestStreamIsActiveSpacesPushes: sparse traffic, a request every 2 s for a minute, each
// served before the next, makes the queue go from empty to non-empty 30 times. KEDA
// answers every push with RequestScale and a ScaledObject status write, as lastActiveTime
// changes (startPushScalers and handleResult in KEDA's pkg/scaling/scale_handler.go), so
// each activation pushed was a status write every 2 s. Once the first push has woken the
// workload, KEDA does not scale it to zero before a cooldownPeriod has passed since
// lastActiveTime (scaleToZeroOrIdle in pkg/scaling/executor/scale_scaledobjects.go), so
// the stream pushes at most once per pushInterval (30 s by default, KEDA's default
// pollingInterval): twice in the minute. A request after the trigger has been quiet for
// longer than that, one that may find the workload at zero, is still pushed at once. The
// scaler's clock is moved by hand; the stream's looks are waited for through its counters.
// TestStreamIsActivePushesHeldActivationStillActive: an activation held within
// pushInterval is pushed when the interval has passed, if the trigger is still active.
// KEDA may not have acted on the push before it (a paused ScaledObject, metric names not
// set yet, a failed scale: startPushScalers in pkg/scaling/scale_handler.go and
// RequestScale skip those without writing lastActiveTime), so a workload at zero with
// work waiting must not wait for KEDA's next poll.
func TestStreamIsActivePushesHeldActivationStillActive(t *testing.T) {
	var offset atomic.Int64
	now := func() time.Time { return time.Now().Add(time.Duration(offset.Load())) }
	ns := natstest.Start(t, "", "")
	// The watchdog would measure the offset as clock skew and correct it away: keep it quiet.
	s := startScaler(t, ns.ClientURL(), Config{Now: now, streamCheckEvery: time.Hour})
	pub := newPublisher(t, ns.ClientURL())
	pub.queue("ml", "jobs", 0, 0)
	testkit.Eventually(t, 5*time.Second, func() bool { _, _, q := s.State().Size(); return q == 1 })
	stream, err := s.client.StreamIsActive(t.Context(), ref("ml", "llm", map[string]string{"queue": "jobs", "pushInterval": "1s"}))
	if err != nil {
		t.Fatal(err)
	}
	msgs, _ := recvAll(stream)
	expectMsg(t, msgs, false)
	pub.queue("ml", "jobs", 1, 0) // pushed: the wake
	expectMsg(t, msgs, true)
	// Served: applied before the next report, which would otherwise replace it unread (the
	// stream keeps one report per producer), and no dip would be seen. Counted as the
	// third report applied: Apply counts a report after its effects, so a count read now
	// could still miss the wake's.
	pub.queue("ml", "jobs", 0, 0)
	testkit.Eventually(t, 5*time.Second, func() bool { return s.State().Applied() >= 3 })
	testkit.Eventually(t, 5*time.Second, func() bool { return testutil.ToFloat64(s.metrics.activationsPushed) == 1 })
	// The clock set back 3 s: the next activation reads as within the second of the push
	// unless the machine takes 4 s to get there (under load it once took over one, and
	// the activation was pushed, not held), and the held one is pushed at most 4 s after.
	offset.Store(int64(-3 * time.Second))
	held := testutil.ToFloat64(s.metrics.activationsHeld)
	pub.queue("ml", "jobs", 1, 0) // within the second: held, and nobody serves it
	testkit.Eventually(t, 5*time.Second, func() bool { return testutil.ToFloat64(s.metrics.activationsHeld) > held })
	// Still active when the second (and the 3 s) has passed: pushed then. The stream
	// counts a push once it has sent it, so the count may come just after the message.
	expectMsg(t, msgs, true)
	testkit.Eventually(t, 5*time.Second, func() bool { return testutil.ToFloat64(s.metrics.activationsPushed) == 2 })
}

func TestStreamIsActiveSpacesPushes(t *testing.T) {
	var offset atomic.Int64
	now := func() time.Time { return time.Now().Add(time.Duration(offset.Load())) }
	ns := natstest.Start(t, "", "")
	// The watchdog would measure the offset as clock skew and correct it away: keep it quiet.
	s := startScaler(t, ns.ClientURL(), Config{Now: now, streamCheckEvery: time.Hour})
	pub := newPublisher(t, ns.ClientURL())
	pub.queue("ml", "jobs", 0, 0)
	testkit.Eventually(t, 5*time.Second, func() bool { _, _, q := s.State().Size(); return q == 1 })

	// staleAfter 10m: the hand-moved clock must not make the queue's reports stale.
	stream, err := s.client.StreamIsActive(t.Context(), ref("ml", "llm", map[string]string{"queue": "jobs", "staleAfter": "10m"}))
	if err != nil {
		t.Fatal(err)
	}
	msgs, _ := recvAll(stream)
	expectMsg(t, msgs, false)

	looked := func() float64 {
		return testutil.ToFloat64(s.metrics.activationsPushed) + testutil.ToFloat64(s.metrics.activationsHeld)
	}
	// request is one request: waiting, then served, the queue empty again. It returns once
	// the stream has judged the activation, pushed or held, at the clock's present reading.
	request := func() {
		t.Helper()
		before := looked()
		for _, waiting := range []uint64{1, 0} {
			applied := s.State().Applied()
			pub.queue("ml", "jobs", waiting, 0)
			testkit.Eventually(t, 5*time.Second, func() bool { return s.State().Applied() > applied })
			if waiting == 1 {
				testkit.Eventually(t, 5*time.Second, func() bool { return looked() > before })
			}
		}
	}

	for i := range 30 { // at 0 s, 2 s, … 58 s
		if i > 0 {
			offset.Add(int64(2 * time.Second))
		}
		request()
	}
	// Pushed at 0 s (the wake) and at 30 s, a pushInterval after it; the other 28 held.
	pushed, held := testutil.ToFloat64(s.metrics.activationsPushed), testutil.ToFloat64(s.metrics.activationsHeld)
	if pushed != 2 || held != 28 {
		t.Fatalf("a minute of requests 2 s apart: pushed %v, held %v; want 2 pushed (one per pushInterval 30s), 28 held", pushed, held)
	}
	expectMsg(t, msgs, true)
	expectMsg(t, msgs, true)
	select {
	case m := <-msgs:
		t.Fatalf("stream sent %v more, want only the 2 pushes", m)
	default:
	}
	// The stream counts a held activation just before the status page's count moves.
	testkit.Eventually(t, 5*time.Second, func(context.Context) error {
		_, page := get(t, s, http.MethodGet, "/status")
		return testkit.Check(strings.Contains(page, "28 activations held within pushInterval"), "the status page = %q, want 28 activations held within pushInterval", page)
	})

	// Quiet for longer than pushInterval since the last push (at 30 s): the next request
	// may find the workload at zero, and is pushed at once, without the clock moving on.
	offset.Add(int64(40 * time.Second))
	request()
	expectMsg(t, msgs, true)
	if got := pushedAtLeast(t, s, 3); got != 3 {
		t.Fatalf("activations pushed = %v, want 3: the request after a quiet pushInterval is pushed", got)
	}
}

// TestStreamIsActiveCombinedTriggerPushesOnce: a trigger with a queue and a podSelector
// whose pods are busy stays active while its queue is empty, so the queue's heartbeats,
// empty each time, push nothing: KEDA writes the ScaledObject's status for every push,
// and a push a second per trigger would use up its apiserver rate. Once the pods are idle
// too, an empty report is a dip of the whole trigger, and the next work is pushed.
func TestStreamIsActiveCombinedTriggerPushesOnce(t *testing.T) {
	ns := natstest.Start(t, "", "")
	s := startScaler(t, ns.ClientURL(), Config{})
	pub := newPublisher(t, ns.ClientURL())
	llm := map[string]string{"app": "llm"}
	busy := &gpuscalerv1.NodeReport{Node: "n1", Source: "sim", Gpus: []*gpuscalerv1.GPUSample{gpu("GPU-1", "ml", "llm-0", llm, 90, 60, 80)}}
	idle := &gpuscalerv1.NodeReport{Node: "n1", Source: "sim", Gpus: []*gpuscalerv1.GPUSample{gpu("GPU-1", "ml", "llm-0", llm, 0, 60, 80)}}
	applied := func(publish func()) {
		t.Helper()
		before := s.State().Applied()
		publish()
		testkit.Eventually(t, 5*time.Second, func() bool { return s.State().Applied() > before })
	}
	applied(func() { pub.node(busy) })
	applied(func() { pub.queue("ml", "jobs", 0, 0) })

	stream, err := s.client.StreamIsActive(t.Context(), ref("ml", "llm", map[string]string{
		"queue": "jobs", "podSelector": "app=llm", "gpuUtilTarget": "60", "activationGpuUtil": "10", "pushInterval": "0s"}))
	if err != nil {
		t.Fatal(err)
	}
	msgs, _ := recvAll(stream)
	expectMsg(t, msgs, true) // the pods are busy: active when opened
	for range 30 {
		applied(func() { pub.queue("ml", "jobs", 0, 0) }) // heartbeats of an empty queue
	}
	// The pods go idle: the whole trigger is inactive, which the next heartbeat shows; then
	// work arrives, a real activation. Its push is the first message since the opening
	// one, or a heartbeat above pushed.
	applied(func() { pub.node(idle) })
	applied(func() { pub.queue("ml", "jobs", 0, 0) })
	applied(func() { pub.queue("ml", "jobs", 1, 0) })
	expectOnePush(t, s, msgs, "the queue's work after the pods went idle")
}

// TestThousandStreams opens 1,000 streams at once: one queue report reaches each of the
// streams on that queue, none of the others, and shutdown ends every one cleanly.
func TestThousandStreams(t *testing.T) {
	const streams, queues = 1000, 10
	ns := natstest.Start(t, "", "")
	s := startScaler(t, ns.ClientURL(), Config{})
	pub := newPublisher(t, ns.ClientURL())

	type opened struct {
		msgs <-chan bool
		errc <-chan error
	}
	all := make([]opened, streams)
	for i := range all {
		stream, err := s.client.StreamIsActive(t.Context(), ref("ml", "so-"+itoa(i), map[string]string{"queue": "q" + itoa(i%queues)}))
		if err != nil {
			t.Fatal(err)
		}
		msgs, errc := recvAll(stream)
		all[i] = opened{msgs, errc}
	}
	for i := range all {
		expectMsg(t, all[i].msgs, false)
	}
	testkit.Eventually(t, 5*time.Second, func() bool { return testutil.ToFloat64(s.metrics.streamsOpen) == streams })

	pub.queue("ml", "q3", 1, 0)
	for i := range all {
		if i%queues == 3 {
			expectMsg(t, all[i].msgs, true)
		}
	}
	for i := range all {
		select {
		case m := <-all[i].msgs:
			t.Fatalf("stream %d on queue q%d got %v from a report for q3", i, i%queues, m)
		default:
		}
	}

	s.stop()
	for i := range all {
		expectEOF(t, all[i].errc)
	}
	if got := testutil.ToFloat64(s.metrics.streamsOpen); got != 0 {
		t.Fatalf("streams open after shutdown = %v, want 0", got)
	}
}

func TestStaleDataIsUnavailable(t *testing.T) {
	var offset atomic.Int64
	now := func() time.Time { return time.Now().Add(time.Duration(offset.Load())) }
	ns := natstest.Start(t, "", "")
	// The watchdog would measure the offset as clock skew and correct it away: keep it quiet.
	s := startScaler(t, ns.ClientURL(), Config{Now: now, streamCheckEvery: time.Hour})
	pub := newPublisher(t, ns.ClientURL())
	r := ref("ml", "llm", map[string]string{"queue": "jobs", "staleAfter": "10s"})

	pub.queue("ml", "jobs", 4, 0)
	testkit.Eventually(t, 5*time.Second, func() bool {
		resp, err := s.client.IsActive(t.Context(), r)
		return err == nil && resp.GetResult()
	})
	offset.Store(int64(time.Minute))
	_, err := s.client.IsActive(t.Context(), r)
	wantCode(t, err, codes.Unavailable, "queue ml/jobs last reported at", "longer than staleAfter 10s")
	_, err = s.client.GetMetrics(t.Context(), &pb.GetMetricsRequest{ScaledObjectRef: r, MetricName: "queue-backlog"})
	wantCode(t, err, codes.Unavailable, "queue ml/jobs last reported at")

	// The default staleAfter (30s) applies when the trigger sets none.
	_, err = s.client.IsActive(t.Context(), ref("ml", "llm", map[string]string{"queue": "jobs"}))
	wantCode(t, err, codes.Unavailable, "longer than staleAfter 30s")
}

func TestRestartRecoversStateBeforeServing(t *testing.T) {
	ns := natstest.Start(t, "", "")
	first := startScaler(t, ns.ClientURL(), Config{})
	pub := newPublisher(t, ns.ClientURL())
	pub.queue("ml", "jobs", 6, 1)
	pub.queue("ml", "jobs", 2, 1) // only the latest per subject matters
	pub.queue("prod", "jobs", 0, 0)
	pub.node(&gpuscalerv1.NodeReport{Node: "n1", Gpus: []*gpuscalerv1.GPUSample{gpu("GPU-1", "ml", "llm-0", map[string]string{"app": "llm"}, 75, 1, 80)}})
	testkit.Eventually(t, 5*time.Second, func() bool { n, _, q := first.State().Size(); return n == 1 && q == 2 })
	first.stop()

	second := startScaler(t, ns.ClientURL(), Config{})
	// Ready means restored: the very first calls answer from the replayed state.
	resp, err := second.client.GetMetrics(t.Context(), &pb.GetMetricsRequest{
		ScaledObjectRef: ref("ml", "llm", map[string]string{"queue": "jobs"}), MetricName: "queue-backlog"})
	if err != nil || resp.GetMetricValues()[0].GetMetricValueFloat() != 3 {
		t.Fatalf("restarted GetMetrics = %v, %v; want backlog 3", resp, err)
	}
	resp, err = second.client.GetMetrics(t.Context(), &pb.GetMetricsRequest{
		ScaledObjectRef: ref("ml", "llm", map[string]string{"podSelector": "app=llm", "gpuUtilTarget": "50"}), MetricName: "gpu-util"})
	if err != nil || resp.GetMetricValues()[0].GetMetricValueFloat() != 75 {
		t.Fatalf("restarted gpu-util = %v, %v; want 75", resp, err)
	}
	if got := testutil.ToFloat64(second.metrics.replayMessages); got != 3 {
		t.Fatalf("replayed %v messages, want 3 (the last per subject)", got)
	}
}

// TestNotReadyIsUnavailable checks the handlers refuse to answer from a state that is
// not yet restored.
func TestNotReadyIsUnavailable(t *testing.T) {
	srv := &Server{state: NewState(nil), ready: make(chan struct{}), done: make(chan struct{}), stale: DefaultStaleAfter}
	r := ref("ml", "llm", map[string]string{"queue": "jobs"})
	_, err := srv.IsActive(t.Context(), r)
	wantCode(t, err, codes.Unavailable, "restoring its state")
	_, err = srv.GetMetrics(t.Context(), &pb.GetMetricsRequest{ScaledObjectRef: r, MetricName: "queue-backlog"})
	wantCode(t, err, codes.Unavailable, "restoring its state")
	if _, err := srv.GetMetricSpec(t.Context(), r); err != nil {
		t.Fatalf("GetMetricSpec needs no state, got %v", err)
	}
}

func TestMalformedEventsAreCountedAndDropped(t *testing.T) {
	ns := natstest.Start(t, "", "")
	s := startScaler(t, ns.ClientURL(), Config{})
	pub := newPublisher(t, ns.ClientURL())
	pub.queue("ml", "jobs", 3, 0)
	pub.node(&gpuscalerv1.NodeReport{Node: "n1", Gpus: []*gpuscalerv1.GPUSample{gpu("GPU-1", "ml", "llm-0", map[string]string{"app": "llm"}, 75, 1, 80)}})
	testkit.Eventually(t, 5*time.Second, func() bool { return s.State().Applied() == 2 }) // counted after its effects: Size moves first

	// The stream keeps one message per subject, so a message replaced before the consumer
	// reads it is never delivered (only the latest report matters). Send each one after
	// the scaler has handled the one before: dropped it or applied it (an event is
	// counted as received before either, and nodes and queues are read by consumers of
	// their own).
	handled := func() float64 {
		n := float64(s.State().Applied())
		families, err := s.reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range families {
			if m.GetName() == "gpuscaler_scaler_events_dropped_total" {
				for _, c := range m.GetMetric() {
					n += c.GetCounter().GetValue()
				}
			}
		}
		return n
	}
	send := func(subject string, data []byte) {
		t.Helper()
		before := handled()
		pub.raw(subject, data)
		testkit.Eventually(t, 5*time.Second, func() bool { return handled() > before })
	}
	bad := func(r proto.Message) []byte { b, _ := proto.Marshal(r); return b }
	send("gpuscaler.v1.queue.ml.jobs.p", []byte{0xff, 0xff, 0xff})                                                                         // decode
	send("gpuscaler.v1.queue.ml.jobs.p", bad(&gpuscalerv1.QueueReport{Namespace: "prod", Queue: "jobs", ProducerId: "p", Waiting: 99}))    // mismatch: other namespace
	send("gpuscaler.v1.queue.ml.jobs.p", bad(&gpuscalerv1.QueueReport{Namespace: "ml", Queue: "other", ProducerId: "p", Waiting: 99}))     // mismatch: other queue
	send("gpuscaler.v1.node.n1", bad(&gpuscalerv1.NodeReport{Node: "n1", Gpus: []*gpuscalerv1.GPUSample{{Uuid: ""}}}))                     // invalid: no uuid
	send("gpuscaler.v1.node.n1", bad(&gpuscalerv1.NodeReport{Node: "n2"}))                                                                 // mismatch: other node
	send("gpuscaler.v1.node.n1.gpu", []byte("hello"))                                                                                      // subject
	send("gpuscaler.v1.queue.ml.jobs.p", bad(&gpuscalerv1.QueueReport{Namespace: "ml", Queue: "jobs", ProducerId: "p", Waiting: 1 << 62})) // valid again

	want := `
# HELP gpuscaler_scaler_events_dropped_total Events dropped, by kind and reason: malformed (subject, decode, invalid, mismatch: naming another node or queue than their subject, metadata), queue_limit: a new queue in a namespace with --max-queues-per-namespace queues, or producer_limit: a new producer of a queue with --max-producers-per-queue producers.
# TYPE gpuscaler_scaler_events_dropped_total counter
gpuscaler_scaler_events_dropped_total{kind="node",reason="invalid"} 1
gpuscaler_scaler_events_dropped_total{kind="node",reason="mismatch"} 1
gpuscaler_scaler_events_dropped_total{kind="queue",reason="decode"} 1
gpuscaler_scaler_events_dropped_total{kind="queue",reason="mismatch"} 2
gpuscaler_scaler_events_dropped_total{kind="unknown",reason="subject"} 1
`
	if err := testutil.CollectAndCompare(s.reg, strings.NewReader(want), "gpuscaler_scaler_events_dropped_total"); err != nil {
		t.Fatal(err)
	}
	// The malformed events changed nothing: n1 keeps its GPU, the queue its last good value.
	resp, err := s.client.GetMetrics(t.Context(), &pb.GetMetricsRequest{
		ScaledObjectRef: ref("ml", "llm", map[string]string{"podSelector": "app=llm", "gpuUtilTarget": "50"}), MetricName: "gpu-util"})
	if err != nil || resp.GetMetricValues()[0].GetMetricValueFloat() != 75 {
		t.Fatalf("gpu-util after malformed node reports = %v, %v; want 75", resp, err)
	}
	resp, err = s.client.GetMetrics(t.Context(), &pb.GetMetricsRequest{
		ScaledObjectRef: ref("ml", "llm", map[string]string{"queue": "jobs"}), MetricName: "queue-backlog"})
	if err != nil || resp.GetMetricValues()[0].GetMetricValueFloat() != 1<<62 {
		t.Fatalf("queue-backlog = %v, %v; want %d", resp, err, uint64(1<<62))
	}
	if n, g, q := s.State().Size(); n != 1 || g != 1 || q != 1 {
		t.Fatalf("state size = %d nodes, %d gpus, %d queues; want 1, 1, 1", n, g, q)
	}
}

// TestQueueLimitDropsNewQueues: over NATS, a namespace publishing more queues than
// MaxQueuesPerNamespace gets the first ones tracked and the rest dropped, counted
// without a namespace label, and logged once a minute naming the namespace; another
// namespace's queue is unaffected.
func TestQueueLimitDropsNewQueues(t *testing.T) {
	ns := natstest.Start(t, "", "")
	s, logs := startScalerLogging(t, ns.ClientURL(), Config{MaxQueuesPerNamespace: 3})
	pub := newPublisher(t, ns.ClientURL())
	for i := range 3 {
		pub.queue("evil", "q"+itoa(i), 1, 0)
	}
	pub.queue("ml", "jobs", 4, 0)
	testkit.Eventually(t, 5*time.Second, func() bool { _, _, q := s.State().Size(); return q == 4 })
	for i := 3; i < 8; i++ {
		pub.queue("evil", "q"+itoa(i), 1, 0)
	}
	dropped := func() float64 {
		return testutil.ToFloat64(s.metrics.eventsDropped.WithLabelValues("queue", "queue_limit"))
	}
	testkit.Eventually(t, 5*time.Second, func() bool { return dropped() == 5 })

	if _, _, q := s.State().Size(); q != 4 {
		t.Fatalf("state holds %d queues, want 4 (3 of evil, 1 of ml)", q)
	}
	if n := testkit.CountLines(logs.String(), "dropped a report of a new queue"); n != 1 {
		t.Errorf("%d log lines for the dropped reports, want 1 (once a minute per namespace):\n%s", n, logs.String())
	}
	if !strings.Contains(logs.String(), "namespace=evil") {
		t.Errorf("the log line does not name the namespace:\n%s", logs.String())
	}
	want := `
# HELP gpuscaler_scaler_namespaces_at_queue_limit Namespaces with as many queues as --max-queues-per-namespace allows; reports of their new queues are dropped, and logged naming the namespace.
# TYPE gpuscaler_scaler_namespaces_at_queue_limit gauge
gpuscaler_scaler_namespaces_at_queue_limit 1
`
	if err := testutil.CollectAndCompare(s.reg, strings.NewReader(want), "gpuscaler_scaler_namespaces_at_queue_limit"); err != nil {
		t.Fatal(err)
	}

	// Tracked queues keep updating, in the namespace at its limit and elsewhere; a
	// trigger on a dropped queue says why.
	pub.queue("evil", "q0", 9, 0)
	pub.queue("ml", "jobs", 5, 0)
	for q, want := range map[string]float64{"evil/q0": 9, "ml/jobs": 5} {
		namespace, queue, _ := strings.Cut(q, "/")
		r := ref(namespace, "so", map[string]string{"queue": queue})
		testkit.Eventually(t, 5*time.Second, func() bool {
			resp, err := s.client.GetMetrics(t.Context(), &pb.GetMetricsRequest{ScaledObjectRef: r, MetricName: MetricQueueBacklog})
			return err == nil && resp.GetMetricValues()[0].GetMetricValueFloat() == want
		})
	}
	_, err := s.client.IsActive(t.Context(), ref("evil", "so", map[string]string{"queue": "q7"}))
	wantCode(t, err, codes.Unavailable, "namespace evil has 3 queues", "--max-queues-per-namespace")
}

func TestHTTPEndpointsAndRPCMetrics(t *testing.T) {
	ns := natstest.Start(t, "", "")
	s := startScaler(t, ns.ClientURL(), Config{})
	newPublisher(t, ns.ClientURL()).queue("ml", "jobs", 1, 0)
	r := ref("ml", "llm", map[string]string{"queue": "jobs"})
	// Wait through GetMetrics, so that the IsActive counts below are exactly the two calls
	// made after: polling IsActive would count an Unavailable for each poll that came
	// before the report was applied.
	testkit.Eventually(t, 5*time.Second, func() bool {
		resp, err := s.client.GetMetrics(t.Context(), &pb.GetMetricsRequest{ScaledObjectRef: r, MetricName: "queue-backlog"})
		return err == nil && resp.GetMetricValues()[0].GetMetricValueFloat() == 1
	})
	if resp, err := s.client.IsActive(t.Context(), r); err != nil || !resp.GetResult() {
		t.Fatalf("IsActive = %v, %v; want true", resp, err)
	}
	if _, err := s.client.IsActive(t.Context(), ref("ml", "llm", map[string]string{"queue": "absent"})); status.Code(err) != codes.Unavailable {
		t.Fatalf("IsActive on an absent queue = %v; want Unavailable", err)
	}

	get := func(path string) (int, string) {
		resp, err := http.Get("http://" + s.HTTPAddr().String() + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	if code, body := get("/healthz"); code != 200 || body != "ok\n" {
		t.Fatalf("/healthz = %d %q, want 200 ok", code, body)
	}
	if code, body := get("/readyz"); code != 200 || body != "ready\n" {
		t.Fatalf("/readyz = %d %q, want 200 ready", code, body)
	}
	code, body := get("/metrics")
	for _, want := range []string{
		`gpuscaler_scaler_state_entries{kind="queue"} 1`,
		`gpuscaler_scaler_events_received_total{kind="queue"} 1`,
		`gpuscaler_scaler_ready 1`,
		`gpuscaler_scaler_nats_connected 1`,
		`gpuscaler_scaler_rpc_duration_seconds_count{code="OK",method="IsActive"} 1`,
		`gpuscaler_scaler_rpc_duration_seconds_count{code="Unavailable",method="IsActive"} 1`,
		`gpuscaler_scaler_replay_duration_seconds`,
	} {
		if code != 200 || !strings.Contains(body, want) {
			t.Errorf("/metrics (status %d) lacks %q", code, want)
		}
	}
}

// TestSurvivesNATSRestart stops the NATS server under a running scaler and starts it
// again on the same address and store: /readyz fails once NATS has been gone longer than
// staleAfter, and the scaler follows new reports after the reconnect.
func TestSurvivesNATSRestart(t *testing.T) {
	addr, dir := testkit.FreeAddr(t), t.TempDir()
	ns := natstest.Start(t, addr, dir)
	s := startScaler(t, ns.ClientURL(), Config{StaleAfter: time.Second})
	pub := newPublisher(t, ns.ClientURL())
	r := ref("ml", "llm", map[string]string{"queue": "jobs", "staleAfter": "10m"})
	pub.queue("ml", "jobs", 1, 0)
	testkit.Eventually(t, 5*time.Second, func() bool {
		resp, err := s.client.IsActive(t.Context(), r)
		return err == nil && resp.GetResult()
	})

	ns.Shutdown()
	testkit.Eventually(t, 10*time.Second, func() bool {
		err := s.readiness()
		return err != nil && strings.Contains(err.Error(), "NATS has been disconnected")
	})
	// The state stays: data is judged by its age, not by the connection.
	if resp, err := s.client.IsActive(t.Context(), r); err != nil || !resp.GetResult() {
		t.Fatalf("IsActive while NATS is down = %v, %v; want true from the last report", resp, err)
	}

	natstest.Start(t, addr, dir)
	testkit.Eventually(t, 15*time.Second, func() bool { return s.readiness() == nil })
	testkit.Eventually(t, 15*time.Second, func() bool {
		pubCtx, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		data, _ := proto.Marshal(&gpuscalerv1.QueueReport{Namespace: "ml", Queue: "jobs", ProducerId: "p", Waiting: 42})
		if _, err := pub.js.Publish(pubCtx, "gpuscaler.v1.queue.ml.jobs.p", data); err != nil {
			return false
		}
		resp, err := s.client.GetMetrics(t.Context(), &pb.GetMetricsRequest{ScaledObjectRef: r, MetricName: "queue-backlog"})
		return err == nil && resp.GetMetricValues()[0].GetMetricValueFloat() == 42
	})
}

// TestConcurrentReadsAndWrites runs readers, streams and a writer at once under -race.
func TestConcurrentReadsAndWrites(t *testing.T) {
	ns := natstest.Start(t, "", "")
	s := startScaler(t, ns.ClientURL(), Config{})
	pub := newPublisher(t, ns.ClientURL())
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for i := range 4 {
		wg.Go(func() {
			r := ref("ml", "so", map[string]string{"queue": "q" + itoa(i), "podSelector": "app=llm", "gpuUtilTarget": "50"})
			for ctx.Err() == nil {
				_, _ = s.client.IsActive(ctx, r)
				_, _ = s.client.GetMetrics(ctx, &pb.GetMetricsRequest{ScaledObjectRef: r, MetricName: "gpu-util"})
			}
		})
	}
	for i := range 50 {
		pub.queue("ml", "q"+itoa(i%4), uint64(i%3), 0)
		pub.node(&gpuscalerv1.NodeReport{Node: fmt.Sprintf("n%d", i%5), Gpus: []*gpuscalerv1.GPUSample{
			gpu("GPU-"+itoa(i), "ml", "p"+itoa(i%7), map[string]string{"app": "llm"}, float64(i%100), 1, 2)}})
	}
	cancel()
	wg.Wait()
	if !errors.Is(ctx.Err(), context.Canceled) && !errors.Is(ctx.Err(), context.DeadlineExceeded) {
		t.Fatal(ctx.Err())
	}
}

func TestNewRejectsBadStaleAfter(t *testing.T) {
	ns := natstest.Start(t, "", "")
	nc := natstest.Connect(t, ns.ClientURL())
	for _, d := range []time.Duration{-time.Second, 500 * time.Millisecond, 25 * time.Hour} {
		if _, err := New(Config{GRPCAddr: "127.0.0.1:0", HTTPAddr: "-", StaleAfter: d}, nc.Conn, testkit.Logger(t), nil); err == nil || !strings.Contains(err.Error(), "stale-after") {
			t.Errorf("New with StaleAfter %s: error %v, want one naming stale-after", d, err)
		}
	}
}

// TestGRPCHealth checks the standard health service says SERVING once ready, and
// NOT_SERVING once NATS has been gone longer than staleAfter.
func TestGRPCHealth(t *testing.T) {
	ns := natstest.Start(t, testkit.FreeAddr(t), "")
	s := startScaler(t, ns.ClientURL(), Config{StaleAfter: time.Second})
	health := healthpb.NewHealthClient(s.conn)
	status := func() healthpb.HealthCheckResponse_ServingStatus {
		resp, err := health.Check(t.Context(), &healthpb.HealthCheckRequest{})
		if err != nil {
			return healthpb.HealthCheckResponse_UNKNOWN
		}
		return resp.GetStatus()
	}
	testkit.Eventually(t, 5*time.Second, func() bool { return status() == healthpb.HealthCheckResponse_SERVING })
	ns.Shutdown()
	testkit.Eventually(t, 10*time.Second, func() bool { return status() == healthpb.HealthCheckResponse_NOT_SERVING })
}

// jobsBacklog reads the queue-backlog of ml/jobs from s, -1 when it fails.
func jobsBacklog(t *testing.T, s *testScaler) func() float64 {
	r := ref("ml", "llm", map[string]string{"queue": "jobs"})
	return func() float64 {
		resp, err := s.client.GetMetrics(t.Context(), &pb.GetMetricsRequest{ScaledObjectRef: r, MetricName: "queue-backlog"})
		if err != nil {
			return -1
		}
		return resp.GetMetricValues()[0].GetMetricValueFloat()
	}
}

// TestStreamDeletedIsSetUpAgain deletes the stream under a running scaler (as a NATS
// restart does to a memory stream): the scaler must create it again and follow it.
func TestStreamDeletedIsSetUpAgain(t *testing.T) {
	ns := natstest.Start(t, "", "")
	s := startScaler(t, ns.ClientURL(), Config{streamCheckEvery: 50 * time.Millisecond})
	pub := newPublisher(t, ns.ClientURL())
	backlog := jobsBacklog(t, s)
	pub.queue("ml", "jobs", 5, 0)
	testkit.Eventually(t, 5*time.Second, func() bool { return backlog() == 5 })

	if err := pub.js.DeleteStream(t.Context(), gpuscalerv1.QueueStreamName); err != nil {
		t.Fatal(err)
	}
	// The scaler creates the stream again; a report published then is followed.
	testkit.Eventually(t, 10*time.Second, func() bool {
		_, err := pub.js.Stream(t.Context(), gpuscalerv1.QueueStreamName)
		return err == nil
	})
	testkit.Eventually(t, 10*time.Second, func() bool {
		data, _ := proto.Marshal(&gpuscalerv1.QueueReport{Namespace: "ml", Queue: "jobs", ProducerId: "p", Waiting: 9})
		_, _ = pub.js.Publish(t.Context(), "gpuscaler.v1.queue.ml.jobs.p", data)
		return backlog() == 9
	})
	if err := s.readiness(); err != nil {
		t.Fatalf("readiness after the stream came back: %v", err)
	}
}

// TestStalledConsumerIsReplaced: the scaler's consumer stops delivering while the
// stream goes on taking reports, as when the NATS server hosting it is killed and
// nats.go's own recovery waits on a stream with no leader (stallWatch). Here the server
// pauses it, which nats.go never notices. The scaler makes a new consumer, resuming after
// the last report read, and counts the stall.
func TestStalledConsumerIsReplaced(t *testing.T) {
	ns := natstest.Start(t, "", "")
	s, logs := startScalerLogging(t, ns.ClientURL(), Config{streamCheckEvery: 50 * time.Millisecond})
	pub := newPublisher(t, ns.ClientURL())
	backlog := jobsBacklog(t, s)
	pub.queue("ml", "jobs", 5, 0)
	testkit.Eventually(t, 5*time.Second, func() bool { return backlog() == 5 })
	received := testutil.ToFloat64(s.metrics.eventsReceived.WithLabelValues("queue"))

	stream, err := pub.js.Stream(t.Context(), gpuscalerv1.QueueStreamName)
	if err != nil {
		t.Fatal(err)
	}
	names := stream.ConsumerNames(t.Context())
	var paused int
	for name := range names.Name() {
		if _, err := pub.js.PauseConsumer(t.Context(), gpuscalerv1.QueueStreamName, name, time.Now().Add(time.Hour)); err != nil {
			t.Fatal(err)
		}
		paused++
	}
	if err := names.Err(); err != nil || paused != 1 {
		t.Fatalf("paused %d consumers (%v), want the scaler's one", paused, err)
	}
	pub.queue("ml", "jobs", 9, 0)
	testkit.Eventually(t, 10*time.Second, func() bool { return backlog() == 9 })
	if n := testutil.ToFloat64(s.metrics.consumerStalls); n < 1 {
		t.Errorf("gpuscaler_scaler_stream_consumer_stalls_total = %v, want at least 1", n)
	}
	if !strings.Contains(logs.String(), "consumer stalled") {
		t.Errorf("no stall logged:\n%s", logs)
	}
	// Resumed after the last report read: the first report is not applied again.
	if got := testutil.ToFloat64(s.metrics.eventsReceived.WithLabelValues("queue")); got != received+1 {
		t.Errorf("queue reports received %v, want %v: the new consumer replayed what the old one had read", got, received+1)
	}
}

// TestStreamRecreatedElsewhereIsFollowed: another party deletes and recreates the stream,
// so its sequence numbers start again from 1. The scaler must notice and replay it.
func TestStreamRecreatedElsewhereIsFollowed(t *testing.T) {
	ns := natstest.Start(t, "", "")
	s := startScaler(t, ns.ClientURL(), Config{streamCheckEvery: 50 * time.Millisecond})
	pub := newPublisher(t, ns.ClientURL())
	r := ref("ml", "llm", map[string]string{"queue": "jobs"})
	for i := range 20 { // move the old stream's sequence well past what the new one will reach
		pub.queue("ml", "q"+itoa(i), 1, 0)
	}
	pub.queue("ml", "jobs", 5, 0)
	testkit.Eventually(t, 5*time.Second, func() bool { _, _, q := s.State().Size(); return q == 21 })

	cfg := (StreamConfig{}).withDefaults().queueStream()
	if err := pub.js.DeleteStream(t.Context(), gpuscalerv1.QueueStreamName); err != nil {
		t.Fatal(err)
	}
	// Made again at once, as another party would. The scaler makes it too once it sees it
	// gone, which may come first: either way the sequences start again from 1. Under load
	// nats-server can refuse a create racing another ("error creating store for
	// stream"), so it is tried until the stream exists.
	testkit.Eventually(t, 5*time.Second, func() bool {
		_, err := pub.js.CreateStream(t.Context(), cfg)
		if err != nil && !errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			t.Logf("create the stream again: %v", err)
		}
		return err == nil || errors.Is(err, jetstream.ErrStreamNameAlreadyInUse)
	})
	pub.queue("ml", "jobs", 9, 0) // sequence 1 of the new stream
	testkit.Eventually(t, 10*time.Second, func() bool {
		resp, err := s.client.GetMetrics(t.Context(), &pb.GetMetricsRequest{ScaledObjectRef: r, MetricName: "queue-backlog"})
		return err == nil && resp.GetMetricValues()[0].GetMetricValueFloat() == 9
	})
}

// TestExistingStreamWithOtherSettingsIsAdopted: streams made with a storage this scaler
// cannot change are updated keeping it, rather than fought over; one that cannot be
// updated at all (here it denies purges, which an update may not cancel) is used as it is.
func TestExistingStreamWithOtherSettingsIsAdopted(t *testing.T) {
	ns := natstest.Start(t, "", "")
	pub := newPublisher(t, ns.ClientURL())
	cfg := (StreamConfig{Memory: true}).withDefaults()
	nodes, queues := cfg.nodeStream(), cfg.queueStream()
	nodes.MaxBytes = 1 << 20
	queues.DenyPurge = true
	for _, stream := range []jetstream.StreamConfig{nodes, queues} {
		if _, err := pub.js.CreateStream(t.Context(), stream); err != nil {
			t.Fatal(err)
		}
	}
	pub.queue("ml", "jobs", 3, 0)
	pub.node(&gpuscalerv1.NodeReport{Node: "n1", Gpus: []*gpuscalerv1.GPUSample{gpu("GPU-1", "ml", "llm-0", llm, 75, 1, 80)}})
	s, logs := startScalerLogging(t, ns.ClientURL(), Config{}) // wants file storage
	resp, err := s.client.GetMetrics(t.Context(), &pb.GetMetricsRequest{
		ScaledObjectRef: ref("ml", "llm", map[string]string{"queue": "jobs"}), MetricName: "queue-backlog"})
	if err != nil || resp.GetMetricValues()[0].GetMetricValueFloat() != 3 {
		t.Fatalf("GetMetrics on an adopted stream = %v, %v; want backlog 3", resp, err)
	}
	if n, _, _ := s.State().Size(); n != 1 {
		t.Fatalf("%d nodes replayed from an updated stream, want 1", n)
	}
	for name, want := range map[string]jetstream.StreamConfig{gpuscalerv1.StreamName: nodes, gpuscalerv1.QueueStreamName: queues} {
		st, err := pub.js.Stream(t.Context(), name)
		if err != nil {
			t.Fatal(err)
		}
		got := st.CachedInfo().Config
		if got.Storage != jetstream.MemoryStorage {
			t.Errorf("stream %s has storage %s, want memory, as it was made", name, got.Storage)
		}
		wantBytes := int64(DefaultStreamMaxBytes) // updated to this scaler's
		if name == gpuscalerv1.QueueStreamName {
			wantBytes = want.MaxBytes // used as it was
		}
		if got.MaxBytes != wantBytes {
			t.Errorf("stream %s has MaxBytes %d, want %d", name, got.MaxBytes, wantBytes)
		}
	}
	for _, want := range []string{"updated the existing stream keeping its storage", "using the existing stream as it is"} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("no %q in the log:\n%s", want, logs.String())
		}
	}
}

// TestUnusableStreamSaysWhyNotReady: when another stream already captures gpuscaler's
// subjects, the scaler cannot make its own, and /readyz says so.
func TestUnusableStreamSaysWhyNotReady(t *testing.T) {
	ns := natstest.Start(t, "", "")
	pub := newPublisher(t, ns.ClientURL())
	if _, err := pub.js.CreateStream(t.Context(), jetstream.StreamConfig{Name: "SQUATTER", Subjects: []string{"gpuscaler.>"}}); err != nil {
		t.Fatal(err)
	}
	s := newScaler(t, ns.ClientURL(), Config{})
	testkit.Eventually(t, 10*time.Second, func() bool {
		err := s.readiness()
		return err != nil && strings.Contains(err.Error(), "create or update stream GPUSCALER")
	})
	_, err := s.client.IsActive(t.Context(), ref("ml", "llm", map[string]string{"queue": "jobs"}))
	wantCode(t, err, codes.Unavailable, "restoring its state")
}

// TestClockSkewIsCorrected runs the scaler with a clock 40 s ahead of NATS's: without
// correction every report would be stale on arrival.
func TestClockSkewIsCorrected(t *testing.T) {
	ns := natstest.Start(t, "", "")
	ahead := func() time.Time { return time.Now().Add(40 * time.Second) }
	s := startScaler(t, ns.ClientURL(), Config{Now: ahead, streamCheckEvery: 50 * time.Millisecond})
	pub := newPublisher(t, ns.ClientURL())
	pub.queue("ml", "jobs", 2, 0)
	r := ref("ml", "llm", map[string]string{"queue": "jobs"})
	testkit.Eventually(t, 5*time.Second, func() bool {
		resp, err := s.client.IsActive(t.Context(), r)
		return err == nil && resp.GetResult()
	})
	if skew := s.clock.Skew(); skew > -39*time.Second || skew < -41*time.Second {
		t.Fatalf("measured skew %s, want about -40s", skew)
	}
}

func TestTriggerStaleAfterBeyondStreamMaxAge(t *testing.T) {
	ns := natstest.Start(t, "", "")
	s := startScaler(t, ns.ClientURL(), Config{Stream: StreamConfig{MaxAge: 10 * time.Minute}})
	_, err := s.client.GetMetricSpec(t.Context(), ref("ml", "llm", map[string]string{"queue": "jobs", "staleAfter": "11m"}))
	wantCode(t, err, codes.InvalidArgument, `staleAfter="11m0s"`, "at most 10m0s, the scaler's --stream-max-age")
}

func TestNewRejectsMaxAgeNotAboveStaleAfter(t *testing.T) {
	ns := natstest.Start(t, "", "")
	nc := natstest.Connect(t, ns.ClientURL())
	_, err := New(Config{GRPCAddr: "127.0.0.1:0", HTTPAddr: "-", StaleAfter: time.Minute, Stream: StreamConfig{MaxAge: time.Minute}}, nc.Conn, testkit.Logger(t), nil)
	if err == nil || !strings.Contains(err.Error(), "stream-max-age 1m0s: want more than stale-after 1m0s") {
		t.Fatalf("New with MaxAge = StaleAfter: error %v, want one naming both", err)
	}
}

// connCounter counts the connections a client opened.
type connCounter struct{ n atomic.Int32 }

func (c *connCounter) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context   { return ctx }
func (c *connCounter) HandleRPC(context.Context, stats.RPCStats)                         {}
func (c *connCounter) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context { return ctx }
func (c *connCounter) HandleConn(_ context.Context, s stats.ConnStats) {
	if _, ok := s.(*stats.ConnBegin); ok {
		c.n.Add(1)
	}
}

// TestConnectionsAgeOutButStreamsStay checks MaxConnectionAge: the server ends a client's
// connection after it (so KEDA resolves the address again and reaches replicas added
// since), the client's calls go on over a new connection, and a StreamIsActive stream
// opened on the old one still delivers.
func TestConnectionsAgeOutButStreamsStay(t *testing.T) {
	ns := natstest.Start(t, "", "")
	s := startScaler(t, ns.ClientURL(), Config{MaxConnectionAge: 200 * time.Millisecond})
	pub := newPublisher(t, ns.ClientURL())
	pub.queue("ml", "jobs", 0, 0)

	var conns connCounter
	client := pb.NewExternalScalerClient(dial(t, s.GRPCAddr().String(),
		grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithStatsHandler(&conns)))
	r := ref("ml", "llm", map[string]string{"queue": "jobs"})
	stream, err := client.StreamIsActive(t.Context(), r)
	if err != nil {
		t.Fatal(err)
	}
	if first, err := stream.Recv(); err != nil || first.GetResult() {
		t.Fatalf("first message = %v, %v; want false", first, err)
	}
	testkit.Eventually(t, 10*time.Second, func() bool {
		_, err := client.GetMetricSpec(t.Context(), r)
		return err == nil && conns.n.Load() >= 2
	})
	pub.queue("ml", "jobs", 1, 0)
	got := make(chan error, 1)
	go func() {
		resp, err := stream.Recv()
		if err == nil && !resp.GetResult() {
			err = errors.New("got false")
		}
		got <- err
	}()
	select {
	case err := <-got:
		if err != nil {
			t.Fatalf("stream after the connection aged out: %v; want true", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no activation on the stream within 5s of the report")
	}
}

// TestStallWatch: a stream with nothing newer than the last message read is idle, not
// stalled, however long nothing is read; a message just stored is not a stall either,
// until it has waited consumerStallAfter; reading anything starts over.
func TestStallWatch(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	w := stallWatch{read: 10}
	for i, step := range []struct {
		at         time.Duration
		read       uint64
		msgs, last uint64
		want       bool
	}{
		{0, 10, 5, 10, false},                                  // caught up
		{time.Hour, 10, 0, 12, false},                          // emptied by MaxAge: LastSeq stays, nothing to read
		{time.Hour + time.Second, 10, 3, 12, false},            // newer messages: pending from here
		{time.Hour + 2*time.Second, 10, 3, 13, false},          // 1 s
		{time.Hour + 3*time.Second, 10, 3, 13, true},           // 2 s: stalled
		{time.Hour + 4*time.Second, 12, 3, 13, false},          // read again: starts over
		{time.Hour + 10*time.Second, 12, 3, 13, false},         // pending again from here
		{time.Hour + 10500*time.Millisecond, 13, 3, 13, false}, // caught up
	} {
		var got bool
		if !w.progressed(step.read) {
			got = w.stalled(t0.Add(step.at), step.msgs, step.last)
		}
		if got != step.want {
			t.Errorf("step %d: stalled = %v, want %v", i, got, step.want)
		}
	}
}
