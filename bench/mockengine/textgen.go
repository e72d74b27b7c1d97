package mockengine

import (
	"switchyard/tokenizer"

	"switchyard/internal/mix"
)

// outputWords are the words the engine generates. Each is one token of the built-in
// tokenizer with and without a leading space, and decodes back to itself, so a client that
// sends the output back in the next turn hits the engine's cache of it.
var outputWords = [...]string{
	"the", "of", "and", "to", "in", "is", "it", "on", "we", "cat", "dog", "sun", "sea", "red",
	"big", "new", "old", "one", "two", "day", "way", "can", "see", "run", "end", "top", "key",
	"map", "air", "art", "law", "man", "far", "few", "set", "sky", "tea", "joy", "box", "yes",
}

// sentenceLen is the number of output tokens per generated sentence, the last being ".".
const sentenceLen = 12

// wordTable maps (seed, position) to output tokens.
type wordTable struct {
	first, rest []wordToken // without and with a leading space
	period      wordToken
}

type wordToken struct {
	id   uint32
	text string
}

func newWordTable(tok tokenizer.Tokenizer) *wordTable {
	w := &wordTable{}
	single := func(text string) (wordToken, bool) {
		ids := encodeWord(tok, text)
		if len(ids) != 1 || tok.Decode(ids) != text {
			return wordToken{}, false
		}
		return wordToken{id: ids[0], text: text}, true
	}
	for _, word := range outputWords {
		a, okA := single(word)
		b, okB := single(" " + word)
		if okA && okB {
			w.first, w.rest = append(w.first, a), append(w.rest, b)
		}
	}
	if p, ok := single("."); ok {
		w.period = p
	}
	if len(w.first) == 0 {
		// A tokenizer without single-token words: emit its encoding of "a" regardless.
		ids := encodeWord(tok, "a")
		t := wordToken{text: "a"}
		if len(ids) > 0 {
			t.id = ids[0]
		}
		w.first, w.rest, w.period = []wordToken{t}, []wordToken{t}, t
	}
	return w
}

// token returns output token i of the sequence with the given seed.
func (w *wordTable) token(seed uint64, i int) wordToken {
	if i > 0 && i%sentenceLen == sentenceLen-1 && w.period.text != "" {
		return w.period
	}
	h := splitmix64(seed + uint64(i))
	if i == 0 {
		return w.first[h%uint64(len(w.first))]
	}
	return w.rest[h%uint64(len(w.rest))]
}

// splitmix64 is one step of the splitmix64 generator from state x: the state advanced by
// its golden gamma, mixed.
func splitmix64(x uint64) uint64 { return mix.Mix64(x + 0x9e3779b97f4a7c15) }

// hashTokens mixes a token sequence into a seed.
func hashTokens(ids []uint32) uint64 {
	h := uint64(14695981039346656037)
	for _, id := range ids {
		h = (h ^ uint64(id)) * 1099511628211
	}
	return splitmix64(h)
}

// logprob returns a deterministic pseudo log-probability for a token at a position.
func logprob(seed uint64, i int) float64 {
	return -float64(splitmix64(seed^uint64(i)*0x9e37)%4000)/1000.0 - 0.001
}
