//go:build !race

package httpfront

import "testing"

// TestTokenizedPreparationAllocations locks in allocation-free counting of text prompts with
// the Hugging Face tokenizer (warm caches, pooled ID and body buffers), forwarding included.
// Chat requests allocate inside the chat template's rendering.
func TestTokenizedPreparationAllocations(t *testing.T) {
	pt := newPromptTokenizer(loadTokenizer(t, "qwen3"), true)
	tests := []struct {
		name    string
		kind    routeKind
		body    string
		forward bool
	}{
		{"completions", routeCompletions, `{"model":"qwen","prompt":"once upon a time, in a switchyard","max_tokens":16}`, false},
		{"completions with escapes", routeCompletions, `{"model":"qwen","prompt":"caf\u00e9 \"yard\"\n","max_tokens":16}`, false},
		{"completions batch", routeCompletions, `{"model":"qwen","prompt":["one prompt","another prompt"],"max_tokens":16}`, false},
		{"generate", routeGenerate, `{"text":"the hump yard","sampling_params":{"max_new_tokens":8}}`, false},
		{"generate forwarded", routeGenerate, `{"text":"the hump yard","sampling_params":{"max_new_tokens":8},"rid":"a"}`, true},
		{"generate batch forwarded", routeGenerate, `{"text":["the hump","the yard"]}`, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var (
				f    requestFacts
				text []byte
				fwd  []byte
			)
			body := []byte(tt.body)
			prepare := func() {
				if e := parseRequest(tt.kind, body, &f); e != nil {
					t.Fatal(e)
				}
				if tt.forward {
					if !pt.forwards(&f) {
						t.Fatal("not forwarded")
					}
					fwd, _, _ = f.forwardInputIDs(pt, body, fwd[:0], &text)
					return
				}
				if n, _, _ := f.inputTokens(pt, body, &text); n <= 0 {
					t.Fatalf("counted %d tokens", n)
				}
			}
			prepare() // warm the caches and buffers
			if allocs := testing.AllocsPerRun(100, prepare); allocs != 0 {
				t.Errorf("%.1f allocations per request, want 0", allocs)
			}
		})
	}
}
