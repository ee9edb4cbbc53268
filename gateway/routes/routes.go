// Package routes is the gateway's routes file: its format, parsed strictly with the
// file's line in every error, and the match of a request to a route (host, then the
// longest path prefix, then a header). Pure functions of their input, apart from the
// gateway's I/O and its Kubernetes client, so the parser is fuzzed in a test binary of
// its own.
package routes

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/url"
	"slices"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	gpuscalerv1 "github.com/gpuscaler/gpuscaler/proto/gpuscaler/v1"
)

// DefaultHealthPath is where a url backend is probed when its route names no healthPath.
const DefaultHealthPath = "/health"

// ErrInvalid is wrapped by every error Parse returns.
var ErrInvalid = errors.New("invalid routes")

// Route sends the requests it matches to one backend and counts them as one queue.
type Route struct {
	// Name identifies the route in logs and metrics; unique in a Table.
	Name string
	// Host matches the request's host, case-insensitively and without its port: a name,
	// or "*.suffix" for any subdomain of suffix. Empty matches every host.
	Host string
	// PathPrefix matches the request path segment by segment: "/v1" matches "/v1" and
	// "/v1/chat", not "/v10". Never empty ("/" when the file gives none).
	PathPrefix string
	// HeaderName and HeaderValue, when HeaderName is set, match requests that carry that
	// header with exactly that value.
	HeaderName, HeaderValue string
	// ServiceName and ServicePort name a Service in the gateway's namespace, or URL a
	// backend outside Kubernetes (a path in it goes before the request's); exactly one
	// is set.
	ServiceName string
	ServicePort int
	URL         *url.URL
	// HealthPath is the path on the URL's host that answers 2xx when the backend is
	// ready.
	HealthPath string
	// Queue is the queue the route's requests are counted in.
	Queue string
	// HoldTimeout bounds how long a request waits for a ready backend.
	HoldTimeout time.Duration
	// Concurrency, when positive, is how many requests one backend replica takes at
	// once: the gateway then forwards to ready endpoints directly, least loaded first,
	// and holds what exceeds Concurrency × ready endpoints. 0 forwards to the Service.
	Concurrency int
}

// BackendKey says which backend a route reaches: routes with the same key share
// readiness; a reload that changes it starts the route afresh.
func (r *Route) BackendKey() string {
	if r.URL != nil {
		return "url " + r.URL.String() + " " + r.HealthPath
	}
	return fmt.Sprintf("service %s:%d", r.ServiceName, r.ServicePort)
}

// BackendName names the backend for people: "service llm-server" or the URL.
func (r *Route) BackendName() string {
	if r.URL != nil {
		return r.URL.String()
	}
	return "service " + r.ServiceName
}

// routeSpec is one route as the file spells it.
type routeSpec struct {
	Name       string `yaml:"name"`
	Host       string `yaml:"host"`
	PathPrefix string `yaml:"pathPrefix"`
	Header     *struct {
		Name  string `yaml:"name"`
		Value string `yaml:"value"`
	} `yaml:"header"`
	Service *struct {
		Name string `yaml:"name"`
		Port int    `yaml:"port"`
	} `yaml:"service"`
	URL         string `yaml:"url"`
	HealthPath  string `yaml:"healthPath"`
	Queue       string `yaml:"queue"`
	HoldTimeout string `yaml:"holdTimeout"`
	Concurrency int    `yaml:"concurrency"`
}

// The keys each mapping of the file may hold; any other is refused.
var (
	topKeys     = []string{"routes"}
	routeKeys   = []string{"name", "host", "pathPrefix", "header", "service", "url", "healthPath", "queue", "holdTimeout", "concurrency"}
	headerKeys  = []string{"name", "value"}
	serviceKeys = []string{"name", "port"}
)

// Parse reads a routes file's content; name is the file's name, used in errors.
// Errors wrap ErrInvalid and say the file, the line where known, the route and
// what is wrong, e.g. `routes.yaml:7: route "llm" (routes[0]): holdTimeout "5x": …`.
//
// The format:
//
//	routes:
//	- name: llm                              # unique
//	  host: llm.example.com                  # optional: exact, or *.suffix
//	  pathPrefix: /v1                        # optional; default /
//	  header: {name: X-Model, value: llama}  # optional
//	  service: {name: llm-server, port: 8000} # or url: http://127.0.0.1:8000
//	  healthPath: /health                    # url backends; default /health
//	  queue: llm-requests
//	  holdTimeout: 5m
//	  concurrency: 4                         # optional: per replica
func Parse(name string, data []byte) (*Table, error) {
	fail := func(line int, format string, args ...any) error {
		where := name
		if line > 0 {
			where = fmt.Sprintf("%s:%d", name, line)
		}
		return fmt.Errorf("%w: %s: %s", ErrInvalid, where, fmt.Sprintf(format, args...))
	}
	var doc yaml.Node
	dec := yaml.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, fail(0, "empty file: want a list under routes:")
		}
		return nil, fail(0, "%s", strings.TrimPrefix(err.Error(), "yaml: "))
	}
	if len(doc.Content) == 0 {
		return nil, fail(0, "empty file: want a list under routes:")
	}
	top := doc.Content[0]
	if top.Kind != yaml.MappingNode {
		return nil, fail(top.Line, "want a mapping with routes:, got %s", kindName(top))
	}
	if err := checkKeys(top, topKeys, "", fail); err != nil {
		return nil, err
	}
	list := valueOf(top, "routes")
	if list == nil || list.Kind != yaml.SequenceNode {
		line := top.Line
		if list != nil {
			line = list.Line
		}
		return nil, fail(line, "want a list under routes:")
	}
	t := &Table{}
	seen := map[string]int{}
	for i, item := range list.Content {
		where := fmt.Sprintf("routes[%d]", i)
		if item.Kind != yaml.MappingNode {
			return nil, fail(item.Line, "%s: want a mapping, got %s", where, kindName(item))
		}
		if n := valueOf(item, "name"); n != nil && n.Kind == yaml.ScalarNode && n.Value != "" {
			where = fmt.Sprintf("route %q (%s)", n.Value, where)
		}
		if err := checkKeys(item, routeKeys, where+": ", fail); err != nil {
			return nil, err
		}
		for key, keys := range map[string][]string{"header": headerKeys, "service": serviceKeys} {
			if v := valueOf(item, key); v != nil {
				if v.Kind != yaml.MappingNode {
					return nil, fail(v.Line, "%s: %s: want a mapping, got %s", where, key, kindName(v))
				}
				if err := checkKeys(v, keys, where+": "+key+": ", fail); err != nil {
					return nil, err
				}
			}
		}
		var s routeSpec
		if err := item.Decode(&s); err != nil {
			var te *yaml.TypeError
			if errors.As(err, &te) && len(te.Errors) > 0 {
				return nil, fail(0, "%s: %s", where, te.Errors[0])
			}
			return nil, fail(item.Line, "%s: %v", where, err)
		}
		line := func(key string) int {
			if v := valueOf(item, key); v != nil {
				return v.Line
			}
			return item.Line
		}
		r, key, err := s.route()
		if err != nil {
			return nil, fail(line(key), "%s: %v", where, err)
		}
		if j, dup := seen[r.Name]; dup {
			return nil, fail(line("name"), "%s: name %q is also routes[%d]'s", where, r.Name, j)
		}
		seen[r.Name] = i
		t.routes = append(t.routes, r)
	}
	t.sort()
	return t, nil
}

// route checks a spec and makes its Route; on error it also names the key at fault.
func (s *routeSpec) route() (*Route, string, error) {
	r := &Route{
		Name:        s.Name,
		Host:        strings.ToLower(s.Host),
		PathPrefix:  s.PathPrefix,
		HealthPath:  s.HealthPath,
		Queue:       s.Queue,
		Concurrency: s.Concurrency,
	}
	if r.Name == "" {
		return nil, "name", errors.New("name is empty")
	}
	if strings.ContainsAny(r.Host, "/: \t") || strings.Contains(strings.TrimPrefix(r.Host, "*."), "*") || r.Host == "*." {
		return nil, "host", fmt.Errorf("host %q: want a host name without port, or *.suffix", s.Host)
	}
	switch {
	case r.PathPrefix == "":
		r.PathPrefix = "/"
	case !strings.HasPrefix(r.PathPrefix, "/"):
		return nil, "pathPrefix", fmt.Errorf("pathPrefix %q: want a path beginning with /", s.PathPrefix)
	}
	if s.Header != nil {
		if s.Header.Name == "" {
			return nil, "header", errors.New("header: name is empty")
		}
		r.HeaderName, r.HeaderValue = s.Header.Name, s.Header.Value
	}
	switch {
	case s.Service != nil && s.URL != "":
		return nil, "url", errors.New("both service and url: want exactly one")
	case s.Service == nil && s.URL == "":
		return nil, "name", errors.New("neither service nor url: want exactly one")
	case s.Service != nil:
		if s.Service.Name == "" {
			return nil, "service", errors.New("service: name is empty")
		}
		if s.Service.Port < 1 || s.Service.Port > 65535 {
			return nil, "service", fmt.Errorf("service: port %d: want 1 to 65535", s.Service.Port)
		}
		if s.HealthPath != "" {
			return nil, "healthPath", errors.New("healthPath is for url backends; a service's readiness comes from its EndpointSlices")
		}
		r.ServiceName, r.ServicePort = s.Service.Name, s.Service.Port
	default:
		u, err := url.Parse(s.URL)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil || u.RawQuery != "" || u.Fragment != "" {
			return nil, "url", fmt.Errorf("url %q: want http://host[:port][/path] or https://…", s.URL)
		}
		r.URL = u
		if r.HealthPath == "" {
			r.HealthPath = DefaultHealthPath
		}
		if !strings.HasPrefix(r.HealthPath, "/") {
			return nil, "healthPath", fmt.Errorf("healthPath %q: want a path beginning with /", s.HealthPath)
		}
	}
	if err := gpuscalerv1.ValidateQueueName(r.Queue); err != nil {
		return nil, "queue", fmt.Errorf("queue: %w", err)
	}
	if s.HoldTimeout == "" {
		return nil, "name", errors.New("holdTimeout is missing: want how long a request may wait for a ready backend, such as 5m")
	}
	d, err := time.ParseDuration(s.HoldTimeout)
	if err != nil {
		return nil, "holdTimeout", fmt.Errorf("holdTimeout %q: want a duration such as 30s or 5m", s.HoldTimeout)
	}
	if d <= 0 {
		return nil, "holdTimeout", fmt.Errorf("holdTimeout %q: want more than 0", s.HoldTimeout)
	}
	r.HoldTimeout = d
	if r.Concurrency < 0 {
		return nil, "concurrency", fmt.Errorf("concurrency %d: want 0 (forward to the Service) or more", s.Concurrency)
	}
	return r, "", nil
}

// checkKeys refuses a mapping key outside allowed, or one given twice.
func checkKeys(m *yaml.Node, allowed []string, where string, fail func(int, string, ...any) error) error {
	seen := map[string]bool{}
	for i := 0; i+1 < len(m.Content); i += 2 {
		k := m.Content[i]
		if !slices.Contains(allowed, k.Value) {
			return fail(k.Line, "%sunknown key %q: want one of %s", where, k.Value, strings.Join(allowed, ", "))
		}
		if seen[k.Value] {
			return fail(k.Line, "%skey %q given twice", where, k.Value)
		}
		seen[k.Value] = true
	}
	return nil
}

// valueOf returns the value of key in mapping m, or nil.
func valueOf(m *yaml.Node, key string) *yaml.Node {
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == key {
			return m.Content[i+1]
		}
	}
	return nil
}

func kindName(n *yaml.Node) string {
	switch n.Kind {
	case yaml.SequenceNode:
		return "a list"
	case yaml.MappingNode:
		return "a mapping"
	case yaml.AliasNode:
		return "an alias"
	default:
		if n.Value == "" {
			return "nothing"
		}
		return fmt.Sprintf("%q", n.Value)
	}
}
