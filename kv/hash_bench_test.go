package kv

import (
	"crypto/sha256"
	"strconv"
	"testing"
)

func BenchmarkAppendBlockHashes(b *testing.B) {
	for _, n := range []int{1024, 8192} {
		tokens := make([]uint32, n)
		for i := range tokens {
			tokens[i] = uint32(i * 2654435761)
		}
		for _, bs := range []int{16, 64, 256} {
			for _, fast := range []bool{true, false} {
				name := strconv.Itoa(n) + "tok/bs" + strconv.Itoa(bs)
				if !fast {
					name += "/crypto-sha256" // the portable path, for the ratio
				}
				b.Run(name, func(b *testing.B) {
					withFastHash(b, fast, func() {
						dst := make([]int64, 0, n)
						b.ReportAllocs()
						b.SetBytes(int64(4 * n))
						for b.Loop() {
							dst = AppendBlockHashes(dst[:0], tokens, bs)
						}
					})
				})
			}
		}
		// Baseline: one SHA-256 over the same bytes, without chaining.
		b.Run(strconv.Itoa(n)+"tok/baseline-sha256", func(b *testing.B) {
			buf := make([]byte, 4*n)
			b.ReportAllocs()
			b.SetBytes(int64(4 * n))
			for b.Loop() {
				_ = sha256.Sum256(buf)
			}
		})
	}
}
