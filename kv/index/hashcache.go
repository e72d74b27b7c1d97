package index

import (
	"hash/maphash"
	"sync/atomic"

	"switchyard/kv"
	"switchyard/kv/hashing"
)

// chunkBlocks is how many blocks one hash-cache entry holds: the lookup waves and the
// streamed hashing both advance in multiples of it.
const chunkBlocks = firstWave

// hashCache remembers the block hashes of recently hashed prompt chunks, so that a prompt
// sharing a prefix with an earlier one (a conversation's next turn, a common system prompt)
// is not hashed with SHA-256 again. A chunk is chunkBlocks whole blocks aligned on a multiple
// of chunkBlocks from the prompt's start. Its key is 128 bits chained over the chunks before
// it, so it names the whole prefix up to the chunk, and the block size: one pass of a keyed
// hash (hash/maphash, random seeds per process) over the chunk's tokens, then each half of
// the key mixes that, the previous chunk's key and the block size under a seed of its own.
// Finding a chunk costs one pass of maphash over its tokens, many times cheaper than its
// SHA-256 chain. Two different chunks after the same prefix get the same key only when their
// 64-bit keyed token hashes collide (about 2^-64 for a pair, and the seeds are secret).
//
// Each key has two candidate slots (one per half of the key): a lookup reads both, an insert
// takes an empty one or else replaces one chosen by the key, so two hot prefixes whose keys
// meet in one slot need not evict each other. Entries are immutable and published with
// atomic pointers, so lookups on any goroutine share the cache without locks. A collision of
// 128-bit keys would route on a wrong prefix, never corrupt the index.
type hashCache struct {
	seeds [2]maphash.Seed
	slots []atomic.Pointer[chunkEntry]
	mask  uint64
	m     *kv.Metrics
}

type chunkKey [2]uint64

type chunkEntry struct {
	key    chunkKey
	hashes [chunkBlocks]int64
	last   hashing.Digest // digest of the chunk's last block
}

// newHashCache returns a cache of about chunks entries (rounded up to a power of two), or nil
// for chunks < 1.
func newHashCache(chunks int, m *kv.Metrics) *hashCache {
	if chunks < 1 {
		return nil
	}
	size := 1
	for size < chunks {
		size <<= 1
	}
	return &hashCache{
		seeds: [2]maphash.Seed{maphash.MakeSeed(), maphash.MakeSeed()},
		slots: make([]atomic.Pointer[chunkEntry], size),
		mask:  uint64(size - 1),
		m:     m,
	}
}

// key is the key of the chunk tokens (chunkBlocks whole blocks of blockSize) that follows the
// prefix whose key is prev (the zero key for the first chunk).
func (c *hashCache) key(prev chunkKey, blockSize int, tokens []uint32) chunkKey {
	return c.keyOf(prev, blockSize, c.body(tokens))
}

// body is the keyed hash of a chunk's tokens: nearly all of the cost of its key, and, unlike
// the key, independent of the chunks before it.
func (c *hashCache) body(tokens []uint32) uint64 {
	return maphash.Bytes(c.seeds[0], tokenBytes(tokens))
}

// keyOf is key for the chunk whose body is body.
func (c *hashCache) keyOf(prev chunkKey, blockSize int, body uint64) chunkKey {
	var k chunkKey
	for i, seed := range c.seeds {
		k[i] = maphash.Comparable(seed, [4]uint64{prev[0], prev[1], body, uint64(blockSize)})
	}
	return k
}

// candidates returns the two slots k may live in.
func (c *hashCache) candidates(k chunkKey) (*atomic.Pointer[chunkEntry], *atomic.Pointer[chunkEntry]) {
	return &c.slots[k[0]&c.mask], &c.slots[k[1]&c.mask]
}

func (c *hashCache) get(k chunkKey) *chunkEntry {
	a, b := c.candidates(k)
	for _, s := range [2]*atomic.Pointer[chunkEntry]{a, b} {
		if e := s.Load(); e != nil && e.key == k {
			c.m.HashCacheHits.Inc()
			return e
		}
	}
	c.m.HashCacheMisses.Inc()
	return nil
}

func (c *hashCache) put(k chunkKey, hashes []int64, last hashing.Digest) {
	e := &chunkEntry{key: k, last: last}
	copy(e.hashes[:], hashes)
	a, b := c.candidates(k)
	switch {
	case a.Load() == nil:
		a.Store(e)
	case b.Load() == nil:
		b.Store(e)
	case k[0]>>63 == 0:
		a.Store(e)
	default:
		b.Store(e)
	}
}
