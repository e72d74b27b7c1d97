package mockengine

import (
	"slices"
	"testing"
	"time"

	"switchyard/kv/events"
	"switchyard/kv/hashing"
)

// ids returns the token IDs from, from+1, ..., from+n-1.
func ids(from, n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = uint32(from + i)
	}
	return out
}

func generate(t *testing.T, e *Engine, prompt []uint32, maxNew int, extra map[string]any) map[string]any {
	t.Helper()
	body := map[string]any{"input_ids": prompt, "sampling_params": map[string]any{"max_new_tokens": maxNew}}
	for k, v := range extra {
		body[k] = v
	}
	r := do(t, newClient(t), "POST", e.URL()+"/generate", body)
	if r.status != 200 {
		t.Fatalf("/generate: %d %s", r.status, r.body)
	}
	return r.json(t)
}

// TestRepeatedPromptGetsCheaper runs the engine as a discrete-event simulation: the
// reported latencies are exactly the cost model's, so a cache hit shows as a smaller TTFT.
func TestRepeatedPromptGetsCheaper(t *testing.T) {
	clk := NewManualClock(time.Unix(1_800_000_000, 0))
	costs := &Costs{PrefillOverhead: 5 * time.Millisecond, PrefillPerToken: 100 * time.Microsecond, DecodeStep: 10 * time.Millisecond, DecodePerRequest: time.Millisecond}
	e := startEngine(t, Config{Clock: clk, Costs: costs, PageSize: 16, LoadPublish: LoadPublish{Disabled: true}})
	runClock(t, clk)

	prompt := ids(1000, 1000)
	ttft := func(m map[string]any) time.Duration {
		return time.Duration(path(t, m, "meta_info", "first_token_latency").(float64) * float64(time.Second))
	}
	first := generate(t, e, prompt, 4, nil)
	second := generate(t, e, prompt, 4, nil)

	if got := num(t, path(t, first, "meta_info", "cached_tokens")); got != 0 {
		t.Errorf("first request: cached_tokens = %d, want 0", got)
	}
	// Whole pages of the first 999 tokens (at least one token is always computed).
	wantCached := 999 / 16 * 16
	if got := num(t, path(t, second, "meta_info", "cached_tokens")); got != wantCached {
		t.Errorf("second request: cached_tokens = %d, want %d", got, wantCached)
	}
	wantFirst := costs.PrefillOverhead + 1000*costs.PrefillPerToken
	wantSecond := costs.PrefillOverhead + time.Duration(1000-wantCached)*costs.PrefillPerToken
	if got := ttft(first); !near(got, wantFirst) {
		t.Errorf("first TTFT = %v, want %v", got, wantFirst)
	}
	if got := ttft(second); !near(got, wantSecond) {
		t.Errorf("second TTFT = %v, want %v", got, wantSecond)
	}
	// Three decode steps of one request each follow the first token.
	e2e := time.Duration(path(t, second, "meta_info", "e2e_latency").(float64) * float64(time.Second))
	if want := wantSecond + 3*(costs.DecodeStep+costs.DecodePerRequest); !near(e2e, want) {
		t.Errorf("second e2e = %v, want %v", e2e, want)
	}

	// The chat API reports the same through usage.
	chat := func() map[string]any {
		r := do(t, newClient(t), "POST", e.URL()+"/v1/chat/completions", map[string]any{
			"model": "m", "max_tokens": 2,
			"messages": []map[string]any{{"role": "system", "content": longText(400)}, {"role": "user", "content": "Hi"}},
		})
		if r.status != 200 {
			t.Fatalf("chat: %d %s", r.status, r.body)
		}
		return r.json(t)
	}
	c1, c2 := chat(), chat()
	p1 := num(t, path(t, c1, "usage", "prompt_tokens"))
	k1 := num(t, path(t, c1, "usage", "prompt_tokens_details", "cached_tokens"))
	k2 := num(t, path(t, c2, "usage", "prompt_tokens_details", "cached_tokens"))
	if k1 != 0 || k2 != (p1-1)/16*16 {
		t.Errorf("chat cached_tokens = %d then %d, want 0 then %d (prompt %d)", k1, k2, (p1-1)/16*16, p1)
	}
}

func near(a, b time.Duration) bool { return (a - b).Abs() <= time.Microsecond }

func longText(words int) string {
	w := []string{"router", "engine", "prefix", "cache", "token", "block", "queue", "decode"}
	b := make([]byte, 0, words*7)
	for i := range words {
		if i > 0 {
			b = append(b, ' ')
		}
		b = append(b, w[(i*7)%len(w)]...)
	}
	return string(b)
}

// TestTTFTFallsOnRealClock measures TTFT the way a client does, over a real clock.
func TestTTFTFallsOnRealClock(t *testing.T) {
	costs := &Costs{PrefillOverhead: time.Millisecond, PrefillPerToken: 500 * time.Microsecond, DecodeStep: 2 * time.Millisecond, DecodePerRequest: 0}
	e := startEngine(t, Config{Speedup: 2.5, Costs: costs}) // an uncached 1000-token prompt takes 200 ms
	c := newClient(t)
	body := map[string]any{"model": "m", "max_tokens": 2, "stream": true, "messages": []map[string]any{{"role": "user", "content": longText(800)}}}
	measure := func() time.Duration {
		start := time.Now()
		resp, err := c.Post(e.URL()+"/v1/chat/completions", "application/json", jsonBody(t, body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		buf := make([]byte, 1)
		if _, err := resp.Body.Read(buf); err != nil { // the first byte of the first event
			t.Fatal(err)
		}
		d := time.Since(start)
		if _, done, err := sseEvents(resp.Body); err != nil || !done {
			t.Fatalf("stream did not end cleanly: done=%v err=%v", done, err)
		}
		return d
	}
	// The warm TTFT is the fastest of three hits: a scheduling stall of a loaded host (which
	// can only lengthen a measurement) in one of them does not fail the test, a cache that does
	// not hit fails all three.
	cold := measure()
	warm := measure()
	for range 2 {
		warm = min(warm, measure())
	}
	if warm >= cold/2 {
		t.Fatalf("TTFT did not fall on a cache hit: cold %v, warm %v", cold, warm)
	}
	t.Logf("TTFT cold %v, warm %v", cold, warm)
}

// TestEvictionEmitsBlockRemoved fills a small cache and checks the KV events: stores with
// their parent hash and token IDs (prompt and output pages), LRU eviction of unreferenced
// leaves, and the cached-token counts that follow.
func TestEvictionEmitsBlockRemoved(t *testing.T) {
	for _, shape := range []events.Shape{events.ShapeArray, events.ShapeMap} {
		t.Run(shape.String(), func(t *testing.T) {
			const ps = 4
			e := startEngine(t, Config{ZeroCost: true, PageSize: ps, CacheTokens: 64, KVEvents: KVEvents{Shape: shape, Topic: "kv@mock"}})
			c := newClient(t)
			sub := dialSub(t, e.KVEventsEndpoint(0), "kv@mock")
			seq0 := syncKV(t, c, e, sub, "kv@mock")
			expectBatch := func(wantSeq uint64) *events.EventBatch {
				t.Helper()
				seq, b := kvBatch(t, sub.next(t), "kv@mock")
				if seq != wantSeq {
					t.Fatalf("seq = %d, want %d (no gaps)", seq, wantSeq)
				}
				if !b.HasDPRank || b.DPRank != 0 {
					t.Fatalf("batch without attn_dp_rank 0: %+v", b)
				}
				return b
			}

			a := ids(1, 33) // 8 whole pages and one token
			generate(t, e, a, 0, nil)
			b := expectBatch(seq0 + 1)
			hashesA := hashing.AppendBlockHashes(nil, a[:32], ps)
			want := []events.Event{{Kind: events.EventBlockStored, BlockHashes: hashesA, TokenIDs: a[:32], BlockSize: ps, Medium: events.MediumGPU}}
			if !slices.EqualFunc(b.Events, want, eventEqual) {
				t.Fatalf("prompt A stored %+v, want %+v", b.Events, want)
			}

			// An extension of A stores two pages under A's last one.
			ext := append(slices.Clone(a[:32]), ids(200, 9)...)
			generate(t, e, ext, 0, nil)
			b = expectBatch(seq0 + 2)
			hashesExt := hashing.AppendBlockHashes(nil, ext[:40], ps)
			want = []events.Event{{Kind: events.EventBlockStored, BlockHashes: hashesExt[8:], ParentHash: hashesA[7], HasParent: true,
				TokenIDs: ext[32:40], BlockSize: ps, Medium: events.MediumGPU}}
			if !slices.EqualFunc(b.Events, want, eventEqual) {
				t.Fatalf("extension stored %+v, want %+v", b.Events, want)
			}

			// 40 tokens cached; B needs 33 more of 64: the two least recently used leaves go
			// first (the extension's pages, leaf first), then A's last page.
			bPrompt := ids(500, 33)
			generate(t, e, bPrompt, 0, nil)
			b = expectBatch(seq0 + 3)
			if len(b.Events) != 2 || b.Events[0].Kind != events.EventBlockRemoved || b.Events[1].Kind != events.EventBlockStored {
				t.Fatalf("want BlockRemoved then BlockStored, got %+v", b.Events)
			}
			// Cached: A's 8 pages plus 2 extension pages = 40 tokens; 40 + 33 > 64 needs 9 tokens
			// freed, i.e. 3 pages: ext[9], ext[8] (its parent, now a leaf), then A's page 7.
			wantRemoved := []int64{hashesExt[9], hashesExt[8], hashesA[7]}
			if !slices.Equal(b.Events[0].BlockHashes, wantRemoved) || b.Events[0].Medium != events.MediumGPU {
				t.Fatalf("removed %v, want %v", b.Events[0].BlockHashes, wantRemoved)
			}

			// A again: 7 of its pages survive.
			m := generate(t, e, a, 0, nil)
			if got := num(t, path(t, m, "meta_info", "cached_tokens")); got != 28 {
				t.Fatalf("cached_tokens after eviction = %d, want 28", got)
			}
			expectBatch(seq0 + 4) // page 8 of A stored again (after evicting one of B's)

			// Output tokens are cached too: a prompt of 6 tokens and 10 outputs fills 4 pages.
			out := generate(t, e, ids(900, 6), 10, nil)
			outIDs := toUint32s(t, out["output_ids"])
			b = expectBatch(seq0 + 5)
			var stored *events.Event
			for i := range b.Events {
				if b.Events[i].Kind == events.EventBlockStored {
					stored = &b.Events[i]
				}
			}
			full := append(ids(900, 6), outIDs...)
			if stored == nil || !slices.Equal(stored.TokenIDs, full[4:16]) ||
				!slices.Equal(stored.BlockHashes, hashing.AppendBlockHashes(nil, full[:16], ps)[1:]) {
				t.Fatalf("output pages not stored as expected: %+v", b.Events)
			}
		})
	}
}

func eventEqual(a, b events.Event) bool {
	return a.Kind == b.Kind && slices.Equal(a.BlockHashes, b.BlockHashes) && a.ParentHash == b.ParentHash &&
		a.HasParent == b.HasParent && slices.Equal(a.TokenIDs, b.TokenIDs) && a.BlockSize == b.BlockSize &&
		a.Medium == b.Medium && a.HasLoRA == b.HasLoRA
}

func toUint32s(t *testing.T, v any) []uint32 {
	t.Helper()
	a, ok := v.([]any)
	if !ok {
		t.Fatalf("%v is not a list", v)
	}
	out := make([]uint32, len(a))
	for i, x := range a {
		out[i] = uint32(num(t, x))
	}
	return out
}
