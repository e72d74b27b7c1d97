//go:build !race

package httpfront

import (
	"bytes"
	"testing"

	"github.com/valyala/fasthttp"

	"switchyard/config"
	"switchyard/engine"
	"switchyard/load"
)

// TestParseRequestAllocations locks in an allocation-free request parse on the hot path.
func TestParseRequestAllocations(t *testing.T) {
	bodies := []struct {
		kind routeKind
		body string
	}{
		{routeChat, `{"model":"llama","messages":[{"role":"system","content":"be brief"},{"role":"user","content":"hi \u00e9"}],"max_tokens":64,"temperature":0.7,"top_p":0.9,"stream":true}`},
		{routeCompletions, `{"model":"llama","prompt":"once upon a time","max_tokens":16}`},
		{routeGenerate, `{"input_ids":[1,2,3,4,5,6,7,8],"sampling_params":{"max_new_tokens":8}}`},
	}
	for _, b := range bodies {
		var f requestFacts
		body := []byte(b.body)
		if e := parseRequest(b.kind, body, &f); e != nil { // warm the scratch buffers
			t.Fatal(e)
		}
		allocs := testing.AllocsPerRun(200, func() {
			if e := parseRequest(b.kind, body, &f); e != nil {
				t.Fatal(e)
			}
			_, _, _ = f.inputTokens(nil, body, nil)
		})
		if allocs != 0 {
			t.Errorf("%s: %.1f allocations per parse, want 0", b.kind, allocs)
		}
	}
}

// TestInjectBootstrapAllocations checks the PD body is built without allocating.
func TestInjectBootstrapAllocations(t *testing.T) {
	body := []byte(`{"model":"llama","messages":[{"role":"user","content":"hi"}]}`)
	dst := make([]byte, 0, 1024)
	allocs := testing.AllocsPerRun(200, func() {
		dst = injectBootstrap(dst[:0], body, "10.0.0.1", 8998, 0)
	})
	if allocs != 0 {
		t.Errorf("%.1f allocations, want 0", allocs)
	}
}

// TestSLOAllocations: reading the target headers and making the dispatch-time estimates
// allocate nothing.
func TestSLOAllocations(t *testing.T) {
	with := parseRequestHeader(t, "POST /v1/chat/completions HTTP/1.1\r\nHost: r\r\nX-Slo-Ttft-Ms: 250.5\r\nX-Slo-Tpot-Ms: 20\r\n\r\n")
	without := parseRequestHeader(t, "POST /v1/chat/completions HTTP/1.1\r\nHost: r\r\n\r\n")
	fwd := newForwardNames("", "")
	for name, h := range map[string]*fasthttp.RequestHeader{"with targets": with, "without": without} {
		if n := testing.AllocsPerRun(200, func() {
			var hdr clientHeaders
			fwd.scan(h, &hdr)
			if _, e := sloTargets(&hdr, engine.SLOTargets{}); e != nil {
				t.Fatal(e)
			}
		}); n != 0 {
			t.Errorf("sloTargets %s: %v allocs, want 0", name, n)
		}
	}
	w := engine.NewWorker("A", "http://127.0.0.1:1", "llama", engine.StagePlain, nil)
	s := &Server{opts: Options{Loads: load.NewTable()}}
	mr := &modelRoute{metrics: &modelMetrics{slo: &sloModelMetrics{buckets: map[string]*sloBucketMetrics{}}}}
	req := &engine.BucketRequest{Model: "llama", InputTokens: 100}
	pick := &engine.BucketPick{BucketID: "b", Plain: engine.Pick{Worker: w}}
	var tr sloTrack
	if n := testing.AllocsPerRun(200, func() { s.sloStart(&tr, mr, req, pick) }); n != 0 {
		t.Errorf("sloStart: %v allocs, want 0", n)
	}
	_ = tr
}

// plainChatAllocations is the allocations per small non-streaming request through a Server
// configured by the defaults and then set (nil: none), client, router and engine counted
// alike.
func plainChatAllocations(t *testing.T, set func(cfg *config.Config)) float64 {
	client, uri, body := servePlainChatWith(t, set)
	return requestAllocations(t, client, uri, body, nil)
}

// requestAllocations is the allocations per POST of body to uri through client, answered
// 200 (and passing check, when set), counted over the whole process once the pools and the
// connections are warm.
func requestAllocations(t *testing.T, client *fasthttp.HostClient, uri string, body []byte, check func(resp *fasthttp.Response)) float64 {
	req := fasthttp.AcquireRequest()
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	do := func() {
		req.Reset()
		req.SetRequestURI(uri)
		req.Header.SetMethod(fasthttp.MethodPost)
		req.Header.SetContentType("application/json")
		req.SetBodyRaw(body)
		if err := client.Do(req, resp); err != nil || resp.StatusCode() != 200 {
			t.Fatalf("request: %v, status %d", err, resp.StatusCode())
		}
		if check != nil {
			check(resp)
		}
	}
	for range 50 { // warm the pools and the connection
		do()
	}
	return testing.AllocsPerRun(500, do)
}

// TestPlainChatAllocations: a small non-streaming request with the defaults (aborts on)
// allocates at most once, client, router and engine together: fasthttp's drain of the
// streamed request body (an io.LimitedReader). The dispatch and the load guard live in the
// pooled exchange.
func TestPlainChatAllocations(t *testing.T) {
	if n := plainChatAllocations(t, nil); n > 1 {
		t.Errorf("%.1f allocations per request, want at most 1", n)
	}
}

// TestAbortWatchAllocations: with aborts on (the default), a request's watch of its client
// and its cancellable dispatch cost at most 2 allocations more than with aborts off, client,
// router and engine counted alike (no goroutine, channel or closure per request).
func TestAbortWatchAllocations(t *testing.T) {
	perRequest := func(abort bool) float64 {
		return plainChatAllocations(t, func(cfg *config.Config) { cfg.Abort.Enabled = abort })
	}
	off := perRequest(false)
	on := perRequest(true)
	if on > off+2 {
		t.Errorf("%.1f allocations per request with aborts on, %.1f off: want at most 2 more", on, off)
	}
}

// TestStreamAllocations bounds what a 64-event stream allocates, client, router and a
// fasthttp engine together (the engine's stream writer makes about ten of them). In the
// router: the relay, with the stream's load guard and the held part of an event cut by a
// read inside it (three allocations before: the guard, the held part, and the engine
// connection's release, a closure), the engine body stream, the hijack handler, fasthttp's
// drain of the request body and the stream's goroutine.
func TestStreamAllocations(t *testing.T) {
	client, uri, body := serveStreamChat(t)
	n := requestAllocations(t, client, uri, body, func(resp *fasthttp.Response) {
		if !bytes.HasSuffix(resp.Body(), []byte("data: [DONE]\n\n")) {
			t.Fatalf("stream ended without [DONE]: %q", resp.Body())
		}
	})
	if n > 18 {
		t.Errorf("%.0f allocations per stream, want at most 18 (21 before the guard and the held part lived in the relay and the engine connection's release was a method)", n)
	}
}
