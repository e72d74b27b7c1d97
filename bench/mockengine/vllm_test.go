package mockengine

import (
	"strings"
	"sync"
	"testing"
	"time"

	"switchyard/load"
)

// TestVLLMFlavorRoutes: the vLLM flavour serves what a vLLM OpenAI server serves and
// answers 404 on every SGLang-specific route.
func TestVLLMFlavorRoutes(t *testing.T) {
	e := startEngine(t, Config{Flavor: FlavorVLLM, ZeroCost: true, Model: "org/m-1", DPSize: 2})
	c := newClient(t)
	for _, tt := range []struct {
		method, path string
		body         any
		want         int
	}{
		{"GET", "/health", nil, 200},
		{"GET", "/v1/models", nil, 200},
		{"GET", "/metrics", nil, 200},
		{"GET", "/version", nil, 200},
		{"POST", "/v1/chat/completions", map[string]any{"model": "org/m-1", "messages": []any{map[string]any{"role": "user", "content": "hi"}}, "max_tokens": 2}, 200},
		{"POST", "/v1/completions", map[string]any{"model": "org/m-1", "prompt": "hi", "max_tokens": 2}, 200},
		{"POST", "/tokenize", map[string]any{"model": "org/m-1", "prompt": "hello world"}, 200},
		{"POST", "/reset_prefix_cache", nil, 200},
		{"GET", "/server_info", nil, 404},
		{"GET", "/get_server_info", nil, 404},
		{"GET", "/get_load", nil, 404},
		{"GET", "/v1/loads", nil, 404},
		{"POST", "/generate", map[string]any{"text": "hi"}, 404},
		{"GET", "/health_generate", nil, 404},
		{"POST", "/flush_cache", nil, 404},
		{"GET", "/mock/faults", nil, 200},
	} {
		if r := do(t, c, tt.method, e.URL()+tt.path, tt.body); r.status != tt.want {
			t.Errorf("%s %s: status %d, want %d: %s", tt.method, tt.path, r.status, tt.want, r.body)
		}
	}
	if ep := e.LoadEndpoint(0); ep != "" {
		t.Errorf("a vLLM engine publishes a load gauge at %s", ep)
	}
	m := do(t, c, "GET", e.URL()+"/v1/models", nil).json(t)
	if got := path(t, m, "data", 0, "owned_by"); got != "vllm" {
		t.Errorf("owned_by %v", got)
	}
	tok := do(t, c, "POST", e.URL()+"/tokenize", map[string]any{"prompt": "hello world"}).json(t)
	want := e.tok.Encode("hello world")
	if num(t, tok["count"]) != len(want) || len(tok["tokens"].([]any)) != len(want) || num(t, tok["max_model_len"]) != e.Config().ContextLength {
		t.Errorf("/tokenize = %v, want %d tokens %v", tok, len(want), want)
	}
	chat := do(t, c, "POST", e.URL()+"/tokenize", map[string]any{"messages": []any{map[string]any{"role": "user", "content": "hello"}}}).json(t)
	if num(t, chat["count"]) == 0 {
		t.Errorf("/tokenize messages = %v", chat)
	}
	detok := do(t, c, "POST", e.URL()+"/detokenize", map[string]any{"tokens": tok["tokens"]}).json(t)
	if detok["prompt"] != e.tok.Decode(want) {
		t.Errorf("/detokenize = %v", detok)
	}
}

// TestVLLMMetricsFollowTheSimulator: the vLLM page carries the simulator's queue, per DP
// rank, in the names and labels the router's Prometheus decoder reads, and its figures are
// those of the native load report.
func TestVLLMMetricsFollowTheSimulator(t *testing.T) {
	for _, flavor := range []Flavor{FlavorVLLM, FlavorSGLang} {
		t.Run(string(flavor), func(t *testing.T) {
			clk := NewManualClock(time.Unix(1_800_000_000, 0))
			e := startEngine(t, Config{Flavor: flavor, Clock: clk, MaxRunning: 2, DPSize: 2, Model: "org/m-1"})
			c := newClient(t)
			const n = 6
			var wg sync.WaitGroup
			for i := range n {
				wg.Add(1)
				go func() {
					defer wg.Done()
					_, _ = tryDo(c, "POST", e.URL()+"/v1/completions", map[string]any{
						"model": "org/m-1", "prompt": ids(1000*(i+1), 64), "max_tokens": 2, "data_parallel_rank": i % 2})
				}()
			}
			var reps []load.RankReport
			var info load.PrometheusInfo
			var native []load.RankReport
			// A rank's scheduler admits what has arrived and then sleeps its prefill on the
			// manual clock, which nothing advances here: the queues settle, but a page can be
			// read while a scheduler is still admitting. Poll until the page shows all six
			// requests and agrees with the native report read right after it.
			poll(t, "six queued requests on the metrics page, as in the native report", func() bool {
				r := do(t, c, "GET", e.URL()+"/metrics", nil)
				if ct := r.header.Get("Content-Type"); !strings.HasPrefix(ct, "text/plain; version=0.0.4") {
					t.Fatalf("content type %q", ct)
				}
				var err error
				reps, info, err = load.DecodePrometheus(r.body, "org/m-1", clk.Now())
				if err != nil {
					t.Fatalf("%v\n%s", err, r.body)
				}
				if len(reps) != 2 || reps[0].Running+reps[0].Waiting+reps[1].Running+reps[1].Waiting != n {
					return false
				}
				native, _ = e.reports()
				for i, r := range reps {
					if r.Running != native[i].Running || r.Waiting != native[i].Waiting {
						return false
					}
				}
				return true
			})
			for i, r := range reps {
				if !r.Has(load.HasNative|load.HasUsedTokens) || r.MaxTotalTokens != native[i].MaxTotalTokens || r.Running > 2 {
					t.Errorf("rank %d: page %+v, native report %+v", i, r, native[i])
				}
			}
			if info.Flavor != string(flavor) || info.Model != "org/m-1" {
				t.Errorf("info %+v", info)
			}
			runClock(t, clk)
			wg.Wait()
		})
	}
}

// TestVLLMFlavorFaults: fault injection works on the vLLM flavour too.
func TestVLLMFlavorFaults(t *testing.T) {
	e := startEngine(t, Config{Flavor: FlavorVLLM, ZeroCost: true, Faults: Faults{Status: 503, Unhealthy: true}})
	c := newClient(t)
	chat := map[string]any{"messages": []any{map[string]any{"role": "user", "content": "hi"}}, "max_tokens": 1}
	if r := do(t, c, "POST", e.URL()+"/v1/chat/completions", chat); r.status != 503 {
		t.Fatalf("chat under a status fault: %d", r.status)
	}
	if r := do(t, c, "GET", e.URL()+"/health", nil); r.status != 503 {
		t.Fatalf("health under an unhealthy fault: %d", r.status)
	}
	if r := do(t, c, "PUT", e.URL()+"/mock/faults", map[string]any{}); r.status != 200 {
		t.Fatalf("clearing faults: %d %s", r.status, r.body)
	}
	if r := do(t, c, "POST", e.URL()+"/v1/chat/completions", chat); r.status != 200 {
		t.Fatalf("chat after clearing: %d %s", r.status, r.body)
	}
}
