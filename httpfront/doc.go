// Package httpfront is Switchyard's HTTP front end (fasthttp): the routes, request
// preparation, the bucket loop through the actors, the HTTP error mapping, plain and
// prefill/decode dispatch with SSE streaming, the worker admin API, /metrics, health and
// graceful shutdown. The worker lifecycle (introspection, health checks, circuit breakers,
// the upstream clients, telemetry and KV subscriptions of every worker) is its sub-package
// httpfront/fleet; with discovery.kubernetes.enabled, Run also follows the engine pods of a
// Kubernetes cluster (fleet.Kubernetes), adding and removing their workers as POST /workers
// and DELETE /workers/{id} do. With cluster.enabled (cluster.go) the router replicas share
// bindings, in-flight counts and the admin API's worker changes; discovered workers are each
// replica's own (every replica watches the pods).
//
// # Request flow
//
// A handler reads the body itself (fasthttp streams it): a known-length body straight into
// the exchange's buffer, a chunked or compressed one through its decoder into pooled chunks,
// capped at server.max_body_bytes (32 MiB by default) before and after decompression and
// charged, with the decoder's working memory, to the router-wide body budget
// (server.max_body_bytes_in_flight; 503 body_budget_exhausted when it has no room). An answer
// given before the body was read closes the connection lingering (half-close, then read and
// drop what the client still sends, bounded), so that the client reads it. It validates it
// with a strict allocation-free JSON scanner (OpenAI-style 400 errors), counts input tokens
// (tokenizer, token IDs already in the body, or the body-size estimate), computes the expected
// peak (overflow-checked), and asks actors.Selector for a complete selection, one actor round
// trip per bucket attempt. The picked engines admit the dispatch (fleet.Member.Admit, reached
// from the pick's engine.Worker without a lookup). The handler then acquires in-flight
// guards for the engines it dispatches to and forwards the body with the allow-listed
// headers through each engine's fleet.Upstream, and charges each engine's breaker with what
// the answer says of it.
//
// Retries (attempts.go): the request's attempt loop selects, admits and dispatches again
// after a dispatch that failed before any byte reached the client, when package retry's
// rules allow it (a transport failure, a timeout before the first byte, a retryable status;
// retries left; the backoff ends before the request's deadline). The failed engines join the
// request's exclusion set (engine.BucketRequest.RetryAfter): the next selection runs in the
// same bucket first without them, then in the later compatible buckets, and a
// prefill/decode failure picks a whole new pair from one bucket. Once that selection has
// found engines, the shared budget (retry.Budget) is asked and the backoff waited, on the
// Server's clock, ending early when the client leaves; with no engine left the client gets
// the failed attempt's answer at once. An engine that refuses the dispatch before anything
// is sent (its half-open breaker already probing, removed, or every connection the router
// may open to it busy) is left out the same way and the selection runs again at once. A
// stream whose first byte reached the client is never retried; a prefill/decode pair's
// stream is relayed only once the prefill has answered. Every response says how many
// dispatches it took (X-Switchyard-Attempts); retries are counted by reason.
//
// Admission comes first (sub-package flow): after the API-key check, the rate limits
// (router-wide and per API key: 429 rate_limited with Retry-After); once the model is known,
// the concurrency limits (the model's, then the router's), whose queues hold requests over a
// limit by priority (the body's "priority" or server.priority_header), then by weighted fair
// sharing among tenants (server.tenant_header, else the API key) (429 queue_full when full, 408 queue_timeout, and a request whose
// client closes its connection while it waits is taken out: the connection is watched only
// while the request waits). The request holds its slots until it ends; a stream's relay
// releases them when the stream ends; they cover every attempt of a retried request.
//
// # Routing facts beyond the length
//
// The handler also reads what some policies and groups need: consistent_hash's key (the
// first header of hashing.key_headers present, only for a model with such a group), and a
// model name that is a LoRA adapter of a configured model (lora.go: configured in
// models.<name>.lora_adapters or held by an engine), which routes by the base model with
// BucketRequest.Adapter set; an engine picked to load the adapter gets it through its API
// before the request is forwarded (one load per engine and adapter at a time). A pick with a
// data-parallel rank (dp_dispatch) forwards the body with data_parallel_rank, and a PD pair's
// decode engine also gets prefill_dp_rank; a PD bucket's bypassed request (decode engine
// alone) is dispatched like a plain one, and its decision counted.
//
// # Tokenizers
//
// New loads the Hugging Face tokenizer of every model with models.<name>.tokenizer.path
// (Options.Tokenizer may supply one instead); a file that cannot be loaded fails New with an
// error naming the key. With a tokenizer, a chat request is counted by applying the model's
// chat template to its messages as SGLang prepares them for a text model (content parts
// joined, null members dropped, tool-call arguments parsed), with the generation prompt, the
// tools (unless tool_choice is "none") and chat_template_kwargs; a text prompt is encoded with
// the post-processor's special tokens, as the engine encodes it. The IDs go to
// BucketRequest.TokenIDs in a buffer pooled with the request's exchange; when the template
// refuses a conversation the body-size estimate applies. With tokenizer.forward_input_ids, a
// /generate request carrying text is forwarded with input_ids in place of the text. Without a
// tokenizer nothing of this runs.
//
// # Cache-aware routing
//
// When some group runs cache_aware, New builds the cache state (actors.CacheState): with
// cache_aware.source local, a prefix index on index shard actors fed by the KV events of
// every worker of such a model (publishers given as workers[].kv_events or named by the
// fleet from its one introspection of the engine, plus kv.bind_endpoint); with remote, the
// client of a `switchyard indexer`. Run follows the engines' events until the drain is over;
// the fleet tells the cache state of workers added or removed through the admin API (a POST
// /workers body may name "kv_events") and of publishers it learns later. A
// request of such a model makes its one prefix lookup in the handler goroutine, after
// tokenizing and before the bucket loop, into a memo pooled with its exchange
// (BucketRequest.Prefix); a remote lookup's I/O happens only there, bounded by
// cache_aware.query_timeout. A lookup needs token IDs: a cache_aware model without a
// configured tokenizer gets the built-in one (tokenizer.Simple, the mock engine's default),
// whose blocks match no real engine's, so against real engines tokenizer.path must name the
// engine's tokenizer; a request with no token IDs (a batch) makes no lookup and falls back
// on load.
//
// # SLO targets, estimates and PD labels
//
// A request's latency targets are its x-slo-ttft-ms and x-slo-tpot-ms headers, else its
// model's slo defaults (BucketRequest.SLO); they order the buckets of a model whose
// bucket_order is slo (in actors.Selector.Select). At dispatch the handler makes the
// request's estimates for the engines it was given (load.EstimateTTFT on the prefilling
// engine, load.EstimateTPOT on the decoding one) and holds the prefilling engine's
// pending-prefill slot (load.Tracker.AcquirePrefill) until the first token. A stream's relay
// feeds what it observes back: the time to first token into the prefilling engine's
// learned rates, the mean gap between data events into the decoding engine's; then it counts
// the targets met or missed by bucket. A request with a target gets its estimates and the
// bucket order rule in response headers. Non-streamed responses teach nothing and are not
// judged (their first token is not observed). Worker labels for PD compatibility are the
// configured ones over those introspected from /server_info.
//
// # Tracing
//
// With tracing.enabled (trace.go, sub-package tracing), every inference request gets an
// OpenTelemetry server span that continues the client's W3C traceparent, with child spans
// for its preparation (and prefix lookup), each selection (an event per bucket attempt,
// through engine.BucketRequest.Observer), each dispatch attempt (whose span context is the
// traceparent sent to the engines, both of a prefill/decode pair) and a relayed stream
// (its first token an event). The spans live in the exchange and, once a stream is
// relayed, in its relay, which ends them. Off, every hook is one comparison and allocates
// nothing. The Server's lifecycle shuts the exporter down last, after the drain.
//
// # Concurrency model
//
// Client connections come through a listener wrapper (conns.go) that caps them (in all and
// per address, evicting an idle one at the cap), retries accept when the process is out of
// file descriptors, and hands out connections (conn.go) whose deadlines move lazily and whose
// every write is bounded by server.write_timeout. Its table of connections is behind one
// mutex, taken per connection, not per request; a connection's state changes are atomic.
//
// Handlers run on fasthttp's goroutines and never hand the RequestCtx, or bytes aliasing it,
// to another goroutine. A stream is relayed by fasthttp's stream-writer goroutine plus one
// reader goroutine per stream; both own only copies (the upstream response, the guard). The
// relay writes whole SSE events only, so a stream that fails ends with an error event on an
// event boundary; its writes are also bounded by the request deadline. A PD
// request's prefill runs on its own goroutine, tracked by the Server, and completes even when
// the client leaves. Health loops run one goroutine per worker, owned by the fleet.
// Read-mostly state (the registry) is published as immutable snapshots behind atomic
// pointers; breakers and in-flight counts are atomics; metric handles are created once and
// kept.
//
// # What a caller must release
//
// The Server is one ordered lifecycle (life.go): New records every part it builds, Run adds
// its background loops, and stopping runs them in reverse order; a New that fails part-way
// stops what it built. New listens at once; Run serves until its context is done, then
// drains (stops accepting, lets requests and streams finish for up to server.drain_timeout,
// ends the remaining streams with a shutting_down event and gives their connections
// Options.StreamEndGrace to deliver it, then closes what remains) and releases every
// goroutine, connection and actor (the KV-event subscriptions and the index shard actors
// included). A Server that is never Run still holds
// its listener: call Run with a cancelled context to release it.
package httpfront
