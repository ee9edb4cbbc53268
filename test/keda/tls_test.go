package keda

import (
	"maps"
	"testing"

	"github.com/gpuscaler/gpuscaler/test/testkit"
)

// TestMutualTLS runs the scaler with --tls-cert, --tls-key and --tls-client-ca, and gives
// KEDA's scaler its TLS material as a TriggerAuthentication does: PEM contents in the
// auth params caCert, tlsClientCert and tlsClientKey. With all three KEDA gets its
// metrics and pushes; a client without a certificate, with one the scaler's CA did not
// sign, or without TLS is refused, and so is a server KEDA cannot verify.
func TestMutualTLS(t *testing.T) {
	ca := testkit.NewCA(t, "gpuscaler test CA")
	serverCert, serverKey := ca.Issue(t, "gpuscaler", 0)
	clientCert, clientKey := pemStrings(ca.Issue(t, "keda-operator", 0))
	rogue := testkit.NewCA(t, "another CA")
	rogueCert, rogueKey := pemStrings(rogue.Issue(t, "keda-operator", 0))

	dir := t.TempDir()
	s := startScaler(t,
		"--tls-cert", testkit.WriteFile(t, dir, "tls.crt", serverCert),
		"--tls-key", testkit.WriteFile(t, dir, "tls.key", serverKey),
		"--tls-client-ca", testkit.WriteFile(t, dir, "ca.crt", ca.PEM))
	s.publishQueue(t, "secure", "jobs", 2, 0)

	good := map[string]string{"caCert": string(ca.PEM), "tlsClientCert": clientCert, "tlsClientKey": clientKey}
	waitMetric(t, s, trigger{namespace: "secure", auth: good, metadata: map[string]string{"queue": "jobs"}}, "s0-queue-backlog", 2000)

	tests := map[string]struct {
		auth     map[string]string
		metadata map[string]string
		wantOK   bool
	}{
		"mutual TLS": {auth: good, wantOK: true},
		"enableTLS with the same material": {
			auth: good, metadata: map[string]string{"enableTLS": "true"}, wantOK: true,
		},
		"no client certificate": {
			auth: map[string]string{"caCert": string(ca.PEM)},
		},
		"client certificate from another CA": {
			auth: map[string]string{"caCert": string(ca.PEM), "tlsClientCert": rogueCert, "tlsClientKey": rogueKey},
		},
		"server certificate KEDA does not trust": {
			auth: map[string]string{"caCert": string(rogue.PEM), "tlsClientCert": clientCert, "tlsClientKey": clientKey},
		},
		"no TLS": {},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			md := map[string]string{"queue": "jobs"}
			maps.Copy(md, tc.metadata)
			tr := trigger{namespace: "secure", name: "secure-app", auth: tc.auth, metadata: md}
			sc := s.external(t, tr)
			specs := sc.GetMetricSpecForScaling(t.Context())
			got, active, err := metric(t, sc, "s0-queue-backlog")
			if !tc.wantOK {
				if err == nil || len(specs) != 0 {
					t.Fatalf("got %d specs and %dm (active %t, error %v), want no specs and an error: the connection must be refused",
						len(specs), got, active, err)
				}
				t.Logf("refused as expected: %v", err)
				return
			}
			if err != nil || len(specs) != 1 {
				t.Fatalf("got %d specs and error %v, want one spec and no error", len(specs), err)
			}
			if got != 2000 || !active {
				t.Errorf("got %dm active %t, want 2000m active true", got, active)
			}
			// The push scaler shares the connection and its TLS: the stream opens and
			// sends the current state.
			if v := receive(t, s.push(t, tr)); !v {
				t.Errorf("StreamIsActive over mutual TLS: got %t, want true", v)
			}
		})
	}
}

// pemStrings is a certificate and key as a TriggerAuthentication's auth params hold them.
func pemStrings(cert, key []byte) (string, string) { return string(cert), string(key) }
