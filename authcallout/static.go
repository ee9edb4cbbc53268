package authcallout

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"golang.org/x/crypto/bcrypt"
	"sigs.k8s.io/yaml"

	gpuscalerv1 "github.com/gpuscaler/gpuscaler/proto/gpuscaler/v1"
)

// StaticUser is a client outside the cluster that logs in with a user name and password,
// and gets the same limits a ServiceAccount of its role would.
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

// staticUser is a checked StaticUser.
type staticUser struct {
	hash []byte
	id   Identity
}

// LoadStaticUsers reads and checks a --static-users file. Every mistake is reported with
// the entry it is in.
func LoadStaticUsers(path string) (map[string]staticUser, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("static users: %w", err)
	}
	users, err := parseStaticUsers(data)
	if err != nil {
		return nil, fmt.Errorf("static users %s: %w", path, err)
	}
	return users, nil
}

func parseStaticUsers(data []byte) (map[string]staticUser, error) {
	var f staticUsersFile
	if err := yaml.UnmarshalStrict(data, &f); err != nil {
		return nil, fmt.Errorf("want YAML {users: [{user, passwordHash, role, namespace|node}]}: %w", err)
	}
	out := make(map[string]staticUser, len(f.Users))
	for i, u := range f.Users {
		where := fmt.Sprintf("users[%d] (%q)", i, u.User)
		if u.User == "" {
			return nil, fmt.Errorf("%s: user is empty", where)
		}
		if _, dup := out[u.User]; dup {
			return nil, fmt.Errorf("%s: user listed twice", where)
		}
		if _, err := bcrypt.Cost([]byte(u.PasswordHash)); err != nil {
			return nil, fmt.Errorf("%s: passwordHash is not a bcrypt hash (htpasswd -nbB user password): %v", where, err)
		}
		role, err := parseRole(u.Role)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", where, err)
		}
		id := Identity{Role: role, Name: "static:" + u.User}
		switch role {
		case RoleProducer:
			if err := gpuscalerv1.ValidateNamespace(u.Namespace); err != nil {
				return nil, fmt.Errorf("%s: a producer needs the namespace it speaks for: %w", where, err)
			}
			if u.Node != "" {
				return nil, fmt.Errorf("%s: node %q is for collectors, not producers", where, u.Node)
			}
			id.Namespace = u.Namespace
		case RoleCollector:
			if err := gpuscalerv1.ValidateNodeName(u.Node); err != nil {
				return nil, fmt.Errorf("%s: a collector needs the node it speaks for: %w", where, err)
			}
			if u.Namespace != "" {
				return nil, fmt.Errorf("%s: namespace %q is for producers, not collectors", where, u.Namespace)
			}
			id.Node = u.Node
		case RoleScaler:
			if u.Namespace != "" || u.Node != "" {
				return nil, fmt.Errorf("%s: a scaler speaks for no namespace or node", where)
			}
		}
		out[u.User] = staticUser{hash: []byte(u.PasswordHash), id: id}
	}
	return out, nil
}

// dummyHashFor returns a hash to compare against when the user is unknown, of the cost
// of the users' own hashes, so that a wrong user name costs as long as a wrong password
// and the time of a refusal does not tell which users exist.
func dummyHashFor(users map[string]staticUser) []byte {
	cost := bcrypt.MinCost
	for _, u := range users {
		if c, err := bcrypt.Cost(u.hash); err == nil && c > cost {
			cost = c
		}
	}
	h, err := bcrypt.GenerateFromPassword([]byte("gpuscaler"), cost)
	if err != nil {
		panic(err) // only for a cost out of range, which bcrypt.Cost never returns
	}
	return h
}

// checkStatic returns the identity of user if password is its password.
func checkStatic(users map[string]staticUser, dummy []byte, user, password string) (Identity, error) {
	u, ok := users[user]
	hash := u.hash
	if !ok {
		hash = dummy
	}
	err := bcrypt.CompareHashAndPassword(hash, []byte(password))
	if !ok || err != nil {
		// One answer for both, so the reply does not say which users exist.
		return Identity{}, deny("bad_password", "user %q: unknown user or wrong password", user)
	}
	return u.id, nil
}

// HashPassword reads a password (its first line) from r and returns its bcrypt hash.
func HashPassword(r io.Reader) (string, error) {
	line, err := bufio.NewReader(io.LimitReader(r, 1024)).ReadString('\n')
	if err != nil && !errors.Is(err, io.EOF) {
		return "", fmt.Errorf("read the password: %w", err)
	}
	pw := strings.TrimRight(line, "\r\n")
	if pw == "" {
		return "", errors.New("no password on stdin")
	}
	if len(pw) > 72 {
		return "", errors.New("password is longer than 72 bytes, bcrypt's limit")
	}
	h, err := bcrypt.GenerateFromPassword([]byte(pw), bcrypt.DefaultCost)
	return string(h), err
}
