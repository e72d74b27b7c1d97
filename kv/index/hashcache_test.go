package index

import (
	"slices"
	"testing"

	"switchyard/kv"
	"switchyard/kv/hashing"
)

// chainWith hashes tokens in blocks of bs through sc with cache, as a lookup does.
func chainWith(sc *lookupScratch, cache *hashCache, tokens []uint32, bs int) []int64 {
	sc.startChain(tokens, bs, cache, nil)
	sc.hashUpTo((len(tokens) + bs - 1) / bs)
	return slices.Clone(sc.hashes)
}

// resident counts the whole chunks of tokens (block size bs) whose entries the cache holds:
// the hits a lookup of tokens gets. Keys are random per cache, so chunks may share slots.
func resident(c *hashCache, tokens []uint32, bs int) uint64 {
	var k chunkKey
	var n uint64
	for from := 0; (from+chunkBlocks)*bs <= len(tokens); from += chunkBlocks {
		k = c.key(k, bs, tokens[from*bs:(from+chunkBlocks)*bs])
		a, b := c.candidates(k)
		if e := a.Load(); e != nil && e.key == k {
			n++
		} else if e := b.Load(); e != nil && e.key == k {
			n++
		}
	}
	return n
}

func TestHashCacheGivesTheSameHashes(t *testing.T) {
	m := kv.NewMetrics(nil)
	c := newHashCache(1<<12, m)
	sc := &lookupScratch{}
	// 5,000 tokens in 16-token blocks: 4 whole chunks of 64 blocks and a partial one.
	prompt := seqTokens(3, 5000)
	want := hashing.AppendBlockHashes(nil, prompt, 16)
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
	if got := chainWith(sc, c, fork, 16); !slices.Equal(got, hashing.AppendBlockHashes(nil, fork, 16)) {
		t.Fatal("forked prompt: hashes differ")
	}
	if hits, _ := m.HashCacheChunks(); hits-before != shared {
		t.Fatalf("forked prompt: %d hits, want %d", hits-before, shared)
	}

	// The same tokens in another block size are another chain.
	if got := chainWith(sc, c, prompt, 32); !slices.Equal(got, hashing.AppendBlockHashes(nil, prompt, 32)) {
		t.Fatal("block size 32: hashes differ")
	}
	// A chunk past a partial one is not cached (the key chain stops), and still right.
	sc.startChain(prompt, 16, c, nil)
	sc.hashUpTo(10)
	sc.hashUpTo(300)
	if !slices.Equal(sc.hashes, want[:300]) {
		t.Fatal("hashing in uneven steps differs")
	}
}

func TestIndexWithHashCacheMatchesWithout(t *testing.T) {
	for _, chunks := range []int{0, 1, 1024} {
		x, err := New(Config{Shards: 4, MaxBlocks: 1 << 20, HashCacheChunks: chunks})
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

// TestHashCacheTwoChoices checks that two keys meeting in one slot both stay: the second
// takes its other slot.
func TestHashCacheTwoChoices(t *testing.T) {
	c := newHashCache(16, kv.NewMetrics(nil))
	k1, k2 := chunkKey{5, 9}, chunkKey{5 + 16, 12} // the same first slot (5), other second slots
	c.put(k1, nil, hashing.Digest{1})
	c.put(k2, nil, hashing.Digest{2})
	if e := c.get(k1); e == nil || e.last != (hashing.Digest{1}) {
		t.Fatalf("k1: %v", e)
	}
	if e := c.get(k2); e == nil || e.last != (hashing.Digest{2}) {
		t.Fatalf("k2: %v", e)
	}
	// With both of k3's slots taken, it replaces one of them, and is found.
	k3 := chunkKey{5, 12} // slot 5 holds k1, slot 12 k2
	c.put(k3, nil, hashing.Digest{3})
	if e := c.get(k3); e == nil || e.last != (hashing.Digest{3}) {
		t.Fatalf("k3: %v", e)
	}
}

// TestLookupHashesAWaveOnlyPastItsFirstBlock: a lookup asks about a wave's first block
// before it hashes the wave, so a prompt nobody holds, or one held up to the end of a wave,
// does not hash (nor key in the hash cache) the next wave's chunk; the answers stay right.
func TestLookupHashesAWaveOnlyPastItsFirstBlock(t *testing.T) {
	x, err := New(Config{Shards: 2, MaxBlocks: 1 << 16, HashCacheChunks: 1024})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = x.Close() })
	prompt := seqTokens(11, 2*chunkBlocks*16) // two whole chunks: the first wave, and more
	hold(t, x, register(t, x, "a", 1, 16)[0], prompt[:chunkBlocks*16], 16, TierGPU)
	hold(t, x, register(t, x, "b", 1, 16)[0], prompt[:3*16], 16, TierGPU)
	for _, c := range []struct {
		name         string
		tokens       []uint32
		want         map[string]int64
		hits, misses uint64
	}{
		{"cold", seqTokens(1<<20, 2*chunkBlocks*16), map[string]int64{}, 0, 0},
		{"held to the first wave's end", prompt, map[string]int64{"a": chunkBlocks * 16, "b": 3 * 16}, 0, 1},
		{"again, from the cache", prompt, map[string]int64{"a": chunkBlocks * 16, "b": 3 * 16}, 1, 0},
	} {
		hits0, misses0 := x.Metrics().HashCacheChunks()
		got := lookup(t, x, "m", c.tokens)
		if len(got) != len(c.want) || got["a"] != c.want["a"] || got["b"] != c.want["b"] {
			t.Errorf("%s: matched %v, want %v", c.name, got, c.want)
		}
		hits, misses := x.Metrics().HashCacheChunks()
		if hits-hits0 != c.hits || misses-misses0 != c.misses {
			t.Errorf("%s: %d chunks from the hash cache, %d hashed; want %d and %d", c.name, hits-hits0, misses-misses0, c.hits, c.misses)
		}
	}
}
