package httpfront

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"github.com/VictoriaMetrics/metrics"

	"switchyard/config"
)

// lockedBuffer is a bytes.Buffer safe for the server's goroutines to write and the test to
// read.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// count returns the number of lines holding every one of subs.
func (l *lockedBuffer) count(subs ...string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, line := range strings.Split(l.b.String(), "\n") {
		all := true
		for _, s := range subs {
			all = all && strings.Contains(line, s)
		}
		if all {
			n++
		}
	}
	return n
}

// TestTokenizerErrors: a conversation the chat template refuses (Gemma 3's alternating
// roles), one it cannot render, and a chat request for a tokenizer without a template are
// counted per model and stage, logged once per cause, and answered as tokenizer.on_error
// says: by default rejected for a cache_aware model and estimated otherwise.
func TestTokenizerErrors(t *testing.T) {
	gemma, qwen, llama2 := tokenizerDir(t, "gemma3"), tokenizerDir(t, "qwen3"), tokenizerDir(t, "llama2")
	e := newFakeEngine(t, "E", "m")
	cfg := baseConfig()
	cfg.KV.Enabled = false
	cache := config.Policy{Type: config.PolicyCacheAware}
	group := func(p *config.Policy) []config.Bucket {
		return []config.Bucket{{ID: "all", Groups: config.Groups{Plain: &config.Group{Policy: p}}}}
	}
	models := map[string]config.Model{
		"gemma-cache":     {Buckets: group(&cache), Tokenizer: config.Tokenizer{Path: gemma}},
		"gemma-plain":     {Buckets: group(nil), Tokenizer: config.Tokenizer{Path: gemma}},
		"gemma-reject":    {Buckets: group(nil), Tokenizer: config.Tokenizer{Path: gemma, OnError: config.TokenizerOnErrorReject}},
		"gemma-estimate":  {Buckets: group(&cache), Tokenizer: config.Tokenizer{Path: gemma, OnError: config.TokenizerOnErrorEstimate}},
		"qwen-reject":     {Buckets: group(nil), Tokenizer: config.Tokenizer{Path: qwen, OnError: config.TokenizerOnErrorReject}},
		"llama2-cache":    {Buckets: group(&cache), Tokenizer: config.Tokenizer{Path: llama2}},
		"llama2-estimate": {Buckets: group(nil), Tokenizer: config.Tokenizer{Path: llama2}},
	}
	cfg.Models = models
	for name := range models {
		cfg.Workers = append(cfg.Workers, plainWorker("E-"+name, e.url, name))
	}
	var logs lockedBuffer
	set := metrics.NewSet()
	ts, rec := startRecordingServer(t, cfg, Options{Metrics: set, SkipStartupChecks: true, NoTelemetry: true,
		Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))})

	// Two user turns in a row: Gemma's template raises.
	refused := func(model string) string {
		return `{"model":"` + model + `","messages":[{"role":"user","content":"a"},{"role":"user","content":"b"}],"max_tokens":4}`
	}
	// A template variable of the wrong type: the template cannot iterate it.
	broken := `{"model":"qwen-reject","messages":[{"role":"user","content":"hi"}],"chat_template_kwargs":{"messages":5}}`
	chat := func(model string) string { return chatBody(model, "hello", "") }

	tests := []struct {
		name   string
		body   string
		status int
		code   string // error code; "" for a served request
		model  string
		stage  string
	}{
		{"cache_aware rejects a refused conversation", refused("gemma-cache"), 400, CodeChatTemplate, "gemma-cache", "chat_template"},
		{"same cause again", refused("gemma-cache"), 400, CodeChatTemplate, "gemma-cache", "chat_template"},
		{"plain model estimates", refused("gemma-plain"), 200, "", "gemma-plain", "chat_template"},
		{"on_error reject", refused("gemma-reject"), 400, CodeChatTemplate, "gemma-reject", "chat_template"},
		{"on_error estimate on cache_aware", refused("gemma-estimate"), 200, "", "gemma-estimate", "chat_template"},
		{"a template that cannot render", broken, 500, CodeTokenizer, "qwen-reject", "chat_template"},
		{"no chat template, cache_aware", chat("llama2-cache"), 500, CodeTokenizer, "llama2-cache", "no_chat_template"},
		{"no chat template, estimate", chat("llama2-estimate"), 200, "", "llama2-estimate", "no_chat_template"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			name := `switchyard_tokenizer_errors_total{model="` + tt.model + `",stage="` + tt.stage + `"}`
			before := counter(set, name)
			r := post(t, ts.url+"/v1/chat/completions", tt.body)
			if r.status != tt.status {
				t.Fatalf("status %d, want %d: %s", r.status, tt.status, r.body)
			}
			if tt.code != "" {
				var eb struct {
					Error struct{ Code, Message, Param string }
				}
				if err := json.Unmarshal(r.body, &eb); err != nil || eb.Error.Code != tt.code {
					t.Fatalf("error body %s: code %q, want %q (%v)", r.body, eb.Error.Code, tt.code, err)
				}
				if tt.code == CodeChatTemplate && (!strings.Contains(eb.Error.Message, "Conversation roles must alternate") || eb.Error.Param != "messages") {
					t.Fatalf("message %q param %q: want the template's own words and param messages", eb.Error.Message, eb.Error.Param)
				}
			} else if got := rec.last(t); got.ids != nil || got.input != estimateTokens(len(tt.body)) {
				t.Fatalf("input %d ids %v: want the body-size estimate %d and no IDs", got.input, got.ids, estimateTokens(len(tt.body)))
			}
			if got := counter(set, name); got != before+1 {
				t.Fatalf("%s = %d, want %d", name, got, before+1)
			}
		})
	}
	// Logged once per cause and model: gemma-cache failed twice with one cause.
	const failed = "tokenizer cannot count a request exactly"
	if n := logs.count(failed, `model=gemma-cache stage=chat_template`); n != 1 {
		t.Fatalf("gemma-cache's cause logged %d times, want once:\n%s", n, logs.b.String())
	}
	for _, m := range []string{"gemma-plain", "gemma-reject", "gemma-estimate", "qwen-reject", "llama2-cache", "llama2-estimate"} {
		if n := logs.count(failed, "model="+m+" "); n != 1 {
			t.Errorf("%s logged %d times, want once", m, n)
		}
	}
	// A conversation the template accepts is counted exactly and not as a failure.
	ok := `{"model":"gemma-cache","messages":[{"role":"user","content":"a"},{"role":"assistant","content":"b"},{"role":"user","content":"c"}]}`
	if r := post(t, ts.url+"/v1/chat/completions", ok); r.status != 200 {
		t.Fatalf("status %d: %s", r.status, r.body)
	}
	if got := rec.last(t); len(got.ids) == 0 {
		t.Fatal("an accepted conversation got no token IDs")
	}
}
