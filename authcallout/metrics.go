package authcallout

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the callout's own Prometheus metrics.
type metrics struct {
	decisions *prometheus.CounterVec
	duration  prometheus.Histogram
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gpuscaler_auth_callout_decisions_total",
			Help: "NATS clients admitted (result allowed) and refused (result denied), by role and by the reason for a refusal: malformed_request, malformed_token, expired, wrong_audience, rejected (by the Kubernetes API: revoked, expired, pod gone), review_failed (Kubernetes API unreachable), not_service_account, not_listed, no_node, bad_password, no_credentials, no_kubernetes.",
		}, []string{"role", "result", "reason"}),
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "gpuscaler_auth_callout_duration_seconds",
			Help:    "Time to answer one authorization request, TokenReview included.",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5},
		}),
	}
	reg.MustRegister(m.decisions, m.duration)
	return m
}

// observe records one decision: admitted when reason is empty, refused otherwise. role is
// 0 when the client was refused before its role was known.
func (m *metrics) observe(role Role, reason string, start, end time.Time) {
	result := "allowed"
	if reason != "" {
		result = "denied"
	}
	m.decisions.WithLabelValues(role.String(), result, reason).Inc()
	m.duration.Observe(end.Sub(start).Seconds())
}
