package mockengine

import (
	"strconv"
	"strings"

	"github.com/valyala/fasthttp"

	"switchyard/load"
)

// labelEscaper escapes a Prometheus label value.
var labelEscaper = strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`)

// promWriter appends Prometheus text exposition (format 0.0.4) the way Python's
// prometheus_client writes it: HELP and TYPE once per family, then one line per series.
type promWriter struct{ b []byte }

func (w *promWriter) family(name, typ, help string) {
	w.b = append(w.b, "# HELP "...)
	w.b = append(w.b, name...)
	w.b = append(w.b, ' ')
	w.b = append(w.b, help...)
	w.b = append(w.b, "\n# TYPE "...)
	w.b = append(w.b, name...)
	w.b = append(w.b, ' ')
	w.b = append(w.b, typ...)
	w.b = append(w.b, '\n')
}

// sample writes name{labels} value; labels alternate names and values.
func (w *promWriter) sample(name string, v float64, labels ...string) {
	w.b = append(w.b, name...)
	if len(labels) > 0 {
		w.b = append(w.b, '{')
		for i := 0; i+1 < len(labels); i += 2 {
			if i > 0 {
				w.b = append(w.b, ',')
			}
			w.b = append(w.b, labels[i]...)
			w.b = append(w.b, `="`...)
			w.b = append(w.b, labelEscaper.Replace(labels[i+1])...)
			w.b = append(w.b, '"')
		}
		w.b = append(w.b, '}')
	}
	w.b = append(w.b, ' ')
	w.b = strconv.AppendFloat(w.b, v, 'f', -1, 64)
	if v == float64(int64(v)) {
		w.b = append(w.b, ".0"...)
	}
	w.b = append(w.b, '\n')
}

// serveMetrics answers GET /metrics with the flavour's Prometheus names, updated from the
// simulator's state: one series per DP rank.
func (e *Engine) serveMetrics(ctx *fasthttp.RequestCtx) {
	reps, extras := e.reports()
	var w promWriter
	if e.cfg.Flavor == FlavorVLLM {
		e.vllmMetrics(&w, reps, extras)
	} else {
		e.sglangMetrics(&w, reps, extras)
	}
	ctx.SetStatusCode(fasthttp.StatusOK)
	ctx.SetContentType("text/plain; version=0.0.4; charset=utf-8")
	ctx.Response.SetBodyRaw(w.b)
}

// vllmMetrics writes vLLM's scheduler, cache and token metrics, labelled model_name and
// engine (the DP rank), and cache_config_info with the KV capacity in blocks.
func (e *Engine) vllmMetrics(w *promWriter, reps []load.RankReport, x []rankExtra) {
	model := e.cfg.Model
	series := func(name, typ, help string, value func(i int) float64) {
		w.family(name, typ, help)
		for i := range reps {
			w.sample(name, value(i), "model_name", model, "engine", strconv.Itoa(i))
		}
	}
	series("vllm:num_requests_running", "gauge", "Number of requests in model execution batches.",
		func(i int) float64 { return float64(reps[i].Running) })
	series("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.",
		func(i int) float64 { return float64(reps[i].Waiting) })
	series("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.",
		func(i int) float64 { return min(float64(reps[i].UsedTokens)/float64(reps[i].MaxTotalTokens), 1) })
	series("vllm:num_preemptions_total", "counter", "Cumulative number of preemption from the engine.",
		func(int) float64 { return 0 })
	series("vllm:prefix_cache_queries_total", "counter", "Prefix cache queries, in terms of number of queried tokens.",
		func(i int) float64 { return float64(x[i].promptTokens) })
	series("vllm:prefix_cache_hits_total", "counter", "Prefix cache hits, in terms of number of cached tokens.",
		func(i int) float64 { return float64(x[i].cachedTokens) })
	series("vllm:prompt_tokens_total", "counter", "Number of prefill tokens processed.",
		func(i int) float64 { return float64(x[i].promptTokens - x[i].cachedTokens) })
	series("vllm:generation_tokens_total", "counter", "Number of generation tokens processed.",
		func(i int) float64 { return float64(x[i].genTokens) })
	w.family("vllm:cache_config_info", "gauge", "Information of the LLMEngine CacheConfig")
	for i := range reps {
		w.sample("vllm:cache_config_info", 1, "block_size", strconv.Itoa(e.cfg.PageSize), "cache_dtype", "auto",
			"enable_prefix_caching", "True", "engine", strconv.Itoa(i), "gpu_memory_utilization", "0.9",
			"num_cpu_blocks", "None", "num_gpu_blocks", strconv.Itoa(e.cfg.CacheTokens/e.cfg.PageSize))
	}
}

// sglangMetrics writes SGLang's scheduler metrics (as --enable-metrics exposes them),
// labelled model_name and, with data parallelism, dp_rank.
func (e *Engine) sglangMetrics(w *promWriter, reps []load.RankReport, x []rankExtra) {
	labels := func(i int) []string {
		l := []string{"engine_type", "unified", "model_name", e.cfg.Model, "pp_rank", "0", "tp_rank", "0"}
		if len(reps) > 1 {
			l = append(l, "dp_rank", strconv.Itoa(i))
		}
		return l
	}
	series := func(name, typ, help string, value func(i int) float64) {
		w.family(name, typ, help)
		for i := range reps {
			w.sample(name, value(i), labels(i)...)
		}
	}
	series("sglang:num_running_reqs", "gauge", "The number of running requests.",
		func(i int) float64 { return float64(reps[i].Running) })
	series("sglang:num_queue_reqs", "gauge", "The number of requests in the waiting queue.",
		func(i int) float64 { return float64(reps[i].Waiting) })
	series("sglang:num_used_tokens", "gauge", "The number of used tokens.",
		func(i int) float64 { return float64(reps[i].UsedTokens) })
	series("sglang:max_total_num_tokens", "gauge", "Maximum total number of tokens in the KV cache pool.",
		func(i int) float64 { return float64(reps[i].MaxTotalTokens) })
	series("sglang:token_usage", "gauge", "The token usage.",
		func(i int) float64 { return min(float64(reps[i].UsedTokens)/float64(reps[i].MaxTotalTokens), 1) })
	series("sglang:cache_hit_rate", "gauge", "The prefix cache hit rate.",
		func(i int) float64 { return x[i].cacheHitRate })
	series("sglang:gen_throughput", "gauge", "The generation throughput (token/s).",
		func(i int) float64 { return x[i].genThroughput })
	series("sglang:prompt_tokens_total", "counter", "Number of prefill tokens processed.",
		func(i int) float64 { return float64(x[i].promptTokens) })
	series("sglang:generation_tokens_total", "counter", "Number of generation tokens processed.",
		func(i int) float64 { return float64(x[i].genTokens) })
	series("sglang:cached_tokens_total", "counter", "Number of cached prompt tokens.",
		func(i int) float64 { return float64(x[i].cachedTokens) })
}
