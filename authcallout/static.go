package authcallout

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"golang.org/x/crypto/bcrypt"

	"github.com/gpuscaler/gpuscaler/authcallout/parse"
)

// StaticUsers are checked static users by name (LoadStaticUsers, ParseStaticUsers).
type StaticUsers map[string]staticUser

// staticUser is a checked StaticUser.
type staticUser struct {
	hash []byte
	id   Identity
}

// LoadStaticUsers reads and checks a --static-users file. Every mistake is reported with
// the entry it is in.
func LoadStaticUsers(path string) (StaticUsers, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("static users: %w", err)
	}
	users, err := ParseStaticUsers(data)
	if err != nil {
		return nil, fmt.Errorf("static users %s: %w", path, err)
	}
	return users, nil
}

// ParseStaticUsers reads the YAML of a --static-users file (parse.StaticUsers).
func ParseStaticUsers(data []byte) (StaticUsers, error) {
	users, err := parse.StaticUsers(data)
	if err != nil {
		return nil, err
	}
	out := make(StaticUsers, len(users))
	for _, u := range users {
		role, err := parseRole(u.Role)
		if err != nil {
			return nil, err // parse.StaticUsers checked it
		}
		out[u.User] = staticUser{hash: []byte(u.PasswordHash), id: Identity{Role: role, Name: "static:" + u.User, Namespace: u.Namespace, Node: u.Node}}
	}
	return out, nil
}

// dummyHashFor returns a hash to compare against when the user is unknown, of the cost
// of the users' own hashes, so that a wrong user name costs as long as a wrong password
// and the time of a refusal does not tell which users exist.
func dummyHashFor(users StaticUsers) []byte {
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
func checkStatic(users StaticUsers, dummy []byte, user, password string) (Identity, error) {
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
