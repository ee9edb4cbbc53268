package cluster

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// Controllers are kube-controller-manager and kube-scheduler, run out of cluster against
// the control plane with the admin kubeconfig.
type Controllers struct {
	ControllerManager, Scheduler *Process
}

// HPASyncPeriod is the controller manager's --horizontal-pod-autoscaler-sync-period:
// 15 s by default, 1 s here so that scenarios take seconds. Everything else about the
// HPA is its default, or set per ScaledObject (advanced.horizontalPodAutoscalerConfig).
const HPASyncPeriod = time.Second

// controllers are the controllers the suite needs, by the names --controllers accepts
// (cmd/kube-controller-manager/names): Deployments, ReplicaSets, Jobs and HPAs; the
// default ServiceAccount a pod needs (ServiceAccount admission refuses pods without
// it) and the kube-root-ca.crt ConfigMap; namespaces deleted with what they hold, and
// owned objects with their owners; node lifecycle, which lifts the not-ready taint
// the API server gives every new Node once kwok reports it Ready; and EndpointSlices,
// which say which pods of a Service are ready (kwok's pods have 10.244.x.x addresses,
// which nothing here dials): the gateway holds requests until they show one.
var controllers = []string{
	"deployment", "replicaset", "job", "horizontalpodautoscaling",
	"serviceaccount", "root-ca-cert-publisher",
	"namespace", "garbagecollector",
	"nodelifecycle",
	"endpointslice",
}

// StartControllers starts kube-controller-manager and kube-scheduler and waits for their
// /healthz. Both are given the admin kubeconfig for delegated authentication too, so
// that neither looks for an in-cluster configuration.
func StartControllers(ctx context.Context, ps *Procs, cp *ControlPlane, kcmBin, schedBin string) (*Controllers, error) {
	c := &Controllers{}
	kcmPort, err := FreePort()
	if err != nil {
		return nil, err
	}
	kubeconfig := "--kubeconfig=" + cp.Kubeconfig
	delegated := []string{"--authentication-kubeconfig=" + cp.Kubeconfig, "--authorization-kubeconfig=" + cp.Kubeconfig}
	c.ControllerManager, err = ps.Start("kube-controller-manager", kcmBin, append([]string{
		kubeconfig,
		"--leader-elect=false",
		"--bind-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(kcmPort),
		"--controllers=" + strings.Join(controllers, ","),
		// Without it the kube-root-ca.crt ConfigMap would hold the kubeconfig's CA
		// only when given inline; here it is.
		"--root-ca-file=" + filepath.Join(cp.Dir, "ca.crt"),
		"--horizontal-pod-autoscaler-sync-period=" + HPASyncPeriod.String(),
		"--v=1",
	}, delegated...))
	if err != nil {
		return nil, err
	}
	if err := waitHealthz(ctx, c.ControllerManager, "kube-controller-manager", kcmPort, "/healthz"); err != nil {
		return nil, err
	}
	schedPort, err := FreePort()
	if err != nil {
		return nil, err
	}
	c.Scheduler, err = ps.Start("kube-scheduler", schedBin, append([]string{
		kubeconfig,
		"--leader-elect=false",
		"--bind-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(schedPort),
		"--v=1",
	}, delegated...))
	if err != nil {
		return nil, err
	}
	if err := waitHealthz(ctx, c.Scheduler, "kube-scheduler", schedPort, "/healthz"); err != nil {
		return nil, err
	}
	return c, nil
}

// waitHealthz waits until path (/healthz, /readyz) on a component's secure loopback port
// answers 200. The component serves a self-signed certificate, and admits anyone to
// those paths: the certificate is not checked, only the answer counts.
func waitHealthz(ctx context.Context, p *Process, what string, port int, path string) error {
	url := fmt.Sprintf("https://127.0.0.1:%d%s", port, path)
	hc := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	return Eventually(ctx, 2*time.Minute, 200*time.Millisecond, what+" healthy", p, func(ctx context.Context) (bool, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return false, err
		}
		resp, err := hc.Do(req)
		if err != nil {
			return false, Retry(err)
		}
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return false, Retry(fmt.Errorf("GET %s: %s: %s", url, resp.Status, lastLines(string(body), 5)))
		}
		return true, nil
	})
}
