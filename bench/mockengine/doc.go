// Package mockengine is a simulated SGLang (or vLLM) engine for tests and benchmarks: it
// speaks the wire formats of INTEROP.md and behaves like an engine under load, so the router's tests,
// the benchmark harness and the demo can run without GPUs. `switchyard mockengine` runs it
// as a command (Command); tests start engines in-process (Start, StartMany).
//
// # What it owns
//
//   - The HTTP API (fasthttp): POST /v1/chat/completions, /v1/completions and /generate
//     (text or input_ids, single or batch), streaming as Server-Sent Events ending with
//     "data: [DONE]" or as one JSON body, with OpenAI usage (prompt_tokens,
//     completion_tokens, prompt_tokens_details.cached_tokens); GET /health,
//     /health_generate, /server_info, /get_server_info, /v1/models, /get_load and /v1/loads
//     (encoded by package load), /metrics (Prometheus text, sglang: names); POST /flush_cache
//     and /abort_request ({"rid"} or {"abort_all"}: the named requests stop at the next
//     step boundary, as SGLang's do; a request's rid is its body's, or one of the engine's
//     own). Every response carries X-Worker-Id. Malformed JSON and invalid sampling parameters get a 400 with an
//     OpenAI-style error body, unknown routes a 404, a wrong method a 405; a handler panic
//     becomes a 500 and is logged.
//   - The vLLM flavour (Config.Flavor, --flavor vllm) serves what a vLLM OpenAI server serves
//     and nothing SGLang-specific: the OpenAI routes, /v1/models, /health, POST /tokenize and
//     /detokenize, /version, POST /reset_prefix_cache, and /metrics with vLLM's names
//     (num_requests_running and _waiting, kv_cache_usage_perc, cache_config_info,
//     prefix-cache and token counters), labelled model_name and engine (the DP rank); no
//     /server_info, /get_load, /v1/loads, /generate or load gauge. A vLLM engine aborts a
//     request as soon as its caller hangs up (the connection is watched, package
//     httpfront/hangup, while the request runs); an SGLang engine keeps generating until
//     /abort_request names it, or a stream's write fails. Aborts and WaitAborts count the
//     aborted requests for tests. The simulation, KV events and faults are the same for
//     both flavours.
//   - The simulation, per data-parallel rank: prompts are tokenized with the project's
//     tokenizer: the built-in Simple tokenizer by default (the router's too), or the Hugging
//     Face tokenizer of --tokenizer (Config.TokenizerPath), whose chat template renders chat
//     messages as sent, with tools and chat_template_kwargs, exactly as the router counts
//     them when configured with the same files; a paged prefix
//     cache keyed by SGLang block hashes (package kv/hashing) with a token capacity and LRU eviction
//     of unreferenced leaves, which caches prompt and output pages; and a scheduler with
//     max_running_requests, a FIFO waiting queue, prefill batches costing a fixed overhead
//     plus a cost per uncached token, and decode steps whose cost grows with the batch.
//     Costs are simulated durations divided by Config.Speedup; Config.ZeroCost skips the
//     scheduler and answers at once. At least one prompt token is always computed, so a
//     repeated prompt hits all its whole pages but the last token's.
//   - Load reports from that state: /get_load, /v1/loads with the cumulative prefill
//     counters, and the ZMQ load gauge (topic "load", extended 11-element form by default).
//   - KV events over ZMQ, one PUB socket per DP rank: (topic, 8-byte big-endian seq, msgpack
//     batch) with BlockStored (parent hash, token IDs), BlockRemoved on eviction and
//     AllBlocksCleared at start, on flush_cache and on restart, in either event shape; an
//     optional replay ROUTER socket per rank answers an 8-byte start seq with (seq, payload)
//     per retained batch and then seq -1. With KVEvents.Format "vllm" the publisher looks
//     like current vLLM's: hashes no router reproduces, topic kv@host:port+rank@model, 0 as
//     a first parent, extra trailing elements, replay replies (topic, seq, payload) ending
//     ("", -1, ""); KVEvents.Connect dials a router's bound SUB instead of binding. The
//     sockets (zmtp.go) are built on load/zmtp, the router's own ZMTP implementation, and
//     tested against go-zeromq/zmq4 clients.
//   - PD roles. A prefill engine runs a bootstrap HTTP server: GET /bootstrap/rooms/{room}
//     answers once the prefill of that bootstrap_room completed (200 with prompt and cached
//     token counts) or failed (409). A decode engine refuses a request without
//     bootstrap_host and bootstrap_room (400), long-polls the named prefill engine for the
//     room (bootstrap_port null means Config.DefaultBootstrapPort), and fails with a 500
//     naming room and peer on a refused connection, a timeout (Config.PDTimeout), a failed
//     prefill, a prompt of a different length or a prefill engine of another KV transfer
//     backend (Config.TransferBackend, reported in /server_info as
//     disaggregation_transfer_backend beside kv_cache_dtype, tp_size and page_size). While it
//     waits the request counts as waiting in the load reports. With Config.DecodeCanPrefill
//     a decode engine serves a request without bootstrap fields alone, like a plain engine
//     (a router's PD bypass).
//   - LoRA (Config.LoRA): adapter slots, adapters loaded at start or through the load and
//     unload routes with a simulated load time, listed in /v1/models with their parent;
//     a request naming an adapter that is not loaded is a 404.
//   - Fault injection (Faults): fail the first N requests, a failure rate, a fixed status,
//     added latency, a connection dropped after N tokens, a hang before the first token,
//     unhealthy health checks (now or after a delay), withheld events, and restarts (every
//     request fails, every ZMQ peer connection drops, the cache empties, counters and
//     sequence numbers start from zero). Set
//     at start, with Engine.SetFaults and Engine.Restart, or over HTTP with GET/PUT
//     /mock/faults and POST /mock/restart.
//
// Beyond SGLang's fields, /generate's meta_info carries queue_time, first_token_latency
// (seconds, from arrival), dp_rank and worker_id, and /server_info carries a "mock" object
// and, in kv_events, event_shape and the replay port base.
//
// # Concurrency model
//
// Each DP rank has one scheduler goroutine and a mutex guarding its queues, cache and
// counters; request handlers queue sequences and wait on a per-request channel, reading
// progress from atomics. KV events are encoded and handed to the PUB socket under the rank's
// mutex, so batches leave in the order the cache changed. Each PUB subscriber has a bounded
// queue (dropping when full, like a ZMQ high-water mark). Time comes from Config.Clock:
// ManualClock freezes an engine (Advance) or runs it as a discrete-event simulation (Run),
// in which every timer of the engine (step costs, added latency, the PD timeout, delayed
// faults, the load-gauge interval) fires as soon as it is set, so reported latencies equal
// the cost model exactly. An Engine's methods are safe for concurrent use.
//
// # What a caller must release
//
// Close every Engine (or cancel the context given to Start): Close fails the requests in
// flight, stops every goroutine the engine started and closes every socket. Command closes
// its engines when its context is done.
package mockengine
