package routes

import (
	"bytes"
	"errors"
	"io"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
)

const exampleRoutes = `
routes:
- name: llm
  host: llm.example.com
  pathPrefix: /v1
  header: {name: X-Model, value: llama}
  service: {name: llm-server, port: 8000}
  queue: llm-requests
  holdTimeout: 5m
  concurrency: 4
- name: dev
  url: http://127.0.0.1:8000
  queue: dev
  holdTimeout: 30s
`

func TestParse(t *testing.T) {
	tab, err := Parse("routes.yaml", []byte(exampleRoutes))
	if err != nil {
		t.Fatal(err)
	}
	rs := tab.Routes()
	if len(rs) != 2 {
		t.Fatalf("got %d routes, want 2", len(rs))
	}
	llm, dev := rs[0], rs[1]
	if llm.Name != "llm" || llm.Host != "llm.example.com" || llm.PathPrefix != "/v1" || llm.HeaderName != "X-Model" || llm.HeaderValue != "llama" ||
		llm.ServiceName != "llm-server" || llm.ServicePort != 8000 || llm.Queue != "llm-requests" || llm.HoldTimeout != 5*time.Minute || llm.Concurrency != 4 {
		t.Errorf("got llm %+v", llm)
	}
	if dev.URL.String() != "http://127.0.0.1:8000" || dev.HealthPath != DefaultHealthPath || dev.PathPrefix != "/" || dev.HoldTimeout != 30*time.Second {
		t.Errorf("got dev %+v", dev)
	}
}

func TestParseRefuses(t *testing.T) {
	route := func(extra string) string {
		return "routes:\n- name: llm\n  queue: q\n  holdTimeout: 5m\n" + extra
	}
	svc := "  service: {name: s, port: 80}\n"
	tests := map[string]struct {
		data string
		want string // the error begins with routes.yaml and contains this
	}{
		"empty":              {"", "routes.yaml: empty file"},
		"not yaml":           {"routes: [", "routes.yaml"},
		"top is a list":      {"- a", "routes.yaml:1: want a mapping"},
		"unknown top key":    {"routez: []", `routes.yaml:1: unknown key "routez"`},
		"routes not a list":  {"routes: 3", "routes.yaml:1: want a list under routes:"},
		"bad hold timeout":   {"routes:\n- name: llm\n  queue: q\n  holdTimeout: 5x\n" + svc, `routes.yaml:4: route "llm" (routes[0]): holdTimeout "5x"`},
		"zero hold timeout":  {"routes:\n- name: llm\n  queue: q\n  holdTimeout: 0s\n" + svc, `holdTimeout "0s": want more than 0`},
		"no hold timeout":    {"routes:\n- name: llm\n  queue: q\n" + svc, "holdTimeout is missing"},
		"unknown route key":  {route(svc + "  retries: 3\n"), `routes.yaml:6: route "llm" (routes[0]): unknown key "retries"`},
		"unknown svc key":    {route("  service: {name: s, port: 80, ns: x}\n"), `service: unknown key "ns"`},
		"no name":            {"routes:\n- queue: q\n  holdTimeout: 5m\n" + svc, "routes[0]: name is empty"},
		"duplicate name":     {route(svc) + "- name: llm\n  queue: q\n  holdTimeout: 1m\n" + svc, `route "llm" (routes[1]): name "llm" is also routes[0]'s`},
		"both backends":      {route(svc + "  url: http://x\n"), "both service and url"},
		"no backend":         {route(""), "neither service nor url"},
		"port 0":             {route("  service: {name: s, port: 0}\n"), "port 0: want 1 to 65535"},
		"port too big":       {route("  service: {name: s, port: 65536}\n"), "port 65536"},
		"port not a number":  {route("  service: {name: s, port: http}\n"), "line 5: cannot unmarshal"},
		"bad queue":          {"routes:\n- name: llm\n  queue: a.b\n  holdTimeout: 5m\n" + svc, `routes.yaml:3: route "llm" (routes[0]): queue: invalid name`},
		"negative conc":      {route(svc + "  concurrency: -1\n"), "concurrency -1"},
		"bad url":            {route("  url: ftp://x\n"), `url "ftp://x"`},
		"relative prefix":    {route(svc + "  pathPrefix: v1\n"), `pathPrefix "v1"`},
		"host with port":     {route(svc + "  host: a.b:80\n"), `host "a.b:80"`},
		"health for service": {route(svc + "  healthPath: /h\n"), "healthPath is for url backends"},
		"route not mapping":  {"routes:\n- 3\n", "routes.yaml:2: routes[0]: want a mapping"},
		"key twice":          {route(svc + "  queue: r\n"), `key "queue" given twice`},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			_, err := Parse("routes.yaml", []byte(tc.data))
			if err == nil {
				t.Fatalf("got no error, want one containing %q", tc.want)
			}
			if !errors.Is(err, ErrInvalid) {
				t.Errorf("got %v, want it to wrap ErrInvalid", err)
			}
			msg := strings.TrimPrefix(err.Error(), ErrInvalid.Error()+": ")
			if !strings.HasPrefix(msg, "routes.yaml") || !strings.Contains(msg, tc.want) {
				t.Errorf("got %q, want it to begin routes.yaml and contain %q", msg, tc.want)
			}
		})
	}
}

func TestMatch(t *testing.T) {
	tab, err := Parse("routes.yaml", []byte(`
routes:
- {name: any, url: "http://b", queue: q, holdTimeout: 1m}
- {name: v1, pathPrefix: /v1, url: "http://b", queue: q, holdTimeout: 1m}
- {name: v1chat, pathPrefix: /v1/chat, url: "http://b", queue: q, holdTimeout: 1m}
- {name: v1llama, pathPrefix: /v1, header: {name: X-Model, value: llama}, url: "http://b", queue: q, holdTimeout: 1m}
- {name: wild, host: "*.example.com", url: "http://b", queue: q, holdTimeout: 1m}
- {name: wilder, host: "*.eu.example.com", url: "http://b", queue: q, holdTimeout: 1m}
- {name: exact, host: llm.example.com, url: "http://b", queue: q, holdTimeout: 1m}
`))
	if err != nil {
		t.Fatal(err)
	}
	tests := map[string]struct {
		host, path, model string
		want              string
	}{
		"default":               {"other", "/", "", "any"},
		"prefix":                {"other", "/v1/models", "", "v1"},
		"prefix itself":         {"other", "/v1", "", "v1"},
		"not a segment":         {"other", "/v10", "", "any"},
		"longest prefix":        {"other", "/v1/chat/completions", "", "v1chat"},
		"header preferred":      {"other", "/v1/models", "llama", "v1llama"},
		"longer prefix first":   {"other", "/v1/chat/completions", "llama", "v1chat"},
		"exact host":            {"llm.example.com", "/v1", "", "exact"},
		"host case and port":    {"LLM.Example.COM:8080", "/", "", "exact"},
		"wildcard":              {"a.example.com", "/", "", "wild"},
		"longer wildcard":       {"a.eu.example.com", "/", "", "wilder"},
		"wildcard not the apex": {"example.com", "/", "", "any"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			r := httptest.NewRequest("GET", "http://"+tc.host+tc.path, nil)
			if tc.model != "" {
				r.Header.Set("X-Model", tc.model)
			}
			got := tab.Match(r)
			if got == nil || got.Name != tc.want {
				t.Errorf("got %v, want %s", got, tc.want)
			}
		})
	}
	empty, _ := Parse("r", []byte("routes: []"))
	if got := empty.Match(httptest.NewRequest("GET", "/", nil)); got != nil {
		t.Errorf("empty table: got %v, want no route", got)
	}
}

func FuzzParse(f *testing.F) {
	f.Add([]byte(exampleRoutes))
	f.Add([]byte("routes: []"))
	f.Add([]byte("routes:\n- {name: a, url: 'http://x', queue: q, holdTimeout: 1s, host: '*.a', header: {name: h}}"))
	f.Add([]byte("routes: &a [*a]"))
	f.Fuzz(func(t *testing.T, data []byte) {
		tab, err := Parse("f.yaml", data)
		if err != nil {
			if !errors.Is(err, ErrInvalid) || tab != nil {
				t.Fatalf("got %v and %v, want a nil table and an ErrInvalid", tab, err)
			}
			return
		}
		names := map[string]bool{}
		for _, r := range tab.Routes() {
			if r.Name == "" || names[r.Name] || r.HoldTimeout <= 0 || r.Concurrency < 0 || r.PathPrefix == "" ||
				(r.URL == nil) == (r.ServiceName == "") {
				t.Fatalf("accepted an invalid route %+v", r)
			}
			names[r.Name] = true
		}
		tab.Match(httptest.NewRequest("GET", "http://h.example/x", nil))
	})
}

// TestExampleRoutesParse reads the routes the inference example deploys, rendered from
// the gateway's Helm chart (examples/inference-scale-to-zero/gateway.yaml, its
// ConfigMap's routes.yaml): what the chart writes, the gateway must take.
func TestExampleRoutesParse(t *testing.T) {
	data, err := os.ReadFile("../../examples/inference-scale-to-zero/gateway.yaml")
	if err != nil {
		t.Fatalf("the rendered example: %v", err)
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	found := false
	for {
		var obj struct {
			Kind string            `yaml:"kind"`
			Data map[string]string `yaml:"data"`
		}
		if err := dec.Decode(&obj); err != nil {
			if errors.Is(err, io.EOF) {
				break
			}
			t.Fatal(err)
		}
		routes, ok := obj.Data["routes.yaml"]
		if obj.Kind != "ConfigMap" || !ok {
			continue
		}
		found = true
		tab, err := Parse("routes.yaml", []byte(routes))
		if err != nil {
			t.Fatalf("the example's routes: %v", err)
		}
		if rs := tab.Routes(); len(rs) != 1 || rs[0].ServiceName != "llm-server" || rs[0].Queue != "llm-requests" {
			t.Errorf("got routes %+v, want llm → llm-server, queue llm-requests", rs)
		}
	}
	if !found {
		t.Error("no ConfigMap with routes.yaml in the example")
	}
}
