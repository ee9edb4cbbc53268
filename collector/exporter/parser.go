package exporter

// The parser reads the /metrics page of NVIDIA's dcgm-exporter (Prometheus text
// exposition) into GPU samples: Parse. It is a pure function: no I/O, no state.

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"google.golang.org/protobuf/proto"

	"github.com/gpuscaler/gpuscaler/collector/xid"
	gpuscalerv1 "github.com/gpuscaler/gpuscaler/proto/gpuscaler/v1"
)

const (
	// maxProblems bounds the problems one parse lists; the rest are counted.
	maxProblems = 100
	// maxLineShown is how much of a rejected line a problem quotes.
	maxLineShown = 120
)

// field is a reading the parser takes from dcgm-exporter.
type field uint8

const (
	fieldGPUUtil        field = iota // DCGM_FI_DEV_GPU_UTIL
	fieldSMActive                    // DCGM_FI_PROF_SM_ACTIVE
	fieldTensorActive                // DCGM_FI_PROF_PIPE_TENSOR_ACTIVE
	fieldGREngineActive              // DCGM_FI_PROF_GR_ENGINE_ACTIVE
	fieldFBUsed                      // DCGM_FI_DEV_FB_USED
	fieldFBFree                      // DCGM_FI_DEV_FB_FREE
	fieldFBReserved                  // DCGM_FI_DEV_FB_RESERVED
	fieldFBTotal                     // DCGM_FI_DEV_FB_TOTAL
	fieldPower                       // DCGM_FI_DEV_POWER_USAGE
	fieldTemp                        // DCGM_FI_DEV_GPU_TEMP
	fieldXID                         // DCGM_FI_DEV_XID_ERRORS
	fieldMinor                       // DCGM_FI_DEV_GPU_MINOR_NUMBER, not a reading: see Parse
	fieldCount
)

// unit is how dcgm-exporter prints a field, and so how the parser checks it.
type unit uint8

const (
	unitPercent unit = iota // 0–100
	unitRatio               // 0–1, reported ×100
	unitMiB                 // mebibytes, reported in bytes
	unitWatts
	unitCelsius
	unitXIDNumber // the last XID's number
	unitMinorNumber
)

// fieldsByName maps the metric names the parser reads to what they hold. The lines of
// every other family are skipped unparsed.
var fieldsByName = map[string]struct {
	field field
	unit  unit
}{
	"DCGM_FI_DEV_GPU_UTIL":            {fieldGPUUtil, unitPercent},
	"DCGM_FI_PROF_SM_ACTIVE":          {fieldSMActive, unitRatio},
	"DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": {fieldTensorActive, unitRatio},
	"DCGM_FI_PROF_GR_ENGINE_ACTIVE":   {fieldGREngineActive, unitRatio},
	"DCGM_FI_DEV_FB_USED":             {fieldFBUsed, unitMiB},
	"DCGM_FI_DEV_FB_FREE":             {fieldFBFree, unitMiB},
	"DCGM_FI_DEV_FB_RESERVED":         {fieldFBReserved, unitMiB},
	"DCGM_FI_DEV_FB_TOTAL":            {fieldFBTotal, unitMiB},
	"DCGM_FI_DEV_POWER_USAGE":         {fieldPower, unitWatts},
	"DCGM_FI_DEV_GPU_TEMP":            {fieldTemp, unitCelsius},
	"DCGM_FI_DEV_XID_ERRORS":          {fieldXID, unitXIDNumber},
	// Printed only when the exporter's counters CSV lists it as a gauge; DCGM's field is
	// DCGM_FI_DEV_GPU_MINOR_NUMBER, and DCGM_FI_DEV_MINOR_NUMBER its older name, which
	// dcgm-exporter still accepts (go-dcgm GetFieldID reads both tables).
	"DCGM_FI_DEV_GPU_MINOR_NUMBER": {fieldMinor, unitMinorNumber},
	"DCGM_FI_DEV_MINOR_NUMBER":     {fieldMinor, unitMinorNumber},
}

// minorLabels are the labels that carry a GPU's minor number when the exporter's
// counters CSV lists the field as a label ("label" type, as DCGM_FI_DRIVER_VERSION in the
// default CSV): dcgm-exporter names the label after the field as the CSV spells it.
var minorLabels = [...]string{"DCGM_FI_DEV_GPU_MINOR_NUMBER", "DCGM_FI_DEV_MINOR_NUMBER"}

// Bounds past which a reading is not a measurement. DCGM marks "no value" with blank
// sentinels (2147483632 for 32-bit integers, 2^47 for doubles) that an exporter may print
// as numbers: check names them, and every bound below would reject them anyway.
const (
	// ratioSlack lets a ratio exceed 1 by float error (1.0000001), clamped to 1.
	ratioSlack = 1e-3
	maxMiB     = 1 << 32 // 4 PiB of framebuffer
	maxWatts   = 100_000
	maxCelsius = 1_000
	maxXID     = 2147483632 // DCGM's 32-bit blank
)

// check returns v in the unit GPUSample wants, or why it is no reading.
func (u unit) check(v float64) (float64, string) {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return 0, "not a finite number"
	}
	if v < 0 {
		return 0, "negative"
	}
	if dcgmBlank(v) {
		return 0, "DCGM's blank (no value)"
	}
	switch u {
	case unitPercent:
		if v > 100*(1+ratioSlack) {
			return 0, "above 100%"
		}
		return min(v, 100), ""
	case unitRatio:
		if v > 1+ratioSlack {
			return 0, "above a ratio of 1"
		}
		return min(v*100, 100), ""
	case unitMiB:
		if v > maxMiB {
			return 0, "beyond any framebuffer"
		}
	case unitWatts:
		if v > maxWatts {
			return 0, "beyond any GPU's power"
		}
	case unitCelsius:
		if v > maxCelsius {
			return 0, "beyond any GPU's temperature"
		}
	case unitXIDNumber:
		if v >= maxXID || v != math.Trunc(v) {
			return 0, "not an XID number"
		}
	case unitMinorNumber:
		if v > math.MaxUint32 || v != math.Trunc(v) {
			return 0, "not a minor number"
		}
	}
	return v, ""
}

// dcgmBlank reports whether v is one of DCGM's blank values (32-bit, 64-bit or
// double): blank, not found, not supported, not permissioned.
func dcgmBlank(v float64) bool {
	for _, blank := range [...]float64{0x7ffffff0, 0x7ffffffffffffff0, 0x800000000000} {
		if v >= blank && v <= blank+3 {
			return true
		}
	}
	return false
}

// LineError is a line of the page the text parser rejected.
type LineError struct {
	Line int    // 1-based line number in the page
	Text string // the line, cut to maxLineShown bytes
	Msg  string // the text parser's reason
}

func (e *LineError) Error() string {
	return fmt.Sprintf("line %d %q: %s", e.Line, e.Text, e.Msg)
}

// deviceKey identifies a device in a page: a GPU by its UUID, a MIG instance by
// its GPU's UUID and its GPU instance id.
type deviceKey struct {
	uuid string
	gi   uint32
	mig  bool
}

// podLabels are a series' pod labels.
type podLabels struct{ namespace, name, container string }

// held reports whether the labels name a pod; labels printed empty, or half empty, do
// not. A series that names no pod is the device's own.
func (l podLabels) held() bool { return l.namespace != "" && l.name != "" }

// podKey names a pod: a device lists a pod once, whatever its containers.
type podKey struct{ namespace, name string }

// seriesReading tells apart the series a device has of one field: dcgm-exporter prints
// a field once per pod holding the device, and once per replica (vgpu) each holds.
type seriesReading struct {
	pod  podLabels
	vgpu string
}

// seriesID is a series of the page, for finding it again.
type seriesID struct {
	key    deviceKey
	field  field
	series seriesReading
}

// device gathers one device's series.
type device struct {
	key      deviceKey
	profile  string
	model    string
	index    uint32
	hasIndex bool
	badIndex bool // a gpu label that is no index was reported
	minor    uint32
	hasMinor bool
	badMinor bool // a minor number that is none was reported
	// pods holds the pods the series name, each with one of its containers; badPods the
	// ones with an invalid namespace, reported once. lastPod skips both maps while the
	// series name the pod the last one did.
	pods     map[podKey]string
	badPods  map[podKey]bool
	lastPod  podLabels
	replicas bool // a series names the replica (vgpu) of the device its pod holds
	// Per field: the reading, and the raw value it was read from, to compare copies with.
	value [fieldCount]float64
	raw   [fieldCount]float64
	has   [fieldCount]bool
	// own: the reading is from a series without pod labels, the device's own, which per-pod
	// series never replace.
	own [fieldCount]bool
	// The first series of each field and how many series there were, to find repeats.
	first  [fieldCount]seriesReading
	series [fieldCount]int
	// The first disagreement between per-pod copies of a field, reported unless the
	// device's own series of the field shows they were per-pod figures.
	disagree [fieldCount]error
}

func (d *device) String() string {
	if d.key.mig {
		return fmt.Sprintf("%s GPU instance %d", d.key.uuid, d.key.gi)
	}
	return d.key.uuid
}

// parser holds one parse.
type parser struct {
	text     expfmt.TextParser
	kept     []byte                   // the lines the text parser reads, each ending with a newline
	lines    []keptLine               // where each kept line is in the page
	series   map[string][]*dto.Metric // the samples parsed, by family in page order
	devices  map[deviceKey]*device
	seen     map[seriesID]bool // the series of fields with several, see repeat
	problems []error
	unlisted int // problems past maxProblems
}

// Parse reads a dcgm-exporter /metrics page (Prometheus text format, with or
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
// problem (*LineError, with its line number in the page) and parsing resumes
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
// The instances take the GPU's index, model and minor number when their series lack them.
//
// Labels: Index from gpu, Model from modelName, MigProfile from GPU_I_PROFILE,
// MigInstanceId from GPU_I_ID. Hostname is not read: the collector names its node. The
// first series of a device that carries a label sets it, taking the families in name
// order and each in page order, so the result does not depend on where bad lines fall.
//
// Minor: the minor number, from DCGM's DCGM_FI_DEV_GPU_MINOR_NUMBER (or its older name
// DCGM_FI_DEV_MINOR_NUMBER), printed only when the exporter's counters CSV lists it, as a
// label on every series ("label" type) or as a series of its own ("gauge"); read like the
// labels above, and absent without it. A value that is no uint32 is a problem and leaves
// Minor absent. A MIG instance's is its GPU's: DCGM reads the field from the parent GPU
// for an instance (DcgmCacheManager::SetPracticalEntityInfo), and an instance without it
// takes its GPU's. The device label ("nvidia0") is not the minor number and is not
// read: dcgm-exporter prints "nvidia" and DCGM's GPU id, the gpu label's number, which
// DCGM assigns in NVML's enumeration order, not the driver's /dev/nvidiaN order.
//
// DeviceId: dcgm-exporter does not give a MIG device's "MIG-…" UUID, yet NodeReport needs
// the devices' ids unique, so a MIG instance's DeviceId is "<GPU UUID>/gi<GPU_I_ID>". It
// keeps the slices of one GPU apart and matches no device plugin id. A whole GPU's
// DeviceId is empty (its UUID).
//
// Pods: namespace, pod and container (pod_namespace, pod_name and container_name, which
// dcgm-exporter's --use-old-namespace prints, when those are absent) name a pod when
// namespace and pod are both non-empty; a pod whose namespace is invalid is a problem and
// is left out. Every pod a device's series name is kept: Pod is the first by namespace and
// name, OtherPods the rest in that order, at most MaxPodsPerGPU in all (the first by
// name; the others are a problem), each once with the first of its containers by name.
// The exporter knows no pod labels, UID or owner, so those stay empty.
//
// Sharing: with --kubernetes-virtual-gpus, dcgm-exporter's PodMapper prints each series
// of a device once per pod holding one of its replicas (the kubelet's "<UUID>::<n>"
// ids, GKE's "/vgpu<n>"), with the replica number in a vgpu label; without it, it names
// only one pod per device, the last the kubelet lists. Shared is set when a device has
// more than one pod, or a vgpu label says it is offered as replicas. The copies of a
// reading printed for each pod are the same device reading: copies that disagree are a
// problem, and the first in page order is kept. Since dcgm-exporter 4.8.2 (its #594,
// per-process metrics for time-sharing and MIG), that mode also prints
// DCGM_FI_DEV_GPU_UTIL and DCGM_FI_DEV_FB_USED once without pod labels, the device's own
// reading, and once per pod with the share of that pod's processes; the reading is then
// the one without pod labels, and the per-pod figures are not read.
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
//   - LastXid, Unhealthy, XidErrors: DCGM_FI_DEV_XID_ERRORS is the number of the last XID
//     error DCGM saw on the device (0 for none), not a count, and a whole number below
//     DCGM's blank. LastXid is that number. When it is not one of the application errors
//     NVIDIA's device plugin ignores (xid.Critical), the device is unhealthy:
//     Unhealthy is "XID <n>". On a MIG instance an XID of the whole GPU (the GPU's own
//     series) counts too, unless the instance's own is critical ("XID <n> on the GPU"):
//     it applies to every instance, as the device plugin applies an event without
//     instance ids to every MIG device of the GPU. One page cannot count XIDs, so
//     XidErrors is 1 when LastXid is non-zero, else 0; it never grows past 1.
//     The number stays: DCGM keeps a field's last sample until a newer one comes (it
//     ages samples out only when it stores one), so the last XID stays on the page, and
//     the device unhealthy, until another XID replaces it or DCGM's host engine (in the
//     exporter, or nv-hostengine) restarts, however long ago it came and whatever was
//     done to the GPU since. NVIDIA's device plugin does not bring a device back to
//     healthy either. The parser is pure and knows no time: it cannot age the XID out.
func Parse(r io.Reader) ([]*gpuscalerv1.GPUSample, []error) {
	var buf bytes.Buffer
	if l, ok := r.(interface{ Len() int }); ok {
		buf.Grow(l.Len() + 1)
	}
	if _, err := buf.ReadFrom(r); err != nil {
		return nil, []error{fmt.Errorf("read the page: %w", err)}
	}
	page := buf.Bytes()
	p := &parser{
		text:    expfmt.NewTextParser(model.UTF8Validation),
		devices: make(map[deviceKey]*device, 16),
		series:  make(map[string][]*dto.Metric, len(fieldsByName)),
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

func (p *parser) problem(err error) {
	if len(p.problems) >= maxProblems {
		p.unlisted++
		return
	}
	p.problems = append(p.problems, err)
}

// keptLine is a line of the page kept for the text parser.
type keptLine struct {
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
func (p *parser) keep(page []byte) {
	for number, start := 1, 0; start < len(page); number++ {
		end := len(page)
		if i := bytes.IndexByte(page[start:], '\n'); i >= 0 {
			end = start + i
		}
		line := bytes.TrimSuffix(page[start:end], []byte{'\r'}) // a CRLF line end
		if _, ok := fieldsByName[string(metricName(line))]; ok {
			p.kept = appendLine(p.kept, line)
			p.kept = append(p.kept, '\n')
			p.lines = append(p.lines, keptLine{number: number, start: start})
		}
		start = end + 1
	}
}

// metricName returns the metric name a sample line starts with, as the text
// format writes it: a name, or a quoted name first inside the braces or before them. It
// returns nil for a comment, a blank line, and a name with escapes (no name it reads
// has any).
func metricName(line []byte) []byte {
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

// labelsRead are the labels the parser reads (family's switch; keep the two in
// step); see Parse.
var labelsRead = map[string]bool{
	"gpu": true, "UUID": true, "modelName": true, "GPU_I_PROFILE": true, "GPU_I_ID": true,
	"namespace": true, "pod": true, "container": true, "vgpu": true,
	"pod_namespace": true, "pod_name": true, "container_name": true,
	minorLabels[0]: true, minorLabels[1]: true,
}

// appendLine appends a sample line to dst without the labels the parser does not
// read. The label pairs it keeps are copied as they are, for the text parser to read and
// judge; a line it cannot follow (a quoted name, a label set it does not understand) is
// appended whole. A fault in a label that is dropped costs nothing.
func appendLine(dst, line []byte) []byte {
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
		for i < len(line) && labelByte(line[i], i > start) {
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
		if labelsRead[string(name)] {
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

// labelByte reports whether b may be in a label name, after its first byte when
// later is true.
func labelByte(b byte, later bool) bool {
	return b == '_' || (b >= 'a' && b <= 'z') || (b >= 'A' && b <= 'Z') || (later && b >= '0' && b <= '9')
}

// parse feeds the kept lines to the text parser in runs that parse; see Parse.
func (p *parser) parse(page []byte) {
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
			start = lineStart(p.kept, pos, pe.Line)
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
		if len(text) > maxLineShown {
			text = text[:maxLineShown]
		}
		p.problem(&LineError{Line: bad.number, Text: string(text), Msg: pe.Msg})
		end := start + bytes.IndexByte(p.kept[start:], '\n') + 1
		if dropBroken(fams, pe.Line, metricName(p.kept[start:end-1])) {
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

// dropBroken makes what the text parser returned with an error at line n the
// samples of lines 1 to n-1, and reports whether it could; if not, those lines must be
// parsed again. Every kept line is one sample of an untyped family, so those lines made
// n-1 samples; the parser may also have added the sample of line n, before finding its
// fault in the value or timestamp, as the last of family name.
func dropBroken(fams map[string]*dto.MetricFamily, n int, name []byte) bool {
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

// lineStart returns the offset of the n-th line (1-based) of page[pos:], or -1.
func lineStart(page []byte, pos, n int) int {
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
func (p *parser) families(fams map[string]*dto.MetricFamily) {
	for name, mf := range fams {
		p.series[name] = append(p.series[name], mf.GetMetric()...)
	}
}

// read takes the gathered samples, family by family in name order, so that which series
// sets a device's labels depends neither on map order nor on where bad lines cut runs.
func (p *parser) read() {
	for _, name := range slices.Sorted(maps.Keys(p.series)) {
		if spec, ok := fieldsByName[name]; ok { // always: only their lines are kept
			p.family(name, spec.field, spec.unit, p.series[name])
		}
	}
}

// deviceLabels are the labels of one series that the parser reads.
type deviceLabels struct {
	gpu, uuid, model, profile, gi, vgpu string
	minor, minorName                    string // a minor number label and its name
	pod, oldPod                         podLabels
}

func (p *parser) family(name string, field field, unit unit, series []*dto.Metric) {
	for _, m := range series {
		var l deviceLabels
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
			case "vgpu":
				l.vgpu = v
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
			case minorLabels[0], minorLabels[1]:
				if l.minor == "" {
					l.minor, l.minorName = v, lp.GetName()
				}
			}
		}
		if l.pod == (podLabels{}) {
			l.pod = l.oldPod
		}
		if l.uuid == "" {
			p.problem(fmt.Errorf("%s series without a UUID label skipped", name))
			continue
		}
		key := deviceKey{uuid: l.uuid}
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
			d = &device{key: key}
			p.devices[key] = d
		}
		p.label(d, &l)
		v, ok := valueOf(m)
		if !ok {
			p.problem(fmt.Errorf("%s of %s: no sample value; skipped", name, d))
			continue
		}
		if field == fieldMinor {
			p.minorSeries(d, name, v, unit)
			continue
		}
		own := !l.pod.held()
		repeated := p.repeat(d, field, seriesReading{pod: l.pod, vgpu: l.vgpu})
		switch {
		case d.has[field] && repeated:
			p.problem(fmt.Errorf("%s of %s: series repeated; the first value kept", name, d))
		case d.has[field] && d.own[field]:
			// The device's own series is read. A series for a pod beside it is that pod's
			// own figure: dcgm-exporter's per-process GPU_UTIL and FB_USED on a shared GPU
			// (see Parse), not the device's.
		case d.has[field] && !own:
			// Another pod's copy of the reading: the same device read once, so the same
			// value, or the page is not what the exporter read.
			if v != d.raw[field] && d.disagree[field] == nil {
				d.disagree[field] = fmt.Errorf("%s of %s: the copies for its pods disagree, %v for pod %s/%s and %v before; the first kept",
					name, d, v, l.pod.namespace, l.pod.name, d.raw[field])
			}
		default: // the first valid series, or the device's own after a pod's copy
			if got, why := unit.check(v); why != "" {
				p.problem(fmt.Errorf("%s of %s: %v is %s; dropped", name, d, v, why))
			} else {
				d.value[field], d.raw[field], d.has[field], d.own[field] = got, v, true, own
			}
		}
	}
}

// repeat notes series s of d's field f and reports whether the page had it before. Most
// fields of most devices have one series; the set is kept only for those with several.
func (p *parser) repeat(d *device, f field, s seriesReading) bool {
	switch d.series[f] {
	case 0:
		d.first[f], d.series[f] = s, 1
		return false
	case 1:
		if s == d.first[f] {
			return true
		}
		if p.seen == nil {
			p.seen = make(map[seriesID]bool)
		}
		p.seen[seriesID{d.key, f, d.first[f]}] = true
	}
	id := seriesID{d.key, f, s}
	if p.seen[id] {
		return true
	}
	p.seen[id] = true
	d.series[f]++
	return false
}

// minorSeries takes a minor number printed as a series, as a label: the first series
// that has one sets it.
func (p *parser) minorSeries(d *device, name string, v float64, unit unit) {
	if d.hasMinor || d.badMinor {
		return
	}
	if got, why := unit.check(v); why != "" {
		d.badMinor = true
		p.problem(fmt.Errorf("%s of %s: %v is %s; no minor number reported", name, d, v, why))
	} else {
		d.minor, d.hasMinor = uint32(got), true
	}
}

// label fills what the device still lacks from one series' labels, and adds its pod.
func (p *parser) label(d *device, l *deviceLabels) {
	if !d.hasIndex && !d.badIndex && l.gpu != "" {
		if i, err := strconv.ParseUint(l.gpu, 10, 32); err == nil {
			d.index, d.hasIndex = uint32(i), true
		} else {
			d.badIndex = true
			p.problem(fmt.Errorf("%s: gpu label %q is not an index", d, l.gpu))
		}
	}
	if !d.hasMinor && !d.badMinor && l.minor != "" {
		if m, err := strconv.ParseUint(l.minor, 10, 32); err == nil {
			d.minor, d.hasMinor = uint32(m), true
		} else {
			d.badMinor = true
			p.problem(fmt.Errorf("%s: %s label %q is not a minor number; none reported", d, l.minorName, l.minor))
		}
	}
	if d.model == "" {
		d.model = l.model
	}
	if d.profile == "" && d.key.mig {
		d.profile = l.profile
	}
	if l.vgpu != "" {
		d.replicas = true
	}
	if l.pod.held() && l.pod != d.lastPod {
		d.lastPod = l.pod
		p.pod(d, l.pod)
	}
}

// pod adds a pod holding the device. Of a pod's containers, the first by name is kept
// (an empty one last), so the result does not depend on the page's order.
func (p *parser) pod(d *device, l podLabels) {
	k := podKey{l.namespace, l.name}
	if c, ok := d.pods[k]; ok {
		if c == "" || (l.container != "" && l.container < c) {
			d.pods[k] = l.container
		}
		return
	}
	if d.badPods[k] {
		return
	}
	if err := gpuscalerv1.ValidateNamespace(l.namespace); err != nil {
		if d.badPods == nil {
			d.badPods = make(map[podKey]bool)
		}
		d.badPods[k] = true
		p.problem(fmt.Errorf("%s: pod %s/%s: %w; not reported", d, l.namespace, l.name, err))
		return
	}
	if d.pods == nil {
		d.pods = make(map[podKey]string, 1)
	}
	d.pods[k] = l.container
}

// valueOf returns a series' sample value: dcgm-exporter types its families gauge or
// counter, and a family without a TYPE line is untyped.
func valueOf(m *dto.Metric) (float64, bool) {
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

// samples turns the devices into GPUSamples; see Parse.
func (p *parser) samples() []*gpuscalerv1.GPUSample {
	devs := make([]*device, 0, len(p.devices))
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
			if gpu := p.devices[deviceKey{uuid: d.key.uuid}]; gpu != nil {
				if !d.hasIndex && gpu.hasIndex {
					d.index, d.hasIndex = gpu.index, true
				}
				if d.model == "" {
					d.model = gpu.model
				}
				if !d.hasMinor && gpu.hasMinor {
					d.minor, d.hasMinor = gpu.minor, true
				}
			}
		}
	}
	devs = slices.DeleteFunc(devs, func(d *device) bool { return !d.key.mig && inMIG[d.key.uuid] })
	slices.SortFunc(devs, func(a, b *device) int {
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
	for _, d := range devs {
		for f, err := range d.disagree {
			if err != nil && !d.own[f] {
				p.problem(err)
			}
		}
	}
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

func (p *parser) sample(d *device) *gpuscalerv1.GPUSample {
	get := func(f field) (float64, bool) { return d.value[f], d.has[f] }
	g := &gpuscalerv1.GPUSample{Uuid: d.key.uuid, Index: d.index, Model: d.model}
	if d.hasMinor {
		g.Minor = proto.Uint32(d.minor)
	}
	p.pods(d, g)
	util := fieldGPUUtil
	if d.key.mig {
		g.MigProfile = d.profile
		g.MigInstanceId = proto.Uint32(d.key.gi)
		g.DeviceId = d.key.uuid + "/gi" + strconv.FormatUint(uint64(d.key.gi), 10)
		util = fieldGREngineActive
	}
	if v, ok := get(util); ok {
		g.GpuUtil = proto.Float64(v)
	}
	if v, ok := get(fieldSMActive); ok {
		g.SmActive = proto.Float64(v)
	}
	if v, ok := get(fieldTensorActive); ok {
		g.TensorActive = proto.Float64(v)
	}
	used, hasUsed := get(fieldFBUsed)
	free, hasFree := get(fieldFBFree)
	reserved, _ := get(fieldFBReserved) // 0 when not printed
	total, hasTotal := get(fieldFBTotal)
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
		g.FbUsedBytes = proto.Uint64(bytesOfMiB(used))
	}
	if hasTotal {
		g.FbTotalBytes = proto.Uint64(bytesOfMiB(total))
	}
	if v, ok := get(fieldPower); ok {
		g.PowerWatts = proto.Float64(v)
	}
	if v, ok := get(fieldTemp); ok {
		g.TemperatureCelsius = proto.Float64(v)
	}
	var own, whole uint32 // the device's last XID, and its GPU's for a MIG instance
	if v, ok := get(fieldXID); ok {
		own = uint32(v)
	}
	if gpu := p.devices[deviceKey{uuid: d.key.uuid}]; d.key.mig && gpu != nil && gpu.has[fieldXID] {
		whole = uint32(gpu.value[fieldXID])
	}
	switch {
	case xid.Critical(uint64(own)):
		g.LastXid, g.Unhealthy = own, fmt.Sprintf("XID %d", own)
	case xid.Critical(uint64(whole)):
		g.LastXid, g.Unhealthy = whole, fmt.Sprintf("XID %d on the GPU", whole)
	case own != 0:
		g.LastXid = own
	default:
		g.LastXid = whole
	}
	if g.LastXid != 0 {
		g.XidErrors = 1
	}
	return g
}

// pods sets the sample's pods, sorted by namespace and name, and Shared.
func (p *parser) pods(d *device, g *gpuscalerv1.GPUSample) {
	g.Shared = len(d.pods) > 1 || d.replicas
	if len(d.pods) == 0 {
		return
	}
	keys := slices.SortedFunc(maps.Keys(d.pods), func(a, b podKey) int {
		return cmp.Or(strings.Compare(a.namespace, b.namespace), strings.Compare(a.name, b.name))
	})
	if len(keys) > gpuscalerv1.MaxPodsPerGPU {
		p.problem(fmt.Errorf("%s: %d pods, more than the %d a sample holds; the last %d by name dropped",
			d, len(keys), gpuscalerv1.MaxPodsPerGPU, len(keys)-gpuscalerv1.MaxPodsPerGPU))
		keys = keys[:gpuscalerv1.MaxPodsPerGPU]
	}
	refs := make([]*gpuscalerv1.PodRef, len(keys))
	for i, k := range keys {
		refs[i] = &gpuscalerv1.PodRef{Namespace: k.namespace, Name: k.name, Container: d.pods[k]}
	}
	g.Pod = refs[0]
	if len(refs) > 1 {
		g.OtherPods = refs[1:]
	}
}

// bytesOfMiB converts MiB, at most 3 × maxMiB, to bytes.
func bytesOfMiB(mib float64) uint64 {
	return uint64(mib * (1 << 20))
}
