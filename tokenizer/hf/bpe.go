package hf

import (
	"hash/maphash"
	"math"
	"strings"
	"sync/atomic"
	"unicode/utf8"
)

// noRank marks a pair of symbols that no merge joins.
const noRank = math.MaxUint32

// bpe is a BPE model. Merges join adjacent symbols lowest rank first, leftmost first on ties,
// as the tokenizers library does. Two kinds:
//
//   - byte-level (GPT-2 style): the vocabulary is kept in raw bytes, a piece is a byte string
//     and its initial symbols are its bytes;
//   - character-level (SentencePiece style: Llama 2, Gemma, Mistral): a piece's initial
//     symbols are its characters' tokens; a character without one becomes the tokens of its
//     UTF-8 bytes (<0xNN>, byte_fallback) or the unknown token (consecutive ones fused with
//     fuse_unk), or is dropped when there is none.
type bpe struct {
	vocab        map[string]uint32 // a token's raw bytes (byte-level) or text → ID
	byteLevel    bool
	byteID       [256]int64 // byte-level: ID of each single byte; else ID of <0xNN>; -1 when absent
	charID       []int32    // character-level: ID of each BMP character's token, -1 when absent
	astralID     map[rune]uint32
	byteFallback bool
	unk          int64 // ID of the unknown token, -1 when there is none
	fuseUnk      bool
	merges       mergeTable
	ignoreMerges bool // a piece that is a whole token is that token, merges or not
	cutMeta      bool // cutEnd may cut before a ▁ that follows an ASCII letter or digit
	cache        *wordCache
}

var _ wordModel = (*bpe)(nil)

// appendWord appends the IDs of one piece to dst.
func (m *bpe) appendWord(dst []uint32, w string) []uint32 {
	if len(w) == 1 && m.byteLevel {
		if id := m.byteID[w[0]]; id >= 0 {
			return append(dst, uint32(id))
		}
		return dst
	}
	if !m.cutMeta || len(w) <= maxCachedWord {
		return m.appendSubword(dst, w)
	}
	// A long SentencePiece-style piece: its words merge apart (see cutEnd).
	for len(w) > 0 {
		end := m.nextCut(w, 1)
		dst = m.appendSubword(dst, w[:end])
		w = w[end:]
	}
	return dst
}

// appendSubword appends the IDs of w, merged as one word, through the word cache.
func (m *bpe) appendSubword(dst []uint32, w string) []uint32 {
	if w == "" {
		return dst
	}
	return m.cache.appendCached(dst, w, m.mergeWord)
}

// mergeWord appends the IDs of w merged as one word: the token w itself with ignore_merges.
func (m *bpe) mergeWord(dst []uint32, w string) []uint32 {
	if id, ok := m.vocab[w]; ok && m.ignoreMerges {
		return append(dst, id)
	}
	return m.merge(dst, w)
}

// metaspaceRune is the character SentencePiece-style tokenizers write for a space.
const metaspaceRune = '\u2581'

// cutEnd returns the end of the first chunk of a long piece: the first ▁ at least minChunk
// bytes in that follows an ASCII letter or digit, when no merge can join across such a place
// (cutMeta, see buildBPE), so the chunks merge as the whole piece would; else len(w).
func (m *bpe) cutEnd(w string) int {
	if !m.cutMeta {
		return len(w)
	}
	return m.nextCut(w, minChunk)
}

// nextCut returns the first place at least from bytes into w where a ▁ follows an ASCII
// letter or digit, or len(w).
func (m *bpe) nextCut(w string, from int) int {
	for p := max(from, 1); p+3 <= len(w); {
		k := strings.IndexByte(w[p:], 0xE2)
		if k < 0 || p+k+3 > len(w) {
			break
		}
		p += k
		if w[p+1] == 0x96 && w[p+2] == 0x81 && asciiAlnum(w[p-1]) {
			return p
		}
		p++
	}
	return len(w)
}

func asciiAlnum(c byte) bool { return asciiLetter(c) || (c >= '0' && c <= '9') }

// smallWord is the largest piece merged by the quadratic scan; longer ones use a heap.
const smallWord = 48

// appendSymbols appends the initial symbols of w to dst.
func (m *bpe) appendSymbols(dst []uint32, w string) []uint32 {
	if m.byteLevel {
		for i := 0; i < len(w); i++ {
			if id := m.byteID[w[i]]; id >= 0 {
				dst = append(dst, uint32(id))
			}
		}
		return dst
	}
	pendingUnk := false
	for i := 0; i < len(w); {
		r, n := rune(w[i]), 1
		if r >= utf8.RuneSelf {
			r, n = utf8.DecodeRuneInString(w[i:])
		}
		if id, ok := m.charToken(r); ok {
			if pendingUnk {
				dst, pendingUnk = append(dst, uint32(m.unk)), false
			}
			dst = append(dst, id)
			i += n
			continue
		}
		if m.byteFallback && m.hasByteTokens(w[i:i+n]) {
			// As in the tokenizers library, a pending unknown token is not flushed here.
			for k := i; k < i+n; k++ {
				dst = append(dst, uint32(m.byteID[w[k]]))
			}
			i += n
			continue
		}
		if m.unk >= 0 {
			if pendingUnk && !m.fuseUnk {
				dst = append(dst, uint32(m.unk))
			}
			pendingUnk = true
		}
		i += n
	}
	if pendingUnk {
		dst = append(dst, uint32(m.unk))
	}
	return dst
}

func (m *bpe) charToken(r rune) (uint32, bool) {
	if r < 0x10000 {
		if id := m.charID[r]; id >= 0 {
			return uint32(id), true
		}
		return 0, false
	}
	id, ok := m.astralID[r]
	return id, ok
}

func (m *bpe) hasByteTokens(s string) bool {
	for i := 0; i < len(s); i++ {
		if m.byteID[s[i]] < 0 {
			return false
		}
	}
	return true
}

// merge appends the symbols of w to dst and merges them in place.
func (m *bpe) merge(dst []uint32, w string) []uint32 {
	start := len(dst)
	dst = m.appendSymbols(dst, w)
	syms := dst[start:]
	if len(syms) < 2 {
		return dst
	}
	if len(syms) > smallWord {
		return dst[:start+m.mergeLong(syms)]
	}
	var rankBuf [smallWord]uint32
	n := len(syms)
	ranks := rankBuf[:n-1]
	for i := range ranks {
		ranks[i], _ = m.merges.get(syms[i], syms[i+1])
	}
	for {
		best, bestRank := -1, uint32(noRank)
		for i, r := range ranks[:n-1] {
			if r < bestRank {
				best, bestRank = i, r
			}
		}
		if best < 0 {
			break
		}
		_, id := m.merges.get(syms[best], syms[best+1])
		syms[best] = id
		copy(syms[best+1:n-1], syms[best+2:n])
		copy(ranks[best:n-2], ranks[best+1:n-1])
		n--
		if best > 0 {
			ranks[best-1], _ = m.merges.get(syms[best-1], syms[best])
		}
		if best < n-1 {
			ranks[best], _ = m.merges.get(syms[best], syms[best+1])
		}
	}
	return dst[:start+n]
}

// mergeLong merges syms in place with a priority queue of candidate pairs ordered by rank,
// then position, and returns the number of symbols left.
func (m *bpe) mergeLong(syms []uint32) int {
	n := len(syms)
	prev := make([]int32, n)
	next := make([]int32, n)
	alive := make([]bool, n)
	for i := range n {
		prev[i], next[i], alive[i] = int32(i-1), int32(i+1), true
	}
	next[n-1] = -1
	h := make(pairHeap, 0, n)
	for i := 0; i+1 < n; i++ {
		if r, _ := m.merges.get(syms[i], syms[i+1]); r != noRank {
			h.push(uint64(r)<<32 | uint64(i))
		}
	}
	for len(h) > 0 {
		top := h.pop()
		rank, pos := uint32(top>>32), int32(uint32(top))
		nx := next[pos]
		if !alive[pos] || nx < 0 {
			continue
		}
		r, id := m.merges.get(syms[pos], syms[nx])
		if r != rank {
			continue // stale entry: one side was merged since
		}
		syms[pos] = id
		alive[nx] = false
		next[pos] = next[nx]
		if next[pos] >= 0 {
			prev[next[pos]] = pos
		}
		if p := prev[pos]; p >= 0 {
			if r, _ := m.merges.get(syms[p], syms[pos]); r != noRank {
				h.push(uint64(r)<<32 | uint64(p))
			}
		}
		if nx := next[pos]; nx >= 0 {
			if r, _ := m.merges.get(syms[pos], syms[nx]); r != noRank {
				h.push(uint64(r)<<32 | uint64(pos))
			}
		}
	}
	k := 0
	for i := int32(0); i >= 0; i = next[i] {
		syms[k] = syms[i]
		k++
	}
	return k
}

// pairHeap is a 4-ary min-heap of rank<<32 | position: half the depth of a binary heap,
// and its sifts move a hole instead of swapping.
type pairHeap []uint64

func (h *pairHeap) push(v uint64) {
	*h = append(*h, v)
	s := *h
	i := len(s) - 1
	for i > 0 {
		p := (i - 1) / 4
		if s[p] <= v {
			break
		}
		s[i] = s[p]
		i = p
	}
	s[i] = v
}

func (h *pairHeap) pop() uint64 {
	s := *h
	top := s[0]
	last := len(s) - 1
	v := s[last]
	s = s[:last]
	*h = s
	if last == 0 {
		return top
	}
	i := 0
	for {
		c := 4*i + 1
		if c >= last {
			break
		}
		// The smallest of up to four children.
		m := c
		for k := c + 1; k < c+4 && k < last; k++ {
			if s[k] < s[m] {
				m = k
			}
		}
		if s[m] >= v {
			break
		}
		s[i] = s[m]
		i = m
	}
	s[i] = v
	return top
}

// mergeTable maps a pair of token IDs to the merge's rank and resulting ID, with open
// addressing: Go maps cost several times more per lookup on this hot path.
type mergeTable struct {
	keys []uint64 // left<<32 | right
	vals []uint64 // (rank+1)<<32 | id; 0 marks an empty slot
	mask uint64
	bits uint
}

func newMergeTable(n int) mergeTable {
	bits := uint(4)
	for 1<<bits < 2*n {
		bits++
	}
	size := 1 << bits
	return mergeTable{keys: make([]uint64, size), vals: make([]uint64, size), mask: uint64(size - 1), bits: bits}
}

func (t *mergeTable) slot(key uint64) uint64 {
	return (key * 0x9E3779B97F4A7C15) >> (64 - t.bits)
}

// set records a merge; a later merge of the same pair replaces an earlier one, as in the
// tokenizers library.
func (t *mergeTable) set(left, right, rank, id uint32) {
	key := uint64(left)<<32 | uint64(right)
	for i := t.slot(key); ; i = (i + 1) & t.mask {
		if t.vals[i] == 0 || t.keys[i] == key {
			t.keys[i] = key
			t.vals[i] = uint64(rank+1)<<32 | uint64(id)
			return
		}
	}
}

// get returns the rank and ID of the merge of left and right, or noRank.
func (t *mergeTable) get(left, right uint32) (rank, id uint32) {
	key := uint64(left)<<32 | uint64(right)
	for i := t.slot(key); ; i = (i + 1) & t.mask {
		v := t.vals[i]
		if v == 0 {
			return noRank, 0
		}
		if t.keys[i] == key {
			return uint32(v>>32) - 1, uint32(v)
		}
	}
}

// wordCache remembers the IDs of recently encoded pieces. It is a lossy direct-mapped table
// of atomic pointers: lookups take no lock, a colliding insert replaces the older entry, and
// memory is bounded by the slot count times the longest cached piece.
type wordCache struct {
	seed  maphash.Seed
	slots []atomic.Pointer[wordEntry]
	mask  uint64
}

type wordEntry struct {
	word string
	ids  []uint32
}

// maxCachedWord is the longest piece the word cache keeps, in bytes.
const maxCachedWord = 64

func newWordCache(slots int) *wordCache {
	n := 1
	for n < slots {
		n <<= 1
	}
	return &wordCache{seed: maphash.MakeSeed(), slots: make([]atomic.Pointer[wordEntry], n), mask: uint64(n - 1)}
}

func (c *wordCache) get(w string) ([]uint32, bool) {
	if c == nil || len(w) > maxCachedWord {
		return nil, false
	}
	e := c.slots[maphash.String(c.seed, w)&c.mask].Load()
	if e == nil || e.word != w {
		return nil, false
	}
	return e.ids, true
}

// appendCached appends the IDs of w: from the cache, or encoded by encode and remembered.
func (c *wordCache) appendCached(dst []uint32, w string, encode func(dst []uint32, w string) []uint32) []uint32 {
	if ids, ok := c.get(w); ok { // fast path: a piece seen before
		return append(dst, ids...)
	}
	start := len(dst)
	dst = encode(dst, w)
	c.put(w, dst[start:])
	return dst
}

func (c *wordCache) put(w string, ids []uint32) {
	if c == nil || len(w) > maxCachedWord {
		return
	}
	e := &wordEntry{word: strings.Clone(w), ids: append([]uint32(nil), ids...)}
	c.slots[maphash.String(c.seed, w)&c.mask].Store(e)
}
