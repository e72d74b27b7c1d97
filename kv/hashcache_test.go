package kv

import (
	"slices"
	"testing"
)

// chainWith hashes tokens in blocks of bs through sc with cache, as a lookup does.
func chainWith(sc *lookupScratch, cache *hashCache, tokens []uint32, bs int) []int64 {
	sc.startChain(tokens, bs, cache)
	sc.hashUpTo((len(tokens) + bs - 1) / bs)
	return slices.Clone(sc.hashes)
}

// resident counts the whole chunks of tokens (block size bs) whose entries the cache holds:
// the hits a lookup of tokens gets. Keys are random per cache, so two chunks may share a slot.
func resident(c *hashCache, tokens []uint32, bs int) uint64 {
	var k chunkKey
	var n uint64
	for from := 0; (from+chunkBlocks)*bs <= len(tokens); from += chunkBlocks {
		k = c.key(k, bs, tokens[from*bs:(from+chunkBlocks)*bs])
		if e := c.slots[k[0]&c.mask].Load(); e != nil && e.key == k {
			n++
		}
	}
	return n
}

func TestHashCacheGivesTheSameHashes(t *testing.T) {
	m := NewMetrics(nil)
	c := newHashCache(1<<12, m)
	sc := &lookupScratch{}
	// 5,000 tokens in 16-token blocks: 4 whole chunks of 64 blocks and a partial one.
	prompt := seqTokens(3, 5000)
	want := AppendBlockHashes(nil, prompt, 16)
	if got := chainWith(sc, c, prompt, 16); !slices.Equal(got, want) {
		t.Fatal("first hashing differs from AppendBlockHashes")
	}
	if hits, misses := m.HashCacheChunks(); hits != 0 || misses != 4 {
		t.Fatalf("first hashing: %d hits, %d misses; want 0, 4 (whole chunks only)", hits, misses)
	}
	held := resident(c, prompt, 16)
	if held == 0 {
		t.Fatal("the cache kept none of the prompt's chunks")
	}
	if got := chainWith(sc, c, prompt, 16); !slices.Equal(got, want) {
		t.Fatal("cached hashing differs from AppendBlockHashes")
	}
	if hits, _ := m.HashCacheChunks(); hits != held {
		t.Fatalf("second hashing: %d hits, want %d", hits, held)
	}

	// A prompt sharing the first two chunks: those hit (if still held), the rest is hashed.
	fork := append(slices.Clone(prompt[:2*chunkBlocks*16]), seqTokens(1<<20, 3000)...)
	before, _ := m.HashCacheChunks()
	shared := resident(c, fork[:2*chunkBlocks*16], 16)
	if got := chainWith(sc, c, fork, 16); !slices.Equal(got, AppendBlockHashes(nil, fork, 16)) {
		t.Fatal("forked prompt: hashes differ")
	}
	if hits, _ := m.HashCacheChunks(); hits-before != shared {
		t.Fatalf("forked prompt: %d hits, want %d", hits-before, shared)
	}

	// The same tokens in another block size are another chain.
	if got := chainWith(sc, c, prompt, 32); !slices.Equal(got, AppendBlockHashes(nil, prompt, 32)) {
		t.Fatal("block size 32: hashes differ")
	}
	// A chunk past a partial one is not cached (the key chain stops), and still right.
	sc.startChain(prompt, 16, c)
	sc.hashUpTo(10)
	sc.hashUpTo(300)
	if !slices.Equal(sc.hashes, want[:300]) {
		t.Fatal("hashing in uneven steps differs")
	}
}

func TestIndexWithHashCacheMatchesWithout(t *testing.T) {
	for _, chunks := range []int{0, 1, 1024} {
		x, err := NewIndex(IndexConfig{Shards: 4, MaxBlocks: 1 << 20, HashCacheChunks: chunks})
		if err != nil {
			t.Fatal(err)
		}
		prompt := seqTokens(7, 100_000)
		hold(t, x, register(t, x, "full", 1, 16)[0], prompt, 16, TierGPU)
		hold(t, x, register(t, x, "half", 1, 16)[0], prompt[:50_000], 16, TierGPU)
		for range 3 { // cold, then from the cache (a 1-entry cache keeps replacing itself)
			if got := lookup(t, x, "m", prompt); got["full"] != 100_000 || got["half"] != 50_000 {
				t.Fatalf("%d chunks: got %v", chunks, got)
			}
		}
		hits, _ := x.Metrics().HashCacheChunks()
		if (chunks == 1024) != (hits > 0) {
			t.Fatalf("%d chunks: %d hits", chunks, hits)
		}
		_ = x.Close()
	}
}
