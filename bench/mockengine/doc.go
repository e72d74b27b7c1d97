// Package mockengine is a simulated SGLang (or vLLM) engine for tests and benchmarks: it
// speaks the wire formats of INTEROP.md and behaves like an engine under load, so the router's
// tests, the benchmark harness and the demo can run without GPUs. `switchyard mockengine` runs
// it as a command (Command); tests start engines in-process (Start, StartMany).
//
// It owns the engine's HTTP API in both flavours (Config.Flavor), the simulation per
// data-parallel rank (tokenizer, paged prefix cache keyed by kv/hashing's block hashes,
// scheduler and cost model), load reports, KV events over ZMQ (load/zmtp sockets, with
// replay), the PD roles (bootstrap server, decode engines that wait for their prefill),
// LoRA adapter slots and fault injection (Faults). docs/mock-engine.md is the user's guide;
// docs/architecture.md ("bench/mockengine in detail") lists what each part does.
//
// Concurrency: each DP rank has one scheduler goroutine and a mutex guarding its queues,
// cache and counters; request handlers queue sequences and wait on a per-request channel,
// reading progress from atomics. KV events are encoded and handed to the PUB socket under the
// rank's mutex, so batches leave in the order the cache changed; each PUB subscriber has a
// bounded queue (dropping when full, like a ZMQ high-water mark). Time comes from
// Config.Clock: ManualClock freezes an engine (Advance) or runs it as a discrete-event
// simulation (Run), in which every timer of the engine fires as soon as it is set, so
// reported latencies equal the cost model exactly. An Engine's methods are safe for
// concurrent use.
//
// What a caller must release: close every Engine (or cancel the context given to Start):
// Close fails the requests in flight, stops every goroutine the engine started and closes
// every socket. Command closes its engines when its context is done.
package mockengine
