// Package report turns the load generator's per-request results into the benchmark's
// figures and writes them: a table on stdout, JSON for machines and one SVG chart per
// scenario.
//
// # What it owns
//
//   - The arithmetic: nearest-rank percentiles, the token-weighted cache hit rate, load
//     spread (max/mean over every engine of the deployment, an engine that served nothing
//     counting as zero) and throughput in simulated time (wall time × the engines' speedup).
//   - Summary (one measured run), Row (one policy, variant or mailbox size), Scenario and
//     Report, with their JSON form.
//   - Rendering: WriteTable (text/tabwriter), WriteJSON, and WriteSVG, a hand-written SVG
//     chart of horizontal bars with one panel per figure (TTFT percentiles, throughput, hit
//     rate against the oracle, spread; requests/s, latency and CPU for overhead; accepted
//     throughput, 429 rate and p99 for mailbox).
//
// # Concurrency model
//
// Pure functions over values the caller owns; nothing is shared.
//
// # What a caller must release
//
// Nothing.
package report
