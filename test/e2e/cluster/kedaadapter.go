package cluster

import (
	"context"
	"encoding/base64"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
)

// MetricsAdapter is KEDA's metrics API server (cmd/adapter), registered as the
// v1beta1.external.metrics.k8s.io APIService behind the API server's aggregation layer:
// the HPA controller reads gpuscaler's metrics through it as in a cluster, and it
// forwards every query to the operator's metrics service.
type MetricsAdapter struct {
	*Process
	Addr string
}

// keda-metrics-apiserver is the Service KEDA's manifests register the APIService with;
// the aggregator checks the adapter's certificate against <name>.<namespace>.svc.
const kedaAdapterService = "keda-metrics-apiserver"

var apiServiceGVR = schema.GroupVersionResource{Group: "apiregistration.k8s.io", Version: "v1", Resource: "apiservices"}

// StartKEDAAdapter starts the adapter against the operator k, registers it and waits
// until the aggregator reports the APIService Available.
//
// With no kube-proxy, the aggregator reaches the adapter through a Service of type
// ExternalName naming 127.0.0.1: it resolves such a Service to https://<externalName>:
// <APIService port> without endpoints (ResolveCluster, k8s.io/apiserver/pkg/util/proxy),
// where Endpoints and EndpointSlices refuse loopback addresses. It still verifies the
// adapter's certificate for keda-metrics-apiserver.keda.svc against the APIService's
// caBundle, as in a cluster.
func StartKEDAAdapter(ctx context.Context, ps *Procs, cp *ControlPlane, k *KEDA, bin, dir string) (*MetricsAdapter, error) {
	// One pair serves the aggregator and is the client certificate the operator's
	// metrics service asks for: the adapter reads ca.crt, tls.crt and tls.key from
	// --cert-dir for that (pkg/metricsservice/utils/tls.go).
	certDir := filepath.Join(dir, "keda-adapter-certs")
	svcName := kedaAdapterService + "." + k.Namespace + ".svc"
	if err := cp.CA.WriteServingPair(certDir, kedaAdapterService, svcName); err != nil {
		return nil, err
	}
	port, err := FreePort()
	if err != nil {
		return nil, err
	}
	metricsAddr, err := FreeAddr()
	if err != nil {
		return nil, err
	}
	_, metricsPort, _ := net.SplitHostPort(metricsAddr)
	a := &MetricsAdapter{Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port))}
	a.Process, err = ps.Start("keda-adapter", bin, []string{
		"--kubeconfig=" + cp.Kubeconfig,
		"--lister-kubeconfig=" + cp.Kubeconfig,
		"--authentication-kubeconfig=" + cp.Kubeconfig,
		"--authorization-kubeconfig=" + cp.Kubeconfig,
		"--bind-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(port),
		"--tls-cert-file=" + filepath.Join(certDir, "tls.crt"),
		"--tls-private-key-file=" + filepath.Join(certDir, "tls.key"),
		"--cert-dir=" + certDir,
		"--metrics-service-address=" + k.MetricsServiceAddr,
		// Its own /metrics listens on :8080 unless told otherwise.
		"--port=" + metricsPort,
		"--v=1",
	},
		"WATCH_NAMESPACE=",
		"POD_NAMESPACE="+k.Namespace,
		"KEDA_CLUSTER_OBJECT_NAMESPACE="+k.Namespace,
	)
	if err != nil {
		return nil, err
	}
	if err := waitHealthz(ctx, a.Process, "KEDA metrics adapter", port, "/readyz"); err != nil {
		return nil, err
	}
	if err := registerAPIService(ctx, cp, k.Namespace, port); err != nil {
		return nil, err
	}
	return a, nil
}

// registerAPIService creates the ExternalName Service and the APIService, then waits for
// Available=True.
func registerAPIService(ctx context.Context, cp *ControlPlane, namespace string, port int) error {
	kc, err := kubernetes.NewForConfig(cp.Config)
	if err != nil {
		return err
	}
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: kedaAdapterService, Namespace: namespace},
		Spec:       corev1.ServiceSpec{Type: corev1.ServiceTypeExternalName, ExternalName: "127.0.0.1"},
	}
	if _, err := kc.CoreV1().Services(namespace).Create(ctx, svc, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create Service %s/%s: %w", namespace, kedaAdapterService, err)
	}
	dyn, err := dynamic.NewForConfig(cp.Config)
	if err != nil {
		return err
	}
	name := "v1beta1.external.metrics.k8s.io"
	apiService := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "apiregistration.k8s.io/v1",
		"kind":       "APIService",
		"metadata":   map[string]any{"name": name},
		"spec": map[string]any{
			"service":              map[string]any{"name": kedaAdapterService, "namespace": namespace, "port": int64(port)},
			"group":                "external.metrics.k8s.io",
			"version":              "v1beta1",
			"caBundle":             base64.StdEncoding.EncodeToString(cp.CA.CertPEM), // []byte in the Go type: base64 in JSON
			"groupPriorityMinimum": int64(100),
			"versionPriority":      int64(100),
		},
	}}
	if _, err := dyn.Resource(apiServiceGVR).Create(ctx, apiService, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create APIService %s: %w", name, err)
	}
	return Eventually(ctx, 2*time.Minute, 200*time.Millisecond, "APIService "+name+" Available", nil, func(ctx context.Context) (bool, error) {
		u, err := dyn.Resource(apiServiceGVR).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, Retry(err)
		}
		c, ok := statusCondition(u, "Available")
		if !ok {
			return false, nil
		}
		if c["status"] == "True" {
			return true, nil
		}
		return false, Retry(fmt.Errorf("Available=%v %v: %v", c["status"], c["reason"], c["message"]))
	})
}

// statusCondition returns u's status condition of type typ.
func statusCondition(u *unstructured.Unstructured, typ string) (map[string]any, bool) {
	conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
	for _, c := range conds {
		if m, _ := c.(map[string]any); m["type"] == typ {
			return m, true
		}
	}
	return nil, false
}

// writeFile writes data to dir/name.
func writeFile(dir, name string, data []byte) (string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	path := filepath.Join(dir, name)
	return path, os.WriteFile(path, data, 0o644)
}
