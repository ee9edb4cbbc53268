// Package exporter is the collector's "exporter" GPU source: it scrapes a dcgm-exporter
// that already runs on the node (the GPU Operator deploys one on most GPU clusters)
// instead of talking to DCGM itself. Source.Collect does the HTTP GET; Parse, a pure
// function (parser.go), turns the exposition text into samples. The package imports
// nothing of the collector's, so its fuzz tests run in a test binary that links little.
package exporter

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"
	"sync/atomic"
	"time"

	"github.com/gpuscaler/gpuscaler/collector/sourceerr"
	gpuscalerv1 "github.com/gpuscaler/gpuscaler/proto/gpuscaler/v1"
)

const (
	// maxBody bounds one scrape. dcgm-exporter's page for eight GPUs with the
	// profiling fields is about 100 KiB, and a few MiB even with one series per pod on
	// shared GPUs; a body past 16 MiB is not a dcgm-exporter and is refused whole.
	maxBody = 16 << 20
	// defaultTimeout bounds a scrape when the caller gives no timeout.
	defaultTimeout = 5 * time.Second
)

// Source scrapes a dcgm-exporter. Collect is safe for concurrent use: the source
// holds no state between scrapes but the closed flag.
type Source struct {
	url     string // the URL as given, for requests
	shown   string // the URL with any password redacted, for errors
	client  *http.Client
	timeout time.Duration
	closed  atomic.Bool
}

// New returns a Source that reads the GPUs from a dcgm-exporter's /metrics page at
// rawURL (http or https), such as http://localhost:9400/metrics on a node where the
// exporter runs with hostNetwork, or the node-local address of its pod. Point it at this
// node's exporter: the samples are reported as this node's GPUs.
//
// client is used for every scrape; nil means a client of its own. timeout bounds each
// scrape (connect, headers and body) on top of the context given to Collect; zero or
// less means 5 s.
//
// dcgm-exporter gives no MIG device UUID, so a MIG instance's DeviceId is not the device
// plugin's id: see Parse.
func New(rawURL string, client *http.Client, timeout time.Duration) (*Source, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, fmt.Errorf("dcgm-exporter URL: %w", err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return nil, fmt.Errorf("dcgm-exporter URL %q: scheme %q, want http or https", u.Redacted(), u.Scheme)
	}
	if u.Host == "" {
		return nil, fmt.Errorf("dcgm-exporter URL %q: no host", u.Redacted())
	}
	if timeout <= 0 {
		timeout = defaultTimeout
	}
	if client == nil {
		// A transport of its own, so Close drops only this source's idle connections.
		var rt http.RoundTripper = http.DefaultTransport
		if t, ok := http.DefaultTransport.(*http.Transport); ok {
			rt = t.Clone()
		}
		client = &http.Client{Transport: rt, Timeout: timeout}
	}
	return &Source{url: u.String(), shown: u.Redacted(), client: client, timeout: timeout}, nil
}

func (s *Source) Name() string { return "exporter" }

// Collect scrapes the exporter once. A line the parser rejects costs that line only; the
// error is for a scrape that yields nothing: an unreachable exporter, a status other than
// 200, a body that is not text exposition or exceeds 16 MiB, or a page with no GPU in it
// (wrapping sourceerr.ErrNoGPUSource). The problems of a scrape that yields devices are not returned:
// the samples are what the caller needs, and one malformed exporter line must not cost
// the node's report.
func (s *Source) Collect(ctx context.Context) ([]*gpuscalerv1.GPUSample, error) {
	if s.closed.Load() {
		return nil, fmt.Errorf("dcgm-exporter %s: source is closed", s.shown)
	}
	body, err := s.fetch(ctx)
	if err != nil {
		return nil, err
	}
	samples, problems := Parse(bytes.NewReader(body))
	if len(samples) == 0 {
		if len(problems) > 0 {
			return nil, fmt.Errorf("%w: dcgm-exporter %s: no GPU in a %d-byte page; %d problems, the first: %w",
				sourceerr.ErrNoGPUSource, s.shown, len(body), len(problems), problems[0])
		}
		return nil, fmt.Errorf("%w: dcgm-exporter %s: no GPU in a %d-byte page", sourceerr.ErrNoGPUSource, s.shown, len(body))
	}
	return samples, nil
}

// fetch GETs the page and returns its body, at most maxBody bytes.
func (s *Source) fetch(ctx context.Context) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.url, nil)
	if err != nil {
		return nil, fmt.Errorf("dcgm-exporter %s: %w", s.shown, err)
	}
	// The classic text format, which expfmt's text parser reads; dcgm-exporter sends it
	// whatever is asked, a promhttp handler in front of it honours the ask.
	req.Header.Set("Accept", "text/plain;version=0.0.4;q=1,*/*;q=0.1")
	req.Header.Set("User-Agent", "gpuscaler-collector")
	resp, err := s.client.Do(req)
	if err != nil {
		// *url.Error already names the method and URL, with the password redacted.
		return nil, fmt.Errorf("dcgm-exporter: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		snippet, _ := io.ReadAll(io.LimitReader(resp.Body, 200))
		return nil, fmt.Errorf("dcgm-exporter %s: status %s: %q", s.shown, resp.Status, bytes.TrimSpace(snippet))
	}
	if ct := resp.Header.Get("Content-Type"); ct != "" {
		mt, _, err := mime.ParseMediaType(ct)
		if err != nil || (mt != "text/plain" && mt != "application/openmetrics-text") {
			return nil, fmt.Errorf("dcgm-exporter %s: content type %q, want text/plain (is it the exporter's /metrics page?)", s.shown, ct)
		}
	}
	if resp.ContentLength > maxBody {
		return nil, fmt.Errorf("dcgm-exporter %s: page of %d bytes, more than the %d allowed", s.shown, resp.ContentLength, maxBody)
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxBody+1))
	if err != nil {
		return nil, fmt.Errorf("dcgm-exporter %s: read page: %w", s.shown, err)
	}
	if len(body) > maxBody {
		return nil, fmt.Errorf("dcgm-exporter %s: page longer than the %d bytes allowed", s.shown, maxBody)
	}
	return body, nil
}

// Close drops the client's idle connections. Collect fails after it.
func (s *Source) Close() error {
	s.closed.Store(true)
	s.client.CloseIdleConnections()
	return nil
}
