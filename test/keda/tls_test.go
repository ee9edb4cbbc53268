package keda

import (
	"maps"
	"testing"
)

// TestMutualTLS runs the scaler with --tls-cert, --tls-key and --tls-client-ca, and gives
// KEDA's scaler its TLS material as a TriggerAuthentication does: PEM contents in the
// auth params caCert, tlsClientCert and tlsClientKey. With all three KEDA gets its
// metrics and pushes; a client without a certificate, with one the scaler's CA did not
// sign, or without TLS is refused, and so is a server KEDA cannot verify.
func TestMutualTLS(t *testing.T) {
	ca := newCA(t, "gpuscaler test CA")
	serverCert, serverKey := ca.issue(t, "gpuscaler")
	clientCert, clientKey := ca.issue(t, "keda-operator")
	rogue := newCA(t, "another CA")
	rogueCert, rogueKey := rogue.issue(t, "keda-operator")

	dir := t.TempDir()
	s := startScaler(t,
		"--tls-cert", writeFile(t, dir, "tls.crt", serverCert),
		"--tls-key", writeFile(t, dir, "tls.key", serverKey),
		"--tls-client-ca", writeFile(t, dir, "ca.crt", ca.pem))
	s.publishQueue(t, "secure", "jobs", 2, 0)

	good := map[string]string{"caCert": ca.pem, "tlsClientCert": clientCert, "tlsClientKey": clientKey}
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
			auth: map[string]string{"caCert": ca.pem},
		},
		"client certificate from another CA": {
			auth: map[string]string{"caCert": ca.pem, "tlsClientCert": rogueCert, "tlsClientKey": rogueKey},
		},
		"server certificate KEDA does not trust": {
			auth: map[string]string{"caCert": rogue.pem, "tlsClientCert": clientCert, "tlsClientKey": clientKey},
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
