package httpfront

import (
	"testing"

	"switchyard/config"
)

// TestRequestErrorsDoNotOpenBreakers: 15 requests that make every engine answer 500 (an
// unsupported parameter, say) pass the engines' answers through and leave every engine in
// service: the model does not turn into 503s while its engines are healthy.
func TestRequestErrorsDoNotOpenBreakers(t *testing.T) {
	engines := []*fakeEngine{newFakeEngine(t, "A", "llama"), newFakeEngine(t, "B", "llama"), newFakeEngine(t, "C", "llama")}
	cfg := baseConfig()
	for _, e := range engines {
		cfg.Workers = append(cfg.Workers, plainWorker(e.id, e.url, "llama"))
	}
	cfg.Models = map[string]config.Model{"llama": {Buckets: []config.Bucket{plainBucket("b", nil, nil, "A", "B", "C")}}}
	ts := startServer(t, cfg, Options{NoTelemetry: true})

	for _, e := range engines {
		e.fail.Store(500)
	}
	for i := range 15 {
		if r := post(t, ts.url+"/v1/chat/completions", chatBody("llama", "hi", `"logit_bias":{"x":1}`)); r.status != 500 {
			t.Fatalf("request %d: status %d body %s, want the engine's 500", i, r.status, r.body)
		}
	}
	for _, e := range engines {
		e.fail.Store(0)
	}
	for i := range 3 {
		if r := post(t, ts.url+"/v1/chat/completions", chatBody("llama", "hi", "")); r.status != 200 {
			t.Fatalf("good request %d after the bad ones: status %d body %s", i, r.status, r.body)
		}
	}
	for _, e := range engines {
		if !ts.Workers().Worker(e.id).Healthy() {
			t.Errorf("engine %s taken out of service by request-specific errors", e.id)
		}
	}
	// 4xx are never the engine's fault either.
	for _, e := range engines {
		e.fail.Store(400)
	}
	for range 30 {
		post(t, ts.url+"/v1/chat/completions", chatBody("llama", "hi", ""))
	}
	for _, e := range engines {
		if !ts.Workers().Worker(e.id).Healthy() {
			t.Errorf("engine %s taken out of service by 400 answers", e.id)
		}
	}
}

// TestAddedWorkerLenientInfoHealthyAtOnce: an engine whose /server_info spells
// kv_events.endpoint_port_base as a string (as some SGLang builds do) introspects, and a
// worker added through POST /workers serves the very next request.
func TestAddedWorkerLenientInfoHealthyAtOnce(t *testing.T) {
	a := newFakeEngine(t, "A", "llama")
	cfg := baseConfig()
	cfg.Workers = []config.Worker{plainWorker("A", a.url, "llama")}
	cfg.Models = map[string]config.Model{
		"llama": {Buckets: []config.Bucket{plainBucket("b", nil, nil, "A")}},
		"qwen":  {Buckets: []config.Bucket{{ID: "b", Groups: config.Groups{Plain: &config.Group{}}}}},
	}
	ts := startServer(t, cfg, Options{NoTelemetry: true})
	e := newKeepAliveEngine(t, "Q", "", 0)
	e.info = `{"model_path":"/models/qwen","served_model_name":"qwen","disaggregation_mode":"null","dp_size":"1",` +
		`"page_size":16,"kv_events":{"publisher":"zmq","endpoint":"tcp://*:5557","endpoint_port_base":"5557","topic":"","dp_size":1}}`
	r := post(t, ts.url+"/workers", `{"url":"`+e.url+`","id":"Q","model":"qwen"}`)
	if r.status != 201 || !contains(r.body, `"introspected":true`) || !contains(r.body, `"healthy":true`) {
		t.Fatalf("add: %d %s", r.status, r.body)
	}
	if r := post(t, ts.url+"/v1/chat/completions", chatBody("qwen", "hi", "")); r.status != 200 || r.header.Get(headerWorker) != "Q" {
		t.Fatalf("first request to the added worker: %d %s", r.status, r.body)
	}
}
