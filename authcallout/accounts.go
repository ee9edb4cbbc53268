package authcallout

import (
	"fmt"

	gpuscalerv1 "github.com/gpuscaler/gpuscaler/proto/gpuscaler/v1"
)

// Accounts names the NATS account each role's users join. Each role has an account of
// its own, so that a reply a client names can reach only its own account: the scaler's
// account holds the GPUSCALER stream and exports the report subjects as services, and
// the collectors' and producers' accounts import them. A JetStream ack, or any reply,
// to a message a producer or collector publishes then travels back to that client's
// account alone, never into the stream (which captures gpuscaler.v1.> in the scaler's
// account only), whatever reply subject the client names.
type Accounts struct {
	Scaler, Collector, Producer string
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

// of returns role's account.
func (a Accounts) of(r Role) string {
	switch r {
	case RoleScaler:
		return a.Scaler
	case RoleCollector:
		return a.Collector
	default:
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

// producerMaxSubs bounds the subscriptions of a producer or collector connection.
const producerMaxSubs = 16

func (l Limits) String() string {
	return fmt.Sprintf("limits { max_connections: %d, max_subscriptions: %d, max_payload: %d }",
		l.MaxConnections, l.MaxSubscriptions, l.MaxPayload)
}
