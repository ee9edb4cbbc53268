package exporter

import (
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gpuscaler/gpuscaler/collector/sourceerr"
	gpuscalerv1 "github.com/gpuscaler/gpuscaler/proto/gpuscaler/v1"
)

func TestNew(t *testing.T) {
	for name, tc := range map[string]struct {
		url     string
		wantErr string
	}{
		"http":               {url: "http://127.0.0.1:9400/metrics"},
		"https":              {url: "https://dcgm-exporter.gpu-operator.svc:9400/metrics"},
		"empty":              {url: "", wantErr: `scheme "", want http or https`},
		"no scheme":          {url: "localhost:9400/metrics", wantErr: `scheme "localhost", want http or https`},
		"ftp":                {url: "ftp://host/metrics", wantErr: `scheme "ftp"`},
		"no host":            {url: "http:///metrics", wantErr: "no host"},
		"not a URL":          {url: "http://%zz", wantErr: "invalid URL escape"},
		"password redacted":  {url: "ftp://user:secret@host/", wantErr: "user:xxxxx@host"},
		"unix socket scheme": {url: "unix:///run/dcgm.sock", wantErr: `scheme "unix"`},
	} {
		t.Run(name, func(t *testing.T) {
			s, err := New(tc.url, nil, 0)
			if tc.wantErr == "" {
				if err != nil {
					t.Fatalf("got error %v, want none", err)
				}
				if s.Name() != "exporter" {
					t.Errorf("got name %q, want exporter", s.Name())
				}
				if err := s.Close(); err != nil {
					t.Errorf("Close: got %v, want nil", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("got error %v, want one containing %q", err, tc.wantErr)
			}
			if strings.Contains(err.Error(), "secret") {
				t.Errorf("error %q shows the password", err)
			}
		})
	}
	t.Run("default client and timeout", func(t *testing.T) {
		for _, tc := range []struct{ in, want time.Duration }{{0, defaultTimeout}, {-time.Second, defaultTimeout}, {3 * time.Second, 3 * time.Second}} {
			s, err := New("http://localhost:9400/metrics", nil, tc.in)
			if err != nil {
				t.Fatal(err)
			}
			if s.timeout != tc.want || s.client.Timeout != tc.want {
				t.Errorf("timeout %v: got %v and client %v, want %v", tc.in, s.timeout, s.client.Timeout, tc.want)
			}
			if s.client.Transport == http.DefaultTransport {
				t.Error("got the shared default transport, want one of its own")
			}
		}
	})
	t.Run("given client", func(t *testing.T) {
		c := &http.Client{}
		s, err := New("http://localhost:9400/metrics", c, time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if got := s.client; got != c {
			t.Errorf("got client %p, want the given %p", got, c)
		}
	})
}

// testServer serves handler and returns its /metrics URL.
func testServer(t *testing.T, handler http.HandlerFunc) string {
	t.Helper()
	srv := httptest.NewServer(handler)
	t.Cleanup(srv.Close)
	return srv.URL + "/metrics"
}

func TestCollect(t *testing.T) {
	h100 := fixture(t, "aicr-h100-8gpu-k8s-pod-sampled.prom")
	garbage := fixture(t, "garbage.prom")
	serve := func(contentType string, body []byte) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			if contentType == "" {
				w.Header()["Content-Type"] = nil // no sniffing
			} else {
				w.Header().Set("Content-Type", contentType)
			}
			_, _ = w.Write(body)
		}
	}
	huge := bytes.Repeat([]byte("# padding to make the page longer than a dcgm-exporter's\n"), maxBody/56+1)
	for name, tc := range map[string]struct {
		handler  http.HandlerFunc
		wantGPUs int
		wantErr  string
		wantIs   error
	}{
		"text format":                  {handler: serve("text/plain; version=0.0.4; charset=utf-8", h100), wantGPUs: 8},
		"OpenMetrics content type":     {handler: serve("application/openmetrics-text; version=1.0.0; charset=utf-8", h100), wantGPUs: 8},
		"no content type":              {handler: serve("", h100), wantGPUs: 8},
		"bad lines cost only the line": {handler: serve("text/plain", garbage), wantGPUs: 2},
		"gzip": {
			handler: func(w http.ResponseWriter, r *http.Request) {
				if !strings.Contains(r.Header.Get("Accept-Encoding"), "gzip") {
					http.Error(w, "want gzip", http.StatusBadRequest)
					return
				}
				w.Header().Set("Content-Type", "text/plain")
				w.Header().Set("Content-Encoding", "gzip")
				zw := gzip.NewWriter(w)
				_, _ = zw.Write(h100)
				_ = zw.Close()
			},
			wantGPUs: 8,
		},
		"server error": {
			handler: func(w http.ResponseWriter, r *http.Request) {
				http.Error(w, "DCGM not ready", http.StatusServiceUnavailable)
			},
			wantErr: `status 503 Service Unavailable: "DCGM not ready"`,
		},
		"not found":        {handler: http.NotFound, wantErr: "status 404 Not Found"},
		"an HTML page":     {handler: serve("text/html; charset=utf-8", []byte("<html><body>login</body></html>")), wantErr: `content type "text/html; charset=utf-8", want text/plain`},
		"JSON":             {handler: serve("application/json", []byte(`{"gpus":[]}`)), wantErr: `content type "application/json"`},
		"bad content type": {handler: serve("text/plain; ===", h100), wantErr: `content type "text/plain; ==="`},
		"empty page":       {handler: serve("text/plain", nil), wantIs: sourceerr.ErrNoGPUSource, wantErr: "no GPU in a 0-byte page"},
		"another exporter's page": {
			handler: serve("text/plain", []byte("# TYPE node_load1 gauge\nnode_load1 0.42\nDCGM_FI_DEV_NVSWITCH_TEMPERATURE_CURRENT{nvswitch=\"0\"} 40\n")),
			wantIs:  sourceerr.ErrNoGPUSource, wantErr: "no GPU in a",
		},
		"nothing but bad lines": {
			handler: serve("text/plain", []byte("DCGM_FI_DEV_GPU_TEMP{UUID=\"GPU-1\"} ERROR - FAILED TO CONVERT TO STRING\n")),
			wantIs:  sourceerr.ErrNoGPUSource, wantErr: `1 problems, the first: line 1`,
		},
		"page larger than allowed, length announced": {
			handler: func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "text/plain")
				w.Header().Set("Content-Length", strconv.Itoa(len(huge)))
				_, _ = w.Write(huge)
			},
			wantErr: fmt.Sprintf("page of %d bytes, more than the %d allowed", len(huge), maxBody),
		},
		"page larger than allowed, streamed": {
			handler: func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "text/plain")
				w.(http.Flusher).Flush() // no Content-Length: chunked
				_, _ = w.Write(huge)
			},
			wantErr: fmt.Sprintf("page longer than the %d bytes allowed", maxBody),
		},
	} {
		t.Run(name, func(t *testing.T) {
			url := testServer(t, tc.handler)
			s, err := New(url, nil, 10*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = s.Close() })
			got, err := s.Collect(t.Context())
			if tc.wantErr == "" {
				if err != nil {
					t.Fatalf("got error %v, want none", err)
				}
				if len(got) != tc.wantGPUs {
					t.Errorf("got %d samples, want %d", len(got), tc.wantGPUs)
				}
				if err := (&gpuscalerv1.NodeReport{Node: "n", Gpus: got}).Validate(); err != nil {
					t.Errorf("samples do not validate: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("got error %v, want one containing %q", err, tc.wantErr)
			}
			if !strings.Contains(err.Error(), url) {
				t.Errorf("error %q does not name the URL %s", err, url)
			}
			if tc.wantIs != nil && !errors.Is(err, tc.wantIs) {
				t.Errorf("got error %v, want one wrapping %v", err, tc.wantIs)
			}
			if got != nil {
				t.Errorf("got %d samples with the error, want none", len(got))
			}
		})
	}
}

func TestCollectTimeouts(t *testing.T) {
	release := make(chan struct{})
	url := testServer(t, func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-release:
		}
	})
	t.Cleanup(func() { close(release) }) // runs before the server closes

	t.Run("the caller's deadline", func(t *testing.T) {
		s, err := New(url, nil, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
		defer cancel()
		if _, err := s.Collect(ctx); !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("got error %v, want one wrapping context.DeadlineExceeded", err)
		}
	})
	t.Run("the source's timeout, with a client of the caller's", func(t *testing.T) {
		s, err := New(url, &http.Client{}, 50*time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		if _, err := s.Collect(t.Context()); !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("got error %v, want one wrapping context.DeadlineExceeded", err)
		}
	})
	t.Run("the source's timeout, with its own client", func(t *testing.T) {
		s, err := New(url, nil, 50*time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		if _, err := s.Collect(t.Context()); !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("got error %v, want one wrapping context.DeadlineExceeded", err)
		}
	})
	t.Run("a cancelled context", func(t *testing.T) {
		s, err := New(url, nil, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		if _, err := s.Collect(ctx); !errors.Is(err, context.Canceled) {
			t.Errorf("got error %v, want one wrapping context.Canceled", err)
		}
	})
}

func TestCollectAfterClose(t *testing.T) {
	page := fixture(t, "linode-rtx4000ada-k8s-pod.prom")
	url := testServer(t, func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write(page) })
	s, err := New(url, nil, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 2 { // the connection is reused, then dropped by Close
		if got, err := s.Collect(t.Context()); err != nil || len(got) != 1 {
			t.Fatalf("Collect %d: got %d samples and %v, want 1 and no error", i, len(got), err)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatalf("Close: got %v, want nil", err)
	}
	if _, err := s.Collect(t.Context()); err == nil || !strings.Contains(err.Error(), "closed") {
		t.Errorf("Collect after Close: got %v, want an error saying the source is closed", err)
	}
}

func TestCollectRedactsPassword(t *testing.T) {
	forbidden := testServer(t, func(w http.ResponseWriter, r *http.Request) { http.Error(w, "no", http.StatusForbidden) })
	gone := httptest.NewServer(http.NotFoundHandler())
	gone.Close()
	for name, tc := range map[string]struct{ url, wantErr string }{
		"a status":          {url: forbidden, wantErr: "status 403"},
		"no server to talk": {url: gone.URL + "/metrics", wantErr: "connect"},
	} {
		t.Run(name, func(t *testing.T) {
			s, err := New(strings.Replace(tc.url, "http://", "http://scraper:s3cret@", 1), nil, time.Second)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			_, err = s.Collect(t.Context())
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("got error %v, want one containing %q", err, tc.wantErr)
			}
			if strings.Contains(err.Error(), "s3cret") || !strings.Contains(err.Error(), "scraper:") {
				t.Errorf("error %q shows the password, or not the URL", err)
			}
		})
	}
}
