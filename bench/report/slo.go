package report

import (
	"math"
	"time"

	"switchyard/bench/loadgen"
)

// SLOSummary is what a row of the slo scenario reports beside its Summary: how many
// requests met their time-to-first-token target, and how the router's TTFT estimates (made
// at dispatch, returned in a response header) compare with the TTFT observed. Latencies are
// in milliseconds and rates per second, in the row's time base.
type SLOSummary struct {
	// TargetTTFTMs is the requests' TTFT target.
	TargetTTFTMs float64 `json:"target_ttft_ms"`
	// Met counts the requests that succeeded within the target; Attainment is Met over every
	// request sent (a failed request misses).
	Met        int     `json:"met"`
	Attainment float64 `json:"attainment"`
	// GoodputPerS is Met per second of the run.
	GoodputPerS float64 `json:"goodput_per_s"`
	// Buckets counts the successful requests by the bucket the router chose.
	Buckets map[string]int `json:"buckets,omitempty"`
	// Estimated is the percentiles of the estimates of the successful requests that carried
	// one, and EstimateRatio those of their estimated / observed TTFT (1 is exact).
	Estimated     Percentiles `json:"estimated_ttft_ms"`
	EstimateRatio Percentiles `json:"estimate_ratio"`
	// RatioP10 is the 10th percentile of the ratio (the percentiles above hold the upper
	// tail); Within30 is the fraction of estimates within ±30% of their observation.
	RatioP10 float64 `json:"estimate_ratio_p10"`
	Within30 float64 `json:"within_30pct"`
	// MedianError is the estimates' median over the observed median of the same requests,
	// minus 1: the error of the estimated TTFT p50 against the observed p50.
	MedianError float64 `json:"median_error"`
}

// SummarizeSLO judges results against a TTFT target (wall time) and compares their
// estimates with their observed TTFT. scale and elapsed are as in SummaryOptions.
func SummarizeSLO(results []loadgen.Result, target time.Duration, scale float64, elapsed time.Duration) *SLOSummary {
	if !(scale > 0) {
		scale = 1
	}
	ms := func(d time.Duration) float64 { return float64(d) * scale / float64(time.Millisecond) }
	s := &SLOSummary{TargetTTFTMs: ms(target)}
	var est, obs, ratio []float64
	within := 0
	for i := range results {
		r := &results[i]
		if !r.OK() {
			continue
		}
		if s.Buckets == nil {
			s.Buckets = map[string]int{}
		}
		s.Buckets[r.Bucket]++
		if r.TTFT > 0 && r.TTFT <= target {
			s.Met++
		}
		if r.EstimatedTTFT > 0 && r.TTFT > 0 {
			q := float64(r.EstimatedTTFT) / float64(r.TTFT)
			est, obs, ratio = append(est, ms(r.EstimatedTTFT)), append(obs, ms(r.TTFT)), append(ratio, q)
			if math.Abs(q-1) <= 0.3 {
				within++
			}
		}
	}
	if len(results) > 0 {
		s.Attainment = float64(s.Met) / float64(len(results))
	}
	if sec := elapsed.Seconds() * scale; sec > 0 {
		s.GoodputPerS = float64(s.Met) / sec
	}
	if len(ratio) > 0 {
		s.Within30 = float64(within) / float64(len(ratio))
		s.Estimated = PercentilesOf(est)
		observed := PercentilesOf(obs)
		if observed.P50 > 0 {
			s.MedianError = s.Estimated.P50/observed.P50 - 1
		}
		s.EstimateRatio = PercentilesOf(ratio)
		s.RatioP10 = Percentile(ratio, 10) // ratio is sorted now
	}
	return s
}
