// Package kv owns the router's view of the engines' KV caches.
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
//
// The ZMQ subscription, the prefix index and CacheSource build on these and live beside them.
//
// # Concurrency model
//
// The hashing functions are pure and safe for concurrent use; they allocate nothing for
// blocks of up to 64 tokens beyond growing dst. An Encoder and a Decoder each reuse their
// buffers and belong to one goroutine at a time; keep one per subscription.
//
// # What a caller must release
//
// Nothing. The slices of a batch decoded by Decoder.Decode alias the decoder's buffers and
// are valid only until its next Decode call: copy what must outlive it.
package kv
