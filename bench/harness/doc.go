// Package harness runs the benchmark scenarios of `switchyard bench` and `switchyard demo`:
// it starts mock engines and a router in-process (or targets a running router), drives a
// workload through them with package loadgen, and assembles a report.Report.
//
// # What it owns
//
//   - The cluster: N plain mock engines, or P prefill plus D decode engines, with the
//     simulation settings (speedup, cache capacity, max running requests, costs, zero
//     cost), and an httpfront router configured per row (a policy, a bucket layout, a
//     mailbox size), all on 127.0.0.1 with ports chosen by the OS. Every row starts fresh
//     engines, so caches are cold and no policy inherits another's state.
//   - The scenarios: overhead (router against the same engines reached directly, through
//     a bare fasthttp proxy and through nginx, zero simulated cost: requests/s, added
//     latency, CPU seconds per 1,000 requests; the router and the bare proxy run as their
//     own processes when Options.ReplicaCommand and Options.BareCommand are set, as nginx
//     does, and each one's own CPU is its process's), routing (one workload under each policy of a list, with the
//     oracle's bound on the hit rate), pd (the prefill group's policy compared on a PD
//     bucket), buckets (the long-context mix on one pool against length buckets, per
//     length class), mailbox (an overload burst at several actors.mailbox sizes:
//     accepted throughput, 429 rate, p99) and slo (two buckets over the same lengths, one
//     also fed background load sent to its engines directly; requests with a TTFT target,
//     arriving open loop, under capacity and slo bucket order: SLO attainment, goodput,
//     TTFT percentiles and the router's TTFT estimates against the observed TTFT) and
//     instructions (the router and the reference proxies, each its own process under
//     valgrind's cachegrind, started twice per mode for N1 and N2 requests: user-space
//     instructions per request from the difference of the two counts; run by name).
//   - The trace scenario's hit-loss lines: each row's placement replayed on simulated
//     engines (mockengine.Simulate) against the oracle's, and, for a cache_aware row, the
//     router's own latency decisions (recorded through httpfront.Options.CacheAwareObserver
//     and matched to the requests by prompt) saying why a request left its prefix's holder.
//   - Policy lists as data (PolicySpec, ParsePolicies): a policy the router cannot build
//     yet becomes a skipped row carrying the reason, not a failed run.
//   - The progress line on the progress writer during every measured row.
//
// # Concurrency model
//
// Run measures one row at a time; each row's engines, router and load generator run
// concurrently inside it and are stopped before the next row starts.
//
// # What a caller must release
//
// Nothing: Run stops every engine and router it started before it returns, also on error or
// cancellation.
package harness
