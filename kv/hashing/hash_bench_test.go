package hashing

import (
	"crypto/sha256"
	"encoding/binary"
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
			name := strconv.Itoa(n) + "tok/bs" + strconv.Itoa(bs)
			b.Run(name, func(b *testing.B) { // the path this build runs (hashPath)
				dst := make([]int64, 0, n)
				b.ReportAllocs()
				b.SetBytes(int64(4 * n))
				for b.Loop() {
					dst = AppendBlockHashes(dst[:0], tokens, bs)
				}
			})
			// Baseline: the same chain with crypto/sha256 per block, the portable path.
			b.Run(name+"/crypto-sha256", func(b *testing.B) {
				buf := make([]byte, sha256.Size+4*bs)
				b.ReportAllocs()
				b.SetBytes(int64(4 * n))
				for b.Loop() {
					var d Digest
					for i := 0; i < n; i += bs {
						k := 0
						if i > 0 {
							k = copy(buf, d[:])
						}
						for _, tok := range tokens[i:min(i+bs, n)] {
							binary.LittleEndian.PutUint32(buf[k:], tok)
							k += 4
						}
						d = sha256.Sum256(buf[:k])
					}
				}
			})
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
