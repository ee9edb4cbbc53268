package manifests

import (
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/gpuscaler/gpuscaler/deploy/render"
)

// TestValuesRejected: values the chart cannot honour fail at render time with a message
// that says what to do, rather than producing manifests that fail in the cluster.
func TestValuesRejected(t *testing.T) {
	chart := filepath.Join(root(t), render.ChartDir)
	cases := map[string]struct {
		values map[string]any
		want   string
	}{
		"misspelt key": {
			values: map[string]any{"scaler": map[string]any{"replica": 3}},
			want:   "replica",
		},
		"external NATS without a URL": {
			values: map[string]any{"nats": map[string]any{"enabled": false, "auth": map[string]any{"kubernetes": map[string]any{"secretName": "s"}}}},
			want:   "nats.url is required",
		},
		"creds with the bundled NATS": {
			values: map[string]any{"nats": map[string]any{"auth": map[string]any{"type": "creds", "secretName": "s"}}},
			want:   "operator-mode NATS",
		},
		"auth without its Secret": {
			values: map[string]any{"nats": map[string]any{"auth": map[string]any{"type": "token", "insecureAllowPasswordsWithoutTLS": true}}},
			want:   "nats.auth.secretName is required",
		},
		"a collector identity with the bundled NATS": {
			values: map[string]any{"nats": map[string]any{"auth": map[string]any{"type": "token", "secretName": "s", "collectorSecretName": "c"}}},
			want:   "nats.auth.collectorSecretName needs your own NATS",
		},
		"a collector Secret with kubernetes auth": {
			values: map[string]any{"nats": map[string]any{"enabled": false, "url": "nats://n:4222",
				"auth": map[string]any{"collectorSecretName": "c", "kubernetes": map[string]any{"secretName": "s"}}}},
			want: "nats.auth.collectorSecretName is for a shared secret",
		},
		"kubernetes auth on your own NATS without its issuer": {
			values: map[string]any{"nats": map[string]any{"enabled": false, "url": "nats://n:4222"}},
			want:   "nats.auth.kubernetes.secretName is required with your own NATS",
		},
		"tokens shorter-lived than Kubernetes allows": {
			values: map[string]any{"nats": map[string]any{"auth": map[string]any{"kubernetes": map[string]any{"tokenExpirationSeconds": 60}}}},
			want:   "tokenExpirationSeconds",
		},
		"a producer identity without its namespace": {
			values: map[string]any{"nats": map[string]any{"auth": map[string]any{"kubernetes": map[string]any{"producerIdentities": "default"}}}},
			want:   "producerIdentities",
		},
		"an unknown auth type": {
			values: map[string]any{"nats": map[string]any{"auth": map[string]any{"type": "serviceAccount"}}},
			want:   "type",
		},
		"misspelt authCallout key": {
			values: map[string]any{"authCallout": map[string]any{"replica": 3}},
			want:   "replica",
		},
		"a status page anyone reaches": {
			values: map[string]any{"scaler": map[string]any{"statusPage": true}},
			want:   "scaler.statusPage shows every namespace's triggers, queues and pods to whoever reaches scaler.httpPort: it needs networkPolicy.enabled with networkPolicy.metricsFrom",
		},
		"a status page without NetworkPolicies": {
			values: map[string]any{"scaler": map[string]any{"statusPage": true}, "networkPolicy": map[string]any{"enabled": false,
				"metricsFrom": []any{map[string]any{"namespaceSelector": map[string]any{"matchLabels": map[string]any{"kubernetes.io/metadata.name": "monitoring"}}}}}},
			want: "scaler.statusPage shows every namespace's",
		},
		"two NATS servers": {
			values: map[string]any{"nats": map[string]any{"replicas": 2}},
			want:   "nats.replicas 2",
		},
		"bundled NATS TLS without a server certificate": {
			values: map[string]any{"nats": map[string]any{"tls": map[string]any{"enabled": true, "secretName": "c"}}},
			want:   "nats.tls.serverSecretName is required",
		},
		"client TLS without its Secret": {
			values: map[string]any{"nats": map[string]any{"enabled": false, "url": "tls://n:4222", "tls": map[string]any{"enabled": true},
				"auth": map[string]any{"kubernetes": map[string]any{"secretName": "s"}}}},
			want: "nats.tls.secretName is required",
		},
		"a scaler certificate of yours without KEDA's": {
			values: map[string]any{"scaler": map[string]any{"tls": map[string]any{"secretName": "grpc"}}},
			want:   "keda.clusterTriggerAuthentication.secretName is required with scaler.tls.secretName",
		},
		"a KEDA certificate of yours without the scaler's": {
			values: map[string]any{"keda": map[string]any{"clusterTriggerAuthentication": map[string]any{"secretName": "client"}}},
			want:   "scaler.tls.secretName is required with keda.clusterTriggerAuthentication.secretName",
		},
		"ClusterTriggerAuthentication for a scaler without TLS": {
			values: map[string]any{"scaler": map[string]any{"tls": map[string]any{"enabled": false}}},
			want:   "keda.clusterTriggerAuthentication.enabled needs scaler.tls.enabled",
		},
		"cert-manager neither auto, true nor false": {
			values: map[string]any{"scaler": map[string]any{"tls": map[string]any{"certManager": map[string]any{"enabled": "yes"}}}},
			want:   "enabled",
		},
		"cert-manager's cluster resource namespace, gone with the ClusterIssuers (issue 28)": {
			values: map[string]any{"scaler": map[string]any{"tls": map[string]any{"certManager": map[string]any{"clusterResourceNamespace": "cert-manager"}}}},
			want:   "clusterResourceNamespace",
		},
		"unknown source": {
			values: map[string]any{"collector": map[string]any{"source": "rocm"}},
			want:   "source",
		},
		"duration without a unit": {
			values: map[string]any{"scaler": map[string]any{"staleAfter": "30"}},
			want:   "staleAfter",
		},
		"size in the wrong unit": {
			values: map[string]any{"nats": map[string]any{"jetstream": map[string]any{"maxFileStore": "8GB"}}},
			want:   "maxFileStore",
		},
	}
	for _, name := range slices.Sorted(maps.Keys(cases)) {
		tc := cases[name]
		t.Run(name, func(t *testing.T) {
			_, err := render.Render(chart, tc.values)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got error %v, want one mentioning %q", err, tc.want)
			}
		})
	}
}
