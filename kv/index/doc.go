// Package index is the prefix index: block hash → owners per storage tier (Tiers), where an
// owner is a (worker, DP rank) pair (Owners, OwnerID).
//
// A block's key (Config.BlockKey) is the engines' SHA-256 wire hash (BlockKeyEngine, package
// hashing) or the router's own 64-bit chained key (BlockKeyRouter, blockkey.go: RouterKeys,
// a keyed hash per block whose seed is the index's), which a lookup computes several times
// faster from the prompt; ingest then keys every engine's blocks from their token IDs.
//
// Blocks are sharded by hash over Shards; each shard keeps its blocks inline in an
// open-addressing table (table.go: linear probing from the first slot of a cache line,
// backward-shift deletion). A lookup (Index.Lookup) hashes the prompt with each block size
// its model's engines use and computes every owner's longest held prefix. The lookup
// goroutine reads the shards' tables itself (match.go: a software pipeline over batches of
// blocks, in prompt order across shards, prefetching the table lines and owner runs of the
// batches ahead). With the engines' SHA-256 keys it asks in growing waves (each wave's first
// block asked about alone before the wave is hashed, so a prompt nobody holds costs one
// block's hash), a long cached prompt is streamed (stream.go: one goroutine hashes, a helper
// matches and, while it waits for hashes, reads the tokens of the chunks ahead for their
// cache keys), and whole 64-block chunks of recent prompts keep their hashes in a lock-free
// cache (hashcache.go). With the router's keys, cheap to compute, the prompt is keyed as it
// is matched, in one pass; when the operator switches it on (Config.SplitBlocks, off by
// default), a long one on two cores while the index's twin is free (twin.go: a goroutine
// started by the first long lookup and stopped by Close matches the back part of the
// prompt while the lookup goroutine matches the front). The index is bounded
// (Config.MaxBlocks) with a CLOCK approximation of LRU in which blocks a request matched
// outlive blocks only stored.
//
// Clearing: every owner has an epoch; an entry is valid only with its owner's current epoch.
// Clearing an owner (ClearOwner, worker removal) is one atomic increment, effective for every
// lookup that starts after it (a lookup reads the epochs of the owners it asks about when it
// starts); shards reclaim the stale records in bounded sweeps.
//
// Concurrency: Index is safe for concurrent use. Each Shard has one writer at a time, the
// goroutine that owns it (an index shard actor, package actors implements ShardHost, or a
// mutex in LockedShards): writes, clears, prunes and sweeps run there, in order. Lookups
// read the shard tables on their own goroutine (Index.matchDirect), beside the writer and
// without waiting for it: every table word and owner record is written and read
// with sync/atomic; reallocated arrays are published with atomic.Pointer (a reader keeps the
// old ones until it is done); and a sequence per stripe of block hashes, odd while the
// writer changes a block of the stripe (insert, backward-shift move, delete, owner run),
// lets a reader keep only reads no write overlapped, so each block's owner set read is one
// it had at some moment of the lookup. A block whose stripe keeps changing is read again a
// bounded number of times, then its shard's query goes to the owner (ShardHost.Match) as a
// fallback. Readers mark the blocks they match for the CLOCK with a compare-and-swap of the
// entry's age, skipped when it is already set; a concurrent write may undo it (LRU stays
// approximate). A lookup sees what the shards have applied, not batches still queued for
// them; Sync waits for those. Owners publishes immutable snapshots and keeps epochs in
// atomics. A Writer belongs to one goroutine. Close an Index (it stops its twin, if any, and
// its shard host); a host returns the ShardBatch values handed to it with Done.
package index
