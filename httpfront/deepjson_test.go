package httpfront

import (
	"strings"
	"testing"
)

// TestDeepJSONRefusedByName: a body nested a million levels deep, wherever the nesting is
// (a field the router reads, one it skips, the first one), is refused with 400 invalid_json
// saying it is too deep: it is valid JSON, and "not valid JSON" sent clients looking for a
// syntax error. Nothing reaches the engine.
func TestDeepJSONRefusedByName(t *testing.T) {
	e := newFakeEngine(t, "A", "llama")
	ts := startServer(t, oneEngineConfig(e), Options{SkipStartupChecks: true, NoTelemetry: true})
	const levels = 1_000_000
	deep := strings.Repeat("[", levels) + strings.Repeat("]", levels)
	deepObject := strings.Repeat(`{"a":`, levels/5) + "1" + strings.Repeat("}", levels/5)
	msgs := `"messages":[{"role":"user","content":"x"}]`
	tests := []struct{ name, path, body string }{
		{"a field the router skips", "/v1/chat/completions", `{"model":"llama",` + msgs + `,"x":` + deep + `}`},
		{"message content", "/v1/chat/completions", `{"model":"llama","messages":[{"role":"user","content":` + deep + `}]}`},
		{"tools", "/v1/chat/completions", `{"model":"llama",` + msgs + `,"tools":` + deep + `}`},
		{"objects before the model", "/v1/chat/completions", `{"x":` + deepObject + `,"model":"llama",` + msgs + `}`},
		{"prompt", "/v1/completions", `{"model":"llama","prompt":` + deep + `}`},
		{"the body itself", "/v1/completions", deep},
		{"rerank documents", "/v1/rerank", `{"model":"llama","query":"q","documents":` + deep + `}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := post(t, ts.url+tt.path, tt.body)
			if r.status != 400 || r.errorCode() != CodeInvalidJSON || !contains(r.body, "deeper than 128 levels") {
				t.Fatalf("%d %.300s; want 400 %s saying it is too deep", r.status, r.body, CodeInvalidJSON)
			}
		})
	}
	if n := e.hits.Load(); n != 0 {
		t.Fatalf("%d requests reached the engine", n)
	}
}
