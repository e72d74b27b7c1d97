package report

import (
	"bytes"
	"encoding/xml"
	"fmt"
	"io"
	"math"
	"strings"
)

// chart is a set of panels of horizontal bars sharing their row labels.
type chart struct {
	title, subtitle string
	labels          []string
	panels          []panel
}

// panel is one figure: for each label, one bar per series.
type panel struct {
	title  string
	series []series
	// ref, when set, draws a labelled vertical reference line (the oracle's hit rate).
	ref    *reference
	format func(float64) string
}

type series struct {
	name   string
	values []float64 // per label; NaN draws nothing
}

type reference struct {
	name  string
	value float64
}

var palette = []string{"#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948"}

// Layout, in pixels.
const (
	svgWidth    = 960
	labelWidth  = 190
	valueWidth  = 80
	barHeight   = 13
	groupGap    = 7
	panelHeader = 44
	panelGap    = 18
	chartHeader = 58
	// The subtitle wraps at subtitleChars characters, one line per subtitleLine pixels.
	subtitleChars = 150
	subtitleLine  = 16
)

// wrap cuts s into lines of at most width characters at spaces (a longer word stays whole).
func wrap(s string, width int) []string {
	var lines []string
	line := ""
	for _, w := range strings.Fields(s) {
		switch {
		case line == "":
			line = w
		case len(line)+1+len(w) <= width:
			line += " " + w
		default:
			lines = append(lines, line)
			line = w
		}
	}
	return append(lines, line)
}

// WriteSVG writes the scenario's chart. Skipped rows appear as labels without bars.
func WriteSVG(w io.Writer, s *Scenario) error {
	c := buildChart(s)
	sub := wrap(c.subtitle, subtitleChars)
	header := chartHeader + (len(sub)-1)*subtitleLine
	var b bytes.Buffer
	height := header
	for _, p := range c.panels {
		height += panelHeight(len(c.labels), len(p.series)) + panelGap
	}
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n",
		svgWidth, height, svgWidth, height)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="#ffffff"/>`+"\n")
	fmt.Fprintf(&b, `<text x="12" y="24" font-size="17" font-weight="bold">%s</text>`+"\n", esc(c.title))
	for i, line := range sub {
		fmt.Fprintf(&b, `<text x="12" y="%d" fill="#555555">%s</text>`+"\n", 44+i*subtitleLine, esc(line))
	}
	y := header
	for _, p := range c.panels {
		writePanel(&b, p, c.labels, y)
		y += panelHeight(len(c.labels), len(p.series)) + panelGap
	}
	b.WriteString("</svg>\n")
	_, err := w.Write(b.Bytes())
	if err != nil {
		return fmt.Errorf("cannot write chart: %w", err)
	}
	return nil
}

func panelHeight(labels, nseries int) int {
	return panelHeader + labels*(max(nseries, 1)*barHeight+groupGap)
}

func writePanel(b *bytes.Buffer, p panel, labels []string, y0 int) {
	peak := 0.0
	for _, s := range p.series {
		for _, v := range s.values {
			if !math.IsNaN(v) {
				peak = max(peak, v)
			}
		}
	}
	if p.ref != nil {
		peak = max(peak, p.ref.value)
	}
	if peak <= 0 {
		peak = 1
	}
	barMax := float64(svgWidth - labelWidth - valueWidth - 12)
	h := panelHeight(len(labels), len(p.series))
	fmt.Fprintf(b, `<rect x="6" y="%d" width="%d" height="%d" fill="#f7f7f7" stroke="#dddddd"/>`+"\n", y0, svgWidth-12, h)
	fmt.Fprintf(b, `<text x="14" y="%d" font-size="14" font-weight="bold">%s</text>`+"\n", y0+20, esc(p.title))
	// Legend.
	lx := labelWidth
	for i, s := range p.series {
		if len(p.series) == 1 && p.ref == nil {
			break
		}
		fmt.Fprintf(b, `<rect x="%d" y="%d" width="10" height="10" fill="%s"/>`+"\n", lx, y0+28, palette[i%len(palette)])
		fmt.Fprintf(b, `<text x="%d" y="%d">%s</text>`+"\n", lx+14, y0+37, esc(s.name))
		lx += 24 + 7*len(s.name)
	}
	if p.ref != nil {
		fmt.Fprintf(b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#222222" stroke-dasharray="4,3"/>`+"\n", lx, y0+33, lx+16, y0+33)
		fmt.Fprintf(b, `<text x="%d" y="%d">%s %s</text>`+"\n", lx+20, y0+37, esc(p.ref.name), esc(p.format(p.ref.value)))
	}
	y := y0 + panelHeader
	group := max(len(p.series), 1) * barHeight
	for li, label := range labels {
		fmt.Fprintf(b, `<text x="%d" y="%d" text-anchor="end">%s</text>`+"\n", labelWidth-8, y+group/2+4, esc(label))
		for si, s := range p.series {
			v := s.values[li]
			if math.IsNaN(v) {
				continue
			}
			wpx := v / peak * barMax
			by := y + si*barHeight
			fmt.Fprintf(b, `<rect x="%d" y="%d" width="%.1f" height="%d" fill="%s"><title>%s %s: %s</title></rect>`+"\n",
				labelWidth, by+1, wpx, barHeight-2, palette[si%len(palette)], esc(label), esc(s.name), esc(p.format(v)))
			fmt.Fprintf(b, `<text x="%.1f" y="%d" font-size="10" fill="#333333">%s</text>`+"\n", float64(labelWidth)+wpx+4, by+barHeight-3, esc(p.format(v)))
		}
		y += group + groupGap
	}
	if p.ref != nil {
		x := float64(labelWidth) + p.ref.value/peak*barMax
		fmt.Fprintf(b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#222222" stroke-dasharray="4,3"/>`+"\n", x, y0+panelHeader-4, x, y0+h-4)
	}
}

func esc(s string) string {
	var b bytes.Buffer
	_ = xml.EscapeText(&b, []byte(s))
	return b.String()
}

// buildChart lays out the scenario's figures.
func buildChart(s *Scenario) chart {
	c := chart{title: "switchyard bench — " + s.Title(), subtitle: s.Deployment}
	if s.Description != "" {
		c.subtitle = s.Description + " · " + s.Deployment
	}
	msUnit := "ms, wall"
	rate := "per second"
	if s.TimeBase == TimeSimulated {
		msUnit = "ms, simulated"
		rate = "per simulated second"
	}
	fmtNum := func(v float64) string { return num(v) }
	fmtPct := func(v float64) string { return pct(v) }
	fmtX := func(v float64) string { return fmt.Sprintf("%.2f×", v) }
	for i := range s.Rows {
		r := &s.Rows[i]
		label := r.Name
		if s.Name == ScenarioMailbox {
			label = fmt.Sprintf("mailbox %d", r.Mailbox)
		}
		if r.Skipped != "" {
			label += " (skipped)"
		}
		c.labels = append(c.labels, label)
	}
	// rowCol is one value per row, NaN where a row has none; col and slo read the summaries.
	rowCol := func(f func(*Row) (float64, bool)) []float64 {
		out := make([]float64, len(s.Rows))
		for i := range s.Rows {
			if v, ok := f(&s.Rows[i]); ok {
				out[i] = v
			} else {
				out[i] = math.NaN()
			}
		}
		return out
	}
	col := func(f func(*Summary) float64) []float64 {
		return rowCol(func(r *Row) (float64, bool) {
			if r.Summary == nil {
				return 0, false
			}
			return f(r.Summary), true
		})
	}
	switch s.Name {
	case ScenarioOverhead:
		c.panels = []panel{
			{title: "Throughput (requests " + rate + ")", format: fmtNum, series: []series{{name: "req/s", values: col(func(m *Summary) float64 { return m.RequestsPerS })}}},
			{title: "Latency (" + msUnit + ")", format: fmtNum, series: []series{
				{name: "p50", values: col(func(m *Summary) float64 { return m.E2E.P50 })},
				{name: "p90", values: col(func(m *Summary) float64 { return m.E2E.P90 })},
				{name: "p99", values: col(func(m *Summary) float64 { return m.E2E.P99 })},
			}},
			{title: "Process CPU seconds per 1,000 requests", format: func(v float64) string { return fmt.Sprintf("%.3f", v) }, series: []series{{name: "cpu", values: func() []float64 {
				out := make([]float64, len(s.Rows))
				for i := range s.Rows {
					out[i] = s.Rows[i].CPUSecondsPer1K
					if s.Rows[i].Summary == nil {
						out[i] = math.NaN()
					}
				}
				return out
			}()}}},
		}
	case ScenarioInstructions:
		c.panels = []panel{
			{title: "User-space instructions per request (cachegrind Ir)", format: fmtNum, series: []series{{name: "instructions", values: rowCol(func(r *Row) (float64, bool) {
				if r.Instructions == nil {
					return 0, false
				}
				return r.Instructions.PerRequest, true
			})}}},
		}
	case ScenarioMailbox:
		c.panels = []panel{
			{title: "Accepted throughput (requests " + rate + ")", format: fmtNum, series: []series{{name: "accepted", values: col(func(m *Summary) float64 { return m.RequestsPerS })}}},
			{title: "Rejected with 429 (share of requests)", format: fmtPct, series: []series{{name: "429", values: col(RejectRate)}}},
			{title: "Latency of accepted requests (" + msUnit + ")", format: fmtNum, series: []series{
				{name: "p50", values: col(func(m *Summary) float64 { return m.E2E.P50 })},
				{name: "p99", values: col(func(m *Summary) float64 { return m.E2E.P99 })},
			}},
		}
	case ScenarioSLO:
		slo := func(f func(*SLOSummary) float64) []float64 {
			return rowCol(func(r *Row) (float64, bool) {
				if r.SLO == nil {
					return 0, false
				}
				return f(r.SLO), true
			})
		}
		c.panels = []panel{
			{title: "SLO attainment (share of requests within the TTFT target)", format: fmtPct, series: []series{
				{name: "attainment", values: slo(func(o *SLOSummary) float64 { return o.Attainment })}}},
			{title: "Goodput and throughput (requests " + rate + ")", format: fmtNum, series: []series{
				{name: "goodput", values: slo(func(o *SLOSummary) float64 { return o.GoodputPerS })},
				{name: "req/s", values: col(func(m *Summary) float64 { return m.RequestsPerS })},
			}},
			{title: "Time to first token (" + msUnit + ")", format: fmtNum, series: []series{
				{name: "p50", values: col(func(m *Summary) float64 { return m.TTFT.P50 })},
				{name: "p90", values: col(func(m *Summary) float64 { return m.TTFT.P90 })},
				{name: "p99", values: col(func(m *Summary) float64 { return m.TTFT.P99 })},
			}},
			{title: "Estimated / observed TTFT (1 is exact)", format: fmtX, series: []series{
				{name: "p10", values: slo(func(o *SLOSummary) float64 { return o.RatioP10 })},
				{name: "p50", values: slo(func(o *SLOSummary) float64 { return o.EstimateRatio.P50 })},
				{name: "p90", values: slo(func(o *SLOSummary) float64 { return o.EstimateRatio.P90 })},
			}},
		}
	default:
		hit := panel{title: "Cache hit rate (cached / prompt tokens)", format: fmtPct, series: []series{{name: "hit rate", values: col(func(m *Summary) float64 { return m.HitRate })}}}
		if s.Oracle != nil {
			hit.ref = &reference{name: "oracle", value: s.Oracle.HitRate}
		}
		c.panels = []panel{
			{title: "Time to first token (" + msUnit + ")", format: fmtNum, series: []series{
				{name: "p50", values: col(func(m *Summary) float64 { return m.TTFT.P50 })},
				{name: "p90", values: col(func(m *Summary) float64 { return m.TTFT.P90 })},
				{name: "p99", values: col(func(m *Summary) float64 { return m.TTFT.P99 })},
			}},
			{title: "Throughput (output tokens " + rate + ")", format: fmtNum, series: []series{{name: "output tok/s", values: col(func(m *Summary) float64 { return m.OutputTokensPerS })}}},
			hit,
			{title: "Load spread (max / mean per engine; 1 is even)", format: fmtX, series: []series{
				{name: "requests", values: col(func(m *Summary) float64 { return m.SpreadRequests })},
				{name: "prefill tokens", values: col(func(m *Summary) float64 { return m.SpreadPrefill })},
			}},
		}
	}
	return c
}
