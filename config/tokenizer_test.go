package config

import (
	"errors"
	"strings"
	"testing"
)

func TestValidateTokenizer(t *testing.T) {
	tests := []struct {
		name string
		tk   Tokenizer
		want []string // exact error lines; nil means valid
	}{
		{name: "none", tk: Tokenizer{}},
		{name: "path only", tk: Tokenizer{Path: "/models/qwen"}},
		{name: "every key", tk: Tokenizer{Path: "/models/qwen/tokenizer.json", CacheBytes: ptr[int64](1 << 20), ForwardInputIDs: true}},
		{name: "cache disabled", tk: Tokenizer{Path: "/models/qwen", CacheBytes: ptr[int64](0)}},
		{name: "blank path", tk: Tokenizer{Path: "  "},
			want: []string{"models.qwen.tokenizer.path: must not be blank"}},
		{name: "negative cache", tk: Tokenizer{Path: "/models/qwen", CacheBytes: ptr[int64](-1)},
			want: []string{"models.qwen.tokenizer.cache_bytes: must be at least 0 (0 disables the prefix cache), got -1"}},
		{name: "cache without path", tk: Tokenizer{CacheBytes: ptr[int64](1024)},
			want: []string{"models.qwen.tokenizer.cache_bytes: requires models.qwen.tokenizer.path"}},
		{name: "forward without path", tk: Tokenizer{ForwardInputIDs: true},
			want: []string{"models.qwen.tokenizer.forward_input_ids: requires models.qwen.tokenizer.path: without a tokenizer there are no input_ids to forward"}},
		{name: "on_error estimate", tk: Tokenizer{Path: "/models/qwen", OnError: TokenizerOnErrorEstimate}},
		{name: "on_error reject", tk: Tokenizer{Path: "/models/qwen", OnError: TokenizerOnErrorReject}},
		{name: "on_error unknown", tk: Tokenizer{Path: "/models/qwen", OnError: "ignore"},
			want: []string{`models.qwen.tokenizer.on_error: unknown value "ignore" (estimate or reject)`}},
		{name: "on_error without path", tk: Tokenizer{OnError: TokenizerOnErrorReject},
			want: []string{"models.qwen.tokenizer.on_error: requires models.qwen.tokenizer.path"}},
		{name: "both without path", tk: Tokenizer{CacheBytes: ptr[int64](-3), ForwardInputIDs: true},
			want: []string{
				"models.qwen.tokenizer.cache_bytes: must be at least 0 (0 disables the prefix cache), got -3",
				"models.qwen.tokenizer.forward_input_ids: requires models.qwen.tokenizer.path: without a tokenizer there are no input_ids to forward",
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := validBase()
			m := c.Models["qwen"]
			m.Tokenizer = tt.tk
			c.Models["qwen"] = m
			err := c.Validate()
			if got := errLines(err); !equalLines(got, tt.want) {
				t.Fatalf("Validate() =\n  %s\nwant\n  %s", strings.Join(got, "\n  "), strings.Join(tt.want, "\n  "))
			}
			for _, fe := range fieldErrors(err) {
				if !errors.Is(fe, ErrInvalid) {
					t.Errorf("%v does not unwrap to ErrInvalid", fe)
				}
			}
		})
	}
}

func TestDecodeTokenizer(t *testing.T) {
	tests := []struct {
		name    string
		doc     string
		cache   int64 // -1: absent
		forward bool
	}{
		{"defaults", `models: {m: {tokenizer: {path: /t}, buckets: [{id: a, groups: {plain: {}}}]}}`, -1, false},
		{"every key", `models: {m: {tokenizer: {path: /t, cache_bytes: 0x100000, forward_input_ids: true}, buckets: [{id: a, groups: {plain: {}}}]}}`, 1 << 20, true},
		{"cache off", `models: {m: {tokenizer: {path: /t, cache_bytes: 0}, buckets: [{id: a, groups: {plain: {}}}]}}`, 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tk := mustDecodeYAML(t, tt.doc).Models["m"].Tokenizer
			cache := int64(-1)
			if tk.CacheBytes != nil {
				cache = *tk.CacheBytes
			}
			if tk.Path != "/t" || cache != tt.cache || tk.ForwardInputIDs != tt.forward {
				t.Errorf("tokenizer = {path %q, cache_bytes %d, forward_input_ids %v}, want {/t, %d, %v}",
					tk.Path, cache, tk.ForwardInputIDs, tt.cache, tt.forward)
			}
		})
	}
}

func TestDecodeTokenizerWrongTypes(t *testing.T) {
	_, err := Decode([]byte(`models: {m: {tokenizer: {path: /t, forward_input_ids: "yes", cache_bytes: 1.5}}}`), FormatYAML)
	got := errLines(err)
	want := []string{
		"models.m.tokenizer.cache_bytes: expected an integer, got number 1.5",
		`models.m.tokenizer.forward_input_ids: expected true or false, got string "yes"`,
	}
	if !equalLines(got, want) {
		t.Fatalf("decode errors =\n  %s\nwant\n  %s", strings.Join(got, "\n  "), strings.Join(want, "\n  "))
	}
}

func TestLoadTokenizerFromEnvironment(t *testing.T) {
	file := writeFile(t, "example.yaml", issueExample)
	cfg, err := Load([]string{"--config", file}, []string{
		"SWITCHYARD_MODELS__LLAMA__TOKENIZER__PATH=/models/llama",
		"SWITCHYARD_MODELS__LLAMA__TOKENIZER__FORWARD_INPUT_IDS=true",
		"SWITCHYARD_MODELS__LLAMA__TOKENIZER__CACHE_BYTES=4096",
	})
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	tk := cfg.Models["llama"].Tokenizer
	if tk.Path != "/models/llama" || !tk.ForwardInputIDs || tk.CacheBytes == nil || *tk.CacheBytes != 4096 {
		t.Errorf("tokenizer = %+v", tk)
	}
	if err := cfg.Validate(); err != nil {
		t.Errorf("Validate: %v", err)
	}
}

func TestModelPath(t *testing.T) {
	tests := []struct{ name, want string }{
		{"llama", "models.llama"},
		{"qwen-3_8b", "models.qwen-3_8b"},
		{"meta-llama/Llama-3.1-8B", `models["meta-llama/Llama-3.1-8B"]`},
	}
	for _, tt := range tests {
		if got := ModelPath(tt.name); got != tt.want {
			t.Errorf("ModelPath(%q) = %s, want %s", tt.name, got, tt.want)
		}
	}
}
