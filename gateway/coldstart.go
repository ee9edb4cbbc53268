package gateway

import (
	"slices"
	"sync"
	"time"

	gpuscalerv1 "github.com/gpuscaler/gpuscaler/proto/gpuscaler/v1"
)

// The gateway measures how long a new backend replica takes to serve, its cold start,
// which the scaler's queue-demand metric needs (docs/gateway.md, "Cold starts"). It sees
// a Service's endpoints in its EndpointSlices: a pod gets an endpoint once it has an IP,
// not ready while its model loads, and ready when its readiness probe passes. So a
// replica's cold start is the time from its endpoint first seen not ready to that
// endpoint ready. A route going from no ready endpoint to one is the same measurement of
// the endpoint that became ready first: the time before it, from the first request held
// to a replica being asked for, is the scaler's and KEDA's, and shows in
// gpuscaler_gateway_hold_seconds.

// recentStarts is how many of a Service's latest cold starts its figure is the largest
// of. A scale-up starts several replicas, some on nodes that have the image and the
// weights cached and some not; the metric must plan for the slow one, so one quick
// restart must not hide a slow load. Forgetting older ones lets a change of model or
// engine show within a few starts.
const recentStarts = 5

// endpointState is one endpoint of a Service port, as its EndpointSlice says.
type endpointState struct {
	// key names the endpoint across updates: its pod's UID (targetRef), else its
	// address, for an endpoint that names no pod.
	key   string
	ready bool
}

// coldStarts measures the cold starts of the Services the routes send to. Its methods
// are safe for concurrent use.
type coldStarts struct {
	now func() time.Time

	mu       sync.Mutex // guards services
	services map[string]*serviceStarts
}

// serviceStarts is what coldStarts holds of one Service.
type serviceStarts struct {
	// starting holds, by endpoint key, when each endpoint not yet ready was first seen.
	// The zero time marks one first seen when what came before was unknown (the
	// gateway's first read of the slices, or the route just made): it existed before
	// then, so no figure is taken from it.
	starting map[string]time.Time
	// served holds the endpoints seen ready: one that turns not ready again (a readiness
	// probe failing under load) has not started anew, and is not measured.
	served map[string]bool
	// recent are the last recentStarts cold starts, oldest first.
	recent []time.Duration
}

func newColdStarts(now func() time.Time) *coldStarts {
	return &coldStarts{now: now, services: map[string]*serviceStarts{}}
}

// observe takes the endpoints of Service service now. unknownBefore says the endpoints
// seen for the first time may have existed unseen (the slices' first read, a new
// route): those not ready are then not measured. It returns the cold starts measured by
// this observation and the Service's figure: the largest of its recent ones, 0 when
// none was measured.
func (c *coldStarts) observe(service string, eps []endpointState, unknownBefore bool) (measured []time.Duration, figure time.Duration) {
	now := c.now()
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.services[service]
	if s == nil {
		s = &serviceStarts{starting: map[string]time.Time{}, served: map[string]bool{}}
		c.services[service] = s
	}
	seen := make(map[string]bool, len(eps))
	for _, e := range eps {
		seen[e.key] = true
		if s.served[e.key] {
			continue
		}
		since, starting := s.starting[e.key]
		switch {
		case e.ready:
			s.served[e.key] = true
			delete(s.starting, e.key)
			if d := max(now.Sub(since), 0); starting && !since.IsZero() && d <= gpuscalerv1.MaxColdStartSeconds*time.Second {
				// Not ready for over an hour (a crash loop, a stuck probe) is no model
				// load: the scaler would drop a figure that large.
				measured = append(measured, d)
				s.recent = append(s.recent, d)
				if len(s.recent) > recentStarts {
					s.recent = slices.Delete(s.recent, 0, len(s.recent)-recentStarts)
				}
			}
		case !starting && unknownBefore:
			s.starting[e.key] = time.Time{}
		case !starting:
			s.starting[e.key] = now
		}
	}
	// An endpoint gone (its pod deleted, whether it served or not) is forgotten.
	for k := range s.starting {
		if !seen[k] {
			delete(s.starting, k)
		}
	}
	for k := range s.served {
		if !seen[k] {
			delete(s.served, k)
		}
	}
	return measured, s.figureLocked()
}

// figure returns Service service's figure: the largest of its recent cold starts, 0
// when none was measured.
func (c *coldStarts) figure(service string) time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	if s := c.services[service]; s != nil {
		return s.figureLocked()
	}
	return 0
}

func (s *serviceStarts) figureLocked() time.Duration {
	if len(s.recent) == 0 {
		return 0
	}
	return slices.Max(s.recent)
}

// retain forgets the Services keep does not hold: no route sends to them any more.
func (c *coldStarts) retain(keep map[string]bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for name := range c.services {
		if !keep[name] {
			delete(c.services, name)
		}
	}
}
