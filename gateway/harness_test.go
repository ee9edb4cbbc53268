package gateway

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynamicfake "k8s.io/client-go/dynamic/fake"

	"github.com/gpuscaler/gpuscaler/test/testkit"
)

// countingCounter is a real, minimal Counter: it counts each call, as a Reporter would.
type countingCounter struct {
	enqueued, started, finished, dropped, closed atomic.Int64
	coldStart                                    atomic.Int64 // the last ColdStart, in nanoseconds
}

func (c *countingCounter) Enqueued(n int) { c.enqueued.Add(int64(n)) }
func (c *countingCounter) Started(n int)  { c.started.Add(int64(n)) }
func (c *countingCounter) Finished(n int) { c.finished.Add(int64(n)) }
func (c *countingCounter) Dropped(n int)  { c.dropped.Add(int64(n)) }
func (c *countingCounter) Close() error   { c.closed.Add(1); return nil }

func (c *countingCounter) ColdStart(d time.Duration) { c.coldStart.Store(int64(d)) }

func (c *countingCounter) String() string {
	return fmt.Sprintf("enqueued %d, started %d, finished %d, dropped %d, closed %d",
		c.enqueued.Load(), c.started.Load(), c.finished.Load(), c.dropped.Load(), c.closed.Load())
}

// counts returns enqueued, started, finished, dropped.
func (c *countingCounter) counts() [4]int64 {
	return [4]int64{c.enqueued.Load(), c.started.Load(), c.finished.Load(), c.dropped.Load()}
}

// testGateway is a Gateway served on a loopback port for one test.
type testGateway struct {
	*Gateway
	URL  string // http://127.0.0.1:port
	File string // the routes file
	reg  *prometheus.Registry
	log  *testkit.SyncBuffer
	kube *dynamicfake.FakeDynamicClient
	// stop ends Run and waits for it to return.
	stop     func()
	stopOnce sync.Once
	mu       sync.Mutex
	queue    map[string]*countingCounter
}

// counter returns queue's counter (the latest made for it).
func (tg *testGateway) counter(queue string) *countingCounter {
	tg.mu.Lock()
	defer tg.mu.Unlock()
	return tg.queue[queue]
}

// startGateway serves a gateway with the routes in routes until the test ends, and
// checks then that Run returned and closed every counter. cfg's zero fields get test
// values: fast polls, a namespace "ml", a fake clientset.
func startGateway(t testing.TB, routes string, cfg Config) *testGateway {
	t.Helper()
	tg := &testGateway{File: filepath.Join(t.TempDir(), "routes.yaml"), reg: prometheus.NewRegistry(), queue: map[string]*countingCounter{}}
	if err := os.WriteFile(tg.File, []byte(routes), 0o600); err != nil {
		t.Fatal(err)
	}
	log := &testkit.SyncBuffer{}
	tg.log = log
	cfg.Log = slog.New(slog.NewTextHandler(log, &slog.HandlerOptions{Level: slog.LevelDebug}))
	cfg.RoutesFile = tg.File
	cfg.Registerer = tg.reg
	setDefault(&cfg.RoutesPoll, 10*time.Millisecond)
	setDefault(&cfg.HeldProbeInterval, 5*time.Millisecond)
	setDefault(&cfg.DialRetry, 5*time.Millisecond)
	setDefault(&cfg.ShutdownGrace, 5*time.Second)
	if cfg.Namespace == "" {
		cfg.Namespace = "ml"
	}
	if cfg.Kube == nil {
		tg.kube = newFakeKube(t)
		cfg.Kube = tg.kube
	}
	if cfg.NewCounter == nil {
		cfg.NewCounter = tg.newCounter
	}
	g, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	tg.Gateway = g
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	tg.URL = "http://" + lis.Addr().String()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- g.Run(ctx, lis) }()
	tg.stop = func() {
		cancel()
		tg.stopOnce.Do(func() {
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("Run: %v", err)
				}
			case <-time.After(10 * time.Second):
				t.Fatalf("Run still running 10s after its context ended")
			}
		})
	}
	t.Cleanup(func() {
		tg.stop()
		tg.mu.Lock()
		defer tg.mu.Unlock()
		for q, c := range tg.queue {
			if c.closed.Load() != 1 {
				t.Errorf("queue %s: counter closed %d times, want 1", q, c.closed.Load())
			}
		}
		if t.Failed() {
			t.Logf("gateway log:\n%s", log)
		}
	})
	testkit.Eventually(t, 5*time.Second, func() bool { return g.Ready() == nil })
	return tg
}

func (tg *testGateway) newCounter(q string) (Counter, error) {
	tg.mu.Lock()
	defer tg.mu.Unlock()
	c := &countingCounter{}
	tg.queue[q] = c
	return c, nil
}

// held returns the number of requests route holds, from the gauge.
func (tg *testGateway) held(route string) float64 {
	return testutil.ToFloat64(tg.m.held.WithLabelValues(route))
}

// requests returns the requests_total of route and code.
func (tg *testGateway) requests(route string, code int) float64 {
	return testutil.ToFloat64(tg.m.requests.WithLabelValues(route, strconv.Itoa(code)))
}

// writeRoutes replaces the routes file.
func (tg *testGateway) writeRoutes(t *testing.T, routes string) {
	t.Helper()
	tmp := tg.File + ".new"
	if err := os.WriteFile(tmp, []byte(routes), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, tg.File); err != nil {
		t.Fatal(err)
	}
}

// setSlice creates or updates Service service's EndpointSlice in namespace ml, with
// one endpoint at addr (ip:port), ready or not.
func (tg *testGateway) setSlice(t testing.TB, service, addr string, ready bool) {
	t.Helper()
	host, portText, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	port, _ := strconv.Atoi(portText)
	p32 := int32(port)
	name := "http"
	s := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: service + "-abc", Namespace: "ml", Labels: map[string]string{discoveryv1.LabelServiceName: service}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: &name, Port: &p32}},
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{host}, Conditions: discoveryv1.EndpointConditions{Ready: &ready}}},
	}
	putSlice(t, tg.kube, s)
}

// newFakeKube is client-go's fake dynamic client, serving slices.
func newFakeKube(t testing.TB, slices ...*discoveryv1.EndpointSlice) *dynamicfake.FakeDynamicClient {
	t.Helper()
	c := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{EndpointSlicesResource: "EndpointSliceList"})
	for _, s := range slices {
		putSlice(t, c, s)
	}
	return c
}

// putSlice creates or updates s through the dynamic client, as the API server would
// hand it out: the typed object turned into its JSON form.
func putSlice(t testing.TB, c *dynamicfake.FakeDynamicClient, s *discoveryv1.EndpointSlice) {
	t.Helper()
	obj, err := runtime.DefaultUnstructuredConverter.ToUnstructured(s)
	if err != nil {
		t.Fatal(err)
	}
	u := &unstructured.Unstructured{Object: obj}
	u.SetAPIVersion("discovery.k8s.io/v1")
	u.SetKind("EndpointSlice")
	res := c.Resource(EndpointSlicesResource).Namespace(s.Namespace)
	if _, err := res.Update(t.Context(), u, metav1.UpdateOptions{}); err != nil {
		if _, err := res.Create(t.Context(), u, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
}

// get sends method to url with body in the background and returns a channel with its
// outcome.
type outcome struct {
	resp *http.Response
	body string
	err  error
}
