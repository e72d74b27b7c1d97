package approx

import (
	"context"
	"fmt"
	"slices"
	"testing"

	"switchyard/kv"
)

// BenchmarkApproxLookup measures one lookup of the approximate tree (behind mutexes, as the
// actors serialize it) for prompts of 256 and 4096 symbols that share a recorded prefix,
// beside the same lookup in an empty tree (the baseline: hashing to a shard and copying the
// prompt, nothing matched).
func BenchmarkApproxLookup(b *testing.B) {
	for _, n := range []int{256, 4096} {
		for _, filled := range []bool{false, true} {
			name := fmt.Sprintf("tokens=%d/empty", n)
			if filled {
				name = fmt.Sprintf("tokens=%d/filled", n)
			}
			b.Run(name, func(b *testing.B) {
				x, err := New(Config{Shards: 2, MaxTreeSize: 1 << 24})
				if err != nil {
					b.Fatal(err)
				}
				defer x.Close()
				prefix := ramp(1_000_000, n*3/4)
				if filled {
					for i := range 256 {
						x.Record("m", fmt.Sprint("w", i%8), append(slices.Clone(prefix), ramp(i*10_000, n/4)...))
					}
				}
				q := append(slices.Clone(prefix), ramp(7, n/4)...)
				b.ReportAllocs()
				b.ResetTimer()
				b.RunParallel(func(pb *testing.PB) {
					var l kv.Lookup
					for pb.Next() {
						if err := x.Lookup(context.Background(), "m", q, &l); err != nil {
							b.Fatal(err)
						}
					}
				})
			})
		}
	}
}

// BenchmarkApproxRecord measures recording dispatched prompts that share a prefix (the
// common case: a conversation's next turn, a shared system prompt).
func BenchmarkApproxRecord(b *testing.B) {
	for _, n := range []int{256, 4096} {
		b.Run(fmt.Sprintf("tokens=%d", n), func(b *testing.B) {
			x, err := New(Config{Shards: 2, MaxTreeSize: 1 << 24})
			if err != nil {
				b.Fatal(err)
			}
			defer x.Close()
			prefix := ramp(1_000_000, n*3/4)
			seqs := make([][]uint32, 1024)
			for i := range seqs {
				seqs[i] = append(slices.Clone(prefix), ramp(i*10_000, n/4)...)
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				x.Record("m", fmt.Sprint("w", i%8), seqs[i%len(seqs)])
			}
		})
	}
}
