package e2e

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	kedav1alpha1 "github.com/kedacore/keda/v2/apis/keda/v1alpha1"

	"github.com/gpuscaler/gpuscaler/test/e2e/cluster"
)

// TestSparseTrafficStatusWrites counts the writes to a ScaledObject that sparse traffic
// causes: a request every 2 s for a minute, each served at once, so the queue goes from
// empty to non-empty 30 times. KEDA answers every pushed true with RequestScale and a
// status patch, lastActiveTime changing each time (startPushScalers and handleResult in
// pkg/scaling/scale_handler.go, KEDA v2.21.0). Two ScaledObjects on the same scaler get
// the same traffic at once: one with pushInterval 0s, which pushes every activation as
// the scaler did before pushInterval, and one with the default (30s). Both use KEDA's
// default pollingInterval (30 s) and cooldownPeriod (300 s). A watch on each counts its
// resourceVersion changes.
func TestSparseTrafficStatusWrites(t *testing.T) {
	t.Parallel() // no latency measured: see "Tests in parallel" in main_test.go
	const (
		requests = 30
		every    = 2 * time.Second
		// The default pushes at the first request and once more a pushInterval later;
		// KEDA's polls may flip the Active condition back after each. Pushing every
		// activation writes about once per request.
		maxWrites = 8
	)
	ns := newNamespace(t, "writes")
	names := []string{"every", "spaced"}
	meta := map[string][]string{
		"every":  {"queue", "every", "pushInterval", "0s"},
		"spaced": {"queue", "spaced"},
	}
	producers := map[string]*producer{}
	for _, name := range names {
		createDeployment(t, ns, name, 0)
		producers[name] = startProducer(t, ns, name, cluster.Report{})
		createScaledObject(t, scaledObject(ns, name, name, 0, 4, 0, 0, pushTrigger(meta[name]...)))
	}
	// KEDA's first poll of each sets its conditions: count from after that.
	for _, name := range names {
		waitCondition(t, ns, name, kedav1alpha1.ConditionActive, metav1.ConditionFalse, "", 60*time.Second)
	}

	list, err := env.KEDACli.KedaV1alpha1().ScaledObjects(ns).List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	w, err := env.KEDACli.KedaV1alpha1().ScaledObjects(ns).Watch(t.Context(), metav1.ListOptions{ResourceVersion: list.ResourceVersion})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	writes := make(chan map[string]int, 1)
	go func() {
		n := map[string]int{}
		for ev := range w.ResultChan() {
			if so, ok := ev.Object.(*kedav1alpha1.ScaledObject); ok && ev.Type == watch.Modified {
				n[so.Name]++
			}
		}
		writes <- n
	}()

	dw := watchDeployments(t, ns, names...)
	tick := time.NewTicker(every)
	defer tick.Stop()
	for i := range requests {
		for _, name := range names {
			producers[name].Set(cluster.Report{Waiting: 1, Arrivals: 1})
		}
		// Each request is seen before it is served: the stream keeps one report per
		// producer, and one replaced unread is an activation that never happened.
		for _, name := range names {
			waitActivity(t, ns, name, scalerMetadata(meta[name]...), true)
			producers[name].Set(cluster.Report{})
		}
		if i == 0 {
			// The first request finds both at 0 replicas, and is pushed for both.
			for _, name := range names {
				dw.waitFor(t, name, 1, 30*time.Second)
			}
		}
		// The window ends one period after the last request, as it began with the first.
		<-tick.C
	}
	w.Stop()
	n := <-writes

	t.Logf("ScaledObject status writes during %d requests %s apart: %d with pushInterval 0s (every activation pushed), %d with the default pushInterval 30s",
		requests, every, n["every"], n["spaced"])
	if n["spaced"] > maxWrites {
		t.Errorf("default pushInterval: %d writes to the ScaledObject in a minute of sparse traffic, want at most %d", n["spaced"], maxWrites)
	}
	if n["every"] <= maxWrites {
		t.Errorf("pushInterval 0s: %d writes, want more than %d: the measurement cannot tell pushing every activation from spacing them", n["every"], maxWrites)
	}
}
