package httpfront

import (
	"bufio"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"switchyard/config"
)

func TestPlainChatForwardsAllowListedHeaders(t *testing.T) {
	e := newFakeEngine(t, "A", "llama")
	cfg := baseConfig()
	cfg.Workers = []config.Worker{plainWorker("A", e.url, "llama")}
	cfg.Models = map[string]config.Model{"llama": {Buckets: []config.Bucket{plainBucket("all", nil, nil, "A")}}}
	ts := startServer(t, cfg, Options{})

	r := post(t, ts.url+"/v1/chat/completions", chatBody("llama", "hi", `"max_tokens":8`),
		"X-Request-Id", "req-1", "Traceparent", "00-abc-01", "X-Session-Id", "s1",
		"Cookie", "secret=1", "X-Custom", "no", "Connection", "keep-alive")
	if r.status != 200 || !contains(r.body, "hello from A") {
		t.Fatalf("status %d body %s", r.status, r.body)
	}
	if got := r.header.Get(headerWorker); got != "A" {
		t.Errorf("%s = %q, want A", headerWorker, got)
	}
	if got := r.header.Get("X-Worker-Id"); got != "A" {
		t.Errorf("X-Worker-Id = %q, want A (engine headers pass through)", got)
	}
	_, hs := e.received()
	if len(hs) != 1 {
		t.Fatalf("engine got %d requests", len(hs))
	}
	h := hs[0]
	for _, k := range []string{"X-Request-Id", "Traceparent", "X-Session-Id"} {
		if h.Get(k) == "" {
			t.Errorf("header %s not forwarded", k)
		}
	}
	for _, k := range []string{"Cookie", "X-Custom"} {
		if h.Get(k) != "" {
			t.Errorf("header %s forwarded, want dropped", k)
		}
	}
}

func TestLongRequestOverflowsIntoLongBucket(t *testing.T) {
	short := newFakeEngine(t, "S", "llama")
	long := newFakeEngine(t, "L", "llama")
	cfg := baseConfig()
	cfg.Workers = []config.Worker{plainWorker("S", short.url, "llama"), plainWorker("L", long.url, "llama")}
	cfg.Models = map[string]config.Model{"llama": {Buckets: []config.Bucket{
		plainBucket("short", ptr(int64(200)), ptr(int64(400)), "S"),
		plainBucket("long", ptr(int64(100000)), ptr(int64(200000)), "L"),
	}}}
	ts := startServer(t, cfg, Options{})
	tests := []struct {
		name, body, want string
	}{
		{"short prompt", chatBody("llama", "hello", `"max_tokens":16`), "S"},
		{"long prompt", chatBody("llama", strings.Repeat("word ", 400), `"max_tokens":16`), "L"},
		{"short prompt with a peak beyond the short context", chatBody("llama", "hello", `"max_tokens":1000`), "L"},
		{"short prompt, unknown output budget", chatBody("llama", "hello", ""), "S"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := post(t, ts.url+"/v1/chat/completions", tt.body)
			if r.status != 200 || r.header.Get(headerWorker) != tt.want {
				t.Fatalf("status %d worker %q, want 200 from %s: %s", r.status, r.header.Get(headerWorker), tt.want, r.body)
			}
		})
	}
}

func TestStreamingArrivesIncrementally(t *testing.T) {
	e := newFakeEngine(t, "A", "llama", withGate())
	cfg := baseConfig()
	cfg.Workers = []config.Worker{plainWorker("A", e.url, "llama")}
	cfg.Models = map[string]config.Model{"llama": {Buckets: []config.Bucket{plainBucket("all", nil, nil, "A")}}}
	ts := startServer(t, cfg, Options{HeartbeatInterval: time.Hour})

	req, _ := http.NewRequest(http.MethodPost, ts.url+"/v1/chat/completions",
		strings.NewReader(chatBody("llama", "hi", `"stream":true`)))
	resp, err := testClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/event-stream") {
		t.Fatalf("content type %q", ct)
	}
	br := bufio.NewReader(resp.Body)
	first, err := br.ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	// The engine is still holding the rest of the stream: the client saw the first chunk
	// while the engine was generating.
	select {
	case <-e.gate:
		t.Fatal("gate released before the first chunk was read")
	default:
	}
	if !strings.Contains(first, `"tok0"`) {
		t.Fatalf("first line %q", first)
	}
	close(e.gate)
	var events []string
	for {
		line, err := br.ReadString('\n')
		if strings.HasPrefix(line, "data: ") {
			events = append(events, strings.TrimSpace(line))
		}
		if err != nil {
			break
		}
	}
	if len(events) != 4 || events[len(events)-1] != "data: [DONE]" {
		t.Fatalf("events after the first: %q", events)
	}
}

func pdConfig(p, d *fakeEngine, bootstrapPort *int) *config.Config {
	cfg := baseConfig()
	cfg.Workers = []config.Worker{
		{ID: "P", URL: p.url, Model: "llama", Role: config.RolePrefill, BootstrapPort: bootstrapPort, DPSize: 1},
		{ID: "D", URL: d.url, Model: "llama", Role: config.RoleDecode, DPSize: 1},
	}
	cfg.Models = map[string]config.Model{"llama": {Buckets: []config.Bucket{{
		ID: "pd",
		Groups: config.Groups{PD: &config.PDGroups{
			Prefill: &config.Group{WorkerIDs: &[]string{"P"}},
			Decode:  &config.Group{WorkerIDs: &[]string{"D"}},
		}},
	}}}}
	return cfg
}

func TestPDDispatchInjectsBootstrap(t *testing.T) {
	p := newFakeEngine(t, "P", "llama", withMode("prefill"))
	p.bootstrapPort = 8998
	d := newFakeEngine(t, "D", "llama", withMode("decode"))
	d.expectHost, d.expectPort = "127.0.0.1", 8998
	ts := startServer(t, pdConfig(p, d, ptr(8998)), Options{})

	t.Run("non-streaming chat", func(t *testing.T) {
		r := post(t, ts.url+"/v1/chat/completions", chatBody("llama", "hi", ""))
		if r.status != 200 || !contains(r.body, "hello from D") {
			t.Fatalf("status %d body %s", r.status, r.body)
		}
		if r.header.Get(headerPrefillWorker) != "P" || r.header.Get(headerWorker) != "D" {
			t.Errorf("headers %v", r.header)
		}
		pb, _ := p.received()
		db, _ := d.received()
		var pr, dr map[string]any
		_ = json.Unmarshal(pb[len(pb)-1], &pr)
		_ = json.Unmarshal(db[len(db)-1], &dr)
		if pr["bootstrap_room"] != dr["bootstrap_room"] || pr["bootstrap_host"] != "127.0.0.1" {
			t.Errorf("P got %v, D got %v", pr, dr)
		}
	})
	t.Run("streaming generate with logprobs", func(t *testing.T) {
		r := post(t, ts.url+"/generate", `{"text":"hi","stream":true,"return_logprob":true,"sampling_params":{"max_new_tokens":4}}`)
		if r.status != 200 {
			t.Fatalf("status %d body %s", r.status, r.body)
		}
		if !contains(r.body, `"input_token_logprobs":[[-0.1,1,null],[-0.5,1,null]]`) {
			t.Errorf("prefill logprobs not prepended: %s", r.body)
		}
		if !strings.HasSuffix(string(r.body), "data: [DONE]\n\n") {
			t.Errorf("stream did not end with [DONE]: %q", r.body)
		}
	})
	t.Run("non-streaming generate with logprobs", func(t *testing.T) {
		r := post(t, ts.url+"/generate", `{"text":"hi","return_logprob":true}`)
		if r.status != 200 || !contains(r.body, `"input_token_logprobs":[[-0.1,1,null],[-0.5,1,null]]`) {
			t.Fatalf("status %d body %s", r.status, r.body)
		}
	})
	t.Run("batch generate gets one room per item", func(t *testing.T) {
		r := post(t, ts.url+"/generate", `{"text":["a","b"]}`)
		if r.status != 400 { // the fake decode engine expects scalar fields: lists prove batching
			t.Fatalf("status %d body %s", r.status, r.body)
		}
		pb, _ := p.received()
		var pr map[string]any
		_ = json.Unmarshal(pb[len(pb)-1], &pr)
		rooms, _ := pr["bootstrap_room"].([]any)
		if len(rooms) != 2 {
			t.Errorf("bootstrap_room = %v, want two rooms", pr["bootstrap_room"])
		}
	})
}

func TestPDDecodeRefusesWrongBootstrap(t *testing.T) {
	p := newFakeEngine(t, "P", "llama", withMode("prefill"))
	d := newFakeEngine(t, "D", "llama", withMode("decode"))
	d.expectHost, d.expectPort = "127.0.0.1", 9999 // not what the router will send
	ts := startServer(t, pdConfig(p, d, ptr(8998)), Options{})
	r := post(t, ts.url+"/v1/chat/completions", chatBody("llama", "hi", ""))
	if r.status != 400 || !contains(r.body, "bad bootstrap_port") {
		t.Fatalf("status %d body %s", r.status, r.body)
	}
}

func TestPDPrefillFailures(t *testing.T) {
	tests := []struct {
		name       string
		failStatus int32
		wantStatus int
		wantCode   string
	}{
		{"prefill 5xx is prefill_failed", 500, 502, CodePrefillFailed},
		{"prefill 4xx passes through", 422, 422, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := newFakeEngine(t, "P", "llama", withMode("prefill"))
			d := newFakeEngine(t, "D", "llama", withMode("decode"))
			d.expectHost = "127.0.0.1"
			p.fail.Store(tt.failStatus)
			ts := startServer(t, pdConfig(p, d, nil), Options{})
			for _, stream := range []string{"", `"stream":true`} {
				r := post(t, ts.url+"/v1/chat/completions", chatBody("llama", "hi", stream))
				if r.status != tt.wantStatus || r.errorCode() != tt.wantCode && tt.wantCode != "" {
					t.Fatalf("stream=%q: status %d code %q body %s", stream, r.status, r.errorCode(), r.body)
				}
			}
		})
	}
}

// TestPDPrefillCompletesAfterClientLeaves: with abort.prefill_to_completion, a prefill
// whose client left runs to completion and stays accounted meanwhile.
func TestPDPrefillCompletesAfterClientLeaves(t *testing.T) {
	p := newFakeEngine(t, "P", "llama", withMode("prefill"))
	p.hold = make(chan struct{})
	d := newFakeEngine(t, "D", "llama", withMode("decode"))
	d.expectHost = "127.0.0.1"
	cfg := pdConfig(p, d, nil)
	cfg.Abort.PrefillToCompletion = true
	ts := startServer(t, cfg, Options{})

	client := &http.Client{Timeout: 200 * time.Millisecond}
	req, _ := http.NewRequest(http.MethodPost, ts.url+"/v1/chat/completions", strings.NewReader(chatBody("llama", "hi", "")))
	if _, err := client.Do(req); err == nil {
		t.Fatal("expected the client to give up")
	}
	// The prefill request is still held by the engine; it is still accounted.
	pw := ts.Workers().Worker("P")
	if pw.Counters.InFlight() != 1 {
		t.Fatalf("prefill in-flight = %d, want 1 while it runs", pw.Counters.InFlight())
	}
	close(p.hold)
	ts.stop(t) // the drain waits for the prefill request, which the client's leaving did not end
	if n := pw.Counters.InFlight(); n != 0 {
		t.Fatalf("prefill in-flight = %d after it completed", n)
	}
	if p.hits.Load() != 1 || p.aborts.Load() != 0 {
		t.Errorf("prefill hits %d, aborts %d; want 1 and none", p.hits.Load(), p.aborts.Load())
	}
}
