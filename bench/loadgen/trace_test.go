package loadgen

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"switchyard/bench/mockengine"
	"switchyard/bench/workload"
	"switchyard/tokenizer"
)

// traceLines repeat a prefix: line 2 extends line 1's three 16-token blocks.
const traceLines = `{"timestamp": 0, "input_length": 40, "output_length": 5, "hash_ids": [1, 2, 3]}
{"timestamp": 30, "input_length": 64, "output_length": 4, "hash_ids": [1, 2, 3, 4]}
{"timestamp": 60, "input_length": 20, "output_length": 3, "hash_ids": [7, 8]}
`

func traceWorkload(t *testing.T, chat bool) *workload.Workload {
	t.Helper()
	w, err := workload.ReadTrace(strings.NewReader(traceLines), workload.TraceConfig{BlockSize: 16, Chat: chat}, 1)
	if err != nil {
		t.Fatal(err)
	}
	return w
}

// TestMeasureTraceOnEngines sends a trace's token prompts to real mock engines through each
// route that carries them (SGLang's /generate and the OpenAI completions route of a vLLM
// engine), streaming and not, and chat text to the chat route: the engines count the
// trace's input lengths exactly and the second request hits the first one's cached blocks.
func TestMeasureTraceOnEngines(t *testing.T) {
	tests := []struct {
		name   string
		flavor mockengine.Flavor
		path   string
		chat   bool
		stream bool
	}{
		{name: "generate stream", flavor: mockengine.FlavorSGLang, path: "/generate", stream: true},
		{name: "generate", flavor: mockengine.FlavorSGLang, path: "/generate"},
		{name: "vllm completions stream", flavor: mockengine.FlavorVLLM, path: "/v1/completions", stream: true},
		{name: "vllm completions", flavor: mockengine.FlavorVLLM, path: "/v1/completions"},
		{name: "chat stream", flavor: mockengine.FlavorSGLang, path: DefaultPath, chat: true, stream: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			e, err := mockengine.Start(ctx, mockengine.Config{Flavor: tt.flavor, Model: "m", Speedup: 1000,
				KVEvents: mockengine.KVEvents{Disabled: true}, LoadPublish: mockengine.LoadPublish{Disabled: true}})
			if err != nil {
				t.Fatal(err)
			}
			defer e.Close()
			w := traceWorkload(t, tt.chat)
			// One request outstanding at a time: each arrival waits for the one before it to
			// end, so the second request finds the first one's pages cached even when a busy
			// machine delays the first past the second's arrival time.
			m, err := Measure(ctx, Config{URLs: []string{e.URL()}, Path: tt.path, Model: "m", Stream: tt.stream, Replay: 1,
				MaxOutstanding: 1}, w.Requests)
			if err != nil {
				t.Fatal(err)
			}
			if len(m.Results) != 3 || m.Truncated {
				t.Fatalf("%d results, truncated %v", len(m.Results), m.Truncated)
			}
			extra := 0
			if tt.chat {
				extra = len(mustPrompt(t, &w.Requests[0])) - 40 // the chat template's tokens
			}
			for i, r := range m.Results {
				want := w.Requests[i]
				if !r.OK() || r.PromptTokens != want.Tokens.Len+extra || r.CompletionTokens != want.MaxTokens || r.TTFT <= 0 {
					t.Errorf("request %d: %+v; want %d prompt and %d completion tokens", i, r, want.Tokens.Len+extra, want.MaxTokens)
				}
			}
			// Request 2 (64 tokens) shares 48 tokens with request 1: its first two whole
			// 16-token pages at least, whatever the chat template adds before them.
			if got := m.Results[1].CachedTokens; got < 32 {
				t.Errorf("second request cached %d tokens, want its shared prefix", got)
			}
			if m.Results[0].CachedTokens != 0 || m.Results[2].CachedTokens != 0 {
				t.Errorf("cached tokens without a shared prefix: %+v", m.Results)
			}
		})
	}
}

func mustPrompt(t *testing.T, r *workload.Request) []uint32 {
	t.Helper()
	p, err := r.Prompt(tokenizer.NewSimple())
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestReplayArrivals: each request leaves no earlier than its arrival time divided by
// Replay, and a duration bound stops the replay before later arrivals.
func TestReplayArrivals(t *testing.T) {
	srv := okServer()
	defer srv.Close()
	reqs := requests(4)
	for i := range reqs {
		reqs[i].At = time.Duration(i) * 40 * time.Millisecond
	}
	m, err := Measure(context.Background(), Config{URLs: []string{srv.URL}, Model: "m", Replay: 2}, reqs)
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Results) != 4 || m.Truncated {
		t.Fatalf("%d results, truncated %v", len(m.Results), m.Truncated)
	}
	for i, r := range m.Results {
		if !r.OK() || r.Start < reqs[i].At/2 {
			t.Errorf("request %d sent at %v, before its arrival %v", i, r.Start, reqs[i].At/2)
		}
	}
	m, err = Measure(context.Background(), Config{URLs: []string{srv.URL}, Model: "m", Replay: 1, Duration: 70 * time.Millisecond}, reqs)
	if err != nil {
		t.Fatal(err)
	}
	if !m.Truncated || len(m.Results) != 2 {
		t.Errorf("duration bound: %d results, truncated %v; want the 2 arrivals before it", len(m.Results), m.Truncated)
	}
	// Token routes need token prompts; replay excludes a Poisson rate.
	if _, err := Measure(context.Background(), Config{URLs: []string{srv.URL}, Model: "m", Path: "/generate"}, reqs); err == nil {
		t.Error("chat requests accepted on /generate")
	}
	if err := (Config{URLs: []string{srv.URL}, Model: "m", Replay: 1, Rate: 3}).Validate(); err == nil {
		t.Error("replay and rate accepted together")
	}
}

// TestReplayRequestsOverlap: a replay's requests are in flight together, streaming or not,
// as an open loop's are. (The non-streaming client was sized for one closed-loop client in
// a replay, so a replay sent one request at a time and queued the rest for a connection.)
func TestReplayRequestsOverlap(t *testing.T) {
	const n = 3
	for _, stream := range []bool{false, true} {
		t.Run(fmt.Sprint("stream=", stream), func(t *testing.T) {
			var inflight atomic.Int64
			reached := make(chan struct{})
			var once sync.Once
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if inflight.Add(1) == n {
					once.Do(func() { close(reached) })
				}
				// Hold every request until all are in flight.
				select {
				case <-reached:
				case <-r.Context().Done():
				case <-time.After(10 * time.Second):
					t.Errorf("the replay never had %d requests in flight", n)
				}
				if stream {
					io.WriteString(w, "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\ndata: [DONE]\n\n")
					return
				}
				io.WriteString(w, `{"usage":{"prompt_tokens":1,"completion_tokens":1}}`)
			}))
			defer srv.Close()
			m, err := Measure(context.Background(), Config{URLs: []string{srv.URL}, Model: "m", Replay: 1, Stream: stream}, requests(n))
			if err != nil {
				t.Fatal(err)
			}
			for i, r := range m.Results {
				if !r.OK() {
					t.Errorf("request %d: %+v", i, r)
				}
			}
		})
	}
}
