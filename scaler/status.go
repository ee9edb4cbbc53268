package scaler

import (
	"bytes"
	"cmp"
	_ "embed"
	"fmt"
	"html/template"
	"log/slog"
	"maps"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/gpuscaler/gpuscaler/internal/version"
	gpuscalerv1 "github.com/gpuscaler/gpuscaler/proto/gpuscaler/v1"
)

// The status page: what KEDA asked this replica recently and what it answered, the
// queues and the nodes the scaler knows, server-rendered from status.html. It is served
// on the HTTP port beside /metrics and the probes, never on the gRPC port, so it reaches
// exactly who may scrape the scaler (see deploy/README.md, "The status page"). Everything
// on it that comes from outside (pod, queue and ScaledObject names, metadata, error
// text) is escaped by html/template, and its Content-Security-Policy runs no script.

//go:embed status.html
var statusHTML string

var statusTemplates = template.Must(template.New("status").Funcs(template.FuncMap{
	"dur": fmtDuration,
	"age": func(d *durationpb.Duration) string { return fmtDuration(d.AsDuration()) },
	"num": num,
	"coldStart": func(c *gpuscalerv1.ColdStart) string {
		return c.Describe()
	},
	"pct":  func(v *float64) string { return strconv.FormatFloat(*v, 'f', 0, 64) + "%" },
	"free": fmtFree,
	// labels writes a node's labels as a nodeSelector would match them: k=v, sorted.
	"labels": func(m map[string]string) string { return labels.Set(m).String() },
	"plural": func(n any, noun string) string {
		if fmt.Sprint(n) == "1" {
			return "1 " + noun
		}
		return fmt.Sprint(n) + " " + noun + "s"
	},
}).Parse(statusHTML))

// maxStatusRows bounds each of the page's tables, so that a cluster of thousands of
// queues or nodes gets a page a browser still renders; the namespace filter narrows it.
const maxStatusRows = 500

// statusPage serves the page for one scaler replica.
type statusPage struct {
	srv        *Server
	state      *State
	readiness  func() error
	staleAfter time.Duration // the default staleAfter: older reports are marked
	replica    string        // the host name: KEDA spreads its calls over replicas
	log        *slog.Logger
}

func newStatusPage(s *Scaler, srv *Server) *statusPage {
	host, _ := os.Hostname()
	return &statusPage{srv: srv, state: s.state, readiness: s.readiness, staleAfter: s.cfg.StaleAfter,
		replica: host, log: s.log.With("component", "status")}
}

// register adds the page's routes to mux.
func (p *statusPage) register(mux *http.ServeMux) {
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "/status", http.StatusFound)
	})
	mux.HandleFunc("GET /status", p.serveIndex)
	mux.HandleFunc("GET /status/trigger", p.serveTrigger)
}

// statusHeader is what every view shows at its top.
type statusHeader struct {
	Title     string
	Replica   string
	Version   string
	Ready     bool
	NotReady  string // why not, when not ready
	Refresh   int    // seconds between reloads; 0: none
	Namespace string // the filter; "" for every namespace
	// StaleAfter is the scaler's default staleAfter; reports older are marked.
	StaleAfter  string
	StaleAfterD time.Duration
	// Keep is the filter and refresh as query parameters, for links that keep them, and
	// Query the same with its "?".
	Keep, Query template.URL
	// Claims says whom the scaler believes of which pods hold a node's GPUs, when that
	// is worth a banner: every node, or nobody yet.
	Claims string
}

type indexView struct {
	statusHeader
	Triggers      []triggerView
	TriggersShown int
	Failing       int
	Queues        []*gpuscalerv1.QueueStatus
	QueuesTotal   int
	StaleQueues   int
	Nodes         []*gpuscalerv1.NodeStatus
	NodesTotal    int
	GPUs          int
	FreeGPUs      int
	StaleNodes    int
	MaxRows       int
	IdleAfter     string
}

// triggerView is one trigger's recorded calls, ready to print.
type triggerView struct {
	ID        uint64
	Namespace string
	Name      string
	Metadata  []keyValue // as KEDA sent it, without scalerAddress
	Invalid   string     // why the metadata does not parse
	IsActive  callView
	Spec      callView
	Metrics   []metricView
	Stream    streamView
	Failing   bool
	LastCall  string
}

type keyValue struct{ Key, Value string }

// callView is one recorded call: when, and its answer or error.
type callView struct {
	Made   bool
	Ago    string
	Answer string
	Code   string // the gRPC code's name, when the call failed
	Error  string
}

type metricView struct {
	Name     string
	Target   string // "" when the trigger gives no such metric
	Replicas string // what the value alone asks of an HPA
	callView
}

type streamView struct {
	Open   int
	Opened string // how long ago the last stream opened; "" if none did
	Sent   callView
	Ended  callView
	// Held counts the activations not pushed, within pushInterval of a push; HeldAgo is
	// how long ago the last was.
	Held    int
	HeldAgo string
}

func (p *statusPage) header(r *http.Request, title string) (statusHeader, error) {
	q := r.URL.Query()
	h := statusHeader{Title: title, Replica: p.replica, Version: version.Version, StaleAfter: fmtDuration(p.staleAfter), StaleAfterD: p.staleAfter}
	if v := q.Get("refresh"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 3600 {
			return h, fmt.Errorf("refresh %q: want whole seconds from 1 to 3600, or leave it out for no reload", v)
		}
		h.Refresh = n
	}
	if ns := q.Get("namespace"); ns != "" {
		if err := gpuscalerv1.ValidateNamespace(ns); err != nil {
			return h, fmt.Errorf("namespace %q: %w", ns, err)
		}
		h.Namespace = ns
	}
	keep := url.Values{}
	if h.Namespace != "" {
		keep.Set("namespace", h.Namespace)
	}
	if h.Refresh > 0 {
		keep.Set("refresh", strconv.Itoa(h.Refresh))
	}
	if len(keep) > 0 {
		h.Keep = template.URL(keep.Encode())
		h.Query = "?" + h.Keep
	}
	if err := p.readiness(); err != nil {
		h.NotReady = err.Error()
	} else {
		h.Ready = true
	}
	if checks, synced := p.state.ChecksPodClaims(); !checks || !synced {
		h.Claims = podClaimsReason(checks, synced)
	}
	return h, nil
}

func (p *statusPage) serveIndex(w http.ResponseWriter, r *http.Request) {
	h, err := p.header(r, "gpuscaler status")
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	v := indexView{statusHeader: h, MaxRows: maxStatusRows, IdleAfter: fmtDuration(p.srv.calls.idleAfter)}

	rows, now := p.srv.calls.snapshot()
	for i := range rows {
		t := &rows[i]
		if h.Namespace != "" && t.key.entry.namespace != h.Namespace {
			continue
		}
		tv := viewTrigger(t, now)
		if tv.Failing {
			v.Failing++
		}
		v.Triggers = append(v.Triggers, tv)
	}
	// Failing triggers first, then by namespace and name: what needs a look is on top.
	slices.SortFunc(v.Triggers, func(a, b triggerView) int {
		if a.Failing != b.Failing {
			if a.Failing {
				return -1
			}
			return 1
		}
		if c := strings.Compare(a.Namespace, b.Namespace); c != 0 {
			return c
		}
		if c := strings.Compare(a.Name, b.Name); c != 0 {
			return c
		}
		return cmp.Compare(a.ID, b.ID)
	})
	v.TriggersShown = len(v.Triggers)
	if len(v.Triggers) > maxStatusRows {
		v.Triggers = v.Triggers[:maxStatusRows]
	}

	for _, q := range p.state.Queues(p.staleAfter) {
		if h.Namespace != "" && q.GetNamespace() != h.Namespace {
			continue
		}
		v.QueuesTotal++
		if q.GetStale() {
			v.StaleQueues++
		}
		if len(v.Queues) < maxStatusRows {
			v.Queues = append(v.Queues, q)
		}
	}
	for _, n := range p.state.Nodes() {
		if h.Namespace != "" && !holdsNamespace(n, h.Namespace) {
			continue
		}
		v.NodesTotal++
		v.GPUs += int(n.GetGpuCount())
		v.FreeGPUs += int(n.GetFree()[""])
		if n.GetAge().AsDuration() > p.staleAfter {
			v.StaleNodes++
		}
		if len(v.Nodes) < maxStatusRows {
			v.Nodes = append(v.Nodes, n)
		}
	}
	p.render(w, "index", v)
}

// holdsNamespace reports whether a pod of namespace ns holds one of n's GPUs.
func holdsNamespace(n *gpuscalerv1.NodeStatus, ns string) bool {
	for _, g := range n.GetGpus() {
		for _, h := range g.GetHolds() {
			if h.GetNamespace() == ns {
				return true
			}
		}
	}
	for _, u := range n.GetUnattributed() {
		if u.GetNamespace() == ns {
			return true
		}
	}
	return false
}

type triggerDetailView struct {
	statusHeader
	Trigger   triggerView
	Explained *gpuscalerv1.Explanation
	Effective []keyValue
}

func (p *statusPage) serveTrigger(w http.ResponseWriter, r *http.Request) {
	h, err := p.header(r, "")
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	raw := r.URL.Query().Get("id")
	id, err := strconv.ParseUint(raw, 10, 64)
	if err != nil {
		http.Error(w, fmt.Sprintf("id %q: want the number of a trigger on /status", raw), http.StatusBadRequest)
		return
	}
	row, ok := p.srv.calls.byID(id)
	if !ok {
		http.Error(w, fmt.Sprintf("trigger %d is not recorded: KEDA has not called this replica about it for %s, more than %d other triggers were called since, or the replica restarted; see /status",
			id, fmtDuration(p.srv.calls.idleAfter), p.srv.calls.max), http.StatusNotFound)
		return
	}
	now := p.srv.calls.now()
	v := triggerDetailView{statusHeader: h, Trigger: viewTrigger(&row, now)}
	v.Title = fmt.Sprintf("%s/%s — gpuscaler status", v.Trigger.Namespace, v.Trigger.Name)
	e := row.key.entry
	// Only triggers KEDA called about are explained: a page anyone on the HTTP port can
	// load must not make the scaler follow JetStream consumers of its choosing.
	ex, err := p.srv.Explain(r.Context(), &gpuscalerv1.ExplainRequest{Namespace: e.namespace, Name: row.key.name, Metadata: e.metadata})
	if err != nil {
		p.log.Warn("explain for the status page failed", "namespace", e.namespace, "name", row.key.name, "err", err)
		http.Error(w, "explain: "+err.Error(), http.StatusInternalServerError)
		return
	}
	v.Explained = ex
	v.Effective = sortedPairs(ex.GetEffective(), nil)
	p.render(w, "trigger", v)
}

// render writes the named view whole, or a 500 when the template fails: never half a page.
func (p *statusPage) render(w http.ResponseWriter, name string, data any) {
	var b bytes.Buffer
	if err := statusTemplates.ExecuteTemplate(&b, name, data); err != nil {
		p.log.Error("render the status page", "view", name, "err", err)
		http.Error(w, "render "+name+": "+err.Error(), http.StatusInternalServerError)
		return
	}
	hd := w.Header()
	hd.Set("Content-Type", "text/html; charset=utf-8")
	// No script runs, whatever a name or message holds; inline CSS is the page's own.
	hd.Set("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'")
	hd.Set("X-Content-Type-Options", "nosniff")
	hd.Set("Referrer-Policy", "no-referrer")
	hd.Set("Cache-Control", "no-store")
	w.Write(b.Bytes())
}

func viewTrigger(t *triggerCalls, now time.Time) triggerView {
	e := t.key.entry
	v := triggerView{
		ID:        t.id,
		Namespace: e.namespace,
		Name:      t.key.name,
		Metadata:  sortedPairs(e.metadata, func(k string) bool { return k != "scalerAddress" }),
		LastCall:  ago(t.last, now),
	}
	if e.err != nil {
		v.Invalid = status.Convert(e.err).Message()
	}
	v.IsActive = viewCall(t.isActive, now, activeWord(t.isActive.active))
	v.Spec = viewCall(t.spec, now, "")
	targets := map[string]float64{}
	if e.t != nil {
		for _, m := range e.t.MetricSpecs() {
			targets[m.Name] = m.Target
		}
	}
	for _, m := range t.metrics {
		if m.name == "" {
			continue
		}
		mv := metricView{Name: m.name, callView: viewCall(m.call, now, num(m.value))}
		if target, ok := targets[m.name]; ok {
			mv.Target = num(target)
			if m.err == nil {
				mv.Replicas = strconv.FormatInt(replicasFor(m.value, target), 10)
			}
		}
		v.Metrics = append(v.Metrics, mv)
	}
	v.Stream = streamView{Open: t.streamsOpen, Sent: viewCall(t.sent, now, activeWord(t.sent.active)), Ended: viewCall(t.ended, now, "")}
	if !t.opened.IsZero() {
		v.Stream.Opened = ago(t.opened, now)
	}
	if t.heldCount > 0 {
		v.Stream.Held, v.Stream.HeldAgo = t.heldCount, ago(t.held, now)
	}
	if t.ended.err == nil {
		v.Stream.Ended.Answer = "ended cleanly"
	}
	// A stream KEDA closed (Canceled) is KEDA's doing, not a failure; one that failed
	// otherwise is failing until a stream opens again.
	streamFailed := t.ended.err != nil && status.Code(t.ended.err) != codes.Canceled && !t.ended.at.Before(t.opened)
	v.Failing = e.err != nil || t.isActive.err != nil || t.spec.err != nil || streamFailed
	for _, m := range t.metrics {
		v.Failing = v.Failing || m.err != nil
	}
	return v
}

func viewCall(c call, now time.Time, answer string) callView {
	if c.at.IsZero() {
		return callView{}
	}
	v := callView{Made: true, Ago: ago(c.at, now), Answer: answer}
	if c.err != nil {
		st := status.Convert(c.err)
		v.Code, v.Error, v.Answer = st.Code().String(), st.Message(), ""
	}
	return v
}

func activeWord(active bool) string {
	if active {
		return "active"
	}
	return "inactive"
}

func ago(t, now time.Time) string { return fmtDuration(now.Sub(t)) + " ago" }

// fmtDuration prints d to the second (to the millisecond under a second, to the minute
// from an hour), as an operator reads an age: 450ms, 42s, 3m07s, 10m, 2h05m.
func fmtDuration(d time.Duration) string {
	switch {
	case d < 0:
		return "-" + fmtDuration(-d)
	case d < time.Second:
		return d.Round(time.Millisecond).String()
	case d < time.Minute:
		return d.Round(time.Second).String()
	case d < time.Hour:
		d = d.Round(time.Second)
		if d%time.Minute == 0 {
			return fmt.Sprintf("%dm", d/time.Minute)
		}
		return fmt.Sprintf("%dm%02ds", d/time.Minute, d%time.Minute/time.Second)
	default:
		d = d.Round(time.Minute)
		if d%time.Hour == 0 {
			return fmt.Sprintf("%dh", d/time.Hour)
		}
		return fmt.Sprintf("%dh%02dm", d/time.Hour, d%time.Hour/time.Minute)
	}
}

// fmtFree prints a node's free devices: "2 GPUs", "3 × 1g.10gb", by profile.
func fmtFree(free map[string]int32) string {
	if len(free) == 0 {
		return "none"
	}
	var parts []string
	for _, p := range slices.Sorted(maps.Keys(free)) {
		switch n := free[p]; {
		case p == "" && n == 1:
			parts = append(parts, "1 GPU")
		case p == "":
			parts = append(parts, fmt.Sprintf("%d GPUs", n))
		default:
			parts = append(parts, fmt.Sprintf("%d × %s", n, p))
		}
	}
	return strings.Join(parts, ", ")
}

// sortedPairs lists m by key, the keys keep accepts (all when keep is nil).
func sortedPairs(m map[string]string, keep func(string) bool) []keyValue {
	out := make([]keyValue, 0, len(m))
	for _, k := range slices.Sorted(maps.Keys(m)) {
		if keep == nil || keep(k) {
			out = append(out, keyValue{k, m[k]})
		}
	}
	return out
}
