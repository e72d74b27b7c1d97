// Package load owns engine-reported load and router-local request accounting.
//
// It decodes the engines' load reports, all outside input (/v1/loads, /get_load, the msgpack
// ZMQ load gauge, a Prometheus metrics page: DecodeLoads, DecodeGetLoad, DecodeGauge,
// DecodePrometheus), each into RankReports, one per data-parallel rank, never panicking
// (errors wrap ErrMalformed), with the matching encoders for the mock engine; it runs the
// transports (Poller over HTTP, GaugeSubscriber over ZMQ) and aggregates reports into
// immutable per-worker Snapshots (Aggregator, Table), where missing, stale or
// rank-incomplete load is unknown, never zero; it keeps the router's own accounting per
// worker (Tracker, Counters, Guards holding in-flight and pending-prefill slots) and the
// SLO estimates learned from it (Rates, EstimateTTFT, EstimateTPOT). Its sub-package zmtp
// is the project's one ZeroMQ transport; LogThrottle is the one throttled log of malformed
// telemetry. docs/architecture.md ("load in detail") says what each part does.
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
// are atomics, and a Guard is registered for ReleaseStale in a lock-free slot table (locked
// lists only for guards beyond the table's 8,192 slots).
//
// # What a caller must release
//
// Every Guard returned by Tracker.Acquire must be released with Guard.Release on every
// path once the request finishes (defer g.Release()). Release is idempotent and safe to
// call concurrently; only the first call gives the slot back. A guard that leaks is
// released by Tracker.ReleaseStale, which the owner of the Tracker runs periodically with a
// maximum age; each such release is counted (StaleReleased). Run
// methods return when their context is done and close what they opened.
//
// A Guard from Tracker.AcquireWaiting (a request assigned to a worker that waits before its
// dispatch) is released the same way, whether or not its owner called Guard.Dispatch: the
// dispatch makes it the request's guard, not a second one.
//
// A Guard acquired in the caller's storage (Tracker.AcquirePrefillInto) is released the
// same way, once; after that the storage may be acquired again, and the former guard's
// methods must not be called.
package load
