package jsontext

import "testing"

func BenchmarkAppendString(b *testing.B) {
	s := "The quick brown fox said \"hello\" to the lazy dog.\n"
	buf := make([]byte, 0, 128)
	b.ReportAllocs()
	for b.Loop() {
		buf = AppendString(buf[:0], s)
	}
}
