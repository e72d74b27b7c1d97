// Package load owns engine-reported load and router-local request accounting.
//
// # What it owns
//
//   - Decoding of the engines' load reports, all outside input: the native HTTP
//     GET /v1/loads body (DecodeLoads), the legacy GET /get_load body (DecodeGetLoad), the
//     msgpack ZMQ load gauge in its 6- and 11-element forms (DecodeGauge) and a Prometheus
//     text page with vLLM's or SGLang's metric names (DecodePrometheus, prometheus.go). Each returns
//     RankReports, one per data-parallel (DP) rank, and never panics; errors wrap
//     ErrMalformed. The matching encoders (LoadsBody, GetLoadRank, AppendGauge) let the mock
//     engine emit exactly what the decoders read.
//   - Transports: Poller (HTTP polling with fasthttp: /v1/loads falling back to /get_load on
//     404, the metrics page, or detection of which an engine has, once; Source says which)
//     and GaugeSubscriber (ZMQ SUB on the sub-package zmtp, topic "load", every message
//     bounded by its Limits, reconnect with zmtp.Retry).
//   - Its sub-package zmtp is the project's one ZeroMQ transport (ZMTP 3, bounded reads,
//     one reconnect loop), shared by this package, kv and the mock engine; LogThrottle is
//     the one throttled log of malformed telemetry (at most one line per source and
//     interval, with a count), used here and by kv.
//   - Aggregation: Aggregator keeps the latest report per DP rank, derives the prefill
//     throughput and estimated prefill queue from the cumulative counters, and builds an
//     immutable Snapshot per worker: the sum over a complete set of fresh ranks, or unknown.
//     Missing, stale or rank-incomplete load is the zero Observation — unknown, never zero
//     load. A worker of several ranks also keeps each rank's own observation
//     (Snapshot.ObserveRank), for the router's choice of a rank. Table publishes the current
//     Snapshot.
//   - Router-local accounting: Tracker hands out one Counters per worker (in-flight,
//     dispatch count, latest dispatch time, pending prefill) and the Guards that hold
//     in-flight slots; a Guard from AcquirePrefill also holds a pending-prefill slot until
//     the request's first token (Guard.FirstToken).
//   - SLO estimates: each Counters carries the worker's learned Rates, two cost Lines fitted
//     online to what the router observes of its own requests (time to first token against
//     prefill work in tokens, time per output token against decode load in requests), and
//     EstimateTTFT / EstimateTPOT turn a load Observation, the counters and a request's
//     uncached tokens into the request's expected latencies (PrefillWork and DecodeLoad say
//     how the queue ahead is counted). Learning and estimating take no lock and do not
//     allocate.
//
// # Concurrency model
//
// An Aggregator is owned by exactly one goroutine (a telemetry actor) and is not safe for
// concurrent use. That owner ingests reports, calls Aggregator.Snapshot and publishes the
// result with Table.Store. Snapshots are immutable: any number of goroutines read them
// through Table.Load and Snapshot.Observe without locks (Observe is a map lookup and a time
// comparison and does not allocate). A Poller or GaugeSubscriber runs on the goroutine that
// calls its Run and calls its Deliver callback there; the callback hands the reports to
// the owner (for example as a LoadReported message), never to the Aggregator directly from
// another goroutine. Tracker, Counters and Guard are safe for concurrent use; their fields
// are atomics.
//
// # What a caller must release
//
// Every Guard returned by Tracker.Acquire must be released with Guard.Release on every
// path once the request finishes (defer g.Release()). Release is idempotent and safe to
// call concurrently; only the first call gives the slot back. A guard that leaks is
// released by Tracker.ReleaseStale, which the owner of the Tracker runs periodically with a
// maximum age; each such release is counted (StaleReleased). Run
// methods return when their context is done and close what they opened.
package load
