package grafana

import "fmt"

// Matchers every query starts from: the selected router instances, and models.
const (
	inst      = `instance=~"$instance"`
	instModel = `instance=~"$instance",model=~"$model"`
	// served are the inference requests of the selected models ("none" is the
	// non-inference routes, "unknown" requests naming no configured model).
	served = `instance=~"$instance",model=~"$model",model!="none"`
)

// rate is the per-second rate of a counter over the dashboard's rate interval.
func rate(metric, matchers string) string {
	return fmt.Sprintf(`rate(%s{%s}[$__rate_interval])`, metric, matchers)
}

// sumRate sums rate by the given labels ("" for a single series).
func sumRate(by, metric, matchers string) string {
	if by == "" {
		return "sum(" + rate(metric, matchers) + ")"
	}
	return fmt.Sprintf("sum by (%s) (%s)", by, rate(metric, matchers))
}

// quantiles are the p50, p90 and p99 of a classic histogram (name without _bucket), grouped
// by extra labels when given.
func quantiles(histogram, matchers, by, legend string) []Query {
	group := "le"
	if by != "" {
		group = "le, " + by
	}
	var qs []Query
	for _, q := range []struct{ v, name string }{{"0.5", "p50"}, {"0.9", "p90"}, {"0.99", "p99"}} {
		qs = append(qs, Query{
			Expr:   fmt.Sprintf("histogram_quantile(%s, sum by (%s) (%s))", q.v, group, rate(histogram+"_bucket", matchers)),
			Legend: q.name + legend,
		})
	}
	return qs
}

func ptr(f float64) *float64 { return &f }

// Switchyard is the dashboard.
var Switchyard = Dashboard{
	UID:   "switchyard",
	Title: "Switchyard",
	Description: "Switchyard LLM inference router: traffic, latency, engine selection, engines, " +
		"the KV-cache index and the process. Generated from deploy/grafana/panels.go.",
	Tags: []string{"switchyard", "llm", "inference"},
	Rows: []Row{
		{Title: "Overview", Panels: []Panel{
			{Title: "Requests / s", Kind: Stat, Unit: "reqps", Width: 4, Height: 4,
				Description: "Inference requests per second over the selected routers and models.",
				Queries:     []Query{{Expr: sumRate("", "switchyard_requests_total", served), Legend: "requests"}}},
			{Title: "5xx ratio", Kind: Stat, Unit: "percentunit", Width: 4, Height: 4,
				Description: "Share of inference responses with a 5xx status (router and engine errors).",
				Queries: []Query{{Expr: sumRate("", "switchyard_responses_total", instModel+`,status=~"5.."`) + " / " +
					sumRate("", "switchyard_responses_total", instModel), Legend: "5xx"}}},
			{Title: "In flight", Kind: Stat, Unit: "short", Width: 4, Height: 4,
				Description: "Requests the routers are serving now.",
				Queries:     []Query{{Expr: "sum(switchyard_inflight_requests{" + inst + "})", Legend: "in flight"}}},
			{Title: "Breakers not closed", Kind: Stat, Unit: "short", Width: 4, Height: 4,
				Description: "Engines whose circuit breaker is open or half-open on some router.",
				Queries:     []Query{{Expr: "count(max by (worker) (switchyard_worker_breaker_state{" + inst + "}) > 0) or vector(0)", Legend: "breakers"}}},
			{Title: "Routers by version", Kind: Stat, Unit: "short", Width: 8, Height: 4,
				Description: "Router replicas per build (switchyard version): a rollout in progress shows two.",
				Queries:     []Query{{Expr: "count by (version, revision) (switchyard_build_info{" + inst + "})", Legend: "{{version}}"}}},
		}},
		{Title: "Traffic", Panels: []Panel{
			{Title: "Requests by model", Unit: "reqps", Stack: true,
				Description: "Inference requests per second by model (unknown: the request named no configured model).",
				Queries:     []Query{{Expr: sumRate("model", "switchyard_requests_total", served), Legend: "{{model}}"}}},
			{Title: "Responses by status", Unit: "reqps", Stack: true,
				Description: "Inference responses per second by HTTP status. An engine's own error status is passed through; see the README's error table for the router's codes.",
				Queries:     []Query{{Expr: sumRate("status", "switchyard_responses_total", instModel), Legend: "{{status}}"}}},
			{Title: "Error ratio by model", Unit: "percentunit",
				Description: "Share of each model's responses with a 5xx and with a 4xx status.",
				Queries: []Query{
					{Expr: sumRate("model", "switchyard_responses_total", instModel+`,status=~"5.."`) + " / " +
						sumRate("model", "switchyard_responses_total", instModel), Legend: "{{model}} 5xx"},
					{Expr: sumRate("model", "switchyard_responses_total", instModel+`,status=~"4.."`) + " / " +
						sumRate("model", "switchyard_responses_total", instModel), Legend: "{{model}} 4xx"},
				}},
			{Title: "In flight by router", Unit: "short",
				Description: "Requests each router is serving, streams included.",
				Queries:     []Query{{Expr: "sum by (instance) (switchyard_inflight_requests{" + inst + "})", Legend: "{{instance}}"}}},
			{Title: "Client disconnects", Unit: "ops",
				Description: "Clients that left before their answer was complete, per second.",
				Queries:     []Query{{Expr: sumRate("instance", "switchyard_client_disconnects_total", inst), Legend: "{{instance}}"}}},
			{Title: "Stale in-flight guards released", Unit: "ops",
				Description: "In-flight guards released by load.guard_max_age instead of by their request: should stay at zero.",
				Queries:     []Query{{Expr: sumRate("instance", "switchyard_stale_guards_released_total", inst), Legend: "{{instance}}"}}},
		}},
		{Title: "Latency", Panels: []Panel{
			{Title: "Time to first token", Unit: "s", Width: 12,
				Description: "Time from the request's arrival to the first token sent to the client (p50, p90, p99 over the selected models).",
				Queries:     quantiles("switchyard_time_to_first_token_seconds", instModel, "", "")},
			{Title: "Request duration", Unit: "s", Width: 12,
				Description: "End-to-end request duration, streams included (p50, p90, p99).",
				Queries:     quantiles("switchyard_request_duration_seconds", instModel, "", "")},
			{Title: "Time to first token p99 by model", Unit: "s", Width: 12,
				Description: "p99 time to first token of each model.",
				Queries:     quantiles("switchyard_time_to_first_token_seconds", instModel, "model", " {{model}}")[2:]},
			{Title: "Request duration p99 by model", Unit: "s", Width: 12,
				Description: "p99 request duration of each model.",
				Queries:     quantiles("switchyard_request_duration_seconds", instModel, "model", " {{model}}")[2:]},
		}},
		{Title: "Admission: concurrency limits, queues, rate limits", Panels: []Panel{
			{Title: "Requests under a concurrency limit", Unit: "short",
				Description: "Slots held under each concurrency limit (server.max_concurrent_requests, models.<name>.max_concurrent_requests). Empty without limits.",
				Queries:     []Query{{Expr: "sum by (scope, model) (switchyard_concurrent_requests{" + inst + "})", Legend: "{{scope}} {{model}}"}}},
			{Title: "Queue depth", Unit: "short",
				Description: "Requests waiting for a slot in each limit's queue.",
				Queries:     []Query{{Expr: "sum by (scope, model) (switchyard_queue_depth{" + inst + "})", Legend: "{{scope}} {{model}}"}}},
			{Title: "Queue wait p99", Unit: "s",
				Description: "p99 time spent in each queue by the requests that waited (served, timed out or left).",
				Queries:     quantiles("switchyard_queue_wait_seconds", inst, "scope, model", " {{scope}} {{model}}")[2:]},
			{Title: "Queue rejections", Unit: "ops", Stack: true,
				Description: "Requests a queue refused or ended: queue_full (429), queue_timeout (408), client_gone, shutting_down.",
				Queries:     []Query{{Expr: sumRate("scope, model, reason", "switchyard_queue_rejections_total", inst), Legend: "{{scope}} {{model}} {{reason}}"}}},
			{Title: "Rate limited", Unit: "ops",
				Description: "Requests refused 429 rate_limited by the router's and the per-key token buckets, and the API keys tracked.",
				Queries: []Query{
					{Expr: sumRate("scope", "switchyard_rate_limited_total", inst), Legend: "refused {{scope}}"},
					{Expr: "sum(switchyard_rate_limit_keys{" + inst + "})", Legend: "keys tracked"},
				}},
		}},
		{Title: "Selection", Panels: []Panel{
			{Title: "Selections by policy", Unit: "ops", Stack: true,
				Description: "Engine picks per second by the policy of the group that made them (a PD request makes two).",
				Queries:     []Query{{Expr: sumRate("policy", "switchyard_selections_total", instModel), Legend: "{{policy}}"}}},
			{Title: "Selections by reason", Unit: "ops", Stack: true,
				Description: "Engine picks per second by the reason the policy gave (cache hit, fallback, session reuse...).",
				Queries:     []Query{{Expr: sumRate("policy, reason", "switchyard_selections_total", instModel), Legend: "{{policy}}: {{reason}}"}}},
			{Title: "Selections by bucket", Unit: "ops", Stack: true,
				Description: "Engine picks per second by model, bucket and group (plain, prefill, decode).",
				Queries:     []Query{{Expr: sumRate("model, bucket, group", "switchyard_selections_total", instModel), Legend: "{{model}}/{{bucket}}/{{group}}"}}},
			{Title: "Selection failures", Unit: "ops", Stack: true,
				Description: "Requests no bucket could serve, by outcome: no_matching_bucket (400), no_candidates and no_admissible_engine (503), overloaded (429), timeouts and faults (5xx).",
				Queries:     []Query{{Expr: sumRate("outcome", "switchyard_selection_failures_total", inst), Legend: "{{outcome}}"}}},
			{Title: "Admission rejections", Unit: "ops", Stack: true,
				Description: "Engines refused by an admission cap, by the cap; the request moves on to the next bucket.",
				Queries:     []Query{{Expr: sumRate("limit", "switchyard_admission_rejections_total", inst), Legend: "{{limit}}"}}},
			{Title: "Mailbox rejections", Unit: "ops", Stack: true,
				Description: "Messages refused by a full actor mailbox. A bucket, group or affinity refusal answers the request 429 overloaded (raise actors.mailbox.* if this is not a burst you want to shed); telemetry drops a load report; a KV index shard (index_shard) drops events; affinity_partition is a cluster replica's binding partitions.",
				Queries:     []Query{{Expr: sumRate("kind", "switchyard_actor_mailbox_rejections_total", inst), Legend: "{{kind}}"}}},
			{Title: "Actor panics", Unit: "ops",
				Description: "Actors restarted after a panic (the request that hit one got a 500). Should stay at zero.",
				Queries:     []Query{{Expr: sumRate("kind", "switchyard_actor_panics_total", inst), Legend: "{{kind}}"}}},
		}},
		{Title: "Engines", Panels: []Panel{
			{Title: "Healthy engines by model and role", Unit: "short", Width: 12,
				Description: "Healthy engines of each model in each role its buckets need (the fewest any router sees). At 0 the model's requests fail and /readiness answers 503.",
				Queries:     []Query{{Expr: "min by (model, role) (switchyard_healthy_workers{" + instModel + "})", Legend: "{{model}} {{role}}"}}},
			{Title: "In flight by engine", Unit: "short", Width: 12,
				Description: "Requests the routers have in flight on each engine.",
				Queries:     []Query{{Expr: "sum by (worker) (switchyard_worker_inflight_requests{" + inst + "})", Legend: "{{worker}}"}}},
			{Title: "Engine health", Kind: StateTimeline, Unit: "short", Width: 12,
				Description: "Each engine's health-check state (the worst any router sees).",
				Mappings:    []Mapping{{Value: "1", Text: "healthy", Color: "green"}, {Value: "0", Text: "unhealthy", Color: "red"}},
				Queries:     []Query{{Expr: "min by (worker) (switchyard_worker_healthy{" + inst + "})", Legend: "{{worker}}"}}},
			{Title: "Circuit breakers", Kind: StateTimeline, Unit: "short", Width: 12,
				Description: "Each engine's circuit breaker (the worst any router sees): open after health.breaker_failures consecutive dispatch failures, half-open after health.breaker_cooldown.",
				Mappings: []Mapping{{Value: "0", Text: "closed", Color: "green"}, {Value: "1", Text: "open", Color: "red"},
					{Value: "2", Text: "half-open", Color: "orange"}},
				Queries: []Query{{Expr: "max by (worker) (switchyard_worker_breaker_state{" + inst + "})", Legend: "{{worker}}"}}},
			{Title: "Engines by load source", Unit: "short", Width: 8, Stack: true,
				Description: "Where each engine's load comes from (v1_loads, get_load, prometheus, zmq; the fewest-informed router counts). none: no report yet, so policies fall back on in-flight counts and admission caps on reported load fail open.",
				Queries: []Query{{Expr: "count by (source) (min by (worker, source) (switchyard_worker_load_source{" + inst + "}) == 1)",
					Legend: "{{source}}"}}},
			{Title: "Upstream errors", Unit: "ops", Width: 8, Stack: true,
				Description: "Failed dispatches per second by engine and kind: transport, timeout, status_5xx, stream_idle.",
				Queries:     []Query{{Expr: sumRate("worker, kind", "switchyard_upstream_errors_total", inst), Legend: "{{worker}} {{kind}}"}}},
			{Title: "Retries", Unit: "ops", Width: 12, Stack: true,
				Description: "Dispatches tried again on another engine after failing before any byte reached the client, by what failed (transport, timeout, status_<code>); and retries the retry budget refused (retry.budget), whose requests got their failed attempt's answer.",
				Queries: []Query{
					{Expr: sumRate("reason", "switchyard_retries_total", inst), Legend: "retry {{reason}}"},
					{Expr: sumRate("", "switchyard_retry_budget_exhausted_total", inst), Legend: "refused by the budget"},
				}},
			{Title: "Upstream connections", Unit: "ops", Width: 8,
				Description: "Requests sent again on a fresh connection after an idle one turned out closed by the engine, by engine; and the router's own failures (connection_limit: upstream.max_conns_per_worker reached, the request goes to another engine if one is free; out_of_resources: no file descriptor, answered 503), not charged to the engine.",
				Queries: []Query{
					{Expr: sumRate("worker", "switchyard_upstream_stale_connection_retries_total", inst), Legend: "stale retry {{worker}}"},
					{Expr: sumRate("kind", "switchyard_router_errors_total", inst), Legend: "router {{kind}}"},
				}},
			{Title: "Aborts", Unit: "ops", Width: 8, Stack: true,
				Description: "Requests whose engines were stopped because nobody waits for the answer any more, by cause: client_disconnect (the client left before or during the answer), timeout (server.request_timeout, upstream.response_header_timeout), stream_idle_timeout; and calls of an engine's abort API (SGLang's /abort_request) that failed.",
				Queries: []Query{
					{Expr: sumRate("cause", "switchyard_aborts_total", inst), Legend: "{{cause}}"},
					{Expr: sumRate("", "switchyard_abort_api_errors_total", inst), Legend: "abort API failed"},
				}},
		}},
		{Title: "KV cache and cache_aware", Panels: []Panel{
			{Title: "cache_aware hit rate", Unit: "percentunit", Max: ptr(1),
				Description: "Share of cache_aware picks that went to an engine holding the prompt's prefix (the rest fell back on load).",
				Queries: []Query{{Expr: sumRate("", "switchyard_cache_aware_decisions_total", inst+`,outcome="cache_candidate"`) + " / " +
					sumRate("", "switchyard_cache_aware_decisions_total", inst), Legend: "hit rate"}}},
			{Title: "cache_aware decisions and fallbacks", Unit: "ops",
				Description: "cache_aware picks by outcome, and why the misses fell back on load.",
				Queries: []Query{
					{Expr: sumRate("outcome", "switchyard_cache_aware_decisions_total", inst), Legend: "{{outcome}}"},
					{Expr: sumRate("reason", "switchyard_cache_aware_fallbacks_total", inst), Legend: "fallback: {{reason}}"},
				}},
			{Title: "Matched tokens per cache pick", Unit: "short",
				Description: "Prefix length, in tokens, that cache picks found on their engine (p50, p90, p99).",
				Queries:     quantiles("switchyard_cache_aware_matched_tokens", inst, "", "")},
			{Title: "Index size", Unit: "short",
				Description: "Blocks resident in each router's prefix index, and the (engine, DP rank) owners it follows.",
				Queries: []Query{
					{Expr: "sum by (instance) (switchyard_kv_index_blocks{" + inst + "})", Legend: "blocks {{instance}}"},
					{Expr: "sum by (instance) (switchyard_kv_index_owners{" + inst + "})", Legend: "owners {{instance}}"},
				}},
			{Title: "Index memory", Unit: "bytes",
				Description: "Memory held by each router's prefix index (bounded by kv.max_blocks).",
				Queries:     []Query{{Expr: "sum by (instance) (switchyard_kv_index_memory_bytes{" + inst + "})", Legend: "{{instance}}"}}},
			{Title: "KV event lag", Unit: "s",
				Description: "Age of KV-event batches when applied to the index: the router's clock minus the engine's batch timestamp (includes clock skew between the machines).",
				Queries:     quantiles("switchyard_kv_event_lag_seconds", inst, "", "")},
			{Title: "KV events", Unit: "ops",
				Description: "Event batches by result (malformed, unknown_engine should stay at zero) and block operations by result (dropped_busy: a shard could not keep up).",
				Queries: []Query{
					{Expr: sumRate("result", "switchyard_kv_event_batches_total", inst), Legend: "batches {{result}}"},
					{Expr: sumRate("result", "switchyard_kv_block_ops_total", inst), Legend: "block ops {{result}}"},
				}},
			{Title: "Index repairs", Unit: "ops",
				Description: "Sequence gaps, replays (ok, failed), reconnects, and engines' entries cleared by reason.",
				Queries: []Query{
					{Expr: sumRate("", "switchyard_kv_sequence_gaps_total", inst), Legend: "gaps"},
					{Expr: sumRate("result", "switchyard_kv_replays_total", inst), Legend: "replays {{result}}"},
					{Expr: sumRate("", "switchyard_kv_reconnects_total", inst), Legend: "reconnects"},
					{Expr: sumRate("reason", "switchyard_kv_owner_clears_total", inst), Legend: "cleared: {{reason}}"},
				}},
			{Title: "Prefix lookups", Unit: "ops",
				Description: "Prefix lookups per second by source (local index, remote indexer) and outcome (unavailable: the request was placed by load).",
				Queries: []Query{
					{Expr: sumRate("source, outcome", "switchyard_kv_lookups_total", inst), Legend: "{{source}} {{outcome}}"},
				}},
			{Title: "Prefix lookup duration", Unit: "s",
				Description: "Prefix lookup duration by source (local index, remote indexer): p50, p90, p99.",
				Queries:     quantiles("switchyard_kv_lookup_duration_seconds", inst, "source", " {{source}}")},
			{Title: "Hash cache hit rate", Unit: "percentunit", Max: ptr(1),
				Description: "Share of prompt chunks whose block hashes a lookup found in the hash cache (kv.hash_cache_chunks).",
				Queries: []Query{{Expr: sumRate("", "switchyard_kv_hash_cache_chunks_total", inst+`,result="hit"`) + " / " +
					sumRate("", "switchyard_kv_hash_cache_chunks_total", inst), Legend: "hit rate"}}},
		}},
		{Title: "Session and sticky routing", Panels: []Panel{
			{Title: "Bindings", Unit: "short",
				Description: "Session and routing-key bindings held, by model, bucket and stage.",
				Queries:     []Query{{Expr: "sum by (model, bucket, stage) (switchyard_affinity_bindings{" + instModel + "})", Legend: "{{model}}/{{bucket}}/{{stage}}"}}},
			{Title: "Binding lookups and binds", Unit: "ops",
				Description: "Binding lookups by result (hit, miss) and binds by result (bound, conflict).",
				Queries: []Query{
					{Expr: sumRate("result", "switchyard_affinity_lookups_total", instModel), Legend: "lookup {{result}}"},
					{Expr: sumRate("result", "switchyard_affinity_binds_total", instModel), Legend: "bind {{result}}"},
				}},
			{Title: "Bindings removed", Unit: "ops",
				Description: "Bindings removed by cause: expired (idle), evicted (affinity.max_bindings), invalidated (engine gone).",
				Queries:     []Query{{Expr: sumRate("cause", "switchyard_affinity_removed_total", instModel), Legend: "{{cause}}"}}},
		}},
		{Title: "Process", Panels: []Panel{
			{Title: "CPU", Unit: "percentunit",
				Description: "CPU time used per second by each router (1 = one core).",
				Queries:     []Query{{Expr: sumRate("instance", "process_cpu_seconds_total", inst), Legend: "{{instance}}"}}},
			{Title: "Memory", Unit: "bytes",
				Description: "Resident memory and Go heap in use of each router.",
				Queries: []Query{
					{Expr: "sum by (instance) (process_resident_memory_bytes{" + inst + "})", Legend: "resident {{instance}}"},
					{Expr: "sum by (instance) (go_memstats_heap_inuse_bytes{" + inst + "})", Legend: "heap {{instance}}"},
				}},
			{Title: "Goroutines", Unit: "short",
				Description: "Goroutines of each router: a steady climb under steady load is a leak.",
				Queries:     []Query{{Expr: "sum by (instance) (go_goroutines{" + inst + "})", Legend: "{{instance}}"}}},
		}},
	},
}
