package index_test

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"switchyard/kv/index"
	"switchyard/kv/internal/kvtest"
)

// BenchmarkResidentMemory measures the heap a resident block costs: the index is filled
// with n random blocks (each held by `owners` engines) and the live heap is compared before
// and after. The shards' own estimate (Stats().MemoryBytes) is reported beside it.
func BenchmarkResidentMemory(b *testing.B) {
	for _, n := range []int{1_000_000, 10_000_000} {
		for _, owners := range []int{1, 2} {
			b.Run(fmt.Sprintf("blocks=%d/owners=%d", n, owners), func(b *testing.B) {
				for b.Loop() {
					var st index.Stats
					heap := kvtest.HeapGrowth(func() any {
						x, err := index.New(index.Config{Shards: 8, MaxBlocks: 2 * n})
						if err != nil {
							b.Fatal(err)
						}
						ids := make([]index.OwnerID, owners)
						for i := range ids {
							got, _ := x.SetWorker(fmt.Sprintf("w%d", i), "m", 1, 16)
							ids[i] = got[0]
						}
						rng := rand.New(rand.NewPCG(1, 1))
						w := x.NewWriter()
						for range n {
							h := int64(rng.Uint64())
							for _, o := range ids {
								w.Store(o, x.Owners().Epoch(o), h, index.TierGPU)
							}
							if w.Pending() > 1<<14 {
								w.Flush()
							}
						}
						w.Flush()
						st = x.Stats()
						return x
					})
					if st.Blocks != int64(n) {
						b.Fatalf("%d blocks resident", st.Blocks)
					}
					b.ReportMetric(float64(heap)/float64(n), "heap-B/block")
					b.ReportMetric(float64(st.MemoryBytes)/float64(n), "estimate-B/block")
				}
			})
		}
	}
}
