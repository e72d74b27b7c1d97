package tokenizer

import "unicode/utf8"

// ValidUTF8 returns s with every ill-formed UTF-8 sequence replaced by U+FFFD, one
// replacement per maximal subpart (Unicode §3.9, the policy of the WHATWG decoder, Rust's
// String::from_utf8_lossy and Python's "replace" handler). The reference tokenizers and
// Python's json module only see text decoded this way, so Switchyard decodes invalid input
// the same way. Fast path: valid input is returned as is, without allocating.
func ValidUTF8(s string) string {
	if utf8.ValidString(s) {
		return s
	}
	return string(AppendValidUTF8(make([]byte, 0, len(s)+8), s))
}

// AppendValidUTF8 appends s to dst with the replacement of ValidUTF8.
func AppendValidUTF8(dst []byte, s string) []byte {
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			dst = append(dst, c)
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r != utf8.RuneError || size != 1 {
			dst = append(dst, s[i:i+size]...)
			i += size
			continue
		}
		dst = append(dst, "\uFFFD"...)
		i += maximalSubpart(s[i:])
	}
	return dst
}

// AppendValidUTF8Bytes is AppendValidUTF8 for a byte slice.
func AppendValidUTF8Bytes(dst, b []byte) []byte {
	for i := 0; i < len(b); {
		c := b[i]
		if c < utf8.RuneSelf {
			dst = append(dst, c)
			i++
			continue
		}
		r, size := utf8.DecodeRune(b[i:])
		if r != utf8.RuneError || size != 1 {
			dst = append(dst, b[i:i+size]...)
			i += size
			continue
		}
		dst = append(dst, "\uFFFD"...)
		i += maximalSubpart(string(b[i:min(len(b), i+4)]))
	}
	return dst
}

// maximalSubpart returns the length of the maximal prefix of s, which starts with an
// ill-formed sequence, that is also a prefix of some well-formed sequence (at least 1).
func maximalSubpart(s string) int {
	c := s[0]
	lo, hi := byte(0x80), byte(0xBF)
	var need int
	switch {
	case c >= 0xC2 && c <= 0xDF:
		need = 1
	case c == 0xE0:
		need, lo = 2, 0xA0
	case c == 0xED:
		need, hi = 2, 0x9F
	case c >= 0xE1 && c <= 0xEF:
		need = 2
	case c == 0xF0:
		need, lo = 3, 0x90
	case c == 0xF4:
		need, hi = 3, 0x8F
	case c >= 0xF1 && c <= 0xF3:
		need = 3
	default:
		return 1
	}
	n := 1
	for k := 0; k < need && n < len(s); k++ {
		b := s[n]
		if k == 0 {
			if b < lo || b > hi {
				break
			}
		} else if b < 0x80 || b > 0xBF {
			break
		}
		n++
	}
	return n
}
