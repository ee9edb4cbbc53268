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

	"github.com/gpuscaler/gpuscaler/authcallout/parse"
	gpuscalerv1 "github.com/gpuscaler/gpuscaler/proto/gpuscaler/v1"
)

func TestPermissions(t *testing.T) {
	tests := map[string]struct {
		id                 Identity
		pubAllow, subAllow []string
		subDeny            []string
		jetStream          bool
		wantErr            string
	}{
		"producer of a JetStream namespace: anything in its own account": {
			id: Identity{Role: RoleProducer, Namespace: "team-a"}, jetStream: true,
			pubAllow: []string{">"}, subAllow: []string{">"},
		},
		"producer of a JetStream namespace that is no subject token": {
			id: Identity{Role: RoleProducer, Namespace: "a.>"}, jetStream: true, wantErr: "not a DNS-1123 label",
		},
		"producer": {
			id:       Identity{Role: RoleProducer, Namespace: "team-a"},
			pubAllow: []string{"gpuscaler.v1.queue.team-a.*.*"}, subAllow: []string{"_INBOX.gpuscaler.team-a.>"},
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
			p, err := tc.id.permissions(tc.jetStream)
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
	// The scaler publishes nothing but JetStream API requests, its own account's or the
	// consumer info a JetStream namespace's account exports to it, and never the ones
	// that destroy data.
	p, err := Identity{Role: RoleScaler}.permissions(false)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range p.Pub.Allow {
		if !strings.HasPrefix(s, "$JS.") && s != gpuscalerv1.TenantConsumerInfoAll {
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
	// It keeps both its streams: the node stream and the queue stream.
	for _, stream := range []string{gpuscalerv1.StreamName, gpuscalerv1.QueueStreamName} {
		for _, api := range []string{"$JS.API.STREAM.CREATE.", "$JS.API.STREAM.UPDATE.", "$JS.API.STREAM.MSG.GET.", "$JS.API.CONSUMER.CREATE.", "$JS.FC."} {
			want := api + stream
			if api == "$JS.FC." {
				want += ".>"
			}
			if !slices.Contains(p.Pub.Allow, want) {
				t.Errorf("scaler may not publish %q", want)
			}
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
	users, err := ParseStaticUsers([]byte(`users:
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
	if _, err := ParseStaticUsers([]byte("users: [{user: a}]")); err == nil || !strings.Contains(err.Error(), "passwordHash is not a bcrypt hash") {
		t.Fatalf("got %v, want parse.StaticUsers' error", err)
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

// authorizeService returns a Service that admits one token of team-a's (returned) and a
// static producer "ci" of team-a with password "pw".
func authorizeService(t testing.TB) (*Service, string) {
	hash, _ := bcrypt.GenerateFromPassword([]byte("pw"), bcrypt.MinCost)
	issuer, _ := nkeys.CreateAccount()
	kube := fake.NewClientset()
	api := &apiserver{tokens: map[string]userInfo{}}
	kube.PrependReactor("create", "tokenreviews", api.react)
	valid := fakeToken(t, testAudience, time.Now().Add(time.Hour))
	api.tokens[valid] = tenantA
	s, err := New(Config{Issuer: issuer, Kube: clientsetKube{Interface: kube}, Producers: "*/*", Collectors: "gpuscaler/gpuscaler-collector",
		StaticUsers: StaticUsers{"ci": {hash: hash, id: Identity{Role: RoleProducer, Name: "static:ci", Namespace: "team-a"}}}})
	if err != nil {
		t.Fatal(err)
	}
	return s, valid
}

// TestAuthorizeAnswers: the callout answers a request it can decode with a response for
// that request's user, from its issuer, to that server, holding a user or an error and
// never both, and answers nothing else. (parse.Request, the decoding, is fuzzed in its
// own package.)
func TestAuthorizeAnswers(t *testing.T) {
	s, valid := authorizeService(t)
	inputs := map[string][]byte{
		"a reviewed token": request(t, jwt.ConnectOptions{Token: valid}),
		"an unknown token": request(t, jwt.ConnectOptions{Token: fakeToken(t, testAudience, time.Now().Add(time.Hour))}),
		"a static user":    request(t, jwt.ConnectOptions{Username: "ci", Password: "pw"}),
		"a wrong password": request(t, jwt.ConnectOptions{Username: "ci", Password: "no"}),
		"no credentials":   request(t, jwt.ConnectOptions{}),
		"an unsigned JWT":  []byte("eyJ0eXAiOiJKV1QiLCJhbGciOiJlZDI1NTE5LW5rZXkifQ.e30.x"),
		"not a JWT":        []byte("not a jwt"),
		"nothing":          nil,
	}
	admitted := 0
	for name, data := range inputs {
		t.Run(name, func(t *testing.T) {
			resp := s.Authorize(context.Background(), data)
			req, err := parse.Request(data, time.Now())
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
					if s != "gpuscaler.v1.queue.team-a.*.*" {
						t.Fatalf("admitted a client to publish %q: only team-a's identities exist here", s)
					}
				}
				admitted++
			}
		})
	}
	if admitted != 2 {
		t.Fatalf("admitted %d clients, want 2 (the reviewed token and the static user)", admitted)
	}
}
