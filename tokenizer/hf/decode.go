package hf

import (
	"strings"
	"unicode/utf8"

	"switchyard/tokenizer"
)

// decodeStep is one decoder of the tokenizers library applied to the token strings of a
// decoding (decode_chain): it returns the new list, which may alias tokens.
type decodeStep interface {
	apply(tokens []string) []string
}

var (
	_ decodeStep = (*replaceDecoder)(nil)
	_ decodeStep = byteFallbackDecoder{}
	_ decodeStep = fuseDecoder{}
	_ decodeStep = (*stripDecoder)(nil)
	_ decodeStep = (*metaspaceDecoder)(nil)
	_ decodeStep = (*wordPieceDecoder)(nil)
	_ decodeStep = (*byteLevelDecoder)(nil)
)

// replaceDecoder replaces every match of a pattern in each token.
type replaceDecoder struct{ r replaceNormalizer }

func (d *replaceDecoder) apply(tokens []string) []string {
	for i, t := range tokens {
		tokens[i] = d.r.normalize(t)
	}
	return tokens
}

// byteFallbackDecoder turns runs of <0xNN> tokens into the text of their bytes, or into one
// U+FFFD per byte when the run is not UTF-8.
type byteFallbackDecoder struct{}

func (byteFallbackDecoder) apply(tokens []string) []string {
	out := tokens[:0:0]
	var run []byte
	flush := func() {
		if len(run) == 0 {
			return
		}
		if utf8.Valid(run) {
			out = append(out, string(run))
		} else {
			for range run {
				out = append(out, "\uFFFD")
			}
		}
		run = run[:0]
	}
	for _, t := range tokens {
		if b, ok := byteToken(t); ok {
			run = append(run, b)
			continue
		}
		flush()
		out = append(out, t)
	}
	flush()
	return out
}

// byteToken reads a <0xNN> token (hex digits of either case).
func byteToken(t string) (byte, bool) {
	if len(t) != 6 || !strings.HasPrefix(t, "<0x") || t[5] != '>' {
		return 0, false
	}
	hi, ok1 := hexDigit(t[3])
	lo, ok2 := hexDigit(t[4])
	return hi<<4 | lo, ok1 && ok2
}

func hexDigit(c byte) (byte, bool) {
	switch {
	case c >= '0' && c <= '9':
		return c - '0', true
	case c >= 'a' && c <= 'f':
		return c - 'a' + 10, true
	case c >= 'A' && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}

// fuseDecoder joins every token into one.
type fuseDecoder struct{}

func (fuseDecoder) apply(tokens []string) []string {
	return []string{strings.Join(tokens, "")}
}

// stripDecoder removes up to start leading and stop trailing content characters of each
// token.
type stripDecoder struct {
	content     rune
	start, stop int
}

func (d *stripDecoder) apply(tokens []string) []string {
	for i, t := range tokens {
		for k := 0; k < d.start; k++ {
			r, n := utf8.DecodeRuneInString(t)
			if n == 0 || r != d.content {
				break
			}
			t = t[n:]
		}
		for k := 0; k < d.stop; k++ {
			r, n := utf8.DecodeLastRuneInString(t)
			if n == 0 || r != d.content {
				break
			}
			t = t[:len(t)-n]
		}
		tokens[i] = t
	}
	return tokens
}

// metaspaceDecoder writes the replacement character as a space, except in the first token,
// where it is dropped unless prepend_scheme is "never".
type metaspaceDecoder struct {
	rep       string
	dropFirst bool
}

func (d *metaspaceDecoder) apply(tokens []string) []string {
	for i, t := range tokens {
		if i == 0 && d.dropFirst {
			tokens[i] = strings.ReplaceAll(t, d.rep, "")
		} else {
			tokens[i] = strings.ReplaceAll(t, d.rep, " ")
		}
	}
	return tokens
}

// wordPieceDecoder joins WordPiece tokens: a token after the first loses its prefix or gets
// a space before it; with cleanup, the spaces the tokenization put before punctuation and
// English contractions are taken out.
type wordPieceDecoder struct {
	prefix  string
	cleanup bool
}

func (d *wordPieceDecoder) apply(tokens []string) []string {
	for i, t := range tokens {
		if i != 0 {
			if rest, ok := strings.CutPrefix(t, d.prefix); ok {
				t = rest
			} else {
				t = " " + t
			}
		}
		if d.cleanup {
			t = cleanupWordPiece(t)
		}
		tokens[i] = t
	}
	return tokens
}

func cleanupWordPiece(s string) string {
	for _, r := range [...][2]string{{" .", "."}, {" ?", "?"}, {" !", "!"}, {" ,", ","}, {" ' ", "'"},
		{" n't", "n't"}, {" 'm", "'m"}, {" do not", " don't"}, {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"}} {
		s = strings.ReplaceAll(s, r[0], r[1])
	}
	return s
}

// byteLevelDecoder maps the byte-level characters of every token back to bytes (a token
// with another character is kept as it is) and joins them into one, decoded as UTF-8 with
// U+FFFD for what is not.
type byteLevelDecoder struct{ toByte map[rune]byte }

func (d *byteLevelDecoder) apply(tokens []string) []string {
	var b []byte
	for _, t := range tokens {
		if raw, ok := fromByteLevel(t, d.toByte); ok {
			b = append(b, raw...)
		} else {
			b = append(b, t...)
		}
	}
	return []string{string(tokenizer.AppendValidUTF8Bytes(nil, b))}
}
