package httpfront

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"switchyard/config"
)

// twoEngineConfig is engines A and B behind one plain bucket of model llama.
func twoEngineConfig(a, b *fakeEngine) *config.Config {
	cfg := baseConfig()
	cfg.Workers = []config.Worker{plainWorker("A", a.url, "llama"), plainWorker("B", b.url, "llama")}
	cfg.Models = map[string]config.Model{"llama": {Buckets: []config.Bucket{{ID: "all",
		Groups: config.Groups{Plain: &config.Group{}}}}}}
	return cfg
}

// last returns the last request the engine that served r received, and its body.
func lastRequest(t *testing.T, r response, engines ...*fakeEngine) (string, []byte) {
	t.Helper()
	for _, e := range engines {
		if e.id == r.header.Get(headerWorker) {
			paths := e.requested()
			bodies, _ := e.received()
			return paths[len(paths)-1], bodies[len(bodies)-1]
		}
	}
	t.Fatalf("no engine named %q served the request (status %d: %s)", r.header.Get(headerWorker), r.status, r.body)
	return "", nil
}

// TestClientRoutes: the routes clients call besides chat, completions and /generate go
// through the selection to one engine, on the engine's route, with the body as sent.
func TestClientRoutes(t *testing.T) {
	a, b := newFakeEngine(t, "A", "llama"), newFakeEngine(t, "B", "llama")
	ts := startServer(t, twoEngineConfig(a, b), Options{NoTelemetry: true})
	tests := []struct {
		route, body, want string
	}{
		{"/v1/embeddings", `{"model":"llama","input":["first text","second"]}`, "POST /v1/embeddings"},
		{"/v1/embeddings", `{"model":"llama","input":[1,2,3]}`, "POST /v1/embeddings"},
		{"/v1/rerank", `{"query":"q","documents":["a","b"]}`, "POST /v1/rerank"},
		{"/rerank", `{"model":"llama","query":"q","documents":["a"]}`, "POST /v1/rerank"},
		{"/v1/responses", `{"model":"llama","input":"hello","max_output_tokens":8}`, "POST /v1/responses"},
		{"/v1/responses", `{"model":"llama","input":[{"role":"user","content":"hi"}]}`, "POST /v1/responses"},
		{"/tokenize", `{"prompt":"hello world"}`, "POST /tokenize"},
		{"/detokenize", `{"model":"llama","tokens":[1,2,3]}`, "POST /detokenize"},
	}
	for _, tt := range tests {
		r := post(t, ts.url+tt.route, tt.body)
		if r.status != 200 {
			t.Fatalf("%s %s: %d %s", tt.route, tt.body, r.status, r.body)
		}
		path, body := lastRequest(t, r, a, b)
		if path != tt.want || string(body) != tt.body {
			t.Errorf("%s: the engine received %s %s, want %s with the body as sent", tt.route, path, body, tt.want)
		}
	}
	r := post(t, ts.url+"/v1/responses", `{"model":"llama","input":"hello","stream":true}`)
	if r.status != 200 || !strings.HasPrefix(r.header.Get("Content-Type"), "text/event-stream") || !contains(r.body, "data: [DONE]") {
		t.Errorf("streamed response: %d %s", r.status, r.body)
	}

	bad := []struct{ route, body, code string }{
		{"/v1/embeddings", `{"input":"x"}`, CodeMissingModel},
		{"/v1/embeddings", `{"model":"llama"}`, CodeMissingPrompt},
		{"/v1/embeddings", `{"model":"llama","input":{}}`, CodeMissingPrompt},
		{"/v1/rerank", `{"query":"q"}`, CodeMissingPrompt},
		{"/v1/rerank", `{"query":"q","documents":[]}`, CodeMissingPrompt},
		{"/v1/responses", `{"model":"llama"}`, CodeMissingPrompt},
		{"/v1/responses", `{"model":"llama","input":"x","max_output_tokens":0}`, CodeInvalidParameter},
		{"/tokenize", `{}`, CodeMissingPrompt},
		{"/detokenize", `{"tokens":[-1]}`, CodeInvalidParameter},
		{"/v1/embeddings", `{"model":"nope","input":"x"}`, CodeModelNotFound},
		{"/tokenize", `[1]`, CodeInvalidJSON},
	}
	for _, tt := range bad {
		if r := post(t, ts.url+tt.route, tt.body); r.status/100 != 4 || r.errorCode() != tt.code {
			t.Errorf("%s %s: %d %s, want code %s", tt.route, tt.body, r.status, r.body, tt.code)
		}
	}
}

// TestClientRoutesOnPD: a prefill/decode model's generation routes go to the pair with
// the bootstrap fields; a route that generates nothing goes to the prefill engine alone.
func TestClientRoutesOnPD(t *testing.T) {
	p := newFakeEngine(t, "P", "llama", withMode("prefill"))
	p.bootstrapPort = 8998
	d := newFakeEngine(t, "D", "llama", withMode("decode"))
	d.expectHost, d.expectPort = "127.0.0.1", 8998
	ts := startServer(t, pdConfig(p, d, ptr(8998)), Options{NoTelemetry: true})
	r := post(t, ts.url+"/v1/embeddings", `{"model":"llama","input":"x"}`)
	if r.status != 200 || r.header.Get(headerWorker) != "P" || len(d.requested()) != 0 {
		t.Fatalf("embeddings on pd: %d on %q, decode got %v", r.status, r.header.Get(headerWorker), d.requested())
	}
	if _, body := lastRequest(t, r, p); contains(body, "bootstrap_room") {
		t.Errorf("embeddings carried bootstrap fields: %s", body)
	}
	r = post(t, ts.url+"/v1/responses", `{"model":"llama","input":"x"}`)
	if r.status != 200 || r.header.Get(headerWorker) != "D" || r.header.Get(headerPrefillWorker) != "P" {
		t.Fatalf("responses on pd: %d %s", r.status, r.body)
	}
	if got := d.requested(); !slices.Equal(got, []string{"POST /v1/responses"}) {
		t.Errorf("decode got %v", got)
	}
	if r := get(t, ts.url+"/get_model_info"); r.status != 200 || r.header.Get(headerWorker) != "P" {
		t.Errorf("get_model_info on pd: %d on %q", r.status, r.header.Get(headerWorker))
	}
}

// TestGatheredRoutes: /get_model_info from one engine, /get_server_info from every engine,
// /flush_cache to every engine with each one's answer, and /v1/models with every model the
// fleet serves, the models of workers added at run time included.
func TestGatheredRoutes(t *testing.T) {
	a, b := newFakeEngine(t, "A", "llama"), newFakeEngine(t, "B", "llama")
	ts := startServer(t, twoEngineConfig(a, b), Options{NoTelemetry: true, SkipStartupChecks: true})

	r := get(t, ts.url+"/get_model_info")
	if r.status != 200 {
		t.Fatalf("get_model_info: %d %s", r.status, r.body)
	}
	if path, _ := lastRequest(t, r, a, b); path != "GET /get_model_info" {
		t.Errorf("the engine received %s", path)
	}
	if r := get(t, ts.url+"/get_model_info?model=nope"); r.status != 404 || r.errorCode() != CodeModelNotFound {
		t.Errorf("unknown model: %d %s", r.status, r.body)
	}
	if r := post(t, ts.url+"/get_model_info", "{}"); r.status != 405 {
		t.Errorf("POST get_model_info: %d", r.status)
	}

	b.noInfo.Store(true)
	r = get(t, ts.url+"/get_server_info")
	var info struct {
		Served  string `json:"served_model_name"`
		Workers []struct {
			ID         string          `json:"id"`
			ServerInfo json.RawMessage `json:"server_info"`
			Error      string          `json:"error"`
		} `json:"workers"`
	}
	if err := json.Unmarshal(r.body, &info); err != nil || r.status != 200 || info.Served != "llama" || len(info.Workers) != 2 ||
		info.Workers[0].ID != "A" || !contains(info.Workers[0].ServerInfo, `"dp_size":1`) || info.Workers[1].Error == "" {
		t.Fatalf("get_server_info: %d %s", r.status, r.body)
	}

	r = post(t, ts.url+"/flush_cache", "")
	if r.status != 200 || !contains(r.body, `"success":true`) {
		t.Fatalf("flush_cache: %d %s", r.status, r.body)
	}
	for _, e := range []*fakeEngine{a, b} {
		if !slices.Contains(e.requested(), "POST /flush_cache") {
			t.Errorf("engine %s was not flushed: %v", e.id, e.requested())
		}
	}
	b.fail.Store(500)
	r = post(t, ts.url+"/flush_cache", "")
	var flush struct {
		Success bool `json:"success"`
		Results []struct {
			ID      string `json:"id"`
			Success bool   `json:"success"`
			Status  int    `json:"status"`
		} `json:"results"`
	}
	if err := json.Unmarshal(r.body, &flush); err != nil || r.status != 502 || r.errorCode() != CodeUpstream || flush.Success ||
		len(flush.Results) != 2 || !flush.Results[0].Success || flush.Results[1].Success || flush.Results[1].Status != 500 {
		t.Fatalf("flush with a failing engine: %d %s", r.status, r.body)
	}

	c := newFakeEngine(t, "C", "other")
	if r := post(t, ts.url+"/workers", `{"url":"`+c.url+`","id":"C","model":"other"}`); r.status != 201 {
		t.Fatalf("add: %d %s", r.status, r.body)
	}
	r = get(t, ts.url+"/v1/models")
	if r.status != 200 || !contains(r.body, `"id":"llama"`) || !contains(r.body, `"id":"other"`) {
		t.Fatalf("models: %d %s", r.status, r.body)
	}
}
