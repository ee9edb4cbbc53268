package authcallout

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// Kube is what the callout asks the Kubernetes API: to review a token, and, with pod
// lookup, where a pod runs. NewKube talks to a real API server; the callout needs
// system:auth-delegator for the first and get on pods for the second.
type Kube interface {
	// ReviewToken creates a TokenReview (authentication.k8s.io/v1) and returns its status.
	ReviewToken(ctx context.Context, token string, audiences []string) (TokenReviewStatus, error)
	// Pod returns the uid of pod namespace/name and the node it is bound to, or an error
	// wrapping ErrPodNotFound.
	Pod(ctx context.Context, namespace, name string) (uid, node string, err error)
}

// ErrPodNotFound reports a pod the API server does not have.
var ErrPodNotFound = errors.New("pod not found")

// TokenReviewStatus is the status of a TokenReview, as the API server returns it
// (k8s.io/api/authentication/v1 TokenReviewStatus; the callout declares the few fields
// it reads itself, so the binary links no typed client: see the collector's footprint).
type TokenReviewStatus struct {
	Authenticated bool     `json:"authenticated,omitempty"`
	User          UserInfo `json:"user,omitempty"`
	Audiences     []string `json:"audiences,omitempty"`
	Error         string   `json:"error,omitempty"`
}

// UserInfo is who a reviewed token belongs to.
type UserInfo struct {
	Username string              `json:"username,omitempty"`
	UID      string              `json:"uid,omitempty"`
	Groups   []string            `json:"groups,omitempty"`
	Extra    map[string][]string `json:"extra,omitempty"`
}

// NewKube returns a Kube for the API server of a kubeconfig file, or of the in-cluster
// configuration when kubeconfig is empty.
func NewKube(kubeconfig string) (Kube, error) {
	return newRESTKube(kubeconfig)
}

func newRESTKube(kubeconfig string) (*restKube, error) {
	var (
		cfg *rest.Config
		err error
	)
	if kubeconfig == "" {
		if cfg, err = rest.InClusterConfig(); err != nil {
			return nil, fmt.Errorf("kubernetes in-cluster config (outside a pod, pass --kubeconfig): %w", err)
		}
	} else if cfg, err = clientcmd.BuildConfigFromFlags("", kubeconfig); err != nil {
		return nil, fmt.Errorf("kubeconfig %s: %w", kubeconfig, err)
	}
	cfg.UserAgent = "gpuscaler-auth-callout"
	client, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client for %s: %w", cfg.Host, err)
	}
	host := strings.TrimSuffix(cfg.Host, "/")
	if !strings.Contains(host, "://") {
		host = "https://" + host
	}
	return &restKube{client: client, host: host + strings.TrimSuffix(cfg.APIPath, "/")}, nil
}

// restKube calls the API server's REST API.
type restKube struct {
	client *http.Client
	host   string
}

func (k *restKube) ReviewToken(ctx context.Context, token string, audiences []string) (TokenReviewStatus, error) {
	body, err := json.Marshal(map[string]any{
		"apiVersion": "authentication.k8s.io/v1",
		"kind":       "TokenReview",
		"spec":       map[string]any{"token": token, "audiences": audiences},
	})
	if err != nil {
		return TokenReviewStatus{}, err
	}
	var out struct {
		Status TokenReviewStatus `json:"status"`
	}
	if err := k.do(ctx, http.MethodPost, "/apis/authentication.k8s.io/v1/tokenreviews", body, &out); err != nil {
		return TokenReviewStatus{}, fmt.Errorf("TokenReview: %w", err)
	}
	return out.Status, nil
}

func (k *restKube) Pod(ctx context.Context, namespace, name string) (string, string, error) {
	var out struct {
		Metadata struct {
			UID string `json:"uid"`
		} `json:"metadata"`
		Spec struct {
			NodeName string `json:"nodeName"`
		} `json:"spec"`
	}
	path := "/api/v1/namespaces/" + url.PathEscape(namespace) + "/pods/" + url.PathEscape(name)
	if err := k.do(ctx, http.MethodGet, path, nil, &out); err != nil {
		return "", "", fmt.Errorf("pod %s/%s: %w", namespace, name, err)
	}
	return out.Metadata.UID, out.Spec.NodeName, nil
}

// do sends a request and decodes a 2xx answer's JSON into out. A 404 wraps
// ErrPodNotFound (the callout reads nothing else by name); another status is an error
// with the API server's message.
func (k *restKube) do(ctx context.Context, method, path string, body []byte, out any) error {
	return k.send(ctx, method, path, "application/json", body, out)
}

// send is do with the body's content type.
func (k *restKube) send(ctx context.Context, method, path, contentType string, body []byte, out any) error {
	var r io.Reader
	if body != nil {
		r = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, k.host+path, r)
	if err != nil {
		return err
	}
	req.Header.Set("Accept", "application/json")
	if body != nil {
		req.Header.Set("Content-Type", contentType)
	}
	resp, err := k.client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return err
	}
	if resp.StatusCode/100 != 2 {
		var st struct {
			Message string `json:"message"`
		}
		_ = json.Unmarshal(data, &st)
		if st.Message == "" {
			st.Message = strings.TrimSpace(string(data))
		}
		if resp.StatusCode == http.StatusNotFound {
			return fmt.Errorf("%w: %s", ErrPodNotFound, st.Message)
		}
		return fmt.Errorf("%s %s: %s: %s", method, path, resp.Status, st.Message)
	}
	if err := json.Unmarshal(data, out); err != nil {
		return fmt.Errorf("%s %s: decode the answer: %w", method, path, err)
	}
	return nil
}
