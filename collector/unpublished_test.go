package collector

import (
	"errors"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/gpuscaler/gpuscaler/collector/sim"
	"github.com/gpuscaler/gpuscaler/internal/natstest"
	"github.com/gpuscaler/gpuscaler/test/testkit"
)

// TestCollectorSaysWithinAnIntervalItCannotPublish runs two cycles against a NATS URL
// where nothing listens (a port listened on, then closed): the second cycle finds the
// first report still unpublished, and the collector says so then, naming the URL and the
// cause, and counts it. Before, it said nothing until readiness failed.
func TestCollectorSaysWithinAnIntervalItCannotPublish(t *testing.T) {
	url := "nats://" + testkit.FreeAddr(t)
	nc := natstest.Connect(t, url)
	testkit.Eventually(t, 10*time.Second, func() bool { return errors.Is(nc.Problem(), syscall.ECONNREFUSED) })
	simulated, err := sim.New("n1", sim.Config{GPUs: 1})
	if err != nil {
		t.Fatal(err)
	}
	log, buf := testkit.BufferLogger()
	reg := prometheus.NewRegistry()
	// The interval is long: the test drives the cycles itself.
	c, err := New(Config{Node: "n1", Interval: time.Hour, NATSProblem: nc.Problem}, simulated, simulated, simulated, nc.Conn, log, reg)
	if err != nil {
		t.Fatal(err)
	}
	publishErrors := func() float64 {
		return testutil.ToFloat64(c.metrics.errors.WithLabelValues("publish"))
	}

	c.cycle(t.Context())
	if strings.Contains(buf.String(), "cannot publish") || publishErrors() != 0 {
		t.Fatalf("after one cycle: got log %q and %v publish errors, want neither: the report has had no interval yet", buf, publishErrors())
	}
	c.cycle(t.Context())
	line := ""
	for l := range strings.SplitSeq(buf.String(), "\n") {
		if strings.Contains(l, "cannot publish") {
			line = l
		}
	}
	for _, want := range []string{"level=WARN", "stage=publish", "not connected to NATS at " + url, "nothing listens there", "connection refused"} {
		if !strings.Contains(line, want) {
			t.Errorf("got log line %q, want it to contain %q; log:\n%s", line, want, buf)
		}
	}
	if got := publishErrors(); got != 1 {
		t.Errorf("gpuscaler_collector_errors_total{stage=\"publish\"}: got %v, want 1", got)
	}
	if got := testutil.ToFloat64(c.metrics.published); got != 0 {
		t.Errorf("reports published: got %v, want 0", got)
	}
}
