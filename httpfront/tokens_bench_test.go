package httpfront

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
)

// multiTurnChat returns a chat request body of turns user/assistant exchanges (a system
// prompt first, a new user question last), about 600 bytes of varied text per exchange, and
// padded with a long document when docBytes > 0.
func multiTurnChat(turns, docBytes int) []byte {
	type msg struct {
		Role    string `json:"role"`
		Content string `json:"content"`
	}
	msgs := []msg{{"system", "You are Switchyard's assistant. Answer precisely, cite the configuration keys you use, and keep answers under two hundred words."}}
	if docBytes > 0 {
		var doc strings.Builder
		for i := 0; doc.Len() < docBytes; i++ {
			fmt.Fprintf(&doc, "Section %d. A classification yard sorts %d railway cars onto tracks by destination; "+
				"the hump lets gravity roll each car (ID %x) to its track.\n", i, 40+i%17, i*7919)
		}
		msgs = append(msgs, msg{"user", "Read this document:\n" + doc.String()}, msg{"assistant", "I have read it."})
	}
	for i := range turns {
		msgs = append(msgs,
			msg{"user", fmt.Sprintf("Question %d: how does the router pick an engine when bucket %q is full and the session header x-session-id is %d? Include numbers like 3.14159 and 2^%d, 東京 and émojis 🚂.", i, fmt.Sprint("b", i), 1000+i, i)},
			msg{"assistant", fmt.Sprintf("For question %d: the router tries the buckets in rank order; a full bucket is skipped, then the policy (power_of_two, cache_aware or sticky) picks among the healthy engines with admission checks.\n\n```yaml\nmodels:\n  llama:\n    buckets: [{id: b%d, limits: {max: %d}}]\n```\nThat is all.", i, i, 4096*(i+1))})
	}
	msgs = append(msgs, msg{"user", "Summarize everything above in three bullet points."})
	b, _ := json.Marshal(map[string]any{"model": "qwen", "messages": msgs, "max_tokens": 256, "stream": true})
	return b
}

// multiTurnChatParts is multiTurnChat as the OpenAI SDKs send a conversation with tools:
// contents as lists of text parts, and each assistant turn a tool call (arguments as a JSON
// string) followed by its tool result. Such a conversation needs preparing for a text chat
// template (parts joined, arguments parsed, null members dropped).
func multiTurnChatParts(turns int) []byte {
	type part struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	type call struct {
		ID       string `json:"id"`
		Type     string `json:"type"`
		Function struct {
			Name      string `json:"name"`
			Arguments string `json:"arguments"`
		} `json:"function"`
	}
	type msg struct {
		Role       string  `json:"role"`
		Content    any     `json:"content"`
		ToolCalls  []call  `json:"tool_calls,omitempty"`
		ToolCallID *string `json:"tool_call_id,omitempty"`
		Name       *string `json:"name"`
	}
	msgs := []msg{{Role: "system", Content: []part{{"text", "You are Switchyard's assistant. Use the tools to look configuration keys up."}}}}
	for i := range turns {
		var c call
		c.ID, c.Type = fmt.Sprintf("call_%d", i), "function"
		c.Function.Name = "lookup_key"
		c.Function.Arguments = fmt.Sprintf(`{"key": "models.llama.buckets[%d].limits.max", "explain": true}`, i)
		id := c.ID
		msgs = append(msgs,
			msg{Role: "user", Content: []part{{"text", fmt.Sprintf("Question %d: what bounds bucket b%d?", i, i)}, {"text", "Answer with numbers like 3.14159, 東京 and 🚂."}}},
			msg{Role: "assistant", Content: nil, ToolCalls: []call{c}},
			msg{Role: "tool", Content: fmt.Sprintf(`{"value": %d, "unit": "tokens"}`, 4096*(i+1)), ToolCallID: &id},
			msg{Role: "assistant", Content: []part{{"text", fmt.Sprintf("Bucket b%d takes prompts up to %d tokens.", i, 4096*(i+1))}}})
	}
	msgs = append(msgs, msg{Role: "user", Content: []part{{"text", "Summarize everything above in three bullet points."}}})
	tools := []any{map[string]any{"type": "function", "function": map[string]any{"name": "lookup_key", "description": "Look a configuration key up.",
		"parameters": map[string]any{"type": "object", "properties": map[string]any{"key": map[string]any{"type": "string"}, "explain": map[string]any{"type": "boolean"}}, "required": []string{"key"}}}}}
	b, _ := json.Marshal(map[string]any{"model": "qwen", "messages": msgs, "tools": tools, "max_tokens": 256, "stream": true})
	return b
}

// BenchmarkPrepareRequest measures request preparation (parse, validation, token counting and
// the expected peak) with the Hugging Face tokenizers on multi-turn chats whose history the
// prefix cache has seen (warm: the same body every iteration), beside the body-size estimate.
func BenchmarkPrepareRequest(b *testing.B) {
	cases := []struct {
		name  string
		model string // "" : no tokenizer (the estimate)
		kind  routeKind
		body  []byte
	}{
		{"estimate/chat-8turns", "", routeChat, multiTurnChat(8, 0)},
		{"qwen3/chat-1turn", "qwen3", routeChat, multiTurnChat(0, 0)},
		{"qwen3/chat-8turns", "qwen3", routeChat, multiTurnChat(8, 0)},
		{"qwen3/chat-32turns", "qwen3", routeChat, multiTurnChat(32, 0)},
		{"qwen3/chat-8turns-tools", "qwen3", routeChat, multiTurnChatParts(8)},
		{"qwen3/chat-100k-tokens", "qwen3", routeChat, multiTurnChat(8, 400_000)},
		{"llama3/chat-8turns", "llama3", routeChat, multiTurnChat(8, 0)},
		{"qwen3/completions", "qwen3", routeCompletions, []byte(`{"model":"qwen","prompt":"Once upon a time in a classification yard, a hump engineer counted the cars.","max_tokens":64}`)},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			var pt *promptTokenizer
			if c.model != "" {
				pt = newPromptTokenizer(loadTokenizer(b, c.model), false)
			}
			var f requestFacts
			var text []byte
			prepare := func() int64 {
				if e := parseRequest(c.kind, c.body, &f); e != nil {
					b.Fatal(e)
				}
				input, _, _ := f.inputTokens(pt, c.body, &text)
				if _, e := expectedPeak(input, f.maxTokens); e != nil {
					b.Fatal(e)
				}
				return input
			}
			tokens := prepare() // warms the prefix cache
			b.ReportAllocs()
			b.SetBytes(int64(len(c.body)))
			for b.Loop() {
				prepare()
			}
			b.ReportMetric(float64(tokens), "tokens")
		})
	}
}
