package collectors

import (
	"context"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	metadatafake "k8s.io/client-go/metadata/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/gpuscaler/gpuscaler/internal/testkit"
)

func testNodeMeta(name string, labels map[string]string) *metav1.PartialObjectMetadata {
	return &metav1.PartialObjectMetadata{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Node"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
	}
}

func TestNodeLabels(t *testing.T) {
	client := newFakeMetadataClient(testNodeMeta("gpu-1", map[string]string{"pool": "a100"}))
	n := NewNodeLabels(client, "gpu-1", 10*time.Millisecond, nil)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	go n.Run(ctx)
	testkit.Eventually(t, 5*time.Second, func() bool { return n.Labels()["pool"] == "a100" })

	nodes := client.Resource(nodesResource).(metadatafake.MetadataClient)
	if _, err := nodes.UpdateFake(testNodeMeta("gpu-1", map[string]string{"pool": "h100"}), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 5*time.Second, func() bool { return n.Labels()["pool"] == "h100" })
}

func TestNodeLabelsForbidden(t *testing.T) {
	client := newFakeMetadataClient()
	client.PrependReactor("get", "nodes", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewForbidden(schema.GroupResource{Resource: "nodes"}, "gpu-1", nil)
	})
	log, out := testkit.BufferLogger()
	n := NewNodeLabels(client, "gpu-1", time.Millisecond, log)
	for range 5 {
		n.read(t.Context())
	}
	if n.Labels() != nil {
		t.Fatalf("labels %v without access, want none", n.Labels())
	}
	if got := testkit.CountLines(out.String(), "cannot read this node's labels"); got != 1 {
		t.Fatalf("logged the missing access %d times, want once:\n%s", got, out.String())
	}
}
