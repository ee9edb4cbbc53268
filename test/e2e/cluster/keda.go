package cluster

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"
)

// KEDA is KEDA's operator, run out of cluster against the control plane.
type KEDA struct {
	Operator *Process
	// MetricsServiceAddr is the operator's gRPC metrics service, which KEDA's metrics
	// API server (the adapter) calls for every HPA query; CertDir holds the mutual-TLS
	// material (ca.crt, tls.crt, tls.key) it and its clients use.
	MetricsServiceAddr string
	CertDir            string
	// Namespace is KEDA's own (KEDA_CLUSTER_OBJECT_NAMESPACE, POD_NAMESPACE).
	Namespace string
}

// KEDAOptions are the operator binary, KEDA's module folder (for its CRDs) and the run's
// folder.
type KEDAOptions struct {
	OperatorBin string
	// ModuleDir is github.com/kedacore/keda/v2 in the module cache; its
	// config/crd/bases are applied.
	ModuleDir string
	Dir       string
}

var crdGVR = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}

// StartKEDA applies KEDA's CRDs (server-side: they are too large for the last-applied
// annotation), creates KEDA's namespace and starts the operator, waiting for its readyz.
func StartKEDA(ctx context.Context, ps *Procs, cp *ControlPlane, o KEDAOptions) (*KEDA, error) {
	if err := ApplyCRDs(ctx, cp, filepath.Join(o.ModuleDir, "config", "crd", "bases")); err != nil {
		return nil, err
	}
	k := &KEDA{Namespace: "keda", CertDir: filepath.Join(o.Dir, "keda-certs")}
	kc, err := kubernetes.NewForConfig(cp.Config)
	if err != nil {
		return nil, err
	}
	if err := CreateNamespace(ctx, kc, k.Namespace); err != nil {
		return nil, err
	}
	// The operator's metrics service loads ca.crt, tls.crt and tls.key from --cert-dir
	// (mutual TLS); with --enable-cert-rotation=false nothing else writes them.
	if err := cp.CA.WriteServingPair(k.CertDir, "keda-operator", "keda-operator", "keda-operator.keda", "keda-operator.keda.svc", "keda-operator.keda.svc.cluster.local"); err != nil {
		return nil, err
	}
	caDir := filepath.Join(o.Dir, "keda-ca") // --ca-dir: extra CAs for scalers, none
	if err := os.MkdirAll(caDir, 0o755); err != nil {
		return nil, err
	}
	metricsAddr, err := FreeAddr()
	if err != nil {
		return nil, err
	}
	probeAddr, err := FreeAddr()
	if err != nil {
		return nil, err
	}
	if k.MetricsServiceAddr, err = FreeAddr(); err != nil {
		return nil, err
	}
	k.Operator, err = ps.Start("keda-operator", o.OperatorBin, []string{
		"--kubeconfig=" + cp.Kubeconfig,
		"--leader-elect=false",
		"--metrics-bind-address=" + metricsAddr,
		"--health-probe-bind-address=" + probeAddr,
		"--metrics-service-bind-address=" + k.MetricsServiceAddr,
		"--cert-dir=" + k.CertDir,
		"--ca-dir=" + caDir,
		"--enable-cert-rotation=false",
		"--enable-webhook-patching=false",
		"--enable-apiservice-patching=false",
		"--zap-log-level=info",
		"--zap-encoder=console",
		"--zap-time-encoding=rfc3339nano",
	},
		"WATCH_NAMESPACE=",
		"KEDA_CLUSTER_OBJECT_NAMESPACE="+k.Namespace,
		"POD_NAMESPACE="+k.Namespace,
		"POD_NAME=keda-operator-e2e",
		"OPERATOR_NAME=keda-operator",
	)
	if err != nil {
		return nil, err
	}
	err = waitHTTPOK(ctx, 2*time.Minute, 200*time.Millisecond, "KEDA operator ready", k.Operator, "http://"+probeAddr+"/readyz")
	if err != nil {
		return nil, err
	}
	return k, nil
}

// ApplyCRDs server-side applies every CRD in dir and waits until each is established.
func ApplyCRDs(ctx context.Context, cp *ControlPlane, dir string) error {
	dyn, err := dynamic.NewForConfig(cp.Config)
	if err != nil {
		return err
	}
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil {
		return err
	}
	if len(files) == 0 {
		return fmt.Errorf("no CRDs in %s", dir)
	}
	slices.Sort(files)
	var names []string
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		var obj map[string]any
		if err := yaml.Unmarshal(data, &obj); err != nil {
			return fmt.Errorf("%s: %w", f, err)
		}
		u := &unstructured.Unstructured{Object: obj}
		_, err = dyn.Resource(crdGVR).Apply(ctx, u.GetName(), u, metav1.ApplyOptions{FieldManager: "gpuscaler-e2e", Force: true})
		if err != nil {
			return fmt.Errorf("apply %s: %w", filepath.Base(f), err)
		}
		names = append(names, u.GetName())
	}
	for _, name := range names {
		err := Eventually(ctx, time.Minute, 100*time.Millisecond, "CRD "+name+" established", nil, func(ctx context.Context) (bool, error) {
			u, err := dyn.Resource(crdGVR).Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return false, Retry(err)
			}
			c, _ := statusCondition(u, "Established")
			return c["status"] == "True", nil
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// CreateNamespace creates a namespace, or leaves it as it is if it exists.
func CreateNamespace(ctx context.Context, kc kubernetes.Interface, name string) error {
	_, err := kc.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create namespace %s: %w", name, err)
	}
	return nil
}
