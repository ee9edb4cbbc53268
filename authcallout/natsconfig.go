package authcallout

import (
	"fmt"
	"strconv"
	"strings"

	gpuscalerv1 "github.com/gpuscaler/gpuscaler/proto/gpuscaler/v1"
)

// NATSConfig says how to configure a nats-server for the callout.
type NATSConfig struct {
	// Issuer is the callout's issuer public key (Service.IssuerPublicKey), or a
	// $VARIABLE holding it.
	Issuer string
	// CalloutPassword is the password of user "callout", the callout's own login; a
	// $VARIABLE is written as a reference, which nats-server reads from its environment.
	CalloutPassword string
	// StoreDir is JetStream's store; empty leaves it to the server's options.
	StoreDir string
	// Accounts name the roles' accounts; DefaultAccounts where empty.
	Accounts Accounts
	// ProducerLimits and CollectorLimits bound those accounts' clients; the defaults
	// where zero.
	ProducerLimits, CollectorLimits Limits
	// TenantLimits and TenantJetStream bound each account of Accounts.JetStreamNamespaces;
	// DefaultTenantLimits and DefaultTenantJetStream where zero.
	TenantLimits    Limits
	TenantJetStream JetStreamLimits
	// Trusted are users of the scaler's account that bypass the callout, with
	// permissions of their own. For tools only (the bench's simulated nodes): every part
	// of gpuscaler authenticates through the callout.
	Trusted []TrustedUser
}

// TrustedUser is a user the server admits itself (NATSConfig.Trusted).
type TrustedUser struct {
	User, Password string
	// Publish lists the subjects it may publish to.
	Publish []string
}

// String returns the configuration text: every client but user "callout" goes to the
// callout, signed by Issuer, and admitted users are placed in their role's account. It
// is what the chart's bundled NATS runs (deploy/helm/gpuscaler/templates/_nats.tpl,
// where the values come from the environment), and what tests and the bench start.
//
// The scaler's account keeps the stream and exports the report subjects as services:
// the queue subjects to the producers' account, the node subjects to the collectors'.
// A service import maps a request's reply subject to one of its own (_R_.…), which
// routes the response back to the requester's account; so the stream's ack to a report
// reaches its sender wherever it names, and never the stream.
//
// A namespace with JetStream (Accounts.JetStreamNamespaces) has an account of its own,
// with JetStream under TenantJetStream: it imports its own queue subjects alone
// (gpuscaler.v1.queue.<ns>.*.*, narrower than the export, so another namespace's queue
// subject published there reaches nothing), and exports its consumer info to the
// scaler's account, which imports it under gpuscalerv1.TenantJetStreamAPI. Nothing else
// crosses: a client there may publish and subscribe anything, and reach no other account.
func (c NATSConfig) String() string {
	a := c.Accounts.withDefaults()
	pl, cl := c.ProducerLimits, c.CollectorLimits
	if pl == (Limits{}) {
		pl = DefaultProducerLimits
	}
	if cl == (Limits{}) {
		cl = DefaultCollectorLimits
	}
	tl, tjs := c.TenantLimits, c.TenantJetStream
	if tl == (Limits{}) {
		tl = DefaultTenantLimits
	}
	if tjs == (JetStreamLimits{}) {
		tjs = DefaultTenantJetStream
	}
	type tenant struct{ account, queues, api string }
	var tenants []tenant
	queueImporters := []string{a.Producer}
	for _, ns := range a.JetStreamNamespaces {
		subjects, err1 := gpuscalerv1.NamespaceQueueSubjects(ns)
		api, err2 := gpuscalerv1.TenantJetStreamAPI(ns)
		if err1 != nil || err2 != nil {
			continue // Service and the flags refuse such a name; no account for it
		}
		t := tenant{strconv.Quote(a.Tenant(ns)), strconv.Quote(subjects), api}
		tenants = append(tenants, t)
		queueImporters = append(queueImporters, t.account)
	}
	var b strings.Builder
	if c.StoreDir != "" {
		fmt.Fprintf(&b, "jetstream {\n  store_dir: %s\n}\n", strconv.Quote(c.StoreDir))
	}
	queues, nodes := strconv.Quote(gpuscalerv1.QueueSubjectPrefix+">"), strconv.Quote(gpuscalerv1.NodeSubjectPrefix+">")
	authUsers := []string{"callout"}
	fmt.Fprintf(&b, "accounts {\n  AUTH {\n    users: [ { user: callout, password: %s } ]\n  }\n", value(c.CalloutPassword))
	fmt.Fprintf(&b, "  %s {\n    jetstream: enabled\n", a.Scaler)
	fmt.Fprintf(&b, "    exports: [\n      { service: %s, accounts: [ %s ] }\n      { service: %s, accounts: [ %s ] }\n    ]\n",
		queues, strings.Join(queueImporters, ", "), nodes, a.Collector)
	if len(tenants) > 0 {
		b.WriteString("    imports: [\n")
		for _, t := range tenants {
			fmt.Fprintf(&b, "      { service: { account: %s, subject: %s }, to: %s }\n",
				t.account, strconv.Quote(consumerInfo), strconv.Quote(t.api+".CONSUMER.INFO.>"))
		}
		b.WriteString("    ]\n")
	}
	if len(c.Trusted) > 0 {
		b.WriteString("    users: [\n")
		for _, u := range c.Trusted {
			pubs := make([]string, len(u.Publish))
			for i, p := range u.Publish {
				pubs[i] = strconv.Quote(p)
			}
			fmt.Fprintf(&b, "      { user: %s, password: %s, permissions: { publish: [%s], subscribe: { deny: \">\" } } }\n",
				strconv.Quote(u.User), strconv.Quote(u.Password), strings.Join(pubs, ", "))
			authUsers = append(authUsers, strconv.Quote(u.User))
		}
		b.WriteString("    ]\n")
	}
	b.WriteString("  }\n")
	for _, imp := range []struct {
		account, subject string
		limits           Limits
	}{{a.Producer, queues, pl}, {a.Collector, nodes, cl}} {
		fmt.Fprintf(&b, "  %s {\n    imports: [ { service: { account: %s, subject: %s } } ]\n    %s\n  }\n",
			imp.account, a.Scaler, imp.subject, imp.limits)
	}
	for _, t := range tenants {
		fmt.Fprintf(&b, "  %s {\n    %s\n    imports: [ { service: { account: %s, subject: %s } } ]\n    exports: [ { service: %s, accounts: [ %s ] } ]\n    %s\n  }\n",
			t.account, tjs, a.Scaler, t.queues, strconv.Quote(consumerInfo), a.Scaler, tl)
	}
	fmt.Fprintf(&b, "  SYS { }\n}\nsystem_account: SYS\nauthorization {\n  auth_callout {\n    issuer: %s\n    auth_users: [ %s ]\n    account: AUTH\n  }\n}\n",
		c.Issuer, strings.Join(authUsers, ", "))
	return b.String()
}

// consumerInfo is the part of a tenant account's JetStream API the scaler reads: the
// info of its consumers (scaler/workqueue.go fetches nothing else there).
const consumerInfo = "$JS.API.CONSUMER.INFO.>"

// value writes s as a configuration value: quoted, unless it is a $VARIABLE reference.
func value(s string) string {
	if strings.HasPrefix(s, "$") {
		return s
	}
	return strconv.Quote(s)
}
