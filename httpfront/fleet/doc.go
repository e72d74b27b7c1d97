// Package fleet is the router's worker lifecycle: where workers come from (the
// configuration, the admin API, Kubernetes pods), and for each worker its registry entry,
// its one introspection (Introspect: /server_info with load.Fetch, decoded by DecodeInfo),
// its LoRA adapter list, active health checks, circuit breaker (Member.Admit), upstream HTTP
// client (Upstream, with lazily moved deadlines: LazyDeadline; reads and writes of its TCP
// sockets, and of the router's client connections, as raw system calls: Socket; a streamed
// response's reads paced by its connection's read deadline and interruptible from any
// goroutine: Stream;
// its chunked body decoded below fasthttp's client, straight into the reader's buffer:
// streamTransport, streamBody, chunkDecoder; the same decoder follows the framing alone for
// a proxy that relays the bytes as they came: ChunkedFraming),
// telemetry and KV-event subscriptions; and Kubernetes discovery (Kubernetes). Failures are *Error values whose Kind
// says whether the engine or the router is answerable. docs/architecture.md ("httpfront/fleet
// in detail") says what each part does.
//
// Concurrency: Add and Remove serialize on the Fleet's mutex and publish registry snapshots
// through engine.WorkerSet. The dispatch path reaches a worker's Member through its
// engine.Worker (MemberOf, a field read); Admit and Ticket.Done are atomic operations on the
// breaker, and a state change republishes the worker's eligibility at once, so the next pick
// sees it. Each worker's health loop owns its counters; the breaker's cool-down runs on the
// Clock's timer. Upstream is safe for concurrent use. Kubernetes discovery's informer only
// queues pod keys; a few reconciler goroutines (never two for one pod) call the Sink.
//
// What a caller must release: every Ticket from Admit must be ended with Done, on every path;
// a streamed response's body stream must be closed (Response.CloseBodyStream or
// ReleaseResponse), which gives its connection back to the pool or closes it.
// Stop ends the health loops, timers and telemetry and waits for them; CloseConnections closes
// every live upstream connection and InterruptStreams the connections read under
// Stream.Pace (a drain's hard stop). Kubernetes.Run returns when its
// context is done; the workers it added stay until the fleet stops.
package fleet
