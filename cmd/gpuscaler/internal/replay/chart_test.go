package replay

import (
	"bytes"
	"context"
	"encoding/xml"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/gpuscaler/gpuscaler/cmd/gpuscaler/internal/inference"
	"github.com/gpuscaler/gpuscaler/cmd/gpuscaler/internal/traces"
)

// chartAttribution is a real attribution line, with the quotes that must be escaped.
const chartAttribution = `Azure LLM inference trace 2023 (conversation): Azure/AzurePublicDataset, Patel et al., "Splitwise", ISCA 2024, CC BY 4.0`

// handInference is three policies over a minute in six bins of 10 s: always-on holds 100
// replicas, the two others 0 to 3, so a linear replicas axis would crush them.
func handInference() *inference.Result {
	return &inference.Result{Requests: 12, Services: 2, Span: time.Minute, Policies: []inference.PolicyResult{{
		Name: inference.PolicyAlwaysOn, GPUHours: 1.67, Timeline: inference.Timeline{Bin: 10 * time.Second,
			Replicas: []float64{100, 100, 100, 100, 100, 100}, Backlog: []int{0, 1, 0, 0, 2, 0}, Wait: []float64{0, 0, 0, 0, 0, 0}},
	}, {
		Name: inference.PolicyKEDAPoll, Setting: "queueTarget=1", GPUHours: 0.02, WaitP99: 61, Timeline: inference.Timeline{Bin: 10 * time.Second,
			Replicas: []float64{0, 1, 2, 3, 0.5, 0}, Backlog: []int{3, 4, 2, 0, 7, 0}, Wait: []float64{61, 30, 0, 0, 45, 0}},
	}, {
		Name: inference.PolicyRecommends, Setting: "targetWait=30s", GPUHours: 0.02, WaitP99: 44.5, Timeline: inference.Timeline{Bin: 10 * time.Second,
			Replicas: []float64{0, 2, 2, 1, 1, 0}, Backlog: []int{3, 2, 1, 0, 6, 0}, Wait: []float64{44.5, 12, 0, 0, 20, 0}},
	}}}
}

// TestInferenceChartModel checks what a reader sees in the hand-made chart: each policy
// in the legend, with its setting and figures, and as a series of the same colour in
// every panel holding its timeline's values; axes that cover the data.
func TestInferenceChartModel(t *testing.T) {
	res := handInference()
	c, err := buildInferenceChart("hand", chartAttribution, res)
	if err != nil {
		t.Fatal(err)
	}
	wantNames := []string{"always-on", "keda-poll-backlog (queueTarget=1)", "gpuscaler (targetWait=30s)"}
	checkChartPolicies(t, c, wantNames)
	if e := c.legend[1]; e.note != "0.02 GPU-h, wait p99 61 s" {
		t.Errorf("legend of %s says %q, want its GPU-hours and p99 wait", e.name, e.note)
	}
	if len(c.panels) != 3 {
		t.Fatalf("%d panels, want replicas, backlog and waits", len(c.panels))
	}
	for i, p := range res.Policies {
		tl := p.Timeline
		for k, want := range map[int][]float64{0: tl.Replicas, 1: ints(tl.Backlog), 2: tl.Wait} {
			sr := c.panels[k].series[i]
			var got []float64
			for j, s := range sr.steps {
				got = append(got, s.v)
				if s.from != float64(10*j) || s.to != float64(10*j+10) {
					t.Errorf("panel %q, %s: bin %d spans %v to %v s, want %d to %d", c.panels[k].title, sr.name, j, s.from, s.to, 10*j, 10*j+10)
				}
			}
			if !slices.Equal(got, want) {
				t.Errorf("panel %q, %s: values %v, want the timeline's %v", c.panels[k].title, sr.name, got, want)
			}
		}
	}
	checkAxesCover(t, c)
	replicas, backlog, waits := c.panels[0], c.panels[1], c.panels[2]
	if !replicas.log || replicas.axis.Max != 100 {
		t.Errorf("replicas axis: log %v to %v; want a log axis to 100, always-on's 100 beside the others' 0 to 3", replicas.log, replicas.axis.Max)
	}
	if backlog.log || backlog.axis.Max != 8 || waits.log || waits.axis.Max != 80 {
		t.Errorf("backlog axis log %v to %v, waits log %v to %v: want linear axes to 8 and to 80 s", backlog.log, backlog.axis.Max, waits.log, waits.axis.Max)
	}
	if !strings.Contains(replicas.title, "2 services") || !strings.Contains(replicas.fullNote(), "log scale") {
		t.Errorf("replicas panel %q / %q: want it to say it sums 2 services and is on a log scale", replicas.title, replicas.fullNote())
	}
	if tm := c.time; tm.from != 0 || tm.to != 60 || tm.unit.name != unitSeconds.name || tm.ticks[0] != 0 || tm.ticks[len(tm.ticks)-1] != 60 {
		t.Errorf("time axis %+v: want 0 to 60 s, ticked from 0 to 60", tm)
	}
}

// TestInferenceChartDrawn renders the hand-made chart: well-formed SVG with no script, a
// path per series, the title and attribution as given (escaped in the file), every
// policy and a tick for each axis' end in the text.
func TestInferenceChartDrawn(t *testing.T) {
	const title = `<script>alert("x")</script> & co`
	var out bytes.Buffer
	if err := WriteInferenceChart(&out, title, chartAttribution, handInference()); err != nil {
		t.Fatal(err)
	}
	texts, elems := svgContent(t, out.Bytes())
	if elems["path"] != 9 || elems["script"] != 0 {
		t.Errorf("%d paths and %d scripts, want 9 (3 policies × 3 panels) and none", elems["path"], elems["script"])
	}
	if strings.Contains(out.String(), "<script") || !strings.Contains(out.String(), "&lt;script&gt;") {
		t.Error("the title's markup is not escaped in the SVG")
	}
	joined := strings.Join(texts, "\n")
	for _, want := range []string{title, "Data: " + chartAttribution, "always-on", "keda-poll-backlog (queueTarget=1)", "gpuscaler (targetWait=30s)", "100", "8", "80 s", "60 s"} {
		if !slices.Contains(texts, want) {
			t.Errorf("chart's text lacks %q; it has:\n%s", want, joined)
		}
	}
}

// TestInferenceChartRealReplay draws the first 300 requests of the Azure LLM trace
// replayed under every policy: every policy in the legend and each panel, axes covering
// the data, well-formed SVG, and a legend and titles that fit their room.
func TestInferenceChartRealReplay(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(tracesDir, "azure-llm-2023-conv.csv"))
	if err != nil {
		t.Fatalf("the Azure LLM trace is part of the shared test data: %v", err)
	}
	reqs, err := traces.ReadAzureLLM(bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	sc, err := AzureLLM(reqs[:300], DefaultLLMServiceModel, 1, chartLoadLatency(t), 1)
	if err != nil {
		t.Fatal(err)
	}
	sc.Config.WarmUp = 0 // 300 requests are a minute: measure them all
	res, err := inference.Run(context.Background(), sc.Services, sc.Config, sc.Policies, nil, sc.Tail, nil)
	if err != nil {
		t.Fatal(err)
	}
	c, err := buildInferenceChart("azure-llm: 300 requests to 1 service", chartAttribution, res)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, p := range sc.Policies {
		if p.Setting == "" {
			names = append(names, p.Name)
		} else {
			names = append(names, p.Name+" ("+p.Setting+")")
		}
	}
	checkChartPolicies(t, c, names)
	checkAxesCover(t, c)
	checkFits(t, c)
	if c.time.unit.name != unitMinutes.name || c.time.to != res.Span.Seconds() {
		t.Errorf("time axis in %q to %v s, want minutes to the span's %v s", c.time.unit.name, c.time.to, res.Span.Seconds())
	}
	// The replay is real: some policy held replicas and some request waited.
	if c.panels[0].axis.Max < 1 || c.panels[2].axis.Max <= 0 {
		t.Errorf("replicas axis to %v, waits to %v: want the replay's replicas and waits", c.panels[0].axis.Max, c.panels[2].axis.Max)
	}
	var out bytes.Buffer
	if err := WriteInferenceChart(&out, "azure-llm", chartAttribution, res); err != nil {
		t.Fatal(err)
	}
	if _, elems := svgContent(t, out.Bytes()); elems["path"] != 3*len(res.Policies) {
		t.Errorf("%d paths, want %d: one per policy and panel", elems["path"], 3*len(res.Policies))
	}
}

// TestOpenBChartHand draws the openb hand case (openb_test.go): A runs from 0 to 100 s,
// the plain ScaledJob's Pod for B is Pending from 30 s to 100 s, capacityAware creates
// none until 120 s; the span is 170 s.
func TestOpenBChartHand(t *testing.T) {
	res, _ := replayHand(t, false)
	c, err := buildOpenBChart("openb hand case", chartAttribution, res)
	if err != nil {
		t.Fatal(err)
	}
	checkChartPolicies(t, c, []string{"gpuscaler-backlog (plain ScaledJob)", "gpuscaler (capacityAware)"})
	checkAxesCover(t, c)
	if !c.legend[0].dash || c.legend[1].dash {
		t.Errorf("legend dashes %v, %v: want the plain ScaledJob dashed, capacityAware solid", c.legend[0].dash, c.legend[1].dash)
	}
	if c.time.from != 0 || c.time.to != 170 {
		t.Errorf("time axis from %v to %v s, want 0 to 170", c.time.from, c.time.to)
	}
	at := func(sr replaySeries, t float64) float64 {
		for _, s := range sr.steps {
			if s.from <= t && t < s.to {
				return s.v
			}
		}
		return -1
	}
	pending := c.panels[2]
	if !strings.Contains(pending.title, "Pending") {
		t.Fatalf("third panel %q, want Pods Pending", pending.title)
	}
	plain, aware := pending.series[0], pending.series[1]
	for _, tc := range []struct{ t, plain, aware float64 }{{10, 0, 0}, {50, 1, 0}, {99, 1, 0}, {110, 0, 0}, {169, 0, 0}} {
		if p, a := at(plain, tc.t), at(aware, tc.t); p != tc.plain || a != tc.aware {
			t.Errorf("Pending at %v s: plain %v, capacityAware %v; want %v and %v", tc.t, p, a, tc.plain, tc.aware)
		}
	}
	if !plain.dash || aware.dash || pending.axis.Max != 1 {
		t.Errorf("Pending: plain dashed %v, capacityAware dashed %v, axis to %v; want dashed, solid, to 1", plain.dash, aware.dash, pending.axis.Max)
	}
	if running := c.panels[1].series[0]; at(running, 40) != 2 || at(running, 55) != 1 {
		t.Errorf("Jobs running under the plain ScaledJob: %v at 40 s, %v at 55 s; want 2 (A and C), then 1 (A)", at(running, 40), at(running, 55))
	}
	checkFits(t, c)

	var out bytes.Buffer
	if err := WriteOpenBChart(&out, "openb <hand>", chartAttribution, res); err != nil {
		t.Fatal(err)
	}
	texts, elems := svgContent(t, out.Bytes())
	if elems["path"] != 6 || !slices.Contains(texts, "openb <hand>") || strings.Contains(out.String(), "<hand>") {
		t.Errorf("%d paths, title escaped: %v: want 6 paths and the title escaped", elems["path"], !strings.Contains(out.String(), "<hand>"))
	}
	if n := strings.Count(out.String(), `stroke-dasharray`); n != 3+1 {
		t.Errorf("%d dashed strokes, want 4: the plain ScaledJob's line in each panel and in the legend", n)
	}
}

// TestOpenBChartLaterStart: the timeline counts from the trace's start, the span from
// the first task, so a replay whose first task comes at 2 days spans 2 to 2 days + span.
func TestOpenBChartLaterStart(t *testing.T) {
	day := 24 * time.Hour
	res := &OpenBResult{Span: 5 * day, Policies: []OpenBPolicy{
		{Name: inference.PolicyBacklog, PendingJobsMax: 3, Timeline: []OpenBPoint{{At: 2 * day, Waiting: 1}, {At: 3 * day, Waiting: 4, Running: 2, Pending: 3}, {At: 6 * day}}},
		{Name: inference.PolicyRecommends, CapacityAware: true, Timeline: []OpenBPoint{{At: 2 * day, Waiting: 1}, {At: 3 * day, Waiting: 4, Running: 2}, {At: 6 * day}}},
	}}
	c, err := buildOpenBChart("later", chartAttribution, res)
	if err != nil {
		t.Fatal(err)
	}
	if tm := c.time; tm.from != 2*86400 || tm.to != 7*86400 || tm.unit.name != unitDays.name || tm.ticks[0] != 2*86400 {
		t.Errorf("time axis %+v: want days 2 to 7, ticked from day 2", tm)
	}
	if s := c.panels[0].series[0].steps; len(s) != 3 || s[2].from != 6*86400 || s[2].to != 7*86400 {
		t.Errorf("waiting steps %+v: want the last point held to the span's end", s)
	}
	checkAxesCover(t, c)
	if c.panels[2].axis.Max != 3 {
		t.Errorf("Pending axis to %v, want 3", c.panels[2].axis.Max)
	}
}

// TestChartSameCourse: a policy whose lines lie under another's says so in the legend.
func TestChartSameCourse(t *testing.T) {
	res := handInference()
	res.Policies[1].Timeline = res.Policies[2].Timeline
	c, err := buildInferenceChart("same", chartAttribution, res)
	if err != nil {
		t.Fatal(err)
	}
	if got := c.legend[1].also; got != "hidden under gpuscaler: same course" {
		t.Errorf("legend of keda-poll-backlog says %q, want that it is hidden under gpuscaler", got)
	}
	if c.legend[0].also != "" || c.legend[2].also != "" {
		t.Errorf("legend notes %q, %q: want none for policies of their own course", c.legend[0].also, c.legend[2].also)
	}
	// A dashed plain ScaledJob over a solid capacityAware one is not hidden.
	o := &OpenBResult{Span: time.Hour, Policies: []OpenBPolicy{
		{Name: inference.PolicyBacklog, Timeline: []OpenBPoint{{At: 0, Waiting: 1}}},
		{Name: inference.PolicyRecommends, CapacityAware: true, Timeline: []OpenBPoint{{At: 0, Waiting: 1}}},
	}}
	oc, err := buildOpenBChart("same", chartAttribution, o)
	if err != nil {
		t.Fatal(err)
	}
	if got := oc.legend[0].also; got != "the same course as gpuscaler" {
		t.Errorf("openb legend says %q, want the same course, not hidden", got)
	}
}

func TestChartErrors(t *testing.T) {
	broken := handInference()
	broken.Policies[2].Timeline.Wait = broken.Policies[2].Timeline.Wait[:3]
	for name, tc := range map[string]struct {
		attribution string
		res         *inference.Result
		want        string
	}{
		"no attribution":     {"  ", handInference(), "CC BY 4.0"},
		"no result":          {chartAttribution, nil, "no policies"},
		"no policies":        {chartAttribution, &inference.Result{Span: time.Minute}, "no policies"},
		"no span":            {chartAttribution, &inference.Result{Policies: handInference().Policies}, "span 0s"},
		"timelines disagree": {chartAttribution, broken, "policy gpuscaler: timeline of 6 replicas, 6 backlogs and 3 waits"},
	} {
		t.Run(name, func(t *testing.T) {
			err := WriteInferenceChart(io.Discard, "t", tc.attribution, tc.res)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want one saying %q", err, tc.want)
			}
		})
	}
	if err := WriteOpenBChart(io.Discard, "t", chartAttribution, &OpenBResult{Span: time.Hour, Policies: []OpenBPolicy{{Name: "x"}}}); err == nil || !strings.Contains(err.Error(), "policy x: an empty timeline") {
		t.Errorf("openb with an empty timeline: error %v, want one naming the policy", err)
	}
	if err := WriteOpenBChart(io.Discard, "t", "", &OpenBResult{}); err == nil {
		t.Error("openb without attribution: no error")
	}
}

// TestTimeAxis: days over 3 days, hours over 3 hours, minutes over 3 minutes, at most
// ten intervals of a round step, every tick within the span.
func TestTimeAxis(t *testing.T) {
	for _, tc := range []struct {
		from, to  float64
		unit      timeUnit
		firstTick float64
		step      float64 // seconds
	}{
		{0, 45, unitSeconds, 0, 5},
		{0, 180, unitSeconds, 0, 20},
		{0, 4401.7, unitMinutes, 0, 600},
		{0, 296*3600 + 129, unitDays, 0, 2 * 86400},
		{0, 5 * 3600, unitHours, 0, 3600},
		{0, 26 * 3600, unitHours, 0, 3 * 3600},
		{0, 3612.5 * 3600, unitDays, 0, 20 * 86400},
		{100, 270, unitSeconds, 100, 20},
		{1.5 * 86400, 5 * 86400, unitDays, 2 * 86400, 86400},
	} {
		a := newTimeAxis(tc.from, tc.to, "since")
		if a.unit.name != tc.unit.name || len(a.ticks) < 2 || a.ticks[0] != tc.firstTick || a.ticks[1]-a.ticks[0] != tc.step {
			t.Errorf("newTimeAxis(%v, %v): unit %q, ticks %v; want %q ticks from %v by %v", tc.from, tc.to, a.unit.name, a.ticks, tc.unit.name, tc.firstTick, tc.step)
			continue
		}
		if last := a.ticks[len(a.ticks)-1]; last > tc.to || len(a.ticks) > maxTimeTicks+1 {
			t.Errorf("newTimeAxis(%v, %v): %d ticks up to %v, want at most %d within the span", tc.from, tc.to, len(a.ticks), last, maxTimeTicks+1)
		}
	}
	if got := newTimeAxis(0, 30*3600, "").tickLabel(12 * 3600); got != "12 h" {
		t.Errorf("tick label at 12 h = %q", got)
	}
}

func TestColorsFor(t *testing.T) {
	got := colorsFor([]string{inference.PolicyRecommends, "mine", inference.PolicyRecommends, inference.PolicyAlwaysOn})
	want := []string{policyColors[inference.PolicyRecommends], extraColors[0], extraColors[1], policyColors[inference.PolicyAlwaysOn]}
	if !slices.Equal(got, want) {
		t.Errorf("colorsFor = %v, want %v: a policy's own colour, then unused extra ones", got, want)
	}
}

func TestFmtCount(t *testing.T) {
	for v, want := range map[float64]string{0: "0", 4.44: "4.4", 10: "10", 999.6: "1,000", 32267.9: "32,268", 1234567: "1,234,567", -12345: "-12,345"} {
		if got := fmtCount(v); got != want {
			t.Errorf("fmtCount(%v) = %q, want %q", v, got, want)
		}
	}
}

// checkChartPolicies checks that the legend names the policies in order, each with a
// colour of its own, and that every panel has a series per policy in the legend's colour
// and dash.
func checkChartPolicies(t *testing.T, c replayChart, names []string) {
	t.Helper()
	var got, colors []string
	for _, e := range c.legend {
		got = append(got, e.name)
		colors = append(colors, e.color)
	}
	if !slices.Equal(got, names) {
		t.Errorf("legend %q, want %q", got, names)
	}
	if len(slices.Compact(slices.Sorted(slices.Values(colors)))) != len(colors) {
		t.Errorf("legend colours %v: want one of its own per policy", colors)
	}
	for _, p := range c.panels {
		if len(p.series) != len(c.legend) {
			t.Errorf("panel %q draws %d series, want %d, one per policy", p.title, len(p.series), len(c.legend))
			continue
		}
		for i, sr := range p.series {
			if e := c.legend[i]; sr.name != e.name || sr.color != e.color || sr.dash != e.dash || len(sr.steps) == 0 {
				t.Errorf("panel %q, series %d: %q in %s (dashed %v, %d steps), want %q in %s (dashed %v) as in the legend", p.title, i, sr.name, sr.color, sr.dash, len(sr.steps), e.name, e.color, e.dash)
			}
		}
	}
}

// checkAxesCover checks every panel's value axis reaches its data's most, without
// wasting more than half its height, and that the time axis holds every step.
func checkAxesCover(t *testing.T, c replayChart) {
	t.Helper()
	for _, p := range c.panels {
		peak := 0.0
		for _, sr := range p.series {
			peak = max(peak, sr.peak())
			for _, s := range sr.steps {
				if s.from < c.time.from || s.to > c.time.to || s.to <= s.from {
					t.Errorf("panel %q, %s: step from %v to %v s, outside the time axis %v to %v", p.title, sr.name, s.from, s.to, c.time.from, c.time.to)
				}
			}
		}
		if p.axis.Max < peak || (peak >= 1 && p.axis.Max > 2.5*peak) {
			t.Errorf("panel %q: axis to %v for data up to %v", p.title, p.axis.Max, peak)
		}
		if p.scale(peak) > 1 || p.scale(0) != 0 {
			t.Errorf("panel %q: the peak drawn at %v of the height, 0 at %v", p.title, p.scale(peak), p.scale(0))
		}
	}
}

// checkFits checks, by an estimate of the font's widths (Helvetica's lower case averages
// about half an em; the charts drawn by rsvg-convert measure 0.47), that the legend's lines
// fit beside the plot and the titles and notes above it.
func checkFits(t *testing.T, c replayChart) {
	t.Helper()
	width := func(s string, size float64) float64 { return 0.52 * size * float64(utf8.RuneCountInString(s)) }
	const legendRoom = chartRight - 16 - 28
	for _, e := range c.legend {
		if w := max(width(e.name, 12), width(e.note, 11), width(e.also, 11)); w > legendRoom {
			t.Errorf("legend entry %q / %q / %q is about %.0f px wide, more than the %v px beside the plot", e.name, e.note, e.also, w, legendRoom)
		}
	}
	const plotW = chartWidth - chartLeft - chartRight
	for _, p := range c.panels {
		if w := max(width(p.title, 12), width(p.fullNote(), 11)); w > plotW {
			t.Errorf("panel %q / %q is about %.0f px wide, more than the plot's %v", p.title, p.fullNote(), w, plotW)
		}
	}
	if w := max(width(c.title, 15), width(c.attribution, 11)); w > chartWidth-chartLeft {
		t.Errorf("title %q / %q about %.0f px wide, more than the chart's %v", c.title, c.attribution, w, chartWidth-chartLeft)
	}
}

// svgContent walks an SVG to its end, failing unless it is well-formed XML with an svg
// root, and returns the content of its text elements and a count of elements by name.
func svgContent(t *testing.T, data []byte) ([]string, map[string]int) {
	t.Helper()
	dec := xml.NewDecoder(bytes.NewReader(data))
	var texts []string
	elems := map[string]int{}
	in := false
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("chart is not well-formed XML: %v", err)
		}
		switch tok := tok.(type) {
		case xml.StartElement:
			if len(elems) == 0 && tok.Name.Local != "svg" {
				t.Fatalf("chart's root is %q, want svg", tok.Name.Local)
			}
			elems[tok.Name.Local]++
			in = tok.Name.Local == "text"
		case xml.CharData:
			if in {
				texts = append(texts, string(tok))
			}
		case xml.EndElement:
			in = false
		}
	}
	return texts, elems
}

// chartLoadLatency is GenTD26's measured model loads.
func chartLoadLatency(t *testing.T) *traces.Durations {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(tracesDir, "gentd26-basemodel-load-latency-ms.csv"))
	if err != nil {
		t.Fatalf("the load latencies are part of the shared test data: %v", err)
	}
	ls, err := traces.ReadLoadLatency(bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	d, err := traces.NewDurations(ls)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func ints(v []int) []float64 {
	out := make([]float64, len(v))
	for i, x := range v {
		out[i] = float64(x)
	}
	return out
}

// TestInferenceChartShadesWhatIsNotMeasured: a trace cut from a running service has its
// warm-up and what follows its last arrival shaded in every panel, and the replicas
// panel says why; a replay measured whole has nothing shaded.
func TestInferenceChartShadesWhatIsNotMeasured(t *testing.T) {
	res := handInference()
	res.WarmUp, res.CutEnd, res.LastArrival = 10*time.Second, true, 40*time.Second
	c, err := buildInferenceChart("cut", chartAttribution, res)
	if err != nil {
		t.Fatal(err)
	}
	if want := []interval{{0, 10}, {40, 60}}; !slices.Equal(c.unmeasured, want) {
		t.Errorf("shaded %v, want %v: the warm-up and after the last arrival", c.unmeasured, want)
	}
	if !strings.Contains(c.panels[0].note, "shaded: not counted") {
		t.Errorf("replicas panel's note %q does not say what is shaded", c.panels[0].note)
	}
	checkFits(t, c)
	var out bytes.Buffer
	if err := c.render(&out); err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(out.String(), `fill="`+unmeasuredFill+`"`); n != 2*len(c.panels) {
		t.Errorf("%d shaded rectangles, want %d: two in each of %d panels", n, 2*len(c.panels), len(c.panels))
	}

	whole, err := buildInferenceChart("whole", chartAttribution, handInference())
	if err != nil {
		t.Fatal(err)
	}
	if len(whole.unmeasured) != 0 || strings.Contains(whole.panels[0].note, "shaded") {
		t.Errorf("a replay measured whole shades %v (note %q), want nothing", whole.unmeasured, whole.panels[0].note)
	}
}
