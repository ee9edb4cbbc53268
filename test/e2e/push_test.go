package e2e

import (
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/kedacore/keda/v2/pkg/scalers/externalscaler"

	"github.com/gpuscaler/gpuscaler/test/e2e/cluster"
)

// TestPushAtScaler times the scaler's own share of a wake-up: from NATS delivering a
// QueueReport with work to a subscriber, to StreamIsActive sending true to a client
// (KEDA's generated externalscaler client), for the scaler on nats-server and the one
// with embedded NATS. TestWakeLatency's figures are this plus KEDA's work.
func TestPushAtScaler(t *testing.T) {
	runs := envInt(t, "GPUSCALER_E2E_PUSH_RUNS", 12)
	var lines string
	for _, b := range backends() {
		t.Run(b.name, func(t *testing.T) {
			ns := newNamespace(t, "push")
			p := startProducerOn(t, b.g, ns, "q", cluster.Report{})
			// pushInterval 0s: each run times a push, seconds after the last.
			meta := map[string]string{"scalerAddress": b.s.GRPCAddr, "queue": "q", "pushInterval": "0s"}
			conn, err := grpc.NewClient(b.s.GRPCAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			stream, err := externalscaler.NewExternalScalerClient(conn).StreamIsActive(t.Context(),
				&externalscaler.ScaledObjectRef{Name: "probe", Namespace: ns, ScalerMetadata: meta})
			if err != nil {
				t.Fatal(err)
			}
			if first, err := stream.Recv(); err != nil || first.GetResult() {
				t.Fatalf("StreamIsActive opened with %v, %v; want false", first.GetResult(), err)
			}
			nc, err := nats.Connect(b.g.NATSURL, nats.Name("gpuscaler-e2e-push"))
			if err != nil {
				t.Fatal(err)
			}
			defer nc.Close()
			reports, err := nc.SubscribeSync(fmt.Sprintf("gpuscaler.v1.queue.%s.q.*", ns))
			if err != nil {
				t.Fatal(err)
			}
			if err := nc.Flush(); err != nil {
				t.Fatal(err)
			}
			var lat []time.Duration
			for range runs {
				dropPending(t, reports)
				published := make(chan error, 1)
				go func() { published <- p.SetErr(cluster.Report{Waiting: 1}) }()
				event := nextReportWithWork(t, reports)
				r, err := stream.Recv()
				if err != nil {
					t.Fatal(err)
				}
				if !r.GetResult() {
					t.Fatal("StreamIsActive pushed false")
				}
				lat = append(lat, time.Since(event))
				if err := <-published; err != nil {
					t.Fatal(err)
				}
				p.Set(cluster.Report{})
				waitInactive(t, ns, "probe", meta)
			}
			lines += fmt.Sprintf("  %-58s %s\n", "gpuscaler scaler, "+b.name, summary(lat))
		})
	}
	out := "\npush inside the scaler: QueueReport delivered → StreamIsActive true at the client:\n" + lines
	t.Log(out)
	fmt.Fprint(os.Stderr, out)
}

// dropPending drops the reports delivered so far (heartbeats of earlier runs).
func dropPending(t *testing.T, sub *nats.Subscription) {
	t.Helper()
	for {
		if n, _, err := sub.Pending(); err != nil {
			t.Fatal(err)
		} else if n == 0 {
			return
		}
		if _, err := sub.NextMsg(time.Second); err != nil {
			t.Fatal(err)
		}
	}
}

// nextReportWithWork returns when NATS delivers a QueueReport with waiting above 0:
// heartbeats of the empty queue may come first.
func nextReportWithWork(t *testing.T, reports *nats.Subscription) time.Time {
	t.Helper()
	for {
		msg, err := reports.NextMsg(10 * time.Second)
		if err != nil {
			t.Fatal(err)
		}
		at := time.Now()
		waiting, err := queueReportWaiting(msg.Data)
		if err != nil {
			t.Fatal(err)
		}
		if waiting > 0 {
			return at
		}
	}
}

// queueReportWaiting reads the waiting count (field 3 of gpuscaler.v1.QueueReport in
// proto/gpuscaler/v1/events.proto) from an encoded report. The e2e module does not import
// the main module's generated code (see README.md), so it reads the one field it needs.
func queueReportWaiting(b []byte) (uint64, error) {
	var waiting uint64
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return 0, protowire.ParseError(n)
		}
		b = b[n:]
		if num == 3 && typ == protowire.VarintType {
			v, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return 0, protowire.ParseError(n)
			}
			waiting = v
			b = b[n:]
			continue
		}
		n = protowire.ConsumeFieldValue(num, typ, b)
		if n < 0 {
			return 0, protowire.ParseError(n)
		}
		b = b[n:]
	}
	return waiting, nil
}
