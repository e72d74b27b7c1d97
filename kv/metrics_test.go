package kv

import (
	"strings"
	"testing"

	"github.com/VictoriaMetrics/metrics"

	"switchyard/load/series/seriestest"
)

// TestLookupDurationExposition: switchyard_kv_lookup_duration_seconds (lock-free
// series.Histograms, one per source kind) is exposed byte for byte as
// metrics.PrometheusHistogram exposes the same observations.
func TestLookupDurationExposition(t *testing.T) {
	set := metrics.NewSet()
	m := NewMetrics(set)
	// Binary fractions: the sums are exact whatever order the histogram's shards are added in.
	obs := map[string][]float64{
		metricLookupDuration + `{source="local"}`:  {0x1p-17, 0x1p-14, 0x1p-12, 2},
		metricLookupDuration + `{source="remote"}`: {0x3p-6, 0x3p-5, 0.25},
	}
	for k := range numSourceKinds {
		for _, v := range obs[metricLookupDuration+`{source="`+sourceKindNames[k]+`"}`] {
			m.lookups[k].seconds.Update(v)
		}
	}
	got, want := seriestest.FamilyLines(set, metricLookupDuration), seriestest.PrometheusLines(metricLookupDuration, lookupBuckets, obs)
	if strings.Count(want, "_count{") != 2 {
		t.Fatalf("the reference lacks the series:\n%s", want)
	}
	if got != want {
		t.Fatalf("exposition differs:\n got:\n%s\nwant:\n%s", got, want)
	}
}
