// Package workload generates the benchmark harness's request sequences: seeded, reproducible
// lists of chat requests shaped like the traffic a routing policy is judged on, and the
// oracle that bounds the prefix-cache hit rate any router could reach on them.
//
// # What it owns
//
//   - Request and Workload: one chat request (messages, output length, the session and
//     routing keys sent as headers, the request it must wait for) and an ordered list of them.
//   - The generators: SharedPrefix (groups of prompts sharing a system prompt, the shape of
//     the inference-perf shared_prefix workload), MultiTurn (users × turns whose history
//     grows, with the session header set), LongContext (a mix of short, medium and long
//     prompts that exercises several buckets) and ZeroReuse (unique prompts, the control).
//     Every generator is a pure function of its configuration and seed.
//   - Text whose token count is exact under the built-in tokenizer (one three-letter word is
//     one token), so prompt lengths are what the configuration says.
//   - Oracle: the best achievable cache hit rate of a request sequence for a given page size
//     and total cache capacity (one pooled, page-granular LRU prefix cache that sees every
//     request: no router can place a request better than where its whole prefix already is),
//     and FleetOracle for a replayed trace: the same rules on separate engines of their own
//     capacity, with running requests' pages pinned, output reserved and output pages
//     cached as the engines do, each request placed on its longest holder.
//
// # Concurrency model
//
// Generators and the oracles are pure; a Workload is immutable once built and safe to share.
//
// # What a caller must release
//
// Nothing.
package workload
