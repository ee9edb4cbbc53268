package scaler

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/gpuscaler/gpuscaler/internal/natstest"
	"github.com/gpuscaler/gpuscaler/test/testkit"
)

// get fetches path from the scaler's HTTP port without following redirects.
func get(t *testing.T, s *testScaler, method, path string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, "http://"+s.HTTPAddr().String()+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	client := &http.Client{Timeout: 10 * time.Second, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, string(body)
}

// TestStatusPageEscapesWhatComesFromOutside checks the page as served, without a
// browser: every hostile pod name, ScaledObject name and metadata value is escaped, and
// the headers let no script run should one slip through.
func TestStatusPageEscapesWhatComesFromOutside(t *testing.T) {
	s := statusFixture(t)
	for _, path := range []string{"/status", "/status?namespace=web"} {
		resp, body := get(t, s, http.MethodGet, path)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("GET %s: %s\n%s", path, resp.Status, body)
		}
		for _, raw := range []string{hostilePod, hostileName, hostileMetadata, "<script", "<img"} {
			if strings.Contains(body, raw) {
				t.Errorf("GET %s holds %q unescaped", path, raw)
			}
		}
		wantContains(t, "GET "+path, body,
			"web/&lt;script&gt;document.title=&#39;pwned-pod&#39;&lt;/script&gt;",
			"web/&lt;img src=x onerror=document.title=&#39;pwned-name&#39;&gt;",
			"queue: &lt;/td&gt;&lt;script&gt;document.title=&#39;pwned-md&#39;&lt;/script&gt;")
		for header, want := range map[string]string{
			"Content-Type":            "text/html; charset=utf-8",
			"Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'",
			"X-Content-Type-Options":  "nosniff",
			"Cache-Control":           "no-store",
		} {
			if got := resp.Header.Get(header); got != want {
				t.Errorf("GET %s: %s = %q, want %q", path, header, got, want)
			}
		}
	}
}

func TestStatusPageRequests(t *testing.T) {
	s := statusFixture(t)
	tests := map[string]struct {
		method, path string
		code         int
		want         []string
		not          []string
	}{
		"root redirects": {"GET", "/", http.StatusFound, nil, nil},
		"a cordoned, tainted node": {"GET", "/status", http.StatusOK, []string{`<span class="badge stale">cordoned</span>`,
			"tainted <code>ToBeDeletedByClusterAutoscaler=1732700000:NoSchedule</code> <code>node.kubernetes.io/unschedulable:NoSchedule</code>"}, nil},
		"refresh":                {"GET", "/status?refresh=5", http.StatusOK, []string{`<meta http-equiv="refresh" content="5">`, `href="/status/trigger?id=1&refresh=5"`}, nil},
		"no refresh by default":  {"GET", "/status", http.StatusOK, nil, []string{`http-equiv="refresh"`}},
		"refresh zero":           {"GET", "/status?refresh=0", http.StatusBadRequest, []string{`refresh "0": want whole seconds from 1 to 3600, or leave it out for no reload`}, nil},
		"refresh not a number":   {"GET", "/status?refresh=soon", http.StatusBadRequest, []string{`refresh "soon": want whole seconds`}, nil},
		"bad namespace":          {"GET", "/status?namespace=Not_A_Namespace", http.StatusBadRequest, []string{`namespace "Not_A_Namespace": `}, nil},
		"namespace filter":       {"GET", "/status?namespace=ml", http.StatusOK, []string{"ml/llm", "ml/idle-worker", "gpu-node-a", "gpu-node-b", "<b>jobs</b>"}, []string{"web/&lt;img", "<b>render</b>"}},
		"namespace filter nodes": {"GET", "/status?namespace=web", http.StatusOK, []string{"gpu-node-a", "<b>render</b>"}, []string{"gpu-node-b", "ml/idle-worker", "<b>jobs</b>"}},
		"a producer that does not measure": {"GET", "/status?namespace=ml", http.StatusOK,
			[]string{`title="its traffic is estimated from differences between its reports (a producer that does not measure)">estimated</span>`}, []string{">measured</span>"}},
		"trigger id not a number": {"GET", "/status/trigger?id=llm", http.StatusBadRequest,
			[]string{`id "llm": want the number of a trigger on /status`}, nil},
		"trigger not recorded": {"GET", "/status/trigger?id=999", http.StatusNotFound,
			[]string{"trigger 999 is not recorded: KEDA has not called this replica about it for 10m"}, nil},
		"trigger":  {"GET", "/status/trigger?id=1", http.StatusOK, []string{"<title>ml/llm — gpuscaler status</title>", "The queue&#39;s backlog 15 is above activationQueueDepth 0."}, nil},
		"no POST":  {"POST", "/status", http.StatusMethodNotAllowed, nil, nil},
		"metrics":  {"GET", "/metrics", http.StatusOK, []string{"gpuscaler_scaler_ready 1"}, nil},
		"readyz":   {"GET", "/readyz", http.StatusOK, []string{"ready"}, nil},
		"no other": {"GET", "/status/nodes", http.StatusNotFound, nil, nil},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			resp, body := get(t, s, tc.method, tc.path)
			if resp.StatusCode != tc.code {
				t.Fatalf("%s %s: %s, want %d\n%s", tc.method, tc.path, resp.Status, tc.code, body)
			}
			wantContains(t, tc.method+" "+tc.path, body, tc.want...)
			for _, n := range tc.not {
				if strings.Contains(body, n) {
					t.Errorf("%s %s holds %q", tc.method, tc.path, n)
				}
			}
		})
	}
	if resp, _ := get(t, s, "GET", "/"); resp.Header.Get("Location") != "/status" {
		t.Errorf("GET / redirects to %q, want /status", resp.Header.Get("Location"))
	}
}

func TestStatusPageOff(t *testing.T) {
	ns := natstest.Start(t, "", "")
	s := startScaler(t, ns.ClientURL(), Config{NoStatusPage: true})
	for path, code := range map[string]int{"/status": http.StatusNotFound, "/": http.StatusNotFound, "/metrics": http.StatusOK} {
		if resp, body := get(t, s, http.MethodGet, path); resp.StatusCode != code {
			t.Errorf("GET %s with the status page off: %s, want %d\n%s", path, resp.Status, code, body)
		}
	}
}

// TestStatusPageNotReadyAndLong renders the page of a scaler not ready yet, over a state
// with more queues than a table shows.
func TestStatusPageNotReadyAndLong(t *testing.T) {
	clock := newFakeClock(t0)
	state := NewState(clock.Now)
	for i := range maxStatusRows + 1 {
		if err := state.Apply(queueEvent("ml", fmt.Sprintf("q-%03d", i), uint64(i), 0), t0); err != nil {
			t.Fatal(err)
		}
	}
	clock.Advance(time.Minute)
	srv := &Server{state: state, ready: make(chan struct{}), done: make(chan struct{}), stale: DefaultStaleAfter,
		triggers: newTriggerCache(10), calls: newCallRecorder(clock.Now, 10, time.Minute)}
	p := &statusPage{srv: srv, state: state, readiness: func() error { return errNotReady }, staleAfter: DefaultStaleAfter,
		replica: "gpuscaler-0", log: testkit.Logger(t)}
	mux := http.NewServeMux()
	p.register(mux)

	if _, err := srv.IsActive(t.Context(), ref("ml", "llm", map[string]string{"queue": "q-001"})); err == nil {
		t.Fatal("IsActive answered before the state was restored")
	}
	w := httptest.NewRecorder()
	mux.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/status", nil))
	if w.Code != http.StatusOK {
		t.Fatalf("GET /status: %d\n%s", w.Code, w.Body)
	}
	wantContains(t, "the page", w.Body.String(),
		"Not ready: "+errNotReady.Error(),
		`<b>ml/llm</b>`, `<span class="badge err">Unavailable</span>`,
		"Queues <span class=\"count\">501, <span class=\"badge stale\">501 older than 30s</span>",
		"The first 500 of 501: filter by namespace for the rest.",
		"No node report.")
	if strings.Contains(w.Body.String(), "<b>q-500</b>") {
		t.Errorf("the page shows the 501st queue, want 500 at most")
	}

	w = httptest.NewRecorder()
	mux.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/status/trigger?id=1", nil))
	wantContains(t, "the trigger's page", w.Body.String(), "The scaler is restoring its state from NATS")
}
