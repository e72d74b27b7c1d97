package hf

import (
	"strings"
	"sync"
	"unicode"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
)

// normalizer rewrites a segment of text before pre-tokenization.
type normalizer interface {
	normalize(s string) string
}

var (
	_ normalizer = unicodeForm{}
	_ normalizer = lowercase{}
	_ normalizer = (*stripNormalizer)(nil)
	_ normalizer = (*replaceNormalizer)(nil)
	_ normalizer = (*prependNormalizer)(nil)
	_ normalizer = stripAccents{}
	_ normalizer = (*sequenceNormalizer)(nil)
	_ normalizer = (*bertNormalizer)(nil)
)

// unicodeForm is one of the NFC, NFD, NFKC and NFKD normalizers, with the reference's
// Unicode 9.0 tables: a character assigned since then is left as it is and, having no
// combining class and no decomposition, normalizes apart from its neighbours. Fast path:
// text already in the form is returned as is.
type unicodeForm struct {
	form norm.Form
}

func (n unicodeForm) normalize(s string) string { return normalizeUnicode9(n.form, s) }

// normalizeUnicode9 normalizes s to form as Unicode 9.0 does.
func normalizeUnicode9(form norm.Form, s string) string {
	i, size := newerThanUnicode9(s)
	if i < 0 {
		return form.String(s)
	}
	var b strings.Builder
	b.Grow(len(s) + 8)
	for i >= 0 {
		b.WriteString(form.String(s[:i]))
		b.WriteString(s[i : i+size])
		s = s[i+size:]
		i, size = newerThanUnicode9(s)
	}
	b.WriteString(form.String(s))
	return b.String()
}

// newerThanUnicode9 returns the index and size of the first character of s assigned after
// Unicode 9.0, or -1.
func newerThanUnicode9(s string) (int, int) {
	bmp := unicode9BMP()
	for i := 0; i < len(s); {
		if s[i] < utf8.RuneSelf {
			i++
			continue
		}
		r, n := utf8.DecodeRuneInString(s[i:])
		if r < 0x10000 {
			if bmp[r>>6]&(1<<(r&63)) != 0 {
				return i, n
			}
		} else if unicode.Is(assignedAfterUnicode9, r) {
			return i, n
		}
		i += n
	}
	return -1, 0
}

// unicode9BMP is assignedAfterUnicode9's Basic Multilingual Plane as a bit set, built once.
var unicode9BMP = sync.OnceValue(func() *[0x10000 / 64]uint64 {
	var bits [0x10000 / 64]uint64
	for _, r := range assignedAfterUnicode9.R16 {
		for c := uint32(r.Lo); c <= uint32(r.Hi); c += uint32(r.Stride) {
			bits[c>>6] |= 1 << (c & 63)
		}
	}
	return &bits
})

// lowercase is the Lowercase normalizer: Rust's char::to_lowercase, each character alone
// (no final sigma), which differs from Go's simple mapping only for U+0130.
type lowercase struct{}

func (lowercase) normalize(s string) string { return toLower(s) }

func toLower(s string) string {
	if !strings.ContainsRune(s, '\u0130') {
		return strings.ToLower(s)
	}
	return strings.ToLower(strings.ReplaceAll(s, "\u0130", "i\u0307"))
}

// stripNormalizer is the Strip normalizer: it trims Unicode whitespace.
type stripNormalizer struct {
	left, right bool
}

func (n *stripNormalizer) normalize(s string) string {
	if n.left {
		s = strings.TrimLeftFunc(s, unicode.IsSpace)
	}
	if n.right {
		s = strings.TrimRightFunc(s, unicode.IsSpace)
	}
	return s
}

// replaceNormalizer is the Replace normalizer: every match of a pattern becomes content.
type replaceNormalizer struct {
	m       matcher
	content string
}

func (n *replaceNormalizer) normalize(s string) string {
	if lit, ok := n.m.(*literalMatcher); ok { // fast path: a fixed string
		if lit.lit == "" {
			return s
		}
		return strings.ReplaceAll(s, lit.lit, n.content)
	}
	matches := n.m.appendMatches(nil, s)
	if len(matches) == 0 {
		return s
	}
	var b strings.Builder
	prev := 0
	for _, m := range matches {
		b.WriteString(s[prev:m[0]])
		b.WriteString(n.content)
		prev = m[1]
	}
	b.WriteString(s[prev:])
	return b.String()
}

// prependNormalizer is the Prepend normalizer: non-empty text gets a prefix.
type prependNormalizer struct {
	prefix string
}

func (n *prependNormalizer) normalize(s string) string {
	if s == "" {
		return s
	}
	return n.prefix + s
}

// stripAccents is the StripAccents normalizer: it removes nonspacing marks.
type stripAccents struct{}

func (stripAccents) normalize(s string) string {
	return strings.Map(func(r rune) rune {
		if unicode.Is(unicode.Mn, r) {
			return -1
		}
		return r
	}, s)
}

// sequenceNormalizer applies its normalizers in turn.
type sequenceNormalizer struct {
	steps []normalizer
}

func (n *sequenceNormalizer) normalize(s string) string {
	for _, step := range n.steps {
		s = step.normalize(s)
	}
	return s
}

// chunkSafe reports whether normalizing two texts apart gives the normalization of their
// concatenation when the second starts with an ASCII character other than whitespace and the
// first ends with a line feed or an ASCII letter: true for the Unicode normalization forms,
// which never compose or reorder across such a character.
func chunkSafe(n normalizer) bool {
	switch n := n.(type) {
	case nil, unicodeForm:
		return true
	case *sequenceNormalizer:
		for _, s := range n.steps {
			if !chunkSafe(s) {
				return false
			}
		}
		return true
	}
	return false
}

// bertNormalizer is the BertNormalizer: clean_text drops NUL, U+FFFD and control, format,
// private-use and surrogate characters (Cc, Cf, Co, Cs but tab, line feed and carriage
// return) and turns every
// whitespace character into a space; handle_chinese_chars puts spaces around CJK
// ideographs; strip_accents (default: as lowercase) decomposes (NFD) and drops nonspacing
// marks; lowercase lowercases. The categories are Unicode 8.0's, as the reference's are:
// characters assigned since then count as unassigned (kept).
type bertNormalizer struct {
	clean, chinese, stripAccents, lower bool
}

func (n *bertNormalizer) normalize(s string) string {
	if n.clean || n.chinese {
		var b strings.Builder
		b.Grow(len(s) + 8)
		for _, r := range s {
			switch {
			case n.clean && (r == 0 || r == utf8.RuneError || isBertControl(r)):
				continue
			case n.clean && isRustWhitespace(r):
				b.WriteByte(' ')
			case n.chinese && isCJK(r):
				b.WriteByte(' ')
				b.WriteRune(r)
				b.WriteByte(' ')
			default:
				b.WriteRune(r)
			}
		}
		s = b.String()
	}
	if n.stripAccents {
		s = strings.Map(func(r rune) rune {
			if unicode.Is(unicode.Mn, r) && !unicode.Is(assignedAfterUnicode8, r) {
				return -1
			}
			return r
		}, normalizeUnicode9(norm.NFD, s))
	}
	if n.lower {
		s = toLower(s)
	}
	return s
}

// isBertControl reports a character of the categories Cc, Cf, Co or Cs other than tab, line
// feed and carriage return.
func isBertControl(r rune) bool {
	switch r {
	case '\t', '\n', '\r':
		return false
	}
	if r < utf8.RuneSelf {
		return r < ' ' || r == 0x7F
	}
	return unicode.In(r, unicode.Cc, unicode.Cf, unicode.Co, unicode.Cs) && !unicode.Is(assignedAfterUnicode8, r)
}

// isCJK reports a character of the CJK ideograph blocks BertNormalizer spaces out.
func isCJK(r rune) bool {
	return (r >= 0x4E00 && r <= 0x9FFF) || (r >= 0x3400 && r <= 0x4DBF) || (r >= 0x20000 && r <= 0x2A6DF) ||
		(r >= 0x2A700 && r <= 0x2B73F) || (r >= 0x2B740 && r <= 0x2B81F) || (r >= 0x2B920 && r <= 0x2CEAF) ||
		(r >= 0xF900 && r <= 0xFAFF) || (r >= 0x2F800 && r <= 0x2FA1F)
}
