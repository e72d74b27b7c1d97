package tokenizer

import (
	"strconv"
	"strings"
	"testing"
)

func BenchmarkSimpleEncode(b *testing.B) {
	s := NewSimple()
	const sentence = "The router sends each prompt to the engine with the longest cached prefix. "
	for _, size := range []int{256, 4096, 65536} {
		text := strings.Repeat(sentence, size/len(sentence)+1)[:size]
		b.Run(strconv.Itoa(size)+"B", func(b *testing.B) {
			dst := make([]uint32, 0, size)
			b.ReportAllocs()
			b.SetBytes(int64(size))
			for b.Loop() {
				dst = s.AppendEncode(dst[:0], text)
			}
		})
	}
	// Baseline: one pass over the bytes, the floor for any tokenizer.
	b.Run("baseline-scan-4096B", func(b *testing.B) {
		text := strings.Repeat("x", 4096)
		b.ReportAllocs()
		b.SetBytes(4096)
		n := 0
		for b.Loop() {
			for i := 0; i < len(text); i++ {
				n += int(text[i] & 1)
			}
		}
		_ = n
	})
}
