package index

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"switchyard/kv"
	"switchyard/kv/hashing"
)

// BenchmarkShardApply measures block stores and removes on one shard without contention:
// a steady state of n resident blocks with churn, in batches of `batch` operations (the
// router's writers send a shard its share of an event batch: tens of operations). 5M
// resident blocks is a shard of a 10M-block index on two cores.
func BenchmarkShardApply(b *testing.B) {
	for _, n := range []int{100_000, 1_000_000, 5_000_000} {
		for _, batchOps := range []int{2, 32} {
			b.Run(fmt.Sprintf("resident=%d/batch=%d", n, batchOps), func(b *testing.B) {
				s, ids, keys := residentShard(n)
				owners := s.owners
				batch := &ShardBatch{}
				b.ReportAllocs()
				cpu := cpuTime(b)
				i := 0
				for b.Loop() {
					// Half the operations remove an old block, half store a new one in its
					// place; b.N counts operations.
					if i%batchOps == 0 {
						batch.Ops = batch.Ops[:0]
					}
					k := (i / 2) % n
					if i%2 == 0 {
						batch.Ops = append(batch.Ops, ShardOp{Hash: keys[k], Owner: uint16(ids[0]), Epoch: owners.Epoch(ids[0]), Tiers: AllTiers, Remove: true})
					} else {
						keys[k] ^= 0x5555
						batch.Ops = append(batch.Ops, ShardOp{Hash: keys[k], Owner: uint16(ids[0]), Epoch: owners.Epoch(ids[0]), Tiers: TierGPU})
					}
					if i++; i%batchOps == 0 {
						s.Apply(batch)
					}
				}
				reportCPU(b, cpu)
			})
		}
	}
}

// residentShard returns a shard holding n random blocks of one owner, and their hashes.
func residentShard(n int) (*Shard, []OwnerID, []int64) {
	owners := NewOwners()
	ids, _ := owners.SetWorker("a", "m", 1, 16)
	s := NewShard(owners, 2*n)
	rng := rand.New(rand.NewPCG(2, 2))
	keys := make([]int64, n)
	batch := &ShardBatch{}
	for i := range keys {
		keys[i] = int64(rng.Uint64())
		batch.Ops = append(batch.Ops, ShardOp{Hash: keys[i], Owner: uint16(ids[0]), Epoch: owners.Epoch(ids[0]), Tiers: TierGPU})
	}
	s.Apply(batch)
	return s, ids, keys
}

// BenchmarkShardMatch measures a shard answering queries of 64 resident blocks (a lookup's
// first wave of a held prompt) picked at random among n: mostly cache misses. b.N counts
// blocks. (A query stops at its first block nobody holds.) "holders=2": every block is held
// by two owners (their records in a run), as a prompt two engines cached.
func BenchmarkShardMatch(b *testing.B) {
	for _, n := range []int{1_000_000, 5_000_000} {
		for _, holders := range []int{1, 2} {
			name := fmt.Sprintf("resident=%d", n)
			if holders > 1 {
				name += fmt.Sprintf("/holders=%d", holders)
			}
			b.Run(name, func(b *testing.B) { benchShardMatch(b, n, holders) })
		}
	}
}

func benchShardMatch(b *testing.B, n, holders int) {
	s, ids, keys := residentShard(n)
	if holders > 1 {
		second, _ := s.owners.SetWorker("b", "m", 1, 16)
		ids = append(ids, second[0])
		batch := &ShardBatch{}
		for _, h := range keys {
			batch.Ops = append(batch.Ops, ShardOp{Hash: h, Owner: uint16(second[0]), Epoch: s.owners.Epoch(second[0]), Tiers: TierGPU})
		}
		s.Apply(batch)
	}
	bits := make([]uint16, int(ids[len(ids)-1])+1)
	bits[ids[0]] = 1
	rng := rand.New(rand.NewPCG(4, 4))
	q := &ShardQuery{Bits: bits, Words: 1}
	held := 0
	b.ReportAllocs()
	cpu := cpuTime(b)
	i := 0
	for b.Loop() {
		if i%64 == 0 {
			q.Hash = q.Hash[:0]
		}
		q.Hash = append(q.Hash, keys[rng.IntN(n)])
		if i++; i%64 == 0 {
			s.Match(q)
			for _, set := range q.Sets {
				held += int(set)
			}
		}
	}
	reportCPU(b, cpu)
	if want := i / 64 * 64; held != want {
		b.Fatalf("%d of %d blocks matched", held, want)
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

// cpuTime returns the CPU time the process has spent, user and system.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// reportCPU reports the CPU time per operation since start as cpu-ns/op: on a busy shared
// machine a single-goroutine benchmark's wall time mostly measures waiting for a core.
func reportCPU(b *testing.B, start time.Duration) {
	b.ReportMetric(float64(cpuTime(b)-start)/float64(b.N), "cpu-ns/op")
}

// BenchmarkHashCacheKey: the key of one chunk of 16-token blocks (1,024 tokens), what a
// lookup pays per chunk to find its hashes in the cache.
func BenchmarkHashCacheKey(b *testing.B) {
	c := newHashCache(16, nil)
	tokens := seqTokens(0, chunkBlocks*16)
	var k chunkKey
	for b.Loop() {
		k = c.key(k, 16, tokens)
	}
}

// BenchmarkChainPath: what a streamed lookup's own goroutine does to hash a 100,000-token
// prompt (16-token blocks) new to the hash cache, without the matching: "nocache" is the
// SHA-256 chain alone, "keyed" also keys each chunk from its tokens (the helper not ahead),
// "ahead" keys each chunk from the body its helper computed (stream.bodies). Each lookup has
// a fresh one-chunk cache, so every chunk misses and is stored. Read min-µs and p50-µs (the
// hashing alone); ns/op also counts the setup.
func BenchmarkChainPath(b *testing.B) {
	prompt := seqTokens(7, 100_000)
	n := len(prompt) / 16
	for _, mode := range []string{"nocache", "keyed", "ahead"} {
		b.Run(mode, func(b *testing.B) {
			var d []time.Duration
			hashes := make([]int64, 0, n)
			m := kv.NewMetrics(nil)
			for b.Loop() {
				sc := &lookupScratch{hashes: hashes}
				var cache *hashCache
				if mode != "nocache" {
					cache = newHashCache(1, m)
				}
				sc.startChain(prompt, 16, cache, nil)
				if mode == "ahead" {
					st := &stream{}
					st.bodies, st.ready = make([]uint64, n/chunkBlocks), make([]atomic.Bool, n/chunkBlocks)
					for c := range st.bodies {
						st.bodies[c] = cache.body(prompt[c*chunkBlocks*16 : (c+1)*chunkBlocks*16])
						st.ready[c].Store(true)
					}
					sc.ahead = st
				}
				t := time.Now()
				sc.hashUpTo(n)
				d = append(d, time.Since(t))
			}
			slices.Sort(d)
			b.ReportMetric(float64(d[0].Nanoseconds())/1e3, "min-µs")
			b.ReportMetric(float64(d[len(d)/2].Nanoseconds())/1e3, "p50-µs")
		})
	}
}
