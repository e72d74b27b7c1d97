package mockengine

import (
	"encoding/json"
	"strings"
	"testing"

	"switchyard/load"
	"switchyard/tokenizer"
)

func TestBadInput(t *testing.T) {
	e := startEngine(t, Config{ZeroCost: true, ContextLength: 100, CacheTokens: 4096})
	c := newClient(t)
	msgs := []map[string]any{{"role": "user", "content": "hi"}}
	tests := []struct {
		name, method, route string
		body                any
		status              int
		want                string
	}{
		{"malformed JSON", "POST", "/v1/chat/completions", `{"messages": [`, 400, "malformed JSON"},
		{"empty body", "POST", "/generate", "", 400, "empty"},
		{"wrong type", "POST", "/v1/chat/completions", `{"messages": "hi"}`, 400, "messages"},
		{"no messages", "POST", "/v1/chat/completions", map[string]any{"messages": []any{}}, 400, "messages"},
		{"bad role", "POST", "/v1/chat/completions", map[string]any{"messages": []map[string]any{{"role": "robot", "content": "x"}}}, 400, "role"},
		{"temperature", "POST", "/v1/chat/completions", map[string]any{"messages": msgs, "temperature": -1}, 400, "temperature"},
		{"top_p", "POST", "/v1/completions", map[string]any{"prompt": "x", "top_p": 0}, 400, "top_p"},
		{"top_k", "POST", "/generate", map[string]any{"text": "x", "sampling_params": map[string]any{"top_k": 0}}, 400, "top_k"},
		{"negative max_tokens", "POST", "/v1/chat/completions", map[string]any{"messages": msgs, "max_tokens": -1}, 400, "max_tokens"},
		{"n", "POST", "/v1/chat/completions", map[string]any{"messages": msgs, "n": 0}, 400, "n must"},
		{"penalty", "POST", "/v1/completions", map[string]any{"prompt": "x", "presence_penalty": 3}, 400, "presence_penalty"},
		{"repetition penalty", "POST", "/generate", map[string]any{"text": "x", "sampling_params": map[string]any{"repetition_penalty": 0}}, 400, "repetition_penalty"},
		{"stop type", "POST", "/v1/completions", map[string]any{"prompt": "x", "stop": 5}, 400, "stop"},
		{"top_logprobs", "POST", "/v1/chat/completions", map[string]any{"messages": msgs, "logprobs": true, "top_logprobs": 30}, 400, "top_logprobs"},
		{"no prompt", "POST", "/v1/completions", map[string]any{}, 400, "prompt"},
		{"text and input_ids", "POST", "/generate", map[string]any{"text": "x", "input_ids": []int{1}}, 400, "exactly one"},
		{"negative token", "POST", "/generate", map[string]any{"input_ids": []int{1, -2}}, 400, "token ID"},
		{"empty prompt", "POST", "/generate", map[string]any{"input_ids": []int{}}, 400, "empty"},
		{"context length", "POST", "/v1/completions", map[string]any{"prompt": "x", "max_tokens": 100}, 400, "context length"},
		{"batch stream", "POST", "/generate", map[string]any{"text": []string{"a", "b"}, "stream": true}, 400, "batch"},
		{"dp rank", "POST", "/generate", map[string]any{"text": "x", "data_parallel_rank": 3}, 400, "data_parallel_rank"},
		{"room type", "POST", "/generate", map[string]any{"text": "x", "bootstrap_host": "h", "bootstrap_room": "r"}, 400, "bootstrap_room"},
		{"room without host", "POST", "/generate", map[string]any{"text": "x", "bootstrap_room": 1}, 400, "bootstrap_host"},
		{"unknown route", "GET", "/v2/nothing", nil, 404, "not found"},
		{"unknown POST route", "POST", "/v1/audio/speech", map[string]any{}, 404, "not found"},
		{"wrong method", "GET", "/v1/chat/completions", nil, 405, "not allowed"},
		{"wrong method on load", "POST", "/get_load", nil, 405, "not allowed"},
		{"abort without rid", "POST", "/abort_request", map[string]any{}, 400, "rid"},
		{"bad faults", "PUT", "/mock/faults", map[string]any{"fail_rate": 2}, 400, "fail_rate"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := do(t, c, tt.method, e.URL()+tt.route, tt.body)
			if r.status != tt.status {
				t.Fatalf("status %d, want %d: %s", r.status, tt.status, r.body)
			}
			if r.header.Get("X-Worker-Id") != e.WorkerID() {
				t.Errorf("X-Worker-Id = %q", r.header.Get("X-Worker-Id"))
			}
			m := r.json(t)
			msg, _ := path(t, m, "error", "message").(string)
			if !strings.Contains(msg, tt.want) || num(t, path(t, m, "error", "code")) != tt.status || path(t, m, "error", "type") == "" {
				t.Fatalf("error body %s, want a message containing %q", r.body, tt.want)
			}
		})
	}
	// The engine still serves after all of that.
	if r := do(t, c, "POST", e.URL()+"/v1/chat/completions", map[string]any{"messages": msgs, "max_tokens": 1}); r.status != 200 {
		t.Fatalf("after bad input: %d", r.status)
	}
}

func TestEveryResponseNamesTheWorker(t *testing.T) {
	e := startEngine(t, Config{ZeroCost: true, WorkerID: "engine-a"})
	c := newClient(t)
	for _, rt := range []struct{ method, route string }{
		{"GET", "/health"}, {"GET", "/health_generate"}, {"GET", "/server_info"}, {"GET", "/get_server_info"},
		{"GET", "/v1/models"}, {"GET", "/get_load"}, {"GET", "/v1/loads"}, {"POST", "/flush_cache"},
		{"POST", "/abort_request"}, {"GET", "/mock/faults"}, {"GET", "/nowhere"},
	} {
		r := do(t, c, rt.method, e.URL()+rt.route, nil)
		if got := r.header.Get("X-Worker-Id"); got != "engine-a" {
			t.Errorf("%s %s: X-Worker-Id %q (status %d)", rt.method, rt.route, got, r.status)
		}
	}
}

func TestServerInfo(t *testing.T) {
	e := startEngine(t, Config{ZeroCost: true, Model: "org/model-7b", PageSize: 32, DPSize: 2, Role: RolePrefill,
		KVEvents: KVEvents{Topic: "kv", Replay: true}})
	c := newClient(t)
	for _, route := range []string{"/server_info", "/get_server_info"} {
		m := do(t, c, "GET", e.URL()+route, nil).json(t)
		check := func(key string, want any) {
			t.Helper()
			if got := m[key]; got != want {
				t.Errorf("%s: %s = %v, want %v", route, key, got, want)
			}
		}
		check("model_path", "org/model-7b")
		check("served_model_name", "org/model-7b")
		check("disaggregation_mode", "prefill")
		check("disaggregation_bootstrap_port", float64(e.BootstrapPort()))
		check("dp_size", float64(2))
		check("page_size", float64(32))
		kve, ok := m["kv_events"].(map[string]any)
		if !ok {
			t.Fatalf("%s: kv_events = %v", route, m["kv_events"])
		}
		base := num(t, kve["endpoint_port_base"])
		if e.KVEventsEndpoint(0) != "tcp://127.0.0.1:"+itoa(base) || e.KVEventsEndpoint(1) != "tcp://127.0.0.1:"+itoa(base+1) {
			t.Errorf("endpoint_port_base %d does not match the rank endpoints %s, %s", base, e.KVEventsEndpoint(0), e.KVEventsEndpoint(1))
		}
		lbase := num(t, kve["load_endpoint_port_base"])
		if e.LoadEndpoint(1) != "tcp://127.0.0.1:"+itoa(lbase+1) {
			t.Errorf("load_endpoint_port_base %d does not match %s", lbase, e.LoadEndpoint(1))
		}
		if kve["endpoint_host"] != "127.0.0.1" || kve["topic"] != "kv" || num(t, kve["block_size"]) != 32 ||
			num(t, kve["dp_size"]) != 2 || kve["publisher"] != "zmq" || kve["load_topic"] != "load" {
			t.Errorf("kv_events = %v", kve)
		}
		var cfg map[string]any
		if err := json.Unmarshal([]byte(m["kv_events_config"].(string)), &cfg); err != nil || cfg["publisher"] != "zmq" || cfg["replay_endpoint"] == nil {
			t.Errorf("kv_events_config = %v (%v)", m["kv_events_config"], err)
		}
	}
	plain := startEngine(t, Config{ZeroCost: true, KVEvents: KVEvents{Disabled: true}, LoadPublish: LoadPublish{Disabled: true}})
	m := do(t, c, "GET", plain.URL()+"/server_info", nil).json(t)
	if m["disaggregation_mode"] != "null" || m["kv_events"] != nil {
		t.Errorf("plain engine without publishers: disaggregation_mode %v, kv_events %v", m["disaggregation_mode"], m["kv_events"])
	}
	models := do(t, c, "GET", plain.URL()+"/v1/models", nil).json(t)
	if path(t, models, "data", 0, "id") != "switchyard-mock" || models["object"] != "list" {
		t.Errorf("/v1/models = %v", models)
	}
}

func TestResponseShapes(t *testing.T) {
	e := startEngine(t, Config{ZeroCost: true})
	c := newClient(t)
	tok := tokenizer.NewSimple()

	t.Run("chat", func(t *testing.T) {
		m := do(t, c, "POST", e.URL()+"/v1/chat/completions", map[string]any{
			"model": "m", "max_tokens": 5, "n": 2, "logprobs": true, "top_logprobs": 2,
			"messages": []map[string]any{{"role": "user", "content": []map[string]any{{"type": "text", "text": "Hello"}}}},
		}).json(t)
		if m["object"] != "chat.completion" || !strings.HasPrefix(m["id"].(string), "chatcmpl-") || m["model"] != "m" {
			t.Fatalf("header fields: %v", m)
		}
		if n := len(m["choices"].([]any)); n != 2 {
			t.Fatalf("%d choices, want 2", n)
		}
		content := path(t, m, "choices", 1, "message", "content").(string)
		if got := len(tok.Encode(content)); got != 5 {
			t.Errorf("content %q is %d tokens, want 5", content, got)
		}
		if path(t, m, "choices", 0, "finish_reason") != "length" || path(t, m, "choices", 1, "index") != float64(1) {
			t.Errorf("choices: %v", m["choices"])
		}
		if n := len(path(t, m, "choices", 0, "logprobs", "content").([]any)); n != 5 {
			t.Errorf("%d logprobs, want 5", n)
		}
		prompt, _ := tok.ApplyChatTemplate([]tokenizer.Message{{Role: "user", Content: "Hello"}})
		if got, want := num(t, path(t, m, "usage", "prompt_tokens")), len(tok.Encode(prompt)); got != want {
			t.Errorf("prompt_tokens %d, want %d", got, want)
		}
		if num(t, path(t, m, "usage", "completion_tokens")) != 10 || num(t, path(t, m, "usage", "total_tokens")) != num(t, path(t, m, "usage", "prompt_tokens"))+10 {
			t.Errorf("usage %v", m["usage"])
		}
	})
	t.Run("chat without max_tokens stops", func(t *testing.T) {
		m := do(t, c, "POST", e.URL()+"/v1/chat/completions", map[string]any{"messages": []map[string]any{{"role": "user", "content": "Hi"}}}).json(t)
		n := num(t, path(t, m, "usage", "completion_tokens"))
		if path(t, m, "choices", 0, "finish_reason") != "stop" || n < 16 || n > 128 {
			t.Errorf("finish %v after %d tokens", path(t, m, "choices", 0, "finish_reason"), n)
		}
	})
	t.Run("chat stream", func(t *testing.T) {
		resp, err := c.Post(e.URL()+"/v1/chat/completions", "application/json", jsonBody(t, map[string]any{
			"max_tokens": 3, "stream": true, "stream_options": map[string]any{"include_usage": true},
			"messages": []map[string]any{{"role": "user", "content": "Hi"}},
		}))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/event-stream") || resp.Header.Get("X-Worker-Id") == "" {
			t.Fatalf("headers %v", resp.Header)
		}
		events, done, err := sseEvents(resp.Body)
		if err != nil || !done || len(events) != 5 { // 3 tokens, finish, usage
			t.Fatalf("%d events, done %v, err %v", len(events), done, err)
		}
		var chunks []map[string]any
		for _, ev := range events {
			var m map[string]any
			if err := json.Unmarshal([]byte(ev), &m); err != nil {
				t.Fatal(err)
			}
			chunks = append(chunks, m)
		}
		if path(t, chunks[0], "choices", 0, "delta", "role") != "assistant" || chunks[0]["object"] != "chat.completion.chunk" {
			t.Errorf("first chunk %v", chunks[0])
		}
		if path(t, chunks[3], "choices", 0, "finish_reason") != "length" {
			t.Errorf("finish chunk %v", chunks[3])
		}
		if len(chunks[4]["choices"].([]any)) != 0 || num(t, path(t, chunks[4], "usage", "completion_tokens")) != 3 {
			t.Errorf("usage chunk %v", chunks[4])
		}
	})
	t.Run("completions", func(t *testing.T) {
		m := do(t, c, "POST", e.URL()+"/v1/completions", map[string]any{"prompt": []string{"a b", "c d"}, "max_tokens": 2, "logprobs": 1}).json(t)
		if m["object"] != "text_completion" || len(m["choices"].([]any)) != 2 || num(t, path(t, m, "usage", "completion_tokens")) != 4 {
			t.Fatalf("%v", m)
		}
		if n := len(path(t, m, "choices", 1, "logprobs", "token_logprobs").([]any)); n != 2 {
			t.Errorf("%d token logprobs", n)
		}
		events, done, err := sseEvents(strings.NewReader(string(do(t, c, "POST", e.URL()+"/v1/completions", map[string]any{"prompt": []int{5, 6, 7}, "max_tokens": 2, "stream": true}).body)))
		if err != nil || !done || len(events) != 3 {
			t.Fatalf("stream: %d events, done %v, err %v", len(events), done, err)
		}
	})
	t.Run("generate", func(t *testing.T) {
		m := do(t, c, "POST", e.URL()+"/generate", map[string]any{"text": "Hello", "sampling_params": map[string]any{"max_new_tokens": 4}, "rid": "r-1"}).json(t)
		ids := toUint32s(t, m["output_ids"])
		if len(ids) != 4 || tok.Decode(ids) != m["text"] {
			t.Fatalf("output_ids %v do not decode to text %q", ids, m["text"])
		}
		if path(t, m, "meta_info", "id") != "r-1" || path(t, m, "meta_info", "finish_reason", "type") != "length" ||
			num(t, path(t, m, "meta_info", "prompt_tokens")) != len(tok.Encode("Hello")) {
			t.Errorf("meta_info %v", m["meta_info"])
		}
		var batch []map[string]any
		r := do(t, c, "POST", e.URL()+"/generate", map[string]any{"text": []string{"a", "b", "c"}, "sampling_params": map[string]any{"max_new_tokens": 1}})
		if err := json.Unmarshal(r.body, &batch); err != nil || len(batch) != 3 {
			t.Fatalf("batch: %s (%v)", r.body, err)
		}
		events, done, err := sseEvents(strings.NewReader(string(do(t, c, "POST", e.URL()+"/generate", map[string]any{"input_ids": []int{1, 2, 3}, "sampling_params": map[string]any{"max_new_tokens": 3}, "stream": true}).body)))
		if err != nil || !done || len(events) != 3 {
			t.Fatalf("stream: %d events, done %v, err %v", len(events), done, err)
		}
		var last map[string]any
		_ = json.Unmarshal([]byte(events[2]), &last)
		if len(last["output_ids"].([]any)) != 3 || path(t, last, "meta_info", "finish_reason", "type") != "length" {
			t.Errorf("last chunk %v", last)
		}
	})
}

func TestDPRanks(t *testing.T) {
	e := startEngine(t, Config{ZeroCost: true, DPSize: 3})
	c := newClient(t)
	seen := map[int]bool{}
	for range 6 {
		m := do(t, c, "POST", e.URL()+"/generate", map[string]any{"text": "x", "sampling_params": map[string]any{"max_new_tokens": 1}}).json(t)
		seen[num(t, path(t, m, "meta_info", "dp_rank"))] = true
	}
	if len(seen) != 3 {
		t.Errorf("round robin reached ranks %v", seen)
	}
	m := do(t, c, "POST", e.URL()+"/generate", map[string]any{"text": "x", "data_parallel_rank": 2}).json(t)
	if num(t, path(t, m, "meta_info", "dp_rank")) != 2 {
		t.Errorf("data_parallel_rank ignored")
	}
	reps := getLoads(t, e)
	if len(reps) != 3 || reps[2].DPRank != 2 {
		t.Fatalf("/v1/loads ranks %+v", reps)
	}
	for i := range 3 {
		if e.KVEventsEndpoint(i) == "" || e.LoadEndpoint(i) == "" {
			t.Errorf("rank %d has no publishers", i)
		}
	}
}

func TestStartMany(t *testing.T) {
	engines, err := StartMany(t.Context(), Config{ZeroCost: true, WorkerID: "w"}, 3)
	if err != nil {
		t.Fatal(err)
	}
	c := newClient(t)
	t.Cleanup(func() {
		for _, e := range engines {
			if err := e.Close(); err != nil {
				t.Error(err)
			}
		}
	})
	for i, e := range engines {
		r := do(t, c, "GET", e.URL()+"/health", nil)
		if r.status != 200 || r.header.Get("X-Worker-Id") != "w-"+itoa(i) {
			t.Errorf("engine %d: %d %q", i, r.status, r.header.Get("X-Worker-Id"))
		}
	}
}

func TestAbortAndFlush(t *testing.T) {
	e := startEngine(t, Config{ZeroCost: true, Faults: Faults{Hang: true}})
	c := newClient(t)
	held := async(t, "POST", e.URL()+"/v1/chat/completions", chatReq(false, 3))
	waitLoad(t, e, "the request to be held", func(r load.RankReport) bool { return r.Running == 1 })
	if r := do(t, c, "POST", e.URL()+"/abort_request", map[string]any{"abort_all": true}); num(t, r.json(t)["aborted"]) != 1 {
		t.Fatalf("abort_all: %s", r.body)
	}
	if r := await(t, held); r.status != 400 {
		t.Fatalf("aborted request: %d %s", r.status, r.body)
	}
	_ = e.SetFaults(Faults{})
	if r := do(t, c, "POST", e.URL()+"/flush_cache", nil); r.status != 200 || !strings.Contains(string(r.body), "flushed") {
		t.Fatalf("flush: %d %s", r.status, r.body)
	}
}
