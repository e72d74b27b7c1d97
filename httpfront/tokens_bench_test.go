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
