package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"
)

// No container runs in this suite, and no kube-proxy: kwok's pods have addresses
// (10.244.x.x) that nothing here may dial. For the gateway's traffic to reach "the
// pods", the test plays both parts on loopback:
//
//   - modelServers plays the containers: for each pod of a Deployment that kwok makes
//     Ready (after its model load), a real HTTP server on a loopback port speaking
//     OpenAI's completions API. When the pod is deleted (a scale-down), its server
//     stops as a model server does on the kubelet's SIGTERM: it takes no new
//     connection and finishes what it serves, within the pod's grace period.
//   - kubeProxy plays kube-proxy, which the suite lacks: a TCP forwarder on 127.0.0.1
//     that sends each connection to one Ready pod's server. The gateway is told, with
//     --service-address, to send the Service's traffic there, as a gateway outside a
//     cluster would be pointed at `kubectl port-forward`.
//
// What the gateway acts on is not played: it holds and releases requests on the
// EndpointSlices the real EndpointSlice controller (kube-controller-manager) writes for
// the Service from the pods' real Ready conditions.

// modelServers runs a model server for each Ready pod of a namespace that a label
// selector selects.
type modelServers struct {
	t *testing.T
	// tokenEvery is how long a server takes per generated token: a request for n
	// tokens takes n × tokenEvery, the work of a GPU the test stands in for.
	tokenEvery time.Duration

	mu sync.Mutex // guards the fields below
	// servers by pod name, draining ones too; ready lists the pods whose servers take
	// new connections (Ready and not terminating), in the order they became so.
	servers map[string]*modelServer
	ready   []string
	// changed is closed and replaced whenever ready changes.
	changed chan struct{}
	stopped bool
	// drains are the servers shutting down.
	drains sync.WaitGroup
	// firstRequest is when a server first got a request (zero: none yet).
	firstRequest time.Time
}

// modelServer is one pod's server.
type modelServer struct {
	pod      string
	addr     string
	srv      *http.Server
	done     chan struct{} // closed when Serve has returned
	draining bool          // guarded by modelServers.mu
}

// startModelServers follows the pods of ns selected by selector until the test ends,
// running a server for each while it is Ready.
func startModelServers(t *testing.T, ns, selector string, tokenEvery time.Duration) *modelServers {
	t.Helper()
	ms := &modelServers{t: t, tokenEvery: tokenEvery, servers: map[string]*modelServer{}, changed: make(chan struct{})}
	factory := informers.NewSharedInformerFactoryWithOptions(env.Kube, 0, informers.WithNamespace(ns),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = selector }))
	inf := factory.Core().V1().Pods().Informer()
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { ms.sync(obj) },
		UpdateFunc: func(_, obj any) { ms.sync(obj) },
		DeleteFunc: func(obj any) {
			if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = d.Obj
			}
			if p, ok := obj.(*corev1.Pod); ok {
				ms.terminate(p)
			}
		},
	}); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	factory.Start(stop)
	t.Cleanup(func() {
		close(stop)
		factory.Shutdown()
		ms.mu.Lock()
		ms.stopped = true
		servers := make([]*modelServer, 0, len(ms.servers))
		for _, s := range ms.servers {
			servers = append(servers, s)
		}
		ms.mu.Unlock()
		for _, s := range servers {
			s.srv.Close()
		}
		ms.drains.Wait()
	})
	return ms
}

// sync starts a Ready pod's server, and takes a pod that is no longer Ready, or is
// terminating, out of the ready list (its server stops when the pod goes).
func (ms *modelServers) sync(obj any) {
	p, ok := obj.(*corev1.Pod)
	if !ok {
		return
	}
	if p.DeletionTimestamp != nil {
		ms.terminate(p)
		return
	}
	ready := podReady(p)
	ms.mu.Lock()
	defer ms.mu.Unlock()
	if ms.stopped {
		return
	}
	listed := slices.Contains(ms.ready, p.Name)
	switch {
	case ready && !listed:
		if ms.servers[p.Name] == nil {
			s, err := ms.serve(p.Name)
			if err != nil {
				ms.t.Errorf("model server for pod %s: %v", p.Name, err)
				return
			}
			ms.servers[p.Name] = s
		}
		ms.ready = append(ms.ready, p.Name)
		ms.broadcastLocked()
	case !ready && listed:
		ms.ready = slices.DeleteFunc(ms.ready, func(n string) bool { return n == p.Name })
		ms.broadcastLocked()
	}
}

// terminate stops a deleted pod's server as the kubelet's SIGTERM stops a model
// server: no new connection, and what it serves finishes within the pod's
// terminationGracePeriodSeconds, after which it is cut. kwok removes the pod object at
// once; the server, like a container still draining, outlives it. Calling it again
// does nothing.
func (ms *modelServers) terminate(p *corev1.Pod) {
	grace := 30 * time.Second // the API's default
	if g := p.Spec.TerminationGracePeriodSeconds; g != nil {
		grace = time.Duration(*g) * time.Second
	}
	ms.mu.Lock()
	defer ms.mu.Unlock()
	if slices.Contains(ms.ready, p.Name) {
		ms.ready = slices.DeleteFunc(ms.ready, func(n string) bool { return n == p.Name })
		ms.broadcastLocked()
	}
	s := ms.servers[p.Name]
	if s == nil || s.draining {
		return
	}
	s.draining = true
	ms.drains.Go(func() {
		ctx, cancel := context.WithTimeout(context.Background(), grace)
		defer cancel()
		if err := s.srv.Shutdown(ctx); err != nil {
			ms.t.Logf("model server of pod %s: cut after its grace period %s: %v", p.Name, grace, err)
			s.srv.Close()
		}
		<-s.done
		ms.mu.Lock()
		delete(ms.servers, p.Name)
		ms.mu.Unlock()
	})
}

func (ms *modelServers) broadcastLocked() {
	close(ms.changed)
	ms.changed = make(chan struct{})
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// serve starts pod's server on a free loopback port. ms.mu is held.
func (ms *modelServers) serve(pod string) (*modelServer, error) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/completions", func(w http.ResponseWriter, r *http.Request) { ms.complete(w, r, pod) })
	s := &modelServer{pod: pod, addr: lis.Addr().String(), srv: &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}, done: make(chan struct{})}
	go func() {
		defer close(s.done)
		_ = s.srv.Serve(lis) // http.ErrServerClosed once the pod goes
	}()
	return s, nil
}

// readyAddrs returns the addresses of the Ready pods' servers, in the order they became
// Ready.
func (ms *modelServers) readyAddrs() []string {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	var addrs []string
	for _, pod := range ms.ready {
		addrs = append(addrs, ms.servers[pod].addr)
	}
	return addrs
}

// first returns when a server first got a request (zero: none yet).
func (ms *modelServers) first() time.Time {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	return ms.firstRequest
}

// running returns how many servers run, draining ones too.
func (ms *modelServers) running() int {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	return len(ms.servers)
}

// pick returns the server of a Ready pod for the n-th connection, round robin, waiting
// up to timeout for one while none is Ready.
func (ms *modelServers) pick(ctx context.Context, n int, timeout time.Duration) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		ms.mu.Lock()
		if len(ms.ready) > 0 {
			addr := ms.servers[ms.ready[n%len(ms.ready)]].addr
			ms.mu.Unlock()
			return addr, nil
		}
		ch := ms.changed
		ms.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return "", errors.New("no Ready pod")
		}
	}
}

// The completions API as the model servers speak it (OpenAI's /v1/completions, which
// vLLM serves): a subset, enough for a client to tell a whole answer from a cut one.
type completionRequest struct {
	Model     string `json:"model"`
	Prompt    string `json:"prompt"`
	MaxTokens int    `json:"max_tokens"`
	Stream    bool   `json:"stream"`
}

type completionChoice struct {
	Index        int     `json:"index"`
	Text         string  `json:"text"`
	FinishReason *string `json:"finish_reason"`
}

type completion struct {
	ID      string             `json:"id"`
	Object  string             `json:"object"`
	Created int64              `json:"created"`
	Model   string             `json:"model"`
	Choices []completionChoice `json:"choices"`
}

// token is the i-th token the model servers generate.
func token(i int) string { return fmt.Sprintf(" t%d", i) }

// completionText is the whole text of an answer of n tokens.
func completionText(n int) string {
	var b strings.Builder
	for i := range n {
		b.WriteString(token(i))
	}
	return b.String()
}

// complete answers a completion of max_tokens tokens, one every tokenEvery: streamed
// as server-sent events (a chunk per token, the last with its finish_reason, then
// [DONE]), or whole at the end. A client that goes away ends it.
func (ms *modelServers) complete(w http.ResponseWriter, r *http.Request, pod string) {
	ms.mu.Lock()
	if ms.firstRequest.IsZero() {
		ms.firstRequest = time.Now()
	}
	ms.mu.Unlock()
	var req completionRequest
	if err := json.NewDecoder(io.LimitReader(r.Body, 1<<20)).Decode(&req); err != nil || req.MaxTokens < 1 || req.MaxTokens > 1000 {
		http.Error(w, `{"error":{"message":"want a JSON body with max_tokens from 1 to 1000","type":"invalid_request_error"}}`, http.StatusBadRequest)
		return
	}
	w.Header().Set("X-E2E-Pod", pod) // which "pod" answered, for the test's log
	id := fmt.Sprintf("cmpl-%s-%d", pod, time.Now().UnixNano())
	chunk := func(text string, last bool) completion {
		c := completion{ID: id, Object: "text_completion", Created: time.Now().Unix(), Model: req.Model,
			Choices: []completionChoice{{Text: text}}}
		if last {
			reason := "length"
			c.Choices[0].FinishReason = &reason
		}
		return c
	}
	timer := time.NewTimer(ms.tokenEvery)
	defer timer.Stop()
	generate := func() bool { // the time one token takes on the GPU
		timer.Reset(ms.tokenEvery)
		select {
		case <-timer.C:
			return true
		case <-r.Context().Done():
			return false
		}
	}
	if !req.Stream {
		for range req.MaxTokens {
			if !generate() {
				return
			}
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(chunk(completionText(req.MaxTokens), true))
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	rc := http.NewResponseController(w)
	for i := range req.MaxTokens {
		if !generate() {
			return
		}
		b, _ := json.Marshal(chunk(token(i), i == req.MaxTokens-1))
		if _, err := fmt.Fprintf(w, "data: %s\n\n", b); err != nil {
			return
		}
		if err := rc.Flush(); err != nil {
			return
		}
	}
	_, _ = io.WriteString(w, "data: [DONE]\n\n")
	_ = rc.Flush()
}

// kubeProxy plays kube-proxy, which this suite lacks, for one Service port: a TCP
// forwarder on 127.0.0.1 that sends each connection to the server of one Ready pod,
// round robin, as kube-proxy balances connections over a Service's ready endpoints.
// Only loopback addresses are ever dialled.
//
// Where kube-proxy finds no ready endpoint it rejects the connection, and the gateway
// dials again within its hold timeout; a listening socket cannot refuse one
// connection, so the forwarder instead waits, a few seconds at most, for its own view
// of the pods to catch up with the EndpointSlice the gateway acted on.
type kubeProxy struct {
	addr    string
	lis     net.Listener
	servers *modelServers

	mu    sync.Mutex // guards conns and n
	conns map[net.Conn]struct{}
	n     int
	wg    sync.WaitGroup
}

func startKubeProxy(t *testing.T, servers *modelServers) *kubeProxy {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	kp := &kubeProxy{addr: lis.Addr().String(), lis: lis, servers: servers, conns: map[net.Conn]struct{}{}}
	ctx, cancel := context.WithCancel(context.Background())
	kp.wg.Go(func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return // closed
			}
			kp.wg.Go(func() { kp.forward(ctx, t, c) })
		}
	})
	t.Cleanup(func() {
		cancel()
		lis.Close()
		kp.mu.Lock()
		for c := range kp.conns {
			c.Close()
		}
		kp.mu.Unlock()
		kp.wg.Wait()
	})
	return kp
}

// track records c as open (or not), for the cleanup to close it.
func (kp *kubeProxy) track(c net.Conn, open bool) {
	kp.mu.Lock()
	defer kp.mu.Unlock()
	if open {
		kp.conns[c] = struct{}{}
	} else {
		delete(kp.conns, c)
	}
}

// forward copies a client's connection to and from a Ready pod's server until either
// side closes it.
func (kp *kubeProxy) forward(ctx context.Context, t *testing.T, client net.Conn) {
	kp.track(client, true)
	defer kp.track(client, false)
	defer client.Close()
	kp.mu.Lock()
	n := kp.n
	kp.n++
	kp.mu.Unlock()
	addr, err := kp.servers.pick(ctx, n, 5*time.Second)
	if err != nil {
		t.Logf("kube-proxy stand-in: connection %d from %s closed: %v", n, client.RemoteAddr(), err)
		return
	}
	var d net.Dialer
	dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	server, err := d.DialContext(dctx, "tcp", addr)
	cancel()
	if err != nil {
		t.Logf("kube-proxy stand-in: dial %s: %v", addr, err)
		return
	}
	kp.track(server, true)
	defer kp.track(server, false)
	defer server.Close()
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(server, client); done <- struct{}{} }()
	go func() { _, _ = io.Copy(client, server); done <- struct{}{} }()
	<-done // either side closed: close both, which ends the other copy
	client.Close()
	server.Close()
	<-done
}

// answer is what a client got for one completion request.
type answer struct {
	code        int
	header      http.Header
	body        string // a JSON answer, or an error body
	text        string // the completion's text, from its chunks when streamed
	chunks      int
	done        bool // a stream ended with [DONE]
	finished    bool // the last choice carried a finish_reason
	sent, first time.Time
	err         error
}

// requestCompletion asks the gateway at addr for a completion of n tokens, streamed or
// not, under path, and reads the answer to its end.
func requestCompletion(ctx context.Context, addr, path string, n int, stream bool) answer {
	a := answer{sent: time.Now()}
	body, _ := json.Marshal(completionRequest{Model: "e2e-llm", Prompt: "say something", MaxTokens: n, Stream: stream})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+path, bytes.NewReader(body))
	if err != nil {
		a.err = err
		return a
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		a.err = err
		return a
	}
	defer resp.Body.Close()
	a.first, a.code, a.header = time.Now(), resp.StatusCode, resp.Header
	if resp.StatusCode != http.StatusOK || !stream {
		b, err := io.ReadAll(resp.Body)
		a.body, a.err = string(b), err
		if err == nil && resp.StatusCode == http.StatusOK {
			var c completion
			if a.err = json.Unmarshal(b, &c); a.err == nil && len(c.Choices) == 1 {
				a.text, a.finished = c.Choices[0].Text, c.Choices[0].FinishReason != nil
			}
		}
		return a
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/event-stream") {
		a.err = fmt.Errorf("Content-Type %q, want text/event-stream", ct)
		return a
	}
	var text strings.Builder
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue // the blank line ending an event
		}
		if a.done {
			a.err = fmt.Errorf("data after [DONE]: %q", data)
			return a
		}
		if data == "[DONE]" {
			a.done = true
			continue
		}
		var c completion
		if err := json.Unmarshal([]byte(data), &c); err != nil || len(c.Choices) != 1 {
			a.err = fmt.Errorf("chunk %d %q: %v", a.chunks, data, err)
			return a
		}
		a.chunks++
		text.WriteString(c.Choices[0].Text)
		a.finished = c.Choices[0].FinishReason != nil
	}
	a.text, a.err = text.String(), sc.Err()
	return a
}

// whole says what is wrong with a 200 answer of n tokens, or "" when it is whole.
func (a answer) whole(n int, stream bool) string {
	switch {
	case a.err != nil:
		return a.err.Error()
	case a.code != http.StatusOK:
		return fmt.Sprintf("status %d: %s", a.code, a.body)
	case stream && (a.chunks != n || !a.done):
		return fmt.Sprintf("stream of %d chunks (want %d), [DONE] %v", a.chunks, n, a.done)
	case a.text != completionText(n) || !a.finished:
		return fmt.Sprintf("text %q, finished %v; want %q, finished", a.text, a.finished, completionText(n))
	}
	return ""
}
