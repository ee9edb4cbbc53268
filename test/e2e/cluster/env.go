// Package cluster starts, on loopback, a real Kubernetes control plane (etcd,
// kube-apiserver, kube-controller-manager, kube-scheduler), KEDA's operator and metrics
// adapter, kwok's fake GPU nodes, a nats-server, a NATS cluster of three and gpuscaler,
// all from binaries it builds through the Go module proxy and caches by version, and
// stops them all again.
//
// Nothing here fakes Kubernetes, KEDA or NATS. No container runs: kwok plays the fake
// nodes' kubelet, and a gpuscaler collector per fake node (--sim-from-cluster) hands out
// its GPUs as the kubelet's device manager would and serves the kubelet's pod-resources
// API.
package cluster

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"k8s.io/client-go/kubernetes"

	kedaclient "github.com/kedacore/keda/v2/pkg/generated/clientset/versioned"
)

// Env is the whole running system.
type Env struct {
	Procs *Procs
	// RepoRoot is the gpuscaler repository (its committed renderings of the chart).
	RepoRoot string
	CP       *ControlPlane
	KEDA     *KEDA
	NATS     *NATS
	// G runs gpuscaler's binary against NATS; Scaler is the scaler most triggers point at.
	G      *Gpuscaler
	Scaler *Scaler
	// Embedded is a second scaler as `make run` starts it, with its own embedded NATS
	// server (no --nats-url); GEmbedded publishes to that server.
	Embedded  *Scaler
	GEmbedded *Gpuscaler

	Kube    kubernetes.Interface
	KEDACli kedaclient.Interface

	// The whole loop (issue 11): kube-controller-manager and kube-scheduler, KEDA's
	// metrics adapter behind the aggregation layer, kwok for fake GPU nodes, and a NATS
	// cluster of three with two scaler replicas behind a headless Service's name
	// (Scalers.Address). GCluster runs gpuscaler's binary against that cluster.
	Controllers *Controllers
	Adapter     *MetricsAdapter
	Kwok        *Kwok
	NATSCluster *NATSCluster
	DNS         *DNS
	GCluster    *Gpuscaler
	Scalers     *ScalerSet

	// Dir is the run's folder (stores, certificates, logs).
	Dir string
	// NATSBin is the nats-server binary, for tests that run a NATS of their own.
	NATSBin string
}

// Options say where things are.
type Options struct {
	// RepoRoot is the gpuscaler repository; E2ERoot the e2e module in it.
	RepoRoot, E2ERoot string
	// CacheDir caches built binaries (DefaultCacheDir).
	CacheDir string
	// Dir is the run's folder, made by the caller.
	Dir string
	// ScalerFlags are extra flags for gpuscaler scaler.
	ScalerFlags []string
	Log         io.Writer
}

// Binaries are the paths of everything the suite runs.
type Binaries struct {
	Etcd, APIServer, ControllerManager, Scheduler, KEDAOperator, KEDAAdapter, Kwok, NATSServer, Gpuscaler string
}

// Build builds (or finds cached) every binary.
func Build(ctx context.Context, o Options) (Binaries, error) {
	b := &Builder{E2ERoot: o.E2ERoot, CacheDir: o.CacheDir, Log: o.Log}
	var bins Binaries
	var err error
	if bins.Gpuscaler, err = BuildGpuscaler(ctx, o.RepoRoot, o.Dir, o.Log); err != nil {
		return bins, err
	}
	for _, t := range []struct {
		tool Tool
		path *string
	}{
		{Etcd, &bins.Etcd},
		{NATSServer, &bins.NATSServer},
		{KubeAPIServer, &bins.APIServer},
		{KubeControllerManager, &bins.ControllerManager},
		{KubeScheduler, &bins.Scheduler},
		{KEDAOperator, &bins.KEDAOperator},
		{KEDAAdapter, &bins.KEDAAdapter},
		{KwokTool, &bins.Kwok},
	} {
		if *t.path, err = b.Build(ctx, t.tool); err != nil {
			return bins, err
		}
	}
	return bins, nil
}

// Start starts everything, in order, and returns once each part is ready. On an error
// the parts already started are left to the caller's Procs.StopAll.
func Start(ctx context.Context, ps *Procs, bins Binaries, o Options) (*Env, error) {
	e := &Env{Procs: ps, Dir: o.Dir, RepoRoot: o.RepoRoot, NATSBin: bins.NATSServer}
	step := func(what string, f func() error) error {
		start := time.Now()
		if err := f(); err != nil {
			return err
		}
		fmt.Fprintf(o.Log, "e2e: %s ready in %s\n", what, time.Since(start).Round(time.Millisecond))
		return nil
	}
	var err error
	if err := step("etcd and kube-apiserver", func() error {
		e.CP, err = StartControlPlane(ctx, ps, ControlPlaneOptions{EtcdBin: bins.Etcd, APIServerBin: bins.APIServer, Dir: o.Dir})
		return err
	}); err != nil {
		return nil, err
	}
	if e.Kube, err = kubernetes.NewForConfig(e.CP.Config); err != nil {
		return nil, err
	}
	if e.KEDACli, err = kedaclient.NewForConfig(e.CP.Config); err != nil {
		return nil, err
	}
	kedaDir, err := ModuleDir(ctx, o.E2ERoot, "github.com/kedacore/keda/v2")
	if err != nil {
		return nil, err
	}
	if err := step("KEDA CRDs and operator", func() error {
		e.KEDA, err = StartKEDA(ctx, ps, e.CP, KEDAOptions{OperatorBin: bins.KEDAOperator, ModuleDir: kedaDir, Dir: o.Dir})
		return err
	}); err != nil {
		return nil, err
	}
	if err := step("nats-server", func() error {
		e.NATS, err = StartNATS(ctx, ps, bins.NATSServer, o.Dir)
		return err
	}); err != nil {
		return nil, err
	}
	simDir := filepath.Join(o.Dir, "sim")
	if err := os.MkdirAll(simDir, 0o755); err != nil {
		return nil, err
	}
	e.G = NewGpuscaler(ps, bins.Gpuscaler, e.NATS.URL, simDir)
	if err := step("gpuscaler scaler", func() error {
		e.Scaler, err = e.G.StartScaler(ctx, o.ScalerFlags...)
		return err
	}); err != nil {
		return nil, err
	}
	if err := step("gpuscaler scaler with embedded NATS", func() error {
		e.Embedded, e.GEmbedded, err = StartEmbeddedScaler(ctx, ps, bins.Gpuscaler, o.Dir)
		return err
	}); err != nil {
		return nil, err
	}
	if err := step("kube-controller-manager and kube-scheduler", func() error {
		e.Controllers, err = StartControllers(ctx, ps, e.CP, bins.ControllerManager, bins.Scheduler)
		return err
	}); err != nil {
		return nil, err
	}
	if err := step("KEDA metrics adapter, registered as v1beta1.external.metrics.k8s.io", func() error {
		e.Adapter, err = StartKEDAAdapter(ctx, ps, e.CP, e.KEDA, bins.KEDAAdapter, o.Dir)
		return err
	}); err != nil {
		return nil, err
	}
	kwokDir, err := ModuleDir(ctx, filepath.Join(o.E2ERoot, KwokTool.Module), "sigs.k8s.io/kwok")
	if err != nil {
		return nil, err
	}
	if err := step("kwok", func() error {
		e.Kwok, err = StartKwok(ctx, ps, e.CP, bins.Kwok, kwokDir, o.Dir)
		return err
	}); err != nil {
		return nil, err
	}
	if err := step("NATS cluster of three", func() error {
		e.NATSCluster, err = StartNATSCluster(ctx, ps, bins.NATSServer, o.Dir)
		return err
	}); err != nil {
		return nil, err
	}
	if e.DNS, err = StartDNS(); err != nil {
		return nil, err
	}
	clusterDir := filepath.Join(o.Dir, "sim-cluster")
	if err := os.MkdirAll(clusterDir, 0o755); err != nil {
		return nil, err
	}
	e.GCluster = NewGpuscaler(ps, bins.Gpuscaler, e.NATSCluster.URLs, clusterDir)
	if err := step("two gpuscaler scaler replicas on the NATS cluster", func() error {
		e.Scalers, err = StartScalerSet(ctx, e.GCluster, e.DNS, "gpuscaler.gpuscaler.svc.e2e.test", 2, o.ScalerFlags...)
		return err
	}); err != nil {
		return nil, err
	}
	return e, nil
}
