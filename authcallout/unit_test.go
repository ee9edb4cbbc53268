package authcallout

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"
	"golang.org/x/crypto/bcrypt"
	"k8s.io/client-go/kubernetes/fake"
)

func TestPermissions(t *testing.T) {
	tests := map[string]struct {
		id                 Identity
		pubAllow, subAllow []string
		subDeny            []string
		wantErr            string
	}{
		"producer": {
			id:       Identity{Role: RoleProducer, Namespace: "team-a"},
			pubAllow: []string{"gpuscaler.v1.queue.team-a.>"}, subAllow: []string{"_INBOX.gpuscaler.team-a.>"},
		},
		"collector, dotted node": {
			id:       Identity{Role: RoleCollector, Node: "ip-10-0-1-7.ec2.internal"},
			pubAllow: []string{"gpuscaler.v1.node.ip-10-0-1-7_ec2_internal"}, subDeny: []string{">"},
		},
		"producer of a namespace that is no subject token": {
			id: Identity{Role: RoleProducer, Namespace: "a.>"}, wantErr: "not a DNS-1123 label",
		},
		"collector of no node": {id: Identity{Role: RoleCollector}, wantErr: "node name is empty"},
		"no role":              {id: Identity{}, wantErr: "no permissions"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			p, err := tc.id.permissions()
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("got %v, want an error containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(p.Pub.Allow, tc.pubAllow) || !slices.Equal(p.Sub.Allow, tc.subAllow) || !slices.Equal(p.Sub.Deny, tc.subDeny) || len(p.Pub.Deny) != 0 {
				t.Fatalf("got pub %v/%v sub %v/%v, want pub %v sub %v/%v", p.Pub.Allow, p.Pub.Deny, p.Sub.Allow, p.Sub.Deny, tc.pubAllow, tc.subAllow, tc.subDeny)
			}
		})
	}
	// The scaler publishes nothing but JetStream API requests, and never the ones that
	// destroy data.
	p, err := Identity{Role: RoleScaler}.permissions()
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range p.Pub.Allow {
		if !strings.HasPrefix(s, "$JS.") {
			t.Errorf("scaler may publish %q, outside the JetStream API", s)
		}
		for _, bad := range []string{"STREAM.DELETE", "STREAM.PURGE", "MSG.DELETE", "SERVER."} {
			if strings.Contains(s, bad) {
				t.Errorf("scaler may publish %q", s)
			}
		}
		if s == ">" || s == "$JS.>" || s == "$JS.API.>" {
			t.Errorf("scaler may publish %q", s)
		}
	}
}

func TestParsePatterns(t *testing.T) {
	got, err := parsePatterns("f", " team-a/inference , */*,gpuscaler/*,")
	if err != nil {
		t.Fatal(err)
	}
	want := []pattern{{"team-a", "inference"}, {"*", "*"}, {"gpuscaler", "*"}}
	if !slices.Equal(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	for in, says := range map[string]string{
		"team-a":          "is not namespace/serviceaccount",
		"team-a/":         "is not namespace/serviceaccount",
		"a/b/c":           "is not namespace/serviceaccount",
		"team-*/x":        "* matches a whole part only",
		"Team_A/x":        "not a DNS-1123 label",
		"team-a/x,/other": "is not namespace/serviceaccount",
	} {
		if _, err := parsePatterns("--producer-identities", in); err == nil || !strings.Contains(err.Error(), says) || !strings.Contains(err.Error(), "--producer-identities") {
			t.Errorf("%q: got %v, want an error naming the flag and saying %q", in, err, says)
		}
	}
	if !matchesAny(want, "x", "y") || (pattern{"gpuscaler", "*"}).matches("other", "x") {
		t.Fatal("matching is wrong")
	}
}

func TestLoadIssuer(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	acc, _ := nkeys.CreateAccount()
	seed, _ := acc.Seed()
	pub, _ := acc.PublicKey()
	kp, err := LoadIssuer(write("seed", string(seed)+"\n"))
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := kp.PublicKey(); got != pub {
		t.Fatalf("account seed gave %s, want %s", got, pub)
	}
	// A random secret, as Helm generates it, gives the same account key every time.
	secret := strings.Repeat("q7Zr", 16)
	k1, err := LoadIssuer(write("r1", secret))
	if err != nil {
		t.Fatal(err)
	}
	k2, _ := LoadIssuer(write("r2", secret+"\n"))
	p1, _ := k1.PublicKey()
	p2, _ := k2.PublicKey()
	if p1 != p2 || !nkeys.IsValidPublicAccountKey(p1) {
		t.Fatalf("random secret gave %s and %s, want one account key", p1, p2)
	}
	user, _ := nkeys.CreateUser()
	useed, _ := user.Seed()
	for content, says := range map[string]string{
		"short":                        "want an NKey account seed (SA…) or a random secret of at least 32 bytes",
		string(useed):                  "an NKey seed of another kind",
		"SA" + strings.Repeat("x", 40): "starts like an NKey account seed",
	} {
		if _, err := LoadIssuer(write("bad", content)); err == nil || !strings.Contains(err.Error(), says) {
			t.Errorf("%.12q: got %v, want %q", content, err, says)
		}
	}
	if _, err := LoadIssuer(filepath.Join(dir, "missing")); err == nil || !strings.Contains(err.Error(), "missing") {
		t.Errorf("missing file: got %v", err)
	}
}

func TestParseStaticUsers(t *testing.T) {
	hash, _ := bcrypt.GenerateFromPassword([]byte("pw"), bcrypt.MinCost)
	h := string(hash)
	users, err := parseStaticUsers([]byte(`users:
- {user: ci, passwordHash: "` + h + `", role: producer, namespace: team-a}
- {user: edge-7, passwordHash: "` + h + `", role: collector, node: edge-7.example.com}
`))
	if err != nil {
		t.Fatal(err)
	}
	if users["ci"].id != (Identity{Role: RoleProducer, Name: "static:ci", Namespace: "team-a"}) ||
		users["edge-7"].id != (Identity{Role: RoleCollector, Name: "static:edge-7", Node: "edge-7.example.com"}) {
		t.Fatalf("got %+v", users)
	}
	for in, says := range map[string]string{
		`users: [{user: a, passwordHash: "` + h + `", role: producer}]`:                                                   "a producer needs the namespace",
		`users: [{user: a, passwordHash: "` + h + `", role: collector, namespace: x}]`:                                    "a collector needs the node",
		`users: [{user: a, passwordHash: "` + h + `", role: admin}]`:                                                      `role "admin": want producer, collector or scaler`,
		`users: [{user: a, passwordHash: secret, role: scaler}]`:                                                          "passwordHash is not a bcrypt hash",
		`users: [{user: a, password: x}]`:                                                                                 `unknown field "password"`,
		`users: [{passwordHash: "` + h + `", role: scaler}]`:                                                              "user is empty",
		`users: [{user: a, passwordHash: "` + h + `", role: scaler}, {user: a, passwordHash: "` + h + `", role: scaler}]`: "listed twice",
		`users: [{user: a, passwordHash: "` + h + `", role: scaler, node: n}]`:                                            "a scaler speaks for no namespace or node",
	} {
		if _, err := parseStaticUsers([]byte(in)); err == nil || !strings.Contains(err.Error(), says) {
			t.Errorf("%s\ngot %v, want %q", in, err, says)
		}
	}
}

func TestParseTokenClaims(t *testing.T) {
	exp := time.Unix(2000000000, 0)
	c, err := parseTokenClaims(fakeToken(t, "gpuscaler-nats", exp))
	if err != nil || !c.Expires.Equal(exp) || !c.hasAudience("gpuscaler-nats") {
		t.Fatalf("got %+v, %v", c, err)
	}
	one := "eyJhbGciOiJSUzI1NiJ9.eyJhdWQiOiJvbmUiLCJleHAiOjE3MDAwMDAwMDB9.c2ln" // {"aud":"one","exp":1700000000}
	if c, err := parseTokenClaims(one); err != nil || !c.hasAudience("one") {
		t.Fatalf("aud as a string: %+v, %v", c, err)
	}
	for in, says := range map[string]string{
		"a.b":                         "three dot-separated parts",
		"a.!!.c":                      "not base64url",
		"a.eyJleHAiOjF9Cg.c":          "", // {"exp":1}\n is valid
		"a.eyJhdWQiOiJ4In0.c":         "no exp claim",
		"a.eyJleHAiOiJ4In0.c":         "invalid number literal",
		"a.eyJleHAiOjEsImF1ZCI6MX0.c": "aud claim",
	} {
		_, err := parseTokenClaims(in)
		if says == "" {
			if err != nil {
				t.Errorf("%s: %v", in, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), says) {
			t.Errorf("%s: got %v, want %q", in, err, says)
		}
	}
}

// request returns an authorization request as a server signs it, for a client whose
// connect options are opts.
func request(t testing.TB, opts jwt.ConnectOptions) []byte {
	t.Helper()
	server, _ := nkeys.CreateServer()
	user, _ := nkeys.CreateUser()
	upub, _ := user.PublicKey()
	spub, _ := server.PublicKey()
	rc := jwt.NewAuthorizationRequestClaims(spub)
	rc.Audience = "nats-authorization-request"
	rc.UserNkey = upub
	rc.Server = jwt.ServerID{ID: spub, Name: "n1"}
	rc.ConnectOptions = opts
	rc.Expires = time.Now().Add(time.Minute).Unix()
	s, err := rc.Encode(server)
	if err != nil {
		t.Fatal(err)
	}
	return []byte(s)
}

func fuzzService(t testing.TB) *Service {
	hash, _ := bcrypt.GenerateFromPassword([]byte("pw"), bcrypt.MinCost)
	issuer, _ := nkeys.CreateAccount()
	kube := fake.NewClientset()
	api := &apiserver{tokens: map[string]userInfo{}}
	kube.PrependReactor("create", "tokenreviews", api.react)
	api.tokens[fakeToken(t, testAudience, time.Now().Add(time.Hour))] = tenantA
	s, err := New(Config{Issuer: issuer, Kube: kube, Producers: "*/*", Collectors: "gpuscaler/gpuscaler-collector",
		StaticUsers: map[string]staticUser{"ci": {hash: hash, id: Identity{Role: RoleProducer, Name: "static:ci", Namespace: "team-a"}}}})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// FuzzAuthorize feeds the callout what the bus could send it: it never panics, and
// answers a request it can decode with a response for that request's user, from its
// issuer, to that server.
func FuzzAuthorize(f *testing.F) {
	f.Add(request(f, jwt.ConnectOptions{Token: fakeToken(f, testAudience, time.Now().Add(time.Hour))}))
	f.Add(request(f, jwt.ConnectOptions{Username: "ci", Password: "pw"}))
	f.Add(request(f, jwt.ConnectOptions{}))
	f.Add([]byte("eyJ0eXAiOiJKV1QiLCJhbGciOiJlZDI1NTE5LW5rZXkifQ.e30.x"))
	f.Add([]byte("not a jwt"))
	s := fuzzService(f)
	f.Fuzz(func(t *testing.T, data []byte) {
		resp := s.Authorize(context.Background(), data)
		req, err := decodeRequest(data, time.Now())
		if err != nil {
			if resp != nil {
				t.Fatalf("answered a request it could not decode (%v)", err)
			}
			return
		}
		rc, err := jwt.DecodeAuthorizationResponseClaims(string(resp))
		if err != nil {
			t.Fatalf("response does not decode: %v", err)
		}
		if rc.Subject != req.UserNkey || rc.Audience != req.Server.ID || rc.Issuer != s.issuerPub {
			t.Fatalf("response for %s/%s from %s, want %s/%s from %s", rc.Subject, rc.Audience, rc.Issuer, req.UserNkey, req.Server.ID, s.issuerPub)
		}
		if (rc.Jwt == "") == (rc.Error == "") {
			t.Fatalf("response has user %q and error %q: want exactly one", rc.Jwt, rc.Error)
		}
		if rc.Jwt != "" {
			uc, err := jwt.DecodeUserClaims(rc.Jwt)
			if err != nil {
				t.Fatal(err)
			}
			for _, s := range uc.Pub.Allow {
				if s != "gpuscaler.v1.queue.team-a.>" {
					t.Fatalf("admitted a client to publish %q: only team-a's identities exist here", s)
				}
			}
		}
	})
}

// FuzzParseTokenClaims: a token is outside input; reading it never panics, and a token
// it accepts has an expiry.
func FuzzParseTokenClaims(f *testing.F) {
	f.Add(fakeToken(f, "gpuscaler-nats", time.Unix(2000000000, 0)))
	f.Add("eyJhbGciOiJSUzI1NiJ9.eyJhdWQiOiJvbmUiLCJleHAiOjE3MDAwMDAwMDB9.c2ln")
	f.Add("a.eyJleHAiOjEsImF1ZCI6W119.c")
	f.Fuzz(func(t *testing.T, token string) {
		c, err := parseTokenClaims(token)
		if err == nil && c.Expires.Unix() <= 0 {
			t.Fatalf("accepted %q with expiry %v", token, c.Expires)
		}
	})
}

// FuzzParseStaticUsers: the static-users file is operator input; every entry it accepts
// names a role and exactly what that role speaks for.
func FuzzParseStaticUsers(f *testing.F) {
	hash, _ := bcrypt.GenerateFromPassword([]byte("pw"), bcrypt.MinCost)
	f.Add([]byte(`users: [{user: ci, passwordHash: "` + string(hash) + `", role: producer, namespace: team-a}]`))
	f.Add([]byte(`users: [{user: n, passwordHash: "` + string(hash) + `", role: collector, node: a.b}]`))
	f.Add([]byte(`{"users": [{"user": "s", "role": "scaler"}]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		users, err := parseStaticUsers(data)
		if err != nil {
			return
		}
		for name, u := range users {
			if _, err := u.id.permissions(); err != nil {
				t.Fatalf("accepted user %q whose permissions fail: %v", name, err)
			}
		}
	})
}
