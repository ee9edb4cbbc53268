package gateway

import "github.com/prometheus/client_golang/prometheus"

// noRoute is the route label of requests no route matched.
const noRoute = "-"

// metrics are the gateway's Prometheus metrics.
type metrics struct {
	requests        *prometheus.CounterVec   // route, code: every request answered
	held            *prometheus.GaugeVec     // route: requests waiting for a ready backend now
	holdSeconds     *prometheus.HistogramVec // route: time from arrival to forwarding or giving up
	upstreamSeconds *prometheus.HistogramVec // route: time from forwarding to the response's last byte
	// coldStartSeconds, route: a backend replica's time from its endpoint first seen not
	// ready to ready (see coldStarts).
	coldStartSeconds *prometheus.HistogramVec
	reloads          *prometheus.CounterVec // result: ok or error
}

func newMetrics(reg prometheus.Registerer) *metrics {
	buckets := prometheus.ExponentialBucketsRange(0.001, 600, 16)
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gpuscaler_gateway_requests_total",
			Help: "Requests answered, by route (- when none matched) and status code (499: the client went away first).",
		}, []string{"route", "code"}),
		held: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "gpuscaler_gateway_held_requests",
			Help: "Requests held now, waiting for a ready backend replica, by route.",
		}, []string{"route"}),
		holdSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "gpuscaler_gateway_hold_seconds",
			Help:    "Time requests waited at the gateway before being forwarded or given up on, by route.",
			Buckets: buckets,
		}, []string{"route"}),
		upstreamSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "gpuscaler_gateway_upstream_seconds",
			Help:    "Time from forwarding a request to the last byte of its response, by route.",
			Buckets: buckets,
		}, []string{"route"}),
		coldStartSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "gpuscaler_gateway_cold_start_seconds",
			Help: "Time a new backend replica of a Service route took from its endpoint first seen not ready to ready, by route.",
			// From a second (a small model on a warm node) to an hour (a large one
			// pulled and loaded on a new node), closest where model loads fall.
			Buckets: []float64{1, 2, 5, 10, 20, 30, 45, 60, 90, 120, 180, 300, 600, 1800, 3600},
		}, []string{"route"}),
		reloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gpuscaler_gateway_route_reloads_total",
			Help: "Routes file reloads, by result: ok, or error (the last good routes stay).",
		}, []string{"result"}),
	}
	if reg != nil {
		reg.MustRegister(m.requests, m.held, m.holdSeconds, m.upstreamSeconds, m.coldStartSeconds, m.reloads)
	}
	return m
}
