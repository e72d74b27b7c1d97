//go:build !race

package tokenizer

import "testing"

func TestSimpleAllocs(t *testing.T) {
	s := NewSimple()
	text := "<|user|>\nHow many tokens does this sentence have, roughly?\n<|assistant|>\n"
	dst := make([]uint32, 0, 256)
	if n := testing.AllocsPerRun(100, func() { dst = s.AppendEncode(dst[:0], text) }); n != 0 {
		t.Errorf("AppendEncode allocates %v times, want 0", n)
	}
	if n := testing.AllocsPerRun(100, func() { _ = s.Count(text) }); n != 0 {
		t.Errorf("Count allocates %v times, want 0", n)
	}
	out := make([]byte, 0, 512)
	ids := s.Encode(text)
	if n := testing.AllocsPerRun(100, func() { out = s.AppendDecode(out[:0], ids) }); n != 0 {
		t.Errorf("AppendDecode allocates %v times, want 0", n)
	}
}
