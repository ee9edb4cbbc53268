package authcallout

import (
	"fmt"
	"slices"

	gpuscalerv1 "github.com/gpuscaler/gpuscaler/proto/gpuscaler/v1"
)

// Accounts names the NATS account each role's users join. Each role has an account of
// its own, so that a reply a client names can reach only its own account: the scaler's
// account holds the GPUSCALER stream and exports the report subjects as services, and
// the collectors' and producers' accounts import them. A JetStream ack, or any reply,
// to a message a producer or collector publishes then travels back to that client's
// account alone, never into the stream (which captures gpuscaler.v1.> in the scaler's
// account only), whatever reply subject the client names.
//
// A namespace listed in JetStreamNamespaces has an account of its own instead of the
// producers' (Tenant): its producers' identities join it, and may do anything inside it,
// JetStream included, under the account's limits. It imports only its own namespace's
// queue subjects from the scaler's account, and exports only its consumer info to the
// scaler's, which reads it under gpuscalerv1.TenantJetStreamAPI.
type Accounts struct {
	Scaler, Collector, Producer string
	// JetStreamNamespaces lists the namespaces that get an account of their own with
	// JetStream; each a DNS-1123 label.
	JetStreamNamespaces []string
}

// DefaultAccounts are the accounts of the chart's bundled NATS.
var DefaultAccounts = Accounts{Scaler: "GPUSCALER", Collector: "GPUSCALER_COLLECTORS", Producer: "GPUSCALER_PRODUCERS"}

func (a Accounts) withDefaults() Accounts {
	if a.Scaler == "" {
		a.Scaler = DefaultAccounts.Scaler
	}
	if a.Collector == "" {
		a.Collector = DefaultAccounts.Collector
	}
	if a.Producer == "" {
		a.Producer = DefaultAccounts.Producer
	}
	return a
}

// Tenant names the account of a namespace listed in JetStreamNamespaces.
func (a Accounts) Tenant(namespace string) string { return a.Scaler + "_NS_" + namespace }

// hasJetStream reports whether namespace has an account of its own.
func (a Accounts) hasJetStream(namespace string) bool {
	return namespace != "" && slices.Contains(a.JetStreamNamespaces, namespace)
}

// validate checks the names of JetStreamNamespaces.
func (a Accounts) validate() error {
	for _, ns := range a.JetStreamNamespaces {
		if err := gpuscalerv1.ValidateNamespace(ns); err != nil {
			return fmt.Errorf("JetStream namespaces: %w", err)
		}
	}
	return nil
}

// of returns the account id joins: its role's, or, for a producer of a namespace with
// JetStream, that namespace's own.
func (a Accounts) of(id Identity) string {
	switch id.Role {
	case RoleScaler:
		return a.Scaler
	case RoleCollector:
		return a.Collector
	default:
		if a.hasJetStream(id.Namespace) {
			return a.Tenant(id.Namespace)
		}
		return a.Producer
	}
}

// Limits the accounts of collectors and producers hold their clients to. The server
// applies them (an account's limits, unlike those of users an auth callout issues in
// config mode: nats-server#5002); every connection of the account counts towards
// MaxConnections, each connection alone towards the others.
type Limits struct {
	// MaxConnections bounds the account's connections together.
	MaxConnections int
	// MaxSubscriptions bounds one connection's subscriptions.
	MaxSubscriptions int
	// MaxPayload bounds one message, in bytes.
	MaxPayload int
}

// Default limits. A producer needs one subscription (the replies to its requests, which
// nats.go multiplexes on one) and a collector none; a queue report is small
// (gpuscalerv1.MaxQueueReportBytes), a node report at most gpuscalerv1.MaxEventBytes.
// Connections: every node's collector and every producer pod of the cluster at once,
// with room to spare; a flood past them refuses that role's new connections rather than
// exhausting the server's.
var (
	DefaultProducerLimits  = Limits{MaxConnections: 10000, MaxSubscriptions: producerMaxSubs, MaxPayload: gpuscalerv1.MaxQueueReportBytes}
	DefaultCollectorLimits = Limits{MaxConnections: 10000, MaxSubscriptions: producerMaxSubs, MaxPayload: gpuscalerv1.MaxEventBytes}
)

// DefaultTenantLimits bound the clients of each namespace's own account together: its
// workers, their JetStream consumers and messages, and its producers. nats.go takes a
// subscription per pull consumer besides the one its requests' replies share.
var DefaultTenantLimits = Limits{MaxConnections: 1000, MaxSubscriptions: 256, MaxPayload: 1 << 20}

// JetStreamLimits bound a namespace's JetStream in its own account. In a single NATS
// server the server reserves each account's store sizes: together they must fit its own
// max_memory_store and max_file_store, or the account gets no JetStream (the server
// logs why).
type JetStreamLimits struct {
	// MaxMemory and MaxFile bound the bytes its memory and file streams hold.
	MaxMemory, MaxFile int64
	// MaxStreams and MaxConsumers bound how many of each it has.
	MaxStreams, MaxConsumers int
}

// DefaultTenantJetStream is a namespace's JetStream: a few work queues on disk.
var DefaultTenantJetStream = JetStreamLimits{MaxMemory: 16 << 20, MaxFile: 1 << 30, MaxStreams: 10, MaxConsumers: 100}

func (l JetStreamLimits) String() string {
	return fmt.Sprintf("jetstream { max_memory: %d, max_file: %d, max_streams: %d, max_consumers: %d }",
		l.MaxMemory, l.MaxFile, l.MaxStreams, l.MaxConsumers)
}

// producerMaxSubs bounds the subscriptions of a producer or collector connection.
const producerMaxSubs = 16

func (l Limits) String() string {
	return fmt.Sprintf("limits { max_connections: %d, max_subscriptions: %d, max_payload: %d }",
		l.MaxConnections, l.MaxSubscriptions, l.MaxPayload)
}
