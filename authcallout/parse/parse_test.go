package parse

import (
	"encoding/base64"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"
	"golang.org/x/crypto/bcrypt"

	gpuscalerv1 "github.com/gpuscaler/gpuscaler/proto/gpuscaler/v1"
)

// token returns a JWT-shaped token with the given payload claims.
func token(t testing.TB, claims map[string]any) string {
	t.Helper()
	b, err := json.Marshal(claims)
	if err != nil {
		t.Fatal(err)
	}
	return "eyJhbGciOiJSUzI1NiJ9." + base64.RawURLEncoding.EncodeToString(b) + ".c2ln"
}

func TestToken(t *testing.T) {
	exp := time.Unix(2000000000, 0)
	c, err := Token(token(t, map[string]any{"aud": []string{"gpuscaler-nats", "x"}, "exp": exp.Unix()}))
	if err != nil || !c.Expires.Equal(exp) || !c.HasAudience("gpuscaler-nats") || c.HasAudience("y") {
		t.Fatalf("got %+v, %v", c, err)
	}
	// RFC 7519 4.1.3: aud may be one string.
	if c, err := Token(token(t, map[string]any{"aud": "one", "exp": 1700000000})); err != nil || !c.HasAudience("one") {
		t.Fatalf("aud as a string: %+v, %v", c, err)
	}
	for in, says := range map[string]string{
		"a.b":                              "three dot-separated parts",
		"a.!!.c":                           "not base64url",
		"a.eyJleHAiOjF9Cg.c":               "", // {"exp":1}\n is valid
		"a.eyJhdWQiOiJ4In0.c":              "no exp claim",
		"a.eyJleHAiOiJ4In0.c":              "invalid number literal",
		"a.eyJleHAiOjEsImF1ZCI6MX0.c":      "aud claim",
		"a.eyJleHAiOi0xfQ.c":               "not a positive whole number",
		strings.Repeat("a", MaxTokenLen+1): "want at most",
	} {
		_, err := Token(in)
		if says == "" {
			if err != nil {
				t.Errorf("%.30s: %v", in, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), says) {
			t.Errorf("%.30s: got %v, want %q", in, err, says)
		}
	}
}

// FuzzToken: a token is outside input; reading it never panics, and a token it accepts
// has an expiry.
func FuzzToken(f *testing.F) {
	f.Add(token(f, map[string]any{"aud": []string{"gpuscaler-nats"}, "exp": 2000000000}))
	f.Add(token(f, map[string]any{"aud": "one", "exp": 1700000000}))
	f.Add("a.eyJleHAiOjEsImF1ZCI6W119.c")
	f.Fuzz(func(t *testing.T, tok string) {
		c, err := Token(tok)
		if err == nil && c.Expires.Unix() <= 0 {
			t.Fatalf("accepted %q with expiry %v", tok, c.Expires)
		}
	})
}

func TestStaticUsers(t *testing.T) {
	hash, _ := bcrypt.GenerateFromPassword([]byte("pw"), bcrypt.MinCost)
	h := string(hash)
	users, err := StaticUsers([]byte(`users:
- {user: ci, passwordHash: "` + h + `", role: producer, namespace: team-a}
- {user: edge-7, passwordHash: "` + h + `", role: collector, node: edge-7.example.com}
`))
	if err != nil {
		t.Fatal(err)
	}
	if len(users) != 2 || users[0] != (StaticUser{User: "ci", PasswordHash: h, Role: "producer", Namespace: "team-a"}) ||
		users[1] != (StaticUser{User: "edge-7", PasswordHash: h, Role: "collector", Node: "edge-7.example.com"}) {
		t.Fatalf("got %+v", users)
	}
	for in, says := range map[string]string{
		`users: [{user: a, passwordHash: "` + h + `", role: producer}]`:                                                   "a producer needs the namespace",
		`users: [{user: a, passwordHash: "` + h + `", role: producer, namespace: x, node: n}]`:                            "is for collectors",
		`users: [{user: a, passwordHash: "` + h + `", role: collector, namespace: x}]`:                                    "a collector needs the node",
		`users: [{user: a, passwordHash: "` + h + `", role: admin}]`:                                                      `role "admin": want producer, collector or scaler`,
		`users: [{user: a, passwordHash: secret, role: scaler}]`:                                                          "passwordHash is not a bcrypt hash",
		`users: [{user: a, password: x}]`:                                                                                 `unknown field "password"`,
		`users: [{passwordHash: "` + h + `", role: scaler}]`:                                                              "user is empty",
		`users: [{user: a, passwordHash: "` + h + `", role: scaler}, {user: a, passwordHash: "` + h + `", role: scaler}]`: "listed twice",
		`users: [{user: a, passwordHash: "` + h + `", role: scaler, node: n}]`:                                            "a scaler speaks for no namespace or node",
	} {
		if _, err := StaticUsers([]byte(in)); err == nil || !strings.Contains(err.Error(), says) {
			t.Errorf("%s\ngot %v, want %q", in, err, says)
		}
	}
}

// FuzzStaticUsers: the static-users file is operator input; every entry it accepts has a
// role and exactly the namespace or node that role speaks for, each a valid subject token.
func FuzzStaticUsers(f *testing.F) {
	hash, _ := bcrypt.GenerateFromPassword([]byte("pw"), bcrypt.MinCost)
	f.Add([]byte(`users: [{user: ci, passwordHash: "` + string(hash) + `", role: producer, namespace: team-a}]`))
	f.Add([]byte(`users: [{user: n, passwordHash: "` + string(hash) + `", role: collector, node: a.b}]`))
	f.Add([]byte(`{"users": [{"user": "s", "role": "scaler"}]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		users, err := StaticUsers(data)
		if err != nil {
			return
		}
		for _, u := range users {
			switch u.Role {
			case "producer":
				_, err = gpuscalerv1.NamespaceQueueSubjects(u.Namespace)
			case "collector":
				_, err = gpuscalerv1.NodeSubject(u.Node)
			case "scaler":
			default:
				t.Fatalf("accepted role %q", u.Role)
			}
			if err != nil {
				t.Fatalf("accepted %+v, which names no subject: %v", u, err)
			}
		}
	})
}

// request returns an authorization request as a server signs it (nats-server
// server/auth_callout.go, processClientOrLeafCallout), changed by edit.
func request(t testing.TB, signer nkeys.KeyPair, edit func(*jwt.AuthorizationRequestClaims)) []byte {
	t.Helper()
	user, _ := nkeys.CreateUser()
	upub, _ := user.PublicKey()
	spub, _ := signer.PublicKey()
	rc := jwt.NewAuthorizationRequestClaims(spub)
	rc.Audience = "nats-authorization-request"
	rc.UserNkey = upub
	rc.Server = jwt.ServerID{ID: spub, Name: "n1"}
	rc.ConnectOptions = jwt.ConnectOptions{Token: "t"}
	rc.Expires = time.Now().Add(time.Minute).Unix()
	if edit != nil {
		edit(rc)
	}
	s, err := rc.Encode(signer)
	if err != nil {
		t.Fatal(err)
	}
	return []byte(s)
}

func TestRequest(t *testing.T) {
	server, _ := nkeys.CreateServer()
	req, err := Request(request(t, server, nil), time.Now())
	if err != nil || req.ConnectOptions.Token != "t" {
		t.Fatalf("got %+v, %v", req, err)
	}
	for name, tc := range map[string]struct {
		data []byte
		says string
	}{
		"for another audience": {request(t, server, func(r *jwt.AuthorizationRequestClaims) { r.Audience = "x" }), `audience "x"`},
		"no user key":          {request(t, server, func(r *jwt.AuthorizationRequestClaims) { r.UserNkey = "" }), "user key"},
		"no server id":         {request(t, server, func(r *jwt.AuthorizationRequestClaims) { r.Server.ID = "" }), "no server id"},
		"expired": {request(t, server, func(r *jwt.AuthorizationRequestClaims) { r.Expires = time.Now().Add(-time.Hour).Unix() }),
			"expired"},
		"encrypted (xkey)": {[]byte("\x01\x02sealed"), "encrypted request"},
		"too long":         {[]byte("eyJ" + strings.Repeat("a", MaxRequestLen)), "want at most"},
	} {
		if _, err := Request(tc.data, time.Now()); err == nil || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("%s: got %v, want %q", name, err, tc.says)
		}
	}
}

// FuzzRequest: requests are outside input (anything on the callout's subject); decoding
// never panics, and what it accepts is signed by a server and names a user key and a
// server to answer.
func FuzzRequest(f *testing.F) {
	server, _ := nkeys.CreateServer()
	f.Add(request(f, server, nil))
	f.Add(request(f, server, func(r *jwt.AuthorizationRequestClaims) {
		r.ConnectOptions = jwt.ConnectOptions{Username: "ci", Password: "pw"}
	}))
	f.Add([]byte("eyJ0eXAiOiJKV1QiLCJhbGciOiJlZDI1NTE5LW5rZXkifQ.e30.x"))
	f.Add([]byte("not a jwt"))
	now := time.Now()
	f.Fuzz(func(t *testing.T, data []byte) {
		req, err := Request(data, now)
		if err != nil {
			return
		}
		if !nkeys.IsValidPublicServerKey(req.Issuer) || !nkeys.IsValidPublicUserKey(req.UserNkey) || req.Server.ID == "" {
			t.Fatalf("accepted %+v", req)
		}
	})
}
