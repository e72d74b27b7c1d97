package httpfront

import (
	"math/rand/v2"
	"testing"
	"unicode/utf8"
)

// plainRunRef is plainRun one byte at a time.
func plainRunRef(b []byte, i int) int {
	for ; i < len(b); i++ {
		if c := b[i]; c == '"' || c == '\\' || c < 0x20 || c >= utf8.RuneSelf {
			return i
		}
	}
	return i
}

// TestPlainRun checks the word-at-a-time run against the byte loop: every byte value at every
// lane of a word and in the tail, after plain bytes and after another stopping byte (a
// borrow from a lower lane must not hide or move the first stop), and random buffers.
func TestPlainRun(t *testing.T) {
	for n := range 20 {
		for pos := range n {
			for c := range 256 {
				b := make([]byte, n)
				for k := range b {
					b[k] = 'a'
				}
				b[pos] = byte(c)
				for start := range min(pos+1, 3) {
					if got, want := plainRun(b, start), plainRunRef(b, start); got != want {
						t.Fatalf("byte %#x at %d of %d, from %d: %d, want %d", c, pos, n, start, got, want)
					}
				}
				if pos+1 < n {
					b[pos+1] = 0
					if got, want := plainRun(b, 0), plainRunRef(b, 0); got != want {
						t.Fatalf("byte %#x at %d of %d before a zero: %d, want %d", c, pos, n, got, want)
					}
				}
			}
		}
	}
	r := rand.New(rand.NewPCG(1, 2))
	alphabet := []byte("ab \"\\\x00\x1f\x20\x7f\x80\xff")
	for range 20000 {
		b := make([]byte, r.IntN(40))
		for k := range b {
			if r.IntN(4) == 0 {
				b[k] = alphabet[r.IntN(len(alphabet))]
			} else {
				b[k] = byte(' ' + r.IntN(95))
			}
		}
		start := 0
		if len(b) > 0 {
			start = r.IntN(len(b))
		}
		if got, want := plainRun(b, start), plainRunRef(b, start); got != want {
			t.Fatalf("%q from %d: %d, want %d", b, start, got, want)
		}
	}
}

// TestScanStringAcrossWords checks strings whose quote, escape, control byte or multi-byte
// rune falls at every offset of the word-at-a-time scan.
func TestScanStringAcrossWords(t *testing.T) {
	for n := range 24 {
		pad := make([]byte, n)
		for k := range pad {
			pad[k] = 'x'
		}
		for _, tc := range []struct {
			mid     string
			ok, esc bool
		}{
			{`\"`, true, true}, {`\\`, true, true}, {`\u00e9`, true, true}, {"é", true, false},
			{"\x01", false, false}, {"\xff", false, false}, {`\x`, false, true}, {"", true, false},
		} {
			s := `"` + string(pad) + tc.mid + string(pad) + `"`
			end, esc, err := scanString([]byte(s+`,`), 0)
			if (err == nil) != tc.ok || (tc.ok && (end != len(s) || esc != tc.esc)) {
				t.Fatalf("%q: end %d escaped %v err %v; want ok %v, end %d, escaped %v", s, end, esc, err, tc.ok, len(s), tc.esc)
			}
		}
		if _, _, err := scanString([]byte(`"`+string(pad)), 0); err == nil {
			t.Fatalf("unterminated string of %d bytes accepted", n)
		}
	}
}
