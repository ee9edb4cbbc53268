package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpuscaler/gpuscaler/test/e2e/cluster"

	"github.com/gpuscaler/gpuscaler/test/testkit"
)

// kwokTolerated is the tolerations of a capacityAware trigger whose Jobs run on the fake
// nodes: their pods tolerate the kwok taint (gpuTemplate), and capacity counts a tainted
// node only for Jobs that tolerate its taints.
var kwokTolerated = cluster.KwokTaintKey + "=fake:NoSchedule"

// (3b) A node the scheduler will not use is not capacity. Free GPUs are allocatable less
// allocated whatever the node's state: before, a drained 8-GPU node made 8 Jobs that
// stayed Pending. kubectl drain cordons the node (spec.unschedulable, k8s.io/kubectl
// pkg/drain/cordon.go), and the scheduler's NodeUnschedulable filter then places no pod
// there; the cluster autoscaler taints a node it removes ToBeDeletedByClusterAutoscaler,
// NoSchedule, which the TaintToleration filter keeps pods off. The collector watches its
// Node and reports both; the pool's 8 free GPUs leave capacity while either holds, and a
// capacityAware ScaledJob creates no Job, poll after poll; uncordoned, 8 Jobs, all Ready.
func TestLoopDrainedNodeLeavesCapacity(t *testing.T) {
	t.Parallel()
	ns := newNamespace(t, "loop-drain")
	pool := newGPUPool(t, "d-"+ns, 8)
	node := pool.name + "-0"
	pw := watchPods(t, ns)
	trigger := loopTrigger("external", "queue", "train", "capacityAware", "true", "gpusPerReplica", "1",
		"nodeSelector", poolLabel+"="+pool.name, "tolerations", kwokTolerated)
	startWorkQueue(t, ns, "train", "drain", 10)
	// The scaler counts the node's 8 free GPUs.
	testkit.Eventually(t, 60*time.Second, backlogOn(ns, "drain", trigger.Metadata, 8))

	kwokTaint := fmt.Sprintf(`{"key":%q,"value":"fake","effect":"NoSchedule"}`, cluster.KwokTaintKey)
	t.Log("the cluster autoscaler taints the node it removes")
	patchNode(t, node, `{"spec":{"taints":[`+kwokTaint+`,{"key":"ToBeDeletedByClusterAutoscaler","value":"1732700000","effect":"NoSchedule"}]}}`)
	// A node being removed counts no GPU.
	testkit.Eventually(t, 60*time.Second, backlogOn(ns, "drain", trigger.Metadata, 0))
	patchNode(t, node, `{"spec":{"taints":[`+kwokTaint+`]}}`)
	// The taint gone, 8 GPUs again.
	testkit.Eventually(t, 60*time.Second, backlogOn(ns, "drain", trigger.Metadata, 8))

	t.Log("the node is drained: cordoned, its GPUs free")
	patchNode(t, node, `{"spec":{"unschedulable":true}}`)
	// A cordoned node counts no GPU.
	testkit.Eventually(t, 60*time.Second, backlogOn(ns, "drain", trigger.Metadata, 0))
	createGPUScaledJob(t, ns, "drain", pool.name, 1, trigger)
	consistently(t, 5*loopPolling*time.Second, "no Job for GPUs on a cordoned node", jobsAtMost(ns, "drain", 0))

	t.Log("the node is uncordoned")
	patchNode(t, node, `{"spec":{"unschedulable":false}}`)
	// 8 Jobs for the 8 GPUs.
	testkit.Eventually(t, 60*time.Second, jobsAre(ns, "drain", 8))
	// All 8 Jobs Ready.
	testkit.Eventually(t, 60*time.Second, func(ctx context.Context) error {
		n, _, err := readyPods(ctx, ns, "scaledjob=drain")
		return testkit.Check(err == nil && n == 8, "%d Ready (%v)", n, err)
	})
	if p := pw.pending("drain-"); len(p) > 0 {
		t.Errorf("Jobs left Pending: %v", p)
	}
}

// patchNode applies a JSON merge patch to the node: a patch, not an update, as kwok's
// heartbeats change the Node all the time.
func patchNode(t *testing.T, node, patch string) {
	t.Helper()
	if _, err := env.Kube.CoreV1().Nodes().Patch(t.Context(), node, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatalf("patch node %s with %s: %v", node, patch, err)
	}
}
