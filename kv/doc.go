// Package kv owns the router's view of the engines' KV caches (POLICY_DESIGN section 6,
// "Cache state"; wire formats in INTEROP.md).
//
// # What it owns
//
//   - Block hashing (hash.go): SGLang's scheme, a SHA-256 chain over blocks of page-size
//     tokens, each token as 4 little-endian bytes, the wire hash being the first 8 bytes of a
//     block's digest as a big-endian int64. AppendBlockHashes hashes a whole token sequence;
//     AppendChainHashes continues a chain from a block's Digest. The router and the mock
//     engine both hash with these functions, so their hashes agree by construction, and the
//     golden vector of INTEROP.md pins them to SGLang's.
//   - The KV-event wire format (event.go): EventBatch [ts, events, attn_dp_rank?] with the
//     events BlockStored, BlockRemoved and AllBlocksCleared, encoded with msgpack as tagged
//     arrays or tagged maps (Encoder, AppendEventBatch) and decoded from either shape by a
//     hand-written, allocation-free msgpack reader (Decoder, DecodeEventBatch) that takes
//     every variant INTEROP.md lists, enforces the per-event sanity caps and never panics.
//   - The prefix index: block hash → owners per storage tier (Tiers), where an owner is a
//     (worker, DP rank) pair (Owners, OwnerID). Blocks are sharded by hash over Shards; each
//     shard keeps its blocks inline in an open-addressing table (blockTable: linear probing,
//     backward-shift deletion) with the first owner in the entry and further owners in a
//     contiguous run. A lookup hashes the prompt with each block size its model's engines
//     use and computes every owner's longest held prefix (Index.Lookup): the shards answer
//     per block with a bitset of the owners asked about, in growing waves, and the prompt is
//     hashed a wave at a time, so a cold prompt costs one small wave; on a pipelined host
//     the next wave is hashed while the shards answer. The index is bounded
//     (IndexConfig.MaxBlocks) with a CLOCK approximation of LRU eviction in which blocks a
//     request matched outlive blocks only stored.
//   - Clearing: every owner has an epoch; an entry is valid only with its owner's current
//     epoch. Clearing an owner (AllBlocksCleared, publisher restart, unrepaired sequence gap,
//     lost connection without replay, a batch refused by a busy shard, worker removal) is one
//     atomic increment, effective for every lookup at once; shards reclaim the stale records
//     in bounded sweeps.
//   - Ingest: an applier keys a worker's events by the engine's hashes once a first block
//     proves them to be the router's, and otherwise re-keys them from their token IDs
//     (vLLM-style engines), mapping engine hashes to router hashes for later removes.
//     Ingestor applies raw payloads; Manager runs the subscriptions to the engines' ZMQ
//     publishers in both topologies of INTEROP (connect to each engine's PUB per DP rank,
//     discovered from /server_info or configured; or bind a SUB that vLLM-style engines
//     dial, identifying them by topic), with per-publisher sequence tracking, replay of a gap
//     within a connection, reconnect with backoff, and clearing on restart, reconnection or
//     removal.
//   - CacheSource, the contract of a prefix source: the local Index, or RemoteSource, the
//     client of `switchyard indexer` (IndexerHandler serves an Index over HTTP, protocol in
//     wire.go). PrefixMemo memoizes one request's lookups, one per source.

// # Concurrency model
//
// The hashing functions are pure and safe for concurrent use; they allocate nothing for
// blocks of up to 64 tokens beyond growing dst. An Encoder and a Decoder each reuse their
// buffers and belong to one goroutine at a time; keep one per subscription.
//
// A Shard belongs to one goroutine at a time: an index shard actor in the router (package
// actors implements ShardHost) or a mutex (LockedShards). Owners publishes immutable
// snapshots and keeps epochs in atomics. Index, RemoteSource, the subscription Manager
// and IndexerHandler are safe for concurrent use. An IndexWriter, an Ingestor, a Decoder and
// a PrefixMemo are owned by one goroutine (a PrefixMemo by one request, handed along its
// picks in sequence).
//
// # What a caller must release
//
// Close an Index (it stops its shard host), cancel the context of Manager.Run and wait for
// it (it closes every socket it opened), and close an IndexerHandler's server. ShardBatch
// values handed to a host are returned with Done by the host. The slices of a batch decoded
// by Decoder.Decode alias the decoder's buffers and are valid only until its next Decode
// call: copy what must outlive it.
package kv
