package subscribe

import (
	"log/slog"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"switchyard/kv/events"
	"switchyard/kv/hashing"
	"switchyard/kv/index"
	"switchyard/kv/internal/kvtest"
	"switchyard/load"
	"switchyard/load/zmtp/zmtptest"
)

// routerApplier is an applier of worker's events on an index keyed by the router's own keys,
// its unkeyed-blocks log on log at clock.
func routerApplier(t *testing.T, x *index.Index, worker, scheme string, log *slog.Logger, clock func() time.Time) *applier {
	t.Helper()
	if x.RouterKeys() == nil {
		t.Fatal("the index is not keyed by the router's keys")
	}
	return newApplier(x, worker, scheme, log, load.LogThrottle{Logger: log, Every: time.Minute, Now: clock})
}

// TestRouterKeysIngest: on an index keyed by the router's own keys, every engine (SGLang
// hashes or not, whatever its declared scheme) has its blocks keyed from their token IDs,
// chained through its parents; removes, per-tier removes and clears follow its own hashes.
func TestRouterKeysIngest(t *testing.T) {
	for _, tt := range []struct {
		name, scheme string
		hashes       func(prompt []uint32) []int64
	}{
		{"sglang hashes, auto", HashSchemeAuto, func(p []uint32) []int64 { return hashing.AppendBlockHashes(nil, p, 16) }},
		{"sglang hashes, declared", HashSchemeSGLang, func(p []uint32) []int64 { return hashing.AppendBlockHashes(nil, p, 16) }},
		{"vllm hashes, auto", HashSchemeAuto, func([]uint32) []int64 { return engineHashes(4, 20) }},
		{"vllm hashes, rekey", HashSchemeRekey, func([]uint32) []int64 { return engineHashes(4, 20) }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			x := kvtest.NewKeyedIndex(t, 3, 1<<16, index.BlockKeyRouter)
			ids := kvtest.Register(t, x, "e", 1, 16)
			a := routerApplier(t, x, "e", tt.scheme, slog.New(slog.DiscardHandler), time.Now)
			prompt := kvtest.SeqTokens(1<<31, 320)
			eh := tt.hashes(prompt)
			applyEvents(t, a, 0,
				stored(eh[:10], 0, prompt[:160], 16, events.MediumGPU),
				stored(eh[10:], eh[9], prompt[160:], 16, events.MediumCPUPinned))
			if !a.needsTokens() || a.verified || a.keys[0][0].r == nil || a.keys[0][0].d != nil {
				t.Fatalf("needs tokens %t, verified %t: not keyed by the router's keys", a.needsTokens(), a.verified)
			}
			if got := kvtest.Lookup(t, x, "m", prompt); got["e"] != 320 {
				t.Fatalf("stored: %v", got)
			}
			// Under the engine's own hashes, nothing: the index holds the router's keys only.
			var raw = index.TierGPU
			w := x.NewWriter()
			w.Remove(ids[0], x.Owners().Epoch(ids[0]), eh[3], raw)
			w.Flush()
			if got := kvtest.Lookup(t, x, "m", prompt); got["e"] != 320 {
				t.Fatalf("a remove of the engine's raw hash reached the index: %v", got)
			}
			if c := x.Metrics().Ingest(); c.HashMismatches != 0 || c.OpsDroppedUnkeyed != 0 {
				t.Fatalf("counts %+v", c)
			}
			// A remove of one tier keeps the other; a remove of every tier forgets the block.
			applyEvents(t, a, 0, events.Event{Kind: events.EventBlockRemoved, BlockHashes: eh[12:13], Medium: events.MediumGPU})
			if got := kvtest.Lookup(t, x, "m", prompt); got["e"] != 320 || a.keys[0][0].r.len() != 20 {
				t.Fatalf("after removing a tier the block is not held in: %v, %d keys", got, a.keys[0][0].r.len())
			}
			applyEvents(t, a, 0, events.Event{Kind: events.EventBlockRemoved, BlockHashes: eh[12:13]})
			if got := kvtest.Lookup(t, x, "m", prompt); got["e"] != 192 || a.keys[0][0].r.len() != 19 {
				t.Fatalf("after remove: %v, %d keys", got, a.keys[0][0].r.len())
			}
			// A child of the removed block has no parent key: not indexed, counted.
			applyEvents(t, a, 0, stored(engineHashes(77, 1), eh[12], kvtest.SeqTokens(5, 16), 16, events.MediumGPU))
			if c := x.Metrics().Ingest(); c.OpsDroppedUnkeyed != 1 {
				t.Fatalf("a block after a forgotten parent: counts %+v", c)
			}
			// A clear empties the owner and its map; what follows is keyed afresh.
			applyEvents(t, a, 0, events.Event{Kind: events.EventAllBlocksCleared}, stored(eh[:2], 0, prompt[:32], 16, events.MediumGPU))
			if got := kvtest.Lookup(t, x, "m", prompt); got["e"] != 32 || a.keys[0][0].r.len() != 2 {
				t.Fatalf("after a clear: %v, %d keys", got, a.keys[0][0].r.len())
			}
		})
	}
}

// TestRouterKeysBoundPerOwner: an owner's map of engine hashes is bounded; past it, new
// blocks are counted and not indexed (a miss, never a stale hit), and a remove makes room.
func TestRouterKeysBoundPerOwner(t *testing.T) {
	if maxRekeyBlocks != 1<<21 {
		t.Fatalf("maxRekeyBlocks %d, documented as 2M", maxRekeyBlocks)
	}
	x := kvtest.NewKeyedIndex(t, 2, 1<<16, index.BlockKeyRouter)
	kvtest.Register(t, x, "e", 1, 16)
	a := routerApplier(t, x, "e", HashSchemeAuto, slog.New(slog.DiscardHandler), time.Now)
	if a.maxKeys != maxRekeyBlocks {
		t.Fatalf("maxKeys %d", a.maxKeys)
	}
	a.maxKeys = 6
	prompt := kvtest.SeqTokens(9, 160)
	eh := engineHashes(5, 10)
	applyEvents(t, a, 0, stored(eh[:4], 0, prompt[:64], 16, events.MediumGPU), stored(eh[4:], eh[3], prompt[64:], 16, events.MediumGPU))
	if got := kvtest.Lookup(t, x, "m", prompt); got["e"] != 96 {
		t.Fatalf("at the bound of 6 blocks: %v", got)
	}
	if c := x.Metrics().Ingest(); c.OpsDroppedUnkeyed != 4 {
		t.Fatalf("counts %+v, want 4 blocks dropped", c)
	}
	applyEvents(t, a, 0, events.Event{Kind: events.EventBlockRemoved, BlockHashes: eh[5:6]},
		stored(eh[5:6], eh[4], prompt[80:96], 16, events.MediumGPU))
	if got := kvtest.Lookup(t, x, "m", prompt); got["e"] != 96 || a.keys[0][0].r.len() != 6 {
		t.Fatalf("stored again after a remove: %v, %d keys", got, a.keys[0][0].r.len())
	}
}

// TestRouterKeysHostileStores: BlockStored events whose token IDs are missing or do not
// cover their blocks are counted, logged once per interval, and change nothing.
func TestRouterKeysHostileStores(t *testing.T) {
	x := kvtest.NewKeyedIndex(t, 2, 1<<16, index.BlockKeyRouter)
	kvtest.Register(t, x, "e", 1, 16)
	h := zmtptest.NewLogCounter(msgUnkeyed)
	at := time.Unix(1_800_000_000, 0)
	a := routerApplier(t, x, "e", HashSchemeSGLang, slog.New(h), func() time.Time { return at })
	prompt := kvtest.SeqTokens(0, 64)
	hs := hashing.AppendBlockHashes(nil, prompt, 16)
	bad := []events.Event{
		stored(hs, 0, nil, 16, events.MediumGPU),                             // no token IDs
		stored(hs, 0, prompt[:48], 16, events.MediumGPU),                     // a block short
		stored(hs, 0, append(slices.Clone(prompt), 1), 16, events.MediumGPU), // a token too many
		stored(hs[:1], 0, prompt, 16, events.MediumGPU),                      // four blocks of tokens for one hash
		stored(hs, 0, prompt, -3, events.MediumGPU),                          // a nonsense block size (the owner's stays)
		{Kind: events.EventBlockStored, BlockHashes: nil, TokenIDs: prompt},  // no blocks: nothing to count
	}
	applyEvents(t, a, 0, bad...)
	if n := x.Stats().Blocks; n != 4 {
		// The block size -3 is ignored (the owner's 16 stays): that event is well formed.
		t.Fatalf("%d blocks indexed, want the 4 of the well-formed event", n)
	}
	if c := x.Metrics().Ingest(); c.OpsDroppedUnkeyed != 4+4+4+1 {
		t.Fatalf("counts %+v, want 13 blocks dropped", c)
	}
	if lines := h.Lines(); len(lines) != 1 || lines[0] != 1 {
		t.Fatalf("log lines (their counts) %v, want one of count 1", lines)
	}
	applyEvents(t, a, 0, bad[0])
	at = at.Add(2 * time.Minute)
	applyEvents(t, a, 0, bad[1])
	if lines := h.Lines(); len(lines) != 2 || lines[1] != 5 {
		// The three of the first batch after its first line, one more, and this one.
		t.Fatalf("log lines (their counts) %v, want a second counting 5", lines)
	}
}

// TestRouterKeysIngestMatchesEngineKeys: the same event payloads, an SGLang engine's and a
// vLLM engine's, decoded and applied to an index keyed by the engines' hashes and to one
// keyed by the router's own keys, give the same matches for every prompt.
func TestRouterKeysIngestMatchesEngineKeys(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 11))
	prompts := make([][]uint32, 8)
	for i := range prompts {
		prompts[i] = make([]uint32, 64+rng.IntN(3000))
		for j := range prompts[i] {
			prompts[i][j] = rng.Uint32()
		}
	}
	// Each engine stores its prompts' whole blocks in events of up to 8 blocks, chained;
	// then removes some and clears one rank's worth.
	batches := map[string][]*events.EventBatch{}
	for e, worker := range []string{"s", "v"} {
		var evs []events.Event
		for i, p := range prompts {
			if i%2 != e && i > 1 {
				continue
			}
			whole := p[:len(p)/16*16]
			hs := hashing.AppendBlockHashes(nil, whole, 16)
			if worker == "v" {
				hs = engineHashes(int64(100+i), len(hs))
			}
			var parent int64
			for b := 0; b < len(hs); b += 8 {
				end := min(b+8, len(hs))
				evs = append(evs, stored(hs[b:end], parent, whole[b*16:end*16], 16, events.MediumGPU))
				parent = hs[end-1]
			}
			if i%3 == 0 {
				evs = append(evs, events.Event{Kind: events.EventBlockRemoved, BlockHashes: hs[len(hs)/2 : len(hs)/2+1]})
			}
		}
		for len(evs) > 0 {
			n := min(len(evs), 16)
			batches[worker] = append(batches[worker], &events.EventBatch{Events: evs[:n]})
			evs = evs[n:]
		}
	}
	results := map[string][]map[string]int64{}
	for _, key := range []string{index.BlockKeyEngine, index.BlockKeyRouter} {
		x := kvtest.NewKeyedIndex(t, 2, 1<<20, key)
		for _, worker := range []string{"s", "v"} {
			kvtest.Register(t, x, worker, 1, 16)
			ing := NewIngestor(x, worker, false, nil)
			for _, b := range batches[worker] {
				p, err := events.AppendEventBatch(nil, b, events.ShapeArray)
				if err != nil {
					t.Fatal(err)
				}
				if _, err := ing.Apply(p, 0); err != nil {
					t.Fatal(err)
				}
			}
		}
		for _, p := range prompts {
			results[key] = append(results[key], kvtest.Lookup(t, x, "m", p))
		}
	}
	held := 0
	for i := range prompts {
		e, r := results[index.BlockKeyEngine][i], results[index.BlockKeyRouter][i]
		if len(e) != len(r) {
			t.Fatalf("prompt %d: engine keys %v, router keys %v", i, e, r)
		}
		for w, n := range e {
			if r[w] != n {
				t.Fatalf("prompt %d: engine keys %v, router keys %v", i, e, r)
			}
			held++
		}
	}
	if held < len(prompts) {
		t.Fatalf("only %d matches: the engines hold too little for the test to mean anything", held)
	}
}
