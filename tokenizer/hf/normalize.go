package hf

import (
	"strings"
	"unicode"

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
)

// unicodeForm is one of the NFC, NFD, NFKC and NFKD normalizers. Fast path: text already in
// the form is returned as is.
type unicodeForm struct {
	form norm.Form
}

func (n unicodeForm) normalize(s string) string { return n.form.String(s) }

// lowercase is the Lowercase normalizer (simple case mapping).
type lowercase struct{}

func (lowercase) normalize(s string) string { return strings.ToLower(s) }

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
