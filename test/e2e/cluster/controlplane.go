package cluster

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// ControlPlane is etcd and kube-apiserver on loopback: token authentication (one admin
// token in system:masters), RBAC, a generated serving certificate and service-account key
// pair, and the aggregation layer (a front-proxy CA and client certificate), through
// which KEDA's metrics adapter serves external.metrics.k8s.io. The controller manager
// and scheduler start apart (StartControllers).
type ControlPlane struct {
	Etcd, APIServer *Process
	// Host is the API server's URL; Config a client config for the admin token.
	Host   string
	Config *rest.Config
	// Kubeconfig is a file with the same credentials, for the other processes.
	Kubeconfig string
	// CA signed every certificate of the run but the front proxy's.
	CA *CA
	// Dir holds the API server's certificates and keys.
	Dir string

	etcdURL string
}

// ControlPlaneOptions are the binaries and the run's folder.
type ControlPlaneOptions struct {
	EtcdBin, APIServerBin string
	// Dir holds the etcd data, certificates, keys and the kubeconfig.
	Dir string
}

const adminToken = "gpuscaler-e2e-admin-token"

// frontProxyClient is the common name of the API server's front-proxy client certificate.
const frontProxyClient = "front-proxy-client"

// StartControlPlane starts etcd, then kube-apiserver, and waits until the API server's
// /readyz passes.
func StartControlPlane(ctx context.Context, ps *Procs, o ControlPlaneOptions) (*ControlPlane, error) {
	cp := &ControlPlane{}
	var err error
	if cp.CA, err = NewCA("gpuscaler-e2e-ca"); err != nil {
		return nil, err
	}
	if err := cp.startEtcd(ctx, ps, o); err != nil {
		return nil, err
	}
	if err := cp.startAPIServer(ctx, ps, o); err != nil {
		return nil, err
	}
	return cp, nil
}

func (cp *ControlPlane) startEtcd(ctx context.Context, ps *Procs, o ControlPlaneOptions) error {
	client, err := FreePort()
	if err != nil {
		return err
	}
	peer, err := FreePort()
	if err != nil {
		return err
	}
	clientURL := fmt.Sprintf("http://127.0.0.1:%d", client)
	peerURL := fmt.Sprintf("http://127.0.0.1:%d", peer)
	cp.Etcd, err = ps.Start("etcd", o.EtcdBin, []string{
		"--name=e2e",
		"--data-dir=" + filepath.Join(o.Dir, "etcd"),
		"--listen-client-urls=" + clientURL,
		"--advertise-client-urls=" + clientURL,
		"--listen-peer-urls=" + peerURL,
		"--initial-advertise-peer-urls=" + peerURL,
		"--initial-cluster=e2e=" + peerURL,
		"--listen-metrics-urls=", // none
		"--unsafe-no-fsync",      // a throwaway store: no fsync, faster on a shared CI disk
		"--log-level=warn",
	})
	if err != nil {
		return err
	}
	err = Eventually(ctx, time.Minute, 100*time.Millisecond, "etcd healthy", cp.Etcd, func(ctx context.Context) (bool, error) {
		var h struct {
			Health string `json:"health"`
		}
		if err := getJSON(ctx, http.DefaultClient, clientURL+"/health", &h); err != nil {
			return false, Retry(err)
		}
		return h.Health == "true", nil
	})
	if err != nil {
		return err
	}
	cp.etcdURL = clientURL
	return nil
}

func (cp *ControlPlane) startAPIServer(ctx context.Context, ps *Procs, o ControlPlaneOptions) error {
	dir := filepath.Join(o.Dir, "apiserver")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	cp.Dir = dir
	if err := cp.CA.WriteServingPair(dir, "kube-apiserver", "kubernetes", "kubernetes.default", "kubernetes.default.svc"); err != nil {
		return err
	}
	// The aggregation layer: the API server proxies external.metrics.k8s.io to KEDA's
	// adapter with a client certificate from its own CA (requestheader), naming the
	// user in X-Remote-* headers. The two CAs must differ, or the API server insists
	// on --requestheader-allowed-names matching its client CA's certificates too.
	frontProxy, err := NewCA("gpuscaler-e2e-front-proxy-ca")
	if err != nil {
		return err
	}
	proxyCert, proxyKey, err := frontProxy.Issue(frontProxyClient, nil, nil, nil)
	if err != nil {
		return err
	}
	for name, data := range map[string][]byte{"front-proxy-ca.crt": frontProxy.CertPEM, "front-proxy-client.crt": proxyCert, "front-proxy-client.key": proxyKey} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			return err
		}
	}
	sa, saPub := filepath.Join(dir, "sa.key"), filepath.Join(dir, "sa.pub")
	if err := WriteRSAKeyPair(sa, saPub); err != nil {
		return err
	}
	tokens := filepath.Join(dir, "tokens.csv")
	if err := os.WriteFile(tokens, []byte(adminToken+`,gpuscaler-e2e-admin,gpuscaler-e2e-admin,"system:masters"`+"\n"), 0o600); err != nil {
		return err
	}
	port, err := FreePort()
	if err != nil {
		return err
	}
	cp.APIServer, err = ps.Start("kube-apiserver", o.APIServerBin, []string{
		"--etcd-servers=" + cp.etcdURL,
		"--bind-address=127.0.0.1",
		"--advertise-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(port),
		"--tls-cert-file=" + filepath.Join(dir, "tls.crt"),
		"--tls-private-key-file=" + filepath.Join(dir, "tls.key"),
		"--client-ca-file=" + filepath.Join(dir, "ca.crt"),
		"--token-auth-file=" + tokens,
		"--anonymous-auth=false",
		"--authorization-mode=RBAC",
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file=" + saPub,
		"--service-account-signing-key-file=" + sa,
		"--service-cluster-ip-range=10.96.0.0/16",
		// The reconciler would publish 127.0.0.1 as the kubernetes Service's endpoint,
		// which validation refuses (loopback), and log it every 10 s.
		"--endpoint-reconciler-type=none",
		"--requestheader-client-ca-file=" + filepath.Join(dir, "front-proxy-ca.crt"),
		"--requestheader-allowed-names=" + frontProxyClient,
		"--requestheader-username-headers=X-Remote-User",
		"--requestheader-group-headers=X-Remote-Group",
		"--requestheader-extra-headers-prefix=X-Remote-Extra-",
		"--proxy-client-cert-file=" + filepath.Join(dir, "front-proxy-client.crt"),
		"--proxy-client-key-file=" + filepath.Join(dir, "front-proxy-client.key"),
		"--enable-priority-and-fairness=false",
		"--profiling=false",
		"--v=1",
	})
	if err != nil {
		return err
	}
	cp.Host = fmt.Sprintf("https://127.0.0.1:%d", port)
	cp.Config = &rest.Config{
		Host:            cp.Host,
		BearerToken:     adminToken,
		TLSClientConfig: rest.TLSClientConfig{CAData: cp.CA.CertPEM},
		QPS:             100,
		Burst:           200,
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(cp.CA.CertPEM)
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	err = Eventually(ctx, 3*time.Minute, 200*time.Millisecond, "kube-apiserver ready", cp.APIServer, func(ctx context.Context) (bool, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, cp.Host+"/readyz", nil)
		if err != nil {
			return false, err
		}
		req.Header.Set("Authorization", "Bearer "+adminToken)
		resp, err := hc.Do(req)
		if err != nil {
			return false, Retry(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return false, Retry(fmt.Errorf("/readyz: %s: %s", resp.Status, lastLines(string(body), 5)))
		}
		return true, nil
	})
	if err != nil {
		return err
	}
	cp.Kubeconfig = filepath.Join(o.Dir, "kubeconfig")
	return writeKubeconfig(cp.Kubeconfig, cp.Host, cp.CA.CertPEM, adminToken)
}

func writeKubeconfig(path, host string, ca []byte, token string) error {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["e2e"] = &clientcmdapi.Cluster{Server: host, CertificateAuthorityData: ca}
	cfg.AuthInfos["admin"] = &clientcmdapi.AuthInfo{Token: token}
	cfg.Contexts["e2e"] = &clientcmdapi.Context{Cluster: "e2e", AuthInfo: "admin", Namespace: "default"}
	cfg.CurrentContext = "e2e"
	return clientcmd.WriteToFile(*cfg, path)
}

func getJSON(ctx context.Context, c *http.Client, url string, v any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
		return fmt.Errorf("GET %s: %s: %s", url, resp.Status, body)
	}
	return json.NewDecoder(resp.Body).Decode(v)
}

// waitHTTPOK waits until GET url answers 200 (a process's /readyz), failing early if p
// exits.
func waitHTTPOK(ctx context.Context, timeout, interval time.Duration, what string, p *Process, url string) error {
	return Eventually(ctx, timeout, interval, what, p, func(ctx context.Context) (bool, error) {
		if err := httpOK(ctx, url); err != nil {
			return false, Retry(err)
		}
		return true, nil
	})
}

// httpOK reports whether GET url answers 200.
func httpOK(ctx context.Context, url string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	c := &http.Client{Timeout: 2 * time.Second}
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s: %s", url, resp.Status, lastLines(string(body), 5))
	}
	return nil
}

// lastLines returns the last n lines of s.
func lastLines(s string, n int) string {
	lines := 0
	for i := len(s) - 1; i >= 0; i-- {
		if s[i] == '\n' && i != len(s)-1 {
			lines++
			if lines == n {
				return s[i+1:]
			}
		}
	}
	return s
}
