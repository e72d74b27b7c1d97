// Package kv is the router's view of the engines' KV caches (POLICY_DESIGN section 6, "Cache
// state"; wire formats in INTEROP.md). This package holds what every prefix source shares;
// the work lives in its sub-packages, by noun:
//
//   - hashing: SGLang's block hashes (a SHA-256 chain), in assembly where the CPU allows.
//   - events: the KV-event wire format and its allocation-free msgpack decoder.
//   - index: the sharded prefix index (owners, tiers, shards, streaming lookups, hash cache).
//   - subscribe: the subscriptions to the engines' KV-event publishers that feed an index.
//   - indexer: the remote indexer, its HTTP protocol, server handler and client source.
//   - approx: the approximate prefix tree of routed prompts (no events needed).
//
// Here: CacheSource, the contract of a prefix source, with its answer Lookup (one Match per
// worker) and its errors ErrUnavailable and ErrRejected; PrefixMemo, one request's lookups
// memoized per source; and Metrics, the handles every sub-package counts on.
//
// Imports: kv and its sub-packages import only load (and each other: hashing and events are
// leaves; index builds on them; subscribe and indexer build on index). Details of each part
// are in its package comment and in docs/architecture.md.
//
// Concurrency: a CacheSource is safe for concurrent use; a PrefixMemo belongs to one request,
// handed along its picks in sequence; Metrics are safe for concurrent use.
package kv
