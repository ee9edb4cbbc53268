package replay

import (
	"bufio"
	"cmp"
	"errors"
	"fmt"
	"html"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/gpuscaler/gpuscaler/cmd/gpuscaler/internal/inference"
	"github.com/gpuscaler/gpuscaler/cmd/gpuscaler/internal/kedarules"
	"github.com/gpuscaler/gpuscaler/cmd/gpuscaler/internal/svgchart"
)

// WriteInferenceChart draws res as an SVG: three panels over one time axis, the replay's
// span — the replicas held (summed over the services), the backlog (items queued) and the
// longest wait of a request arriving at each time — with every policy of res.Policies a
// series of its own, in the same colour in every panel, and one legend giving each
// policy's GPU-hours and p99 wait. title heads the chart; attribution, the trace's
// source and licence, is drawn under it after "Data: " and must not be empty: the
// traces are published under CC BY 4.0, which asks for it wherever results are shown.
func WriteInferenceChart(w io.Writer, title, attribution string, res *inference.Result) error {
	c, err := buildInferenceChart(title, attribution, res)
	if err != nil {
		return err
	}
	return c.render(w)
}

// WriteOpenBChart draws the openb result as an SVG, as WriteInferenceChart does: items
// waiting on the queues, Jobs running and Pods Pending over the replay's span, one series
// per policy (a plain ScaledJob dashed, capacityAware solid), one legend giving each
// policy's p99 wait and most Pods Pending.
func WriteOpenBChart(w io.Writer, title, attribution string, res *OpenBResult) error {
	c, err := buildOpenBChart(title, attribution, res)
	if err != nil {
		return err
	}
	return c.render(w)
}

// replayChart is what a Write…Chart function draws, worked out before any of it is
// drawn, so tests can check what a reader will see (the legend, each panel's series and
// axis) without parsing SVG.
type replayChart struct {
	title, attribution string
	time               timeAxis
	legend             []legendEntry
	panels             []replayPanel
	// unmeasured are shaded in every panel: replayed, but outside what the results
	// count (a cut trace's warm-up, and what follows its last arrival).
	unmeasured []interval
}

// interval is a stretch of the time axis, from and to in seconds.
type interval struct{ from, to float64 }

// timeAxis is the horizontal axis: from and to in seconds, labelled in unit at ticks.
type timeAxis struct {
	from, to float64
	unit     timeUnit
	ticks    []float64 // seconds, within [from, to]
	label    string    // what the time counts from
}

// timeUnit is the unit the time axis is labelled in, and the round steps its ticks take.
type timeUnit struct {
	name    string // after each tick's number: "d", "h", "min", "s"
	seconds float64
	steps   []float64 // in the unit, ascending; beyond them, svgchart.NiceCeil
}

var (
	unitDays    = timeUnit{"d", 86400, []float64{1, 2, 5, 7, 10, 14, 20, 30}}
	unitHours   = timeUnit{"h", 3600, []float64{1, 2, 3, 6, 12, 24}}
	unitMinutes = timeUnit{"min", 60, []float64{1, 2, 5, 10, 15, 20, 30, 60}}
	unitSeconds = timeUnit{"s", 1, []float64{1, 2, 5, 10, 15, 20, 30, 60}}
)

// maxTimeTicks bounds the intervals between the time axis' ticks.
const maxTimeTicks = 10

// newTimeAxis labels [from, to] (seconds) in days for a span over 3 days, hours over 3
// hours, minutes over 3 minutes, else seconds, with a tick at every multiple of the
// smallest round step that makes at most maxTimeTicks intervals.
func newTimeAxis(from, to float64, label string) timeAxis {
	if to <= from {
		to = from + 1
	}
	span := to - from
	unit := unitSeconds
	switch {
	case span > 3*86400:
		unit = unitDays
	case span > 3*3600:
		unit = unitHours
	case span > 3*60:
		unit = unitMinutes
	}
	want := span / unit.seconds / maxTimeTicks
	step := svgchart.NiceCeil(want)
	for _, s := range unit.steps {
		if s >= want {
			step = s
			break
		}
	}
	a := timeAxis{from: from, to: to, unit: unit, label: label}
	stepS := step * unit.seconds
	for k := math.Ceil(from/stepS - 1e-9); k*stepS <= to+1e-9*stepS; k++ {
		a.ticks = append(a.ticks, k*stepS)
	}
	return a
}

// tickLabel is a tick's number in the axis' unit.
func (a timeAxis) tickLabel(t float64) string {
	return kedarules.FmtNum(math.Round(t/a.unit.seconds*10)/10) + " " + a.unit.name
}

// legendEntry is one policy in the legend.
type legendEntry struct {
	policy string // as the output names it
	name   string // the policy with its setting, or its kind
	note   string // its figures, on a second line
	also   string // a third line, when its course is another's
	color  string
	dash   bool
}

// replayPanel is one of a chart's panels: a value axis and a series per policy.
type replayPanel struct {
	title string
	note  string // a second line under the title, saying how to read the panel
	axis  svgchart.Axis
	// log draws the values at log10(1+v): 0 at the bottom, then 1, 10 and 100 nearly
	// evenly apart, so that series of 1 and of 100 both read (see fitAxis). axis.Step is
	// then unused.
	log  bool
	unit string // after each of the value axis' numbers
	// series are one per policy, in the legend's order and colours; the solid ones are
	// drawn first, in order, each over those before it, then the dashed ones.
	series []replaySeries
}

// replaySeries is one policy's values in a panel, as steps: the value holds over each
// step's interval.
type replaySeries struct {
	name  string // as in the legend
	color string
	dash  bool
	steps []step
}

// step is a value held from from to to (seconds).
type step struct{ from, to, v float64 }

// typical returns the series' median over the time it is above 0 (its level when
// active), and false if it never is.
func (sr replaySeries) typical() (float64, bool) {
	var active []step
	total := 0.0
	for _, s := range sr.steps {
		if s.v > 0 && s.to > s.from {
			active = append(active, s)
			total += s.to - s.from
		}
	}
	if len(active) == 0 {
		return 0, false
	}
	slices.SortStableFunc(active, func(a, b step) int { return cmp.Compare(a.v, b.v) })
	seen := 0.0
	for _, s := range active {
		if seen += s.to - s.from; seen >= total/2 {
			return s.v, true
		}
	}
	return active[len(active)-1].v, true
}

func (sr replaySeries) peak() float64 {
	p := 0.0
	for _, s := range sr.steps {
		p = max(p, s.v)
	}
	return p
}

// policyColors gives each policy the colour it has in every chart; a name not here, or
// one seen twice, takes the next of extraColors.
var policyColors = map[string]string{
	inference.PolicyAlwaysOn:   "#8c8c8c",
	inference.PolicySeeds:      "#9467bd",
	inference.PolicyKEDAPoll:   "#ff7f0e",
	inference.PolicyBacklog:    "#1f77b4",
	inference.PolicyRecommends: "#2ca02c",
}

var extraColors = []string{"#d62728", "#8c564b", "#e377c2", "#17becf", "#bcbd22", "#393b79"}

// colorsFor returns a colour per name, in order: a policy's own colour the first time its
// name appears, else the next unused extra one.
func colorsFor(names []string) []string {
	used := map[string]bool{}
	out := make([]string, len(names))
	next := 0
	for i, n := range names {
		if c, ok := policyColors[n]; ok && !used[c] {
			out[i] = c
		} else {
			for next < len(extraColors) && used[extraColors[next]] {
				next++
			}
			out[i] = extraColors[next%len(extraColors)]
			next++
		}
		used[out[i]] = true
	}
	return out
}

func checkHeader(attribution string) error {
	if strings.TrimSpace(attribution) == "" {
		return errors.New("chart: no attribution: the traces are published under CC BY 4.0, which asks for it wherever results are shown")
	}
	return nil
}

// dataLine is the attribution as the chart prints it.
func dataLine(attribution string) string {
	if strings.HasPrefix(attribution, "Data:") {
		return attribution
	}
	return "Data: " + attribution
}

func buildInferenceChart(title, attribution string, res *inference.Result) (replayChart, error) {
	if err := checkHeader(attribution); err != nil {
		return replayChart{}, err
	}
	switch {
	case res == nil || len(res.Policies) == 0:
		return replayChart{}, errors.New("chart: no policies to draw")
	case res.Span <= 0:
		return replayChart{}, fmt.Errorf("chart: span %s: want a replay that lasted", res.Span)
	}
	names := make([]string, len(res.Policies))
	for i, p := range res.Policies {
		tl := p.Timeline
		if tl.Bin <= 0 || len(tl.Replicas) == 0 || len(tl.Backlog) != len(tl.Replicas) || len(tl.Wait) != len(tl.Replicas) {
			return replayChart{}, fmt.Errorf("chart: policy %s: timeline of %d replicas, %d backlogs and %d waits in bins of %s: want as many of each, in bins above 0",
				p.Name, len(tl.Replicas), len(tl.Backlog), len(tl.Wait), tl.Bin)
		}
		names[i] = p.Name
	}
	colors := colorsFor(names)
	span := res.Span.Seconds()
	c := replayChart{title: title, attribution: dataLine(attribution), time: newTimeAxis(0, span, "time since the first request")}
	bin := res.Policies[0].Timeline.Bin
	services := "the service"
	if res.Services != 1 {
		services = "the " + strconv.Itoa(res.Services) + " services"
	}
	replicas := replayPanel{title: "replicas held, summed over " + services,
		note: "each bin's average: loading and serving replicas, each holding its GPUs"}
	backlog := replayPanel{title: "backlog: requests queued, not yet served, summed over " + services,
		note: "the most in each bin of " + fmtBin(bin)}
	waits := replayPanel{title: "longest wait of a request arriving in each bin of " + fmtBin(bin), unit: " s",
		note: "from arrival to the start of its service, model loads included; 0 where none arrived"}
	// A trace cut from a running service counts neither its warm-up nor, in GPU-hours,
	// what follows its last arrival (Inference.WarmUp, CutEnd): shaded, so the areas
	// under the replicas read as the legend's GPU-hours.
	if res.WarmUp > 0 {
		c.unmeasured = append(c.unmeasured, interval{0, min(res.WarmUp.Seconds(), span)})
	}
	if res.CutEnd && res.LastArrival.Seconds() < span {
		c.unmeasured = append(c.unmeasured, interval{res.LastArrival.Seconds(), span})
	}
	if len(c.unmeasured) > 0 {
		replicas.note += "; shaded: not counted (the trace is a cut)"
	}
	for i, p := range res.Policies {
		name := p.Name
		if p.Setting != "" {
			name += " (" + p.Setting + ")"
		}
		c.legend = append(c.legend, legendEntry{policy: p.Name, name: name, color: colors[i],
			note: fmt.Sprintf("%s GPU-h, wait p99 %s", fmtGPUHours(p.GPUHours), fmtSeconds(p.WaitP99))})
		tl := p.Timeline
		binned := func(v func(int) float64) replaySeries {
			sr := replaySeries{name: name, color: colors[i]}
			for k := range tl.Replicas {
				from := (time.Duration(k) * tl.Bin).Seconds()
				if from >= span {
					break
				}
				sr.steps = append(sr.steps, step{from: from, to: min(from+tl.Bin.Seconds(), span), v: v(k)})
			}
			return sr
		}
		replicas.series = append(replicas.series, binned(func(k int) float64 { return tl.Replicas[k] }))
		backlog.series = append(backlog.series, binned(func(k int) float64 { return float64(tl.Backlog[k]) }))
		waits.series = append(waits.series, binned(func(k int) float64 { return tl.Wait[k] }))
	}
	c.noteSame(func(i, j int) bool {
		a, b := res.Policies[i].Timeline, res.Policies[j].Timeline
		return slices.Equal(a.Replicas, b.Replicas) && slices.Equal(a.Backlog, b.Backlog) && slices.Equal(a.Wait, b.Wait)
	})
	c.panels = []replayPanel{replicas, backlog, waits}
	for i := range c.panels {
		c.panels[i].fitAxis(i < 2)
	}
	return c, nil
}

func buildOpenBChart(title, attribution string, res *OpenBResult) (replayChart, error) {
	if err := checkHeader(attribution); err != nil {
		return replayChart{}, err
	}
	switch {
	case res == nil || len(res.Policies) == 0:
		return replayChart{}, errors.New("chart: no policies to draw")
	case res.Span <= 0:
		return replayChart{}, fmt.Errorf("chart: span %s: want a replay that lasted", res.Span)
	}
	// The Timeline's times count from the trace's start; the span from the first task
	// replayed, where every policy's timeline starts.
	names := make([]string, len(res.Policies))
	start := time.Duration(math.MaxInt64)
	for i, p := range res.Policies {
		if len(p.Timeline) == 0 {
			return replayChart{}, fmt.Errorf("chart: policy %s: an empty timeline", p.Name)
		}
		start = min(start, p.Timeline[0].At)
		names[i] = p.Name
	}
	from, to := start.Seconds(), (start + res.Span).Seconds()
	colors := colorsFor(names)
	c := replayChart{title: title, attribution: dataLine(attribution), time: newTimeAxis(from, to, "time since the trace's start")}
	stretch := fmtBin(res.Span / openBTimelinePoints)
	waiting := replayPanel{title: "tasks waiting on the queues: no Pod has taken them yet",
		note: "summed over the queues, one per ScaledJob; where the counts change often, the most in each " + stretch}
	running := replayPanel{title: "Jobs running: their Pods placed and working", note: "the most in each " + stretch + " where they change often"}
	pending := replayPanel{title: "Pods Pending: created by KEDA, no node with free GPUs to take them",
		note: "what a cluster autoscaler would be asked to add; capacityAware asks for no more Jobs than free GPUs can place"}
	for i, p := range res.Policies {
		kind := "plain ScaledJob"
		if p.CapacityAware {
			kind = "capacityAware"
		}
		name := p.Name + " (" + kind + ")"
		c.legend = append(c.legend, legendEntry{policy: p.Name, name: name, color: colors[i], dash: !p.CapacityAware,
			note: fmt.Sprintf("wait p99 %s, %s", fmtSeconds(p.JobWaitP99), pendingNote(p.PendingJobsMax))})
		counts := func(v func(OpenBPoint) int) replaySeries {
			sr := replaySeries{name: name, color: colors[i], dash: !p.CapacityAware}
			for k, pt := range p.Timeline {
				end := to
				if k+1 < len(p.Timeline) {
					end = p.Timeline[k+1].At.Seconds()
				}
				from := pt.At.Seconds()
				if from >= to {
					break
				}
				sr.steps = append(sr.steps, step{from: from, to: min(end, to), v: float64(v(pt))})
			}
			return sr
		}
		waiting.series = append(waiting.series, counts(func(p OpenBPoint) int { return p.Waiting }))
		running.series = append(running.series, counts(func(p OpenBPoint) int { return p.Running }))
		pending.series = append(pending.series, counts(func(p OpenBPoint) int { return p.Pending }))
	}
	c.noteSame(func(i, j int) bool { return slices.Equal(res.Policies[i].Timeline, res.Policies[j].Timeline) })
	c.panels = []replayPanel{waiting, running, pending}
	for i := range c.panels {
		c.panels[i].fitAxis(true)
	}
	return c, nil
}

// noteSame says, in the legend, which policies ran the same course as a later one, whose
// lines then lie on theirs: same(i, j) tells whether policies i and j did.
func (c *replayChart) noteSame(same func(i, j int) bool) {
	for i := range c.legend {
		for j := len(c.legend) - 1; j > i; j-- {
			if !same(i, j) {
				continue
			}
			e, other := &c.legend[i], c.legend[j]
			e.also = "the same course as " + other.policy
			if e.dash == other.dash || !e.dash { // drawn first
				e.also = "hidden under " + other.policy + ": same course"
			}
			break
		}
	}
}

// fitAxis sets the panel's value axis to cover its series' peak. The axis is a log one
// (reaching the first of 1, 2 or 5 times a power of ten at or above the peak) when a
// linear one would crush some policies against its bottom while others use its height:
// when at least half of the series that are ever above 0 spend most of that time in the
// bottom tenth of the peak, and some other series does not. Then 0.5 s and 50 s waits,
// or 2 and 100 replicas, both read.
func (p *replayPanel) fitAxis(whole bool) {
	peak := 0.0
	for _, sr := range p.series {
		peak = max(peak, sr.peak())
	}
	low, high := 0, 0
	for _, sr := range p.series {
		switch m, ok := sr.typical(); {
		case !ok:
		case m < peak/10:
			low++
		default:
			high++
		}
	}
	p.log = low > 0 && high > 0 && low >= high
	p.axis = svgchart.NiceAxis(peak, whole)
	if p.log {
		p.axis = svgchart.Axis{Max: max(1, svgchart.NiceCeil(peak))}
	}
}

// fullNote is the panel's note as drawn: with "log scale" when it is.
func (p replayPanel) fullNote() string {
	switch {
	case !p.log:
		return p.note
	case p.note == "":
		return "log scale"
	}
	return p.note + " (log scale)"
}

// scale returns v's height on the panel's axis, from 0 at the bottom to 1 at the top.
func (p replayPanel) scale(v float64) float64 {
	v = min(max(v, 0), p.axis.Max)
	if p.log {
		return math.Log10(1+v) / math.Log10(1+p.axis.Max)
	}
	return v / p.axis.Max
}

// ticks returns the value axis' ticks: every step of a linear axis; 0 and 1, 2 and 5
// times each power of ten up to the end of a log one.
func (p replayPanel) ticks() []float64 {
	if !p.log {
		return p.axis.Ticks()
	}
	out := []float64{0}
	for dec := 1.0; dec <= p.axis.Max; dec *= 10 {
		for _, m := range []float64{1, 2, 5} {
			if m*dec <= p.axis.Max*(1+1e-9) {
				out = append(out, m*dec)
			}
		}
	}
	return out
}

// pendingNote says how many Pods were Pending at most.
func pendingNote(n int) string {
	if n == 0 {
		return "no Pod ever Pending"
	}
	return fmt.Sprintf("at most %d Pods Pending", n)
}

// fmtBin says how long a bin is, rounded to what a reader needs.
func fmtBin(d time.Duration) string {
	switch {
	case d >= time.Hour:
		return kedarules.FmtNum(math.Round(d.Hours()*10)/10) + " hours"
	case d >= 2*time.Minute:
		return kedarules.FmtNum(math.Round(d.Minutes())) + " minutes"
	default:
		return kedarules.FmtNum(math.Round(d.Seconds()*10)/10) + " s"
	}
}

// fmtSeconds is a wait in seconds, to a tenth below 10 s.
func fmtSeconds(s float64) string {
	if s < 10 {
		return strconv.FormatFloat(math.Round(s*10)/10, 'f', -1, 64) + " s"
	}
	return fmtCount(s) + " s"
}

// fmtGPUHours is GPU-hours to two decimals below 1, one below 10, else as fmtCount.
func fmtGPUHours(h float64) string {
	if h < 1 {
		return strconv.FormatFloat(math.Round(h*100)/100, 'f', -1, 64)
	}
	return fmtCount(h)
}

// fmtCount is v rounded to a whole number, with thousands separated by commas; below
// 10, to a tenth.
func fmtCount(v float64) string {
	if math.Abs(v) < 10 {
		return strconv.FormatFloat(math.Round(v*10)/10, 'f', -1, 64)
	}
	digits := strconv.FormatFloat(math.Abs(math.Round(v)), 'f', 0, 64)
	var b strings.Builder
	if v < 0 {
		b.WriteByte('-')
	}
	for i, d := range digits {
		if i > 0 && (len(digits)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(d)
	}
	return b.String()
}

// Layout of a replay chart, in pixels.
const (
	chartWidth   = 1120.0
	chartLeft    = 64.0  // for the value axes' numbers
	chartRight   = 310.0 // for the legend
	headerH      = 58.0  // the title and the attribution
	panelGap     = 46.0  // above each panel, for its title and note
	panelH       = 150.0
	timeLabelsH  = 34.0 // under the last panel
	legendLineH  = 15.0
	legendEntryH = 38.0
)

func (c replayChart) render(w io.Writer) error {
	plotW := chartWidth - chartLeft - chartRight
	height := headerH + float64(len(c.panels))*(panelGap+panelH) + timeLabelsH
	x := func(t float64) float64 {
		return chartLeft + plotW*(min(max(t, c.time.from), c.time.to)-c.time.from)/(c.time.to-c.time.from)
	}
	b := bufio.NewWriter(w)
	fmt.Fprintf(b, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" viewBox="0 0 %.0f %.0f" font-family="Helvetica, Arial, sans-serif" font-size="12">`+"\n", chartWidth, height, chartWidth, height)
	fmt.Fprintf(b, `<rect width="100%%" height="100%%" fill="#ffffff"/>`+"\n")
	fmt.Fprintf(b, `<text x="%.0f" y="24" font-size="15" font-weight="bold">%s</text>`+"\n", chartLeft, html.EscapeString(c.title))
	fmt.Fprintf(b, `<text x="%.0f" y="42" font-size="11" fill="#555555">%s</text>`+"\n", chartLeft, html.EscapeString(c.attribution))

	// One legend, beside the first panel: the colours are the same in every panel.
	ly := headerH + panelGap + 10
	lx := chartLeft + plotW + 16
	fmt.Fprintf(b, `<text x="%.0f" y="%.0f" font-size="11" fill="#555555">policy</text>`+"\n", lx, ly-18)
	for _, e := range c.legend {
		fmt.Fprintf(b, `<line x1="%.0f" x2="%.0f" y1="%.0f" y2="%.0f" stroke="%s" stroke-width="2.5"%s/>`+"\n", lx, lx+22, ly-4, ly-4, e.color, dashAttr(e.dash))
		fmt.Fprintf(b, `<text x="%.0f" y="%.0f">%s</text>`+"\n", lx+28, ly, html.EscapeString(e.name))
		fmt.Fprintf(b, `<text x="%.0f" y="%.0f" font-size="11" fill="#555555">%s</text>`+"\n", lx+28, ly+legendLineH, html.EscapeString(e.note))
		if e.also != "" {
			ly += legendLineH - 2
			fmt.Fprintf(b, `<text x="%.0f" y="%.0f" font-size="11" fill="#555555">%s</text>`+"\n", lx+28, ly+legendLineH, html.EscapeString(e.also))
		}
		ly += legendEntryH
	}

	y0 := headerH
	for _, p := range c.panels {
		y0 += panelGap
		y := func(v float64) float64 { return y0 + panelH - panelH*p.scale(v) }
		titleY := y0 - 8
		if note := p.fullNote(); note != "" {
			titleY = y0 - 22
			fmt.Fprintf(b, `<text x="%.0f" y="%.0f" font-size="11" fill="#555555">%s</text>`+"\n", chartLeft, y0-8, html.EscapeString(note))
		}
		fmt.Fprintf(b, `<text x="%.0f" y="%.0f" font-weight="bold">%s</text>`+"\n", chartLeft, titleY, html.EscapeString(p.title))
		for _, u := range c.unmeasured {
			fmt.Fprintf(b, `<rect x="%.1f" y="%.0f" width="%.1f" height="%.0f" fill="%s"/>`+"\n", x(u.from), y0, x(u.to)-x(u.from), panelH, unmeasuredFill)
		}
		fmt.Fprintf(b, `<rect x="%.0f" y="%.0f" width="%.0f" height="%.0f" fill="none" stroke="#cccccc"/>`+"\n", chartLeft, y0, plotW, panelH)
		for _, t := range c.time.ticks {
			fmt.Fprintf(b, `<line x1="%.1f" x2="%.1f" y1="%.0f" y2="%.0f" stroke="#eeeeee" stroke-width="0.5"/>`+"\n", x(t), x(t), y0, y0+panelH)
		}
		labelled := math.Inf(1) // the height of the last number written: the next keeps clear of it
		for _, v := range p.ticks() {
			fmt.Fprintf(b, `<line x1="%.0f" x2="%.0f" y1="%.1f" y2="%.1f" stroke="#dddddd" stroke-width="0.5"/>`+"\n", chartLeft, chartLeft+plotW, y(v), y(v))
			if labelled-y(v) >= 13 {
				fmt.Fprintf(b, `<text x="%.0f" y="%.1f" text-anchor="end" fill="#555555">%s</text>`+"\n", chartLeft-6, y(v)+4, html.EscapeString(kedarules.FmtNum(v)+p.unit))
				labelled = y(v)
			}
		}
		// Solid series first, then dashed ones, whose gaps let what they cover show.
		order := make([]replaySeries, 0, len(p.series))
		for _, dashed := range []bool{false, true} {
			for _, sr := range p.series {
				if sr.dash == dashed {
					order = append(order, sr)
				}
			}
		}
		for _, sr := range order {
			var path strings.Builder
			lastY := math.NaN()
			for k, s := range sr.steps {
				x0, x1, py := x(s.from), x(s.to), y(s.v)
				switch {
				case k == 0:
					fmt.Fprintf(&path, "M%.1f %.1f", x0, py)
				case py != lastY:
					fmt.Fprintf(&path, "H%.1f V%.1f", x0, py)
				}
				if k == len(sr.steps)-1 {
					fmt.Fprintf(&path, "H%.1f", x1)
				}
				lastY = py
			}
			fmt.Fprintf(b, `<path d="%s" fill="none" stroke="%s" stroke-width="1.6" stroke-linejoin="round"%s/>`+"\n", path.String(), sr.color, dashAttr(sr.dash))
		}
		y0 += panelH
	}
	for _, t := range c.time.ticks {
		fmt.Fprintf(b, `<text x="%.1f" y="%.0f" text-anchor="middle" fill="#555555">%s</text>`+"\n", x(t), y0+16, html.EscapeString(c.time.tickLabel(t)))
	}
	fmt.Fprintf(b, `<text x="%.0f" y="%.0f" fill="#555555">%s</text>`+"\n", chartLeft+plotW+16, y0+16, html.EscapeString(c.time.label))
	fmt.Fprintln(b, `</svg>`)
	return b.Flush()
}

// unmeasuredFill shades what the results do not count.
const unmeasuredFill = "#efefef"

func dashAttr(dash bool) string {
	if dash {
		return ` stroke-dasharray="6 3"`
	}
	return ""
}
