// Package loadgen sends a workload's requests to a router or to engines and measures each
// one: time to first token, inter-token latency, end-to-end latency, status, the engine
// that served it and the cached and uncached prompt tokens its usage reports.
//
// # What it owns
//
//   - Arrivals: closed loop (a fixed number of clients, each sending its next request when
//     the previous one completes) or open loop (Poisson arrivals at a given rate, from a
//     seeded source, regardless of completions). Either way a request waits for the request
//     it depends on (the previous turn of a conversation) and the run is bounded by a request
//     count and a duration: no request is sent after either bound, and the run returns once
//     the requests in flight complete (each bounded by Config.Timeout).
//   - Two senders: streaming requests (Server-Sent Events, stream_options.include_usage) go
//     through net/http, whose context cancellation bounds a stream that stops moving;
//     non-streaming requests go through a fasthttp client, which costs the machine less CPU
//     per request and so disturbs a throughput measurement less.
//   - Per-request Results; aggregation is package report's.
//
// # Concurrency model
//
// Measure starts one goroutine per closed-loop client, or, in an open loop, a pool of
// senders (one per request in flight, at most MaxOutstanding) fed by the calling goroutine,
// which sends the requests in their order: it hands request i+1 to a sender only once
// request i's sender is about to send it. A progress ticker runs beside them; Measure waits
// for all of them before it returns. Results are merged under one mutex per request (open
// loop) or per client (closed loop). An open-loop Result records how late it was sent
// (Result.Late).
//
// # What a caller must release
//
// Nothing: Measure closes its connections before returning.
package loadgen
