package manifests

import (
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/conf"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/gpuscaler/gpuscaler/deploy/render"
	"github.com/gpuscaler/gpuscaler/test/testkit"
)

// TestBundledNATSConfig parses the bundled server's rendered configuration with the
// nats-server library at the version of the chart's image, checks it against the
// StatefulSet that runs it, and starts the default one to see JetStream come up.
func TestBundledNATSConfig(t *testing.T) {
	for _, c := range render.Cases {
		t.Run(c.Name, func(t *testing.T) {
			objs := caseObjects(t, c)
			sts, ok := find[*appsv1.StatefulSet](objs, render.Release+"-nats")
			if !ok {
				t.Skip("no bundled NATS in this case")
			}
			cm, ok := find[*corev1.ConfigMap](objs, render.Release+"-nats")
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
			if strings.Contains(conf, "/etc/nats/route-tls/") {
				if mounts["/etc/nats/route-tls"] == "" {
					t.Errorf("got route TLS files under /etc/nats/route-tls, not mounted (mounts %v)", mounts)
				}
				conf = strings.ReplaceAll(conf, "/etc/nats/route-tls/", tlsDir+"/")
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
			issuer, err := nkeys.CreateAccount()
			if err != nil {
				t.Fatal(err)
			}
			issuerPub, _ := issuer.PublicKey()
			t.Setenv("POD_NAME", sts.Name+"-0")
			t.Setenv("NATS_USER", "u")
			t.Setenv("NATS_PASSWORD", "p")
			t.Setenv("NATS_TOKEN", "tok")
			t.Setenv("CALLOUT_ISSUER", issuerPub)
			t.Setenv("CALLOUT_PASSWORD", "callout-secret")
			t.Setenv("NATS_ROUTE_PASSWORD", "route-secret")
			// The route URLs, as the kubelet composes them from the pod's variables.
			for _, e := range ctr.Env {
				if strings.HasPrefix(e.Name, "NATS_ROUTE_") && e.ValueFrom == nil {
					t.Setenv(e.Name, strings.ReplaceAll(e.Value, "$(NATS_ROUTE_PASSWORD)", "route-secret"))
				}
			}
			opts, err := server.ProcessConfigFile(path)
			if err != nil {
				t.Fatalf("nats-server rejects the configuration: %v\n%s", err, conf)
			}
			callout := strings.Contains(strings.Join(scalerArgs(objs), " "), "--nats-token-file=")
			if callout {
				checkAuthCalloutConfig(t, objs, sts, opts, issuerPub)
			} else if opts.AuthCallout != nil {
				t.Errorf("got auth_callout in the configuration, and a scaler without --nats-token-file")
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
				if !strings.Contains(r.Hostname(), "."+sts.Spec.ServiceName+"."+render.Namespace+".svc.") {
					t.Errorf("got route %s, want a name under the StatefulSet's Service %s", r, sts.Spec.ServiceName)
				}
				// Each server logs in to the others with the route password.
				if pw, _ := r.User.Password(); r.User.Username() != "route" || pw != "route-secret" {
					t.Errorf("got route %s logging in as %q, want route with $NATS_ROUTE_PASSWORD", r.Redacted(), r.User.Username())
				}
			}
			if replicas > 1 {
				// A route is trusted with every account: it must log in.
				if opts.Cluster.Username != "route" || opts.Cluster.Password != "route-secret" {
					t.Errorf("got cluster authorization user %q, want route with $NATS_ROUTE_PASSWORD", opts.Cluster.Username)
				}
				if got, want := envSecret(ctr, "NATS_ROUTE_PASSWORD"), render.Release+"-nats-routes/route-password"; !strings.HasSuffix(got, "/route-password") {
					t.Errorf("got $NATS_ROUTE_PASSWORD from %q, want a Secret's route-password (%s unless nats.cluster.secretName)", got, want)
				}
				if opts.TLSConfig != nil && opts.Cluster.TLSConfig == nil {
					t.Errorf("got clients over TLS and plain routes, want routes over TLS whenever clients are")
				}
			}
			args := strings.Join(scalerArgs(objs), " ")
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
			if callout {
				checkAuthCalloutServes(t, s.ClientURL(), issuer)
			}
		})
	}
}

func scalerArgs(objs []Object) []string {
	scaler, ok := find[*appsv1.Deployment](objs, render.Release)
	if !ok {
		return nil
	}
	return scaler.Spec.Template.Spec.Containers[0].Args
}

// checkAuthCalloutConfig: the bundled server hands every client to the auth callout,
// trusting the issuer whose public key the callout writes to a ConfigMap (from the seed
// only the callout reads), and admits the callout by the password the callout has.
func checkAuthCalloutConfig(t *testing.T, objs []Object, sts *appsv1.StatefulSet, opts *server.Options, issuerPub string) {
	t.Helper()
	ac := opts.AuthCallout
	if ac == nil {
		t.Fatal("got no auth_callout in the configuration, and a scaler with --nats-token-file")
	}
	if ac.Issuer != issuerPub || ac.Account != "AUTH" || !slices.Equal(ac.AuthUsers, []string{"callout"}) {
		t.Errorf("got auth_callout issuer %s, account %s, auth users %v; want $CALLOUT_ISSUER, AUTH, [callout]", ac.Issuer, ac.Account, ac.AuthUsers)
	}
	if opts.SystemAccount != "SYS" {
		t.Errorf("got system account %q, want SYS", opts.SystemAccount)
	}
	var calloutUser bool
	for _, u := range opts.Users {
		calloutUser = calloutUser || (u.Username == "callout" && u.Password == "callout-secret" && u.Account != nil && u.Account.Name == "AUTH")
	}
	if !calloutUser {
		t.Errorf("got users %v, want callout with $CALLOUT_PASSWORD in account AUTH", opts.Users)
	}

	dep, ok := find[*appsv1.Deployment](objs, render.Release+"-auth-callout")
	if !ok {
		t.Fatal("got no auth callout Deployment")
	}
	pod := sts.Spec.Template.Spec
	ctr := pod.Containers[0]
	callout := dep.Spec.Template.Spec
	// The server reads the issuer's public key from the ConfigMap key the callout writes
	// it to; nothing of the server's reads the seed.
	cm := flagValue(callout.Containers[0].Args, "issuer-key-configmap")
	var ref *corev1.ConfigMapKeySelector
	for _, e := range ctr.Env {
		if e.Name == "CALLOUT_ISSUER" && e.ValueFrom != nil {
			ref = e.ValueFrom.ConfigMapKeyRef
		}
	}
	if ref == nil || cm != render.Namespace+"/"+ref.Name || ref.Key != "issuer.pub" || deref(ref.Optional, false) {
		t.Errorf("got $CALLOUT_ISSUER from %+v and the callout writing --issuer-key-configmap=%q, want the server to wait for key issuer.pub of that ConfigMap", ref, cm)
	}
	if seed := secretFile(t, callout, callout.Containers[0], flagValue(callout.Containers[0].Args, "issuer-seed-file")); !strings.HasSuffix(seed, "/issuer-seed") {
		t.Errorf("got the callout's seed from %q, want a Secret's issuer-seed", seed)
	}
	serverPassword := envSecret(ctr, "CALLOUT_PASSWORD")
	calloutPassword := envSecret(callout.Containers[0], "GPUSCALER_NATS_PASSWORD")
	if serverPassword == "" || serverPassword != calloutPassword {
		t.Errorf("got the servers' callout password from %q, the callout's from %q, want one Secret key", serverPassword, calloutPassword)
	}
	if !slices.Contains(callout.Containers[0].Args, "--nats-user=callout") {
		t.Errorf("got callout args %v, want --nats-user=callout", callout.Containers[0].Args)
	}
}

// mountedVolume names the volume a file lies on in a container.
func mountedVolume(mounts []corev1.VolumeMount, file string) string {
	for _, m := range mounts {
		if strings.HasPrefix(file, strings.TrimSuffix(m.MountPath, "/")+"/") {
			return m.Name
		}
	}
	return ""
}

// secretFile says which Secret key a file in a container comes from: "secret/key".
func secretFile(t *testing.T, pod corev1.PodSpec, ctr corev1.Container, file string) string {
	t.Helper()
	vol := mountedVolume(ctr.VolumeMounts, file)
	for _, m := range ctr.VolumeMounts {
		if m.Name != vol {
			continue
		}
		rel := strings.TrimPrefix(file, strings.TrimSuffix(m.MountPath, "/")+"/")
		for _, v := range pod.Volumes {
			if v.Name != vol || v.Secret == nil {
				continue
			}
			for _, it := range v.Secret.Items {
				if it.Path == rel {
					return v.Secret.SecretName + "/" + it.Key
				}
			}
			if len(v.Secret.Items) == 0 {
				return v.Secret.SecretName + "/" + rel
			}
		}
	}
	return ""
}

// envSecret says which Secret key a container's variable comes from: "secret/key".
func envSecret(ctr corev1.Container, name string) string {
	for _, e := range ctr.Env {
		if e.Name == name && e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
			return e.ValueFrom.SecretKeyRef.Name + "/" + e.ValueFrom.SecretKeyRef.Key
		}
	}
	return ""
}

// checkAuthCalloutServes plays the auth callout against the running bundled server (the
// protocol of nats-server's server/auth_callout.go): logged in as callout, it admits
// the token "scaler" as a user of account GPUSCALER and refuses anything else. The
// admitted user must get JetStream (the account has it); the refused one nothing.
func checkAuthCalloutServes(t *testing.T, url string, issuer nkeys.KeyPair) {
	t.Helper()
	callout, err := nats.Connect(url, nats.UserInfo("callout", "callout-secret"))
	if err != nil {
		t.Fatalf("the callout cannot log in with $CALLOUT_PASSWORD: %v", err)
	}
	defer callout.Close()
	_, err = callout.Subscribe("$SYS.REQ.USER.AUTH", func(m *nats.Msg) {
		req, err := jwt.DecodeAuthorizationRequestClaims(string(m.Data))
		if err != nil {
			t.Errorf("decode auth request: %v", err)
			return
		}
		resp := jwt.NewAuthorizationResponseClaims(req.UserNkey)
		resp.Audience = req.Server.ID
		if req.ConnectOptions.Token == "scaler" {
			user := jwt.NewUserClaims(req.UserNkey)
			user.Audience = "GPUSCALER"
			user.Expires = time.Now().Add(time.Minute).Unix()
			if resp.Jwt, err = user.Encode(issuer); err != nil {
				t.Errorf("encode user: %v", err)
				return
			}
		} else {
			resp.Error = "not a known identity"
		}
		signed, err := resp.Encode(issuer)
		if err != nil {
			t.Errorf("encode response: %v", err)
			return
		}
		m.Respond([]byte(signed))
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := callout.Flush(); err != nil {
		t.Fatal(err)
	}

	if nc, err := nats.Connect(url, nats.Token("someone-else"), nats.Timeout(5*time.Second)); err == nil {
		nc.Close()
		t.Errorf("got a client the callout refused connected, want it refused")
	} else if !strings.Contains(strings.ToLower(err.Error()), "authorization violation") {
		t.Errorf("got %v for a client the callout refused, want an authorization violation", err)
	}

	nc, err := nats.Connect(url, nats.Token("scaler"), nats.Timeout(5*time.Second))
	if err != nil {
		t.Fatalf("the callout admitted the client, NATS did not: %v", err)
	}
	defer nc.Close()
	js, err := nc.JetStream()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.AddStream(&nats.StreamConfig{Name: "GPUSCALER", Subjects: []string{"gpuscaler.v1.>"}, MaxMsgsPerSubject: 1}); err != nil {
		t.Errorf("got %v creating the GPUSCALER stream as a user of account GPUSCALER, want JetStream there", err)
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
	ca := testkit.NewCA(t, "test CA")
	cert, key := ca.Issue(t, "nats", 0)
	testkit.WriteFile(t, dir, "ca.crt", ca.PEM)
	testkit.WriteFile(t, dir, "tls.crt", cert)
	testkit.WriteFile(t, dir, "tls.key", key)
}

// TestBundledNATSAccountsMatchTheCallout: the accounts, imports, exports and limits of the
// chart's default NATS configuration are the ones the callout's own `gpuscaler
// auth-callout nats-config` prints (authcallout.NATSConfig, what its tests run), so the
// accounts the callout places users in exist, with the imports that keep replies in the
// sender's account and the limits documented for them. With namespaces listed for
// JetStream, nats-config is given the callout's own --jetstream-namespaces, which the
// scaler must be given too.
func TestBundledNATSAccountsMatchTheCallout(t *testing.T) {
	for _, name := range []string{render.Cases[0].Name, "jetstream-namespaces"} {
		t.Run(name, func(t *testing.T) {
			i := slices.IndexFunc(render.Cases, func(c render.Case) bool { return c.Name == name })
			if i < 0 {
				t.Fatalf("no render case %s", name)
			}
			objs := caseObjects(t, render.Cases[i])
			cm, ok := find[*corev1.ConfigMap](objs, render.Release+"-nats")
			if !ok {
				t.Fatal("got no ConfigMap with the NATS configuration")
			}
			dep, ok := find[*appsv1.Deployment](objs, render.Release+"-auth-callout")
			if !ok {
				t.Fatal("got no auth callout Deployment")
			}
			namespaces := flagValue(dep.Spec.Template.Spec.Containers[0].Args, "jetstream-namespaces")
			if got := flagValue(scalerArgs(objs), "jetstream-namespaces"); got != namespaces {
				t.Errorf("got the scaler's --jetstream-namespaces %q, the callout's %q, want the same", got, namespaces)
			}
			if name != render.Cases[0].Name && namespaces == "" {
				t.Fatal("got a callout without --jetstream-namespaces in the case that lists some")
			}
			out, err := exec.Command(gpuscalerBinary(t), "auth-callout", "nats-config", "--jetstream-namespaces="+namespaces).Output()
			if err != nil {
				t.Fatalf("gpuscaler auth-callout nats-config: %v", err)
			}
			t.Setenv("POD_NAME", "nats-0")
			t.Setenv("CALLOUT_ISSUER", "issuer")
			t.Setenv("CALLOUT_PASSWORD", "password")
			chart, err := conf.Parse(cm.Data["nats.conf"])
			if err != nil {
				t.Fatalf("chart's nats.conf: %v", err)
			}
			callout, err := conf.Parse(string(out))
			if err != nil {
				t.Fatalf("nats-config's output: %v", err)
			}
			for _, key := range []string{"accounts", "system_account", "authorization"} {
				if !reflect.DeepEqual(chart[key], callout[key]) {
					t.Errorf("%s: the chart renders\n%v\nthe callout expects\n%v", key, chart[key], callout[key])
				}
			}
		})
	}
}
