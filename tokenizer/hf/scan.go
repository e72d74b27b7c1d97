package hf

import (
	"sync"
	"unicode"
	"unicode/utf8"
)

// Hand-written scanners for the Split patterns of gpt-oss (OpenAI's o200k) and DeepSeek V3,
// which Go's regexp cannot express (lookahead) and the backtracking engine runs slowly. Each
// tries the pattern's alternatives in order at the current position, exactly as a
// backtracking engine does; the tests and fuzz targets prove them equal to the regexp2
// engine on the patterns.

// Split patterns with a scanner here.
const (
	// patternO200k is gpt-oss's pattern: case-aware letter runs with contractions, up to
	// three digits, punctuation runs with trailing line breaks and slashes, whitespace.
	patternO200k = `[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	// The three Split patterns of DeepSeek V3, applied in turn.
	patternDigits3  = `\p{N}{1,3}`
	patternCJKKana  = "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+"
	patternDeepSeek = "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+"
)

// Character classes of the scanners here.
const (
	kOther  uint8 = iota
	kUpper        // Lu, Lt
	kLower        // Ll
	kLetter       // Lm, Lo
	kMark         // M
	kNumber       // N
	kSpace        // \s: White_Space
	kPunct        // P
	kSymbol       // S
)

func slowKind(r rune) uint8 {
	switch {
	case unicode.In(r, unicode.Lu, unicode.Lt):
		return kUpper
	case unicode.Is(unicode.Ll, r):
		return kLower
	case unicode.In(r, unicode.Lm, unicode.Lo):
		return kLetter
	case unicode.IsMark(r):
		return kMark
	case unicode.IsNumber(r):
		return kNumber
	case unicode.IsSpace(r):
		return kSpace
	case unicode.IsPunct(r):
		return kPunct
	case unicode.IsSymbol(r):
		return kSymbol
	}
	return kOther
}

// bmpKinds holds the kind of every rune of the Basic Multilingual Plane, built once.
var bmpKinds = sync.OnceValue(func() *[0x10000]uint8 {
	var t [0x10000]uint8
	for r := range rune(0x10000) {
		t[r] = slowKind(r)
	}
	return &t
})

// kinds decodes runes and returns their kind.
type kinds struct{ bmp *[0x10000]uint8 }

func newKinds() kinds { return kinds{bmp: bmpKinds()} }

func (k kinds) at(s string, i int) (rune, int, uint8) {
	b := s[i]
	if b < utf8.RuneSelf {
		return rune(b), 1, k.bmp[b]
	}
	r, n := utf8.DecodeRuneInString(s[i:])
	if r < 0x10000 {
		return r, n, k.bmp[r]
	}
	return r, n, slowKind(r)
}

func isUpperSet(k uint8) bool { return k == kUpper || k == kLetter || k == kMark } // [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]
func isLowerSet(k uint8) bool { return k == kLower || k == kLetter || k == kMark } // [\p{Ll}\p{Lm}\p{Lo}\p{M}]
func isLetterKind(k uint8) bool {
	return k == kUpper || k == kLower || k == kLetter
}

// scanner is a Split pre-tokenizer whose matches cover the whole input (Isolated): next
// returns the end of the piece that starts at i.
type scanner interface {
	preTokenizer
	next(s string, i int) int
}

var (
	_ scanner = (*fastSplit)(nil)
	_ scanner = (*o200kSplit)(nil)
)

// o200kSplit is the hand-written equivalent of patternO200k.
type o200kSplit struct{ k kinds }

func (f *o200kSplit) appendPieces(dst []string, s string, _ bool) []string {
	for i := 0; i < len(s); {
		end := f.next(s, i)
		dst = append(dst, s[i:end])
		i = end
	}
	return dst
}

func (f *o200kSplit) next(s string, i int) int {
	r, n, c := f.k.at(s, i)
	// [^\r\n\p{L}\p{N}]?: tried with the optional character first, then without.
	prefix := !isLetterKind(c) && c != kNumber && r != '\r' && r != '\n'
	if prefix {
		if e := f.upperLower(s, i+n); e >= 0 {
			return e
		}
	}
	if e := f.upperLower(s, i); e >= 0 {
		return e
	}
	if prefix {
		if e := f.upperThenLower(s, i+n); e >= 0 {
			return e
		}
	}
	if e := f.upperThenLower(s, i); e >= 0 {
		return e
	}
	if c == kNumber { // \p{N}{1,3}
		j := i + n
		for k := 1; k < 3 && j < len(s); k++ {
			_, n2, c2 := f.k.at(s, j)
			if c2 != kNumber {
				break
			}
			j += n2
		}
		return j
	}
	// ?[^\s\p{L}\p{N}]+[\r\n/]*
	notWord := func(c uint8) bool { return c != kSpace && !isLetterKind(c) && c != kNumber }
	if r == ' ' && i+1 < len(s) {
		if _, n2, c2 := f.k.at(s, i+1); notWord(c2) {
			return lineBreaksSlashes(s, f.k.runOf(s, i+1+n2, notWord))
		}
	}
	if notWord(c) {
		return lineBreaksSlashes(s, f.k.runOf(s, i+n, notWord))
	}
	return whitespaceEnd(s, i, f.k)
}

// upperLower matches [UU]*[LL]+ and an optional contraction at j, or returns -1: the
// greedy run of UU gives back characters until one of the LL set can start LL+.
func (f *o200kSplit) upperLower(s string, j int) int {
	k, lastLower := j, -1
	for k < len(s) {
		_, n, c := f.k.at(s, k)
		if !isUpperSet(c) {
			break
		}
		if isLowerSet(c) {
			lastLower = k + n
		}
		k += n
	}
	if k < len(s) {
		if _, n, c := f.k.at(s, k); isLowerSet(c) {
			return f.contraction(s, f.k.runOf(s, k+n, isLowerSet))
		}
	}
	if lastLower >= 0 {
		return f.contraction(s, lastLower)
	}
	return -1
}

// upperThenLower matches [UU]+[LL]* and an optional contraction at j, or returns -1.
func (f *o200kSplit) upperThenLower(s string, j int) int {
	k := f.k.runOf(s, j, isUpperSet)
	if k == j {
		return -1
	}
	return f.contraction(s, f.k.runOf(s, k, isLowerSet))
}

func (f *o200kSplit) contraction(s string, e int) int {
	if e < len(s) && s[e] == '\'' {
		if end := contraction(s, e+1); end > 0 {
			return end
		}
	}
	return e
}

// runOf returns the end of the run of characters whose kind is in set, from j.
func (k kinds) runOf(s string, j int, set func(uint8) bool) int {
	for j < len(s) {
		_, n, c := k.at(s, j)
		if !set(c) {
			return j
		}
		j += n
	}
	return j
}

// lineBreaksSlashes returns the end of the run of \r, \n and / from j.
func lineBreaksSlashes(s string, j int) int {
	for j < len(s) && (s[j] == '\r' || s[j] == '\n' || s[j] == '/') {
		j++
	}
	return j
}

// whitespaceEnd returns the end of \s*[\r\n]+|\s+(?!\S)|\s+ at i, where s[i] is whitespace
// (or, when it is not, of the one character there).
func whitespaceEnd(s string, i int, k kinds) int {
	j, lastBreak, lastStart := i, -1, i
	for j < len(s) {
		r, n, c := k.at(s, j)
		if c != kSpace {
			break
		}
		if r == '\r' || r == '\n' {
			lastBreak = j
		}
		lastStart = j
		j += n
	}
	switch {
	case j == i: // not whitespace: no alternative matches; one character
		_, n, _ := k.at(s, i)
		return i + n
	case lastBreak >= 0:
		return lastBreak + 1
	case j == len(s):
		return j
	case lastStart > i:
		return lastStart
	}
	return j
}

// runSplit is a Split pre-tokenizer whose pattern is a run of one class of characters
// (Isolated): runs of at most max characters of the class (0: unbounded) are pieces, and so
// is the text between them. DeepSeek V3's \p{N}{1,3} and CJK-and-kana splits.
type runSplit struct {
	k   kinds
	in  func(r rune, kind uint8) bool
	max int
}

func (p *runSplit) appendPieces(dst []string, s string, _ bool) []string {
	start := 0 // start of the text between matches
	for i := 0; i < len(s); {
		r, n, c := p.k.at(s, i)
		if !p.in(r, c) {
			i += n
			continue
		}
		if i > start {
			dst = append(dst, s[start:i])
		}
		j, count := i+n, 1
		for j < len(s) && (p.max == 0 || count < p.max) {
			r2, n2, c2 := p.k.at(s, j)
			if !p.in(r2, c2) {
				break
			}
			j += n2
			count++
		}
		dst = append(dst, s[i:j])
		start, i = j, j
	}
	if start < len(s) {
		dst = append(dst, s[start:])
	}
	return dst
}

func isCJKOrKana(r rune, _ uint8) bool {
	return (r >= 0x4E00 && r <= 0x9FA5) || (r >= 0x3040 && r <= 0x309F) || (r >= 0x30A0 && r <= 0x30FF)
}

func isNumberKind(_ rune, k uint8) bool { return k == kNumber }

// deepSeekSplit is the hand-written equivalent of patternDeepSeek (Isolated). Unlike the
// others, a character may start no alternative; the text between matches is a piece too.
type deepSeekSplit struct{ k kinds }

func (p *deepSeekSplit) appendPieces(dst []string, s string, _ bool) []string {
	start := 0
	for i := 0; i < len(s); {
		end := p.match(s, i)
		if end < 0 {
			_, n, _ := p.k.at(s, i)
			i += n
			continue
		}
		if i > start {
			dst = append(dst, s[start:i])
		}
		dst = append(dst, s[i:end])
		start, i = end, end
	}
	if start < len(s) {
		dst = append(dst, s[start:])
	}
	return dst
}

// match returns the end of the match at i, or -1.
func (p *deepSeekSplit) match(s string, i int) int {
	r, n, c := p.k.at(s, i)
	// [ASCII punctuation][A-Za-z]+
	if r < utf8.RuneSelf && isASCIIPunct(byte(r)) && i+1 < len(s) && asciiLetter(s[i+1]) {
		j := i + 2
		for j < len(s) && asciiLetter(s[j]) {
			j++
		}
		return j
	}
	letterMark := func(c uint8) bool { return isLetterKind(c) || c == kMark }
	// [^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+, with the optional character first.
	if r != '\r' && r != '\n' && !isLetterKind(c) && c != kPunct && c != kSymbol && i+n < len(s) {
		if _, n2, c2 := p.k.at(s, i+n); letterMark(c2) {
			return p.k.runOf(s, i+n+n2, letterMark)
		}
	}
	if letterMark(c) {
		return p.k.runOf(s, i+n, letterMark)
	}
	// ?[\p{P}\p{S}]+[\r\n]*
	ps := func(c uint8) bool { return c == kPunct || c == kSymbol }
	if r == ' ' && i+1 < len(s) {
		if _, n2, c2 := p.k.at(s, i+1); ps(c2) {
			return newlines(s, p.k.runOf(s, i+1+n2, ps))
		}
	}
	if ps(c) {
		return newlines(s, p.k.runOf(s, i+n, ps))
	}
	if c == kSpace {
		return whitespaceEnd(s, i, p.k)
	}
	return -1
}

func isASCIIPunct(c byte) bool {
	return (c >= '!' && c <= '/') || (c >= ':' && c <= '@') || (c >= '[' && c <= '`') || (c >= '{' && c <= '~')
}
