package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	kedav1alpha1 "github.com/kedacore/keda/v2/apis/keda/v1alpha1"

	"github.com/gpuscaler/gpuscaler/test/e2e/cluster"

	"github.com/gpuscaler/gpuscaler/test/testkit"
)

// TestGatewayScalesAnInferenceServiceFromZero runs two replicas of `gpuscaler gateway`
// in front of an inference Service scaled to zero, as a namespace runs them: each
// holds the requests it gets while the Service has no ready endpoint and reports them as
// its share of the queue a ScaledObject's external-push trigger reads; the scaler sums
// the live shares, KEDA wakes the Deployment, the HPA takes it further, and the first
// ready endpoint in the Service's EndpointSlices (written by the real EndpointSlice
// controller from kwok's Ready conditions) releases the held requests. Traffic reaches
// the pods' model servers through a forwarder playing kube-proxy (modelservers_test.go).
//
//  1. 20 requests, two thirds streamed, spread over both gateways while the Deployment
//     is at 0: the scaler reads 10 + 10, KEDA wakes it by push, the HPA takes it to
//     maxReplicaCount 3 (⌈20/2⌉ = 10), every request gets its whole answer, and with
//     the load gone the Deployment goes back to 0.
//  2. Long streams through both gateways; one gateway is killed (SIGKILL, no last
//     report) while they run: the queue loses that gateway's share only, after
//     staleAfter, never reads 0 or unknown while the other gateway's streams run, the
//     Deployment is not scaled to 0 before they end, and they end whole.
//  3. A route whose Service never has an endpoint: its request gets, after the route's
//     holdTimeout of 2 s, a 503 with Retry-After and an OpenAI-style JSON error.
func TestGatewayScalesAnInferenceServiceFromZero(t *testing.T) {
	const (
		name        = "llm-server"
		queue       = "llm-requests"
		modelLoad   = 1500 * time.Millisecond
		tokenEvery  = 200 * time.Millisecond
		target      = 2
		maxReplicas = 3
		staleAfter  = 3 * time.Second
		holdTimeout = 2 * time.Second
	)
	ns := newNamespace(t, "gateway")
	pool := newGPUPool(t, "gw-"+ns, 8)
	createGPUDeployment(t, ns, name, pool.name, 0, 1, modelLoad)
	createService(t, ns, name, 8000)
	createService(t, ns, "ghost-server", 8000) // selects app=ghost-server: no pod, ever
	servers := startModelServers(t, ns, "app="+name, tokenEvery)
	proxy := startKubeProxy(t, servers)

	routes := fmt.Sprintf(`routes:
- name: llm
  pathPrefix: /v1
  service: {name: %s, port: 8000}
  queue: %s
  holdTimeout: 1m
- name: ghost
  pathPrefix: /ghost
  service: {name: ghost-server, port: 8000}
  queue: ghost-requests
  holdTimeout: %s
`, name, queue, holdTimeout)
	ids := []string{"gw-a", "gw-b"}
	gws := make([]*cluster.Gateway, len(ids))
	for i, id := range ids {
		gw, err := env.G.StartGateway(t.Context(), cluster.GatewayOptions{
			Namespace: ns, Kubeconfig: env.CP.Kubeconfig, Routes: routes, ProducerID: id,
			// kube-proxy's part: the Service's port is the forwarder. ghost-server
			// is never ready, so never dialled.
			ServiceAddresses: []string{fmt.Sprintf("%s:8000=%s", name, proxy.addr)},
			ReportInterval:   500 * time.Millisecond,
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(gw.Stop)
		gws[i] = gw
	}

	trigger := pushTrigger("queue", queue, "queueTarget", fmt.Sprint(target), "staleAfter", staleAfter.String())
	// Each gateway reports its empty share from its start: KEDA's first polls find data
	// (a queue never reported fails them, which breaks KEDA's push stream for a while;
	// see TestWakeAfterProducerOutage).
	// The scaler holds both gateways' empty shares.
	testkit.Eventually(t, 20*time.Second, producersAre(ns, trigger.Metadata, map[string]share{"gw-a": {}, "gw-b": {}}))
	createScaledObject(t, fastScaleDown(scaledObject(ns, name, name, 0, maxReplicas, testPolling, testCooldown, trigger)))
	waitCondition(t, ns, name, kedav1alpha1.ConditionReady, metav1.ConditionTrue, "", 30*time.Second)
	backlog := func(ctx context.Context) (float64, error) {
		return env.Scaler.Metric(ctx, ns, name, trigger.Metadata, "queue-backlog")
	}

	// 3, in the background: a request for a Service that never gets an endpoint.
	ghost := make(chan answer, 1)
	go func() {
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		defer cancel()
		ghost <- requestCompletion(ctx, gws[1].Addr, "/ghost/v1/completions", 1, false)
	}()

	// 1. 20 requests at 0 replicas.
	dw := watchDeployments(t, ns, name)
	pw := watchPods(t, ns)
	const n, tokens = 20, 8
	streamed := func(i int) bool { return i%3 != 2 }
	answers := make([]answer, n)
	var wg sync.WaitGroup
	t.Logf("%d requests of %d tokens (%s each once forwarded), two thirds of them streamed, over both gateways", n, tokens, tokens*tokenEvery)
	sent := time.Now()
	for i := range n {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
			defer cancel()
			answers[i] = requestCompletion(ctx, gws[i%2].Addr, "/v1/completions", tokens, streamed(i))
		})
	}
	woke := dw.waitFor(t, name, 1, 30*time.Second)
	// Until the first answer ends the 20 are waiting or in flight. Each gateway holds
	// 10: reading 20, the scaler sums both shares.
	// The scaler reads the 20 requests, 10 held by each gateway.
	testkit.Eventually(t, 10*time.Second, func(ctx context.Context) error {
		v, err := backlog(ctx)
		if err != nil {
			return err
		}
		return testkit.Check(v == n, "queue-backlog %g", v)
	})
	scaled := dw.waitFor(t, name, maxReplicas, 30*time.Second)
	// What the gateways act on: the EndpointSlice controller's ready endpoints, the
	// pods' kwok addresses, which nothing dials.
	// The Service's EndpointSlices show a ready endpoint.
	testkit.Eventually(t, 30*time.Second, func(ctx context.Context) error {
		eps, err := readyEndpoints(ctx, ns, name)
		if err != nil {
			return err
		}
		if len(eps) > 0 {
			t.Logf("EndpointSlices of %s: ready %v", name, eps)
		}
		return testkit.Check(len(eps) > 0, "ready endpoints %v", eps)
	})
	wg.Wait()
	last := time.Now()
	var first time.Time
	pods := map[string]int{}
	for i, a := range answers {
		if why := a.whole(tokens, streamed(i)); why != "" {
			t.Errorf("request %d through %s: %s", i, ids[i%2], why)
			continue
		}
		if first.IsZero() || a.first.Before(first) {
			first = a.first
		}
		pods[a.header.Get("X-E2E-Pod")]++
	}
	if t.Failed() {
		t.FailNow()
	}
	ready := pw.earliestReady()
	recordFigure(t, "gateway, %d requests at 0 replicas: first request → 1 replica (KEDA, pushed) %s; → %d replicas (HPA, ⌈%d/%d⌉ capped) %s",
		n, woke.Sub(sent).Round(time.Millisecond), maxReplicas, n, target, scaled.Sub(sent).Round(time.Millisecond))
	recordFigure(t, "gateway: first request → first pod Ready %s (model load %s); pod Ready → the first request at its model server %s (EndpointSlice controller, the gateway's watch and release, the forwarder), → first response %s (one token, %s)",
		ready.Sub(sent).Round(time.Millisecond), modelLoad, servers.first().Sub(ready).Round(time.Millisecond), first.Sub(ready).Round(time.Millisecond), tokenEvery)
	t.Logf("all %d answers whole, from pods %v", n, pods)

	zero := dw.waitFor(t, name, 0, 60*time.Second)
	recordFigure(t, "gateway: last answer → 0 replicas %s (HPA scale-down window 3 s, cooldownPeriod %d s)", zero.Sub(last).Round(time.Millisecond), testCooldown)
	// The pods and their model servers gone.
	testkit.Eventually(t, 30*time.Second, func(context.Context) error {
		r := servers.running()
		return testkit.Check(r == 0, "%d model servers running", r)
	})
	// The Service's EndpointSlices list no ready endpoint, so the gateways hold what comes
	// next rather than forward it to a model server that is gone.
	testkit.Eventually(t, 30*time.Second, func(ctx context.Context) error {
		eps, err := readyEndpoints(ctx, ns, name)
		if err != nil {
			return err
		}
		return testkit.Check(len(eps) == 0, "ready endpoints %v", eps)
	})

	// 3. The hold timeout's answer, which came long ago.
	select {
	case a := <-ghost:
		checkHoldTimeout(t, a, holdTimeout)
	case <-time.After(30 * time.Second):
		t.Fatal("no answer from the route without endpoints")
	}

	// 2. One gateway dies while both serve long streams.
	const long = 50 // tokens: 10 s each
	var outstandingB atomic.Int32
	aAnswers, bAnswers := make([]answer, 2), make([]answer, 3)
	var aw, bw sync.WaitGroup
	bSent := time.Now()
	for i := range aAnswers {
		aw.Go(func() {
			ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
			defer cancel()
			aAnswers[i] = requestCompletion(ctx, gws[0].Addr, "/v1/completions", long, true)
		})
	}
	outstandingB.Store(int32(len(bAnswers)))
	for i := range bAnswers {
		bw.Go(func() {
			defer outstandingB.Add(-1)
			ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
			defer cancel()
			bAnswers[i] = requestCompletion(ctx, gws[1].Addr, "/v1/completions", long, true)
		})
	}
	// gw-b's streams cannot end before they have been forwarded and generated for
	// long × tokenEvery: until then its share is 3 for certain.
	bBusyUntil := bSent.Add(long * tokenEvery)
	// Both gateways' streams forwarded, their shares reported.
	testkit.Eventually(t, 20*time.Second, producersAre(ns, trigger.Metadata, map[string]share{"gw-a": {inFlight: 2}, "gw-b": {inFlight: 3}}))

	mon := startBacklogMonitor(t, backlog, func() int { return int(outstandingB.Load()) }, func(ctx context.Context) (int32, error) { return replicas(ctx, ns, name) })
	t.Log("gw-a killed (SIGKILL) with 2 streams in flight; gw-b serves 3")
	gws[0].Kill()
	killed := time.Now()
	var lost time.Time
	// The queue loses gw-a's share only: 3.
	testkit.Eventually(t, staleAfter+5*time.Second, func(ctx context.Context) error {
		v, err := backlog(ctx)
		if err != nil {
			return err
		}
		if v == 3 && lost.IsZero() {
			lost = time.Now()
		}
		return testkit.Check(v == 3, "queue-backlog %g", v)
	})
	if time.Now().After(bBusyUntil) {
		t.Fatalf("gw-a's share left after gw-b's streams could have ended (%s after they were sent): lengthen them", time.Since(bSent))
	}
	// gw-a stale, gw-b's 3 in flight.
	testkit.Eventually(t, 10*time.Second, producersAre(ns, trigger.Metadata, map[string]share{"gw-a": {stale: true}, "gw-b": {inFlight: 3}}))
	recordFigure(t, "gateway: one of two killed (SIGKILL) → its share of the queue gone %s later (staleAfter %s, heartbeat 500ms)", lost.Sub(killed).Round(time.Millisecond), staleAfter)

	bw.Wait()
	bDone := time.Now()
	samples := mon.stop()
	aw.Wait()
	for i, a := range bAnswers {
		if why := a.whole(long, true); why != "" {
			t.Errorf("stream %d through gw-b, which lived: %s", i, why)
		}
	}
	for i, a := range aAnswers {
		if a.whole(long, true) == "" {
			t.Errorf("stream %d through gw-a, killed mid-stream, came whole", i)
		}
	}
	// While gw-b's streams ran, the queue never read 0 or unknown, and before they could
	// have ended it never read below their 3.
	minRead := -1.0
	var seen []int32 // the Deployment's replicas while gw-b's streams ran, each change
	for _, s := range samples {
		if s.outstanding > 0 && s.replicasErr == nil && (len(seen) == 0 || seen[len(seen)-1] != s.replicas) {
			seen = append(seen, s.replicas)
		}
		switch {
		case s.outstanding == 0:
			continue
		case s.err != nil:
			t.Errorf("%s after the kill, with %d streams through gw-b running: the scaler answered %v", s.at.Sub(killed).Round(time.Millisecond), s.outstanding, s.err)
		case s.backlog == 0:
			t.Errorf("%s after the kill, with %d streams through gw-b running: queue-backlog 0", s.at.Sub(killed).Round(time.Millisecond), s.outstanding)
		case s.at.Before(bBusyUntil) && s.backlog < 3:
			t.Errorf("%s after the kill, before gw-b's streams could end: queue-backlog %g, below gw-b's 3", s.at.Sub(killed).Round(time.Millisecond), s.backlog)
		}
		if s.outstanding > 0 && s.replicasErr == nil && s.replicas == 0 {
			t.Errorf("%s after the kill, with %d streams through gw-b running: Deployment at 0 replicas", s.at.Sub(killed).Round(time.Millisecond), s.outstanding)
		}
		if s.err == nil && (minRead < 0 || s.backlog < minRead) {
			minRead = s.backlog
		}
	}
	t.Logf("%d readings of queue-backlog while gw-b's streams ran, the lowest %g; the Deployment's replicas meanwhile %v", len(samples), minRead, seen)
	zero = dw.waitFor(t, name, 0, 60*time.Second)
	if zero.Before(bDone) {
		t.Errorf("Deployment at 0 replicas %s before gw-b's streams ended", bDone.Sub(zero))
	}
	recordFigure(t, "gateway: the survivor's last stream ended → 0 replicas %s", zero.Sub(bDone).Round(time.Millisecond))
}

// createService creates a Service of one TCP port selecting the pods labelled app=name.
func createService(t *testing.T, ns, name string, port int32) {
	t.Helper()
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: corev1.ServiceSpec{
			Selector: map[string]string{"app": name},
			Ports:    []corev1.ServicePort{{Name: "http", Port: port, TargetPort: intstr.FromInt32(port), Protocol: corev1.ProtocolTCP}},
		},
	}
	if _, err := env.Kube.CoreV1().Services(ns).Create(t.Context(), svc, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create Service %s/%s: %v", ns, name, err)
	}
}

// readyEndpoints lists the ready addresses in the EndpointSlices of Service name.
func readyEndpoints(ctx context.Context, ns, name string) ([]string, error) {
	l, err := env.Kube.DiscoveryV1().EndpointSlices(ns).List(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=" + name})
	if err != nil {
		return nil, err
	}
	var addrs []string
	for _, s := range l.Items {
		for _, e := range s.Endpoints {
			if e.Conditions.Ready != nil && *e.Conditions.Ready {
				addrs = append(addrs, e.Addresses...)
			}
		}
	}
	return addrs, nil
}

// share is what a test expects of one producer's last report.
type share struct {
	waiting, inFlight uint64
	stale             bool
}

// producersAre polls `gpuscaler explain` until the queue of a trigger has exactly the
// producers of want, each with its expected report (only stale is checked of a stale
// one).
func producersAre(ns string, meta map[string]string, want map[string]share) func(ctx context.Context) error {
	return func(ctx context.Context) error {
		got, err := env.G.QueueProducers(ctx, env.Scaler.GRPCAddr, ns, meta)
		if err != nil {
			return err
		}
		var parts []string
		ok := len(got) == len(want)
		for id, p := range got {
			parts = append(parts, fmt.Sprintf("%s: %d waiting, %d in flight, stale %v", id, p.Waiting, p.InFlight, p.Stale))
			w, known := want[id]
			switch {
			case !known || p.Stale != w.stale:
				ok = false
			case !w.stale && (p.Waiting != w.waiting || p.InFlight != w.inFlight):
				ok = false
			}
		}
		slices.Sort(parts)
		return testkit.Check(ok, "%s", "producers "+strings.Join(parts, "; "))
	}
}

// checkHoldTimeout checks the answer to a request held past its route's holdTimeout:
// 503, Retry-After, the reason header and an OpenAI-style error body (gateway/errors.go).
func checkHoldTimeout(t *testing.T, a answer, holdTimeout time.Duration) {
	t.Helper()
	if a.err != nil {
		t.Fatalf("hold timeout: %v", a.err)
	}
	took := a.first.Sub(a.sent)
	if a.code != http.StatusServiceUnavailable {
		t.Errorf("hold timeout: status %d, want 503; body %s", a.code, a.body)
	}
	if took < holdTimeout || took > holdTimeout+5*time.Second {
		t.Errorf("hold timeout: answered after %s, want just after holdTimeout %s", took, holdTimeout)
	}
	if got := a.header.Get("Retry-After"); got == "" {
		t.Error("hold timeout: no Retry-After")
	}
	if got, want := a.header.Get("X-Gpuscaler-Reason"), "hold-timeout"; got != want {
		t.Errorf("hold timeout: X-Gpuscaler-Reason %q, want %q", got, want)
	}
	if got := a.header.Get("Content-Type"); got != "application/json" {
		t.Errorf("hold timeout: Content-Type %q, want application/json", got)
	}
	var body struct {
		Error struct {
			Message, Type, Code string
		} `json:"error"`
	}
	if err := json.Unmarshal([]byte(a.body), &body); err != nil {
		t.Fatalf("hold timeout: body %q: %v", a.body, err)
	}
	if body.Error.Code != "gpuscaler_hold_timeout" || body.Error.Type != "server_error" || !strings.Contains(body.Error.Message, "ghost-server") {
		t.Errorf("hold timeout: error %+v, want code gpuscaler_hold_timeout, type server_error, a message naming ghost-server", body.Error)
	}
	recordFigure(t, "gateway: a Service with no endpoint → 503 after %s (holdTimeout %s), Retry-After %s, %s", took.Round(time.Millisecond), holdTimeout, a.header.Get("Retry-After"), strings.TrimSpace(a.body))
}

// backlogMonitor reads the queue's backlog, the Deployment's replicas and the requests
// outstanding every 100 ms until stopped.
type backlogMonitor struct {
	stopc   chan struct{}
	done    chan struct{}
	samples []backlogSample // written by the monitor's goroutine until done
}

type backlogSample struct {
	at          time.Time
	outstanding int
	backlog     float64
	err         error
	replicas    int32
	replicasErr error
}

func startBacklogMonitor(t *testing.T, backlog func(context.Context) (float64, error), outstanding func() int, replicas func(context.Context) (int32, error)) *backlogMonitor {
	m := &backlogMonitor{stopc: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(m.done)
		for {
			ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
			s := backlogSample{at: time.Now()}
			s.backlog, s.err = backlog(ctx)
			s.replicas, s.replicasErr = replicas(ctx)
			// Read last: a request counted here was outstanding through both reads.
			s.outstanding = outstanding()
			cancel()
			m.samples = append(m.samples, s)
			select {
			case <-m.stopc:
				return
			case <-t.Context().Done():
				return
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
	t.Cleanup(func() { m.stop() })
	return m
}

// stop ends the monitor and returns its samples. Calling it again returns them again.
func (m *backlogMonitor) stop() []backlogSample {
	select {
	case <-m.stopc:
	default:
		close(m.stopc)
	}
	<-m.done
	return m.samples
}
