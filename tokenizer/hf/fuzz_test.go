package hf

import (
	"encoding/json"
	"maps"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"switchyard/tokenizer"
)

// The seed corpora are in testdata/fuzz/<target>; f.Add seeds cover the rest.

func FuzzEncode(f *testing.F) {
	for _, s := range []string{"", "hello world", "<|im_start|>user\nhi<|im_end|>", "a\xffb\xe2\x82", "e\u0301 'ſ 'S 123 \u00a0 ", "\n\n  x\t"} {
		f.Add(s)
	}
	cached := loadTiny(f, Options{CacheBytes: 1 << 20})
	direct := loadTiny(f, Options{CacheBytes: -1})
	f.Fuzz(func(t *testing.T, s string) {
		ids := cached.Encode(s)
		if !slices.Equal(ids, direct.Encode(s)) {
			t.Fatalf("cached and direct encodings of %q differ", s)
		}
		if got := cached.Decode(ids); !utf8.ValidString(got) {
			t.Fatalf("Decode returned invalid UTF-8 %q", got)
		}
		roundTrip(t, cached, s, true)
	})
}

// FuzzEncodeModels checks the real tokenizers when make testdata-tokenizers fetched them.
func FuzzEncodeModels(f *testing.F) {
	for _, s := range []string{"", "Hello, world! It's 2025.", "<|im_start|>x<|eot_id|>", "中文 😀 \u00a0\u3000", "a\xff"} {
		f.Add(s)
	}
	qwen, llama := loadModel(f, "qwen3"), loadModel(f, "llama3")
	f.Fuzz(func(t *testing.T, s string) {
		roundTrip(t, qwen, s, true)
		roundTrip(t, llama, s, false)
	})
}

func FuzzFastSplit(f *testing.F) {
	for _, s := range []string{"", "it's 'S 'ſ x'LL", "a  \n\n b\r\n\tc", "(abc) ?!...\n\n", "123456 ٣٤ ²", "\u00a0\u2003x \u0085"} {
		f.Add(s)
	}
	cls := newClassifier()
	type pair struct {
		fast *fastSplit
		ref  *regexSplit
	}
	var pairs []pair
	for _, p := range []struct {
		pattern string
		digits  int
	}{{patternQwen2, 1}, {patternLlama3, 3}} {
		m, err := newRegexMatcher(p.pattern)
		if err != nil {
			f.Fatal(err)
		}
		pairs = append(pairs, pair{&fastSplit{cls: cls, maxDigits: p.digits}, &regexSplit{m: m, behavior: splitIsolated}})
	}
	f.Fuzz(func(t *testing.T, s string) {
		s = tokenizer.ValidUTF8(s)
		for _, p := range pairs {
			if got, want := p.fast.appendPieces(nil, s, false), p.ref.appendPieces(nil, s, false); !slices.Equal(got, want) {
				t.Fatalf("%q:\nfast   %q\nregexp %q", s, got, want)
			}
		}
	})
}

func FuzzRenderChatJSON(f *testing.F) {
	for _, s := range []string{`[{"role":"user","content":"hi"}]`, `[{"role":"system","content":"s"},{"role":"user","content":[{"type":"text","text":"x"}]}]`,
		`[]`, `[{"role":1}]`, `{"a":1}`, `[{"role":"user","content":null}]`} {
		f.Add([]byte(s))
	}
	tk := loadTiny(f, Options{})
	f.Fuzz(func(t *testing.T, msgs []byte) {
		s, err := tk.RenderChatJSON(msgs, ChatOptions{})
		if err == nil {
			tk.Encode(s)
		}
	})
}

// FuzzScanners proves the hand-written scanners of gpt-oss's and DeepSeek V3's patterns equal
// to the backtracking engine on them.
func FuzzScanners(f *testing.F) {
	for _, s := range []string{"", "HELLO world's ABCdef aBC", "x'S 'LL ÀÉ ǅa ʰa a\u0301b \u0301", "a!!\n/b //\r\n c", "123456 ٣٤ ²",
		"\u00a0\u2003x \u0085 \n\n  y", "中文かなカナ漢字abc", "#include <x> $y .Z", "\ue000a \U000e0001b"} {
		f.Add(s)
	}
	type pair struct {
		name string
		fast preTokenizer
		ref  *regexSplit
	}
	var pairs []pair
	for _, p := range []struct {
		name    string
		pattern string
		fast    preTokenizer
	}{
		{"o200k", patternO200k, &o200kSplit{k: newKinds()}},
		{"digits", patternDigits3, &runSplit{k: newKinds(), in: isNumberKind, max: 3}},
		{"cjk", patternCJKKana, &runSplit{k: newKinds(), in: isCJKOrKana}},
		{"deepseek", patternDeepSeek, &deepSeekSplit{k: newKinds()}},
	} {
		m, err := newRegexMatcher(p.pattern)
		if err != nil {
			f.Fatal(err)
		}
		pairs = append(pairs, pair{p.name, p.fast, &regexSplit{m: m, behavior: splitIsolated}})
	}
	f.Fuzz(func(t *testing.T, s string) {
		s = tokenizer.ValidUTF8(s)
		for _, p := range pairs {
			if got, want := p.fast.appendPieces(nil, s, false), p.ref.appendPieces(nil, s, false); !slices.Equal(got, want) {
				t.Fatalf("%s %q:\nfast   %q\nregexp %q", p.name, s, got, want)
			}
		}
	})
}

// FuzzSplitChars proves the character splits (Punctuation, WhitespaceSplit, Digits, and the
// Metaspace split) equal to the general Split on the same matches, for every behavior.
func FuzzSplitChars(f *testing.F) {
	for _, s := range []string{"", "a,b;;c", "!!x!", "▁a▁▁b▁", "1 22  333", "x\u00a0y\t\nz"} {
		f.Add(s)
	}
	type pair struct {
		match   func(r rune) bool
		pattern string
	}
	pairs := []pair{{isRustWhitespace, `\s`}, {func(r rune) bool { return r == metaspaceRune }, "▁"}, {func(r rune) bool { return r == ',' }, ","}}
	var refs [][5]*regexSplit
	for _, p := range pairs {
		m, err := newRegexMatcher(p.pattern)
		if err != nil {
			f.Fatal(err)
		}
		var r [5]*regexSplit
		for b := range r {
			r[b] = &regexSplit{m: m, behavior: splitBehavior(b)}
		}
		refs = append(refs, r)
	}
	ms := &metaspaceSplit{rep: "▁", prepend: prependNever, split: true}
	f.Fuzz(func(t *testing.T, s string) {
		s = tokenizer.ValidUTF8(s)
		for i, p := range pairs {
			for b := range refs[i] {
				got := splitChars(nil, s, p.match, splitBehavior(b))
				if want := refs[i][b].appendPieces(nil, s, false); !slices.Equal(got, want) {
					t.Fatalf("%q behavior %d on %q:\nchars %q\nregexp %q", p.pattern, b, s, got, want)
				}
			}
		}
		// Metaspace without a prepended ▁ is the ▁ split MergedWithNext, after spaces become ▁.
		r := strings.ReplaceAll(s, " ", "▁")
		if got, want := ms.appendPieces(nil, s, true), refs[1][splitMergedWithNext].appendPieces(nil, r, false); !slices.Equal(got, want) {
			t.Fatalf("metaspace %q:\ngot  %q\nwant %q", s, got, want)
		}
	})
}

// FuzzChunkedModels checks, on the real tokenizers make testdata-tokenizers fetched, that
// long texts encode the same through the chunk cache (cut at chunk and word boundaries) as
// in one piece.
func FuzzChunkedModels(f *testing.F) {
	for _, s := range []string{"Hello world. ", "a\n/b ", "x▁y ", "Ünï cödé 中文 ", "aaaa", "it's A B\n"} {
		f.Add(s)
	}
	type pair struct{ cached, direct *Tokenizer }
	var pairs []pair
	for _, m := range []string{"gemma3", "llama2", "gptoss", "deepseek_v3"} {
		cached := loadModel(f, m)
		direct := *cached // the same tokenizer without its chunk cache: no second load
		direct.chunks = nil
		pairs = append(pairs, pair{cached, &direct})
	}
	f.Fuzz(func(t *testing.T, s string) {
		if s == "" || len(s) > 256 {
			return
		}
		long := strings.Repeat(s, 2048/len(s)+1)
		for _, p := range pairs {
			want := p.direct.Encode(long)
			for pass := range 2 {
				if got := p.cached.Encode(long); !slices.Equal(got, want) {
					t.Fatalf("pass %d of %q: chunked and whole encodings differ", pass, s)
				}
			}
		}
	})
}

// FuzzScanJSON proves the fast readers of the vocabulary and merges equal to encoding/json
// wherever they accept their input.
func FuzzScanJSON(f *testing.F) {
	for _, s := range []string{`{"a": 1, "\n": 2, "\u00e9": 3}`, `{}`, `{"a":1,"a":2}`, `[["a", "b"], ["\"", "c"]]`, `["a b", "c d"]`, `[]`, `{"a": 1.5}`, `["ab"]`, "[\"\xff b\"]"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if v, ok := scanVocab(data); ok {
			var want map[string]uint32
			if err := json.Unmarshal(data, &want); err != nil || !maps.Equal(v, want) {
				t.Fatalf("scanVocab(%q) = %v; encoding/json: %v, %v", data, v, want, err)
			}
		}
		if m, ok := scanMerges(data); ok {
			var pairs [][2]string
			var strs []string
			switch {
			case json.Unmarshal(data, &pairs) == nil:
				if !slices.Equal(m, pairs) {
					t.Fatalf("scanMerges(%q) = %q, want %q", data, m, pairs)
				}
			case json.Unmarshal(data, &strs) == nil:
				if len(strs) != len(m) {
					t.Fatalf("scanMerges(%q) = %q, want %q", data, m, strs)
				}
				for i, s := range strs {
					if m[i][0]+" "+m[i][1] != s {
						t.Fatalf("scanMerges(%q)[%d] = %q, want %q", data, i, m[i], s)
					}
				}
			default:
				t.Fatalf("scanMerges accepted %q, which encoding/json refuses", data)
			}
		}
	})
}
