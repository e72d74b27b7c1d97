package index

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"testing"

	"switchyard/kv"
	"switchyard/kv/hashing"
)

// BenchmarkResidentMemory measures the heap a resident block costs: the index is filled
// with n random blocks (each held by `owners` engines) and the live heap is compared before
// and after. The shards' own estimate (Stats().MemoryBytes) is reported beside it.
func BenchmarkResidentMemory(b *testing.B) {
	for _, n := range []int{1_000_000, 10_000_000} {
		for _, owners := range []int{1, 2} {
			b.Run(fmt.Sprintf("blocks=%d/owners=%d", n, owners), func(b *testing.B) {
				for b.Loop() {
					runtime.GC()
					var before, after runtime.MemStats
					runtime.ReadMemStats(&before)
					x, err := New(Config{Shards: 8, MaxBlocks: 2 * n})
					if err != nil {
						b.Fatal(err)
					}
					ids := make([]OwnerID, owners)
					for i := range ids {
						got, _ := x.SetWorker(fmt.Sprintf("w%d", i), "m", 1, 16)
						ids[i] = got[0]
					}
					rng := rand.New(rand.NewPCG(1, 1))
					w := x.NewWriter()
					for range n {
						h := int64(rng.Uint64())
						for _, o := range ids {
							w.Store(o, x.Owners().Epoch(o), h, TierGPU)
						}
						if w.Pending() > 1<<14 {
							w.Flush()
						}
					}
					w.Flush()
					runtime.GC()
					runtime.ReadMemStats(&after)
					st := x.Stats()
					if st.Blocks != int64(n) {
						b.Fatalf("%d blocks resident", st.Blocks)
					}
					b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/float64(n), "heap-B/block")
					b.ReportMetric(float64(st.MemoryBytes)/float64(n), "estimate-B/block")
					runtime.KeepAlive(x)
				}
			})
		}
	}
}

// BenchmarkShardApply measures block stores and removes on one shard without contention:
// a steady state of n resident blocks with churn.
func BenchmarkShardApply(b *testing.B) {
	for _, n := range []int{100_000, 1_000_000} {
		b.Run(fmt.Sprintf("resident=%d", n), func(b *testing.B) {
			owners := NewOwners()
			ids, _ := owners.SetWorker("a", "m", 1, 16)
			s := NewShard(owners, 2*n)
			rng := rand.New(rand.NewPCG(2, 2))
			keys := make([]int64, n)
			batch := &ShardBatch{}
			for i := range keys {
				keys[i] = int64(rng.Uint64())
				batch.Ops = append(batch.Ops, ShardOp{Hash: keys[i], Owner: ids[0], Epoch: owners.Epoch(ids[0]), Tiers: TierGPU})
			}
			s.Apply(batch)
			batch.Ops = batch.Ops[:0]
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				// One op = remove an old block and store a new one in its place.
				batch.Ops = batch.Ops[:0]
				k := i % n
				batch.Ops = append(batch.Ops,
					ShardOp{Hash: keys[k], Owner: ids[0], Epoch: owners.Epoch(ids[0]), Tiers: AllTiers, Remove: true},
					ShardOp{Hash: keys[k] ^ 0x5555, Owner: ids[0], Epoch: owners.Epoch(ids[0]), Tiers: TierGPU})
				keys[k] ^= 0x5555
				s.Apply(batch)
				i++
			}
		})
	}
}

// BenchmarkLookupSizes measures a local lookup (hashing included) by prompt length, with the
// prompt held by one engine among 16, 1M other blocks resident; a cold prompt stops after
// the first wave.
func BenchmarkLookupSizes(b *testing.B) {
	x, err := New(Config{Shards: 8, MaxBlocks: 4_000_000})
	if err != nil {
		b.Fatal(err)
	}
	var ids []OwnerID
	for i := range 16 {
		got, _ := x.SetWorker(fmt.Sprintf("w%02d", i), "m", 1, 16)
		ids = append(ids, got[0])
	}
	rng := rand.New(rand.NewPCG(3, 3))
	w := x.NewWriter()
	for i := range 1_000_000 {
		o := ids[i%len(ids)]
		w.Store(o, x.Owners().Epoch(o), int64(rng.Uint64()), TierGPU)
	}
	w.Flush()
	for _, n := range []int{1024, 8192, 32768} {
		prompt := make([]uint32, n)
		for i := range prompt {
			prompt[i] = rng.Uint32()
		}
		for _, h := range hashing.AppendBlockHashes(nil, prompt, 16) {
			w.Store(ids[3], x.Owners().Epoch(ids[3]), h, TierGPU)
		}
		w.Flush()
		cold := make([]uint32, n)
		for i := range cold {
			cold[i] = rng.Uint32()
		}
		for _, c := range []struct {
			name   string
			tokens []uint32
			want   int64
		}{{"hit", prompt, int64(n)}, {"cold", cold, 0}} {
			b.Run(fmt.Sprintf("tokens=%d/%s", n, c.name), func(b *testing.B) {
				var l kv.Lookup
				b.ReportAllocs()
				for b.Loop() {
					if err := x.Lookup(context.Background(), "m", c.tokens, &l); err != nil {
						b.Fatal(err)
					}
				}
				if l.Tokens("w03") != c.want {
					b.Fatalf("matched %d, want %d", l.Tokens("w03"), c.want)
				}
			})
		}
	}
}
