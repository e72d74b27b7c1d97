package subscribe

import (
	"fmt"
	"log/slog"
	"math/rand/v2"
	"testing"

	"switchyard/kv/events"
	"switchyard/kv/index"
	"switchyard/kv/internal/kvtest"
	"switchyard/load"
)

// BenchmarkResidentMemoryIngested measures the heap a resident block costs once its
// BlockStored events went through ingest, the index and the appliers' re-key maps together:
// n blocks of random tokens in chains of 32 under random engine hashes, spread over 16
// engines, each chain stored by `holders` of them (so that no engine's map reaches its bound
// of 2M blocks). Schemes: "engine/sglang" (kv.block_key engine, an engine whose hashes are
// the router's: indexed as they are, no map), "engine/rekey" (kv.block_key engine, a vLLM
// engine re-keyed to the SHA-256 chain: a digest per block in its map) and "router"
// (kv.block_key router: every engine re-keyed to the router's keys, a key per block in its
// map). The live heap is compared before and after.
func BenchmarkResidentMemoryIngested(b *testing.B) {
	for _, n := range []int{1_000_000, 10_000_000} {
		for _, holders := range []int{1, 2} {
			for _, sc := range []struct{ name, key, scheme string }{
				{"engine/sglang", index.BlockKeyEngine, HashSchemeSGLang},
				{"engine/rekey", index.BlockKeyEngine, HashSchemeRekey},
				{"router", index.BlockKeyRouter, HashSchemeAuto},
			} {
				b.Run(fmt.Sprintf("blocks=%d/holders=%d/%s", n, holders, sc.name), func(b *testing.B) {
					for b.Loop() {
						residentIngested(b, n, holders, sc.key, sc.scheme)
					}
				})
			}
		}
	}
}

func residentIngested(b *testing.B, n, holders int, key, scheme string) {
	const chain, bs, engines = 32, 16, 16
	var x *index.Index
	defer func() {
		if x != nil {
			_ = x.Close()
		}
	}()
	heap := kvtest.HeapGrowth(func() any {
		var err error
		if x, err = index.New(index.Config{Shards: 8, MaxBlocks: 2 * n, BlockKey: key}); err != nil {
			b.Fatal(err)
		}
		aps := make([]*applier, engines)
		for i := range aps {
			w := fmt.Sprintf("w%d", i)
			if _, err := x.SetWorker(w, "m", 1, bs); err != nil {
				b.Fatal(err)
			}
			aps[i] = newApplier(x, w, scheme, slog.New(slog.DiscardHandler), load.LogThrottle{})
		}
		rng := rand.New(rand.NewPCG(1, 1))
		tokens := make([]uint32, chain*bs)
		hs := make([]int64, chain)
		batch := &events.EventBatch{Events: []events.Event{{Kind: events.EventBlockStored, BlockSize: bs, Medium: events.MediumGPU}}}
		for i, done := 0, 0; done < n; i, done = i+1, done+chain {
			k := min(chain, n-done)
			for j := range tokens[:k*bs] {
				tokens[j] = rng.Uint32()
			}
			for j := range hs[:k] {
				hs[j] = int64(rng.Uint64())
			}
			batch.Events[0].BlockHashes, batch.Events[0].TokenIDs = hs[:k], tokens[:k*bs]
			for h := range holders {
				if err := aps[(i+h)%engines].apply(batch, 0); err != nil {
					b.Fatal(err)
				}
			}
		}
		if st := x.Stats(); st.Blocks != int64(n) {
			b.Fatalf("%d blocks resident, want %d", st.Blocks, n)
		}
		return aps // the index with its appliers' maps
	})
	b.ReportMetric(float64(heap)/float64(n), "heap-B/block")
}
