package manifests

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
)

// TestBundledNATSConfig parses the bundled server's rendered configuration with the
// nats-server library at the version of the chart's image, checks it against the
// StatefulSet that runs it, and starts the default one to see JetStream come up.
func TestBundledNATSConfig(t *testing.T) {
	for _, c := range Cases {
		t.Run(c.Name, func(t *testing.T) {
			objs := caseObjects(t, c)
			sts, ok := find[*appsv1.StatefulSet](objs, Release+"-nats")
			if !ok {
				t.Skip("no bundled NATS in this case")
			}
			cm, ok := find[*corev1.ConfigMap](objs, Release+"-nats")
			if !ok {
				t.Fatal("got no ConfigMap with the NATS configuration")
			}
			conf := cm.Data["nats.conf"]
			ctr := sts.Spec.Template.Spec.Containers[0]
			checkNATSImage(t, ctr.Image)
			mounts := map[string]string{}
			for _, m := range ctr.VolumeMounts {
				mounts[m.MountPath] = m.Name
			}

			// The files the configuration names are where the pod mounts them; for
			// parsing, TLS files are replaced by fresh ones.
			tlsDir := t.TempDir()
			writeTestCerts(t, tlsDir)
			if strings.Contains(conf, "/etc/nats/tls/") {
				if mounts["/etc/nats/tls"] == "" {
					t.Errorf("got TLS files under /etc/nats/tls, not mounted (mounts %v)", mounts)
				}
				conf = strings.ReplaceAll(conf, "/etc/nats/tls/", tlsDir+"/")
			}
			for _, dir := range []string{"/data", "/var/run/nats"} {
				if mounts[dir] == "" {
					t.Errorf("got no volume at %s, which the configuration writes to (mounts %v)", dir, mounts)
				}
			}
			path := filepath.Join(t.TempDir(), "nats.conf")
			if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
				t.Fatal(err)
			}
			t.Setenv("POD_NAME", sts.Name+"-0")
			t.Setenv("NATS_USER", "u")
			t.Setenv("NATS_PASSWORD", "p")
			t.Setenv("NATS_TOKEN", "tok")
			opts, err := server.ProcessConfigFile(path)
			if err != nil {
				t.Fatalf("nats-server rejects the configuration: %v\n%s", err, conf)
			}
			replicas := int(deref(sts.Spec.Replicas, 1))
			checks := []struct {
				what      string
				got, want any
			}{
				{"server_name", opts.ServerName, sts.Name + "-0"},
				{"jetstream", opts.JetStream, true},
				{"store_dir", opts.StoreDir, "/data"},
				{"client port", opts.Port, 4222},
				{"monitoring port", opts.HTTPPort, 8222},
				{"routes", len(opts.Routes), map[bool]int{true: replicas, false: 0}[replicas > 1]},
			}
			for _, ck := range checks {
				if ck.got != ck.want {
					t.Errorf("got %s %v, want %v", ck.what, ck.got, ck.want)
				}
			}
			var ports []int32
			for _, p := range ctr.Ports {
				ports = append(ports, p.ContainerPort)
			}
			for _, p := range []int32{4222, 6222, 8222} {
				if !slices.Contains(ports, p) {
					t.Errorf("got container ports %v, want %d", ports, p)
				}
			}
			for _, r := range opts.Routes {
				if !strings.Contains(r.Hostname(), "."+sts.Spec.ServiceName+"."+Namespace+".svc.") {
					t.Errorf("got route %s, want a name under the StatefulSet's Service %s", r, sts.Spec.ServiceName)
				}
			}
			scaler, _ := find[*appsv1.Deployment](objs, Release)
			args := strings.Join(scaler.Spec.Template.Spec.Containers[0].Args, " ")
			wantTLS := opts.TLSConfig != nil
			if gotTLS := strings.Contains(args, "--nats-url=tls://"); gotTLS != wantTLS {
				t.Errorf("got scaler args %q, want a tls:// URL exactly when the server serves TLS (%v)", args, wantTLS)
			}
			if opts.TLSVerify && !strings.Contains(args, "--nats-tls-cert=") {
				t.Errorf("got a server that verifies clients and a scaler without --nats-tls-cert")
			}
			if replicas > 1 && !strings.Contains(args, "--stream-replicas="+strconv.Itoa(replicas)) {
				t.Errorf("got scaler args %q, want the stream on all %d servers", args, replicas)
			}

			if c.Name != "default" {
				return
			}
			// Start it, with the pod's paths and ports moved to this machine.
			opts.StoreDir = t.TempDir()
			opts.PidFile = filepath.Join(t.TempDir(), "nats.pid")
			opts.Host, opts.Port, opts.HTTPPort = "127.0.0.1", -1, -1
			opts.HTTPHost = "127.0.0.1"
			opts.NoSigs = true
			s, err := server.NewServer(opts)
			if err != nil {
				t.Fatal(err)
			}
			go s.Start()
			t.Cleanup(s.Shutdown)
			if !s.ReadyForConnections(10 * time.Second) {
				t.Fatal("the bundled NATS configuration did not start in 10s")
			}
			if !s.JetStreamEnabled() {
				t.Fatal("got JetStream off, want on")
			}
			if got, want := s.JetStreamConfig().MaxMemory, int64(256<<20); got != want {
				t.Errorf("got JetStream max memory %d, want %d (nats.jetstream.maxMemoryStore 256Mi)", got, want)
			}
		})
	}
}

// checkNATSImage: the chart's NATS image is the nats-server version this test parses
// the configuration with (go.mod pins github.com/nats-io/nats-server/v2).
func checkNATSImage(t *testing.T, image string) {
	t.Helper()
	_, tag, _ := strings.Cut(image, ":")
	version, _, _ := strings.Cut(tag, "-")
	if version != server.VERSION {
		t.Errorf("got NATS image %s, want nats:%s-alpine, the nats-server version test/manifests parses its configuration with", image, server.VERSION)
	}
}

// writeTestCerts writes ca.crt, tls.crt and tls.key into dir: a CA and a server
// certificate it signed.
func writeTestCerts(t *testing.T, dir string) {
	t.Helper()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "nats"},
		DNSNames:  []string{"localhost"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		KeyUsage:    x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, caTmpl, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	for name, block := range map[string]*pem.Block{
		"ca.crt":  {Type: "CERTIFICATE", Bytes: caDER},
		"tls.crt": {Type: "CERTIFICATE", Bytes: der},
		"tls.key": {Type: "EC PRIVATE KEY", Bytes: keyDER},
	} {
		if err := os.WriteFile(filepath.Join(dir, name), pem.EncodeToMemory(block), 0o600); err != nil {
			t.Fatal(err)
		}
	}
}
