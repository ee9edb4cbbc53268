// Package authcallout is gpuscaler's NATS auth callout service. The NATS server hands it
// every connecting client's credentials; it establishes who the client is — a Kubernetes
// ServiceAccount, from a projected token reviewed by the apiserver's TokenReview API, or a
// static user for clients outside the cluster — and answers with a short-lived NATS user
// whose permissions follow from that identity alone:
//
//   - a producer in namespace ns publishes gpuscaler.v1.queue.<ns>.<queue>.<producer>
//     (gpuscaler.v1.queue.<ns>.*.*) and nothing else;
//   - a collector publishes its own node's subject, the node taken from the token's
//     bound-pod claims as the apiserver reports them, never from what the client says;
//   - the scaler reads everything and uses the JetStream API of the GPUSCALER and
//     GPUSCALER_QUEUES streams;
//   - nobody else reads, and nobody else touches the JetStream API;
//   - but a producer of a namespace listed in Accounts.JetStreamNamespaces joins that
//     namespace's own account, where it may do anything, JetStream included: the
//     account's imports and exports alone say what reaches other accounts.
//
// It never grants more than the identity allows, and it denies with a reason the client,
// the callout's log and its metrics all see.
package authcallout

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/jwt/v2"

	gpuscalerv1 "github.com/gpuscaler/gpuscaler/proto/gpuscaler/v1"
)

// Role is what an identity may do on the bus.
type Role int

const (
	// RoleProducer publishes QueueReports for the queues of its own namespace.
	RoleProducer Role = iota + 1
	// RoleCollector publishes the NodeReports of its own node.
	RoleCollector
	// RoleScaler reads every report and keeps the GPUSCALER and GPUSCALER_QUEUES streams.
	RoleScaler
)

// String is the role's name in logs, metrics and the static-users file.
func (r Role) String() string {
	switch r {
	case RoleProducer:
		return "producer"
	case RoleCollector:
		return "collector"
	case RoleScaler:
		return "scaler"
	default:
		return "unknown"
	}
}

// parseRole reads a role's name.
func parseRole(s string) (Role, error) {
	for _, r := range []Role{RoleProducer, RoleCollector, RoleScaler} {
		if s == r.String() {
			return r, nil
		}
	}
	return 0, fmt.Errorf("role %q: want producer, collector or scaler", s)
}

// Identity is who a client proved to be, and so what it may do.
type Identity struct {
	Role Role
	// Name is who it is, for logs and the issued user's name:
	// system:serviceaccount:<ns>:<sa>, or static:<user>.
	Name string
	// Namespace is the namespace a producer speaks for (a ServiceAccount's own).
	Namespace string
	// Node is the node a collector speaks for.
	Node string
	// Expires is when the credential stops being valid; zero for static users, which
	// the callout's --user-max-ttl alone bounds.
	Expires time.Time
}

// permissions returns what id may publish and subscribe to. Allow lists are exhaustive:
// NATS denies whatever an allow list leaves out. jetStream says a producer joins its
// namespace's own account (Accounts.JetStreamNamespaces).
func (id Identity) permissions(jetStream bool) (jwt.Permissions, error) {
	var p jwt.Permissions
	switch id.Role {
	case RoleProducer:
		if jetStream {
			if err := gpuscalerv1.ValidateNamespace(id.Namespace); err != nil {
				return p, err
			}
			// The account is the namespace's alone: what reaches another account is what
			// the account imports and exports (NATSConfig), whatever is published in it.
			p.Pub.Allow.Add(">")
			p.Sub.Allow.Add(">")
			return p, nil
		}
		subjects, err := gpuscalerv1.NamespaceQueueSubjects(id.Namespace)
		if err != nil {
			return p, err
		}
		p.Pub.Allow.Add(subjects)
		// Replies to its own requests only: gpuscaler publish waits for the stream's ack.
		p.Sub.Allow.Add(gpuscalerv1.InboxPrefix(id.Namespace) + ".>")
	case RoleCollector:
		subject, err := gpuscalerv1.NodeSubject(id.Node)
		if err != nil {
			return p, err
		}
		p.Pub.Allow.Add(subject)
		p.Sub.Deny.Add(">")
	case RoleScaler:
		// The scaler reads every report, the replies to its own JetStream requests and the
		// subjects of the work queues its triggers name (to wake on their first message),
		// so it may subscribe to anything; what it may publish is the JetStream API of its
		// own stream, and read-only consumer and stream info for the work queues.
		p.Pub.Allow.Add(scalerJetStreamAPI(gpuscalerv1.StreamName, gpuscalerv1.QueueStreamName)...)
	default:
		return p, fmt.Errorf("no permissions for role %s", id.Role)
	}
	return p, nil
}

// scalerJetStreamAPI lists the JetStream API subjects the scaler publishes to: creating,
// updating and reading its streams (the node stream and the queue stream), its ordered
// consumer on each (create, pull, flow control, delete), and the info of any stream and
// consumer, which is read-only: its own account's and, through the imports of
// NATSConfig, each JetStream namespace's. Deleting or purging a stream, and every other
// stream's consumers, are not on the list.
func scalerJetStreamAPI(streams ...string) []string {
	api := []string{
		"$JS.API.INFO",
		"$JS.API.STREAM.INFO.*",
		"$JS.API.CONSUMER.INFO.*.*",
		gpuscalerv1.TenantConsumerInfoAll,
	}
	for _, stream := range streams {
		api = append(api,
			"$JS.API.STREAM.CREATE."+stream,
			"$JS.API.STREAM.UPDATE."+stream,
			"$JS.API.STREAM.MSG.GET."+stream,
			"$JS.API.DIRECT.GET."+stream,
			"$JS.API.DIRECT.GET."+stream+".>",
			"$JS.API.CONSUMER.CREATE."+stream,
			"$JS.API.CONSUMER.CREATE."+stream+".>",
			"$JS.API.CONSUMER.DELETE."+stream+".*",
			"$JS.API.CONSUMER.MSG.NEXT."+stream+".*",
			"$JS.FC."+stream+".>",
		)
	}
	return api
}

// A pattern names ServiceAccounts: namespace/name, where either part may be "*".
type pattern struct{ namespace, name string }

// parsePatterns reads a comma-separated list of namespace/name patterns. flag names the
// flag the list came from, for errors.
func parsePatterns(flag, list string) ([]pattern, error) {
	var out []pattern
	for item := range strings.SplitSeq(list, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		ns, name, ok := strings.Cut(item, "/")
		if !ok || ns == "" || name == "" || strings.Contains(name, "/") {
			return nil, fmt.Errorf("%s: %q is not namespace/serviceaccount (either part may be *)", flag, item)
		}
		for _, part := range []string{ns, name} {
			if part != "*" && strings.Contains(part, "*") {
				return nil, fmt.Errorf("%s: %q: * matches a whole part only, not part of a name", flag, item)
			}
		}
		if ns != "*" {
			if err := gpuscalerv1.ValidateNamespace(ns); err != nil {
				return nil, fmt.Errorf("%s: %q: %w", flag, item, err)
			}
		}
		out = append(out, pattern{ns, name})
	}
	return out, nil
}

func (p pattern) matches(namespace, name string) bool {
	return (p.namespace == "*" || p.namespace == namespace) && (p.name == "*" || p.name == name)
}

func matchesAny(ps []pattern, namespace, name string) bool {
	for _, p := range ps {
		if p.matches(namespace, name) {
			return true
		}
	}
	return false
}

// denial is why a client is refused: a reason for metrics (a short, fixed word) and a
// message for the client and the log.
type denial struct {
	reason string
	msg    string
}

func (d *denial) Error() string { return d.msg }

func deny(reason, format string, args ...any) error {
	return &denial{reason: reason, msg: fmt.Sprintf(format, args...)}
}

// reasonOf returns err's metric reason: a denial's own, or "error" for anything else.
func reasonOf(err error) string {
	var d *denial
	if errors.As(err, &d) {
		return d.reason
	}
	return "error"
}
