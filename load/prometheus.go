package load

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
)

// Engine flavours, as a /metrics page reveals them by its metric names.
const (
	FlavorVLLM   = "vllm"
	FlavorSGLang = "sglang"
)

// DefaultMetricsPath is the route of an engine's Prometheus text exposition.
const DefaultMetricsPath = "/metrics"

// The series the router reads from a Prometheus page. Every other line of the page is
// skipped before parsing (see promFilter).
const (
	vllmRunning       = "vllm:num_requests_running"
	vllmWaiting       = "vllm:num_requests_waiting"
	vllmKVUsage       = "vllm:kv_cache_usage_perc"
	vllmGPUUsage      = "vllm:gpu_cache_usage_perc" // the older name of kv_cache_usage_perc
	vllmCacheConfig   = "vllm:cache_config_info"
	vllmPreemptions   = "vllm:num_preemptions_total"
	vllmPrefixQueries = "vllm:prefix_cache_queries_total"
	vllmPrefixHits    = "vllm:prefix_cache_hits_total"

	sglRunning  = "sglang:num_running_reqs"
	sglWaiting  = "sglang:num_queue_reqs"
	sglUsed     = "sglang:num_used_tokens"
	sglUsage    = "sglang:token_usage"
	sglCapacity = "sglang:max_total_num_tokens"
	sglHitRate  = "sglang:cache_hit_rate"
)

// promKept reports whether name is one of the metrics the router reads.
func promKept(name []byte) bool {
	switch string(name) {
	case vllmRunning, vllmWaiting, vllmKVUsage, vllmGPUUsage, vllmCacheConfig, vllmPreemptions,
		vllmPrefixQueries, vllmPrefixHits,
		sglRunning, sglWaiting, sglUsed, sglUsage, sglCapacity, sglHitRate:
		return true
	}
	return false
}

// MaxPromSeries bounds the series of the kept metrics one page may carry (DP ranks × models
// × the few metrics read); a page with more is malformed.
const MaxPromSeries = 4096

// PrometheusInfo is what a /metrics page says beyond the per-rank load reports.
type PrometheusInfo struct {
	// Flavor is FlavorVLLM or FlavorSGLang, chosen by the page's metric names.
	Flavor string
	// Model is the model_name whose series were read ("" when the series carry none).
	Model string
	// Preemptions is vllm:num_preemptions_total summed over the ranks (vLLM), or -1 when
	// not exposed.
	Preemptions int64
	// CacheHitRate is the prefix-cache hit rate, 0..1: vLLM's prefix_cache_hits_total over
	// prefix_cache_queries_total (since start), SGLang's cache_hit_rate; -1 when not exposed.
	CacheHitRate float64
}

// promFilter appends to dst the lines of body that carry a sample of a metric promKept names and
// returns it. Comments (HELP, TYPE) and every other metric are dropped unread: the parser
// then sees a dozen lines instead of hundreds, and a broken line of a metric the router
// does not read cannot spoil the page.
func promFilter(dst, body []byte) []byte {
	for len(body) > 0 {
		line := body
		if i := bytes.IndexByte(body, '\n'); i >= 0 {
			line, body = body[:i+1], body[i+1:]
		} else {
			body = nil
		}
		// Fast path: most lines are comments or other metrics' samples.
		if len(line) < len("vllm:x") || (line[0] != 'v' && line[0] != 's') {
			continue
		}
		end := bytes.IndexAny(line, "{ \t")
		if end < 0 {
			continue
		}
		if !promKept(line[:end]) {
			continue
		}
		dst = append(dst, line...)
		if line[len(line)-1] != '\n' {
			dst = append(dst, '\n')
		}
	}
	return dst
}

// promSeries is one kept sample: its metric, its labels and its value.
type promSeries struct {
	name   string
	labels []*dto.LabelPair
	value  float64
}

func (s *promSeries) label(name string) (string, bool) {
	for _, l := range s.labels {
		if l.GetName() == name {
			return l.GetValue(), true
		}
	}
	return "", false
}

// DecodePrometheus reads an engine's Prometheus text exposition (a /metrics page of vLLM or
// SGLang) into one RankReport per data-parallel rank, captured at receivedAt.
//
// The flavour is chosen by the metric names: vLLM's when any vllm: series the router reads
// is present, else SGLang's. When the series name more than one model_name, only those of
// model are read (an error when model is empty or absent from the page). Ranks are told
// apart by the engine label (vLLM) or the dp_rank label (SGLang), numbered 0.. in ascending
// label order; SGLang's tp_rank > 0 duplicates are skipped.
//
// vLLM: Running and Waiting are num_requests_running and num_requests_waiting; the KV
// capacity is cache_config_info's kv_cache_size_tokens label, else num_gpu_blocks ×
// block_size; UsedTokens is kv_cache_usage_perc (older: gpu_cache_usage_perc) × capacity.
// SGLang: num_running_reqs, num_queue_reqs, num_used_tokens (else token_usage × capacity)
// and max_total_num_tokens.
// The reports are native (pressure may be compared) when running, waiting and a positive
// capacity are all known; neither flavour exposes waiting uncached tokens.
//
// Values must be finite and non-negative. An error wraps ErrMalformed and names what is
// wrong: a page that does not parse, holds none of the metrics, or a bad value.
func DecodePrometheus(body []byte, model string, receivedAt time.Time) ([]RankReport, PrometheusInfo, error) {
	var scratch [4096]byte
	return decodePrometheus(promFilter(scratch[:0], body), model, receivedAt)
}

func decodePrometheus(kept []byte, model string, receivedAt time.Time) ([]RankReport, PrometheusInfo, error) {
	info := PrometheusInfo{Preemptions: -1, CacheHitRate: -1}
	if len(kept) == 0 {
		return nil, info, promErr(errors.New("none of the vllm: or sglang: load metrics is exposed"))
	}
	var p expfmt.TextParser
	fams, err := p.TextToMetricFamilies(bytes.NewReader(kept))
	if err != nil {
		return nil, info, promErr(err)
	}
	var series []promSeries
	for name, f := range fams {
		for _, m := range f.GetMetric() {
			if len(series) >= MaxPromSeries {
				return nil, info, promErr(fmt.Errorf("more than %d series", MaxPromSeries))
			}
			v := m.GetUntyped().GetValue()
			if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
				lbl := ""
				if len(m.GetLabel()) > 0 {
					lbl = fmt.Sprintf("%v", m.GetLabel())
				}
				return nil, info, promErr(fmt.Errorf("%s%s: value %v is not a finite non-negative number", name, lbl, v))
			}
			series = append(series, promSeries{name: name, labels: m.GetLabel(), value: v})
		}
	}
	info.Flavor = FlavorSGLang
	for i := range series {
		if series[i].name[0] == 'v' && series[i].name != vllmCacheConfig {
			info.Flavor = FlavorVLLM
			break
		}
	}
	if series, info.Model, err = filterModel(series, model); err != nil {
		return nil, info, promErr(err)
	}
	var reps []RankReport
	if info.Flavor == FlavorVLLM {
		reps, err = vllmReports(series, &info)
	} else {
		reps, err = sglangReports(series, &info)
	}
	if err != nil {
		return nil, info, promErr(err)
	}
	for i := range reps {
		reps[i].At = receivedAt
	}
	return reps, info, nil
}

func promErr(err error) error {
	return fmt.Errorf("cannot decode Prometheus metrics: %w: %w", ErrMalformed, err)
}

// filterModel keeps the series of model when the page names several models (series without
// a model_name label are kept: vLLM's cache_config_info carries none).
func filterModel(series []promSeries, model string) ([]promSeries, string, error) {
	var models []string
	for i := range series {
		if m, ok := series[i].label("model_name"); ok && !slices.Contains(models, m) {
			models = append(models, m)
		}
	}
	switch {
	case len(models) == 0:
		return series, "", nil
	case len(models) == 1:
		return series, models[0], nil
	case model == "" || !slices.Contains(models, model):
		slices.Sort(models)
		return nil, "", fmt.Errorf("the page serves models %q and none is %q", models, model)
	}
	out := series[:0]
	for _, s := range series {
		if m, ok := s.label("model_name"); !ok || m == model {
			out = append(out, s)
		}
	}
	return out, model, nil
}

// rankKeys returns the distinct values of label over the series of names, sorted
// numerically when they all are numbers; a series without the label counts as "".
func rankKeys(series []promSeries, label string, names ...string) []string {
	var keys []string
	for i := range series {
		if !slices.Contains(names, series[i].name) {
			continue
		}
		k, _ := series[i].label(label)
		if !slices.Contains(keys, k) {
			keys = append(keys, k)
		}
	}
	slices.SortFunc(keys, func(a, b string) int {
		x, errA := strconv.Atoi(a)
		y, errB := strconv.Atoi(b)
		if errA == nil && errB == nil {
			return x - y
		}
		if a < b {
			return -1
		}
		if a > b {
			return 1
		}
		return 0
	})
	return keys
}

// promInt converts a gauge value to a count.
func promInt(v float64) int64 {
	if v >= math.MaxInt64 {
		return math.MaxInt64
	}
	return int64(math.Round(v))
}

// vllmReports maps vLLM's series onto reports, one per engine label.
func vllmReports(series []promSeries, info *PrometheusInfo) ([]RankReport, error) {
	keys := rankKeys(series, "engine", vllmRunning, vllmWaiting, vllmKVUsage, vllmGPUUsage)
	if len(keys) == 0 {
		return nil, errors.New("no vllm:num_requests_running, num_requests_waiting or kv_cache_usage_perc series")
	}
	if len(keys) > MaxRanks {
		return nil, fmt.Errorf("%d engines, more than %d", len(keys), MaxRanks)
	}
	reps := make([]RankReport, len(keys))
	usage := make([]float64, len(keys))
	hasUsage := make([]bool, len(keys))
	var hits, queries float64
	var hasHits, hasQueries bool
	var preempt float64
	var hasPreempt bool
	var capAll int64 // capacity of a cache_config_info without an engine label
	capOf := map[string]int64{}
	for i := range series {
		s := &series[i]
		eng, _ := s.label("engine")
		r := slices.Index(keys, eng)
		switch s.name {
		case vllmRunning:
			if r >= 0 {
				reps[r].Running, reps[r].Fields = promInt(s.value), reps[r].Fields|HasRunning
			}
		case vllmWaiting:
			if r >= 0 {
				reps[r].Waiting, reps[r].Fields = promInt(s.value), reps[r].Fields|HasWaiting
			}
		case vllmKVUsage:
			if r >= 0 {
				usage[r], hasUsage[r] = s.value, true
			}
		case vllmGPUUsage:
			if r >= 0 && !hasUsage[r] {
				usage[r], hasUsage[r] = s.value, true
			}
		case vllmCacheConfig:
			c := cacheConfigCapacity(s)
			if c <= 0 {
				continue
			}
			if e, ok := s.label("engine"); ok && e != "" {
				capOf[e] = c
			} else {
				capAll = c
			}
		case vllmPreemptions:
			preempt, hasPreempt = preempt+s.value, true
		case vllmPrefixHits:
			hits, hasHits = hits+s.value, true
		case vllmPrefixQueries:
			queries, hasQueries = queries+s.value, true
		}
	}
	for r, k := range keys {
		rep := &reps[r]
		rep.DPRank = r
		c, ok := capOf[k]
		if !ok {
			c = capAll
		}
		if c > 0 {
			rep.MaxTotalTokens = c
			rep.Fields |= HasCapacity
			if hasUsage[r] {
				rep.UsedTokens = promInt(min(usage[r], 1) * float64(c))
				rep.Fields |= HasUsedTokens
			}
		}
		if rep.Has(HasRunning | HasWaiting | HasCapacity) {
			rep.Fields |= HasNative
		}
	}
	if hasPreempt {
		info.Preemptions = promInt(preempt)
	}
	if hasHits && hasQueries && queries > 0 {
		info.CacheHitRate = min(hits/queries, 1)
	}
	return reps, nil
}

// cacheConfigCapacity is the KV capacity in tokens a vllm:cache_config_info series states,
// or 0: its kv_cache_size_tokens label, else num_gpu_blocks × block_size. Values such as
// "None" count as absent.
func cacheConfigCapacity(s *promSeries) int64 {
	num := func(label string) int64 {
		v, ok := s.label(label)
		if !ok {
			return 0
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			return 0
		}
		return n
	}
	if c := num("kv_cache_size_tokens"); c > 0 {
		return c
	}
	blocks, size := num("num_gpu_blocks"), num("block_size")
	if blocks <= 0 || size <= 0 || blocks > math.MaxInt64/size {
		return 0
	}
	return blocks * size
}

// sglangReports maps SGLang's series onto reports, one per dp_rank label.
func sglangReports(series []promSeries, info *PrometheusInfo) ([]RankReport, error) {
	// Only TP rank 0 (the lowest present) speaks for its DP rank.
	tp := ""
	if tps := rankKeys(series, "tp_rank", sglRunning, sglWaiting, sglUsed, sglCapacity); len(tps) > 0 {
		tp = tps[0]
	}
	var kept []promSeries
	for _, s := range series {
		if t, _ := s.label("tp_rank"); t == tp {
			kept = append(kept, s)
		}
	}
	keys := rankKeys(kept, "dp_rank", sglRunning, sglWaiting, sglUsed)
	if len(keys) == 0 {
		return nil, errors.New("no sglang:num_running_reqs, num_queue_reqs or num_used_tokens series")
	}
	if len(keys) > MaxRanks {
		return nil, fmt.Errorf("%d DP ranks, more than %d", len(keys), MaxRanks)
	}
	reps := make([]RankReport, len(keys))
	usage := make([]float64, len(keys))
	hasUsage := make([]bool, len(keys))
	var hitSum float64
	hitN := 0
	for i := range kept {
		s := &kept[i]
		dp, _ := s.label("dp_rank")
		r := slices.Index(keys, dp)
		if r < 0 {
			if s.name == sglHitRate {
				hitSum, hitN = hitSum+s.value, hitN+1
			}
			continue
		}
		rep := &reps[r]
		switch s.name {
		case sglRunning:
			rep.Running, rep.Fields = promInt(s.value), rep.Fields|HasRunning
		case sglWaiting:
			rep.Waiting, rep.Fields = promInt(s.value), rep.Fields|HasWaiting
		case sglUsed:
			rep.UsedTokens, rep.Fields = promInt(s.value), rep.Fields|HasUsedTokens
		case sglCapacity:
			if c := promInt(s.value); c > 0 {
				rep.MaxTotalTokens, rep.Fields = c, rep.Fields|HasCapacity
			}
		case sglUsage:
			usage[r], hasUsage[r] = s.value, true
		case sglHitRate:
			hitSum, hitN = hitSum+s.value, hitN+1
		}
	}
	for r := range reps {
		reps[r].DPRank = r
		if !reps[r].Has(HasUsedTokens) && hasUsage[r] && reps[r].Has(HasCapacity) {
			reps[r].UsedTokens = promInt(min(usage[r], 1) * float64(reps[r].MaxTotalTokens))
			reps[r].Fields |= HasUsedTokens
		}
		if reps[r].Has(HasRunning | HasWaiting | HasCapacity) {
			reps[r].Fields |= HasNative
		}
	}
	if hitN > 0 {
		info.CacheHitRate = min(hitSum/float64(hitN), 1)
	}
	return reps, nil
}
