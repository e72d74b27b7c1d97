package hf

import (
	"switchyard/tokenizer"

	"slices"
	"testing"
	"unicode/utf8"
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
