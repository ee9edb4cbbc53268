package collectors

// The "exporter" GPU source: it scrapes a dcgm-exporter that already runs on the node
// (the GPU Operator deploys one on most GPU clusters) instead of talking to DCGM itself.
// Collect does the HTTP GET; parseExporter, a pure function, turns the exposition text
// into samples.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"mime"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"google.golang.org/protobuf/proto"

	gpuscalerv1 "github.com/gpuscaler/gpuscaler/proto/gpuscaler/v1"
)

const (
	// exporterMaxBody bounds one scrape. dcgm-exporter's page for eight GPUs with the
	// profiling fields is about 100 KiB, and a few MiB even with one series per pod on
	// shared GPUs; a body past 16 MiB is not a dcgm-exporter and is refused whole.
	exporterMaxBody = 16 << 20
	// exporterDefaultTimeout bounds a scrape when the caller gives no timeout.
	exporterDefaultTimeout = 5 * time.Second
	// exporterMaxProblems bounds the problems one parse lists; the rest are counted.
	exporterMaxProblems = 100
	// exporterMaxLineShown is how much of a rejected line a problem quotes.
	exporterMaxLineShown = 120
)

// exporterSource scrapes a dcgm-exporter. Collect is safe for concurrent use: the source
// holds no state between scrapes but the closed flag.
type exporterSource struct {
	url     string // the URL as given, for requests
	shown   string // the URL with any password redacted, for errors
	client  *http.Client
	timeout time.Duration
	closed  atomic.Bool
}

// NewExporter returns a Source that reads the GPUs from a dcgm-exporter's /metrics page at
// rawURL (http or https), such as http://localhost:9400/metrics on a node where the
// exporter runs with hostNetwork, or the node-local address of its pod. Point it at this
// node's exporter: the samples are reported as this node's GPUs.
//
// client is used for every scrape; nil means a client of its own. timeout bounds each
// scrape (connect, headers and body) on top of the context given to Collect; zero or
// less means 5 s.
//
// dcgm-exporter gives no MIG device UUID, so a MIG instance's DeviceId is not the device
// plugin's id: see parseExporter.
func NewExporter(rawURL string, client *http.Client, timeout time.Duration) (Source, error) {
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
		timeout = exporterDefaultTimeout
	}
	if client == nil {
		// A transport of its own, so Close drops only this source's idle connections.
		var rt http.RoundTripper = http.DefaultTransport
		if t, ok := http.DefaultTransport.(*http.Transport); ok {
			rt = t.Clone()
		}
		client = &http.Client{Transport: rt, Timeout: timeout}
	}
	return &exporterSource{url: u.String(), shown: u.Redacted(), client: client, timeout: timeout}, nil
}

func (s *exporterSource) Name() string { return "exporter" }

// Collect scrapes the exporter once. A line the parser rejects costs that line only; the
// error is for a scrape that yields nothing: an unreachable exporter, a status other than
// 200, a body that is not text exposition or exceeds 16 MiB, or a page with no GPU in it
// (wrapping ErrNoGPUSource). The problems of a scrape that yields devices are not returned:
// the samples are what the caller needs, and one malformed exporter line must not cost
// the node's report.
func (s *exporterSource) Collect(ctx context.Context) ([]*gpuscalerv1.GPUSample, error) {
	if s.closed.Load() {
		return nil, fmt.Errorf("dcgm-exporter %s: source is closed", s.shown)
	}
	body, err := s.fetch(ctx)
	if err != nil {
		return nil, err
	}
	samples, problems := parseExporter(bytes.NewReader(body))
	if len(samples) == 0 {
		if len(problems) > 0 {
			return nil, fmt.Errorf("%w: dcgm-exporter %s: no GPU in a %d-byte page; %d problems, the first: %w",
				ErrNoGPUSource, s.shown, len(body), len(problems), problems[0])
		}
		return nil, fmt.Errorf("%w: dcgm-exporter %s: no GPU in a %d-byte page", ErrNoGPUSource, s.shown, len(body))
	}
	return samples, nil
}

// fetch GETs the page and returns its body, at most exporterMaxBody bytes.
func (s *exporterSource) fetch(ctx context.Context) ([]byte, error) {
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
	if resp.ContentLength > exporterMaxBody {
		return nil, fmt.Errorf("dcgm-exporter %s: page of %d bytes, more than the %d allowed", s.shown, resp.ContentLength, exporterMaxBody)
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, exporterMaxBody+1))
	if err != nil {
		return nil, fmt.Errorf("dcgm-exporter %s: read page: %w", s.shown, err)
	}
	if len(body) > exporterMaxBody {
		return nil, fmt.Errorf("dcgm-exporter %s: page longer than the %d bytes allowed", s.shown, exporterMaxBody)
	}
	return body, nil
}

// Close drops the client's idle connections. Collect fails after it.
func (s *exporterSource) Close() error {
	s.closed.Store(true)
	s.client.CloseIdleConnections()
	return nil
}

// exporterField is a reading the parser takes from dcgm-exporter.
type exporterField uint8

const (
	exporterGPUUtil        exporterField = iota // DCGM_FI_DEV_GPU_UTIL
	exporterSMActive                            // DCGM_FI_PROF_SM_ACTIVE
	exporterTensorActive                        // DCGM_FI_PROF_PIPE_TENSOR_ACTIVE
	exporterGREngineActive                      // DCGM_FI_PROF_GR_ENGINE_ACTIVE
	exporterFBUsed                              // DCGM_FI_DEV_FB_USED
	exporterFBFree                              // DCGM_FI_DEV_FB_FREE
	exporterFBReserved                          // DCGM_FI_DEV_FB_RESERVED
	exporterFBTotal                             // DCGM_FI_DEV_FB_TOTAL
	exporterPower                               // DCGM_FI_DEV_POWER_USAGE
	exporterTemp                                // DCGM_FI_DEV_GPU_TEMP
	exporterXID                                 // DCGM_FI_DEV_XID_ERRORS
	exporterFieldCount
)

// exporterUnit is how dcgm-exporter prints a field, and so how the parser checks it.
type exporterUnit uint8

const (
	exporterPercent exporterUnit = iota // 0–100
	exporterRatio                       // 0–1, reported ×100
	exporterMiB                         // mebibytes, reported in bytes
	exporterWatts
	exporterCelsius
	exporterXIDNumber // the last XID's number
)

// exporterFields maps the metric names the parser reads to what they hold. The lines of
// every other family are skipped unparsed.
var exporterFields = map[string]struct {
	field exporterField
	unit  exporterUnit
}{
	"DCGM_FI_DEV_GPU_UTIL":            {exporterGPUUtil, exporterPercent},
	"DCGM_FI_PROF_SM_ACTIVE":          {exporterSMActive, exporterRatio},
	"DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": {exporterTensorActive, exporterRatio},
	"DCGM_FI_PROF_GR_ENGINE_ACTIVE":   {exporterGREngineActive, exporterRatio},
	"DCGM_FI_DEV_FB_USED":             {exporterFBUsed, exporterMiB},
	"DCGM_FI_DEV_FB_FREE":             {exporterFBFree, exporterMiB},
	"DCGM_FI_DEV_FB_RESERVED":         {exporterFBReserved, exporterMiB},
	"DCGM_FI_DEV_FB_TOTAL":            {exporterFBTotal, exporterMiB},
	"DCGM_FI_DEV_POWER_USAGE":         {exporterPower, exporterWatts},
	"DCGM_FI_DEV_GPU_TEMP":            {exporterTemp, exporterCelsius},
	"DCGM_FI_DEV_XID_ERRORS":          {exporterXID, exporterXIDNumber},
}

// Bounds past which a reading is not a measurement. DCGM marks "no value" with blank
// sentinels (2147483632 for 32-bit integers, 2^47 for doubles) that an exporter may print
// as numbers: check names them, and every bound below would reject them anyway.
const (
	// exporterRatioSlack lets a ratio exceed 1 by float error (1.0000001), clamped to 1.
	exporterRatioSlack = 1e-3
	exporterMaxMiB     = 1 << 32 // 4 PiB of framebuffer
	exporterMaxWatts   = 100_000
	exporterMaxCelsius = 1_000
	exporterMaxXID     = 2147483632 // DCGM's 32-bit blank
)

// check returns v in the unit GPUSample wants, or why it is no reading.
func (u exporterUnit) check(v float64) (float64, string) {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return 0, "not a finite number"
	}
	if v < 0 {
		return 0, "negative"
	}
	if exporterDCGMBlank(v) {
		return 0, "DCGM's blank (no value)"
	}
	switch u {
	case exporterPercent:
		if v > 100*(1+exporterRatioSlack) {
			return 0, "above 100%"
		}
		return min(v, 100), ""
	case exporterRatio:
		if v > 1+exporterRatioSlack {
			return 0, "above a ratio of 1"
		}
		return min(v*100, 100), ""
	case exporterMiB:
		if v > exporterMaxMiB {
			return 0, "beyond any framebuffer"
		}
	case exporterWatts:
		if v > exporterMaxWatts {
			return 0, "beyond any GPU's power"
		}
	case exporterCelsius:
		if v > exporterMaxCelsius {
			return 0, "beyond any GPU's temperature"
		}
	case exporterXIDNumber:
		if v >= exporterMaxXID {
			return 0, "not an XID number"
		}
	}
	return v, ""
}

// exporterDCGMBlank reports whether v is one of DCGM's blank values (32-bit, 64-bit or
// double): blank, not found, not supported, not permissioned.
func exporterDCGMBlank(v float64) bool {
	for _, blank := range [...]float64{0x7ffffff0, 0x7ffffffffffffff0, 0x800000000000} {
		if v >= blank && v <= blank+3 {
			return true
		}
	}
	return false
}

// exporterLineError is a line of the page the text parser rejected.
type exporterLineError struct {
	Line int    // 1-based line number in the page
	Text string // the line, cut to exporterMaxLineShown bytes
	Msg  string // the text parser's reason
}

func (e *exporterLineError) Error() string {
	return fmt.Sprintf("line %d %q: %s", e.Line, e.Text, e.Msg)
}

// exporterDeviceKey identifies a device in a page: a GPU by its UUID, a MIG instance by
// its GPU's UUID and its GPU instance id.
type exporterDeviceKey struct {
	uuid string
	gi   uint32
	mig  bool
}

// exporterPodLabels are a series' pod labels.
type exporterPodLabels struct{ namespace, name, container string }

// exporterDevice gathers one device's series.
type exporterDevice struct {
	key      exporterDeviceKey
	profile  string
	model    string
	index    uint32
	hasIndex bool
	badIndex bool              // a gpu label that is no index was reported
	firstPod exporterPodLabels // the first series' pod labels, to tell duplicates from sharing
	pod      *gpuscalerv1.PodRef
	badPod   bool // a pod whose namespace is invalid was reported
	value    [exporterFieldCount]float64
	has      [exporterFieldCount]bool
}

func (d *exporterDevice) String() string {
	if d.key.mig {
		return fmt.Sprintf("%s GPU instance %d", d.key.uuid, d.key.gi)
	}
	return d.key.uuid
}

// exporterParser holds one parse.
type exporterParser struct {
	text     expfmt.TextParser
	kept     []byte                   // the lines the text parser reads, each ending with a newline
	lines    []exporterLine           // where each kept line is in the page
	series   map[string][]*dto.Metric // the samples parsed, by family in page order
	devices  map[exporterDeviceKey]*exporterDevice
	problems []error
	unlisted int // problems past exporterMaxProblems
}

// parseExporter reads a dcgm-exporter /metrics page (Prometheus text format, with or
// without HELP and TYPE lines, families contiguous or not) and returns one sample per
// device, ordered by GPU index, UUID and GPU instance id, and the problems it skipped.
// Every sample passes NodeReport.Validate's rules. It is a pure function.
//
// Lines: only the sample lines of the families read below go to expfmt's text parser,
// with only the labels read below (see keep); comments, other families and a fault in
// them cost nothing. Without TYPE lines every family is untyped, which reads the same:
// dcgm-exporter's families are gauges and counters.
//
// Robustness: expfmt's text parser stops at the first line it rejects (a value printed as
// "ERROR - FAILED TO CONVERT TO STRING", a truncated line). The lines are parsed in runs:
// when a run fails at a line, what the parser returned is cut back to the lines before it
// (or, should that not add up, those lines are parsed again), the line is recorded as a
// problem (*exporterLineError, with its line number in the page) and parsing resumes
// after it. A reading out of its range is dropped and recorded too, naming the series.
//
// Devices: a series belongs to the device its UUID label names, or, with a GPU_I_ID label,
// to that MIG instance of the GPU; one without a UUID is skipped as a problem. A device is
// known by the series of the fields below, even with invalid values, and is reported with
// what could be read; a device with none of them (only clocks, say) is not reported, and
// neither are NVSwitches and CPUs, whose fields these are not. A GPU with MIG instances
// in the page is reported as its instances and not itself (the Source contract), and its
// own series (power, temperature, whole-GPU framebuffer) are not copied to them: they
// measure the GPU, not the slice, and a sum over slices would count them several times.
// The instances take the GPU's index and model when their series lack them.
//
// Labels: Index from gpu, Model from modelName, MigProfile from GPU_I_PROFILE,
// MigInstanceId from GPU_I_ID. Hostname is not read: the collector names its node. The
// first series of a device that carries a label sets it, taking the families in name
// order and each in page order, so the result does not depend on where bad lines fall.
//
// DeviceId: dcgm-exporter does not give a MIG device's "MIG-…" UUID, yet NodeReport needs
// the devices' ids unique, so a MIG instance's DeviceId is "<GPU UUID>/gi<GPU_I_ID>". It
// keeps the slices of one GPU apart and matches no device plugin id. A whole GPU's
// DeviceId is empty (its UUID).
//
// Pod: namespace, pod and container (pod_namespace, pod_name and container_name, which
// dcgm-exporter's --use-old-namespace prints, when those are absent) give Pod when
// namespace and pod are both non-empty and the namespace is a valid one; otherwise Pod is
// nil. The exporter knows no pod labels or owner, so those stay empty. On a GPU shared by
// several pods the exporter prints each series once per pod: the first pod is kept, and
// the other copies of the readings are not duplicates.
//
// Readings, in GPUSample's units, each absent when the page has no valid one:
//   - GpuUtil: DCGM_FI_DEV_GPU_UTIL (percent) on a whole GPU; on a MIG instance, where DCGM
//     does not define GPU util, DCGM_FI_PROF_GR_ENGINE_ACTIVE ×100 (events.proto). A whole
//     GPU without GPU_UTIL has no GpuUtil: graphics-engine activity is not the same
//     measure, and the DCGM source does not substitute it either.
//   - SmActive, TensorActive: DCGM_FI_PROF_SM_ACTIVE, DCGM_FI_PROF_PIPE_TENSOR_ACTIVE, ratios
//     0–1, ×100.
//   - A percentage or ratio up to 0.1% past its top (float error) is clamped to 100;
//     beyond, and NaN, infinite or negative readings, are dropped as problems.
//   - FbUsedBytes: DCGM_FI_DEV_FB_USED, MiB ×2^20. FbTotalBytes: DCGM_FI_DEV_FB_TOTAL when
//     printed; else used + free + reserved (DCGM_FI_DEV_FB_FREE, DCGM_FI_DEV_FB_RESERVED),
//     which is how DCGM defines the total now that drivers no longer count reserved memory
//     as used; else, without reserved, used + free (older exporters, whose used included
//     reserved); else absent. Used is capped at a printed total, read a moment apart.
//   - PowerWatts: DCGM_FI_DEV_POWER_USAGE, W. TemperatureCelsius: DCGM_FI_DEV_GPU_TEMP, °C.
//   - XidErrors: DCGM_FI_DEV_XID_ERRORS is the number of the last XID error DCGM saw on the
//     device since the exporter started (0 for none), not a count. One page cannot count
//     XIDs, so XidErrors is 1 when that number is non-zero, else 0: "at least one XID",
//     over the exporter's lifetime rather than the collector's. It never grows past 1.
func parseExporter(r io.Reader) ([]*gpuscalerv1.GPUSample, []error) {
	var buf bytes.Buffer
	if l, ok := r.(interface{ Len() int }); ok {
		buf.Grow(l.Len() + 1)
	}
	if _, err := buf.ReadFrom(r); err != nil {
		return nil, []error{fmt.Errorf("read the page: %w", err)}
	}
	page := buf.Bytes()
	p := &exporterParser{
		text:    expfmt.NewTextParser(model.UTF8Validation),
		devices: make(map[exporterDeviceKey]*exporterDevice, 16),
		series:  make(map[string][]*dto.Metric, len(exporterFields)),
		kept:    make([]byte, 0, len(page)/4+64), // a full page: a quarter of its lines, half of their labels
	}
	p.keep(page)
	p.parse(page)
	p.read()
	samples := p.samples()
	if p.unlisted > 0 {
		p.problems = append(p.problems, fmt.Errorf("%d more problems not listed", p.unlisted))
	}
	return samples, p.problems
}

func (p *exporterParser) problem(err error) {
	if len(p.problems) >= exporterMaxProblems {
		p.unlisted++
		return
	}
	p.problems = append(p.problems, err)
}

// exporterLine is a line of the page kept for the text parser.
type exporterLine struct {
	number int // 1-based, in the page
	start  int // offset in the page
}

// keep copies the sample lines of the families the parser reads into p.kept, each ending
// with a newline and with only the labels it reads, and notes where each came from.
// A carriage return before the newline goes, as it would be read into the value.
// Comments go (a family without its TYPE line reads the same), and so do the lines of
// other families and the labels nobody reads (pci_bus_id, Hostname, the driver version,
// …): expfmt's parser allocates for every label and checks each against the ones before
// it, so it costs several times more per line than the rest of the parse, and a full
// page holds four times the lines and twice the labels the parser reads.
func (p *exporterParser) keep(page []byte) {
	for number, start := 1, 0; start < len(page); number++ {
		end := len(page)
		if i := bytes.IndexByte(page[start:], '\n'); i >= 0 {
			end = start + i
		}
		line := bytes.TrimSuffix(page[start:end], []byte{'\r'}) // a CRLF line end
		if _, ok := exporterFields[string(exporterMetricName(line))]; ok {
			p.kept = exporterAppendLine(p.kept, line)
			p.kept = append(p.kept, '\n')
			p.lines = append(p.lines, exporterLine{number: number, start: start})
		}
		start = end + 1
	}
}

// exporterMetricName returns the metric name a sample line starts with, as the text
// format writes it: a name, or a quoted name first inside the braces or before them. It
// returns nil for a comment, a blank line, and a name with escapes (no name it reads
// has any).
func exporterMetricName(line []byte) []byte {
	line = bytes.TrimLeft(line, " \t")
	if len(line) > 0 && line[0] == '{' {
		line = bytes.TrimLeft(line[1:], " \t")
		if len(line) == 0 || line[0] != '"' {
			return nil
		}
	}
	if len(line) > 0 && line[0] == '"' {
		end := bytes.IndexByte(line[1:], '"')
		if end < 0 || bytes.IndexByte(line[1:1+end], '\\') >= 0 {
			return nil
		}
		return line[1 : 1+end]
	}
	end := bytes.IndexAny(line, "{ \t")
	if end < 0 {
		end = len(line)
	}
	if end == 0 || line[0] == '#' {
		return nil
	}
	return line[:end]
}

// exporterLabelsRead are the labels the parser reads (family's switch; keep the two in
// step); see parseExporter.
var exporterLabelsRead = map[string]bool{
	"gpu": true, "UUID": true, "modelName": true, "GPU_I_PROFILE": true, "GPU_I_ID": true,
	"namespace": true, "pod": true, "container": true,
	"pod_namespace": true, "pod_name": true, "container_name": true,
}

// exporterAppendLine appends a sample line to dst without the labels the parser does not
// read. The label pairs it keeps are copied as they are, for the text parser to read and
// judge; a line it cannot follow (a quoted name, a label set it does not understand) is
// appended whole. A fault in a label that is dropped costs nothing.
func exporterAppendLine(dst, line []byte) []byte {
	open := bytes.IndexByte(line, '{')
	if open <= 0 || line[0] == ' ' || line[0] == '\t' || line[0] == '"' || bytes.IndexByte(line[:open], '"') >= 0 {
		return append(dst, line...)
	}
	mark := len(dst)
	dst = append(dst, line[:open+1]...)
	kept := 0
	i := open + 1
	skip := func() {
		for i < len(line) && (line[i] == ' ' || line[i] == '\t') {
			i++
		}
	}
	for {
		skip()
		if i < len(line) && line[i] == '}' {
			return append(dst, line[i:]...)
		}
		start := i
		for i < len(line) && exporterLabelByte(line[i], i > start) {
			i++
		}
		name := line[start:i]
		skip()
		if len(name) == 0 || i >= len(line) || line[i] != '=' {
			return append(dst[:mark], line...)
		}
		i++
		skip()
		if i >= len(line) || line[i] != '"' {
			return append(dst[:mark], line...)
		}
		for i++; i < len(line) && line[i] != '"'; i++ {
			if line[i] == '\\' {
				i++
			}
		}
		if i >= len(line) {
			return append(dst[:mark], line...)
		}
		i++ // past the closing quote
		if exporterLabelsRead[string(name)] {
			if kept > 0 {
				dst = append(dst, ',')
			}
			dst = append(dst, line[start:i]...)
			kept++
		}
		skip()
		switch {
		case i < len(line) && line[i] == ',':
			i++
		case i < len(line) && line[i] == '}':
		default:
			return append(dst[:mark], line...)
		}
	}
}

// exporterLabelByte reports whether b may be in a label name, after its first byte when
// later is true.
func exporterLabelByte(b byte, later bool) bool {
	return b == '_' || (b >= 'a' && b <= 'z') || (b >= 'A' && b <= 'Z') || (later && b >= '0' && b <= '9')
}

// parse feeds the kept lines to the text parser in runs that parse; see parseExporter.
func (p *exporterParser) parse(page []byte) {
	pos, first := 0, 0 // p.kept[pos:] starts with kept line first
	for pos < len(p.kept) {
		fams, err := p.text.TextToMetricFamilies(bytes.NewReader(p.kept[pos:]))
		if err == nil {
			p.families(fams)
			return
		}
		var pe expfmt.ParseError
		start := -1
		if errors.As(err, &pe) && pe.Line >= 1 && first+pe.Line <= len(p.lines) {
			start = exporterLineStart(p.kept, pos, pe.Line)
		}
		if start < 0 {
			p.problem(fmt.Errorf("line %d and after: %w", p.lines[first].number, err))
			return
		}
		bad := p.lines[first+pe.Line-1]
		text := page[bad.start:]
		if i := bytes.IndexByte(text, '\n'); i >= 0 {
			text = text[:i]
		}
		if len(text) > exporterMaxLineShown {
			text = text[:exporterMaxLineShown]
		}
		p.problem(&exporterLineError{Line: bad.number, Text: string(text), Msg: pe.Msg})
		end := start + bytes.IndexByte(p.kept[start:], '\n') + 1
		if exporterDropBroken(fams, pe.Line, exporterMetricName(p.kept[start:end-1])) {
			p.families(fams)
		} else if start > pos {
			// The same parser state over the same lines: they parse again.
			fams, err := p.text.TextToMetricFamilies(bytes.NewReader(p.kept[pos:start]))
			if err != nil {
				p.problem(fmt.Errorf("lines %d to %d: %w", p.lines[first].number, bad.number-1, err))
			} else {
				p.families(fams)
			}
		}
		pos, first = end, first+pe.Line
	}
}

// exporterDropBroken makes what the text parser returned with an error at line n the
// samples of lines 1 to n-1, and reports whether it could; if not, those lines must be
// parsed again. Every kept line is one sample of an untyped family, so those lines made
// n-1 samples; the parser may also have added the sample of line n, before finding its
// fault in the value or timestamp, as the last of family name.
func exporterDropBroken(fams map[string]*dto.MetricFamily, n int, name []byte) bool {
	total := 0
	for _, mf := range fams {
		total += len(mf.GetMetric())
	}
	switch total {
	case n - 1:
		return true
	case n:
		mf := fams[string(name)]
		if mf == nil || len(mf.GetMetric()) == 0 {
			return false
		}
		mf.Metric = mf.Metric[:len(mf.Metric)-1]
		return true
	}
	return false
}

// exporterLineStart returns the offset of the n-th line (1-based) of page[pos:], or -1.
func exporterLineStart(page []byte, pos, n int) int {
	for ; n > 1; n-- {
		i := bytes.IndexByte(page[pos:], '\n')
		if i < 0 {
			return -1
		}
		pos += i + 1
	}
	if pos >= len(page) {
		return -1
	}
	return pos
}

// families gathers the samples of one run, by family in page order.
func (p *exporterParser) families(fams map[string]*dto.MetricFamily) {
	for name, mf := range fams {
		p.series[name] = append(p.series[name], mf.GetMetric()...)
	}
}

// read takes the gathered samples, family by family in name order, so that which series
// sets a device's labels depends neither on map order nor on where bad lines cut runs.
func (p *exporterParser) read() {
	for _, name := range slices.Sorted(maps.Keys(p.series)) {
		if spec, ok := exporterFields[name]; ok { // always: only their lines are kept
			p.family(name, spec.field, spec.unit, p.series[name])
		}
	}
}

// exporterLabels are the labels of one series that the parser reads.
type exporterLabels struct {
	gpu, uuid, model, profile, gi string
	pod, oldPod                   exporterPodLabels
}

func (p *exporterParser) family(name string, field exporterField, unit exporterUnit, series []*dto.Metric) {
	for _, m := range series {
		var l exporterLabels
		for _, lp := range m.GetLabel() {
			switch v := lp.GetValue(); lp.GetName() {
			case "gpu":
				l.gpu = v
			case "UUID":
				l.uuid = v
			case "modelName":
				l.model = v
			case "GPU_I_PROFILE":
				l.profile = v
			case "GPU_I_ID":
				l.gi = v
			case "namespace":
				l.pod.namespace = v
			case "pod":
				l.pod.name = v
			case "container":
				l.pod.container = v
			case "pod_namespace":
				l.oldPod.namespace = v
			case "pod_name":
				l.oldPod.name = v
			case "container_name":
				l.oldPod.container = v
			}
		}
		if l.pod == (exporterPodLabels{}) {
			l.pod = l.oldPod
		}
		if l.uuid == "" {
			p.problem(fmt.Errorf("%s series without a UUID label skipped", name))
			continue
		}
		key := exporterDeviceKey{uuid: l.uuid}
		if l.gi != "" {
			gi, err := strconv.ParseUint(l.gi, 10, 32)
			if err != nil {
				p.problem(fmt.Errorf("%s of %s: GPU_I_ID %q is not a GPU instance id; series skipped", name, l.uuid, l.gi))
				continue
			}
			key.gi, key.mig = uint32(gi), true
		}
		d := p.devices[key]
		if d == nil {
			d = &exporterDevice{key: key, firstPod: l.pod}
			p.devices[key] = d
		}
		p.label(d, &l)
		v, ok := exporterValue(m)
		switch {
		case !ok:
			p.problem(fmt.Errorf("%s of %s: no sample value; skipped", name, d))
		case d.has[field]:
			// The same series again is a fault; another pod's copy is how the exporter
			// shows a shared GPU.
			if l.pod == d.firstPod {
				p.problem(fmt.Errorf("%s of %s: series repeated; the first value kept", name, d))
			}
		default:
			if got, why := unit.check(v); why != "" {
				p.problem(fmt.Errorf("%s of %s: %v is %s; dropped", name, d, v, why))
			} else {
				d.value[field], d.has[field] = got, true
			}
		}
	}
}

// label fills what the device still lacks from one series' labels.
func (p *exporterParser) label(d *exporterDevice, l *exporterLabels) {
	if !d.hasIndex && !d.badIndex && l.gpu != "" {
		if i, err := strconv.ParseUint(l.gpu, 10, 32); err == nil {
			d.index, d.hasIndex = uint32(i), true
		} else {
			d.badIndex = true
			p.problem(fmt.Errorf("%s: gpu label %q is not an index", d, l.gpu))
		}
	}
	if d.model == "" {
		d.model = l.model
	}
	if d.profile == "" && d.key.mig {
		d.profile = l.profile
	}
	if d.pod == nil && !d.badPod && l.pod.namespace != "" && l.pod.name != "" {
		if err := gpuscalerv1.ValidateNamespace(l.pod.namespace); err != nil {
			d.badPod = true
			p.problem(fmt.Errorf("%s: pod %s/%s: %w; no pod reported", d, l.pod.namespace, l.pod.name, err))
		} else {
			d.pod = &gpuscalerv1.PodRef{Namespace: l.pod.namespace, Name: l.pod.name, Container: l.pod.container}
		}
	}
}

// exporterValue returns a series' sample value: dcgm-exporter types its families gauge or
// counter, and a family without a TYPE line is untyped.
func exporterValue(m *dto.Metric) (float64, bool) {
	switch {
	case m.GetGauge() != nil:
		return m.GetGauge().GetValue(), true
	case m.GetCounter() != nil:
		return m.GetCounter().GetValue(), true
	case m.GetUntyped() != nil:
		return m.GetUntyped().GetValue(), true
	}
	return 0, false
}

// samples turns the devices into GPUSamples; see parseExporter.
func (p *exporterParser) samples() []*gpuscalerv1.GPUSample {
	devs := make([]*exporterDevice, 0, len(p.devices))
	anyMIG := false
	for _, d := range p.devices {
		devs = append(devs, d)
		anyMIG = anyMIG || d.key.mig
	}
	var inMIG map[string]bool // GPUs reported through their instances
	if anyMIG {
		inMIG = make(map[string]bool)
		for _, d := range devs {
			if !d.key.mig {
				continue
			}
			inMIG[d.key.uuid] = true
			if gpu := p.devices[exporterDeviceKey{uuid: d.key.uuid}]; gpu != nil {
				if !d.hasIndex && gpu.hasIndex {
					d.index, d.hasIndex = gpu.index, true
				}
				if d.model == "" {
					d.model = gpu.model
				}
			}
		}
	}
	devs = slices.DeleteFunc(devs, func(d *exporterDevice) bool { return !d.key.mig && inMIG[d.key.uuid] })
	slices.SortFunc(devs, func(a, b *exporterDevice) int {
		switch {
		case a.index != b.index:
			return cmpOrder(a.index < b.index)
		case a.key.uuid != b.key.uuid:
			return strings.Compare(a.key.uuid, b.key.uuid)
		case a.key.mig != b.key.mig:
			return cmpOrder(!a.key.mig)
		default:
			return cmpOrder(a.key.gi < b.key.gi)
		}
	})
	if len(devs) > gpuscalerv1.MaxGPUs {
		p.problem(fmt.Errorf("%d devices, more than the %d a report holds; the last %d dropped",
			len(devs), gpuscalerv1.MaxGPUs, len(devs)-gpuscalerv1.MaxGPUs))
		devs = devs[:gpuscalerv1.MaxGPUs]
	}
	out := make([]*gpuscalerv1.GPUSample, 0, len(devs))
	var ids map[string]bool // only a MIG instance's made-up id can collide
	if anyMIG {
		ids = make(map[string]bool, len(devs))
	}
	for _, d := range devs {
		if !d.hasIndex && !d.badIndex {
			p.problem(fmt.Errorf("%s: no gpu label; index 0 reported", d))
		}
		g := p.sample(d)
		if ids != nil {
			if ids[g.DeviceID()] {
				p.problem(fmt.Errorf("%s: device id %s taken by another device; dropped", d, g.DeviceID()))
				continue
			}
			ids[g.DeviceID()] = true
		}
		out = append(out, g)
	}
	return out
}

// cmpOrder is -1 when a sorts first, else 1.
func cmpOrder(aFirst bool) int {
	if aFirst {
		return -1
	}
	return 1
}

func (p *exporterParser) sample(d *exporterDevice) *gpuscalerv1.GPUSample {
	get := func(f exporterField) (float64, bool) { return d.value[f], d.has[f] }
	g := &gpuscalerv1.GPUSample{Uuid: d.key.uuid, Index: d.index, Model: d.model, Pod: d.pod}
	util := exporterGPUUtil
	if d.key.mig {
		g.MigProfile = d.profile
		g.MigInstanceId = proto.Uint32(d.key.gi)
		g.DeviceId = d.key.uuid + "/gi" + strconv.FormatUint(uint64(d.key.gi), 10)
		util = exporterGREngineActive
	}
	if v, ok := get(util); ok {
		g.GpuUtil = proto.Float64(v)
	}
	if v, ok := get(exporterSMActive); ok {
		g.SmActive = proto.Float64(v)
	}
	if v, ok := get(exporterTensorActive); ok {
		g.TensorActive = proto.Float64(v)
	}
	used, hasUsed := get(exporterFBUsed)
	free, hasFree := get(exporterFBFree)
	reserved, _ := get(exporterFBReserved) // 0 when not printed
	total, hasTotal := get(exporterFBTotal)
	switch {
	case hasTotal && total > 0:
		if hasUsed {
			used = min(used, total)
		}
	case hasUsed && hasFree:
		total, hasTotal = used+free+reserved, true
	default:
		hasTotal = false
	}
	if hasUsed {
		g.FbUsedBytes = proto.Uint64(exporterBytes(used))
	}
	if hasTotal {
		g.FbTotalBytes = proto.Uint64(exporterBytes(total))
	}
	if v, ok := get(exporterPower); ok {
		g.PowerWatts = proto.Float64(v)
	}
	if v, ok := get(exporterTemp); ok {
		g.TemperatureCelsius = proto.Float64(v)
	}
	if v, ok := get(exporterXID); ok && v != 0 {
		g.XidErrors = 1
	}
	return g
}

// exporterBytes converts MiB, at most 3 × exporterMaxMiB, to bytes.
func exporterBytes(mib float64) uint64 {
	return uint64(mib * (1 << 20))
}
