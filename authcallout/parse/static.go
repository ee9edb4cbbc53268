package parse

import (
	"fmt"

	"golang.org/x/crypto/bcrypt"
	"sigs.k8s.io/yaml"

	gpuscalerv1 "github.com/gpuscaler/gpuscaler/proto/gpuscaler/v1"
)

// StaticUser is a client outside the cluster that logs in with a user name and password,
// and gets the limits a ServiceAccount of its role would.
type StaticUser struct {
	User string `json:"user"`
	// PasswordHash is the bcrypt hash of the password (htpasswd -nbB, or
	// `gpuscaler auth-callout hash-password`); the file never holds the password itself.
	PasswordHash string `json:"passwordHash"`
	// Role is producer, collector or scaler.
	Role string `json:"role"`
	// Namespace is the namespace a producer speaks for.
	Namespace string `json:"namespace,omitempty"`
	// Node is the node a collector speaks for.
	Node string `json:"node,omitempty"`
}

// staticUsersFile is the --static-users file.
type staticUsersFile struct {
	Users []StaticUser `json:"users"`
}

// StaticUsers reads and checks the YAML of a --static-users file: every user has a name
// of its own, a bcrypt hash, a role, and exactly what that role speaks for (a producer
// its namespace, a collector its node, a scaler nothing). A mistake is reported with the
// entry it is in.
func StaticUsers(data []byte) ([]StaticUser, error) {
	var f staticUsersFile
	if err := yaml.UnmarshalStrict(data, &f); err != nil {
		return nil, fmt.Errorf("want YAML {users: [{user, passwordHash, role, namespace|node}]}: %w", err)
	}
	seen := make(map[string]bool, len(f.Users))
	for i, u := range f.Users {
		where := fmt.Sprintf("users[%d] (%q)", i, u.User)
		if u.User == "" {
			return nil, fmt.Errorf("%s: user is empty", where)
		}
		if seen[u.User] {
			return nil, fmt.Errorf("%s: user listed twice", where)
		}
		seen[u.User] = true
		if _, err := bcrypt.Cost([]byte(u.PasswordHash)); err != nil {
			return nil, fmt.Errorf("%s: passwordHash is not a bcrypt hash (htpasswd -nbB user password): %v", where, err)
		}
		switch u.Role {
		case "producer":
			if err := gpuscalerv1.ValidateNamespace(u.Namespace); err != nil {
				return nil, fmt.Errorf("%s: a producer needs the namespace it speaks for: %w", where, err)
			}
			if u.Node != "" {
				return nil, fmt.Errorf("%s: node %q is for collectors, not producers", where, u.Node)
			}
		case "collector":
			if err := gpuscalerv1.ValidateNodeName(u.Node); err != nil {
				return nil, fmt.Errorf("%s: a collector needs the node it speaks for: %w", where, err)
			}
			if u.Namespace != "" {
				return nil, fmt.Errorf("%s: namespace %q is for producers, not collectors", where, u.Namespace)
			}
		case "scaler":
			if u.Namespace != "" || u.Node != "" {
				return nil, fmt.Errorf("%s: a scaler speaks for no namespace or node", where)
			}
		default:
			return nil, fmt.Errorf("%s: role %q: want producer, collector or scaler", where, u.Role)
		}
	}
	return f.Users, nil
}
