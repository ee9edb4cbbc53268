package authcallout

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/gpuscaler/gpuscaler/authcallout/parse"
)

// The extra fields the apiserver's TokenReview reports for a token bound to a pod
// (k8s.io/apiserver/pkg/authentication/serviceaccount: PodNameKey, PodUIDKey, NodeNameKey;
// the node keys since Kubernetes 1.30, feature ServiceAccountTokenPodNodeInfo).
const (
	extraPodName  = "authentication.kubernetes.io/pod-name"
	extraPodUID   = "authentication.kubernetes.io/pod-uid"
	extraNodeName = "authentication.kubernetes.io/node-name"
)

// serviceAccountPrefix begins a ServiceAccount's user name:
// system:serviceaccount:<namespace>:<name>.
const serviceAccountPrefix = "system:serviceaccount:"

// reviewer establishes a ServiceAccount identity from a token with the TokenReview API.
type reviewer struct {
	kube       Kube
	audience   string
	scalers    []pattern
	collectors []pattern
	producers  []pattern
	podLookup  bool
	timeout    time.Duration
}

// review returns the identity token proves, or a denial that says why not. now is the
// time the token's expiry is judged against.
func (r *reviewer) review(ctx context.Context, token string, now time.Time) (Identity, error) {
	claims, err := parse.Token(token)
	if err != nil {
		return Identity{}, deny("malformed_token", "token is not a Kubernetes ServiceAccount token: %v", err)
	}
	// Refusals that need no apiserver: the claims are unverified, but a client can only
	// talk itself out of access with them, never in.
	if !claims.Expires.After(now) {
		return Identity{}, deny("expired", "ServiceAccount token expired at %s; mount a projected token, which the kubelet refreshes",
			claims.Expires.UTC().Format(time.RFC3339))
	}
	if !claims.HasAudience(r.audience) {
		return Identity{}, deny("wrong_audience", "ServiceAccount token is for audience %q, want %q (serviceAccountToken.audience of the projected volume)",
			strings.Join(claims.Audience, ","), r.audience)
	}

	ctx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	st, err := r.kube.ReviewToken(ctx, token, []string{r.audience})
	if err != nil {
		return Identity{}, deny("review_failed", "cannot review the token with the Kubernetes API: %v", err)
	}
	if !st.Authenticated {
		why := st.Error
		if why == "" {
			why = "no reason given"
		}
		return Identity{}, deny("rejected", "the Kubernetes API rejected the token (expired, revoked, or its pod is gone): %s", why)
	}
	// The apiserver answers with the audiences the token is valid for among those asked;
	// an apiserver that ignores spec.audiences answers with its own, so check.
	if !slices.Contains(st.Audiences, r.audience) {
		return Identity{}, deny("wrong_audience", "the Kubernetes API found the token valid for audiences %q, not %q",
			strings.Join(st.Audiences, ","), r.audience)
	}
	ns, sa, ok := parseServiceAccountUser(st.User.Username)
	if !ok {
		return Identity{}, deny("not_service_account", "token is for %q, not a ServiceAccount", st.User.Username)
	}
	id := Identity{Name: st.User.Username, Namespace: ns, Expires: claims.Expires}
	switch {
	case matchesAny(r.scalers, ns, sa):
		id.Role = RoleScaler
	case matchesAny(r.collectors, ns, sa):
		id.Role = RoleCollector
		node, err := r.nodeOf(ctx, st.User)
		if err != nil {
			return Identity{}, err
		}
		id.Node = node
	case matchesAny(r.producers, ns, sa):
		id.Role = RoleProducer
	default:
		return Identity{}, deny("not_listed", "ServiceAccount %s/%s is not among the scalers, collectors or producers this bus admits", ns, sa)
	}
	return id, nil
}

// nodeOf returns the node a collector's token is bound to: from the token's node claim as
// the apiserver reports it, or else, with pod lookup on, from the pod the token is bound
// to, checked by uid. Never from anything the client sent.
func (r *reviewer) nodeOf(ctx context.Context, u UserInfo) (string, error) {
	if node := extra(u, extraNodeName); node != "" {
		return node, nil
	}
	podName, podUID := extra(u, extraPodName), extra(u, extraPodUID)
	if podName == "" {
		return "", deny("no_node", "collector token %s is not bound to a pod, so it names no node; mount a projected ServiceAccount token in the collector's pod", u.Username)
	}
	if !r.podLookup {
		return "", deny("no_node", "collector token %s carries no node claim (Kubernetes before 1.30?); run the callout with --pod-lookup to read the node from pod %s", u.Username, podName)
	}
	ns, _, _ := parseServiceAccountUser(u.Username)
	uid, node, err := r.kube.Pod(ctx, ns, podName)
	switch {
	case errors.Is(err, ErrPodNotFound):
		return "", deny("no_node", "collector token is bound to pod %s/%s, which no longer exists", ns, podName)
	case err != nil:
		return "", deny("review_failed", "cannot read pod %s/%s for its node: %v", ns, podName, err)
	case uid != podUID:
		return "", deny("no_node", "collector token is bound to pod %s/%s uid %s, but that pod is now uid %s", ns, podName, podUID, uid)
	case node == "":
		return "", deny("no_node", "collector pod %s/%s is not scheduled to a node", ns, podName)
	}
	return node, nil
}

// extra returns the single value of a TokenReview extra field, or "".
func extra(u UserInfo, key string) string {
	if v := u.Extra[key]; len(v) == 1 {
		return v[0]
	}
	return ""
}

// parseServiceAccountUser splits system:serviceaccount:<namespace>:<name>.
func parseServiceAccountUser(user string) (namespace, name string, ok bool) {
	rest, ok := strings.CutPrefix(user, serviceAccountPrefix)
	if !ok {
		return "", "", false
	}
	namespace, name, ok = strings.Cut(rest, ":")
	if !ok || namespace == "" || name == "" || strings.Contains(name, ":") {
		return "", "", false
	}
	return namespace, name, true
}

// String describes the reviewer's configuration for the start-up log.
func (r *reviewer) String() string {
	return fmt.Sprintf("audience %q, scalers %v, collectors %v, producers %v", r.audience, r.scalers, r.collectors, r.producers)
}
