package hf

import "math"

// unigram is the Unigram model of SentencePiece (T5, ALBERT, XLM-R style): a piece is cut
// into the sequence of tokens with the highest total score (Viterbi over every token of the
// vocabulary that matches at each position), a character that starts no token becoming the
// unknown token with the lowest score minus 10; consecutive unknown characters are fused
// into one unknown token, whose text is looked up again, else written as its <0xNN> byte
// tokens (byte_fallback), else as the unknown token. Ties keep the first candidate, in the
// order the tokenizers library tries them.
type unigram struct {
	ids          map[string]uint32
	scores       []float64 // by ID
	trie         byteTrie
	unkScore     float64
	unk          int64 // -1: none (an unknown character is then dropped)
	byteFallback bool
	byteID       [256]int64 // ID of <0xNN>, -1 when absent
	cache        *wordCache
}

var _ wordModel = (*unigram)(nil)

// unkPenalty is how much lower than the lowest token score an unknown character scores.
const unkPenalty = 10.0

func (m *unigram) cutEnd(w string) int { return len(w) }

func (m *unigram) appendWord(dst []uint32, w string) []uint32 {
	if w == "" {
		return dst
	}
	return m.cache.appendCached(dst, w, m.viterbi)
}

// node is the best path ending at a byte position: its score, where its last token starts
// (-1: unreached) and that token's ID (-1: unknown).
type node struct {
	score float64
	from  int32
	id    int32
}

func (m *unigram) viterbi(dst []uint32, w string) []uint32 {
	var buf [64]node
	best := buf[:0]
	if len(w)+1 > len(buf) {
		best = make([]node, len(w)+1)
	} else {
		best = buf[:len(w)+1]
	}
	for i := range best {
		best[i] = node{from: -1, id: -1}
	}
	best[0].from = 0
	for pos := 0; pos < len(w); {
		here := best[pos].score
		charLen := runeLen(w, pos)
		single := false
		n := int32(0) // trie node
		for k := pos; k < len(w); k++ {
			n = m.trie.child(n, w[k])
			if n < 0 {
				break
			}
			id := m.trie.id[n]
			if id < 0 {
				continue
			}
			end := k + 1
			cand := here + m.scores[id]
			if t := &best[end]; t.from < 0 || cand > t.score {
				if int64(id) == m.unk {
					id = -1 // the unknown token's text is fused like unknown text
				}
				*t = node{score: cand, from: int32(pos), id: id}
			}
			if end-pos == charLen {
				single = true
			}
		}
		if !single {
			end := pos + charLen
			cand := here + m.unkScore
			if t := &best[end]; t.from < 0 || cand > t.score {
				*t = node{score: cand, from: int32(pos), id: -1}
			}
		}
		pos += charLen
	}
	// Walk back, collecting tokens in reverse order, fusing runs of unknown text (the
	// unknown token's own text included, as in the tokenizers library); then emit them.
	type span struct{ from, to, id int32 }
	var spanBuf [32]span
	spans := spanBuf[:0]
	for end := int32(len(w)); end > 0; {
		nd := best[end]
		if nd.id < 0 && len(spans) > 0 && spans[len(spans)-1].id < 0 {
			spans[len(spans)-1].from = nd.from
		} else {
			spans = append(spans, span{from: nd.from, to: end, id: nd.id})
		}
		end = nd.from
	}
	for i := len(spans) - 1; i >= 0; i-- {
		sp := spans[i]
		if sp.id >= 0 {
			dst = append(dst, uint32(sp.id))
			continue
		}
		dst = m.appendUnknown(dst, w[sp.from:sp.to])
	}
	return dst
}

// appendUnknown appends the tokens of a run of unknown characters.
func (m *unigram) appendUnknown(dst []uint32, s string) []uint32 {
	if id, ok := m.ids[s]; ok {
		return append(dst, id)
	}
	if m.byteFallback {
		ok := true
		for i := 0; i < len(s); i++ {
			ok = ok && m.byteID[s[i]] >= 0
		}
		if ok {
			for i := 0; i < len(s); i++ {
				dst = append(dst, uint32(m.byteID[s[i]]))
			}
			return dst
		}
	}
	if m.unk >= 0 {
		return append(dst, uint32(m.unk))
	}
	return dst
}

func runeLen(s string, i int) int {
	c := s[i]
	switch {
	case c < 0xC0:
		return 1
	case c < 0xE0:
		return min(2, len(s)-i)
	case c < 0xF0:
		return min(3, len(s)-i)
	}
	return min(4, len(s)-i)
}

// minScore returns the lowest of scores (+Inf for none).
func minScore(scores []float64) float64 {
	lo := math.Inf(1)
	for _, s := range scores {
		lo = min(lo, s)
	}
	return lo
}

// byteTrie maps byte strings (the tokens of a vocabulary) to IDs. The root's children are a
// direct table; other nodes keep their edges sorted in one flat array.
type byteTrie struct {
	root  [256]int32
	first []int32 // index into edges of a node's first edge
	count []uint16
	edges []trieEdgeID
	id    []int32 // token ID ending at the node, -1 none
}

type trieEdgeID struct {
	b  byte
	to int32
}

func (t *byteTrie) child(n int32, b byte) int32 {
	if n == 0 {
		return t.root[b]
	}
	e := t.edges[t.first[n] : t.first[n]+int32(t.count[n])]
	if len(e) <= 8 {
		for _, x := range e {
			if x.b == b {
				return x.to
			}
		}
		return -1
	}
	lo, hi := 0, len(e)
	for lo < hi {
		mid := (lo + hi) / 2
		if e[mid].b < b {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	if lo < len(e) && e[lo].b == b {
		return e[lo].to
	}
	return -1
}

// newByteTrie builds the trie of tokens; ids[token] is the ID a token maps to.
func newByteTrie(ids map[string]uint32) byteTrie {
	// Build with maps, then flatten.
	type bnode struct {
		kids map[byte]int32
		id   int32
	}
	nodes := []bnode{{id: -1}}
	for tok, id := range ids {
		n := int32(0)
		for i := 0; i < len(tok); i++ {
			if nodes[n].kids == nil {
				nodes[n].kids = map[byte]int32{}
			}
			next, ok := nodes[n].kids[tok[i]]
			if !ok {
				nodes = append(nodes, bnode{id: -1})
				next = int32(len(nodes) - 1)
				nodes[n].kids[tok[i]] = next
			}
			n = next
		}
		nodes[n].id = int32(id)
	}
	t := byteTrie{first: make([]int32, len(nodes)), count: make([]uint16, len(nodes)), id: make([]int32, len(nodes))}
	for i := range t.root {
		t.root[i] = -1
	}
	for i, nd := range nodes {
		t.id[i] = nd.id
		if i == 0 {
			for b, to := range nd.kids {
				t.root[b] = to
			}
			continue
		}
		t.first[i] = int32(len(t.edges))
		for b := range 256 {
			if to, ok := nd.kids[byte(b)]; ok {
				t.edges = append(t.edges, trieEdgeID{byte(b), to})
			}
		}
		t.count[i] = uint16(len(t.edges) - int(t.first[i]))
	}
	return t
}
