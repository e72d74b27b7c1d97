package hf

import (
	"encoding/json"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"

	"switchyard/tokenizer"
)

// tinyDir holds a small byte-level BPE tokenizer with the Qwen2 pre-tokenizer, the NFC
// normalizer, ChatML special tokens and a chat template: it needs no download.
const tinyDir = "testdata/tiny"

func loadTiny(t testing.TB, opts Options) *Tokenizer {
	t.Helper()
	tk, err := Load(tinyDir, opts)
	if err != nil {
		t.Fatal(err)
	}
	return tk
}

func TestTinyEncode(t *testing.T) {
	tk := loadTiny(t, Options{})
	tests := []struct {
		name string
		text string
		want []uint32
	}{
		{"empty", "", []uint32{}},
		{"merges", "hello world", []uint32{257, 'l', 'l', 'o', 272}},
		{"the", " the", []uint32{258}},
		{"special tokens", "<|im_start|>hi<|im_end|>", []uint32{278, 'h', 'i', 279}},
		{"newlines merge", "\n\n", []uint32{267}},
		{"invalid UTF-8 becomes U+FFFD", "a\xffb", []uint32{'a', 0xEF, 0xBF, 0xBD, 'b'}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := tk.Encode(tt.text)
			if !slices.Equal(got, tt.want) {
				t.Fatalf("Encode(%q) = %v, want %v", tt.text, got, tt.want)
			}
			if n := tk.Count(tt.text); n != len(tt.want) {
				t.Fatalf("Count(%q) = %d, want %d", tt.text, n, len(tt.want))
			}
			if want := tokenizer.ValidUTF8(tt.text); tk.Decode(got) != want {
				t.Fatalf("Decode(Encode(%q)) = %q, want %q", tt.text, tk.Decode(got), want)
			}
		})
	}
}

func TestTinyDecode(t *testing.T) {
	tk := loadTiny(t, Options{})
	tests := []struct {
		name        string
		ids         []uint32
		skipSpecial bool
		want        string
	}{
		{"special kept", []uint32{278, 257, 279}, false, "<|im_start|>he<|im_end|>"},
		{"special skipped", []uint32{278, 257, 279}, true, "he"},
		{"unknown ID skipped", []uint32{257, 100000}, false, "he"},
		{"split character replaced", []uint32{0xE4, 'x'}, false, "\uFFFDx"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := string(tk.AppendDecode(nil, tt.ids, tt.skipSpecial)); got != tt.want {
				t.Fatalf("decode %v = %q, want %q", tt.ids, got, tt.want)
			}
		})
	}
}

func TestTinyTokens(t *testing.T) {
	tk := loadTiny(t, Options{})
	if id, ok := tk.TokenID("<|im_end|>"); !ok || id != 279 || !tk.IsSpecial(id) {
		t.Fatalf("TokenID(<|im_end|>) = %d, %v", id, ok)
	}
	if tok, ok := tk.Token(258); !ok || tok != "Ġthe" {
		t.Fatalf("Token(258) = %q, %v", tok, ok)
	}
	if _, ok := tk.Token(1 << 30); ok {
		t.Fatal("Token of an unknown ID")
	}
	if tk.VocabSize() != 280 {
		t.Fatalf("VocabSize = %d, want 280", tk.VocabSize())
	}
}

func TestLoadPaths(t *testing.T) {
	for _, path := range []string{tinyDir, filepath.Join(tinyDir, TokenizerFile)} {
		tk, err := Load(path, Options{})
		if err != nil {
			t.Fatalf("Load(%s): %v", path, err)
		}
		if !tk.HasChatTemplate() {
			t.Fatalf("Load(%s): the chat template beside tokenizer.json was not found", path)
		}
	}
	if _, err := Load(filepath.Join(t.TempDir(), "missing"), Options{}); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("Load(missing) = %v, want ErrNotExist", err)
	}
}

// edited returns the tiny tokenizer.json with one replacement applied.
func edited(t *testing.T, old, new string) []byte {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(tinyDir, TokenizerFile))
	if err != nil {
		t.Fatal(err)
	}
	s := string(raw)
	if !strings.Contains(s, old) {
		t.Fatalf("tiny tokenizer.json has no %q", old)
	}
	return []byte(strings.Replace(s, old, new, 1))
}

// jsonEdit returns the tiny tokenizer.json with edit applied to its decoded form.
func jsonEdit(t *testing.T, edit func(j map[string]any)) []byte {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(tinyDir, TokenizerFile))
	if err != nil {
		t.Fatal(err)
	}
	var j map[string]any
	if err := json.Unmarshal(raw, &j); err != nil {
		t.Fatal(err)
	}
	edit(j)
	out, err := json.Marshal(j)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func TestLoadErrors(t *testing.T) {
	component := func(typ string) map[string]any { return map[string]any{"type": typ} }
	tests := []struct {
		name     string
		json     func(t *testing.T) []byte
		config   string
		wantErr  error
		wantText string // the message names the component
	}{
		{"not JSON", func(*testing.T) []byte { return []byte("{") }, "", ErrInvalid, "tokenizer.json"},
		{"model type", func(t *testing.T) []byte { return edited(t, `"type": "BPE"`, `"type": "WordLevel"`) }, "", ErrUnsupported, `model "WordLevel"`},
		{"normalizer", func(t *testing.T) []byte { return edited(t, `"type": "NFC"`, `"type": "Precompiled"`) }, "", ErrUnsupported, `normalizer "Precompiled"`},
		{"pre-tokenizer", func(t *testing.T) []byte {
			return jsonEdit(t, func(j map[string]any) { j["pre_tokenizer"] = component("UnicodeScripts") })
		}, "", ErrUnsupported, `pre-tokenizer "UnicodeScripts"`},
		{"decoder", func(t *testing.T) []byte {
			return jsonEdit(t, func(j map[string]any) { j["decoder"] = component("CTC") })
		}, "", ErrUnsupported, `decoder "CTC"`},
		{"decoder in a sequence", func(t *testing.T) []byte {
			return jsonEdit(t, func(j map[string]any) {
				j["decoder"] = map[string]any{"type": "Sequence", "decoders": []any{component("Fuse"), component("BPEDecoder")}}
			})
		}, "", ErrUnsupported, `decoder.decoders[1]: decoder "BPEDecoder"`},
		{"post-processor", func(t *testing.T) []byte {
			return jsonEdit(t, func(j map[string]any) { j["post_processor"] = component("Mystery") })
		}, "", ErrUnsupported, `post-processor "Mystery"`},
		{"merge of unknown tokens", func(t *testing.T) []byte { return edited(t, `"Ġ t"`, `"Ġ zz"`) }, "", ErrInvalid, "model.merges"},
		{"byte fallback with byte-level", func(t *testing.T) []byte { return edited(t, `"byte_fallback": false`, `"byte_fallback": true`) }, "", ErrUnsupported, "model.byte_fallback"},
		{"byte-level pre-tokenizer with WordPiece", func(t *testing.T) []byte {
			return jsonEdit(t, func(j map[string]any) {
				j["model"] = map[string]any{"type": "WordPiece", "unk_token": "a", "vocab": map[string]any{"a": 0}}
			})
		}, "", ErrUnsupported, "WordPiece"},
		{"WordPiece without its unknown token", func(t *testing.T) []byte {
			return jsonEdit(t, func(j map[string]any) {
				j["pre_tokenizer"] = component("BertPreTokenizer")
				j["model"] = map[string]any{"type": "WordPiece", "vocab": map[string]any{"a": 0}}
			})
		}, "", ErrInvalid, "model.unk_token"},
		{"Unigram unk_id outside the vocabulary", func(t *testing.T) []byte {
			return jsonEdit(t, func(j map[string]any) {
				j["pre_tokenizer"] = component("Metaspace")
				j["model"] = map[string]any{"type": "Unigram", "unk_id": 5, "vocab": []any{[]any{"a", -1.0}}}
			})
		}, "", ErrInvalid, "model.unk_id"},
		{"Unigram vocabulary not pairs", func(t *testing.T) []byte {
			return jsonEdit(t, func(j map[string]any) {
				j["pre_tokenizer"] = component("Metaspace")
				j["model"] = map[string]any{"type": "Unigram", "vocab": map[string]any{"a": 1}}
			})
		}, "", ErrInvalid, "model.vocab"},
		{"Metaspace prepend scheme", func(t *testing.T) []byte {
			return jsonEdit(t, func(j map[string]any) {
				j["pre_tokenizer"] = map[string]any{"type": "Metaspace", "replacement": "▁", "prepend_scheme": "sometimes"}
			})
		}, "", ErrUnsupported, "prepend_scheme"},
		{"dropout", func(t *testing.T) []byte { return edited(t, `"dropout": null`, `"dropout": 0.1`) }, "", ErrUnsupported, "model.dropout"},
		{"bad split pattern", func(t *testing.T) []byte { return edited(t, `"Regex": "(?i:`, `"Regex": "((?i:`) }, "", ErrInvalid, "pattern"},
		{"chat template syntax", func(t *testing.T) []byte { return edited(t, `"version"`, `"version"`) }, `{"chat_template": "{% if x %}"}`, ErrTemplate, "chat_template"},
		{"chat template list without default", func(t *testing.T) []byte { return edited(t, `"version"`, `"version"`) },
			`{"chat_template": [{"name": "tool_use", "template": "x"}]}`, ErrInvalid, "default"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var cfg []byte
			if tt.config != "" {
				cfg = []byte(tt.config)
			}
			_, err := New(tt.json(t), cfg, Options{})
			if err == nil {
				t.Fatal("New succeeded, want an error")
			}
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("New: %v, want %v", err, tt.wantErr)
			}
			if !strings.Contains(err.Error(), tt.wantText) {
				t.Fatalf("New: %v, want a message naming %s", err, tt.wantText)
			}
		})
	}
}

func TestTinyChat(t *testing.T) {
	tk := loadTiny(t, Options{})
	msgs := []tokenizer.Message{{Role: "system", Content: "Be brief."}, {Role: "user", Content: "hello"}}
	got, err := tk.ApplyChatTemplate(msgs)
	if err != nil {
		t.Fatal(err)
	}
	want := "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n"
	if got != want {
		t.Fatalf("ApplyChatTemplate = %q, want %q", got, want)
	}
	ids, err := tk.EncodeChat(msgs)
	if err != nil || !slices.Equal(ids, tk.EncodePlain(want)) {
		t.Fatalf("EncodeChat = %v, %v", ids, err)
	}
	if _, err := tk.ApplyChatTemplate(nil); !errors.Is(err, tokenizer.ErrNoMessages) {
		t.Fatalf("no messages: %v", err)
	}
	if _, err := tk.RenderChatJSON([]byte(`{"role": "user"}`), ChatOptions{}); !errors.Is(err, ErrInvalidMessages) {
		t.Fatalf("object instead of array: %v", err)
	}
	s, err := tk.RenderChatJSON([]byte(`[{"role": "user", "content": [{"type": "text", "text": "hi"}]}]`), ChatOptions{NoGenerationPrompt: true})
	if err != nil || s != "<|im_start|>user\n[{\"type\": \"text\", \"text\": \"hi\"}]<|im_end|>\n" {
		t.Fatalf("content parts: %q, %v", s, err)
	}
	raw, err := os.ReadFile(filepath.Join(tinyDir, TokenizerFile))
	if err != nil {
		t.Fatal(err)
	}
	noChat, err := New(raw, nil, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := noChat.EncodeChat(msgs); !errors.Is(err, ErrNoChatTemplate) {
		t.Fatalf("no template: %v", err)
	}
}

// randomText builds text from runes that exercise every branch of the pre-tokenizers and the
// chunk cut points.
func randomText(rng *rand.Rand, n int) string {
	alphabet := []string{"a", "b", "Z", "é", "e\u0301", "中", "ſ", "1", "23", "٣", "²", "Ⅻ", " ", "  ", "\t", "\n", "\r\n",
		"\u00a0", "\u2003", "\u3000", "\u0085", "\u2028", "'", "'s", "'LL", "'re", "!", "?!", "...", "(", "😀", "\u200b",
		"<|im_end|>", "<|im_start|>", "hello", " world", "the", "\n\n", "x\n", "\u0301", "\xff", "\xe2\x82"}
	var b strings.Builder
	for range n {
		b.WriteString(alphabet[rng.IntN(len(alphabet))])
	}
	return b.String()
}

func TestFastSplitMatchesRegexp(t *testing.T) {
	cls := newClassifier()
	for _, tt := range []struct {
		name      string
		pattern   string
		maxDigits int
	}{{"qwen2", patternQwen2, 1}, {"llama3", patternLlama3, 3}} {
		t.Run(tt.name, func(t *testing.T) {
			m, err := newRegexMatcher(tt.pattern)
			if err != nil {
				t.Fatal(err)
			}
			ref := &regexSplit{m: m, behavior: splitIsolated}
			fast := &fastSplit{cls: cls, maxDigits: tt.maxDigits}
			rng := rand.New(rand.NewPCG(1, 2))
			for i := range 3000 {
				s := tokenizer.ValidUTF8(randomText(rng, 1+rng.IntN(40)))
				got, want := fast.appendPieces(nil, s, false), ref.appendPieces(nil, s, false)
				if !slices.Equal(got, want) {
					t.Fatalf("text %d %q:\nfast   %q\nregexp %q", i, s, got, want)
				}
			}
		})
	}
}

func TestChunkCacheMatchesDirect(t *testing.T) {
	cached := loadTiny(t, Options{})
	direct := loadTiny(t, Options{CacheBytes: -1})
	if !cached.chunkCut {
		t.Fatal("the tiny tokenizer should cut chunks inside segments")
	}
	rng := rand.New(rand.NewPCG(3, 4))
	for i := range 300 {
		s := randomText(rng, 200+rng.IntN(2000))
		want := direct.Encode(s)
		for pass := range 2 {
			if got := cached.Encode(s); !slices.Equal(got, want) {
				t.Fatalf("text %d pass %d: cached encoding differs from the direct one", i, pass)
			}
		}
		// A text that extends another shares its chunks.
		ext := s + randomText(rng, 50)
		if got := cached.Encode(ext); !slices.Equal(got, direct.Encode(ext)) {
			t.Fatalf("text %d extended: cached encoding differs", i)
		}
	}
	hits, misses, _ := cached.CacheStats()
	if hits == 0 || misses == 0 {
		t.Fatalf("cache hits %d, misses %d: want both", hits, misses)
	}
}

func TestChunkCacheBounded(t *testing.T) {
	const limit = 64 << 10
	tk := loadTiny(t, Options{CacheBytes: limit})
	rng := rand.New(rand.NewPCG(5, 6))
	for range 200 {
		tk.Encode(randomText(rng, 1000))
	}
	if _, _, bytes := tk.CacheStats(); bytes > limit || bytes == 0 {
		t.Fatalf("cache holds %d bytes, want (0, %d]", bytes, limit)
	}
}

func TestChunkEnd(t *testing.T) {
	long := strings.Repeat("x", minChunk)
	tests := []struct {
		name      string
		seg       string
		slashLine bool
		want      int
	}{
		{"short", "abc", false, 3},
		{"line start", long + "\nnext", false, minChunk + 1},
		{"line start with space is no cut", long + "\n next", false, len(long + "\n next")},
		{"space between letters", long + " word", false, minChunk},
		{"space before digit is no cut", long + " 1", false, len(long + " 1")},
		{"before minChunk", "a\nb" + long, false, len("a\nb" + long)},
		{"line start with a slash", long + "\n/x", false, minChunk + 1},
		{"line start with a slash is no cut for o200k", long + "\n/x", true, len(long + "\n/x")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := chunkEnd(tt.seg, tt.slashLine); got != tt.want {
				t.Fatalf("chunkEnd = %d, want %d", got, tt.want)
			}
		})
	}
}

// roundTrip checks decode(encode(x)) == x for valid UTF-8, after the tokenizer's normalizer.
func roundTrip(t *testing.T, tk *Tokenizer, s string, nfc bool) {
	t.Helper()
	if !utf8.ValidString(s) {
		return
	}
	want := s
	if nfc {
		want = norm.NFC.String(s)
	}
	if got := tk.Decode(tk.Encode(s)); got != want {
		t.Fatalf("Decode(Encode(%q)) = %q, want %q", s, got, want)
	}
}

func TestConcurrentEncode(t *testing.T) {
	cached := loadTiny(t, Options{CacheBytes: 256 << 10})
	direct := loadTiny(t, Options{CacheBytes: -1})
	rng := rand.New(rand.NewPCG(7, 8))
	texts := make([]string, 64)
	want := make([][]uint32, len(texts))
	for i := range texts {
		texts[i] = randomText(rng, 100+rng.IntN(1500))
		want[i] = direct.Encode(texts[i])
	}
	errs := make(chan error, 4)
	for g := range 4 {
		go func() {
			for k := range 200 {
				i := (k*7 + g*13) % len(texts)
				if !slices.Equal(cached.Encode(texts[i]), want[i]) {
					errs <- errors.New("concurrent encoding differs from the direct one")
					return
				}
			}
			errs <- nil
		}()
	}
	for range 4 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
}
