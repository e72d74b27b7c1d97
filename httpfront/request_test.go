package httpfront

import (
	"encoding/json"
	"math"
	"testing"

	"switchyard/tokenizer"
)

func TestParseRequest(t *testing.T) {
	tests := []struct {
		name       string
		kind       routeKind
		body       string
		wantCode   string
		wantParam  string
		wantModel  string
		wantMax    int64
		wantStream bool
		wantBatch  int
		wantTokens int64
	}{
		{name: "chat", kind: routeChat, body: `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":5,"stream":true}`,
			wantModel: "m", wantMax: 5, wantStream: true, wantTokens: -1},
		{name: "chat max_completion_tokens wins", kind: routeChat,
			body:      `{"model":"m","messages":[{"role":"system","content":"s"},{"role":"user","content":[{"type":"text","text":"x"}]}],"max_tokens":5,"max_completion_tokens":7}`,
			wantModel: "m", wantMax: 7, wantTokens: -1},
		{name: "chat escaped model", kind: routeChat, body: `{"model":"a\u00e9\"b","messages":[{"role":"user","content":"x"}]}`,
			wantModel: "aé\"b", wantMax: -1, wantTokens: -1},
		{name: "assistant tool call without content", kind: routeChat,
			body:      `{"model":"m","messages":[{"role":"assistant","content":null,"tool_calls":[{"id":"1"}]},{"role":"user","content":"x"}]}`,
			wantModel: "m", wantMax: -1, wantTokens: -1},
		{name: "nulls are unset", kind: routeChat, body: `{"model":"m","messages":[{"role":"user","content":"x"}],"max_tokens":null,"temperature":null,"stream":null}`,
			wantModel: "m", wantMax: -1, wantTokens: -1},
		{name: "empty body", kind: routeChat, body: ``, wantCode: CodeInvalidJSON},
		{name: "trailing garbage", kind: routeChat, body: `{"model":"m"} x`, wantCode: CodeInvalidJSON},
		{name: "array body", kind: routeChat, body: `[]`, wantCode: CodeInvalidJSON},
		{name: "missing model", kind: routeChat, body: `{"messages":[{"role":"user","content":"x"}]}`, wantCode: CodeMissingModel, wantParam: "model"},
		{name: "empty model", kind: routeChat, body: `{"model":"","messages":[{"role":"user","content":"x"}]}`, wantCode: CodeMissingModel},
		{name: "model not a string", kind: routeChat, body: `{"model":3,"messages":[]}`, wantCode: CodeInvalidParameter},
		{name: "missing messages", kind: routeChat, body: `{"model":"m"}`, wantCode: CodeInvalidMessages},
		{name: "empty messages", kind: routeChat, body: `{"model":"m","messages":[]}`, wantCode: CodeInvalidMessages},
		{name: "message not an object", kind: routeChat, body: `{"model":"m","messages":["x"]}`, wantCode: CodeInvalidMessages},
		{name: "unknown role", kind: routeChat, body: `{"model":"m","messages":[{"role":"bot","content":"x"}]}`, wantCode: CodeInvalidMessages},
		{name: "missing content", kind: routeChat, body: `{"model":"m","messages":[{"role":"user"}]}`, wantCode: CodeInvalidMessages},
		{name: "bad content part", kind: routeChat, body: `{"model":"m","messages":[{"role":"user","content":[{"text":"x"}]}]}`, wantCode: CodeInvalidMessages},
		{name: "max_tokens zero", kind: routeChat, body: `{"model":"m","messages":[{"role":"user","content":"x"}],"max_tokens":0}`, wantCode: CodeInvalidParameter, wantParam: "max_tokens"},
		{name: "max_tokens fraction", kind: routeChat, body: `{"model":"m","messages":[{"role":"user","content":"x"}],"max_tokens":1.5}`, wantCode: CodeInvalidParameter},
		{name: "max_tokens huge", kind: routeChat, body: `{"model":"m","messages":[{"role":"user","content":"x"}],"max_tokens":1e99}`, wantCode: CodeInvalidParameter},
		{name: "temperature negative", kind: routeChat, body: `{"model":"m","messages":[{"role":"user","content":"x"}],"temperature":-0.1}`, wantCode: CodeInvalidParameter, wantParam: "temperature"},
		{name: "temperature string", kind: routeChat, body: `{"model":"m","messages":[{"role":"user","content":"x"}],"temperature":"1"}`, wantCode: CodeInvalidParameter},
		{name: "top_p above 1", kind: routeChat, body: `{"model":"m","messages":[{"role":"user","content":"x"}],"top_p":1.01}`, wantCode: CodeInvalidParameter, wantParam: "top_p"},
		{name: "n zero", kind: routeChat, body: `{"model":"m","messages":[{"role":"user","content":"x"}],"n":0}`, wantCode: CodeInvalidParameter, wantParam: "n"},
		{name: "stream not bool", kind: routeChat, body: `{"model":"m","messages":[{"role":"user","content":"x"}],"stream":"yes"}`, wantCode: CodeInvalidParameter},
		{name: "completions string", kind: routeCompletions, body: `{"model":"m","prompt":"abc","max_tokens":3}`, wantModel: "m", wantMax: 3, wantTokens: -1},
		{name: "completions batch", kind: routeCompletions, body: `{"model":"m","prompt":["a","b","c"]}`, wantModel: "m", wantMax: -1, wantBatch: 3, wantTokens: -1},
		{name: "completions token ids", kind: routeCompletions, body: `{"model":"m","prompt":[1,2,3,4]}`, wantModel: "m", wantMax: -1, wantTokens: 4},
		{name: "completions token batch", kind: routeCompletions, body: `{"model":"m","prompt":[[1,2],[3,4,5]]}`, wantModel: "m", wantMax: -1, wantBatch: 2, wantTokens: 3},
		{name: "completions missing prompt", kind: routeCompletions, body: `{"model":"m"}`, wantCode: CodeMissingPrompt},
		{name: "completions empty prompt list", kind: routeCompletions, body: `{"model":"m","prompt":[]}`, wantCode: CodeMissingPrompt},
		{name: "completions mixed list", kind: routeCompletions, body: `{"model":"m","prompt":["a",1]}`, wantCode: CodeMissingPrompt},
		{name: "generate text", kind: routeGenerate, body: `{"text":"hello","sampling_params":{"max_new_tokens":9,"temperature":3}}`, wantMax: 9, wantTokens: -1},
		{name: "generate ids", kind: routeGenerate, body: `{"input_ids":[5,6,7],"return_logprob":true}`, wantMax: -1, wantTokens: 3},
		{name: "generate zero new tokens", kind: routeGenerate, body: `{"text":"x","sampling_params":{"max_new_tokens":0}}`, wantMax: 0, wantTokens: -1},
		{name: "generate both", kind: routeGenerate, body: `{"text":"x","input_ids":[1]}`, wantCode: CodeInvalidParameter},
		{name: "generate neither", kind: routeGenerate, body: `{"sampling_params":{}}`, wantCode: CodeMissingPrompt},
		{name: "generate negative id", kind: routeGenerate, body: `{"input_ids":[1,-2]}`, wantCode: CodeInvalidParameter},
		{name: "generate id too big", kind: routeGenerate, body: `{"input_ids":[4294967296]}`, wantCode: CodeInvalidParameter},
		{name: "generate bad top_p", kind: routeGenerate, body: `{"text":"x","sampling_params":{"top_p":0}}`, wantCode: CodeInvalidParameter},
		{name: "generate sampling list", kind: routeGenerate, body: `{"text":["x","y"],"sampling_params":[{"max_new_tokens":4},{"max_new_tokens":8}]}`, wantMax: 8, wantBatch: 2, wantTokens: -1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var f requestFacts
			e := parseRequest(tt.kind, []byte(tt.body), &f)
			if tt.wantCode != "" {
				if e == nil || e.code != tt.wantCode {
					t.Fatalf("error %v, want code %s", e, tt.wantCode)
				}
				if tt.wantParam != "" && e.param != tt.wantParam {
					t.Fatalf("param %q, want %q", e.param, tt.wantParam)
				}
				if e.status() != 400 {
					t.Fatalf("status %d", e.status())
				}
				return
			}
			if e != nil {
				t.Fatalf("unexpected error %v", e)
			}
			if string(f.model) != tt.wantModel || f.maxTokens != tt.wantMax || f.stream != tt.wantStream ||
				f.batch != tt.wantBatch || f.tokenCount != tt.wantTokens {
				t.Fatalf("facts model=%q max=%d stream=%v batch=%d tokens=%d", f.model, f.maxTokens, f.stream, f.batch, f.tokenCount)
			}
		})
	}
}

func TestInputTokensAndPeak(t *testing.T) {
	tk := tokenizer.NewSimple()
	body := []byte(`{"model":"m","messages":[{"role":"user","content":"hello there, general"}],"max_tokens":10}`)
	var f requestFacts
	if e := parseRequest(routeChat, body, &f); e != nil {
		t.Fatal(e)
	}
	est, ids, _ := f.inputTokens(nil, body, nil)
	if est != estimateTokens(len(body)) || ids != nil {
		t.Fatalf("estimate %d ids %v", est, ids)
	}
	var text []byte
	n, ids, _ := f.inputTokens(newPromptTokenizer(tk, false), body, &text)
	want, _ := tk.ApplyChatTemplate([]tokenizer.Message{{Role: "user", Content: "hello there, general"}})
	if n != int64(len(tk.Encode(want))) || len(ids) != int(n) {
		t.Fatalf("tokenized %d, want %d", n, len(tk.Encode(want)))
	}
	gen := []byte(`{"input_ids":[1,2,3]}`)
	if e := parseRequest(routeGenerate, gen, &f); e != nil {
		t.Fatal(e)
	}
	if n, ids, _ := f.inputTokens(newPromptTokenizer(tk, false), gen, &text); n != 3 || len(ids) != 3 || ids[2] != 3 {
		t.Fatalf("input_ids counted %d %v", n, ids)
	}
	if p, e := expectedPeak(100, -1); p != -1 || e != nil {
		t.Fatal("unknown budget must give -1")
	}
	if p, e := expectedPeak(100, 28); p != 128 || e != nil {
		t.Fatal("peak = input + output")
	}
	if _, e := expectedPeak(10, math.MaxInt64-5); e == nil {
		t.Fatal("overflow not detected")
	}
}

func TestInjectBootstrap(t *testing.T) {
	tests := []struct {
		name, body string
		port       int
		batch      int
		check      func(map[string]any) bool
	}{
		{"object", `{"model":"m"}`, 8998, 0, func(m map[string]any) bool {
			return m["bootstrap_host"] == "10.0.0.1" && m["bootstrap_port"] == 8998.0 && m["model"] == "m"
		}},
		{"empty object, null port", ` { } `, 0, 0, func(m map[string]any) bool {
			_, has := m["bootstrap_port"]
			return has && m["bootstrap_port"] == nil
		}},
		{"batch", `{"text":["a","b","c"]}`, 1, 3, func(m map[string]any) bool {
			rooms, _ := m["bootstrap_room"].([]any)
			hosts, _ := m["bootstrap_host"].([]any)
			return len(rooms) == 3 && len(hosts) == 3 && rooms[0] != rooms[1]
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out := injectBootstrap(nil, []byte(tt.body), "10.0.0.1", tt.port, tt.batch)
			var m map[string]any
			if err := json.Unmarshal(out, &m); err != nil {
				t.Fatalf("%s: %v", out, err)
			}
			if !tt.check(m) {
				t.Fatalf("unexpected %s", out)
			}
			if r, ok := m["bootstrap_room"].(float64); ok && (r < 0 || r > math.MaxInt64) {
				t.Fatalf("room %v out of range", r)
			}
		})
	}
}

func TestMergeLogprobs(t *testing.T) {
	p := inputLogprobs([]byte(`{"text":"","meta_info":{"input_token_logprobs":[[null,1,null],[-0.2,2,null]]}}`))
	if len(p) != 1 {
		t.Fatalf("prefill logprobs %q", p)
	}
	d := []byte(`{"text":"x","meta_info":{"id":"1","input_token_logprobs":[[-0.3,3,null]],"other":1}}`)
	got := string(mergeLogprobs(nil, d, p))
	want := `{"text":"x","meta_info":{"id":"1","input_token_logprobs":[[null,1,null],[-0.2,2,null],[-0.3,3,null]],"other":1}}`
	if got != want {
		t.Fatalf("merge\n got %s\nwant %s", got, want)
	}
	batchP := inputLogprobs([]byte(`[{"meta_info":{"input_token_logprobs":[[1]]}},{"meta_info":{"input_token_logprobs":[[2]]}}]`))
	batchD := []byte(`[{"meta_info":{"input_token_logprobs":[]}},{"meta_info":{"input_token_logprobs":[[9]]}}]`)
	if got := string(mergeLogprobs(nil, batchD, batchP)); got != `[{"meta_info":{"input_token_logprobs":[[1]]}},{"meta_info":{"input_token_logprobs":[[2],[9]]}}]` {
		t.Fatalf("batch merge %s", got)
	}
	sse := inputLogprobs([]byte("data: {\"meta_info\":{\"input_token_logprobs\":[[7]]}}\n\ndata: [DONE]\n\n"))
	ev := mergeEventLogprobs(nil, []byte("data: {\"meta_info\":{\"input_token_logprobs\":[[8]]}}\n\n"), sse)
	if string(ev) != "data: {\"meta_info\":{\"input_token_logprobs\":[[7],[8]]}}\n\n" {
		t.Fatalf("event merge %q", ev)
	}
	if string(mergeLogprobs(nil, []byte("not json"), p)) != "not json" {
		t.Fatal("unreadable body must pass unchanged")
	}
}

func TestAppendErrorJSON(t *testing.T) {
	for code := range errorTable {
		e := &apiError{code: code, message: "m \"q\" \n <x> \xff", param: "p"}
		var v struct {
			Error struct {
				Message, Type, Code string
				Param               *string
			}
		}
		b := appendErrorJSON(nil, e)
		if err := json.Unmarshal(b, &v); err != nil {
			t.Fatalf("%s: %v: %s", code, err, b)
		}
		if v.Error.Code != code || v.Error.Type == "" || v.Error.Param == nil || *v.Error.Param != "p" {
			t.Fatalf("%s: %s", code, b)
		}
	}
}
