package demo

import (
	"bufio"
	"fmt"
	"html"
	"io"
	"math"
	"strings"
)

// WriteChart draws a run's timeline as an SVG: three panels over one time axis — the
// request queue (backlog and arrival rate), the utilisation of the service's GPUs, and
// the replicas and training Jobs — with each activation marked.
func WriteChart(w io.Writer, s *Summary) error {
	const (
		width, left, right = 980.0, 64.0, 190.0
		top, panelH, gap   = 70.0, 150.0, 44.0
	)
	plotW := width - left - right
	axisY := top + 3*panelH + 2*gap // the bottom of the last panel
	height := axisY + 48
	end := s.Seconds
	if end <= 0 {
		end = 1
	}
	x := func(t float64) float64 { return left + plotW*t/end }

	b := bufio.NewWriter(w)
	fmt.Fprintf(b, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" viewBox="0 0 %.0f %.0f" font-family="Helvetica, Arial, sans-serif" font-size="12">`+"\n", width, height, width, height)
	fmt.Fprintf(b, `<rect width="100%%" height="100%%" fill="#ffffff"/>`+"\n")
	title := fmt.Sprintf("gpuscaler demo: %.0f s, %d requests served, %.0f GPU-seconds used, %.0f s at zero", s.Seconds, s.RequestsServed, s.GPUSeconds, s.SecondsAtZero)
	if len(s.Activations) > 0 {
		title += fmt.Sprintf(", woke in %.1f ms", s.Activations[0].Milliseconds)
	}
	fmt.Fprintf(b, `<text x="%.0f" y="28" font-size="15" font-weight="bold">%s</text>`+"\n", left, html.EscapeString(title))

	type series struct {
		name, color string
		dash        bool
		step        bool
		value       func(Row) (float64, bool)
	}
	panels := []struct {
		title  string
		max    float64
		series []series
		guide  *float64 // a dashed horizontal line, such as a target
		guideL string
	}{
		{title: "inference request queue", series: []series{
			{name: "backlog (scaler)", color: "#1f77b4", value: func(r Row) (float64, bool) { return r.Backlog, true }},
			{name: "arrivals / s", color: "#9aa5b1", dash: true, value: func(r Row) (float64, bool) { return r.Rate, true }},
		}},
		{title: "GPU utilisation of the service's GPUs (%)", max: 100, series: []series{
			{name: "average util", color: "#d62728", value: func(r Row) (float64, bool) {
				if r.Util == nil {
					return 0, false
				}
				return *r.Util, true
			}},
		}, guide: ptr(float64(gpuUtilTarget)), guideL: fmt.Sprintf("target %d%%", gpuUtilTarget)},
		{title: "replicas and training Jobs", series: []series{
			{name: "inference replicas", color: "#2ca02c", step: true, value: func(r Row) (float64, bool) { return float64(r.Replicas), true }},
			{name: "… ready", color: "#98df8a", step: true, dash: true, value: func(r Row) (float64, bool) { return float64(r.Ready), true }},
			{name: "training Jobs running", color: "#9467bd", step: true, value: func(r Row) (float64, bool) { return float64(r.JobsRunning), true }},
			{name: "jobs queued", color: "#c5b0d5", step: true, dash: true, value: func(r Row) (float64, bool) { return float64(r.JobQueue), true }},
		}},
	}
	for i, p := range panels {
		y0 := top + float64(i)*(panelH+gap)
		maxV := p.max
		if maxV == 0 {
			for _, sr := range p.series {
				for _, r := range s.Rows {
					if v, ok := sr.value(r); ok {
						maxV = math.Max(maxV, v)
					}
				}
			}
			maxV = niceCeil(maxV)
		}
		y := func(v float64) float64 { return y0 + panelH - panelH*v/maxV }
		fmt.Fprintf(b, `<text x="%.0f" y="%.0f" font-weight="bold">%s</text>`+"\n", left, y0-8, html.EscapeString(p.title))
		fmt.Fprintf(b, `<rect x="%.0f" y="%.0f" width="%.0f" height="%.0f" fill="none" stroke="#cccccc"/>`+"\n", left, y0, plotW, panelH)
		for k := 0; k <= 4; k++ {
			v := maxV * float64(k) / 4
			fmt.Fprintf(b, `<line x1="%.0f" x2="%.0f" y1="%.1f" y2="%.1f" stroke="#eeeeee"/>`+"\n", left, left+plotW, y(v), y(v))
			fmt.Fprintf(b, `<text x="%.0f" y="%.1f" text-anchor="end" fill="#555555">%s</text>`+"\n", left-6, y(v)+4, fmtNum(math.Round(v*10)/10))
		}
		if p.guide != nil {
			fmt.Fprintf(b, `<line x1="%.0f" x2="%.0f" y1="%.1f" y2="%.1f" stroke="#d62728" stroke-dasharray="2 4" opacity="0.6"/>`+"\n", left, left+plotW, y(*p.guide), y(*p.guide))
			fmt.Fprintf(b, `<text x="%.0f" y="%.1f" fill="#d62728" font-size="11">%s</text>`+"\n", left+plotW-70, y(*p.guide)-4, p.guideL)
		}
		for k, sr := range p.series {
			var path strings.Builder
			pen := false
			prevY := 0.0
			for _, r := range s.Rows {
				v, ok := sr.value(r)
				if !ok {
					pen = false
					continue
				}
				px, py := x(r.Seconds), y(math.Min(v, maxV))
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
			ly := y0 + 14 + float64(k)*18
			fmt.Fprintf(b, `<line x1="%.0f" x2="%.0f" y1="%.0f" y2="%.0f" stroke="%s" stroke-width="2"%s/>`+"\n", left+plotW+12, left+plotW+32, ly-4, ly-4, sr.color, dash)
			fmt.Fprintf(b, `<text x="%.0f" y="%.0f">%s</text>`+"\n", left+plotW+36, ly, html.EscapeString(sr.name))
		}
		for _, a := range s.Activations {
			ax := x(a.AtSeconds)
			fmt.Fprintf(b, `<line x1="%.1f" x2="%.1f" y1="%.0f" y2="%.0f" stroke="#ff7f0e" stroke-width="1.5"/>`+"\n", ax, ax, y0, y0+panelH)
			if i == 0 {
				fmt.Fprintf(b, `<text x="%.1f" y="%.0f" fill="#ff7f0e" font-size="11">woken (%s, %.1f ms)</text>`+"\n", ax+4, y0+12, a.Via, a.Milliseconds)
			}
		}
	}
	step := niceCeil(end / 10)
	for t := 0.0; t <= end+1e-9; t += step {
		fmt.Fprintf(b, `<text x="%.1f" y="%.0f" text-anchor="middle" fill="#555555">%ss</text>`+"\n", x(t), axisY+16, fmtNum(t))
	}
	fmt.Fprintf(b, `<text x="%.0f" y="%.0f" fill="#555555">time since start; the load runs idle, burst, sustained, idle</text>`+"\n", left, axisY+38)
	fmt.Fprintln(b, `</svg>`)
	return b.Flush()
}

// niceCeil rounds v up to 1, 2 or 5 times a power of ten.
func niceCeil(v float64) float64 {
	if v <= 0 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5, 10} {
		if v <= m*p {
			return m * p
		}
	}
	return 10 * p
}

func ptr[T any](v T) *T { return &v }
