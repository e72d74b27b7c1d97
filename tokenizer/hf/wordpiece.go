package hf

import "unicode/utf8"

// wordPiece is the WordPiece model of BERT-family tokenizers: a piece is cut greedily into
// the longest tokens of the vocabulary from its start, tokens after the first written with
// the continuing-subword prefix ("##"). A piece that cannot be cut so, or that has more than
// maxChars characters, is the unknown token.
type wordPiece struct {
	start    map[string]uint32 // tokens that may start a piece
	cont     map[string]uint32 // tokens that continue a piece, without the prefix
	unk      uint32
	maxChars int
	maxLen   int // longest token in bytes, prefix excluded
	cache    *wordCache
}

var _ wordModel = (*wordPiece)(nil)

func (m *wordPiece) cutEnd(w string) int { return len(w) }

func (m *wordPiece) appendWord(dst []uint32, w string) []uint32 {
	if w == "" {
		return dst
	}
	return m.cache.appendCached(dst, w, m.cut)
}

func (m *wordPiece) cut(dst []uint32, w string) []uint32 {
	if len(w) > m.maxChars && utf8.RuneCountInString(w) > m.maxChars {
		return append(dst, m.unk)
	}
	first := len(dst)
	for pos := 0; pos < len(w); {
		vocab := m.start
		if pos > 0 {
			vocab = m.cont
		}
		end := min(len(w), pos+m.maxLen)
		for end < len(w) && !utf8.RuneStart(w[end]) {
			end--
		}
		found := false
		for end > pos {
			if id, ok := vocab[w[pos:end]]; ok {
				dst = append(dst, id)
				found = true
				break
			}
			_, n := utf8.DecodeLastRuneInString(w[pos:end])
			end -= n
		}
		if !found {
			return append(dst[:first], m.unk)
		}
		pos = end
	}
	return dst
}
