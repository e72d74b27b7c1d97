// Package httpfront is Switchyard's HTTP front end (fasthttp): the routes, request
// preparation (body, validation, token counts, routing facts, the prefix lookup), the bucket
// loop through the actors, the attempt loop with its retries, plain and prefill/decode
// dispatch with SSE streaming, the HTTP error mapping, the worker admin API, /metrics, health
// and graceful shutdown. Sub-packages: fleet (the worker lifecycle: introspection, health,
// breakers, upstream clients, Kubernetes discovery), flow (rate and concurrency limits and
// their queues), retry (retry rules and budget), jsontext (the one JSON string writer),
// tracing (OpenTelemetry spans per request, with tracing.enabled). With cluster.enabled
// (cluster.go) the replicas share bindings, in-flight counts and the admin API's worker
// changes; discovered workers are each replica's own. The cluster is joined while New builds
// the server, but its gossip calls back into the fleet only once New is done.
// docs/architecture.md ("httpfront in detail") walks a request through the files.
//
// Concurrency: handlers run on fasthttp's goroutines and never hand the RequestCtx, or bytes
// aliasing it, to another goroutine. Everything that waits on I/O (tokenization, a remote
// prefix lookup) happens in the handler before a pick. A stream, once it has its first
// event, takes its client connection over from fasthttp and is relayed on one fresh
// goroutine, which then waits for the connection's next request and hands the connection
// to a warm goroutine (resume.go: fasthttp's ServeConn) or closes it; the relay owns only
// copies, and its waits are read deadlines on the engine
// connection (stream.go). A PD request's prefill runs on its own goroutine, tracked by the
// Server. Client connections
// come through a listener wrapper (conns.go) whose table is behind one mutex taken per
// connection, not per request. Read-mostly state is published as immutable snapshots behind
// atomic pointers; breakers, in-flight counts and the request histograms are atomics.
//
// What a caller must release: the Server is one ordered lifecycle (life.go): New records
// every part it builds and listens at once, Run adds its background loops, serves until its
// context is done, then drains (server.drain_timeout; remaining streams end with a
// shutting_down event) and stops the parts in reverse order; a New that fails part-way stops
// what it built. A Server that is never Run still holds its listener: call Run with a
// cancelled context to release it.
package httpfront
