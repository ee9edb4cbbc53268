package authcallout

import (
	"fmt"
	"strconv"
)

// NATSConfig returns a nats-server configuration that sends every client but the
// callout's own user (user "callout", password calloutPassword) to the callout, signed
// by issuer, and places admitted users in account DefaultAccount with JetStream stored in
// storeDir. It is what the chart's bundled NATS runs (deploy/helm/gpuscaler/templates/
// _nats.tpl, where the values come from the environment), and what tests and the bench
// start in-process.
func NATSConfig(issuer, calloutPassword, storeDir string) string {
	return fmt.Sprintf(`jetstream {
  store_dir: %s
}
accounts {
  AUTH {
    users: [ { user: callout, password: %s } ]
  }
  %s {
    jetstream: enabled
  }
  SYS { }
}
system_account: SYS
authorization {
  auth_callout {
    issuer: %s
    auth_users: [ callout ]
    account: AUTH
  }
}
`, strconv.Quote(storeDir), strconv.Quote(calloutPassword), DefaultAccount, issuer)
}
