// Package index is the prefix index: block hash → owners per storage tier (Tiers), where an
// owner is a (worker, DP rank) pair (Owners, OwnerID).
//
// Blocks are sharded by hash over Shards; each shard keeps its blocks inline in an
// open-addressing table (table.go: linear probing, backward-shift deletion). A lookup
// (Index.Lookup) hashes the prompt with each block size its model's engines use and computes
// every owner's longest held prefix: the shards answer in growing waves, a long cached
// prompt is streamed (stream.go: one goroutine hashes, a helper matches), and whole 64-block
// chunks of recent prompts keep their hashes in a lock-free cache (hashcache.go). The index
// is bounded (Config.MaxBlocks) with a CLOCK approximation of LRU in which blocks a request
// matched outlive blocks only stored.
//
// Clearing: every owner has an epoch; an entry is valid only with its owner's current epoch.
// Clearing an owner (ClearOwner, worker removal) is one atomic increment, effective for every
// lookup at once; shards reclaim the stale records in bounded sweeps.
//
// Concurrency: Index is safe for concurrent use. A Shard belongs to one goroutine at a time:
// an index shard actor (package actors implements ShardHost) or a mutex (LockedShards).
// Owners publishes immutable snapshots and keeps epochs in atomics. A Writer belongs to one
// goroutine. Close an Index (it stops its shard host); a host returns the ShardBatch values
// handed to it with Done.
package index
