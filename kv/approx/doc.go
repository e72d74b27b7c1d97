// Package approx is the approximate prefix source of cache_aware's approximate mode: a radix
// tree per model of the prompts the router itself sent to each worker (no KV events needed),
// sharded by the prompt's first symbols (ShardPrefix), over token IDs or the bytes of the
// prompt's text (TextSymbols), bounded per worker (Config.MaxTreeSize: an eviction keeps the
// most recently sent). Index is a kv.CacheSource.
//
// Concurrency: Index is safe for concurrent use. A Shard belongs to one goroutine at a time:
// shard actors (package actors implements Host) or mutexes (LockedShards).
package approx
