package keda

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kedacore/keda/v2/pkg/scalers"
	"github.com/kedacore/keda/v2/pkg/scalers/scalersconfig"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	v2 "k8s.io/api/autoscaling/v2"

	"github.com/gpuscaler/gpuscaler/test/testkit"
)

// The NATS contract (DESIGN.md, "Events"), spelt out here because this module talks to
// gpuscaler only as its users do and does not import it.
const (
	streamName        = "GPUSCALER"        // node reports
	queueStreamName   = "GPUSCALER_QUEUES" // queue reports
	nodeSubjectPrefix = "gpuscaler.v1.node."
)

// startTimeout bounds how long a scaler or collector may take to come up. Generous: the
// two cores of CI are shared with other builds.
const startTimeout = 30 * time.Second

// scalerProc is a running `gpuscaler scaler` with its embedded NATS server.
type scalerProc struct {
	*process
	grpcAddr string // host:port of the ExternalScaler service, as KEDA's scalerAddress
	natsURL  string // the embedded NATS server, for collectors and producers
}

// startScaler runs `gpuscaler scaler` on loopback with free ports (port 0 everywhere),
// an embedded NATS server storing into a fresh directory, and extra flags (given last, so
// they override these); it returns once the scaler logs that it is ready (NATS
// connected, state restored, gRPC serving).
func startScaler(t *testing.T, extra ...string) *scalerProc {
	t.Helper()
	args := append([]string{"scaler",
		"--grpc-addr", "127.0.0.1:0", "--http-addr", "-",
		"--embedded-nats-addr", "127.0.0.1:0", "--data-dir", t.TempDir(),
		"--log-format", "json",
	}, extra...)
	p := startProcess(t, "scaler", true, args...)
	ready := p.waitLog(t, "ready", startTimeout)
	embedded := p.waitLog(t, "started embedded NATS with JetStream", startTimeout)
	s := &scalerProc{process: p}
	s.grpcAddr, _ = ready["grpcAddr"].(string)
	s.natsURL, _ = embedded["url"].(string)
	if s.grpcAddr == "" || s.natsURL == "" {
		t.Fatalf("got grpcAddr %q and NATS url %q from the scaler's logs, want both", s.grpcAddr, s.natsURL)
	}
	return s
}

// publishedLine is what `gpuscaler publish` prints once the stream has stored a report.
var publishedLine = regexp.MustCompile(`^published to (\S+) \(stream (\S+), sequence (\d+)\)$`)

// publishQueue publishes one QueueReport with `gpuscaler publish queue` and returns the
// stream sequence it was stored at.
func (s *scalerProc) publishQueue(t *testing.T, namespace, queue string, waiting, inFlight uint64) uint64 {
	t.Helper()
	cmd := s.publishQueueCmd(t.Context(), namespace, queue, waiting, inFlight)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(cmd.Args, " "), err, out)
	}
	return parsePublished(t, string(out))
}

func (s *scalerProc) publishQueueCmd(ctx context.Context, namespace, queue string, waiting, inFlight uint64) *exec.Cmd {
	return exec.CommandContext(ctx, gpuscalerBin, "publish", "queue", "--nats-url", s.natsURL,
		"--namespace", namespace, "--queue", queue,
		"--waiting", strconv.FormatUint(waiting, 10), "--in-flight", strconv.FormatUint(inFlight, 10))
}

func parsePublished(t *testing.T, out string) uint64 {
	t.Helper()
	m := publishedLine.FindStringSubmatch(strings.TrimSpace(out))
	if m == nil {
		t.Fatalf("got publish output %q, want %q", out, publishedLine)
	}
	seq, err := strconv.ParseUint(m[3], 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return seq
}

// stream opens the stream name (streamName or queueStreamName) of the scaler's NATS
// server, to see what it stored and when.
func (s *scalerProc) stream(t *testing.T, name string) jetstream.Stream {
	t.Helper()
	nc, err := nats.Connect(s.natsURL, nats.Name("keda-conformance"))
	if err != nil {
		t.Fatalf("connect to NATS at %s: %v", s.natsURL, err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	st, err := js.Stream(t.Context(), name)
	if err != nil {
		t.Fatalf("stream %s: %v", name, err)
	}
	return st
}

// simNode is a simulated GPU node for `gpuscaler collector --source sim`, in the form of
// its --sim-config file (collector/sim.Config).
type simNode struct {
	GPUs   int      `json:"gpus"`
	Pods   []simPod `json:"pods,omitempty"`
	Jitter float64  `json:"jitter"` // 0: readings exactly as configured
}

type simPod struct {
	Namespace string            `json:"namespace"`
	Name      string            `json:"name"`
	Labels    map[string]string `json:"labels,omitempty"`
	GPUs      []string          `json:"gpus"`
	Util      float64           `json:"util"`
}

// startCollectors runs one simulated-GPU collector per node, publishing to the scaler's
// NATS, and waits until the stream holds a report from every one of them.
func (s *scalerProc) startCollectors(t *testing.T, nodes map[string]simNode) {
	t.Helper()
	dir := t.TempDir()
	for name, node := range nodes {
		data, err := json.Marshal(node)
		if err != nil {
			t.Fatal(err)
		}
		file := testkit.WriteFile(t, dir, name+".json", data)
		startProcess(t, "collector "+name, true, "collector", "--source", "sim", "--sim-config", file,
			"--node", name, "--collector-id", "keda-conformance-"+name, "--interval", "250ms",
			"--kubeconfig", "none", "--http-addr", "-", "--nats-url", s.natsURL, "--log-format", "json")
	}
	st := s.stream(t, streamName)
	for name := range nodes {
		testkit.Eventually(t, startTimeout, func(context.Context) error {
			_, err := st.GetLastMsgForSubject(t.Context(), nodeSubjectPrefix+name)
			return err
		})
	}
}

// trigger is one trigger of a ScaledObject or ScaledJob, as KEDA holds it.
type trigger struct {
	kind       string // "ScaledObject" (default) or "ScaledJob"
	namespace  string // default "default"
	name       string // the ScaledObject's name; default "app"
	index      int    // position in spec.triggers
	metadata   map[string]string
	auth       map[string]string // from a TriggerAuthentication
	env        map[string]string // the workload's environment, for <key>FromEnv
	metricType v2.MetricTargetType
}

// config builds the ScalerConfig KEDA's scale handler builds for t
// (pkg/scaling/scalers_builder.go), pointed at this scaler.
func (s *scalerProc) config(t trigger, triggerType string) *scalersconfig.ScalerConfig {
	t.kind = cmp.Or(t.kind, "ScaledObject")
	t.namespace = cmp.Or(t.namespace, "default")
	t.name = cmp.Or(t.name, "app")
	meta := map[string]string{"scalerAddress": s.grpcAddr}
	maps.Copy(meta, t.metadata)
	auth := map[string]string{}
	maps.Copy(auth, t.auth)
	env := map[string]string{}
	maps.Copy(env, t.env)
	return &scalersconfig.ScalerConfig{
		ScalableObjectName:      t.name,
		ScalableObjectNamespace: t.namespace,
		ScalableObjectType:      t.kind,
		TriggerMetadata:         meta,
		TriggerType:             triggerType,
		ResolvedEnv:             env,
		AuthParams:              auth,
		GlobalHTTPTimeout:       3 * time.Second, // KEDA's default --http-timeout (KEDA_HTTP_DEFAULT_TIMEOUT)
		TriggerIndex:            t.index,
		MetricType:              t.metricType,
		TriggerUniqueKey:        fmt.Sprintf("%s-%s-%s-%d", t.kind, t.namespace, t.name, t.index),
	}
}

// external builds KEDA's `external` scaler for t, closed when the test ends.
func (s *scalerProc) external(t *testing.T, tr trigger) scalers.Scaler {
	t.Helper()
	sc, err := scalers.NewExternalScaler(s.config(tr, "external"))
	if err != nil {
		t.Fatalf("NewExternalScaler: %v", err)
	}
	t.Cleanup(func() { _ = sc.Close(context.Background()) })
	return sc
}

// push builds KEDA's `external-push` scaler for t, runs it as KEDA's scale loop does
// and returns the channel Run delivers activations on. The cleanup stops Run and waits
// for it to close the channel.
func (s *scalerProc) push(t *testing.T, tr trigger) <-chan bool {
	t.Helper()
	sc, err := scalers.NewExternalPushScaler(s.config(tr, "external-push"))
	if err != nil {
		t.Fatalf("NewExternalPushScaler: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	active := make(chan bool)
	go sc.Run(ctx, active)
	t.Cleanup(func() {
		cancel()
		for range active { // Run closes it when it returns
		}
		_ = sc.Close(context.Background())
	})
	return active
}

// metric calls KEDA's GetMetricsAndActivity for name and returns the one value it must
// give, in milli-units (as KEDA hands it to the HPA), and the activity.
func metric(t *testing.T, sc scalers.Scaler, name string) (milli int64, active bool, err error) {
	t.Helper()
	values, active, err := sc.GetMetricsAndActivity(t.Context(), name)
	if err != nil {
		return 0, false, err
	}
	if len(values) != 1 || values[0].MetricName != name {
		t.Fatalf("GetMetricsAndActivity(%q) gave %d values %v, want one named %q", name, len(values), values, name)
	}
	return values[0].Value.MilliValue(), active, nil
}
