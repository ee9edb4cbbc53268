package e2e

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	autoscalingv2 "k8s.io/api/autoscaling/v2"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	kedav1alpha1 "github.com/kedacore/keda/v2/apis/keda/v1alpha1"

	"github.com/gpuscaler/gpuscaler/test/e2e/cluster"
)

// The whole loop (issue 11): workloads whose pods the real scheduler places on kwok's
// fake GPU nodes, whose GPUs a collector per node attributes, scaled by KEDA and by the
// real HPA reading gpuscaler's metrics through KEDA's metrics adapter, with the scalers
// on a NATS cluster. Each scenario has nodes of its own, a pool: the nodes carry
// poolLabel, its pods select them, and a capacity trigger counts only them.

const poolLabel = "e2e.gpuscaler.dev/pool"

// loopPolling is the ScaledObjects' pollingInterval in the loop's scenarios: the HPA
// syncs every cluster.HPASyncPeriod; activation from zero is pushed.
const loopPolling = 2 // s

// gpuPool is a scenario's fake GPU nodes and the collectors playing their kubelets.
type gpuPool struct {
	name       string
	mu         sync.Mutex
	collectors map[string]*cluster.Collector
	gpus       map[string]int
}

// newGPUPool adds a node of gpus GPUs for each count, labelled with the pool.
func newGPUPool(t *testing.T, name string, gpus ...int) *gpuPool {
	t.Helper()
	p := &gpuPool{name: name, collectors: map[string]*cluster.Collector{}, gpus: map[string]int{}}
	for _, n := range gpus {
		p.addNode(t, n)
	}
	return p
}

// addNode creates one more node in the pool, of gpus GPUs, and starts its collector,
// returning the node's name once the collector has published a report.
func (p *gpuPool) addNode(t *testing.T, gpus int) string {
	t.Helper()
	p.mu.Lock()
	name := fmt.Sprintf("%s-%d", p.name, len(p.collectors))
	p.mu.Unlock()
	if err := env.Kwok.AddNode(t.Context(), cluster.GPUNode{Name: name, GPUs: gpus, Labels: map[string]string{poolLabel: p.name}}); err != nil {
		t.Fatal(err)
	}
	c, err := env.GCluster.StartClusterCollector(t.Context(), name, env.CP.Kubeconfig, cluster.SimNode{GPUs: gpus, Jitter: 0}, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Stop)
	p.mu.Lock()
	p.collectors[name] = c
	p.gpus[name] = gpus
	p.mu.Unlock()
	return name
}

// setUtil sets the utilisation of every Ready pod's GPUs on the pool's nodes.
func (p *gpuPool) setUtil(ctx context.Context, util float64) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	for name, c := range p.collectors {
		if err := c.SetSim(ctx, cluster.SimNode{GPUs: p.gpus[name], Util: util, Jitter: 0}); err != nil {
			return err
		}
	}
	return nil
}

// gpuTemplate is a pod of the pool asking for gpus nvidia.com/gpu, Ready modelLoad after
// it runs. It tolerates the fake nodes' taint; deleted, it goes when kwok, its kubelet,
// finishes it (at once).
func gpuTemplate(pool string, labels map[string]string, gpus int, modelLoad time.Duration) corev1.PodTemplateSpec {
	annotations := map[string]string{cluster.ModelLoadAnnotation: modelLoad.String()}
	limits := corev1.ResourceList{"nvidia.com/gpu": *resource.NewQuantity(int64(gpus), resource.DecimalSI)}
	return corev1.PodTemplateSpec{
		ObjectMeta: metav1.ObjectMeta{Labels: labels, Annotations: annotations},
		Spec: corev1.PodSpec{
			NodeSelector: map[string]string{poolLabel: pool},
			Tolerations:  []corev1.Toleration{cluster.Toleration},
			Containers: []corev1.Container{{Name: "server", Image: "registry.invalid/gpuscaler-e2e-model-server:none",
				Resources: corev1.ResourceRequirements{Limits: limits}}},
		},
	}
}

// createGPUDeployment creates a Deployment of gpuTemplate pods, labelled app=name.
func createGPUDeployment(t *testing.T, ns, name, pool string, replicas int32, gpus int, modelLoad time.Duration) {
	t.Helper()
	createDeploymentOf(t, ns, name, replicas, func(labels map[string]string) corev1.PodTemplateSpec {
		return gpuTemplate(pool, labels, gpus, modelLoad)
	})
}

// loopTrigger is gpuscaler's trigger on the scaler replicas behind the headless Service.
func loopTrigger(typ string, kv ...string) kedav1alpha1.ScaleTriggers {
	tr := kedav1alpha1.ScaleTriggers{Type: typ, Metadata: map[string]string{"scalerAddress": env.Scalers.Address()}}
	for i := 0; i+1 < len(kv); i += 2 {
		tr.Metadata[kv[i]] = kv[i+1]
	}
	return tr
}

// fastScaleDown is an HPA behaviour that scales down within seconds (its default waits
// 300 s for the highest of its recommendations to pass) and up by as many pods as asked.
func fastScaleDown(so *kedav1alpha1.ScaledObject) *kedav1alpha1.ScaledObject {
	window := int32(3)
	so.Spec.Advanced = &kedav1alpha1.AdvancedConfig{HorizontalPodAutoscalerConfig: &kedav1alpha1.HorizontalPodAutoscalerConfig{
		Behavior: &autoscalingv2.HorizontalPodAutoscalerBehavior{
			ScaleDown: &autoscalingv2.HPAScalingRules{StabilizationWindowSeconds: &window,
				Policies: []autoscalingv2.HPAScalingPolicy{{Type: autoscalingv2.PercentScalingPolicy, Value: 100, PeriodSeconds: 1}}},
		},
	}}
	return so
}

// hpaMetric returns the current value the HPA shows for its external metric (the
// per-pod average of an AverageValue target) and its ScalingActive condition.
func hpaMetric(ctx context.Context, ns, hpaName, metric string) (float64, string, error) {
	hpa, err := env.Kube.AutoscalingV2().HorizontalPodAutoscalers(ns).Get(ctx, hpaName, metav1.GetOptions{})
	if err != nil {
		return 0, "", err
	}
	var conds []string
	for _, c := range hpa.Status.Conditions {
		conds = append(conds, fmt.Sprintf("%s=%s(%s)", c.Type, c.Status, c.Reason))
	}
	for _, m := range hpa.Status.CurrentMetrics {
		if m.External != nil && m.External.Metric.Name == metric && m.External.Current.AverageValue != nil {
			return m.External.Current.AverageValue.AsApproximateFloat64(), strings.Join(conds, " "), nil
		}
	}
	return 0, strings.Join(conds, " "), fmt.Errorf("HPA %s shows no current value of %s (conditions %s)", hpaName, metric, strings.Join(conds, " "))
}

// podWatch follows a namespace's pods: when each first became Ready, and every pod the
// scheduler left Pending, with the scheduler's reason.
type podWatch struct {
	mu          sync.Mutex
	firstReady  map[string]time.Time
	unscheduled map[string]string // pod → the scheduler's message
	nodes       map[string]string // pod → node
	w           watch.Interface
}

func watchPods(t *testing.T, ns string) *podWatch {
	t.Helper()
	w, err := env.Kube.CoreV1().Pods(ns).Watch(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pw := &podWatch{firstReady: map[string]time.Time{}, unscheduled: map[string]string{}, nodes: map[string]string{}, w: w}
	go func() {
		for ev := range w.ResultChan() {
			pod, ok := ev.Object.(*corev1.Pod)
			if !ok {
				continue
			}
			at := time.Now()
			pw.mu.Lock()
			if pod.Spec.NodeName != "" {
				pw.nodes[pod.Name] = pod.Spec.NodeName
			}
			for _, c := range pod.Status.Conditions {
				switch {
				case c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue:
					if _, seen := pw.firstReady[pod.Name]; !seen {
						pw.firstReady[pod.Name] = at
					}
				case c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable:
					pw.unscheduled[pod.Name] = c.Message
				}
			}
			pw.mu.Unlock()
		}
	}()
	t.Cleanup(w.Stop)
	return pw
}

// earliestReady is when the first pod became Ready (zero: none yet).
func (pw *podWatch) earliestReady() time.Time {
	pw.mu.Lock()
	defer pw.mu.Unlock()
	var first time.Time
	for _, at := range pw.firstReady {
		if first.IsZero() || at.Before(first) {
			first = at
		}
	}
	return first
}

// pending returns the pods the scheduler ever left Pending for lack of GPUs, sorted.
func (pw *podWatch) pending(prefix string) []string {
	pw.mu.Lock()
	defer pw.mu.Unlock()
	var out []string
	for pod, msg := range pw.unscheduled {
		if strings.HasPrefix(pod, prefix) && strings.Contains(msg, "nvidia.com/gpu") {
			out = append(out, pod)
		}
	}
	sort.Strings(out)
	return out
}

// pendingNow counts the pods of the namespace whose names start with prefix that are
// Pending now because no node has the GPUs they ask for.
func pendingNow(ctx context.Context, ns, prefix string) (int, error) {
	pods, err := env.Kube.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return 0, err
	}
	n := 0
	for _, p := range pods.Items {
		if !strings.HasPrefix(p.Name, prefix) || p.Spec.NodeName != "" {
			continue
		}
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && strings.Contains(c.Message, "nvidia.com/gpu") {
				n++
			}
		}
	}
	return n, nil
}

// readyPods counts the pods of ns with label selector selector that are Ready, and lists
// the nodes they run on.
func readyPods(ctx context.Context, ns, selector string) (int, []string, error) {
	pods, err := env.Kube.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		return 0, nil, err
	}
	n := 0
	var nodes []string
	for _, p := range pods.Items {
		if p.DeletionTimestamp != nil {
			continue
		}
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
				n++
				if !slices.Contains(nodes, p.Spec.NodeName) {
					nodes = append(nodes, p.Spec.NodeName)
				}
			}
		}
	}
	return n, nodes, nil
}

// createGPUScaledJob creates a ScaledJob whose Jobs run one gpuTemplate pod of gpus GPUs
// each, running until the test ends (kwok completes a Job's pod after
// pod-complete.stage.kwok.x-k8s.io/delay).
func createGPUScaledJob(t *testing.T, ns, name, pool string, gpus int, trigger kedav1alpha1.ScaleTriggers) {
	t.Helper()
	tmpl := gpuTemplate(pool, map[string]string{"scaledjob": name}, gpus, time.Second)
	tmpl.Annotations["pod-complete.stage.kwok.x-k8s.io/delay"] = "1h"
	tmpl.Annotations["pod-complete.stage.kwok.x-k8s.io/jitter-delay"] = "1h"
	tmpl.Spec.RestartPolicy = corev1.RestartPolicyNever
	sj := &kedav1alpha1.ScaledJob{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: kedav1alpha1.ScaledJobSpec{
			JobTargetRef:    &batchv1.JobSpec{Template: tmpl},
			PollingInterval: int32p(loopPolling),
			MaxReplicaCount: int32p(10),
			ScalingStrategy: kedav1alpha1.ScalingStrategy{Strategy: "default"},
			Triggers:        []kedav1alpha1.ScaleTriggers{trigger},
		},
	}
	if _, err := env.KEDACli.KedaV1alpha1().ScaledJobs(ns).Create(t.Context(), sj, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create ScaledJob %s/%s: %v", ns, name, err)
	}
}

// workQueue plays a queue and the workers that take its items: items wait until a Job's
// pod is Ready (its model loaded), which then holds one in flight, as a worker that
// starts pulls its first item. The producer reports the split.
type workQueue struct {
	p     *producer
	stop  chan struct{}
	done  chan struct{}
	items uint64
}

func startWorkQueue(t *testing.T, ns, queue, scaledJob string, items uint64) *workQueue {
	t.Helper()
	q := &workQueue{p: startProducerOn(t, env.GCluster, ns, queue, cluster.Report{Waiting: items, Arrivals: items}),
		stop: make(chan struct{}), done: make(chan struct{}), items: items}
	go func() {
		defer close(q.done)
		last := uint64(0)
		for {
			select {
			case <-q.stop:
				return
			case <-time.After(200 * time.Millisecond):
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			n, _, err := readyPods(ctx, ns, "scaledjob="+scaledJob)
			cancel()
			if err != nil {
				continue
			}
			taken := min(uint64(n), q.items)
			if taken != last {
				if err := q.p.SetErr(cluster.Report{Waiting: q.items - taken, InFlight: taken}); err == nil {
					last = taken
				}
			}
		}
	}()
	t.Cleanup(func() {
		close(q.stop)
		<-q.done
	})
	return q
}
