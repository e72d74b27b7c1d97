package report

import (
	"slices"
	"strconv"
	"time"

	"switchyard/bench/loadgen"
)

// SummaryOptions describe the deployment and the time base of a summary.
type SummaryOptions struct {
	// Workers are the engines that serve requests (plain, or decode of a PD deployment):
	// every one counts in the request spread, including those that served nothing.
	Workers []string
	// PrefillWorkers are the prefill engines of a PD deployment, over which prefill tokens
	// spread. Default: Workers.
	PrefillWorkers []string
	// TimeScale multiplies every wall duration: the engines' speedup, so that latencies and
	// throughput read in simulated time. Default 1 (wall time).
	TimeScale float64
	// Elapsed is the run's wall time, from the first send to the last completion.
	Elapsed time.Duration
}

// WorkerLoad is what one engine did in a run.
type WorkerLoad struct {
	Worker string `json:"worker"`
	// Requests it served (decode engine of a PD pair).
	Requests int `json:"requests"`
	// PrefillTokens it computed: prompt minus cached tokens of the requests it prefilled.
	PrefillTokens int64 `json:"prefill_tokens"`
}

// Summary is the aggregate of one measured run. Durations are in milliseconds and rates per
// second, both in the time base of SummaryOptions.TimeScale.
type Summary struct {
	// Requests were sent; OK succeeded.
	Requests int `json:"requests"`
	OK       int `json:"ok"`
	// ErrorsByStatus counts failures by HTTP status ("429"); failures without a response
	// count under their kind ("transport", "timeout", "truncated").
	ErrorsByStatus map[string]int `json:"errors_by_status,omitempty"`
	// ErrorsByCode counts failures by error code ("overloaded", "no_available_engine").
	ErrorsByCode map[string]int `json:"errors_by_code,omitempty"`
	// ElapsedS is the run's length in seconds.
	ElapsedS float64 `json:"elapsed_s"`
	// RequestsPerS counts successful requests; OutputTokensPerS their completion tokens.
	RequestsPerS     float64 `json:"requests_per_s"`
	OutputTokensPerS float64 `json:"output_tokens_per_s"`
	// TTFT, ITL and E2E are percentiles over successful requests (ITL over those with two
	// or more output tokens), in milliseconds.
	TTFT Percentiles `json:"ttft_ms"`
	ITL  Percentiles `json:"itl_ms"`
	E2E  Percentiles `json:"e2e_ms"`
	// PromptTokens and CachedTokens sum the usage of successful requests; HitRate is their
	// ratio.
	PromptTokens int64   `json:"prompt_tokens"`
	CachedTokens int64   `json:"cached_tokens"`
	HitRate      float64 `json:"hit_rate"`
	// SpreadRequests is max/mean of requests per serving engine; SpreadPrefill max/mean of
	// prefill tokens per (prefill) engine.
	SpreadRequests float64 `json:"spread_requests"`
	SpreadPrefill  float64 `json:"spread_prefill_tokens"`
	// Workers lists every engine's share, in the order of SummaryOptions.
	Workers []WorkerLoad `json:"workers"`
	// Unknown counts successful requests whose engine is not one of the deployment's (or was
	// not named by the response).
	Unknown int `json:"unknown_worker,omitempty"`
	// Bypassed counts, in a prefill/decode deployment (SummaryOptions.PrefillWorkers), the
	// successful requests a decode engine served alone (no prefill engine named).
	Bypassed int `json:"bypassed,omitempty"`
	// SendLate is how late an open-loop run sent its requests (loadgen.Result.Late), over
	// every request sent; nil when none was late (a closed loop).
	SendLate *Lateness `json:"send_late,omitempty"`
}

// Lateness summarizes how late requests were sent, in milliseconds of wall time whatever
// the summary's time base: the load generator's delay, not the fleet's.
type Lateness struct {
	P50 float64 `json:"p50_ms"`
	P99 float64 `json:"p99_ms"`
	Max float64 `json:"max_ms"`
}

// ErrorCount is the number of failed requests.
func (s *Summary) ErrorCount() int { return s.Requests - s.OK }

// Summarize aggregates results.
func Summarize(results []loadgen.Result, o SummaryOptions) *Summary {
	scale := o.TimeScale
	if !(scale > 0) {
		scale = 1
	}
	prefillWorkers := o.PrefillWorkers
	if len(prefillWorkers) == 0 {
		prefillWorkers = o.Workers
	}
	ms := func(d time.Duration) float64 { return float64(d) * scale / float64(time.Millisecond) }

	s := &Summary{Requests: len(results), ElapsedS: o.Elapsed.Seconds() * scale}
	serving := make(map[string]*WorkerLoad, len(o.Workers))
	prefill := make(map[string]*WorkerLoad, len(prefillWorkers))
	for _, w := range o.Workers {
		s.Workers = append(s.Workers, WorkerLoad{Worker: w})
	}
	for _, w := range prefillWorkers {
		if !slices.Contains(o.Workers, w) {
			s.Workers = append(s.Workers, WorkerLoad{Worker: w})
		}
	}
	for i := range s.Workers {
		wl := &s.Workers[i]
		if slices.Contains(o.Workers, wl.Worker) {
			serving[wl.Worker] = wl
		}
		if slices.Contains(prefillWorkers, wl.Worker) {
			prefill[wl.Worker] = wl
		}
	}

	var ttft, itl, e2e, late []float64
	var outTokens int64
	anyLate := false
	for i := range results {
		r := &results[i]
		late = append(late, float64(r.Late)/float64(time.Millisecond))
		anyLate = anyLate || r.Late > 0
		if !r.OK() {
			status := r.Error
			if r.Status != 0 {
				status = strconv.Itoa(r.Status)
			}
			s.ErrorsByStatus = inc(s.ErrorsByStatus, status)
			if r.Error != "" {
				s.ErrorsByCode = inc(s.ErrorsByCode, r.Error)
			}
			continue
		}
		s.OK++
		outTokens += int64(r.CompletionTokens)
		s.PromptTokens += int64(r.PromptTokens)
		s.CachedTokens += int64(r.CachedTokens)
		if r.TTFT > 0 {
			ttft = append(ttft, ms(r.TTFT))
		}
		if r.ITL > 0 {
			itl = append(itl, ms(r.ITL))
		}
		e2e = append(e2e, ms(r.E2E))
		wl, ok := serving[r.Worker]
		if !ok {
			s.Unknown++
		} else {
			wl.Requests++
		}
		pw := r.PrefillWorker
		if pw == "" {
			pw = r.Worker
			if len(o.PrefillWorkers) > 0 {
				s.Bypassed++
			}
		}
		if p, ok := prefill[pw]; ok {
			p.PrefillTokens += int64(r.PromptTokens - r.CachedTokens)
		}
	}
	s.TTFT, s.ITL, s.E2E = PercentilesOf(ttft), PercentilesOf(itl), PercentilesOf(e2e)
	if anyLate {
		p := PercentilesOf(late)
		s.SendLate = &Lateness{P50: p.P50, P99: p.P99, Max: late[len(late)-1]}
	}
	s.HitRate = HitRate(s.CachedTokens, s.PromptTokens)
	if s.ElapsedS > 0 {
		s.RequestsPerS = float64(s.OK) / s.ElapsedS
		s.OutputTokensPerS = float64(outTokens) / s.ElapsedS
	}
	reqs := make([]float64, 0, len(o.Workers))
	for _, w := range o.Workers {
		reqs = append(reqs, float64(serving[w].Requests))
	}
	pre := make([]float64, 0, len(prefillWorkers))
	for _, w := range prefillWorkers {
		pre = append(pre, float64(prefill[w].PrefillTokens))
	}
	s.SpreadRequests, s.SpreadPrefill = Spread(reqs), Spread(pre)
	return s
}

func inc(m map[string]int, k string) map[string]int {
	if m == nil {
		m = make(map[string]int)
	}
	m[k]++
	return m
}

// Filter returns the results keep accepts, in order.
func Filter(results []loadgen.Result, keep func(*loadgen.Result) bool) []loadgen.Result {
	out := make([]loadgen.Result, 0, len(results))
	for i := range results {
		if keep(&results[i]) {
			out = append(out, results[i])
		}
	}
	return out
}
