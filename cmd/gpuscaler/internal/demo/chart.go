package demo

import (
	"bufio"
	"fmt"
	"html"
	"io"
	"math"
	"strings"

	"github.com/gpuscaler/gpuscaler/cmd/gpuscaler/internal/kedarules"
	"github.com/gpuscaler/gpuscaler/cmd/gpuscaler/internal/svgchart"
)

// WriteChart draws a run's timeline as an SVG: four panels over one time axis — the
// arrival rate, the request queue's backlog, the utilisation of the service's GPUs, and
// the replicas (with those the trigger's queue metric asks for) and training Jobs — under
// a strip naming the load's phases, whose bands run down every panel, with each
// activation marked.
func WriteChart(w io.Writer, s *Summary) error {
	return buildChart(s).render(w)
}

// chart is what WriteChart draws, worked out before any of it is drawn, so tests can
// check what a reader will see (an axis, a phase, a series' values) without parsing SVG.
type chart struct {
	title       string
	end         float64 // seconds the time axis spans
	phases      []band
	activations []ActivationSummary
	panels      []panel
}

// band is one phase of the load, shaded across the panels.
type band struct {
	from, to float64
	label    string
	fill     string
}

type panel struct {
	title  string
	note   string // a second line under the title, saying how to read the panel
	height float64
	axis   axis
	series []series
	guide  *guide
}

// axis is a value axis from 0 to max, with a tick every step.
type axis struct{ max, step float64 }

type guide struct {
	value float64
	label string
}

type series struct {
	name   string // the legend; a newline breaks it in two
	color  string
	dash   bool
	step   bool // drawn as steps: a count that changes at an instant
	points []point
}

// point is one row's value; ok is false where the series has none (a gap in the line).
type point struct {
	t, v float64
	ok   bool
}

// Colours of the phases' bands: the busier the load, the warmer.
var phaseFill = map[string]string{"idle": "#f7f7f7", "burst": "#fde2d2", "sustained": "#fdf2c9"}

func buildChart(s *Summary) chart {
	c := chart{end: s.Seconds, activations: s.Activations}
	if c.end <= 0 {
		c.end = 1
	}
	c.title = fmt.Sprintf("gpuscaler demo: %.0f s, %d requests served, %.0f GPU-seconds used, %.0f s at zero", s.Seconds, s.RequestsServed, s.GPUSeconds, s.SecondsAtZero)
	if len(s.Activations) > 0 {
		c.title += fmt.Sprintf(", woke in %.1f ms", s.Activations[0].Milliseconds)
	}
	for _, p := range s.Phases {
		label := p.Name
		if p.Rate > 0 {
			label += fmt.Sprintf(": %s requests/s", kedarules.FmtNum(p.Rate))
		}
		fill := phaseFill[p.Name]
		if fill == "" {
			fill = phaseFill["idle"]
		}
		c.phases = append(c.phases, band{from: p.From, to: p.To, label: label, fill: fill})
	}
	line := func(name, color string, dash, step bool, value func(Row) (float64, bool)) series {
		sr := series{name: name, color: color, dash: dash, step: step}
		for _, r := range s.Rows {
			v, ok := value(r)
			sr.points = append(sr.points, point{t: r.Seconds, v: v, ok: ok})
		}
		return sr
	}
	always := func(f func(Row) float64) func(Row) (float64, bool) {
		return func(r Row) (float64, bool) { return f(r), true }
	}
	maybe := func(f func(Row) *float64) func(Row) (float64, bool) {
		return func(r Row) (float64, bool) {
			if v := f(r); v != nil {
				return *v, true
			}
			return 0, false
		}
	}
	startup := "its model loads"
	if s.StartupSeconds > 0 {
		startup = fmt.Sprintf("the %s s its model loads", kedarules.FmtNum(s.StartupSeconds))
	}
	c.panels = []panel{
		{title: "load: requests arriving per second", height: 80, series: []series{
			line("arrivals / s", "#7f7f7f", false, false, always(func(r Row) float64 { return r.Rate })),
		}},
		{title: "inference request queue: the backlog its producer counts", height: 120, series: []series{
			line("backlog (waiting +\nin flight)", "#1f77b4", false, false, always(func(r Row) float64 { return float64(r.Backlog) })),
		}},
		{title: "GPU utilisation of the service's GPUs (%)", height: 150, axis: axis{max: 100, step: 25},
			note: fmt.Sprintf("a new replica's GPU sits near %d%% for %s: it pulls the all-GPU average down, not the serving one", loadingUtil, startup),
			series: []series{
				line("serving replicas\n(model loaded)", "#d62728", false, false, maybe(func(r Row) *float64 { return r.UtilServing })),
				line("every GPU held, loading too\n(what the HPA weighs)", "#f2a3a3", true, false, maybe(func(r Row) *float64 { return r.Util })),
			},
			guide: &guide{value: gpuUtilTarget, label: fmt.Sprintf("target %d%%", gpuUtilTarget)}},
		{title: "replicas and training Jobs", height: 150, series: []series{
			line("inference replicas", "#2ca02c", false, true, always(func(r Row) float64 { return float64(r.Replicas) })),
			line("… ready (serving)", "#98df8a", true, true, always(func(r Row) float64 { return float64(r.Ready) })),
			line(queueLegend(s.QueueMetric), "#1f77b4", true, false, maybe(func(r Row) *float64 { return r.Demand })),
			line("training Jobs running", "#9467bd", false, true, always(func(r Row) float64 { return float64(r.JobsRunning) })),
			line("training jobs queued", "#c5b0d5", true, true, always(func(r Row) float64 { return float64(r.JobQueue) })),
		}},
	}
	for i := range c.panels {
		p := &c.panels[i]
		if p.axis.max > 0 {
			continue
		}
		peak := 0.0
		for _, sr := range p.series {
			for _, pt := range sr.points {
				if pt.ok {
					peak = max(peak, pt.v)
				}
			}
		}
		p.axis = niceAxis(peak)
	}
	return c
}

// queueLegend names the replicas the trigger's queue metric asks for, in the chart's
// legend.
func queueLegend(metric string) string {
	if metric == "" {
		metric = "queue metric"
	}
	return metric + ": replicas\nthe scaler asks for"
}

func (c chart) render(w io.Writer) error {
	const (
		width, left, right = 1040.0, 64.0, 250.0
		stripY, stripH     = 44.0, 20.0 // the phases' strip, under the title
		gap                = 48.0       // above each panel, for its title and note
		axisH              = 30.0       // under the last panel, for the time labels
	)
	plotW := width - left - right
	x := func(t float64) float64 { return left + plotW*min(max(t, 0), c.end)/c.end }
	height := stripY + stripH + axisH + 12
	for _, p := range c.panels {
		height += gap + p.height
	}

	b := bufio.NewWriter(w)
	fmt.Fprintf(b, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" viewBox="0 0 %.0f %.0f" font-family="Helvetica, Arial, sans-serif" font-size="12">`+"\n", width, height, width, height)
	fmt.Fprintf(b, `<rect width="100%%" height="100%%" fill="#ffffff"/>`+"\n")
	fmt.Fprintf(b, `<text x="%.0f" y="28" font-size="15" font-weight="bold">%s</text>`+"\n", left, html.EscapeString(c.title))

	// The phases: a labelled strip, then the same bands behind every panel.
	for _, ph := range c.phases {
		x0, x1 := x(ph.from), x(ph.to)
		fmt.Fprintf(b, `<rect x="%.1f" y="%.0f" width="%.1f" height="%.0f" fill="%s" stroke="#ffffff"/>`+"\n", x0, stripY, x1-x0, stripH, ph.fill)
		label := ph.label
		if est := 6.2 * float64(len([]rune(label))); est > x1-x0-4 { // too narrow: the name alone
			label, _, _ = strings.Cut(label, ":")
		}
		fmt.Fprintf(b, `<text x="%.1f" y="%.0f" text-anchor="middle" font-size="11" fill="#333333">%s</text>`+"\n", (x0+x1)/2, stripY+14, html.EscapeString(label))
	}
	if len(c.phases) > 0 {
		fmt.Fprintf(b, `<text x="%.0f" y="%.0f" font-size="11" fill="#555555">load phase</text>`+"\n", left+plotW+12, stripY+14)
	}

	y0 := stripY + stripH
	for i, p := range c.panels {
		y0 += gap
		y := func(v float64) float64 { return y0 + p.height - p.height*min(v, p.axis.max)/p.axis.max }
		titleY := y0 - 8
		if p.note != "" {
			titleY = y0 - 22
			fmt.Fprintf(b, `<text x="%.0f" y="%.0f" font-size="11" fill="#555555">%s</text>`+"\n", left, y0-8, html.EscapeString(p.note))
		}
		fmt.Fprintf(b, `<text x="%.0f" y="%.0f" font-weight="bold">%s</text>`+"\n", left, titleY, html.EscapeString(p.title))
		for _, ph := range c.phases {
			fmt.Fprintf(b, `<rect x="%.1f" y="%.0f" width="%.1f" height="%.0f" fill="%s" opacity="0.6"/>`+"\n", x(ph.from), y0, x(ph.to)-x(ph.from), p.height, ph.fill)
		}
		fmt.Fprintf(b, `<rect x="%.0f" y="%.0f" width="%.0f" height="%.0f" fill="none" stroke="#cccccc"/>`+"\n", left, y0, plotW, p.height)
		for k := 0; ; k++ {
			v := p.axis.step * float64(k)
			if v > p.axis.max+p.axis.step/1e6 {
				break
			}
			fmt.Fprintf(b, `<line x1="%.0f" x2="%.0f" y1="%.1f" y2="%.1f" stroke="#dddddd" stroke-width="0.5"/>`+"\n", left, left+plotW, y(v), y(v))
			fmt.Fprintf(b, `<text x="%.0f" y="%.1f" text-anchor="end" fill="#555555">%s</text>`+"\n", left-6, y(v)+4, kedarules.FmtNum(math.Round(v*100)/100))
		}
		if p.guide != nil {
			gy := y(p.guide.value)
			fmt.Fprintf(b, `<line x1="%.0f" x2="%.0f" y1="%.1f" y2="%.1f" stroke="#d62728" stroke-dasharray="2 4" opacity="0.6"/>`+"\n", left, left+plotW, gy, gy)
			fmt.Fprintf(b, `<text x="%.0f" y="%.1f" text-anchor="end" fill="#d62728" font-size="11">%s</text>`+"\n", left+plotW-4, gy-4, html.EscapeString(p.guide.label))
		}
		ly := y0 + 14
		for _, sr := range p.series {
			var path strings.Builder
			pen, prevY := false, 0.0
			for _, pt := range sr.points {
				if !pt.ok {
					pen = false
					continue
				}
				px, py := x(pt.t), y(pt.v)
				switch {
				case !pen:
					fmt.Fprintf(&path, "M%.1f %.1f", px, py)
				case sr.step:
					fmt.Fprintf(&path, " L%.1f %.1f L%.1f %.1f", px, prevY, px, py)
				default:
					fmt.Fprintf(&path, " L%.1f %.1f", px, py)
				}
				pen, prevY = true, py
			}
			dash := ""
			if sr.dash {
				dash = ` stroke-dasharray="5 3"`
			}
			fmt.Fprintf(b, `<path d="%s" fill="none" stroke="%s" stroke-width="2"%s/>`+"\n", path.String(), sr.color, dash)
			fmt.Fprintf(b, `<line x1="%.0f" x2="%.0f" y1="%.0f" y2="%.0f" stroke="%s" stroke-width="2"%s/>`+"\n", left+plotW+12, left+plotW+32, ly-4, ly-4, sr.color, dash)
			for _, l := range strings.Split(sr.name, "\n") {
				fmt.Fprintf(b, `<text x="%.0f" y="%.0f">%s</text>`+"\n", left+plotW+36, ly, html.EscapeString(l))
				ly += 15
			}
			ly += 4
		}
		for _, a := range c.activations {
			ax := x(a.AtSeconds)
			fmt.Fprintf(b, `<line x1="%.1f" x2="%.1f" y1="%.0f" y2="%.0f" stroke="#ff7f0e" stroke-width="1.5"/>`+"\n", ax, ax, y0, y0+p.height)
			if i == 0 {
				fmt.Fprintf(b, `<text x="%.1f" y="%.0f" fill="#ff7f0e" font-size="11">woken (%s, %.1f ms)</text>`+"\n", ax+4, y0+12, a.Via, a.Milliseconds)
			}
		}
		y0 += p.height
	}
	step := svgchart.NiceCeil(c.end / 10)
	for t := 0.0; t <= c.end+1e-9; t += step {
		fmt.Fprintf(b, `<text x="%.1f" y="%.0f" text-anchor="middle" fill="#555555">%ss</text>`+"\n", x(t), y0+16, kedarules.FmtNum(t))
	}
	fmt.Fprintf(b, `<text x="%.0f" y="%.0f" fill="#555555">time since start</text>`+"\n", left+plotW+24, y0+16)
	fmt.Fprintln(b, `</svg>`)
	return b.Flush()
}

// niceAxis returns the axis for counts up to peak: svgchart.NiceAxis with whole steps.
func niceAxis(peak float64) axis {
	a := svgchart.NiceAxis(peak, true)
	return axis{max: a.Max, step: a.Step}
}

func ptr[T any](v T) *T { return &v }
