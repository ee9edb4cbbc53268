package gateway

import (
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpuscaler/gpuscaler/test/testkit"
)

// fakeClock is a clock a test moves by hand.
type fakeClock struct{ ns atomic.Int64 }

func newFakeClock() *fakeClock {
	c := &fakeClock{}
	c.ns.Store(time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC).UnixNano())
	return c
}

func (c *fakeClock) now() time.Time          { return time.Unix(0, c.ns.Load()) }
func (c *fakeClock) advance(d time.Duration) { c.ns.Add(int64(d)) }

// TestColdStartsObserve follows a Service's endpoints through the sequences a
// Deployment's pods go through, one observation a step, and checks what is measured and
// the figure: the largest of the last recentStarts.
func TestColdStartsObserve(t *testing.T) {
	type step struct {
		after         time.Duration // the clock moves this much before the step
		eps           string        // "a b+ c": a, b ready, c (+ is ready)
		unknownBefore bool
		measured      []time.Duration
		figure        time.Duration
	}
	s := time.Second
	tests := map[string][]step{
		"a pod from not ready to ready": {
			{0, "a", false, nil, 0},
			{30 * s, "a", false, nil, 0},
			{15 * s, "a+", false, []time.Duration{45 * s}, 45 * s},
			{time.Minute, "a+", false, nil, 45 * s},
		},
		"not ready for over an hour (a crash loop) is no cold start": {
			{0, "a", false, nil, 0},
			{time.Hour + s, "a+", false, nil, 0},
			{0, "b", false, nil, 0},
			{time.Hour, "b+", false, []time.Duration{time.Hour}, time.Hour},
		},
		"ready at once: nothing measured": {
			{0, "a+", false, nil, 0},
		},
		"not ready at the first read: its start is unknown": {
			{0, "a", true, nil, 0},
			{20 * s, "a+", false, nil, 0},
		},
		"a serving pod that turns not ready and back has not started anew": {
			{0, "a", false, nil, 0},
			{40 * s, "a+", false, []time.Duration{40 * s}, 40 * s},
			{10 * s, "a", false, nil, 40 * s},
			{90 * s, "a+", false, nil, 40 * s},
		},
		"a pod deleted before it was ready is forgotten": {
			{0, "a", false, nil, 0},
			{10 * s, "", false, nil, 0},
			{10 * s, "a", false, nil, 0},
			{5 * s, "a+", false, []time.Duration{5 * s}, 5 * s},
		},
		"two at once, and a quick restart does not hide the slow one": {
			{0, "a b", false, nil, 0},
			{20 * s, "a+ b", false, []time.Duration{20 * s}, 20 * s},
			{50 * s, "a+ b+", false, []time.Duration{70 * s}, 70 * s},
			{0, "b+ c", false, nil, 70 * s},
			{3 * s, "b+ c+", false, []time.Duration{3 * s}, 70 * s},
		},
		"the largest of the last five": {
			{0, "a", false, nil, 0},
			{90 * s, "a+", false, []time.Duration{90 * s}, 90 * s},
			{0, "b", false, nil, 90 * s},
			{10 * s, "b+", false, []time.Duration{10 * s}, 90 * s},
			{0, "c", false, nil, 90 * s},
			{10 * s, "c+", false, []time.Duration{10 * s}, 90 * s},
			{0, "d", false, nil, 90 * s},
			{10 * s, "d+", false, []time.Duration{10 * s}, 90 * s},
			{0, "e", false, nil, 90 * s},
			{10 * s, "e+", false, []time.Duration{10 * s}, 90 * s},
			{0, "f", false, nil, 90 * s},
			{12 * s, "f+", false, []time.Duration{12 * s}, 12 * s}, // the 90 s is the sixth last
		},
	}
	for name, steps := range tests {
		t.Run(name, func(t *testing.T) {
			clock := newFakeClock()
			c := newColdStarts(clock.now)
			for i, st := range steps {
				clock.advance(st.after)
				var eps []endpointState
				for f := range strings.FieldsSeq(st.eps) {
					key, ready := strings.CutSuffix(f, "+")
					eps = append(eps, endpointState{key: key, ready: ready})
				}
				measured, figure := c.observe("llm:8000", eps, st.unknownBefore)
				if !slicesEqual(measured, st.measured) || figure != st.figure {
					t.Fatalf("step %d (%q): measured %v, figure %s; want %v, %s", i, st.eps, measured, figure, st.measured, st.figure)
				}
				if got := c.figure("llm:8000"); got != figure {
					t.Fatalf("step %d: figure() = %s, observe said %s", i, got, figure)
				}
			}
		})
	}
}

func slicesEqual(a, b []time.Duration) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestGatewayMeasuresColdStart runs a gateway on client-go's fake clientset: a pod's
// endpoint appears not ready (it has an IP, its model loads), then ready 42 s later by
// the gateway's clock. The route's queue gets the figure, the histogram the
// observation; a pod that was there, not ready, when the gateway first read the slices
// is not measured, as its start was not seen.
func TestGatewayMeasuresColdStart(t *testing.T) {
	clock := newFakeClock()
	kube := newFakeKube(t, sliceOf("llm-server", "old", endpointOf("10.0.0.9", "uid-old", false)))
	tg := startGateway(t, "routes:\n- {name: llm, service: {name: llm-server, port: 8000}, queue: llm, holdTimeout: 1m}\n",
		Config{Kube: kube, Now: clock.now})
	tg.kube = kube
	starting := func(uid string) func() bool {
		return func() bool {
			tg.starts.mu.Lock()
			defer tg.starts.mu.Unlock()
			s := tg.starts.services["llm-server:8000"]
			if s == nil { // the gateway has not read the slices yet
				return false
			}
			_, ok := s.starting[uid]
			return ok
		}
	}
	testkit.Eventually(t, 5*time.Second, starting("uid-old"))

	putSlice(t, kube, sliceOf("llm-server", "new", endpointOf("10.0.0.1", "uid-1", false)))
	testkit.Eventually(t, 5*time.Second, starting("uid-1"))
	clock.advance(42 * time.Second)
	putSlice(t, kube, sliceOf("llm-server", "new", endpointOf("10.0.0.1", "uid-1", true)))
	putSlice(t, kube, sliceOf("llm-server", "old", endpointOf("10.0.0.9", "uid-old", true)))
	testkit.Eventually(t, 5*time.Second, func() bool {
		return tg.counter("llm").coldStart.Load() == int64(42*time.Second) && !starting("uid-old")()
	})
	if n := testutil.CollectAndCount(tg.m.coldStartSeconds, "gpuscaler_gateway_cold_start_seconds"); n != 1 {
		t.Fatalf("%d cold start series, want 1 (route llm)", n)
	}
	want := `
# HELP gpuscaler_gateway_cold_start_seconds Time a new backend replica of a Service route took from its endpoint first seen not ready to ready, by route.
# TYPE gpuscaler_gateway_cold_start_seconds histogram
gpuscaler_gateway_cold_start_seconds_bucket{route="llm",le="1"} 0
gpuscaler_gateway_cold_start_seconds_bucket{route="llm",le="2"} 0
gpuscaler_gateway_cold_start_seconds_bucket{route="llm",le="5"} 0
gpuscaler_gateway_cold_start_seconds_bucket{route="llm",le="10"} 0
gpuscaler_gateway_cold_start_seconds_bucket{route="llm",le="20"} 0
gpuscaler_gateway_cold_start_seconds_bucket{route="llm",le="30"} 0
gpuscaler_gateway_cold_start_seconds_bucket{route="llm",le="45"} 1
gpuscaler_gateway_cold_start_seconds_bucket{route="llm",le="60"} 1
gpuscaler_gateway_cold_start_seconds_bucket{route="llm",le="90"} 1
gpuscaler_gateway_cold_start_seconds_bucket{route="llm",le="120"} 1
gpuscaler_gateway_cold_start_seconds_bucket{route="llm",le="180"} 1
gpuscaler_gateway_cold_start_seconds_bucket{route="llm",le="300"} 1
gpuscaler_gateway_cold_start_seconds_bucket{route="llm",le="600"} 1
gpuscaler_gateway_cold_start_seconds_bucket{route="llm",le="1800"} 1
gpuscaler_gateway_cold_start_seconds_bucket{route="llm",le="3600"} 1
gpuscaler_gateway_cold_start_seconds_bucket{route="llm",le="+Inf"} 1
gpuscaler_gateway_cold_start_seconds_sum{route="llm"} 42
gpuscaler_gateway_cold_start_seconds_count{route="llm"} 1
`
	if err := testutil.CollectAndCompare(tg.m.coldStartSeconds, strings.NewReader(want)); err != nil {
		t.Error(err)
	}
}

// sliceOf is one EndpointSlice of Service service, port 8000, in namespace ml.
func sliceOf(service, name string, eps ...discoveryv1.Endpoint) *discoveryv1.EndpointSlice {
	return &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: service + "-" + name, Namespace: "ml", Labels: map[string]string{discoveryv1.LabelServiceName: service}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr("http"), Port: ptr[int32](8000)}},
		Endpoints:   eps,
	}
}

// endpointOf is a pod's endpoint, as the EndpointSlice controller writes it: its IP, its
// ready condition and the pod (targetRef).
func endpointOf(ip, uid string, ready bool) discoveryv1.Endpoint {
	return discoveryv1.Endpoint{
		Addresses:  []string{ip},
		Conditions: discoveryv1.EndpointConditions{Ready: &ready},
		TargetRef:  &corev1.ObjectReference{Kind: "Pod", Namespace: "ml", Name: "llm-" + uid, UID: types.UID(uid)},
	}
}

// TestGatewayColdStartOfAQueueOfTwoServices: a queue that two Service routes count in
// gets the larger of their Services' figures, and a route added later does not measure
// an endpoint that was already starting when it was made.
func TestGatewayColdStartOfAQueueOfTwoServices(t *testing.T) {
	clock := newFakeClock()
	kube := newFakeKube(t)
	route := func(name, service, prefix string) string {
		return "- {name: " + name + ", service: {name: " + service + ", port: 8000}, queue: llm, holdTimeout: 1m, pathPrefix: " + prefix + "}\n"
	}
	tg := startGateway(t, "routes:\n"+route("small", "small-server", "/small")+route("big", "big-server", "/big"), Config{Kube: kube, Now: clock.now})
	starting := func(backend, uid string) func() bool {
		return func() bool {
			tg.starts.mu.Lock()
			defer tg.starts.mu.Unlock()
			s := tg.starts.services[backend]
			if s == nil {
				return false
			}
			_, ok := s.starting[uid]
			return ok
		}
	}
	coldStart := func() time.Duration { return time.Duration(tg.counter("llm").coldStart.Load()) }

	putSlice(t, kube, sliceOf("small-server", "a", endpointOf("10.0.0.1", "uid-s1", false)))
	putSlice(t, kube, sliceOf("big-server", "a", endpointOf("10.0.1.1", "uid-b1", false)))
	testkit.Eventually(t, 5*time.Second, func() bool {
		return starting("small-server:8000", "uid-s1")() && starting("big-server:8000", "uid-b1")()
	})
	clock.advance(20 * time.Second)
	putSlice(t, kube, sliceOf("small-server", "a", endpointOf("10.0.0.1", "uid-s1", true)))
	testkit.Eventually(t, 5*time.Second, func() bool { return coldStart() == 20*time.Second })
	clock.advance(30 * time.Second)
	putSlice(t, kube, sliceOf("big-server", "a", endpointOf("10.0.1.1", "uid-b1", true)))
	testkit.Eventually(t, 5*time.Second, func() bool { return coldStart() == 50*time.Second })

	// A quicker start of the small Service leaves the queue at the big one's figure.
	putSlice(t, kube, sliceOf("small-server", "a", endpointOf("10.0.0.1", "uid-s1", true), endpointOf("10.0.0.2", "uid-s2", false)))
	testkit.Eventually(t, 5*time.Second, starting("small-server:8000", "uid-s2"))
	clock.advance(5 * time.Second)
	putSlice(t, kube, sliceOf("small-server", "a", endpointOf("10.0.0.1", "uid-s1", true), endpointOf("10.0.0.2", "uid-s2", true)))
	testkit.Eventually(t, 5*time.Second, func() bool {
		return testutil.CollectAndCount(tg.m.coldStartSeconds, "gpuscaler_gateway_cold_start_seconds") == 2 &&
			histogramCount(t, tg, "small") == 2
	})
	if got := coldStart(); got != 50*time.Second {
		t.Errorf("queue llm's cold start %s, want the big Service's 50s", got)
	}

	// A route made while its Service's endpoint is starting: when that began is unknown.
	putSlice(t, kube, sliceOf("new-server", "a", endpointOf("10.0.2.1", "uid-n1", false)))
	testkit.Eventually(t, 5*time.Second, func() bool { return len(tg.slices.states("new-server", 8000)) == 1 })
	tg.writeRoutes(t, "routes:\n"+route("small", "small-server", "/small")+route("big", "big-server", "/big")+route("new", "new-server", "/new"))
	testkit.Eventually(t, 5*time.Second, func() bool {
		tg.starts.mu.Lock()
		defer tg.starts.mu.Unlock()
		s := tg.starts.services["new-server:8000"]
		return s != nil && len(s.starting) == 1 && s.starting["uid-n1"].IsZero()
	})
	clock.advance(time.Hour)
	putSlice(t, kube, sliceOf("new-server", "a", endpointOf("10.0.2.1", "uid-n1", true)))
	testkit.Eventually(t, 5*time.Second, func() bool { return !starting("new-server:8000", "uid-n1")() })
	if got := coldStart(); got != 50*time.Second {
		t.Errorf("queue llm's cold start %s after the new route's endpoint became ready, want 50s still", got)
	}
}

// histogramCount returns the observations of route's cold start histogram.
func histogramCount(t *testing.T, tg *testGateway, route string) uint64 {
	t.Helper()
	m := &dto.Metric{}
	if err := tg.m.coldStartSeconds.WithLabelValues(route).(prometheus.Histogram).Write(m); err != nil {
		t.Fatal(err)
	}
	return m.GetHistogram().GetSampleCount()
}
