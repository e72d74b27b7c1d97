package report

import (
	"math"
	"slices"
)

// Percentiles are the p50, p90 and p99 of a set of values and their mean, in milliseconds
// for latencies. N is the number of values; with none, every figure is 0.
type Percentiles struct {
	N    int     `json:"n"`
	P50  float64 `json:"p50"`
	P90  float64 `json:"p90"`
	P99  float64 `json:"p99"`
	Mean float64 `json:"mean"`
}

// Percentile returns the nearest-rank p-th percentile (0 < p <= 100) of sorted values: the
// smallest value such that at least p% of the values are at or below it. It returns 0 for
// no values.
func Percentile(sorted []float64, p float64) float64 {
	n := len(sorted)
	if n == 0 {
		return 0
	}
	rank := int(math.Ceil(p / 100 * float64(n)))
	rank = min(max(rank, 1), n)
	return sorted[rank-1]
}

// PercentilesOf sorts values in place and returns their percentiles.
func PercentilesOf(values []float64) Percentiles {
	if len(values) == 0 {
		return Percentiles{}
	}
	slices.Sort(values)
	sum := 0.0
	for _, v := range values {
		sum += v
	}
	return Percentiles{
		N:    len(values),
		P50:  Percentile(values, 50),
		P90:  Percentile(values, 90),
		P99:  Percentile(values, 99),
		Mean: sum / float64(len(values)),
	}
}

// HitRate is cached / prompt tokens, or 0 without prompt tokens.
func HitRate(cached, prompt int64) float64 {
	if prompt <= 0 {
		return 0
	}
	return float64(cached) / float64(prompt)
}

// Spread is max/mean of per-engine loads: 1 is perfectly even, len(loads) is everything on
// one engine. It returns 0 when every load is 0 (or there are none).
func Spread(loads []float64) float64 {
	if len(loads) == 0 {
		return 0
	}
	sum, peak := 0.0, 0.0
	for _, v := range loads {
		sum += v
		peak = max(peak, v)
	}
	if sum <= 0 {
		return 0
	}
	return peak / (sum / float64(len(loads)))
}
