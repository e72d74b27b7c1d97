package hf

import (
	"encoding/json"
	"slices"
	"testing"
)

// Small tokenizers built in the test, their vectors worked out by hand from the rules of the
// tokenizers library (the parity tests check the real models against the reference).

func newFromJSON(t *testing.T, j map[string]any) *Tokenizer {
	t.Helper()
	raw, err := json.Marshal(j)
	if err != nil {
		t.Fatal(err)
	}
	tk, err := New(raw, nil, Options{CacheBytes: -1})
	if err != nil {
		t.Fatal(err)
	}
	return tk
}

func checkEncode(t *testing.T, tk *Tokenizer, tests []struct {
	text string
	want []uint32
}) {
	t.Helper()
	for _, tt := range tests {
		if got := tk.EncodePlain(tt.text); !slices.Equal(got, tt.want) {
			t.Errorf("EncodePlain(%q) = %v, want %v", tt.text, got, tt.want)
		}
	}
}

// TestSentencePieceBPE: characters without a token fall back to their bytes' tokens, or to
// the unknown token, consecutive ones fused; merges apply lowest rank first; a Metaspace
// pre-tokenizer writes ▁ for spaces and before the text.
func TestSentencePieceBPE(t *testing.T) {
	vocab := map[string]any{"<unk>": 0, "▁": 1, "a": 2, "b": 3, "▁a": 4, "ab": 5, "▁ab": 6, "<0xC3>": 7, "<0xA9>": 8}
	base := func(byteFallback bool) map[string]any {
		return map[string]any{
			"added_tokens":  []any{},
			"normalizer":    nil,
			"pre_tokenizer": map[string]any{"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": false},
			"decoder": map[string]any{"type": "Sequence", "decoders": []any{
				map[string]any{"type": "Replace", "pattern": map[string]any{"String": "▁"}, "content": " "},
				map[string]any{"type": "ByteFallback"}, map[string]any{"type": "Fuse"},
				map[string]any{"type": "Strip", "content": " ", "start": 1, "stop": 0}}},
			"model": map[string]any{"type": "BPE", "unk_token": "<unk>", "fuse_unk": true, "byte_fallback": byteFallback,
				"vocab": vocab, "merges": []any{"a b", "▁ a", "▁ ab"}},
		}
	}
	tk := newFromJSON(t, base(true))
	checkEncode(t, tk, []struct {
		text string
		want []uint32
	}{
		{"ab", []uint32{6}},         // ▁ab: "a b" (rank 0) first, then "▁ ab"
		{"a a", []uint32{4, 4}},     // ▁a ▁a
		{"é", []uint32{1, 7, 8}},    // ▁ then the bytes of é
		{"xyab", []uint32{1, 0, 5}}, // x and y have no token and no byte token: one fused <unk>
	})
	if got := tk.Decode([]uint32{6, 1, 7, 8}); got != "ab é" {
		t.Fatalf("Decode = %q, want %q", got, "ab é")
	}
	if got := tk.Decode([]uint32{7, 2}); got != "\uFFFDa" { // a lone byte of é
		t.Fatalf("Decode = %q, want one U+FFFD per invalid byte", got)
	}
	noFallback := newFromJSON(t, base(false))
	checkEncode(t, noFallback, []struct {
		text string
		want []uint32
	}{{"éé b", []uint32{1, 0, 1, 3}}}) // é é fused into one <unk>
}

// TestWordPiece: the longest token from the start of each word, continuations with ##, and
// the unknown token for a word that cannot be cut so.
func TestWordPiece(t *testing.T) {
	tk := newFromJSON(t, map[string]any{
		"added_tokens":  []any{map[string]any{"id": 0, "content": "[UNK]", "special": true}},
		"normalizer":    map[string]any{"type": "BertNormalizer", "lowercase": true},
		"pre_tokenizer": map[string]any{"type": "BertPreTokenizer"},
		"decoder":       map[string]any{"type": "WordPiece", "prefix": "##", "cleanup": true},
		"model": map[string]any{"type": "WordPiece", "unk_token": "[UNK]", "continuing_subword_prefix": "##",
			"max_input_chars_per_word": 100,
			"vocab":                    map[string]any{"[UNK]": 0, "un": 1, "##aff": 2, "##able": 3, "unaff": 4, "!": 5, "x": 6, "中": 7, "e": 8}},
	})
	checkEncode(t, tk, []struct {
		text string
		want []uint32
	}{
		{"Unaffable!", []uint32{4, 3, 5}}, // unaff ##able: longest first; ! its own piece
		{"unx", []uint32{0}},              // un, then no ##x: the whole word is [UNK]
		{"x中x", []uint32{6, 7, 6}},        // CJK ideographs are spaced out
		{"É", []uint32{8}},                // accents stripped with lowercase
	})
	if got := tk.Decode([]uint32{4, 3, 5}); got != "unaffable!" {
		t.Fatalf("Decode = %q, want %q", got, "unaffable!")
	}
}

// TestUnigram: the cut with the highest total score; a character with no token is the
// unknown token, runs of them fused.
func TestUnigram(t *testing.T) {
	tk := newFromJSON(t, map[string]any{
		"added_tokens":  []any{},
		"pre_tokenizer": map[string]any{"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always", "split": true},
		"decoder":       map[string]any{"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always"},
		"model": map[string]any{"type": "Unigram", "unk_id": 0, "vocab": []any{
			[]any{"<unk>", 0.0}, []any{"▁", -2.0}, []any{"a", -1.0}, []any{"b", -1.0}, []any{"ab", -1.5},
			[]any{"▁a", -3.0}, []any{"▁ab", -4.0}}},
	})
	checkEncode(t, tk, []struct {
		text string
		want []uint32
	}{
		{"ab", []uint32{1, 4}},     // ▁ + ab (-3.5) beats ▁ab and ▁a + b (-4)
		{"a", []uint32{5}},         // ▁a and ▁ + a tie at -3: the first found (the longer) stays
		{"xyb", []uint32{1, 0, 3}}, // ▁, <unk> for x y fused, b
	})
}
