package report

import (
	"math"
	"testing"
	"time"

	"switchyard/bench/loadgen"
)

func seq(n int) []float64 {
	out := make([]float64, n)
	for i := range out {
		out[i] = float64(i + 1)
	}
	return out
}

func TestPercentile(t *testing.T) {
	tests := []struct {
		name   string
		values []float64
		p      float64
		want   float64
	}{
		{"empty", nil, 50, 0},
		{"one value", []float64{7}, 99, 7},
		{"p50 of 1..100", seq(100), 50, 50},
		{"p90 of 1..100", seq(100), 90, 90},
		{"p99 of 1..100", seq(100), 99, 99},
		{"p100 of 1..100", seq(100), 100, 100},
		{"p50 of 1..10", seq(10), 50, 5},
		{"p90 of 1..10", seq(10), 90, 9},
		{"p99 of 1..10 is the maximum", seq(10), 99, 10},
		{"p50 of two values is the lower", []float64{1, 2}, 50, 1},
		{"p51 of two values is the upper", []float64{1, 2}, 51, 2},
		{"tiny p is the minimum", seq(10), 0.001, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Percentile(tt.values, tt.p); got != tt.want {
				t.Errorf("Percentile(%v, %v) = %v, want %v", tt.values, tt.p, got, tt.want)
			}
		})
	}
}

func TestPercentilesOf(t *testing.T) {
	// Unsorted input; mean 50.5.
	v := seq(100)
	for i, j := 0, len(v)-1; i < j; i, j = i+1, j-1 {
		v[i], v[j] = v[j], v[i]
	}
	got := PercentilesOf(v)
	want := Percentiles{N: 100, P50: 50, P90: 90, P99: 99, Mean: 50.5}
	if got != want {
		t.Errorf("got %+v, want %+v", got, want)
	}
	if got := PercentilesOf(nil); got != (Percentiles{}) {
		t.Errorf("empty: %+v", got)
	}
}

func TestHitRate(t *testing.T) {
	tests := []struct {
		cached, prompt int64
		want           float64
	}{{0, 0, 0}, {0, 100, 0}, {25, 100, 0.25}, {100, 100, 1}, {5, -1, 0}}
	for _, tt := range tests {
		if got := HitRate(tt.cached, tt.prompt); got != tt.want {
			t.Errorf("HitRate(%d, %d) = %v, want %v", tt.cached, tt.prompt, got, tt.want)
		}
	}
}

func TestSpread(t *testing.T) {
	tests := []struct {
		name  string
		loads []float64
		want  float64
	}{
		{"none", nil, 0},
		{"all zero", []float64{0, 0}, 0},
		{"even", []float64{5, 5, 5, 5}, 1},
		{"all on one of four", []float64{8, 0, 0, 0}, 4},
		{"two of four", []float64{4, 4, 0, 0}, 2},
		{"uneven", []float64{3, 1}, 1.5},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Spread(tt.loads); math.Abs(got-tt.want) > 1e-12 {
				t.Errorf("Spread(%v) = %v, want %v", tt.loads, got, tt.want)
			}
		})
	}
}

func ok(worker string, prompt, cached, completion int, ttft, itl, e2e time.Duration) loadgen.Result {
	return loadgen.Result{Status: 200, Worker: worker, PromptTokens: prompt, CachedTokens: cached, CompletionTokens: completion,
		TTFT: ttft, ITL: itl, E2E: e2e}
}

func TestSummarize(t *testing.T) {
	ms := time.Millisecond
	results := []loadgen.Result{
		ok("a", 100, 50, 10, 10*ms, 2*ms, 30*ms),
		ok("a", 100, 100, 10, 20*ms, 2*ms, 40*ms),
		ok("b", 200, 0, 20, 30*ms, 0, 50*ms), // one token or non-streaming: no ITL
		{Status: 429, Error: "overloaded", E2E: ms},
		{Status: 0, Error: "timeout", E2E: 5 * ms},
		ok("stranger", 10, 0, 1, ms, 0, ms),
	}
	s := Summarize(results, SummaryOptions{Workers: []string{"a", "b", "c"}, TimeScale: 2, Elapsed: 500 * ms})
	if s.Requests != 6 || s.OK != 4 || s.ErrorCount() != 2 {
		t.Fatalf("requests %d ok %d errors %d", s.Requests, s.OK, s.ErrorCount())
	}
	if s.ErrorsByStatus["429"] != 1 || s.ErrorsByStatus["timeout"] != 1 || s.ErrorsByCode["overloaded"] != 1 {
		t.Errorf("errors %v %v", s.ErrorsByStatus, s.ErrorsByCode)
	}
	// Simulated time: 0.5 s wall × 2 = 1 s.
	if s.ElapsedS != 1 || s.RequestsPerS != 4 || s.OutputTokensPerS != 41 {
		t.Errorf("elapsed %v req/s %v tok/s %v", s.ElapsedS, s.RequestsPerS, s.OutputTokensPerS)
	}
	// Latencies doubled: TTFT 2, 20, 40, 60 ms.
	if s.TTFT.N != 4 || s.TTFT.P50 != 20 || s.TTFT.P99 != 60 {
		t.Errorf("ttft %+v", s.TTFT)
	}
	if s.ITL.N != 2 || s.ITL.P50 != 4 {
		t.Errorf("itl %+v", s.ITL)
	}
	if s.PromptTokens != 410 || s.CachedTokens != 150 || math.Abs(s.HitRate-150.0/410) > 1e-12 {
		t.Errorf("tokens %d/%d hit %v", s.CachedTokens, s.PromptTokens, s.HitRate)
	}
	// Requests a=2 b=1 c=0: max/mean = 2/1. Prefill tokens a=50 b=200 c=0: 200/83.3.
	if s.SpreadRequests != 2 || math.Abs(s.SpreadPrefill-2.4) > 1e-12 {
		t.Errorf("spread %v %v", s.SpreadRequests, s.SpreadPrefill)
	}
	if s.Unknown != 1 || len(s.Workers) != 3 || s.Workers[2] != (WorkerLoad{Worker: "c"}) {
		t.Errorf("unknown %d workers %+v", s.Unknown, s.Workers)
	}
	if s.SendLate != nil {
		t.Errorf("send lateness %+v without a late request", s.SendLate)
	}
	// An open loop's lateness, failures included, in wall milliseconds (not doubled).
	for i, late := range []time.Duration{1, 2, 3, 4, 5, 40} {
		results[i].Late = late * ms
	}
	s = Summarize(results, SummaryOptions{Workers: []string{"a", "b", "c"}, TimeScale: 2, Elapsed: 500 * ms})
	if want := (Lateness{P50: 3, P99: 40, Max: 40}); s.SendLate == nil || *s.SendLate != want {
		t.Errorf("send lateness %+v, want %+v", s.SendLate, want)
	}
}

func TestSummarizePD(t *testing.T) {
	results := []loadgen.Result{
		{Status: 200, Worker: "d0", PrefillWorker: "p0", PromptTokens: 100, CachedTokens: 0},
		{Status: 200, Worker: "d0", PrefillWorker: "p1", PromptTokens: 100, CachedTokens: 50},
		{Status: 200, Worker: "d1", PrefillWorker: "p1", PromptTokens: 100, CachedTokens: 50},
	}
	s := Summarize(results, SummaryOptions{Workers: []string{"d0", "d1"}, PrefillWorkers: []string{"p0", "p1"}})
	// Requests over decode: 2, 1 → 2/1.5. Prefill tokens over prefill: 100, 100 → 1.
	if math.Abs(s.SpreadRequests-4.0/3) > 1e-12 || s.SpreadPrefill != 1 {
		t.Errorf("spread %v %v", s.SpreadRequests, s.SpreadPrefill)
	}
	if len(s.Workers) != 4 || s.Workers[2].PrefillTokens != 100 || s.Workers[0].Requests != 2 {
		t.Errorf("workers %+v", s.Workers)
	}
}

func TestFilter(t *testing.T) {
	rs := []loadgen.Result{{Class: "a"}, {Class: "b"}, {Class: "a"}}
	got := Filter(rs, func(r *loadgen.Result) bool { return r.Class == "a" })
	if len(got) != 2 || got[0].Class != "a" || got[1].Class != "a" {
		t.Errorf("got %+v", got)
	}
}

func TestSummarizeSLO(t *testing.T) {
	ms := func(v float64) time.Duration { return time.Duration(v * float64(time.Millisecond)) }
	results := []loadgen.Result{
		{Status: 200, TTFT: ms(50), EstimatedTTFT: ms(55), Bucket: "b"},   // met, ratio 1.1
		{Status: 200, TTFT: ms(100), EstimatedTTFT: ms(60), Bucket: "b"},  // met (at the target), ratio 0.6
		{Status: 200, TTFT: ms(150), EstimatedTTFT: ms(150), Bucket: "a"}, // missed, ratio 1
		{Status: 200, TTFT: ms(40), Bucket: "b"},                          // met, no estimate
		{Status: 503, Error: "no_available_engine"},                       // missed
	}
	s := SummarizeSLO(results, ms(100), 2, 2*time.Second)
	if s.TargetTTFTMs != 200 || s.Met != 3 || s.Attainment != 0.6 || s.GoodputPerS != 0.75 {
		t.Fatalf("attainment %+v", s)
	}
	if s.Buckets["a"] != 1 || s.Buckets["b"] != 3 || len(s.Buckets) != 2 {
		t.Fatalf("buckets %v", s.Buckets)
	}
	// Ratios 0.6, 1, 1.1: two of three within ±30%.
	if s.EstimateRatio.N != 3 || s.RatioP10 != 0.6 || s.EstimateRatio.P50 != 1 || math.Abs(s.Within30-2.0/3) > 1e-9 {
		t.Fatalf("ratios %+v p10 %v within %v", s.EstimateRatio, s.RatioP10, s.Within30)
	}
	// Estimated p50 120ms (60 × 2) against observed p50 200ms (100 × 2).
	if s.Estimated.P50 != 120 || math.Abs(s.MedianError-(-0.4)) > 1e-9 {
		t.Fatalf("estimated %+v median error %v", s.Estimated, s.MedianError)
	}
	if e := SummarizeSLO(nil, ms(100), 1, 0); e.Attainment != 0 || e.EstimateRatio.N != 0 {
		t.Fatalf("empty %+v", e)
	}
}
