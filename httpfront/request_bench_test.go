package httpfront

import (
	"encoding/json"
	"testing"
)

func BenchmarkParseRequest(b *testing.B) {
	body := []byte(`{"model":"llama","messages":[{"role":"system","content":"be brief"},{"role":"user","content":"hi there"}],"max_tokens":64,"temperature":0.7,"stream":true}`)
	var f requestFacts
	b.ReportAllocs()
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		if e := parseRequest(routeChat, body, &f); e != nil {
			b.Fatal(e)
		}
	}
}

// BenchmarkValidJSONBaseline is encoding/json's validation of the same body: the baseline.
func BenchmarkValidJSONBaseline(b *testing.B) {
	body := []byte(`{"model":"llama","messages":[{"role":"system","content":"be brief"},{"role":"user","content":"hi there"}],"max_tokens":64,"temperature":0.7,"stream":true}`)
	b.ReportAllocs()
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		if !json.Valid(body) {
			b.Fatal("invalid")
		}
	}
}

func BenchmarkInjectBootstrap(b *testing.B) {
	body := []byte(`{"model":"llama","messages":[{"role":"user","content":"hi"}],"max_tokens":64}`)
	dst := make([]byte, 0, 512)
	b.ReportAllocs()
	for b.Loop() {
		dst = injectBootstrap(dst[:0], body, "10.0.0.1", 8998, 0)
	}
}
