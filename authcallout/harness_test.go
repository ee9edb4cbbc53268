package authcallout

import (
	"cmp"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	authenticationv1 "k8s.io/api/authentication/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/gpuscaler/gpuscaler/internal/natsconn"
	"github.com/gpuscaler/gpuscaler/internal/natstest"
	"github.com/gpuscaler/gpuscaler/test/testkit"
)

const (
	calloutUser     = "callout"
	calloutPassword = "callout-secret"
	testAudience    = "gpuscaler-nats"
)

// apiserver stands in for the Kubernetes API's TokenReview: the fake clientset answers
// reviews of the tokens registered with it, as the real apiserver does for the tokens it
// issued (test/e2e reviews real tokens against a real kube-apiserver).
type apiserver struct {
	mu      sync.Mutex
	tokens  map[string]authenticationv1.UserInfo
	reviews int
}

func (a *apiserver) issue(t testing.TB, user authenticationv1.UserInfo, aud string, exp time.Time) string {
	t.Helper()
	tok := fakeToken(t, aud, exp)
	a.mu.Lock()
	defer a.mu.Unlock()
	a.tokens[tok] = user
	return tok
}

func (a *apiserver) react(action k8stesting.Action) (bool, runtime.Object, error) {
	tr := action.(k8stesting.CreateAction).GetObject().(*authenticationv1.TokenReview).DeepCopy()
	a.mu.Lock()
	defer a.mu.Unlock()
	a.reviews++
	user, ok := a.tokens[tr.Spec.Token]
	if !ok {
		tr.Status = authenticationv1.TokenReviewStatus{Error: "[invalid bearer token, token has been invalidated]"}
		return true, tr, nil
	}
	tr.Status = authenticationv1.TokenReviewStatus{Authenticated: true, User: user, Audiences: tr.Spec.Audiences}
	return true, tr, nil
}

func (a *apiserver) revoke(tok string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.tokens, tok)
}

// fakeToken returns a JWT-shaped token with the given audience and expiry, unique per call.
func fakeToken(t testing.TB, aud string, exp time.Time) string {
	t.Helper()
	enc := func(v any) string {
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		return base64.RawURLEncoding.EncodeToString(b)
	}
	return enc(map[string]string{"alg": "RS256"}) + "." +
		enc(map[string]any{"aud": []string{aud}, "exp": exp.Unix(), "jti": nats.NewInbox()}) + "." +
		base64.RawURLEncoding.EncodeToString([]byte(nats.NewInbox()))
}

// serviceAccount is the UserInfo TokenReview reports for a ServiceAccount token; node,
// when set, is the bound pod's node (the node-name extra of Kubernetes 1.30+).
func serviceAccount(ns, name, pod, podUID, node string) authenticationv1.UserInfo {
	u := authenticationv1.UserInfo{Username: serviceAccountPrefix + ns + ":" + name, Extra: map[string]authenticationv1.ExtraValue{}}
	if pod != "" {
		u.Extra[extraPodName] = authenticationv1.ExtraValue{pod}
		u.Extra[extraPodUID] = authenticationv1.ExtraValue{podUID}
	}
	if node != "" {
		u.Extra[extraNodeName] = authenticationv1.ExtraValue{node}
	}
	return u
}

// bus is a real nats-server whose every client but the callout's own is admitted by a
// real Service.
type bus struct {
	url  string
	api  *apiserver
	kube *fake.Clientset
	svc  *Service
	reg  *prometheus.Registry
	log  *testkit.SyncBuffer
}

type busOptions struct {
	static    StaticUsers
	podLookup bool
	maxTTL    time.Duration
	// producers are --producer-identities; empty means "*/*".
	producers string
	// reviewDelay is how long each TokenReview takes, as a slow or distant API
	// server's would.
	reviewDelay time.Duration
	// producerLimits bound the producers' account; the defaults where zero.
	producerLimits Limits
	// jetStreamNamespaces have accounts of their own with JetStream.
	jetStreamNamespaces []string
}

// startBus starts NATS with auth callout configured as the chart configures it, and the
// callout service.
func startBus(t testing.TB, o busOptions) *bus {
	t.Helper()
	issuer, err := nkeys.CreateAccount()
	if err != nil {
		t.Fatal(err)
	}
	pub, _ := issuer.PublicKey()
	accounts := Accounts{JetStreamNamespaces: o.jetStreamNamespaces}
	ns := natstest.StartConfig(t, NATSConfig{Issuer: pub, CalloutPassword: calloutPassword, ProducerLimits: o.producerLimits, Accounts: accounts}.String())
	b := &bus{url: ns.ClientURL(), api: &apiserver{tokens: map[string]authenticationv1.UserInfo{}}}
	b.kube = fake.NewClientset()
	b.kube.PrependReactor("create", "tokenreviews", b.api.react)
	log, buf := testkit.BufferLogger()
	b.log, b.reg = buf, prometheus.NewRegistry()
	b.svc, err = New(Config{
		Issuer: issuer, Audience: testAudience, Kube: clientsetKube{b.kube, o.reviewDelay}, PodLookup: o.podLookup, MaxTTL: o.maxTTL,
		Scalers: "gpuscaler/gpuscaler-scaler", Collectors: "gpuscaler/gpuscaler-collector", Producers: cmp.Or(o.producers, "*/*"),
		StaticUsers: o.static, Accounts: accounts, Log: log, Registry: b.reg,
	})
	if err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(b.url, nats.UserInfo(calloutUser, calloutPassword))
	if err != nil {
		t.Fatalf("callout cannot log in: %v", err)
	}
	t.Cleanup(nc.Close)
	testkit.Start(t, "auth callout", 10*time.Second, b.svc.Ready(), func(ctx context.Context) error { return b.svc.Run(ctx, nc) })
	return b
}

// token issues a valid token for user, expiring in an hour.
func (b *bus) token(t testing.TB, user authenticationv1.UserInfo) string {
	return b.api.issue(t, user, testAudience, time.Now().Add(time.Hour))
}

// connect connects with opts (URL filled in) and records the asynchronous errors the
// server sends, such as permission violations.
func (b *bus) connect(t testing.TB, opts natsconn.Options) (*natsconn.Conn, *asyncErrors, error) {
	t.Helper()
	opts.URLs = b.url
	errs := &asyncErrors{}
	opts.Log = errs.logger(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	nc, err := natsconn.Connect(ctx, opts)
	if err != nil {
		return nil, errs, err
	}
	t.Cleanup(nc.Close)
	return nc, errs, nil
}

func (b *bus) mustConnect(t testing.TB, opts natsconn.Options) (*natsconn.Conn, *asyncErrors) {
	t.Helper()
	nc, errs, err := b.connect(t, opts)
	if err != nil {
		t.Fatalf("connect as %+v: %v", opts.Name, err)
	}
	return nc, errs
}

// decisions returns the callout's count of decisions with the given labels.
func (b *bus) decisions(role, result, reason string) float64 {
	c, err := b.svc.metrics.decisions.GetMetricWithLabelValues(role, result, reason)
	if err != nil {
		return -1
	}
	return testutil.ToFloat64(c)
}

// asyncErrors collects what natsconn logs, where the server's asynchronous errors
// (permission violations) surface.
type asyncErrors struct{ buf *testkit.SyncBuffer }

func (e *asyncErrors) logger(t testing.TB) *slog.Logger {
	log, buf := testkit.BufferLogger()
	e.buf = buf
	return log
}

func (e *asyncErrors) String() string { return e.buf.String() }

// waitFor waits up to 5 s for the collected errors to contain s.
func (e *asyncErrors) waitFor(t testing.TB, s string) {
	t.Helper()
	e.waitForCount(t, s, 1)
}

// waitForCount waits up to 5 s for n of the collected errors to contain s.
func (e *asyncErrors) waitForCount(t testing.TB, s string, n int) {
	t.Helper()
	testkit.Eventually(t, 5*time.Second, func(context.Context) error {
		return testkit.Check(testkit.CountLines(e.String(), s) >= n, "%d of %d errors containing %q; got:\n%s", testkit.CountLines(e.String(), s), n, s, e.String())
	})
}

var errNoMsg = errors.New("no message")

// next returns the next message on sub within d.
func next(sub *nats.Subscription, d time.Duration) (*nats.Msg, error) {
	m, err := sub.NextMsg(d)
	if errors.Is(err, nats.ErrTimeout) {
		return nil, errNoMsg
	}
	return m, err
}

type userInfo = authenticationv1.UserInfo

// clientsetKube is the callout's Kube over a client-go clientset (here the fake one):
// what the binary's REST implementation does against a real API server, which test/e2e
// runs.
type clientsetKube struct {
	kubernetes.Interface
	delay time.Duration // before each review
}

func (k clientsetKube) ReviewToken(ctx context.Context, token string, audiences []string) (TokenReviewStatus, error) {
	time.Sleep(k.delay) // a slow API server's own time, not a wait for state
	tr, err := k.AuthenticationV1().TokenReviews().Create(ctx, &authenticationv1.TokenReview{
		Spec: authenticationv1.TokenReviewSpec{Token: token, Audiences: audiences},
	}, metav1.CreateOptions{})
	if err != nil {
		return TokenReviewStatus{}, err
	}
	st := TokenReviewStatus{Authenticated: tr.Status.Authenticated, Audiences: tr.Status.Audiences, Error: tr.Status.Error,
		User: UserInfo{Username: tr.Status.User.Username, UID: tr.Status.User.UID, Groups: tr.Status.User.Groups}}
	if len(tr.Status.User.Extra) > 0 {
		st.User.Extra = map[string][]string{}
		for key, v := range tr.Status.User.Extra {
			st.User.Extra[key] = v
		}
	}
	return st, nil
}

func (k clientsetKube) Pod(ctx context.Context, namespace, name string) (string, string, error) {
	p, err := k.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return "", "", fmt.Errorf("%w: %v", ErrPodNotFound, err)
	}
	if err != nil {
		return "", "", err
	}
	return string(p.UID), p.Spec.NodeName, nil
}
