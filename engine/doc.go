// Package engine is Switchyard's pure engine-selection domain (POLICY_DESIGN sections 1-5):
// workers and the registry snapshot, stages, the BucketResolver, buckets with their plain or
// prefill/decode groups, EngineGroup, the Policy contract with every concrete policy (one file
// each), per-engine admission, the pressure comparisons, the bucket loop (SelectEngines), and
// the factory that builds resolvers from configuration.
//
// Everything here is synchronous and deterministic for a given state and seed; nothing does
// I/O. Anything that waits on the network (tokenization, remote prefix lookups) is resolved by
// the caller before a pick and carried in the BucketRequest.
//
// Concurrency: BucketResolver and Registry are immutable and safe for concurrent use;
// WorkerSet publishes registry snapshots behind an atomic pointer. An EngineGroup, its policy
// and a Bucket's PickEngines are owned by one goroutine at a time — in the router, by their
// group actor (package actors) — and keep per-group state (cursors, random sources, scratch
// buffers) without locks. Router-local counters (load.Counters) are atomic.
//
// Nothing returned needs releasing. Errors are *PickError values that unwrap to one sentinel
// per outcome (ErrNoCandidates, ErrAdmissionRejected, ...).
package engine
