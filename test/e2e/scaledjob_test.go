package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	kedav1alpha1 "github.com/kedacore/keda/v2/apis/keda/v1alpha1"

	"github.com/gpuscaler/gpuscaler/test/e2e/cluster"

	"github.com/gpuscaler/gpuscaler/test/testkit"
)

// (e) A capacity-aware ScaledJob creates no more Jobs than free GPUs can place. Ten items
// wait, two nodes report 3 and 0 free GPUs: KEDA creates 3 Jobs and no more, poll after
// poll. Beside it, the same ScaledJob without capacityAware creates all 10, which is what
// the cap is for. When 2 more GPUs free up, 2 more Jobs follow.
func TestCapacityAwareScaledJob(t *testing.T) {
	ns := newNamespace(t, "capacity")
	node := func(gpus int, held ...string) cluster.SimNode {
		n := cluster.SimNode{GPUs: gpus, Jitter: 0}
		for i, g := range held {
			n.Pods = append(n.Pods, cluster.SimPod{Namespace: "other", Name: fmt.Sprintf("busy-%d", i), GPUs: []string{g}, Util: f64p(90)})
		}
		return n
	}
	startCollector(t, "cap-a-"+ns, node(4, "0"))              // 3 free
	colB := startCollector(t, "cap-b-"+ns, node(2, "0", "1")) // 0 free
	startProducer(t, ns, "train", cluster.Report{Waiting: 10, Arrivals: 10})

	// Capacity counts the free GPUs of every node that reported within staleAfter, and
	// earlier tests' nodes report no more: wait until their last reports have aged out
	// and the scaler counts only this test's nodes.
	capped := pollTrigger("queue", "train", "capacityAware", "true", "gpusPerReplica", "1", "staleAfter", "3s")
	// The scaler caps the backlog at 3.
	testkit.Eventually(t, 30*time.Second, backlogIs(ns, "train-capped", capped.Metadata, 3))
	createScaledJob(t, ns, "train-capped", capped)
	createScaledJob(t, ns, "train-uncapped", pollTrigger("queue", "train"))

	// Uncapped ScaledJob creates 10 Jobs.

	testkit.Eventually(t, 30*time.Second, jobsAre(ns, "train-uncapped", 10))
	// Capped ScaledJob creates 3 Jobs.
	testkit.Eventually(t, 30*time.Second, jobsAre(ns, "train-capped", 3))
	// KEDA polls every second: five polls that create nothing more.
	consistently(t, 5*time.Second, "no more than 3 Jobs for 3 free GPUs", jobsAtMost(ns, "train-capped", 3))

	t.Log("2 GPUs free up on the second node")
	if err := colB.SetSim(t.Context(), node(2)); err != nil {
		t.Fatal(err)
	}
	// The scaler caps the backlog at 5.
	testkit.Eventually(t, 30*time.Second, backlogIs(ns, "train-capped", capped.Metadata, 5))
	// Capped ScaledJob creates 2 more Jobs.
	testkit.Eventually(t, 30*time.Second, jobsAre(ns, "train-capped", 5))
	consistently(t, 5*time.Second, "no more than 5 Jobs for 5 free GPUs", jobsAtMost(ns, "train-capped", 5))
}

func createScaledJob(t *testing.T, ns, name string, trigger kedav1alpha1.ScaleTriggers) {
	t.Helper()
	sj := &kedav1alpha1.ScaledJob{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: kedav1alpha1.ScaledJobSpec{
			JobTargetRef: &batchv1.JobSpec{
				Template: corev1.PodTemplateSpec{
					Spec: corev1.PodSpec{
						RestartPolicy: corev1.RestartPolicyNever,
						Containers:    []corev1.Container{{Name: "train", Image: "registry.invalid/gpuscaler-e2e-train:none"}},
					},
				},
			},
			PollingInterval: int32p(testPolling),
			MaxReplicaCount: int32p(10),
			ScalingStrategy: kedav1alpha1.ScalingStrategy{Strategy: "default"},
			Triggers:        []kedav1alpha1.ScaleTriggers{trigger},
		},
	}
	if _, err := env.KEDACli.KedaV1alpha1().ScaledJobs(ns).Create(t.Context(), sj, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create ScaledJob %s/%s: %v", ns, name, err)
	}
}

func jobsAre(ns, sj string, want int) func(ctx context.Context) error {
	return func(ctx context.Context) error {
		n, err := jobsOf(ctx, ns, sj)
		if err != nil {
			return err
		}
		if n > want {
			return fmt.Errorf("%d Jobs, more than %d", n, want)
		}
		return testkit.Check(n == want, "%d Jobs", n)
	}
}

func jobsAtMost(ns, sj string, limit int) func(ctx context.Context) error {
	return func(ctx context.Context) error {
		n, err := jobsOf(ctx, ns, sj)
		if err != nil {
			return err
		}
		return testkit.Check(n <= limit, "%d Jobs", n)
	}
}

// backlogIs polls gpuscaler's queue-backlog for a trigger, as KEDA would read it.
func backlogIs(ns, name string, meta map[string]string, want float64) func(ctx context.Context) error {
	return func(ctx context.Context) error {
		v, err := env.Scaler.Metric(ctx, ns, name, meta, "queue-backlog")
		if err != nil {
			return err
		}
		return testkit.Check(v == want, "queue-backlog %g", v)
	}
}
