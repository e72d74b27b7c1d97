package hf

import (
	"unicode"
	"unicode/utf8"
)

// addedToken is an entry of tokenizer.json's added_tokens: a string matched in the text
// before any other processing (or after normalization, when normalized) and encoded as one ID.
type addedToken struct {
	id         uint32
	content    string
	special    bool
	singleWord bool
	lstrip     bool
	rstrip     bool
	normalized bool
}

// addedMatcher finds added tokens in text, leftmost first and, among those starting at the
// same byte, longest first: the leftmost-longest semantics of the tokenizers library.
type addedMatcher struct {
	tokens []addedToken
	first  [256]bool // bytes that start some token
	nodes  []trieNode
}

type trieNode struct {
	edges []trieEdge
	token int32 // index into tokens, or -1
}

type trieEdge struct {
	b  byte
	to int32
}

func newAddedMatcher(tokens []addedToken) *addedMatcher {
	m := &addedMatcher{tokens: tokens, nodes: []trieNode{{token: -1}}}
	for i, t := range tokens {
		if t.content == "" {
			continue
		}
		m.first[t.content[0]] = true
		n := int32(0)
		for j := 0; j < len(t.content); j++ {
			n = m.child(n, t.content[j])
		}
		if m.nodes[n].token < 0 {
			m.nodes[n].token = int32(i)
		}
	}
	return m
}

func (m *addedMatcher) child(n int32, b byte) int32 {
	for _, e := range m.nodes[n].edges {
		if e.b == b {
			return e.to
		}
	}
	m.nodes = append(m.nodes, trieNode{token: -1})
	to := int32(len(m.nodes) - 1)
	m.nodes[n].edges = append(m.nodes[n].edges, trieEdge{b, to})
	return to
}

// longest returns the index of the longest token that starts s[i:] and its end, or -1.
func (m *addedMatcher) longest(s string, i int) (int32, int) {
	best, end := int32(-1), 0
	n := int32(0)
	for j := i; j < len(s); j++ {
		next := int32(-1)
		for _, e := range m.nodes[n].edges {
			if e.b == s[j] {
				next = e.to
				break
			}
		}
		if next < 0 {
			break
		}
		n = next
		if t := m.nodes[n].token; t >= 0 {
			best, end = t, j+1
		}
	}
	return best, end
}

// addedSplit is one part of a text cut at added tokens: either a token or the text between.
type addedSplit struct {
	start, end int
	token      int32 // index into the matcher's tokens, or -1 for text
}

// appendSplits cuts s at the added tokens it contains, applying each token's single_word,
// lstrip and rstrip options as the tokenizers library does.
func (m *addedMatcher) appendSplits(dst []addedSplit, s string) []addedSplit {
	if m == nil || len(m.tokens) == 0 {
		return append(dst, addedSplit{0, len(s), -1})
	}
	startOffset := 0
	for i := 0; i < len(s); {
		if !m.first[s[i]] {
			i++
			continue
		}
		t, stop := m.longest(s, i)
		if t < 0 {
			i++
			continue
		}
		start := i
		tok := &m.tokens[t]
		if tok.singleWord {
			startSpace := start == 0 || !endsWithWord(s[:start])
			stopSpace := stop == len(s) || !startsWithWord(s[stop:])
			if !startSpace || !stopSpace {
				i = stop // the match is consumed even when rejected
				continue
			}
		}
		if tok.lstrip {
			ns := start
			for ns > 0 {
				r, n := utf8.DecodeLastRuneInString(s[:ns])
				if !unicode.IsSpace(r) {
					break
				}
				ns -= n
			}
			start = max(ns, startOffset)
		}
		if tok.rstrip {
			for stop < len(s) {
				r, n := utf8.DecodeRuneInString(s[stop:])
				if !unicode.IsSpace(r) {
					break
				}
				stop += n
			}
		}
		if startOffset < start {
			dst = append(dst, addedSplit{startOffset, start, -1})
		}
		dst = append(dst, addedSplit{start, stop, t})
		startOffset = stop
		i = max(stop, i+1)
	}
	if startOffset < len(s) || len(dst) == 0 {
		dst = append(dst, addedSplit{startOffset, len(s), -1})
	}
	return dst
}

func isWordChar(r rune) bool {
	return unicode.IsLetter(r) || unicode.IsNumber(r) || r == '_' || unicode.Is(unicode.Mn, r)
}

func endsWithWord(s string) bool {
	r, _ := utf8.DecodeLastRuneInString(s)
	return s != "" && isWordChar(r)
}

func startsWithWord(s string) bool {
	r, _ := utf8.DecodeRuneInString(s)
	return s != "" && isWordChar(r)
}
