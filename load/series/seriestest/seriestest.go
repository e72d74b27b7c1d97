// Package seriestest holds test helpers for the router's metric series: the lines of one
// histogram family in a set's exposition, and the lines metrics.PrometheusHistogram gives
// for the same observations, to check that a series.Histogram family is exposed byte for
// byte as the type it replaced. For tests only.
package seriestest

import (
	"bytes"
	"strings"

	"github.com/VictoriaMetrics/metrics"
)

// FamilyLines returns the lines of histogram family's series (_bucket, _sum, _count) in
// set's Prometheus exposition, in order.
func FamilyLines(set *metrics.Set, family string) string {
	var text bytes.Buffer
	set.WritePrometheus(&text)
	var b strings.Builder
	for line := range strings.Lines(text.String()) {
		for _, suffix := range []string{"_bucket", "_sum", "_count"} {
			if rest, ok := strings.CutPrefix(line, family+suffix); ok && rest != "" && (rest[0] == '{' || rest[0] == ' ') {
				b.WriteString(line)
			}
		}
	}
	return b.String()
}

// PrometheusLines returns FamilyLines of metrics.PrometheusHistogram series of family with
// upper bounds bounds, one per name (family{labels}) holding its observations.
func PrometheusLines(family string, bounds []float64, obs map[string][]float64) string {
	ref := metrics.NewSet()
	for name, vs := range obs {
		h := ref.NewPrometheusHistogramExt(name, bounds)
		for _, v := range vs {
			h.Update(v)
		}
	}
	return FamilyLines(ref, family)
}
