package engine

import (
	"strings"
	"testing"

	"github.com/VictoriaMetrics/metrics"

	"switchyard/load/series/seriestest"
)

// TestMatchedTokensExposition: switchyard_cache_aware_matched_tokens (a lock-free
// series.Histogram) is exposed byte for byte as metrics.PrometheusHistogram exposes the same
// observations: name, bounds, sum and count.
func TestMatchedTokensExposition(t *testing.T) {
	const family = `switchyard_cache_aware_matched_tokens`
	set := metrics.NewSet()
	m := NewCacheAwareMetrics(set)
	obs := []float64{0, 16, 64, 65, 1024, 3000, 262144, 262145, 1 << 30}
	for _, v := range obs {
		m.matched.Update(v)
	}
	got, want := seriestest.FamilyLines(set, family), seriestest.PrometheusLines(family, matchedTokenBuckets, map[string][]float64{family: obs})
	if strings.Count(want, "_bucket") != len(matchedTokenBuckets)+1 {
		t.Fatalf("the reference lacks the series:\n%s", want)
	}
	if got != want {
		t.Fatalf("exposition differs:\n got:\n%s\nwant:\n%s", got, want)
	}
}
