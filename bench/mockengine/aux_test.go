package mockengine

import (
	"encoding/json"
	"strings"
	"testing"
)

// TestAuxiliaryRoutes: model info, tokenize, embeddings, rerank and the Responses API, as
// the SGLang and vLLM flavours answer them.
func TestAuxiliaryRoutes(t *testing.T) {
	e := startEngine(t, Config{ZeroCost: true, Model: "m", WorkerID: "w"})
	c := newClient(t)
	if r := do(t, c, "GET", e.URL()+"/get_model_info", nil); r.status != 200 || r.json(t)["model_path"] != "m" {
		t.Fatalf("get_model_info: %d %s", r.status, r.body)
	}
	r := do(t, c, "POST", e.URL()+"/tokenize", map[string]any{"prompt": "hello world"})
	if r.status != 200 || num(t, r.json(t)["count"]) < 1 {
		t.Fatalf("tokenize: %d %s", r.status, r.body)
	}
	var toks struct{ Tokens []uint32 }
	_ = json.Unmarshal(r.body, &toks)
	if r := do(t, c, "POST", e.URL()+"/detokenize", map[string]any{"tokens": toks.Tokens}); r.status != 200 || r.json(t)["prompt"] == nil {
		t.Fatalf("detokenize: %d %s", r.status, r.body)
	}
	r = do(t, c, "POST", e.URL()+"/v1/embeddings", map[string]any{"model": "m", "input": []string{"a b", "c"}})
	var emb struct {
		Data []struct {
			Index     int
			Embedding []float64
		}
	}
	if err := json.Unmarshal(r.body, &emb); err != nil || r.status != 200 || len(emb.Data) != 2 || len(emb.Data[1].Embedding) != embeddingDims {
		t.Fatalf("embeddings: %d %s", r.status, r.body)
	}
	r = do(t, c, "POST", e.URL()+"/v1/rerank", map[string]any{"query": "red apple", "documents": []string{"blue sky", "red apple pie"}})
	var ranked []struct {
		Index int
		Score float64
	}
	if err := json.Unmarshal(r.body, &ranked); err != nil || len(ranked) != 2 || ranked[0].Index != 1 {
		t.Fatalf("rerank: %d %s", r.status, r.body)
	}
	r = do(t, c, "POST", e.URL()+"/v1/responses", map[string]any{"model": "m", "input": "hi"})
	if r.status != 200 || !strings.Contains(string(r.body), "a response from w") {
		t.Fatalf("responses: %d %s", r.status, r.body)
	}
	r = do(t, c, "POST", e.URL()+"/v1/responses", map[string]any{"model": "m", "input": "hi", "stream": true})
	if r.status != 200 || !strings.Contains(string(r.body), "event: response.completed") {
		t.Fatalf("responses stream: %d %s", r.status, r.body)
	}
	if r := do(t, c, "POST", e.URL()+"/v1/embeddings", map[string]any{"model": "m"}); r.status != 400 {
		t.Fatalf("embeddings without input: %d", r.status)
	}

	v := startEngine(t, Config{ZeroCost: true, Model: "m", Flavor: FlavorVLLM})
	if r := do(t, c, "GET", v.URL()+"/get_model_info", nil); r.status != 404 {
		t.Fatalf("vLLM get_model_info: %d", r.status)
	}
	r = do(t, c, "POST", v.URL()+"/rerank", map[string]any{"query": "red", "documents": []string{"red"}})
	if r.status != 200 || !strings.Contains(string(r.body), `"relevance_score"`) {
		t.Fatalf("vLLM rerank: %d %s", r.status, r.body)
	}
}
