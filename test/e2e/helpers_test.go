package e2e

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv1 "k8s.io/api/autoscaling/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	kedav1alpha1 "github.com/kedacore/keda/v2/apis/keda/v1alpha1"

	"github.com/gpuscaler/gpuscaler/test/e2e/cluster"

	"github.com/gpuscaler/gpuscaler/test/testkit"
)

// newNamespace creates a namespace for one test. Its ScaledObjects and ScaledJobs are
// deleted when the test ends, so KEDA stops polling for them; the namespace itself stays
// (no controller manager runs to finalize its deletion), which costs nothing.
func newNamespace(t *testing.T, prefix string) string {
	t.Helper()
	ns := fmt.Sprintf("%s-%04x", prefix, rand.IntN(0x10000))
	if err := cluster.CreateNamespace(t.Context(), env.Kube, ns); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		sos := env.KEDACli.KedaV1alpha1().ScaledObjects(ns)
		_ = sos.DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{})
		sjs := env.KEDACli.KedaV1alpha1().ScaledJobs(ns)
		_ = sjs.DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{})
	})
	return ns
}

// createDeployment creates a Deployment with replicas and a pod template no kubelet will
// ever run.
func createDeployment(t *testing.T, ns, name string, replicas int32) {
	t.Helper()
	createDeploymentOf(t, ns, name, replicas, podTemplate)
}

// createDeploymentOf creates a Deployment of replicas pods labelled app=name, from the
// template template makes for those labels.
func createDeploymentOf(t *testing.T, ns, name string, replicas int32, template func(labels map[string]string) corev1.PodTemplateSpec) {
	t.Helper()
	labels := map[string]string{"app": name}
	d := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: appsv1.DeploymentSpec{
			Replicas: &replicas,
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: template(labels),
		},
	}
	if _, err := env.Kube.AppsV1().Deployments(ns).Create(t.Context(), d, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create Deployment %s/%s: %v", ns, name, err)
	}
}

func podTemplate(labels map[string]string) corev1.PodTemplateSpec {
	return corev1.PodTemplateSpec{
		ObjectMeta: metav1.ObjectMeta{Labels: labels},
		Spec: corev1.PodSpec{
			Containers: []corev1.Container{{Name: "worker", Image: "registry.invalid/gpuscaler-e2e-worker:none"}},
		},
	}
}

// replicas returns the Deployment's spec.replicas.
func replicas(ctx context.Context, ns, name string) (int32, error) {
	d, err := env.Kube.AppsV1().Deployments(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return 0, err
	}
	if d.Spec.Replicas == nil {
		return 1, nil
	}
	return *d.Spec.Replicas, nil
}

// setReplicas writes the Deployment's scale subresource, as a person or another
// controller would.
func setReplicas(t *testing.T, ns, name string, n int32) {
	t.Helper()
	s := &autoscalingv1.Scale{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}, Spec: autoscalingv1.ScaleSpec{Replicas: n}}
	if _, err := env.Kube.AppsV1().Deployments(ns).UpdateScale(t.Context(), name, s, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("scale %s/%s to %d: %v", ns, name, n, err)
	}
}

// consistently polls cond every 200 ms for d and fails the test the first time it does
// not hold. It is how a test shows something does not happen (a scale to zero).
func consistently(t *testing.T, d time.Duration, what string, cond func(ctx context.Context) error) {
	t.Helper()
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if err := cond(t.Context()); err != nil {
			t.Fatalf("%s: broke after %s: %v", what, d-time.Until(deadline).Round(time.Millisecond), err)
		}
		select {
		case <-t.Context().Done():
			t.Fatal(t.Context().Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func waitReplicas(t *testing.T, ns, name string, want int32, timeout time.Duration) {
	t.Helper()
	testkit.Eventually(t, timeout, replicasAre(ns, name, want))
}

func replicasAre(ns, name string, want int32) func(ctx context.Context) error {
	return func(ctx context.Context) error {
		n, err := replicas(ctx, ns, name)
		if err != nil {
			return err
		}
		return testkit.Check(n == want, "Deployment %s/%s: spec.replicas %d, want %d", ns, name, n, want)
	}
}

// condition returns the ScaledObject's condition of type typ.
func condition(ctx context.Context, ns, name string, typ kedav1alpha1.ConditionType) (kedav1alpha1.Condition, error) {
	so, err := env.KEDACli.KedaV1alpha1().ScaledObjects(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return kedav1alpha1.Condition{}, err
	}
	for _, c := range so.Status.Conditions {
		if c.Type == typ {
			return c, nil
		}
	}
	return kedav1alpha1.Condition{}, fmt.Errorf("no %s condition yet (conditions %s)", typ, conditionsString(so.Status.Conditions))
}

func conditionsString(cs kedav1alpha1.Conditions) string {
	var parts []string
	for _, c := range cs {
		parts = append(parts, fmt.Sprintf("%s=%s(%s: %s)", c.Type, c.Status, c.Reason, c.Message))
	}
	return "[" + strings.Join(parts, " ") + "]"
}

// waitCondition waits for the ScaledObject's condition typ to have status (and reason,
// when given).
func waitCondition(t *testing.T, ns, name string, typ kedav1alpha1.ConditionType, status metav1.ConditionStatus, reason string, timeout time.Duration) kedav1alpha1.Condition {
	t.Helper()
	var got kedav1alpha1.Condition
	testkit.Eventually(t, timeout, func(ctx context.Context) error {
		c, err := condition(ctx, ns, name, typ)
		if err != nil {
			return err
		}
		got = c
		return testkit.Check(c.Status == status && (reason == "" || c.Reason == reason),
			"ScaledObject %s/%s: %s=%s (%s: %s), want %s %s", ns, name, c.Type, c.Status, c.Reason, c.Message, status, reason)
	})
	return got
}

// createScaledObject creates so and waits until KEDA has taken it up: its HPA exists
// and the status names its external metrics.
func createScaledObject(t *testing.T, so *kedav1alpha1.ScaledObject) *kedav1alpha1.ScaledObject {
	t.Helper()
	if _, err := env.KEDACli.KedaV1alpha1().ScaledObjects(so.Namespace).Create(t.Context(), so, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create ScaledObject %s/%s: %v", so.Namespace, so.Name, err)
	}
	var got *kedav1alpha1.ScaledObject
	testkit.Eventually(t, 30*time.Second, func(ctx context.Context) error {
		var err error
		got, err = env.KEDACli.KedaV1alpha1().ScaledObjects(so.Namespace).Get(ctx, so.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if got.Status.HpaName == "" || len(got.Status.ExternalMetricNames) == 0 {
			return fmt.Errorf("KEDA has not taken up ScaledObject %s/%s: no HPA or metric names in its status yet: %s", so.Namespace, so.Name, conditionsString(got.Status.Conditions))
		}
		return nil
	})
	return got
}

// kedaHPA returns the HPA KEDA made for so, and checks that it carries one external
// metric, metric, with an AverageValue target of averageValue (gpuscaler's metrics are
// totals for the whole workload under an AverageValue target).
func kedaHPA(t *testing.T, so *kedav1alpha1.ScaledObject, metric, averageValue string) *autoscalingv2.HorizontalPodAutoscaler {
	t.Helper()
	hpa, err := env.Kube.AutoscalingV2().HorizontalPodAutoscalers(so.Namespace).Get(t.Context(), so.Status.HpaName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if m := hpa.Spec.Metrics; len(m) != 1 || m[0].External == nil || m[0].External.Metric.Name != metric ||
		m[0].External.Target.AverageValue == nil || m[0].External.Target.AverageValue.String() != averageValue {
		t.Errorf("KEDA's HPA metrics %+v, want one external %s with averageValue %s", m, metric, averageValue)
	}
	return hpa
}

func int32p(n int32) *int32 { return &n }

// scaledObject builds a ScaledObject on the Deployment target with one trigger.
func scaledObject(ns, name, target string, minR, maxR int32, polling, cooldown int32, trigger kedav1alpha1.ScaleTriggers) *kedav1alpha1.ScaledObject {
	so := &kedav1alpha1.ScaledObject{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: kedav1alpha1.ScaledObjectSpec{
			ScaleTargetRef:  &kedav1alpha1.ScaleTarget{Name: target},
			MinReplicaCount: int32p(minR),
			MaxReplicaCount: int32p(maxR),
			Triggers:        []kedav1alpha1.ScaleTriggers{trigger},
		},
	}
	if polling > 0 {
		so.Spec.PollingInterval = int32p(polling)
	}
	if cooldown > 0 {
		so.Spec.CooldownPeriod = int32p(cooldown)
	}
	return so
}

// pushTrigger is gpuscaler's external-push trigger with metadata.
func pushTrigger(kv ...string) kedav1alpha1.ScaleTriggers {
	return kedav1alpha1.ScaleTriggers{Type: "external-push", Metadata: scalerMetadata(kv...)}
}

// backend is a scaler with the runner that publishes to its NATS server.
type backend struct {
	name string
	g    *cluster.Gpuscaler
	s    *cluster.Scaler
}

// backends are the two ways the scaler runs: on a NATS server, and with its embedded one.
func backends() []backend {
	return []backend{
		{name: "nats-server", g: env.G, s: env.Scaler},
		{name: "embedded NATS", g: env.GEmbedded, s: env.Embedded},
	}
}

// pushTrigger is gpuscaler's external-push trigger on this backend's scaler.
func (b backend) pushTrigger(kv ...string) kedav1alpha1.ScaleTriggers {
	tr := pushTrigger(kv...)
	tr.Metadata["scalerAddress"] = b.s.GRPCAddr
	return tr
}

// pollTrigger is gpuscaler's external (polled) trigger with metadata.
func pollTrigger(kv ...string) kedav1alpha1.ScaleTriggers {
	return kedav1alpha1.ScaleTriggers{Type: "external", Metadata: scalerMetadata(kv...)}
}

func scalerMetadata(kv ...string) map[string]string {
	m := map[string]string{"scalerAddress": env.Scaler.GRPCAddr}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return m
}

// producer plays a queue producer with gpuscaler's own CLI: it publishes a QueueReport at
// once on each change, and every second as a heartbeat (silence means gone).
type producer struct {
	t         *testing.T
	g         *cluster.Gpuscaler
	ns, queue string
	// mu guards report and is held while it is published, so a heartbeat that read the
	// report before a Set cannot publish it after the Set's and replace it (the stream
	// keeps one report per producer).
	mu     sync.Mutex
	report cluster.Report
	stop   chan struct{}
	done   chan struct{}
}

func startProducer(t *testing.T, ns, queue string, r cluster.Report) *producer {
	t.Helper()
	return startProducerOn(t, env.G, ns, queue, r)
}

// startProducerOn is startProducer publishing through g (to its NATS server).
func startProducerOn(t *testing.T, g *cluster.Gpuscaler, ns, queue string, r cluster.Report) *producer {
	t.Helper()
	p := &producer{t: t, g: g, ns: ns, queue: queue, report: r, stop: make(chan struct{}), done: make(chan struct{})}
	if err := g.PublishQueue(t.Context(), ns, queue, r); err != nil {
		t.Fatal(err)
	}
	go p.heartbeat()
	t.Cleanup(p.Stop)
	return p
}

func (p *producer) heartbeat() {
	defer close(p.done)
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-p.stop:
			return
		case <-tick.C:
			p.beat()
		}
	}
}

// beat publishes the report as it is now.
func (p *producer) beat() {
	p.mu.Lock()
	defer p.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := p.g.PublishQueue(ctx, p.ns, p.queue, p.report); err != nil {
		p.t.Logf("producer heartbeat: %v", err)
	}
}

// Set publishes r at once and keeps heartbeating it.
func (p *producer) Set(r cluster.Report) {
	p.t.Helper()
	if err := p.SetErr(r); err != nil {
		p.t.Fatal(err)
	}
}

// SetErr is Set for use off the test's goroutine.
func (p *producer) SetErr(r cluster.Report) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.report = r
	return p.g.PublishQueue(p.t.Context(), p.ns, p.queue, r)
}

// Stop ends the heartbeat: the producer is gone. Calling it again does nothing.
func (p *producer) Stop() {
	select {
	case <-p.stop:
	default:
		close(p.stop)
	}
	<-p.done
}

// startCollector starts a sim collector for node and stops it when the test ends.
func startCollector(t *testing.T, node string, sim cluster.SimNode) *cluster.Collector {
	t.Helper()
	c, err := env.G.StartCollector(t.Context(), node, sim, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Stop)
	return c
}

func f64p(v float64) *float64 { return &v }

// deploymentWatch follows the Deployments of a namespace and timestamps every change of
// spec.replicas as the watch delivers it.
type deploymentWatch struct {
	w      watch.Interface
	events chan replicaEvent
}

type replicaEvent struct {
	name     string
	replicas int32
	at       time.Time
}

func watchDeployments(t *testing.T, ns string, names ...string) *deploymentWatch {
	t.Helper()
	list, err := env.Kube.AppsV1().Deployments(ns).List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	w, err := env.Kube.AppsV1().Deployments(ns).Watch(t.Context(), metav1.ListOptions{ResourceVersion: list.ResourceVersion})
	if err != nil {
		t.Fatal(err)
	}
	dw := &deploymentWatch{w: w, events: make(chan replicaEvent, 64)}
	last := map[string]int32{}
	for _, d := range list.Items {
		last[d.Name] = *d.Spec.Replicas
	}
	go func() {
		defer close(dw.events)
		for ev := range w.ResultChan() {
			d, ok := ev.Object.(*appsv1.Deployment)
			if !ok || d.Spec.Replicas == nil || (len(names) > 0 && !slices.Contains(names, d.Name)) {
				continue
			}
			at := time.Now()
			if r := *d.Spec.Replicas; r != last[d.Name] {
				last[d.Name] = r
				dw.events <- replicaEvent{name: d.Name, replicas: r, at: at}
			}
		}
	}()
	t.Cleanup(w.Stop)
	return dw
}

// discard drops the changes seen so far.
func (dw *deploymentWatch) discard() {
	for {
		select {
		case _, ok := <-dw.events:
			if !ok {
				return
			}
		default:
			return
		}
	}
}

// waitFor returns when the watch saw Deployment name reach want replicas.
func (dw *deploymentWatch) waitFor(t *testing.T, name string, want int32, timeout time.Duration) time.Time {
	t.Helper()
	deadline := time.After(timeout)
	for {
		select {
		case ev, ok := <-dw.events:
			if !ok {
				t.Fatalf("watch on Deployments ended before %s reached %d replicas", name, want)
			}
			if ev.name == name && ev.replicas == want {
				return ev.at
			}
		case <-deadline:
			t.Fatalf("Deployment %s not at %d replicas within %s", name, want, timeout)
		}
	}
}

// jobsOf lists the Jobs KEDA made for a ScaledJob.
func jobsOf(ctx context.Context, ns, scaledJob string) (int, error) {
	l, err := env.Kube.BatchV1().Jobs(ns).List(ctx, metav1.ListOptions{LabelSelector: "scaledjob.keda.sh/name=" + scaledJob})
	if err != nil {
		return 0, err
	}
	return len(l.Items), nil
}

// eventsFor returns the notes of the events about object kind/name in ns with reason.
func eventsFor(ctx context.Context, ns, kind, name, reason string) ([]string, error) {
	l, err := env.Kube.EventsV1().Events(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	var notes []string
	for _, e := range l.Items {
		if e.Regarding.Kind == kind && e.Regarding.Name == name && e.Reason == reason {
			notes = append(notes, e.Note)
		}
	}
	if len(notes) == 0 {
		// KEDA's recorder may write core/v1 events.
		cl, err := env.Kube.CoreV1().Events(ns).List(ctx, metav1.ListOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			return nil, err
		}
		if cl != nil {
			for _, e := range cl.Items {
				if e.InvolvedObject.Kind == kind && e.InvolvedObject.Name == name && e.Reason == reason {
					notes = append(notes, e.Message)
				}
			}
		}
	}
	return notes, nil
}

func splitAddr(t *testing.T, addr string) (string, string) {
	t.Helper()
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	return host, port
}
