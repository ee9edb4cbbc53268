package authcallout

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// kubeconfigFor writes a kubeconfig naming server, with no credentials.
func kubeconfigFor(t *testing.T, server string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "kubeconfig")
	conf := `apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "` + server + `"}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
users: [{name: u, user: {}}]
current-context: c
`
	if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestPublishIssuerKey: the public key lands in the ConfigMap's one key through a merge
// patch of that ConfigMap, the one request (and verb) the chart's Role allows; a missing
// ConfigMap is named.
func TestPublishIssuerKey(t *testing.T) {
	var (
		mu   sync.Mutex
		data = map[string]string{"other": "kept"}
	)
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/api/v1/namespaces/gpuscaler/configmaps/gpuscaler-auth-callout-issuer" {
			http.Error(w, `{"message":"configmaps not found"}`, http.StatusNotFound)
			return
		}
		if r.Method != http.MethodPatch || r.Header.Get("Content-Type") != "application/merge-patch+json" {
			t.Errorf("got %s with %s, want PATCH with application/merge-patch+json", r.Method, r.Header.Get("Content-Type"))
		}
		body, _ := io.ReadAll(r.Body)
		var patch struct {
			Data map[string]string `json:"data"`
		}
		if err := json.Unmarshal(body, &patch); err != nil {
			t.Errorf("patch %s: %v", body, err)
		}
		mu.Lock()
		for k, v := range patch.Data {
			data[k] = v
		}
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"kind":"ConfigMap"}`))
	}))
	defer api.Close()
	kubeconfig := kubeconfigFor(t, api.URL)

	if err := PublishIssuerKey(t.Context(), kubeconfig, "gpuscaler/gpuscaler-auth-callout-issuer", "AKEY"); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	if data[IssuerKeyName] != "AKEY" || data["other"] != "kept" {
		t.Errorf("got ConfigMap data %v, want %s: AKEY beside what was there", data, IssuerKeyName)
	}
	mu.Unlock()

	err := PublishIssuerKey(t.Context(), kubeconfig, "gpuscaler/missing", "AKEY")
	if err == nil || !strings.Contains(err.Error(), "does not exist") {
		t.Errorf("got %v for a missing ConfigMap, want one saying it does not exist", err)
	}
	for _, ref := range []string{"missing", "/name", "ns/", "a/b/c"} {
		if err := PublishIssuerKey(t.Context(), kubeconfig, ref, "AKEY"); err == nil || !strings.Contains(err.Error(), "namespace/name") {
			t.Errorf("got %v for ConfigMap %q, want one asking for namespace/name", err, ref)
		}
	}
}
