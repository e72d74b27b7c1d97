// Package kv owns Switchyard's view of the engines' KV caches (POLICY_DESIGN section 6,
// "Cache state"; wire formats in INTEROP.md).
//
// # What it owns
//
//   - The event wire format (event.go: msgpack batches, both event shapes, sanity caps) and
//     SGLang block hashing (hash.go).
//   - The prefix index: block hash → owners per storage tier (Tiers), where an owner is a
//     (worker, DP rank) pair (Owners, OwnerID). Blocks are sharded by hash over Shards; a
//     lookup hashes the prompt with each block size its model's engines use and computes
//     every owner's longest held prefix (Index.Lookup), asking the shards in growing waves
//     so that a cold prompt costs one small wave. The index is bounded (IndexConfig.MaxBlocks)
//     with a CLOCK approximation of LRU eviction.
//   - Clearing: every owner has an epoch; an entry is valid only with its owner's current
//     epoch. Clearing an owner (AllBlocksCleared, publisher restart, unrepaired sequence gap,
//     a batch refused by a busy shard, worker removal) is one atomic increment, effective
//     for every lookup at once; shards reclaim the stale records in bounded sweeps.
//   - Subscriptions to the engines' ZMQ publishers in both topologies of INTEROP (connect to
//     each engine's PUB per DP rank, discovered from /server_info or configured; or bind a
//     SUB that vLLM-style engines dial, identifying them by topic), with per-publisher
//     sequence tracking, replay on a gap, reconnect with backoff, and re-keying from token
//     IDs for engines whose hashes the router cannot reproduce.
//   - CacheSource, the contract of a prefix source: the local Index, or RemoteSource, the
//     client of `switchyard indexer` (IndexerHandler serves an Index over HTTP). PrefixMemo
//     memoizes one request's lookups, one per source.
//
// # Concurrency model
//
// A Shard belongs to one goroutine at a time: an index shard actor in the router (package
// actors implements ShardHost) or a mutex (LockedShards). Owners publishes immutable
// snapshots and keeps epochs in atomics. Index, RemoteSource and the subscription Manager
// are safe for concurrent use. An IndexWriter, a Decoder and a PrefixMemo are owned by one
// goroutine (a PrefixMemo by one request, handed along its picks in sequence).
//
// # What a caller must release
//
// Close an Index (it stops its shard host), cancel the context of Manager.Run and wait for
// it (it closes every socket it opened), and close an IndexerHandler's server. ShardBatch
// values handed to a host are returned with Done by the host. Nothing else needs releasing.
package kv
