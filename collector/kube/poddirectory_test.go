package kube

import (
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/metadata"
	metadatafake "k8s.io/client-go/metadata/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/gpuscaler/gpuscaler/collector/attribution"
	"github.com/gpuscaler/gpuscaler/test/testkit"
)

const thisNode = "gpu-node-1"

// nodeAnnotation carries a test pod's node. A pod's metadata has no spec.nodeName,
// which the fake needs to honour the directory's field selector; the directory itself
// never reads annotations, and keeps none.
const nodeAnnotation = "test.gpuscaler.io/node-name"

func controllerRef(apiVersion, kind, name string, uid types.UID) metav1.OwnerReference {
	return metav1.OwnerReference{APIVersion: apiVersion, Kind: kind, Name: name, UID: uid, Controller: new(true)}
}

// testObject returns the metadata of an object of kind, as the API server sends it to
// the metadata client.
func testObject(apiVersion, kind, namespace, name string, uid types.UID, owners ...metav1.OwnerReference) *metav1.PartialObjectMetadata {
	return &metav1.PartialObjectMetadata{
		TypeMeta: metav1.TypeMeta{APIVersion: apiVersion, Kind: kind},
		ObjectMeta: metav1.ObjectMeta{
			Namespace: namespace, Name: name, UID: uid, OwnerReferences: owners,
			ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kube-controller-manager", Operation: metav1.ManagedFieldsOperationUpdate}},
		},
	}
}

func testPod(namespace, name, node string, labels map[string]string, owners ...metav1.OwnerReference) *metav1.PartialObjectMetadata {
	pod := testObject("v1", "Pod", namespace, name, types.UID("uid-"+name), owners...)
	pod.Labels = labels
	pod.Annotations = map[string]string{nodeAnnotation: node}
	return pod
}

func testReplicaSet(namespace, name string, uid types.UID, owners ...metav1.OwnerReference) *metav1.PartialObjectMetadata {
	return testObject("apps/v1", "ReplicaSet", namespace, name, uid, owners...)
}

func testJob(namespace, name string, uid types.UID, owners ...metav1.OwnerReference) *metav1.PartialObjectMetadata {
	return testObject("batch/v1", "Job", namespace, name, uid, owners...)
}

var (
	webRS     = controllerRef("apps/v1", "ReplicaSet", "web-7d9f", "uid-rs-web")
	nightlyJb = controllerRef("batch/v1", "Job", "nightly-28999", "uid-job-nightly")
)

// testCluster holds, besides pods, the ReplicaSets and Jobs that own them:
// web-7d9f of Deployment web, orphan-rs of nobody, nightly-28999 of CronJob nightly,
// once of nobody.
func testCluster() []runtime.Object {
	return []runtime.Object{
		testReplicaSet("ml", "web-7d9f", "uid-rs-web", controllerRef("apps/v1", "Deployment", "web", "uid-deploy-web")),
		testReplicaSet("ml", "orphan-rs", "uid-rs-orphan"),
		testReplicaSet("ml", "replaced", "uid-rs-new"),
		testJob("ml", "nightly-28999", "uid-job-nightly", controllerRef("batch/v1", "CronJob", "nightly", "uid-cron")),
		testJob("ml", "once", "uid-job-once"),
	}
}

// newFakeMetadataClient returns client-go's fake metadata client holding objs, made to
// honour field selectors on pods as the API server does. The fake ignores field
// selectors (its List filters by labels only, its Watch by nothing), so without this
// every pod of the cluster would reach the informer.
func newFakeMetadataClient(objs ...runtime.Object) *metadatafake.FakeMetadataClient {
	scheme := metadatafake.NewTestScheme()
	if err := metav1.AddMetaToScheme(scheme); err != nil {
		panic(err)
	}
	c := metadatafake.NewSimpleMetadataClient(scheme, objs...)
	podFields := func(obj runtime.Object) fields.Set {
		p, ok := obj.(*metav1.PartialObjectMetadata)
		if !ok {
			return nil
		}
		return fields.Set{"metadata.namespace": p.Namespace, "metadata.name": p.Name, "spec.nodeName": p.Annotations[nodeAnnotation]}
	}
	tracked := k8stesting.ObjectReaction(c.Tracker())
	c.PrependReactor("list", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		_, obj, err := tracked(a)
		if err != nil {
			return true, nil, err
		}
		list := obj.(*metav1.List)
		sel := a.(k8stesting.ListActionImpl).GetListRestrictions().Fields
		list.Items = slices.DeleteFunc(list.Items, func(item runtime.RawExtension) bool { return !sel.Matches(podFields(item.Object)) })
		return true, list, nil
	})
	c.PrependWatchReactor("pods", func(a k8stesting.Action) (bool, watch.Interface, error) {
		wa := a.(k8stesting.WatchActionImpl)
		w, err := c.Tracker().Watch(PodsResource, a.GetNamespace(), wa.GetListOptions())
		if err != nil {
			return true, nil, err
		}
		sel := wa.GetWatchRestrictions().Fields
		return true, watch.Filter(w, func(e watch.Event) (watch.Event, bool) {
			_, ok := e.Object.(*metav1.PartialObjectMetadata)
			return e, !ok || sel.Matches(podFields(e.Object))
		}), nil
	})
	return c
}

// podsIn returns the fake's pods of namespace, with the fake's create and update.
func podsIn(c *metadatafake.FakeMetadataClient, namespace string) metadatafake.MetadataClient {
	return c.Resource(PodsResource).Namespace(namespace).(metadatafake.MetadataClient)
}

// runDirectory runs a PodDirectory for thisNode until the test ends, and checks that
// Run then returns nil.
func runDirectory(t *testing.T, d *PodDirectory) {
	t.Helper()
	testkit.Start(t, "pod directory", 0, nil, d.Run)
}

// countActions counts the client's calls with verb on resource.
func countActions(cs *metadatafake.FakeMetadataClient, verb, resource string) int {
	n := 0
	for _, a := range cs.Actions() {
		if a.GetVerb() == verb && a.GetResource().Resource == resource {
			n++
		}
	}
	return n
}

// logLines returns the lines logged into buf.
func logLines(buf *testkit.SyncBuffer) []string {
	s := strings.TrimSpace(buf.String())
	if s == "" {
		return nil
	}
	return strings.Split(s, "\n")
}

func TestPodDirectoryPods(t *testing.T) {
	objs := append(testCluster(),
		testPod("ml", "web-7d9f-abcde", thisNode, map[string]string{"app": "web", "pod-template-hash": "7d9f"}, webRS),
		testPod("ml", "web-7d9f-fghij", thisNode, map[string]string{"app": "web", "pod-template-hash": "7d9f"}, webRS),
		testPod("ml", "db-0", thisNode, map[string]string{"app": "db"}, controllerRef("apps/v1", "StatefulSet", "db", "uid-sts")),
		testPod("ml", "nightly-28999-x7k2p", thisNode, nil, nightlyJb),
		testPod("ml", "once-q8r4t", thisNode, nil, controllerRef("batch/v1", "Job", "once", "uid-job-once")),
		testPod("ml", "orphan-rs-1", thisNode, nil, controllerRef("apps/v1", "ReplicaSet", "orphan-rs", "uid-rs-orphan")),
		testPod("ml", "gone-rs-1", thisNode, nil, controllerRef("apps/v1", "ReplicaSet", "gone-rs", "uid-rs-gone")),
		testPod("ml", "replaced-1", thisNode, nil, controllerRef("apps/v1", "ReplicaSet", "replaced", "uid-rs-old")),
		testPod("ml", "bare", thisNode, map[string]string{"team": "a"}),
		testPod("ml", "not-controller", thisNode, nil, metav1.OwnerReference{APIVersion: "v1", Kind: "ConfigMap", Name: "cm", UID: "uid-cm"}),
		testPod("ml", "elsewhere", "gpu-node-2", map[string]string{"app": "web"}, webRS),
		testPod("ml", "pending", "", map[string]string{"app": "web"}, webRS),
	)
	cs := newFakeMetadataClient(objs...)
	d := NewPodDirectory(cs, thisNode, testkit.Logger(t))
	if d.Synced() {
		t.Errorf("Synced before Run: got true, want false")
	}
	runDirectory(t, d)
	testkit.Eventually(t, 5*time.Second, d.Synced)

	tests := map[string]struct {
		namespace, name string
		want            attribution.PodInfo
		wantOK          bool
	}{
		"Deployment via ReplicaSet": {"ml", "web-7d9f-abcde", attribution.PodInfo{
			UID: "uid-web-7d9f-abcde", Labels: map[string]string{"app": "web", "pod-template-hash": "7d9f"},
			OwnerKind: "Deployment", OwnerName: "web",
		}, true},
		"StatefulSet": {"ml", "db-0", attribution.PodInfo{
			UID: "uid-db-0", Labels: map[string]string{"app": "db"}, OwnerKind: "StatefulSet", OwnerName: "db",
		}, true},
		"CronJob via Job": {"ml", "nightly-28999-x7k2p", attribution.PodInfo{
			UID: "uid-nightly-28999-x7k2p", OwnerKind: "CronJob", OwnerName: "nightly",
		}, true},
		"Job of its own": {"ml", "once-q8r4t", attribution.PodInfo{
			UID: "uid-once-q8r4t", OwnerKind: "Job", OwnerName: "once",
		}, true},
		"ReplicaSet of its own": {"ml", "orphan-rs-1", attribution.PodInfo{
			UID: "uid-orphan-rs-1", OwnerKind: "ReplicaSet", OwnerName: "orphan-rs",
		}, true},
		"ReplicaSet gone": {"ml", "gone-rs-1", attribution.PodInfo{
			UID: "uid-gone-rs-1", OwnerKind: "ReplicaSet", OwnerName: "gone-rs",
		}, true},
		"ReplicaSet replaced by another of the same name": {"ml", "replaced-1", attribution.PodInfo{
			UID: "uid-replaced-1", OwnerKind: "ReplicaSet", OwnerName: "replaced",
		}, true},
		"bare pod":                       {"ml", "bare", attribution.PodInfo{UID: "uid-bare", Labels: map[string]string{"team": "a"}}, true},
		"owner that is not a controller": {"ml", "not-controller", attribution.PodInfo{UID: "uid-not-controller"}, true},
		"pod on another node":            {"ml", "elsewhere", attribution.PodInfo{}, false},
		"pod not scheduled yet":          {"ml", "pending", attribution.PodInfo{}, false},
		"no such pod":                    {"ml", "nope", attribution.PodInfo{}, false},
		"other namespace":                {"default", "bare", attribution.PodInfo{}, false},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			got, ok := d.Pod(tt.namespace, tt.name)
			if ok != tt.wantOK || !equalPodInfo(got, tt.want) {
				t.Errorf("Pod(%s, %s): got %+v, %t; want %+v, %t", tt.namespace, tt.name, got, ok, tt.want, tt.wantOK)
			}
		})
	}

	t.Run("asks only for this node's pods", func(t *testing.T) {
		want := "spec.nodeName=" + thisNode
		n := 0
		for _, a := range cs.Actions() {
			var sel fields.Selector
			switch a := a.(type) {
			case k8stesting.ListActionImpl:
				sel = a.GetListRestrictions().Fields
			case k8stesting.WatchActionImpl:
				sel = a.GetWatchRestrictions().Fields
			default:
				continue
			}
			if a.GetResource() != PodsResource {
				continue
			}
			n++
			if got := sel.String(); got != want || a.GetNamespace() != "" {
				t.Errorf("%s pods in namespace %q: got field selector %q, want %q in all namespaces", a.GetVerb(), a.GetNamespace(), got, want)
			}
		}
		if n < 2 {
			t.Errorf("pod lists and watches: got %d, want at least a list and a watch", n)
		}
	})

	t.Run("one lookup per ReplicaSet or Job, not per pod", func(t *testing.T) {
		// web-7d9f (two pods here), orphan-rs, gone-rs, replaced; nightly-28999, once.
		if got := countActions(cs, "get", "replicasets"); got != 4 {
			t.Errorf("ReplicaSet gets: got %d, want 4", got)
		}
		if got := countActions(cs, "get", "jobs"); got != 2 {
			t.Errorf("Job gets: got %d, want 2", got)
		}
	})

	t.Run("the cache keeps only what Pod reads", func(t *testing.T) {
		obj, ok, err := d.informer.GetIndexer().GetByKey("ml/web-7d9f-abcde")
		if err != nil || !ok {
			t.Fatalf("cached pod: got %v, %t, want it", err, ok)
		}
		pod := obj.(*metav1.PartialObjectMetadata)
		if pod.Annotations != nil || pod.ManagedFields != nil {
			t.Errorf("cached pod: got annotations %v and managed fields %v, want neither", pod.Annotations, pod.ManagedFields)
		}
	})

	t.Run("labels are the caller's", func(t *testing.T) {
		got, _ := d.Pod("ml", "bare")
		got.Labels["team"] = "b"
		if again, _ := d.Pod("ml", "bare"); again.Labels["team"] != "a" {
			t.Errorf("after changing a returned label: got team=%s, want a", again.Labels["team"])
		}
	})
}

func equalPodInfo(a, b attribution.PodInfo) bool {
	return a.UID == b.UID && a.OwnerKind == b.OwnerKind && a.OwnerName == b.OwnerName && maps.Equal(a.Labels, b.Labels)
}

func TestPodDirectoryFollowsChanges(t *testing.T) {
	cs := newFakeMetadataClient(testCluster()...)
	d := NewPodDirectory(cs, thisNode, testkit.Logger(t))
	runDirectory(t, d)
	testkit.Eventually(t, 5*time.Second, d.Synced)
	pods := podsIn(cs, "ml")
	ctx := t.Context()

	// The pod on the other node is created first: once a later pod of this node is
	// known, the watch has passed it by.
	if _, err := pods.CreateFake(testPod("ml", "elsewhere", "gpu-node-2", nil), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod := testPod("ml", "web-7d9f-abcde", thisNode, map[string]string{"app": "web"}, webRS)
	if _, err := pods.CreateFake(pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 5*time.Second, func() bool {
		info, ok := d.Pod("ml", "web-7d9f-abcde")
		return ok && info.OwnerKind == "Deployment" && info.OwnerName == "web"
	})
	if info, ok := d.Pod("ml", "elsewhere"); ok {
		t.Errorf("pod on another node: got %+v, want unknown", info)
	}

	pod.Labels = map[string]string{"app": "web", "track": "canary"}
	if _, err := pods.UpdateFake(pod, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 5*time.Second, func() bool {
		info, _ := d.Pod("ml", "web-7d9f-abcde")
		return info.Labels["track"] == "canary"
	})

	if err := pods.Delete(ctx, pod.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 5*time.Second, func() bool {
		_, ok := d.Pod("ml", "web-7d9f-abcde")
		return !ok
	})
	if got := countActions(cs, "get", "replicasets"); got != 1 {
		t.Errorf("ReplicaSet gets: got %d, want 1 (the update must not look the owner up again)", got)
	}
}

func TestPodDirectoryOwnerCacheExpires(t *testing.T) {
	cs := newFakeMetadataClient(append(testCluster(),
		testPod("ml", "web-7d9f-abcde", thisNode, nil, webRS))...)
	d := NewPodDirectory(cs, thisNode, testkit.Logger(t))
	d.ownerTTL = 0 // every owner looked up has expired at once
	runDirectory(t, d)
	testkit.Eventually(t, 5*time.Second, d.Synced)
	if got := countActions(cs, "get", "replicasets"); got != 1 {
		t.Fatalf("ReplicaSet gets after sync: got %d, want 1", got)
	}

	pod := testPod("ml", "web-7d9f-abcde", thisNode, map[string]string{"v": "2"}, webRS)
	if _, err := podsIn(cs, "ml").UpdateFake(pod, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 5*time.Second, func() bool { return countActions(cs, "get", "replicasets") == 2 })
	if info, _ := d.Pod("ml", "web-7d9f-abcde"); info.OwnerKind != "Deployment" {
		t.Errorf("owner: got %s %s, want Deployment web", info.OwnerKind, info.OwnerName)
	}
}

func TestPodDirectoryOwnerLookupForbidden(t *testing.T) {
	cs := newFakeMetadataClient(append(testCluster(),
		testPod("ml", "web-7d9f-abcde", thisNode, nil, webRS),
		testPod("ml", "web-7d9f-fghij", thisNode, nil, webRS),
		testPod("ml", "orphan-rs-1", thisNode, nil, controllerRef("apps/v1", "ReplicaSet", "orphan-rs", "uid-rs-orphan")),
		testPod("ml", "nightly-28999-x7k2p", thisNode, nil, nightlyJb),
	)...)
	cs.PrependReactor("get", "replicasets", func(a k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewForbidden(schema.GroupResource{Group: "apps", Resource: "replicasets"}, a.(k8stesting.GetAction).GetName(), fmt.Errorf("RBAC: no"))
	})
	var logs testkit.SyncBuffer
	d := NewPodDirectory(cs, thisNode, slog.New(slog.NewTextHandler(&logs, nil)))
	runDirectory(t, d)
	testkit.Eventually(t, 5*time.Second, d.Synced)

	for pod, want := range map[string]string{
		"web-7d9f-abcde":      "ReplicaSet web-7d9f",
		"orphan-rs-1":         "ReplicaSet orphan-rs",
		"nightly-28999-x7k2p": "CronJob nightly",
	} {
		info, ok := d.Pod("ml", pod)
		if got := info.OwnerKind + " " + info.OwnerName; !ok || got != want {
			t.Errorf("%s: got owner %q (known: %t), want %q", pod, got, ok, want)
		}
	}
	// Two ReplicaSets, one Forbidden warning; then the sync.
	var warnings int
	for _, l := range logLines(&logs) {
		if strings.Contains(l, "level=WARN") {
			warnings++
			if !strings.Contains(l, "owner of a pod's ReplicaSet") || !strings.Contains(l, "forbidden") || !strings.Contains(l, "get on replicasets (apps)") {
				t.Errorf("warning: got %q, want it to name the ReplicaSet lookup, the error and the RBAC rule", l)
			}
		}
	}
	if warnings != 1 {
		t.Errorf("warnings: got %d, want 1:\n%s", warnings, logs.String())
	}
}

func TestPodDirectoryWithoutAPI(t *testing.T) {
	tests := map[string]struct {
		client func(t *testing.T) metadata.Interface
		// retries: the informer's failed retries reach its error handler, which logs
		// them at debug level. A refused connection is retried inside client-go.
		retries, wantHint bool
	}{
		"pods forbidden": {
			client: func(t *testing.T) metadata.Interface {
				cs := newFakeMetadataClient(testPod("ml", "bare", thisNode, nil))
				cs.PrependReactor("list", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
					return true, nil, apierrors.NewForbidden(schema.GroupResource{Resource: "pods"}, "",
						fmt.Errorf(`User "system:serviceaccount:gpuscaler:collector" cannot list resource "pods"`))
				})
				return cs
			},
			retries: true, wantHint: true,
		},
		"API server unreachable": {
			client: func(t *testing.T) metadata.Interface {
				// Nothing listens there: every connection is refused.
				cs, err := NewMetadataClient(writeKubeconfig(t, "http://"+testkit.FreeAddr(t)))
				if err != nil {
					t.Fatal(err)
				}
				return cs
			},
		},
		"API server failing": {
			client: func(t *testing.T) metadata.Interface {
				api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					http.Error(w, "etcd is down", http.StatusServiceUnavailable)
				}))
				t.Cleanup(api.Close)
				cs, err := NewMetadataClient(writeKubeconfig(t, api.URL))
				if err != nil {
					t.Fatal(err)
				}
				return cs
			},
			retries: true,
		},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			var logs testkit.SyncBuffer
			log := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
			d := NewPodDirectory(tt.client(t), thisNode, log)
			runDirectory(t, d)

			const warning = "cannot read pods from the Kubernetes API; reports will carry namespace/pod/container without labels"
			testkit.Eventually(t, 5*time.Second, func() bool { return strings.Contains(logs.String(), warning) })
			if tt.retries {
				// Let the informer fail, back off and fail twice more: still one line
				// above debug level.
				const retry = "reading pods from the Kubernetes API failed; retrying"
				testkit.Eventually(t, 15*time.Second, func() bool { return strings.Count(logs.String(), retry) >= 2 })
			}
			var lines []string
			for _, l := range logLines(&logs) {
				if !strings.Contains(l, "level=DEBUG") {
					lines = append(lines, l)
				}
			}
			if len(lines) != 1 {
				t.Fatalf("log above debug level: got %d lines, want 1:\n%s", len(lines), logs.String())
			}
			if !strings.Contains(lines[0], "level=WARN") || !strings.Contains(lines[0], "err=") {
				t.Errorf("log: got %q, want a warning with the error", lines[0])
			}
			if got := strings.Contains(lines[0], "hint="); got != tt.wantHint {
				t.Errorf("log %q: hint given %t, want %t", lines[0], got, tt.wantHint)
			}
			if _, ok := d.Pod("ml", "bare"); ok {
				t.Errorf("Pod: got known, want unknown")
			}
			if d.Synced() {
				t.Errorf("Synced: got true, want false")
			}
		})
	}
}

// writeKubeconfig writes a kubeconfig for the API server at url, without credentials.
func writeKubeconfig(t *testing.T, url string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "kubeconfig")
	cfg := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: test
  cluster:
    server: %s
contexts:
- name: test
  context:
    cluster: test
    user: test
current-context: test
users:
- name: test
  user: {}
`, url)
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestPodDirectoryClientConfig(t *testing.T) {
	var userAgent, accept atomic.Value
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		userAgent.Store(r.UserAgent())
		accept.Store(r.Header.Get("Accept"))
		if r.URL.Path != "/api/v1/namespaces/ml/pods/bare" {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"kind":"PartialObjectMetadata","apiVersion":"meta.k8s.io/v1","metadata":{"name":"bare","namespace":"ml","uid":"uid-bare"}}`)
	}))
	t.Cleanup(api.Close)

	t.Run("kubeconfig", func(t *testing.T) {
		client, err := NewMetadataClient(writeKubeconfig(t, api.URL))
		if err != nil {
			t.Fatalf("got %v, want a client", err)
		}
		pod, err := client.Resource(PodsResource).Namespace("ml").Get(t.Context(), "bare", metav1.GetOptions{})
		if err != nil {
			t.Fatalf("get pod: %v", err)
		}
		if pod.UID != "uid-bare" {
			t.Errorf("pod UID: got %s, want uid-bare", pod.UID)
		}
		if got := userAgent.Load(); got != "gpuscaler-collector" {
			t.Errorf("user agent: got %v, want gpuscaler-collector", got)
		}
		// Metadata only, protobuf preferred.
		const want = "application/vnd.kubernetes.protobuf;as=PartialObjectMetadata;g=meta.k8s.io;v=v1,application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"
		if got, _ := accept.Load().(string); !strings.HasPrefix(got, want) {
			t.Errorf("Accept: got %q, want %q first", got, want)
		}
	})

	errs := map[string]struct {
		kubeconfig string
		want       string
	}{
		"no kubeconfig outside a pod": {"", "in-cluster config (outside a pod, pass a kubeconfig)"},
		"kubeconfig missing":          {"/nonexistent/kubeconfig", "kubeconfig /nonexistent/kubeconfig"},
	}
	for name, tt := range errs {
		t.Run(name, func(t *testing.T) {
			t.Setenv("KUBERNETES_SERVICE_HOST", "")
			t.Setenv("KUBERNETES_SERVICE_PORT", "")
			_, err := NewMetadataClient(tt.kubeconfig)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("got %v, want an error with %q", err, tt.want)
			}
		})
	}
}

// TestBinaryLinksNoTypedClient guards the collector's footprint: the gpuscaler binary
// reads the Kubernetes API through the metadata client only. client-go's typed
// clientset and informers would link and initialise every API group's types, which
// doubles the memory the collector's package initialisation touches.
func TestBinaryLinksNoTypedClient(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go list")
	}
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go tool:", err)
	}
	out, err := exec.CommandContext(t.Context(), goTool, "list", "-deps", "../../cmd/gpuscaler").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	for pkg := range strings.SplitSeq(string(out), "\n") {
		for _, banned := range []string{"k8s.io/client-go/kubernetes", "k8s.io/client-go/informers", "k8s.io/api/"} {
			if strings.HasPrefix(pkg, banned) {
				t.Errorf("gpuscaler links %s, want no package under %s", pkg, banned)
			}
		}
	}
}
