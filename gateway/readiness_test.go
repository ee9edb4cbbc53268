package gateway

import (
	"testing"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpuscaler/gpuscaler/test/testkit"
)

func ptr[T any](v T) *T { return &v }

// TestSliceEndpoints reads EndpointSlices as k8s.io/api/discovery/v1 defines them
// (types.go): a nil ready condition is an unknown state that consumers read as ready;
// the ports are the endpoints' (target) ports.
func TestSliceEndpoints(t *testing.T) {
	slice := func(name, service string, ports []discoveryv1.EndpointPort, eps ...discoveryv1.Endpoint) *discoveryv1.EndpointSlice {
		return &discoveryv1.EndpointSlice{
			ObjectMeta:  metav1.ObjectMeta{Name: name, Namespace: "ml", Labels: map[string]string{discoveryv1.LabelServiceName: service}},
			AddressType: discoveryv1.AddressTypeIPv4,
			Ports:       ports,
			Endpoints:   eps,
		}
	}
	ep := func(ip string, ready *bool) discoveryv1.Endpoint {
		return discoveryv1.Endpoint{Addresses: []string{ip}, Conditions: discoveryv1.EndpointConditions{Ready: ready}}
	}
	two := []discoveryv1.EndpointPort{{Name: ptr("metrics"), Port: ptr[int32](9090)}, {Name: ptr("http"), Port: ptr[int32](8000)}}
	one := []discoveryv1.EndpointPort{{Name: ptr("http"), Port: ptr[int32](8080)}}
	client := newFakeKube(t,
		slice("llm-a", "llm", two, ep("10.0.0.1", ptr(true)), ep("10.0.0.2", nil), ep("10.0.0.3", ptr(false))),
		slice("llm-b", "llm", two, ep("10.0.0.4", ptr(true))),
		slice("target-a", "target", one, ep("10.0.1.1", ptr(true))),
		slice("cold-a", "cold", one, ep("10.0.2.1", ptr(false))),
		slice("other-a", "other", two, ep("10.0.3.1", ptr(true))),
	)
	w, err := newSliceWatcher(client, "ml", func(string, bool) {})
	if err != nil {
		t.Fatal(err)
	}
	go w.run(t.Context())
	testkit.Eventually(t, 5*time.Second, w.synced)
	tests := map[string]struct {
		service  string
		port     int
		want     []string
		noSlices bool
	}{
		"ready and unknown, both slices": {"llm", 8000, []string{"10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.4:8000"}, false},
		"one port, another number":       {"target", 80, []string{"10.0.1.1:8080"}, false},
		"none ready":                     {"cold", 80, nil, false},
		"port in no slice":               {"llm", 7000, nil, false},
		"no slices":                      {"missing", 80, nil, true},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, none := w.endpoints(tc.service, tc.port)
			if none != tc.noSlices || len(got) != len(tc.want) {
				t.Fatalf("got %q (no slices %v), want %q (%v)", got, none, tc.want, tc.noSlices)
			}
			for i := range got {
				if got[i] != tc.want[i] {
					t.Errorf("got %q, want %q", got, tc.want)
				}
			}
		})
	}
}
