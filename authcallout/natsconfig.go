package authcallout

import (
	"fmt"
	"strconv"
	"strings"
)

// NATSConfig says how to configure a nats-server for the callout.
type NATSConfig struct {
	// Issuer is the callout's issuer public key (Service.IssuerPublicKey).
	Issuer string
	// CalloutPassword is the password of user "callout", the callout's own login.
	CalloutPassword string
	// StoreDir is JetStream's store; empty leaves it to the server's options.
	StoreDir string
	// Trusted are users of account DefaultAccount that bypass the callout, with
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
// callout, signed by Issuer, and admitted users are placed in account DefaultAccount.
// It is what the chart's bundled NATS runs (deploy/helm/gpuscaler/templates/_nats.tpl,
// where the values come from the environment), and what tests and the bench start.
func (c NATSConfig) String() string {
	var b strings.Builder
	if c.StoreDir != "" {
		fmt.Fprintf(&b, "jetstream {\n  store_dir: %s\n}\n", strconv.Quote(c.StoreDir))
	}
	authUsers := []string{"callout"}
	fmt.Fprintf(&b, "accounts {\n  AUTH {\n    users: [ { user: callout, password: %s } ]\n  }\n  %s {\n    jetstream: enabled\n", strconv.Quote(c.CalloutPassword), DefaultAccount)
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
	fmt.Fprintf(&b, "  }\n  SYS { }\n}\nsystem_account: SYS\nauthorization {\n  auth_callout {\n    issuer: %s\n    auth_users: [ %s ]\n    account: AUTH\n  }\n}\n",
		c.Issuer, strings.Join(authUsers, ", "))
	return b.String()
}
