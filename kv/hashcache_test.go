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

func TestHashCacheGivesTheSameHashes(t *testing.T) {
	m := NewMetrics(nil)
	c := newHashCache(64, m)
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
	if got := chainWith(sc, c, prompt, 16); !slices.Equal(got, want) {
		t.Fatal("cached hashing differs from AppendBlockHashes")
	}
	if hits, _ := m.HashCacheChunks(); hits != 4 {
		t.Fatalf("second hashing: %d hits, want 4", hits)
	}

	// A prompt sharing the first two chunks: those hit, the rest is hashed.
	fork := append(slices.Clone(prompt[:2*chunkBlocks*16]), seqTokens(1<<20, 3000)...)
	if got := chainWith(sc, c, fork, 16); !slices.Equal(got, AppendBlockHashes(nil, fork, 16)) {
		t.Fatal("forked prompt: hashes differ")
	}
	if hits, _ := m.HashCacheChunks(); hits != 6 {
		t.Fatalf("forked prompt: %d hits in all, want 6", hits)
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
