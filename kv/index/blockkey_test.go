package index

import (
	"context"
	"math/rand/v2"
	"slices"
	"testing"

	"switchyard/kv"
	"switchyard/kv/hashing"
)

// TestRouterKeysChain: a chain's keys are its blocks' keys one after the other, continue
// from any block, name the whole prefix (a block's key depends on every block before it, and
// a short last block is not the whole block it starts), and differ between two chains'
// seeds.
func TestRouterKeysChain(t *testing.T) {
	k := NewRouterKeys()
	tokens := seqTokens(1<<31, 16*9+5) // 9 whole blocks and a short one
	keys, last := k.AppendChain(nil, 0, tokens, 16)
	if len(keys) != 10 || last != keys[9] {
		t.Fatalf("%d keys, last %d", len(keys), last)
	}
	var parent int64
	for i, want := range keys {
		got := k.Block(parent, tokens[i*16:min((i+1)*16, len(tokens))])
		if got != want {
			t.Fatalf("block %d: Block %d, AppendChain %d", i, got, want)
		}
		parent = got
	}
	rest, _ := k.AppendChain([]int64{42}, keys[3], tokens[4*16:], 16)
	if !slices.Equal(rest[1:], keys[4:]) || rest[0] != 42 {
		t.Fatalf("continued from block 3: %v, want %v after 42", rest, keys[4:])
	}
	if again, _ := k.AppendChain(nil, 0, tokens, 16); !slices.Equal(again, keys) {
		t.Fatal("the same tokens keyed twice differ")
	}
	if got, _ := k.AppendChain(nil, 0, tokens, 0); len(got) != 0 {
		t.Fatalf("block size 0: %v", got)
	}
	// One token changed in block 2: blocks 0-1 keep their keys, every later one changes.
	other := slices.Clone(tokens)
	other[2*16+5]++
	changed, _ := k.AppendChain(nil, 0, other, 16)
	for i := range keys {
		if same := changed[i] == keys[i]; same != (i < 2) {
			t.Fatalf("block %d: same key %t after a change in block 2", i, same)
		}
	}
	// A short block is not the whole block it begins, nor the same tokens after another parent.
	padded := append(slices.Clone(tokens[9*16:]), make([]uint32, 11)...)
	if k.Block(keys[8], padded) == keys[9] || k.Block(0, tokens[9*16:]) == keys[9] {
		t.Fatal("a short block's key ignores its length or its parent")
	}
	if other, _ := NewRouterKeys().AppendChain(nil, 0, tokens, 16); other[0] == keys[0] && other[9] == keys[9] {
		t.Fatal("two chains' seeds give the same keys")
	}
}

// TestBlockKeyConfig: an index is keyed by the engines' hashes unless told otherwise, and
// refuses a scheme it does not know.
func TestBlockKeyConfig(t *testing.T) {
	prompt := seqTokens(3, 100)
	for _, tt := range []struct {
		key        string
		routerKeys bool
	}{{"", false}, {BlockKeyEngine, false}, {BlockKeyRouter, true}} {
		x, err := New(Config{Shards: 1, BlockKey: tt.key, HashCacheChunks: 64})
		if err != nil {
			t.Fatalf("%q: %v", tt.key, err)
		}
		got := x.AppendBlockKeys(nil, prompt, 16)
		var want []int64
		if tt.routerKeys {
			want, _ = x.RouterKeys().AppendChain(nil, 0, prompt, 16)
		} else {
			want = hashing.AppendBlockHashes(nil, prompt, 16)
		}
		if (x.RouterKeys() != nil) != tt.routerKeys || !slices.Equal(got, want) || (x.hcache == nil) != tt.routerKeys {
			t.Fatalf("%q: router keys %t, hash cache %t, keys %v, want %v", tt.key, x.RouterKeys() != nil, x.hcache != nil, got, want)
		}
		_ = x.Close()
	}
	if _, err := New(Config{BlockKey: "sha1"}); err == nil {
		t.Fatal("an unknown block key was accepted")
	}
}

// TestRouterKeyLookupsMatchEngineKeyLookups: the same blocks held under both schemes give
// the same matches for every prompt, short and long (waves, the streamed lookup on the engine
// scheme), with whole and short last blocks, two block sizes and prompts that diverge.
func TestRouterKeyLookupsMatchEngineKeyLookups(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 5))
	base := make([]uint32, 40_000)
	for i := range base {
		base[i] = rng.Uint32()
	}
	type held struct {
		worker string
		bs     int
		tokens []uint32
	}
	var holds []held
	for i := range 12 {
		bs := 16
		if i%4 == 3 {
			bs = 64
		}
		n := 1 + rng.IntN(len(base))
		tokens := slices.Clone(base[:n])
		if i%3 == 2 && n > 100 {
			tokens[n/2] ^= 1 // diverges halfway
		}
		holds = append(holds, held{string(rune('a' + i)), bs, tokens})
	}
	prompts := [][]uint32{base, base[:1], base[:15], base[:16], base[:17], base[:1000], base[:20_037]}
	for _, h := range holds {
		prompts = append(prompts, h.tokens, h.tokens[:len(h.tokens)*2/3])
	}
	results := map[string][]kv.Lookup{}
	for _, key := range []string{BlockKeyEngine, BlockKeyRouter} {
		x := newKeyedIndex(t, 3, 1<<20, key)
		for _, h := range holds {
			ids, err := x.SetWorker(h.worker, "m", 1, h.bs)
			if err != nil {
				t.Fatal(err)
			}
			hold(t, x, ids[0], h.tokens, h.bs, TierGPU)
		}
		for _, p := range prompts {
			var l kv.Lookup
			if err := x.Lookup(context.Background(), "m", p, &l); err != nil {
				t.Fatal(err)
			}
			results[key] = append(results[key], kv.Lookup{QueryTokens: l.QueryTokens, Matches: slices.Clone(l.Matches)})
		}
	}
	hits := 0
	for i := range prompts {
		e, r := results[BlockKeyEngine][i], results[BlockKeyRouter][i]
		if e.QueryTokens != r.QueryTokens || !slices.Equal(e.Matches, r.Matches) {
			t.Fatalf("prompt %d (%d tokens): engine keys %+v, router keys %+v", i, len(prompts[i]), e.Matches, r.Matches)
		}
		hits += len(e.Matches)
	}
	if hits < len(prompts) {
		t.Fatalf("only %d matches over %d prompts: the test holds too little", hits, len(prompts))
	}
}
