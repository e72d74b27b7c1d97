package httpfront

import (
	"bytes"
	"compress/gzip"
	"net"
	"net/http"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"

	"switchyard/config"
	"switchyard/engine"
)

// TestErrorStatuses drives every error status of the serving path end to end and checks its
// code.
func TestErrorStatuses(t *testing.T) {
	e := newFakeEngine(t, "A", "llama")
	down, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	downURL := "http://" + down.Addr().String()
	down.Close() // nothing listens there any more

	slow := newFakeEngine(t, "S", "slowmodel")
	slow.hold = make(chan struct{})

	cfg := baseConfig()
	cfg.Server.APIKey = "k1"
	cfg.Server.MaxBodyBytes = 64 << 10
	cfg.Server.RequestTimeout = 300 * time.Millisecond
	cfg.Workers = []config.Worker{
		plainWorker("A", e.url, "llama"),
		plainWorker("X", downURL, "deadmodel"),
		plainWorker("S", slow.url, "slowmodel"),
	}
	cfg.Models = map[string]config.Model{
		"llama":     {Buckets: []config.Bucket{plainBucket("tiny", ptr(int64(50)), nil, "A")}},
		"deadmodel": {Buckets: []config.Bucket{plainBucket("all", nil, nil, "X")}},
		"slowmodel": {Buckets: []config.Bucket{plainBucket("all", nil, nil, "S")}},
		"empty":     {Buckets: []config.Bucket{plainBucket("none", nil, nil)}},
	}
	ts := startServer(t, cfg, Options{SkipStartupChecks: true})
	auth := []string{"Authorization", "Bearer k1"}
	chat := ts.url + "/v1/chat/completions"

	tests := []struct {
		name       string
		url, body  string
		headers    []string
		wantStatus int
		wantCode   string
	}{
		{"ok", chat, chatBody("llama", "hi", ""), auth, 200, ""},
		{"missing key", chat, chatBody("llama", "hi", ""), nil, 401, CodeMissingAPIKey},
		{"wrong key", chat, chatBody("llama", "hi", ""), []string{"Authorization", "Bearer nope"}, 403, CodeInvalidAPIKey},
		{"invalid JSON", chat, `{"model":`, auth, 400, CodeInvalidJSON},
		{"not an object", chat, `[1,2]`, auth, 400, CodeInvalidJSON},
		{"missing model", chat, `{"messages":[{"role":"user","content":"x"}]}`, auth, 400, CodeMissingModel},
		{"malformed messages", chat, `{"model":"llama","messages":[{"role":"robot","content":"x"}]}`, auth, 400, CodeInvalidMessages},
		{"non-positive max_tokens", chat, chatBody("llama", "hi", `"max_tokens":0`), auth, 400, CodeInvalidParameter},
		{"temperature out of range", chat, chatBody("llama", "hi", `"temperature":2.5`), auth, 400, CodeInvalidParameter},
		{"top_p out of range", chat, chatBody("llama", "hi", `"top_p":0`), auth, 400, CodeInvalidParameter},
		{"n below 1", chat, chatBody("llama", "hi", `"n":0`), auth, 400, CodeInvalidParameter},
		{"peak overflows", chat, chatBody("llama", "hi", `"max_tokens":9223372036854775807`), auth, 400, CodeInvalidParameter},
		{"no matching bucket", chat, chatBody("llama", strings.Repeat("long ", 200), ""), auth, 400, CodeNoMatchingBucket},
		{"unknown model", chat, chatBody("gpt-9", "hi", ""), auth, 404, CodeModelNotFound},
		{"unknown route", ts.url + "/v2/nothing", "{}", auth, 404, CodeNotFound},
		{"too large", chat, chatBody("llama", strings.Repeat("x", 70<<10), ""), auth, 413, CodeRequestTooLarge},
		{"no engine in group", chat, chatBody("empty", "hi", ""), auth, 503, CodeNoAvailableEngine},
		{"engine unreachable", chat, chatBody("deadmodel", "hi", ""), auth, 502, CodeUpstream},
		{"engine timeout", chat, chatBody("slowmodel", "hi", ""), auth, 504, CodeUpstreamTimeout},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			send := post
			if tt.wantStatus == 413 {
				send = postRaw // answered before the body is read: see postRaw
			}
			r := send(t, tt.url, tt.body, tt.headers...)
			if r.status != tt.wantStatus {
				t.Fatalf("status %d, want %d: %s", r.status, tt.wantStatus, r.body)
			}
			if tt.wantCode != "" && r.errorCode() != tt.wantCode {
				t.Fatalf("code %q, want %q: %s", r.errorCode(), tt.wantCode, r.body)
			}
			if tt.wantCode != "" && !contains(r.body, `"type":`) {
				t.Errorf("error body is not OpenAI-shaped: %s", r.body)
			}
		})
	}
	close(slow.hold)

	t.Run("GET on an inference route", func(t *testing.T) {
		r := get(t, chat, auth...)
		if r.status != 405 || r.errorCode() != CodeMethodNotAllowed {
			t.Fatalf("status %d body %s", r.status, r.body)
		}
	})
}

// TestSelectionFailureStatuses maps every selection outcome the actors can return.
func TestSelectionFailureStatuses(t *testing.T) {
	e := newFakeEngine(t, "A", "llama")
	cfg := baseConfig()
	cfg.Workers = []config.Worker{plainWorker("A", e.url, "llama")}
	cfg.Models = map[string]config.Model{"llama": {Buckets: []config.Bucket{plainBucket("b", nil, nil, "A")}}}
	ts := startServer(t, cfg, Options{SkipStartupChecks: true})
	tests := []struct {
		outcome    engine.Outcome
		wantStatus int
		wantCode   string
	}{
		{engine.OutcomeOverloaded, 429, CodeOverloaded},
		{engine.OutcomeTimeout, 503, CodeSelectionTimeout},
		{engine.OutcomeInvalidSignal, 500, CodeInvalidSignal},
		{engine.OutcomeInvalidConfiguration, 500, CodeInvalidConfig},
		{engine.OutcomeOutsideCandidates, 500, CodeOutsideCandidates},
		{engine.OutcomeInternal, 500, CodeInternal},
		{engine.OutcomeNoCandidates, 503, CodeNoAvailableEngine},
		{engine.OutcomeNoMatchingBucket, 400, CodeNoMatchingBucket},
	}
	real := ts.sel
	defer func() { ts.sel = real }()
	for _, tt := range tests {
		t.Run(tt.outcome.String(), func(t *testing.T) {
			ts.sel = stubSelector{&engine.PickError{Outcome: tt.outcome, Stage: engine.StageDecode, BucketID: "b"}}
			r := post(t, ts.url+"/v1/chat/completions", chatBody("llama", "hi", ""))
			if r.status != tt.wantStatus || r.errorCode() != tt.wantCode {
				t.Fatalf("status %d code %q, want %d %q: %s", r.status, r.errorCode(), tt.wantStatus, tt.wantCode, r.body)
			}
			// A selection that missed its deadline is the router's own overload: the
			// client may retry it.
			if tt.outcome == engine.OutcomeTimeout && r.header.Get("Retry-After") != "1" {
				t.Fatalf("Retry-After %q, want 1", r.header.Get("Retry-After"))
			}
		})
	}
	t.Run("exhaustion carries admission rejections and the stage", func(t *testing.T) {
		ts.sel = stubSelector{&engine.PickError{Outcome: engine.OutcomeNoAdmissibleEngine, Stage: engine.StagePrefill,
			Rejections: []engine.Rejection{{BucketID: "b", Stage: engine.StagePrefill, WorkerID: "A", Limit: "max_running_requests"}}}}
		r := post(t, ts.url+"/v1/chat/completions", chatBody("llama", "hi", ""))
		if r.status != 503 || !contains(r.body, `"stage":"prefill"`) || !contains(r.body, `"limit":"max_running_requests"`) {
			t.Fatalf("status %d body %s", r.status, r.body)
		}
	})
}

// TestAdmissionExhaustionIs503 fills an in-flight cap with a held stream: the next request
// is rejected by admission in every bucket.
func TestAdmissionExhaustionIs503(t *testing.T) {
	e := newFakeEngine(t, "A", "llama", withGate())
	cfg := baseConfig()
	cfg.Workers = []config.Worker{plainWorker("A", e.url, "llama")}
	b := plainBucket("b", nil, nil, "A")
	b.Groups.Plain.Policy = &config.Policy{Type: config.PolicyRoundRobin,
		Admission: config.Admission{MaxInflightRequests: ptr(int64(1))}}
	cfg.Models = map[string]config.Model{"llama": {Buckets: []config.Bucket{b}}}
	ts := startServer(t, cfg, Options{SkipStartupChecks: true})

	req, _ := http.NewRequest(http.MethodPost, ts.url+"/v1/chat/completions", strings.NewReader(chatBody("llama", "hi", `"stream":true`)))
	resp, err := testClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	waitFor(t, e.streamed, "first chunk")
	r := post(t, ts.url+"/v1/chat/completions", chatBody("llama", "hi", ""))
	if r.status != 503 || r.errorCode() != CodeNoAvailableEngine || !contains(r.body, "max_inflight_requests") {
		t.Fatalf("status %d body %s", r.status, r.body)
	}
	close(e.gate)
}

func TestCompressedBodies(t *testing.T) {
	e := newFakeEngine(t, "A", "llama")
	cfg := baseConfig()
	cfg.Workers = []config.Worker{plainWorker("A", e.url, "llama")}
	cfg.Models = map[string]config.Model{"llama": {Buckets: []config.Bucket{plainBucket("b", nil, nil, "A")}}}
	ts := startServer(t, cfg, Options{SkipStartupChecks: true})
	body := []byte(chatBody("llama", "compressed hello", ""))
	for _, enc := range []string{"gzip", "deflate", "br", "zstd", "identity"} {
		t.Run(enc, func(t *testing.T) {
			req, _ := http.NewRequest(http.MethodPost, ts.url+"/v1/chat/completions", bytes.NewReader(compress(t, enc, body)))
			req.Header.Set("Content-Encoding", enc)
			r := do(t, req)
			if r.status != 200 {
				t.Fatalf("status %d body %s", r.status, r.body)
			}
			bodies, _ := e.received()
			if got := withoutRouterRID(bodies[len(bodies)-1]); !bytes.Equal(got, body) {
				t.Fatalf("engine got %q, want the decompressed body", got)
			}
		})
	}
	t.Run("unsupported encoding", func(t *testing.T) {
		req, _ := http.NewRequest(http.MethodPost, ts.url+"/v1/chat/completions", bytes.NewReader(body))
		req.Header.Set("Content-Encoding", "compress")
		if r := do(t, req); r.status != 415 || r.errorCode() != CodeUnsupportedEncoding {
			t.Fatalf("status %d body %s", r.status, r.body)
		}
	})
	t.Run("corrupt body", func(t *testing.T) {
		req, _ := http.NewRequest(http.MethodPost, ts.url+"/v1/chat/completions", bytes.NewReader([]byte("not gzip")))
		req.Header.Set("Content-Encoding", "gzip")
		if r := do(t, req); r.status != 400 || r.errorCode() != CodeInvalidEncoding {
			t.Fatalf("status %d body %s", r.status, r.body)
		}
	})
}

// TestCompressionBombRefused sends 256 MiB of zeros compressed to a few hundred KiB: it is refused
// with 413 once the 32 MiB cap is passed, and the router allocates a bounded amount doing so.
func TestCompressionBombRefused(t *testing.T) {
	e := newFakeEngine(t, "A", "llama")
	cfg := baseConfig()
	cfg.Workers = []config.Worker{plainWorker("A", e.url, "llama")}
	cfg.Models = map[string]config.Model{"llama": {Buckets: []config.Bucket{plainBucket("b", nil, nil, "A")}}}
	ts := startServer(t, cfg, Options{SkipStartupChecks: true})
	for _, enc := range []string{"gzip", "zstd"} {
		t.Run(enc, func(t *testing.T) {
			bomb := bombOf(t, enc, 256<<20)
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			req, _ := http.NewRequest(http.MethodPost, ts.url+"/v1/chat/completions", bytes.NewReader(bomb))
			req.Header.Set("Content-Encoding", enc)
			r := do(t, req)
			runtime.ReadMemStats(&after)
			if r.status != 413 || r.errorCode() != CodeRequestTooLarge {
				t.Fatalf("status %d body %.200s", r.status, r.body)
			}
			// The cap is 32 MiB; growth doubles, so decoding may allocate up to about twice
			// that plus the compressed body. Far below the 256 MiB it expands to.
			if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 160<<20 {
				t.Errorf("allocated %d MiB refusing a compression bomb", alloc>>20)
			}
			if e.hits.Load() != 0 {
				t.Errorf("the bomb reached the engine")
			}
		})
	}
}

func compress(t *testing.T, enc string, b []byte) []byte {
	t.Helper()
	var out []byte
	var err error
	switch enc {
	case "identity":
		return b
	default:
		out, err = testEncode(enc, b)
	}
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// bombOf is a body of encoding enc that expands to size bytes of zeros (a multiple of
// 1 MiB): gzip members or zstd frames of at most 16 MiB, repeated (a body may hold several).
// Zeros compress about as well in 16 MiB as in more, and compressing 256 MiB at once took
// most of these tests' time under -race (gzip: 19-21 s of CPU, 16 MiB about 1 s).
func bombOf(t *testing.T, enc string, size int) []byte {
	t.Helper()
	const chunk = 16 << 20
	var buf bytes.Buffer
	zeros := make([]byte, 1<<20)
	n := min(size, chunk)
	switch enc {
	case "gzip":
		zw, _ := gzip.NewWriterLevel(&buf, gzip.BestCompression)
		for i := 0; i < n/len(zeros); i++ {
			_, _ = zw.Write(zeros)
		}
		_ = zw.Close()
	case "zstd":
		zw, _ := zstd.NewWriter(&buf, zstd.WithEncoderLevel(zstd.SpeedFastest))
		for i := 0; i < n/len(zeros); i++ {
			_, _ = zw.Write(zeros)
		}
		_ = zw.Close()
	}
	return bytes.Repeat(buf.Bytes(), size/n)
}
