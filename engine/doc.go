// Package engine is Switchyard's pure engine-selection domain (POLICY_DESIGN sections 1-5):
// workers and the registry snapshot, stages, the BucketResolver, buckets with their plain or
// prefill/decode groups, EngineGroup, the Policy contract with every concrete policy (one file
// each), per-engine admission, the pressure comparisons, the bucket loop (BucketLoop), how
// one bucket's selection is made stage by stage (Bucket.FirstStage, PickStage), and the
// factory that builds resolvers from configuration.
//
// The retry rule lives here too: a request whose dispatch failed records it
// (BucketRequest.RetryAfter), and its next selection resumes the bucket loop at the bucket of
// the failed attempt, whose groups leave the failed engines out of their candidates
// (BucketRequest.Retry, a fixed-size exclusion set); then the later compatible buckets are
// tried, never the earlier ones. Every attempt is one complete selection from one bucket, so
// a prefill/decode pair never mixes buckets, and affinity bindings that point at a failed
// engine are rebound by their policy's own rule for an engine that is not a candidate.
//
// Two rules refine the bucket loop without changing its invariants. The slo bucket order
// (BucketResolver.Order, OrderBySLO) reorders a request's compatible buckets by how far each
// is expected to miss the request's latency targets (Bucket.Estimate, from the load
// package's estimates); it only orders, so every compatible bucket is still tried in turn.
// PD compatibility (Bucket.Compat) restricts a decode pick to the engines whose labels match
// the chosen prefill engine's (EngineGroup.PickFor); when none does, the attempt fails with
// OutcomePDIncompatible and the loop moves on to the next bucket, discarding the prefill
// pick, so a pair still always comes from one bucket.
//
// Beyond the policies, a group narrows and completes a pick: a request naming a LoRA adapter
// (BucketRequest.Adapter) has as candidates the engines whose AdapterSet holds it (or, with
// adapter loading on, those with the most free slots, and the pick says to load it; with
// replication on, a busy adapter's holders and one more engine that may load it); a multi-rank
// engine gets its data-parallel rank from the group's rank picker (dp_dispatch) by each
// rank's own load report. A PD bucket with BypassBelow asks its decode group first and
// sends a request whose uncached prefill on that engine is short to it alone (Bypasses).
// consistent_hash and prefix_hash share one bounded-load ring (ring.go), seeded by nothing
// but worker IDs, so that router replicas agree.
//
// cache_aware's latency decision can tell a CacheAwareObserver (Deps.CacheAwareObserver) of
// every pick: each candidate's prefix, work ahead, expected TTFT and score, the hit weight,
// the tie ceiling and the engine chosen. It is a diagnostic seam (the bench records why
// requests left their prefix's holder); without an observer a pick records nothing.
//
// Everything here is synchronous and deterministic for a given state and seed; nothing does
// I/O. Anything that waits on the network (tokenization, remote prefix lookups) is resolved by
// the caller before a pick and carried in the BucketRequest.
//
// Concurrency: BucketResolver and Registry are immutable and safe for concurrent use;
// WorkerSet publishes registry snapshots behind an atomic pointer. Bucket.Estimate and
// EngineGroup.HealthyMembers read only immutable group facts, atomics and snapshots, so the
// request goroutine orders buckets without asking any actor. An EngineGroup and its policy
// are owned by one goroutine at a time — in the router, by their group actor (package
// actors), which runs Bucket.PickStage for its stage — and keep per-group state (cursors,
// random sources, scratch buffers) without locks. Router-local counters (load.Counters) are atomic.
//
// Nothing returned needs releasing. Errors are *PickError values that unwrap to one sentinel
// per outcome (ErrNoCandidates, ErrAdmissionRejected, ...).
package engine
