// Command httpaddon-compare measures gpuscaler's gateway beside the KEDA HTTP add-on
// (its interceptor and its scaler, v0.15.0, built through the module proxy), in one run
// on one machine, against the same backend and the same load:
//
//   - wake: a request arrives for a Service with no ready endpoint; how long until KEDA,
//     streaming StreamIsActive with its own externalscaler client, is told active;
//   - added latency: p50 and p99 at a fixed arrival rate, through each and directly;
//   - the most requests a second, through each and directly.
//
// Each runs as it ships, with its defaults: the add-on's scaler polls its interceptors'
// /queue every 500 ms and ticks StreamIsActive every 200 ms; gpuscaler's gateway reports
// the first request at an empty queue at once and its scaler pushes. Both read the same
// kube-apiserver (etcd beside it) for their routes' EndpointSlices; each proxy is a
// process of its own; the load and the backend share this one.
//
// The add-on's scaler finds its interceptors by the addresses of their EndpointSlice, and
// the API server refuses loopback ones; its interceptor dials a Service by its name. So
// this must run where 10.244.0.10 (the interceptor) and 10.244.0.20 (the backend) are
// local addresses and llm.bench and llm.bench.svc name 10.244.0.20:
// hack/httpaddon-compare.sh runs it so, in a network and mount namespace of its own, and
// writes its table into docs/gateway.md. Run from the e2e module's folder.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/kedacore/keda/v2/pkg/scalers/externalscaler"

	"github.com/gpuscaler/gpuscaler/test/e2e/cluster"

	"github.com/gpuscaler/gpuscaler/test/testkit"
)

// The addresses the namespace this runs in must give it (hack/httpaddon-compare.sh).
const (
	interceptorIP = "10.244.0.10"
	backendIP     = "10.244.0.20"
	backendPort   = 8000
	ns            = "bench"
	service       = "llm"
	// host is what clients send: the add-on's interceptor routes by it.
	host = service + "." + ns
)

var (
	buildOnly = flag.Bool("build-only", false, "build (or find cached) every binary, then exit: the network namespace has no module proxy")
	trials    = flag.Int("trials", 40, "wakes measured on each side")
	rate      = flag.Int("rate", 1000, "arrivals a second of the latency runs")
	requests  = flag.Int("requests", 5000, "requests in each latency run")
	rounds    = flag.Int("rounds", 5, "latency and throughput runs on each path; the median is reported")
	workers   = flag.Int("workers", 64, "closed-loop clients of the throughput runs")
	tputFor   = flag.Duration("throughput-for", 3*time.Second, "length of each throughput run")
	serves    = flag.String("serve", "0s,5ms", "how long the backend takes to answer, one latency and throughput set each, comma-separated")
	goneFor   = flag.Duration("gone-for", 10*time.Second, "how long to wait for a scaler to drop a held request whose client went away")
	keep      = flag.Bool("keep", false, "keep the run's folder (every process's log)")
)

func main() {
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), `Usage: httpaddon-compare [flags]

Measures gpuscaler's gateway beside the KEDA HTTP add-on's interceptor and scaler: the
time from a first request at zero to KEDA told active, the added latency and the most
requests a second. Prints a Markdown table on standard output, progress on standard error.
Run it through hack/httpaddon-compare.sh, which gives it the network it needs.

Flags:
`)
		flag.PrintDefaults()
	}
	flag.Parse()
	// The load's own garbage collection is noise on every path alike; less of it.
	debug.SetGCPercent(400)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "httpaddon-compare:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context) error {
	var serveTimes []time.Duration
	for s := range strings.SplitSeq(*serves, ",") {
		d, err := time.ParseDuration(strings.TrimSpace(s))
		if err != nil || d < 0 {
			return fmt.Errorf("--serve: %q is not a duration of 0 or more", s)
		}
		serveTimes = append(serveTimes, d)
	}
	if *trials < 2 || *rate < 1 || *requests < 100 || *rounds < 1 || *workers < 1 {
		return errors.New("--trials must be 2 or more, --requests 100 or more, --rate, --rounds and --workers 1 or more")
	}
	e2eRoot, err := os.Getwd()
	if err != nil {
		return err
	}
	if _, err := os.Stat(filepath.Join(e2eRoot, "tools", "httpaddon", "go.mod")); err != nil {
		return fmt.Errorf("run from the e2e module's folder (test/e2e): %w", err)
	}
	repoRoot := filepath.Clean(filepath.Join(e2eRoot, "..", ".."))
	log := os.Stderr
	dir, err := os.MkdirTemp("", "httpaddon-compare-")
	if err != nil {
		return err
	}
	defer func() {
		if *keep {
			fmt.Fprintln(log, "kept", dir)
		} else {
			os.RemoveAll(dir)
		}
	}()
	b := &cluster.Builder{E2ERoot: e2eRoot, CacheDir: cluster.DefaultCacheDir(repoRoot), Log: log}
	bins := map[string]string{}
	for _, t := range []cluster.Tool{cluster.Etcd, cluster.KubeAPIServer, cluster.HTTPAddOnInterceptor, cluster.HTTPAddOnScaler} {
		if bins[t.Name], err = b.Build(ctx, t); err != nil {
			return err
		}
	}
	gpuscalerBin := filepath.Join(cluster.DefaultCacheDir(repoRoot), "bin", "gpuscaler-compare")
	if *buildOnly {
		if err := os.MkdirAll(filepath.Dir(gpuscalerBin), 0o755); err != nil {
			return err
		}
		built, err := cluster.BuildGpuscaler(ctx, repoRoot, dir, log)
		if err != nil {
			return err
		}
		return copyFile(built, gpuscalerBin)
	}
	if _, err := os.Stat(gpuscalerBin); err != nil {
		return fmt.Errorf("no gpuscaler binary at %s: run with --build-only first (hack/httpaddon-compare.sh does)", gpuscalerBin)
	}
	if err := checkNetwork(); err != nil {
		return err
	}

	logDir := filepath.Join(dir, "logs")
	if err := os.MkdirAll(logDir, 0o755); err != nil {
		return err
	}
	procs := &cluster.Procs{LogDir: logDir, Log: log}
	defer procs.StopAll()
	fmt.Fprintln(log, "starting etcd and kube-apiserver ...")
	cp, err := cluster.StartControlPlane(ctx, procs, cluster.ControlPlaneOptions{EtcdBin: bins["etcd"], APIServerBin: bins["kube-apiserver"], Dir: dir})
	if err != nil {
		return err
	}
	kube, err := kubernetes.NewForConfig(cp.Config)
	if err != nil {
		return err
	}
	addonDir, err := cluster.ModuleDir(ctx, filepath.Join(e2eRoot, cluster.HTTPAddOnInterceptor.Module), "github.com/kedacore/http-add-on")
	if err != nil {
		return err
	}
	if err := cluster.ApplyCRDs(ctx, cp, filepath.Join(addonDir, "config", "crd", "bases")); err != nil {
		return err
	}
	if err := cluster.CreateNamespace(ctx, kube, ns); err != nil {
		return err
	}

	be, err := startBackend()
	if err != nil {
		return err
	}
	defer be.srv.Close()
	adminPort, err := cluster.FreePort()
	if err != nil {
		return err
	}
	if err := setup(ctx, kube, cp, adminPort); err != nil {
		return err
	}

	fmt.Fprintln(log, "starting the add-on's interceptor and scaler, gpuscaler's scaler and gateway ...")
	addon, err := startAddOn(ctx, procs, cp, bins, adminPort)
	if err != nil {
		return err
	}
	ours, err := startGpuscaler(ctx, procs, cp, gpuscalerBin, dir)
	if err != nil {
		return err
	}
	measuring.Store(true)
	defer measuring.Store(false)
	sides := []*side{addon, ours}
	for _, s := range sides {
		if err := s.watch(ctx); err != nil {
			return err
		}
	}

	fmt.Fprintf(log, "wake: %d requests at zero on each side ...\n", *trials)
	for i := range *trials {
		for j := range sides {
			s := sides[(i+j)%len(sides)] // alternate who goes first
			d, err := s.wakeOnce(ctx, kube)
			if err != nil {
				return fmt.Errorf("%s: wake %d: %w", s.name, i+1, err)
			}
			s.wakes = append(s.wakes, d)
		}
	}

	if err := setReady(ctx, kube, service, backendIP, backendPort, true); err != nil {
		return err
	}
	paths := []*path{
		{name: "direct", url: fmt.Sprintf("http://%s:%d", backendIP, backendPort)},
		{name: addon.name, url: addon.proxyURL},
		{name: ours.name, url: ours.proxyURL},
	}
	for _, p := range paths {
		p.client = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1024, MaxIdleConns: 1024}}
		if err := cluster.Eventually(ctx, 30*time.Second, 50*time.Millisecond, p.name+" answers", nil, func(context.Context) (bool, error) {
			return p.post(ctx) == nil, nil
		}); err != nil {
			return err
		}
	}
	var sets []loadSet
	for _, serve := range serveTimes {
		be.serve.Store(int64(serve))
		set := loadSet{serve: serve, lat: map[string][]latency{}, tput: map[string][]float64{}}
		fmt.Fprintf(log, "load, backend taking %s: warming up ...\n", serve)
		for _, p := range paths {
			if _, err := openLoop(ctx, p, *rate, *rate/2); err != nil {
				return err
			}
		}
		for r := range *rounds {
			for j := range paths {
				p := paths[(r+j)%len(paths)]
				l, err := openLoop(ctx, p, *rate, *requests)
				if err != nil {
					return err
				}
				set.lat[p.name] = append(set.lat[p.name], l)
				fmt.Fprintf(log, "  round %d, %s: p50 %s, p99 %s at %d/s\n", r+1, p.name, l.p50, l.p99, *rate)
			}
			for j := range paths {
				p := paths[(r+j)%len(paths)]
				t, err := mostPerSecond(ctx, p, *workers, *tputFor)
				if err != nil {
					return err
				}
				set.tput[p.name] = append(set.tput[p.name], t)
				fmt.Fprintf(log, "  round %d, %s: %.0f requests/s, %d clients\n", r+1, p.name, t, *workers)
			}
		}
		sets = append(sets, set)
	}
	if err := setReady(ctx, kube, service, backendIP, backendPort, false); err != nil {
		return err
	}
	fmt.Fprintln(log, "a held request whose client goes away ...")
	for _, s := range sides {
		if s.gone, err = s.goneOnce(ctx, *goneFor); err != nil {
			return fmt.Errorf("%s: %w", s.name, err)
		}
	}
	table(os.Stdout, addon, ours, sets)
	return nil
}

// checkNetwork says what is missing when this runs outside the namespace it needs.
func checkNetwork() error {
	const why = "run through hack/httpaddon-compare.sh, which makes a network namespace where"
	for _, ip := range []string{interceptorIP, backendIP} {
		l, err := net.Listen("tcp", ip+":0")
		if err != nil {
			return fmt.Errorf("%s is not a local address (%w): %s it is", ip, err, why)
		}
		l.Close()
	}
	for _, name := range []string{host, host + ".svc"} {
		addrs, _ := net.LookupHost(name)
		if !slices.Contains(addrs, backendIP) {
			return fmt.Errorf("%s does not resolve to %s: %s it does", name, backendIP, why)
		}
	}
	return nil
}

// backend answers like a small model server: after serve, a chat completion.
type backend struct {
	srv   *http.Server
	serve atomic.Int64 // time.Duration
}

func startBackend() (*backend, error) {
	l, err := net.Listen("tcp", fmt.Sprintf("%s:%d", backendIP, backendPort))
	if err != nil {
		return nil, err
	}
	be := &backend{}
	be.srv = &http.Server{ReadHeaderTimeout: time.Minute, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		if d := time.Duration(be.serve.Load()); d > 0 {
			// The model's work: a service time both proxies hold the request through, not
			// a wait for anything, so a sleep.
			time.Sleep(d)
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}]}`))
	})}
	go func() { _ = be.srv.Serve(l) }()
	return be, nil
}

// setup makes the Services both proxies read and the add-on's HTTPScaledObject. The
// backend's EndpointSlice is written here as the EndpointSlice controller writes it
// (this run has no controller manager): one endpoint, not ready until the load phase.
// The interceptors' admin Service's slice lists the interceptor, ready.
func setup(ctx context.Context, kube kubernetes.Interface, cp *cluster.ControlPlane, adminPort int) error {
	for name, port := range map[string]int{service: backendPort, "keda-http-interceptor-admin": adminPort} {
		_, err := kube.CoreV1().Services(ns).Create(ctx, &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: corev1.ServiceSpec{
				Selector: map[string]string{"app": name},
				Ports:    []corev1.ServicePort{{Name: "http", Port: int32(port), TargetPort: intstr.FromInt(port)}},
			},
		}, metav1.CreateOptions{})
		if err != nil {
			return err
		}
	}
	if err := setReady(ctx, kube, service, backendIP, backendPort, false); err != nil {
		return err
	}
	if err := setReady(ctx, kube, "keda-http-interceptor-admin", interceptorIP, adminPort, true); err != nil {
		return err
	}
	dyn, err := dynamic.NewForConfig(cp.Config)
	if err != nil {
		return err
	}
	httpso := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "http.keda.sh/v1alpha1",
		"kind":       "HTTPScaledObject",
		"metadata":   map[string]any{"name": service, "namespace": ns},
		"spec": map[string]any{
			"hosts": []any{host},
			"scaleTargetRef": map[string]any{
				"apiVersion": "apps/v1", "kind": "Deployment", "name": service,
				"service": service, "port": int64(backendPort),
			},
			"replicas": map[string]any{"min": int64(0), "max": int64(10)},
		},
	}}
	gvr := schema.GroupVersionResource{Group: "http.keda.sh", Version: "v1alpha1", Resource: "httpscaledobjects"}
	_, err = dyn.Resource(gvr).Namespace(ns).Create(ctx, httpso, metav1.CreateOptions{})
	return err
}

// setReady writes the one EndpointSlice of a Service: its endpoint at ip:port, ready or
// not.
func setReady(ctx context.Context, kube kubernetes.Interface, svc, ip string, port int, ready bool) error {
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: svc + "-1", Labels: map[string]string{discoveryv1.LabelServiceName: svc}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints: []discoveryv1.Endpoint{{
			Addresses:  []string{ip},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(ready), Serving: ptr.To(ready), Terminating: ptr.To(false)},
		}},
		Ports: []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To(int32(port)), Protocol: ptr.To(corev1.ProtocolTCP)}},
	}
	slices := kube.DiscoveryV1().EndpointSlices(ns)
	old, err := slices.Get(ctx, slice.Name, metav1.GetOptions{})
	if err != nil {
		_, err = slices.Create(ctx, slice, metav1.CreateOptions{})
		return err
	}
	slice.ResourceVersion = old.ResourceVersion
	_, err = slices.Update(ctx, slice, metav1.UpdateOptions{})
	return err
}

// measuring is true while the figures are taken: a stream that ends then is news.
var measuring atomic.Bool

// side is one of the two systems: a proxy clients send to, and a scaler KEDA streams.
type side struct {
	name     string
	proxyURL string
	scaler   string // gRPC address
	ref      *externalscaler.ScaledObjectRef

	actives chan time.Time // when each true message of the stream arrived

	wakes []time.Duration
	// gone is how long the scaler went on counting a held request after its client went
	// away; -1: still after --gone-for.
	gone time.Duration
}

func startAddOn(ctx context.Context, procs *cluster.Procs, cp *cluster.ControlPlane, bins map[string]string, adminPort int) (*side, error) {
	proxyPort, err := cluster.FreePort()
	if err != nil {
		return nil, err
	}
	grpcPort, err := cluster.FreePort()
	if err != nil {
		return nil, err
	}
	kubeconfig := "KUBECONFIG=" + cp.Kubeconfig
	// Each serves its OpenTelemetry Prometheus exporter, on by default; on ports of
	// their own here, since both default to 2223.
	icPort, err := cluster.FreePort()
	if err != nil {
		return nil, err
	}
	scPort, err := cluster.FreePort()
	if err != nil {
		return nil, err
	}
	ic, err := procs.Start("keda-http-interceptor", bins["keda-http-interceptor"], nil, kubeconfig,
		fmt.Sprintf("KEDA_HTTP_PROXY_PORT=%d", proxyPort), fmt.Sprintf("KEDA_HTTP_ADMIN_PORT=%d", adminPort),
		"KEDA_HTTP_WATCH_NAMESPACE="+ns, fmt.Sprintf("OTEL_PROM_EXPORTER_PORT=%d", icPort))
	if err != nil {
		return nil, err
	}
	sc, err := procs.Start("keda-http-scaler", bins["keda-http-scaler"], nil, kubeconfig,
		fmt.Sprintf("KEDA_HTTP_SCALER_PORT=%d", grpcPort),
		"KEDA_HTTP_SCALER_TARGET_ADMIN_NAMESPACE="+ns,
		"KEDA_HTTP_SCALER_TARGET_ADMIN_SERVICE=keda-http-interceptor-admin",
		"KEDA_HTTP_SCALER_TARGET_ADMIN_DEPLOYMENT=keda-http-interceptor",
		fmt.Sprintf("KEDA_HTTP_SCALER_TARGET_ADMIN_PORT=%d", adminPort),
		fmt.Sprintf("OTEL_PROM_EXPORTER_PORT=%d", scPort))
	if err != nil {
		return nil, err
	}
	s := &side{
		name:     "KEDA HTTP add-on " + cluster.HTTPAddOnInterceptor.Version,
		proxyURL: fmt.Sprintf("http://127.0.0.1:%d", proxyPort),
		scaler:   fmt.Sprintf("127.0.0.1:%d", grpcPort),
		ref:      &externalscaler.ScaledObjectRef{Name: service, Namespace: ns, ScalerMetadata: map[string]string{"httpScaledObject": service}},
	}
	// Ready when the interceptor's admin server answers /queue and the scaler's
	// IsActive reads the HTTPScaledObject.
	adminURL := fmt.Sprintf("http://%s:%d/queue", interceptorIP, adminPort)
	if err := cluster.Eventually(ctx, time.Minute, 100*time.Millisecond, "the interceptor's /queue", ic, func(ctx context.Context) (bool, error) {
		resp, err := http.Get(adminURL)
		if err != nil {
			return false, cluster.Retry(err)
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, nil
	}); err != nil {
		return nil, err
	}
	if err := cluster.Eventually(ctx, time.Minute, 100*time.Millisecond, "the add-on scaler's IsActive", sc, func(ctx context.Context) (bool, error) {
		_, err := s.isActive(ctx)
		return err == nil, cluster.Retry(err)
	}); err != nil {
		return nil, err
	}
	return s, nil
}

func startGpuscaler(ctx context.Context, procs *cluster.Procs, cp *cluster.ControlPlane, bin, dir string) (*side, error) {
	scaler, g, err := cluster.StartEmbeddedScaler(ctx, procs, bin, dir)
	if err != nil {
		return nil, err
	}
	gw, err := g.StartGateway(ctx, cluster.GatewayOptions{
		Namespace: ns, Kubeconfig: cp.Kubeconfig, ProducerID: "gateway-0", ReportInterval: time.Second, LogLevel: "info",
		Routes: fmt.Sprintf("routes:\n- {name: llm, service: {name: %s, port: %d}, queue: llm-requests, holdTimeout: 5m}\n", service, backendPort),
	})
	if err != nil {
		return nil, err
	}
	s := &side{
		name:     "gpuscaler gateway",
		proxyURL: "http://" + gw.Addr,
		scaler:   scaler.GRPCAddr,
		// pushInterval 0s: the trials wake the Service seconds apart, with no KEDA to
		// scale it to zero between them; in a cluster each wake from zero comes at least
		// a cooldownPeriod after the last push, which the default pushInterval never holds.
		ref: &externalscaler.ScaledObjectRef{Name: service, Namespace: ns, ScalerMetadata: map[string]string{"queue": "llm-requests", "pushInterval": "0s"}},
	}
	// Ready when the gateway's first (empty) report has reached the scaler.
	if err := cluster.Eventually(ctx, time.Minute, 100*time.Millisecond, "gpuscaler's IsActive", gw.Process, func(ctx context.Context) (bool, error) {
		_, err := s.isActive(ctx)
		return err == nil, cluster.Retry(err)
	}); err != nil {
		return nil, err
	}
	return s, nil
}

func (s *side) client() (externalscaler.ExternalScalerClient, func(), error) {
	conn, err := grpc.NewClient(s.scaler, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, nil, err
	}
	return externalscaler.NewExternalScalerClient(conn), func() { conn.Close() }, nil
}

func (s *side) isActive(ctx context.Context) (bool, error) {
	c, done, err := s.client()
	if err != nil {
		return false, err
	}
	defer done()
	resp, err := c.IsActive(ctx, s.ref)
	return resp.GetResult(), err
}

// watch opens the StreamIsActive that KEDA keeps open to an external-push scaler, for
// the rest of the run.
func (s *side) watch(ctx context.Context) error {
	c, _, err := s.client()
	if err != nil {
		return err
	}
	stream, err := c.StreamIsActive(ctx, s.ref)
	if err != nil {
		return err
	}
	s.actives = make(chan time.Time, 64)
	go func() {
		for {
			resp, err := stream.Recv()
			if err != nil {
				if measuring.Load() {
					fmt.Fprintf(os.Stderr, "%s: StreamIsActive ended: %v\n", s.name, err)
				}
				return
			}
			at := time.Now()
			if resp.GetResult() {
				select {
				case s.actives <- at:
				default:
				}
			}
		}
	}()
	return nil
}

// wakeOnce is one wake from zero: it waits until the scaler says inactive (asked with
// IsActive, as KEDA polls: gpuscaler pushes only true, since KEDA ignores a pushed
// false), lets a random part of a second pass (so that requests fall anywhere in a
// poller's period), sends one request and takes the time until the stream says active.
// Then the backend's endpoint turns ready, the held request is answered, and the
// endpoint goes again: the service is back at zero.
func (s *side) wakeOnce(ctx context.Context, kube kubernetes.Interface) (time.Duration, error) {
	if err := cluster.Eventually(ctx, 30*time.Second, 20*time.Millisecond, s.name+" inactive", nil, func(ctx context.Context) (bool, error) {
		active, err := s.isActive(ctx)
		return err == nil && !active, nil
	}); err != nil {
		return 0, err
	}
	// Pacing, not a wait for a state (inactive is awaited above with a deadline): the
	// request goes at a random phase of a poller's period, so the wakes sample every
	// phase rather than line up with the polls.
	time.Sleep(200*time.Millisecond + time.Duration(rand.Int64N(int64(time.Second))))
	for len(s.actives) > 0 {
		<-s.actives
	}
	p := &path{name: s.name, url: s.proxyURL, client: http.DefaultClient}
	answered := make(chan error, 1)
	sent := time.Now()
	go func() { answered <- p.post(ctx) }()
	var took time.Duration
	select {
	case at := <-s.actives:
		took = at.Sub(sent)
	case err := <-answered:
		return 0, fmt.Errorf("answered while the backend had no ready endpoint (%v)", err)
	case <-time.After(30 * time.Second):
		return 0, errors.New("the stream did not say active within 30s of a request")
	case <-ctx.Done():
		return 0, ctx.Err()
	}
	if err := setReady(ctx, kube, service, backendIP, backendPort, true); err != nil {
		return 0, err
	}
	select {
	case err := <-answered:
		if err != nil {
			return 0, fmt.Errorf("the held request: %w", err)
		}
	case <-time.After(30 * time.Second):
		return 0, errors.New("the held request was not answered within 30s of a ready endpoint")
	}
	return took, setReady(ctx, kube, service, backendIP, backendPort, false)
}

// goneOnce sends a request while the backend has no ready endpoint, waits until the
// stream says active, and then the client goes away (its connection closes): it returns
// how long the scaler goes on saying active, or -1 if it still does after limit. A
// model server woken for a request nobody waits for any more costs a GPU for nothing.
func (s *side) goneOnce(ctx context.Context, limit time.Duration) (time.Duration, error) {
	if err := cluster.Eventually(ctx, 30*time.Second, 20*time.Millisecond, s.name+" inactive", nil, func(ctx context.Context) (bool, error) {
		active, err := s.isActive(ctx)
		return err == nil && !active, nil
	}); err != nil {
		return 0, err
	}
	for len(s.actives) > 0 {
		<-s.actives
	}
	reqCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	p := &path{name: s.name, url: s.proxyURL, client: &http.Client{Transport: tr}}
	go func() { _ = p.post(reqCtx) }()
	select {
	case <-s.actives:
	case <-time.After(30 * time.Second):
		return 0, errors.New("the stream did not say active within 30s of a request")
	}
	cancel()
	gone := time.Now()
	err := cluster.Eventually(ctx, limit, 20*time.Millisecond, "inactive", nil, func(ctx context.Context) (bool, error) {
		active, err := s.isActive(ctx)
		return err == nil && !active, nil
	})
	if err != nil {
		return -1, nil
	}
	return time.Since(gone), nil
}

// body is a chat completion request, the same on every path.
const body = `{"model":"llm","messages":[{"role":"user","content":"Say hi."}],"max_tokens":8}`

// path is where the load goes: the backend directly, or through one of the proxies.
type path struct {
	name   string
	url    string
	client *http.Client
}

func (p *path) post(ctx context.Context) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, p.url+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		return err
	}
	req.Host = host
	req.Header.Set("Content-Type", "application/json")
	resp, err := p.client.Do(req)
	if err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: status %d", p.name, resp.StatusCode)
	}
	return nil
}

type latency struct{ p50, p99 time.Duration }

// openLoop sends n requests at rate a second, open loop (testkit.OpenLoop), and returns
// the percentiles of their latencies.
func openLoop(ctx context.Context, p *path, rate, n int) (latency, error) {
	lat, err := testkit.OpenLoop(ctx, rate, n, p.post)
	if err != nil {
		return latency{}, fmt.Errorf("%s: %w", p.name, err)
	}
	return latency{p50: lat[n/2], p99: lat[n*99/100]}, nil
}

// mostPerSecond runs workers closed-loop clients for d and returns the requests answered
// a second.
func mostPerSecond(ctx context.Context, p *path, workers int, d time.Duration) (float64, error) {
	return testkit.ClosedLoop(ctx, workers, d, p.post)
}

// loadSet is what the load phase measured with the backend taking serve.
type loadSet struct {
	serve time.Duration
	lat   map[string][]latency // by path, one a round
	tput  map[string][]float64
}

func median[T time.Duration | float64](xs []T) T {
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}

func ms(d time.Duration) string {
	switch {
	case d >= 100*time.Millisecond:
		return fmt.Sprintf("%.0f ms", float64(d)/1e6)
	case d >= 10*time.Millisecond:
		return fmt.Sprintf("%.1f ms", float64(d)/1e6)
	default:
		return fmt.Sprintf("%.2f ms", float64(d)/1e6)
	}
}

func pct(xs []time.Duration, q int) time.Duration {
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[(len(s)-1)*q/100]
}

// table prints the Markdown table docs/gateway.md shows.
func table(w io.Writer, addon, ours *side, sets []loadSet) {
	fmt.Fprintf(w, "| figure | %s | %s |\n| --- | --- | --- |\n", ours.name, addon.name)
	fmt.Fprintf(w, "| first request at zero → KEDA told active (StreamIsActive), p50 / p99 of %d | %s / %s | %s / %s |\n",
		len(ours.wakes), ms(pct(ours.wakes, 50)), ms(pct(ours.wakes, 99)), ms(pct(addon.wakes, 50)), ms(pct(addon.wakes, 99)))
	gone := func(d time.Duration) string {
		if d < 0 {
			return fmt.Sprintf("still counted after %s", *goneFor)
		}
		return ms(d)
	}
	fmt.Fprintf(w, "| a held request (POST) whose client goes away → KEDA told inactive | %s | %s |\n", gone(ours.gone), gone(addon.gone))
	for _, set := range sets {
		what := "answering at once"
		if set.serve > 0 {
			what = "taking " + set.serve.String()
		}
		p99s := func(name string) (p50, p99 time.Duration) {
			var a, b []time.Duration
			for _, l := range set.lat[name] {
				a, b = append(a, l.p50), append(b, l.p99)
			}
			return median(a), median(b)
		}
		_, direct := p99s("direct")
		cell := func(name string) string {
			p50, p99 := p99s(name)
			return fmt.Sprintf("%.2f× direct (%s; p50 %s)", float64(p99)/float64(direct), ms(p99), ms(p50))
		}
		fmt.Fprintf(w, "| latency, p99 at %d requests/s, backend %s (direct: %s) | %s | %s |\n",
			*rate, what, ms(direct), cell(ours.name), cell(addon.name))
		tput := func(name string) string {
			x := median(set.tput[name])
			return fmt.Sprintf("%.2f× direct (%.0f)", x/median(set.tput["direct"]), x)
		}
		fmt.Fprintf(w, "| most requests/s, %d clients, backend %s (direct: %.0f) | %s | %s |\n",
			*workers, what, median(set.tput["direct"]), tput(ours.name), tput(addon.name))
	}
	cpu := "?"
	if data, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for line := range strings.SplitSeq(string(data), "\n") {
			if v, ok := strings.CutPrefix(line, "model name"); ok {
				cpu = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(v), ":"))
				break
			}
		}
	}
	fmt.Fprintf(w, "\nMeasured by `hack/httpaddon-compare.sh` on %d cores of an %s, %s: each proxy and scaler its own process, with its shipped defaults; the load and the backend in a third; each figure the median of %d rounds (latency: %d requests each; throughput: %s each), the paths taking turns.\n",
		runtime.NumCPU(), cpu, time.Now().UTC().Format(time.DateOnly), *rounds, *requests, *tputFor)
}

func copyFile(from, to string) error {
	data, err := os.ReadFile(from)
	if err != nil {
		return err
	}
	tmp := to + ".tmp"
	if err := os.WriteFile(tmp, data, 0o755); err != nil {
		return err
	}
	return os.Rename(tmp, to)
}
