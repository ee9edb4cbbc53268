package authcallout

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"strings"
)

// IssuerKeyName is the ConfigMap key PublishIssuerKey writes the issuer's public key to.
const IssuerKeyName = "issuer.pub"

// PublishIssuerKey writes the issuer's public key (an account key, "A…") to key
// IssuerKeyName of ConfigMap ref ("namespace/name"), through the Kubernetes API of a
// kubeconfig file (empty: the in-cluster configuration). A NATS server names the issuer
// by its public key (auth_callout.issuer), so it can read it there, and never the seed
// that signs users. It is a merge patch of that one key: the callout needs patch on that
// one ConfigMap, which must exist.
func PublishIssuerKey(ctx context.Context, kubeconfig, ref, publicKey string) error {
	namespace, name, ok := strings.Cut(ref, "/")
	if !ok || namespace == "" || name == "" || strings.Contains(name, "/") {
		return fmt.Errorf("issuer key ConfigMap %q: want namespace/name", ref)
	}
	k, err := newRESTKube(kubeconfig)
	if err != nil {
		return err
	}
	body, err := json.Marshal(map[string]any{"data": map[string]string{IssuerKeyName: publicKey}})
	if err != nil {
		return err
	}
	path := "/api/v1/namespaces/" + url.PathEscape(namespace) + "/configmaps/" + url.PathEscape(name)
	var out struct{}
	if err := k.send(ctx, "PATCH", path, "application/merge-patch+json", body, &out); err != nil {
		if errors.Is(err, ErrPodNotFound) {
			return fmt.Errorf("issuer key ConfigMap %s does not exist (the chart makes it)", ref)
		}
		return fmt.Errorf("issuer key ConfigMap %s: %w", ref, err)
	}
	return nil
}
