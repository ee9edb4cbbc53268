package cluster

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
	"path/filepath"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"k8s.io/apimachinery/pkg/api/resource"

	metricsapi "github.com/kedacore/keda/v2/pkg/metricsservice/api"
)

// MetricsClient asks KEDA's operator for a ScaledObject's external metric over its
// metrics service, exactly the call KEDA's metrics API server (cmd/adapter) makes for each
// HPA query of external.metrics.k8s.io: the operator queries the trigger, applies
// fallback, records health and answers with the value the HPA would divide by its target.
type MetricsClient struct {
	conn *grpc.ClientConn
	api  metricsapi.MetricsServiceClient
}

// NewMetricsClient connects to the operator's metrics service with the mutual-TLS
// material in KEDA's cert dir, as the adapter does.
func (k *KEDA) NewMetricsClient() (*MetricsClient, error) {
	cert, err := tls.LoadX509KeyPair(filepath.Join(k.CertDir, "tls.crt"), filepath.Join(k.CertDir, "tls.key"))
	if err != nil {
		return nil, err
	}
	ca, err := os.ReadFile(filepath.Join(k.CertDir, "ca.crt"))
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca)
	creds := credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{cert}, RootCAs: pool, ServerName: "keda-operator.keda.svc", MinVersion: tls.VersionTLS12})
	conn, err := grpc.NewClient(k.MetricsServiceAddr, grpc.WithTransportCredentials(creds))
	if err != nil {
		return nil, err
	}
	return &MetricsClient{conn: conn, api: metricsapi.NewMetricsServiceClient(conn)}, nil
}

// Close closes the connection.
func (c *MetricsClient) Close() error { return c.conn.Close() }

// Get returns the value KEDA serves for metric (such as "s0-gpu-util") of the ScaledObject
// namespace/name, or KEDA's error.
func (c *MetricsClient) Get(ctx context.Context, namespace, name, metric string) (float64, error) {
	resp, err := c.api.GetMetrics(ctx, &metricsapi.ScaledObjectRef{Name: name, Namespace: namespace, MetricName: metric})
	if err != nil {
		return 0, err
	}
	items := resp.GetItems()
	if len(items) != 1 {
		return 0, fmt.Errorf("KEDA answered %d values for %s, want 1", len(items), metric)
	}
	q, err := resource.ParseQuantity(items[0].GetValue().GetString_())
	if err != nil {
		return 0, fmt.Errorf("KEDA's value for %s: %w", metric, err)
	}
	return q.AsApproximateFloat64(), nil
}
