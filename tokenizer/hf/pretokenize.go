package hf

import (
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
	"unsafe"

	"github.com/dlclark/regexp2/v2"
)

// preTokenizer cuts a normalized segment into pieces that the model encodes one by one. The
// pieces are bytes of the byte-level alphabet: Switchyard keeps the vocabulary in raw bytes,
// so the byte-to-character mapping of the ByteLevel pre-tokenizer is implicit.
type preTokenizer interface {
	// appendPieces appends the pieces of s, in order, to dst. first reports that s starts
	// the text (the Metaspace pre-tokenizer's prepend_scheme "first").
	appendPieces(dst []string, s string, first bool) []string
}

var (
	_ preTokenizer = (*fastSplit)(nil)
	_ preTokenizer = (*regexSplit)(nil)
	_ preTokenizer = (*byteLevelSplit)(nil)
	_ preTokenizer = (*sequenceSplit)(nil)
	_ preTokenizer = (*metaspaceSplit)(nil)
	_ preTokenizer = (*charSplit)(nil)
	_ preTokenizer = (*bertSplit)(nil)
	_ preTokenizer = (*wordSplit)(nil)
)

// Character classes of the Split patterns: \p{L}, \p{N}, \s (Unicode White_Space) and the rest.
const (
	clsOther uint8 = iota
	clsLetter
	clsNumber
	clsSpace
)

// classOfKind maps the kinds of scan.go to the coarse classes of the Qwen and Llama 3
// patterns.
var classOfKind = [...]uint8{kOther: clsOther, kUpper: clsLetter, kLower: clsLetter, kLetter: clsLetter,
	kMark: clsOther, kNumber: clsNumber, kSpace: clsSpace, kPunct: clsOther, kSymbol: clsOther}

// classifier decodes runes and returns their class, from the table of kinds.
type classifier struct {
	k kinds
}

func newClassifier() classifier { return classifier{k: newKinds()} }

// at returns the rune at s[i], its size and its class. s must be valid UTF-8.
func (c classifier) at(s string, i int) (rune, int, uint8) {
	r, n, k := c.k.at(s, i)
	return r, n, classOfKind[k]
}

// Split patterns that fastSplit implements by hand. Both have lookahead, which Go's regexp
// cannot express; the tests prove fastSplit equal to the regexp2 engine on them.
const (
	// patternQwen2 is the pre-tokenizer pattern of Qwen2 and Qwen3: one digit per piece.
	patternQwen2 = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	// patternLlama3 is the pattern of Llama 3 (and OpenAI's cl100k): up to three digits.
	patternLlama3 = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
)

// fastSplit is the hand-written equivalent of patternQwen2 (maxDigits 1) or patternLlama3
// (maxDigits 3) with the Isolated behavior: every match is a piece, and the matches cover the
// whole input. It is a backtracking-free scanner: each alternative of the pattern is tried in
// order at the current position, exactly as a backtracking engine would.
type fastSplit struct {
	cls       classifier
	maxDigits int
}

func (f *fastSplit) appendPieces(dst []string, s string, _ bool) []string {
	for i := 0; i < len(s); {
		end := f.next(s, i)
		dst = append(dst, s[i:end])
		i = end
	}
	return dst
}

// next returns the end of the match that starts at i.
func (f *fastSplit) next(s string, i int) int {
	r, n, c := f.cls.at(s, i)
	switch c {
	case clsLetter: // [^\r\n\p{L}\p{N}]?\p{L}+ without the optional character
		return f.run(s, i+n, clsLetter)
	case clsNumber: // \p{N}{1,maxDigits}
		j := i + n
		for k := 1; k < f.maxDigits && j < len(s); k++ {
			_, n2, c2 := f.cls.at(s, j)
			if c2 != clsNumber {
				break
			}
			j += n2
		}
		return j
	}
	if r == '\'' {
		if end := contraction(s, i+1); end > 0 {
			return end
		}
	}
	// [^\r\n\p{L}\p{N}]?\p{L}+ with the optional character.
	if r != '\r' && r != '\n' && i+n < len(s) {
		if _, _, c2 := f.cls.at(s, i+n); c2 == clsLetter {
			return f.run(s, i+n, clsLetter)
		}
	}
	if c == clsOther { // ?[^\s\p{L}\p{N}]+[\r\n]* without the space
		return newlines(s, f.run(s, i+n, clsOther))
	}
	// c == clsSpace from here on.
	if r == ' ' && i+1 < len(s) {
		if _, n2, c2 := f.cls.at(s, i+1); c2 == clsOther {
			return newlines(s, f.run(s, i+1+n2, clsOther))
		}
	}
	// \s*[\r\n]+ ends after the last line break of the whitespace run; \s+(?!\S) leaves the
	// last whitespace character of a run followed by text to the next piece; \s+ takes the run.
	j, lastBreak, lastStart := i, -1, i
	for j < len(s) {
		r2, n2, c2 := f.cls.at(s, j)
		if c2 != clsSpace {
			break
		}
		if r2 == '\r' || r2 == '\n' {
			lastBreak = j
		}
		lastStart = j
		j += n2
	}
	switch {
	case lastBreak >= 0:
		return lastBreak + 1
	case j == len(s):
		return j
	case lastStart > i:
		return lastStart
	}
	return j
}

// run returns the end of the run of class c starting at j.
func (f *fastSplit) run(s string, j int, c uint8) int {
	for j < len(s) {
		b := s[j]
		if b < utf8.RuneSelf {
			if classOfKind[f.cls.k.bmp[b]] != c {
				return j
			}
			j++
			continue
		}
		_, n, c2 := f.cls.at(s, j)
		if c2 != c {
			return j
		}
		j += n
	}
	return j
}

// newlines returns the end of the run of \r and \n starting at j.
func newlines(s string, j int) int {
	for j < len(s) && (s[j] == '\r' || s[j] == '\n') {
		j++
	}
	return j
}

// contraction returns the end of (?i:'s|'t|'re|'ve|'m|'ll|'d) when s[j-1] is the apostrophe,
// or 0. Case folding is Unicode's: U+017F (long s) folds to s.
func contraction(s string, j int) int {
	if j >= len(s) {
		return 0
	}
	two := func(c byte) bool { return j+1 < len(s) && s[j+1]|0x20 == c }
	switch s[j] | 0x20 {
	case 's', 't', 'm', 'd':
		return j + 1
	case 'r', 'v':
		if two('e') {
			return j + 2
		}
	case 'l':
		if two('l') {
			return j + 2
		}
	}
	if strings.HasPrefix(s[j:], "\u017f") {
		return j + len("\u017f")
	}
	return 0
}

// splitBehavior is what a Split pre-tokenizer does with its matches.
type splitBehavior uint8

const (
	splitIsolated splitBehavior = iota
	splitRemoved
	splitMergedWithPrevious
	splitMergedWithNext
	splitContiguous
)

func parseSplitBehavior(s string) (splitBehavior, error) {
	switch s {
	case "Isolated":
		return splitIsolated, nil
	case "Removed":
		return splitRemoved, nil
	case "MergedWithPrevious":
		return splitMergedWithPrevious, nil
	case "MergedWithNext":
		return splitMergedWithNext, nil
	case "Contiguous":
		return splitContiguous, nil
	}
	return 0, fmt.Errorf("split behavior %q: %w", s, ErrUnsupported)
}

// matcher finds the non-overlapping matches of a pattern.
type matcher interface {
	// appendMatches appends the [start, end) byte offsets of the matches in s to dst.
	appendMatches(dst [][2]int, s string) [][2]int
}

// regexMatcher matches a regular expression with the regexp2 engine (backtracking, with
// lookaround), the general path for patterns fastSplit does not implement.
type regexMatcher struct {
	re *regexp2.Regexp
}

func newRegexMatcher(pattern string) (*regexMatcher, error) {
	re, err := regexp2.Compile(pattern, regexp2.RegexOptions(regexp2.Unicode))
	if err != nil {
		return nil, fmt.Errorf("cannot compile pattern %q: %w: %v", pattern, ErrInvalid, err)
	}
	return &regexMatcher{re: re}, nil
}

func (m *regexMatcher) appendMatches(dst [][2]int, s string) [][2]int {
	idx, err := m.re.FindAllStringIndex(s, -1)
	if err != nil {
		// The engine reports only timeouts and stack limits, neither configured here.
		panic("BUG: regexp2: " + err.Error())
	}
	for _, p := range idx {
		dst = append(dst, [2]int{p[0], p[1]})
	}
	return dst
}

// literalMatcher matches a fixed string.
type literalMatcher struct {
	lit string
}

func (m *literalMatcher) appendMatches(dst [][2]int, s string) [][2]int {
	if m.lit == "" {
		return dst
	}
	for i := 0; ; {
		k := strings.Index(s[i:], m.lit)
		if k < 0 {
			return dst
		}
		dst = append(dst, [2]int{i + k, i + k + len(m.lit)})
		i += k + len(m.lit)
	}
}

// regexSplit is the Split pre-tokenizer of the tokenizers library, for any pattern.
type regexSplit struct {
	m        matcher
	behavior splitBehavior
	invert   bool
}

func (p *regexSplit) appendPieces(dst []string, s string, _ bool) []string {
	var buf [64][2]int
	matches := p.m.appendMatches(buf[:0], s)
	if len(matches) == 0 { // fast path: one piece, whatever the behavior
		if p.invert || s == "" {
			if p.behavior == splitRemoved || s == "" {
				return dst
			}
		}
		return append(dst, s)
	}
	spans := make([]span, 0, 2*len(matches)+1)
	prev := 0
	for _, m := range matches {
		if m[0] > prev {
			spans = append(spans, span{prev, m[0], p.invert})
		}
		spans = append(spans, span{m[0], m[1], !p.invert})
		prev = m[1]
	}
	if prev < len(s) {
		spans = append(spans, span{prev, len(s), p.invert})
	}
	return foldSpans(dst, s, spans, p.behavior)
}

// span is a part of a text: a match of a split pattern or the text between two.
type span struct {
	start, end int
	match      bool
}

// foldSpans appends the pieces of s that spans, which cover s in order, make with a Split
// behavior, as the tokenizers library folds them. It may modify spans.
func foldSpans(dst []string, s string, spans []span, behavior splitBehavior) []string {
	var out []span
	prevMatch := false
	switch behavior {
	case splitIsolated:
		out = spans
	case splitRemoved:
		out = spans[:0]
		for _, sp := range spans {
			if !sp.match {
				out = append(out, sp)
			}
		}
	case splitMergedWithPrevious:
		out = spans[:0]
		for _, sp := range spans {
			if sp.match && !prevMatch && len(out) > 0 {
				out[len(out)-1].end = sp.end
			} else {
				out = append(out, sp)
			}
			prevMatch = sp.match
		}
	case splitMergedWithNext:
		for i := len(spans) - 1; i >= 0; i-- {
			sp := spans[i]
			if sp.match && !prevMatch && len(out) > 0 {
				out[len(out)-1].start = sp.start
			} else {
				out = append(out, sp)
			}
			prevMatch = sp.match
		}
		for i, j := 0, len(out)-1; i < j; i, j = i+1, j-1 {
			out[i], out[j] = out[j], out[i]
		}
	case splitContiguous:
		out = spans[:0]
		for _, sp := range spans {
			if sp.match == prevMatch && len(out) > 0 {
				out[len(out)-1].end = sp.end
			} else {
				out = append(out, sp)
			}
			prevMatch = sp.match
		}
	}
	for _, sp := range out {
		if sp.end > sp.start {
			dst = append(dst, s[sp.start:sp.end])
		}
	}
	return dst
}

// patternGPT2 is the pattern of the ByteLevel pre-tokenizer with use_regex.
const patternGPT2 = `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`

// byteLevelSplit is the ByteLevel pre-tokenizer: an optional space before each piece that
// does not start with one, then, with use_regex, the GPT-2 split. The byte-to-character
// mapping itself is implicit (see preTokenizer).
type byteLevelSplit struct {
	addPrefixSpace bool
	split          preTokenizer // nil without use_regex
}

func (p *byteLevelSplit) appendPieces(dst []string, s string, first bool) []string {
	if p.addPrefixSpace && !strings.HasPrefix(s, " ") {
		s = " " + s
	}
	if p.split == nil {
		return append(dst, s)
	}
	return p.split.appendPieces(dst, s, first)
}

// sequenceSplit applies its pre-tokenizers in turn, each to every piece of the previous one.
type sequenceSplit struct {
	steps []preTokenizer
}

func (p *sequenceSplit) appendPieces(dst []string, s string, first bool) []string {
	cur := []string{s}
	var next []string
	for _, step := range p.steps {
		next = next[:0]
		for i, piece := range cur {
			// A piece still starts the text when it is the first and begins where s does.
			next = step.appendPieces(next, piece, first && i == 0 && sameStart(piece, s))
		}
		cur, next = next, cur
	}
	return append(dst, cur...)
}

// sameStart reports whether a and b start at the same byte of memory (a piece cut from the
// start of b, not a copy).
func sameStart(a, b string) bool {
	return len(a) > 0 && len(b) > 0 && unsafe.StringData(a) == unsafe.StringData(b)
}

// prependScheme is when the Metaspace pre-tokenizer writes a ▁ before a piece.
type prependScheme uint8

const (
	prependAlways prependScheme = iota
	prependFirst                // only before the start of the text
	prependNever
)

// metaspaceSplit is the Metaspace pre-tokenizer: spaces become the replacement character
// (▁), which is also written before the text unless it starts with one (prepend_scheme), and,
// with split, every replacement character starts a new piece.
type metaspaceSplit struct {
	rep     string
	prepend prependScheme
	split   bool
}

func (p *metaspaceSplit) appendPieces(dst []string, s string, first bool) []string {
	if s == "" {
		return dst
	}
	s = strings.ReplaceAll(s, " ", p.rep)
	if (p.prepend == prependAlways || (p.prepend == prependFirst && first)) && !strings.HasPrefix(s, p.rep) {
		s = p.rep + s
	}
	if !p.split {
		return append(dst, s)
	}
	start := 0
	for i := 1; i < len(s); {
		k := strings.Index(s[i:], p.rep)
		if k < 0 {
			break
		}
		dst = append(dst, s[start:i+k])
		start, i = i+k, i+k+len(p.rep)
	}
	return append(dst, s[start:])
}

// charSplit splits at every character for which match is true, with a Split behavior: the
// WhitespaceSplit, Punctuation and Digits pre-tokenizers.
type charSplit struct {
	match    func(r rune) bool
	behavior splitBehavior
}

func (p *charSplit) appendPieces(dst []string, s string, _ bool) []string {
	return splitChars(dst, s, p.match, p.behavior)
}

// splitChars splits s at every character for which match is true, each such character a
// match of its own, and folds the parts with behavior.
func splitChars(dst []string, s string, match func(r rune) bool, behavior splitBehavior) []string {
	var buf [64]span
	spans := buf[:0]
	prev := 0
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		if match(r) {
			if i > prev {
				spans = append(spans, span{prev, i, false})
			}
			spans = append(spans, span{i, i + n, true})
			prev = i + n
		}
		i += n
	}
	if prev < len(s) {
		spans = append(spans, span{prev, len(s), false})
	}
	return foldSpans(dst, s, spans, behavior)
}

// bertSplit is the BertPreTokenizer: pieces are cut at whitespace, which is dropped, and
// every punctuation character is a piece of its own.
type bertSplit struct{}

func (bertSplit) appendPieces(dst []string, s string, _ bool) []string {
	start := 0
	for i := 0; i < len(s); {
		r, n := rune(s[i]), 1
		if r >= utf8.RuneSelf {
			r, n = utf8.DecodeRuneInString(s[i:])
		}
		switch {
		case isRustWhitespace(r):
			if i > start {
				dst = append(dst, s[start:i])
			}
			start = i + n
		case isBertPunct(r):
			if i > start {
				dst = append(dst, s[start:i])
			}
			dst = append(dst, s[i:i+n])
			start = i + n
		}
		i += n
	}
	if start < len(s) {
		dst = append(dst, s[start:])
	}
	return dst
}

// isRustWhitespace is Unicode's White_Space property (Rust's char::is_whitespace).
func isRustWhitespace(r rune) bool {
	if r < utf8.RuneSelf {
		return r == ' ' || (r >= '\t' && r <= '\r')
	}
	return unicode.Is(unicode.White_Space, r)
}

// isBertPunct is ASCII punctuation (symbols included) or a Unicode punctuation character
// of Unicode 8.0, whose categories the reference uses.
func isBertPunct(r rune) bool {
	if r < utf8.RuneSelf {
		return (r >= '!' && r <= '/') || (r >= ':' && r <= '@') || (r >= '[' && r <= '`') || (r >= '{' && r <= '~')
	}
	return unicode.IsPunct(r) && !unicode.Is(assignedAfterUnicode8, r)
}

// wordSplit is the Whitespace pre-tokenizer: the matches of \w+|[^\w\s]+, whitespace
// dropped.
type wordSplit struct{}

func (wordSplit) appendPieces(dst []string, s string, _ bool) []string {
	const none, word, other = 0, 1, 2
	start, kind := 0, none
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		k := other
		switch {
		case isRegexWord(r):
			k = word
		case isRegexSpace(r):
			k = none
		}
		if k != kind {
			if kind != none && i > start {
				dst = append(dst, s[start:i])
			}
			start, kind = i, k
		}
		i += n
	}
	if kind != none && start < len(s) {
		dst = append(dst, s[start:])
	}
	return dst
}

// isRegexWord is \w of Rust's regex crate: Alphabetic, M, Nd, Pc and Join_Control.
func isRegexWord(r rune) bool {
	if r < utf8.RuneSelf {
		return r == '_' || (r >= '0' && r <= '9') || asciiLetter(byte(r))
	}
	return unicode.IsLetter(r) || unicode.In(r, unicode.Nl, unicode.Other_Alphabetic, unicode.M, unicode.Nd, unicode.Pc, unicode.Join_Control)
}

// isRegexSpace is \s of Rust's regex crate: White_Space.
func isRegexSpace(r rune) bool { return isRustWhitespace(r) }
