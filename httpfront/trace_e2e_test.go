package httpfront

import (
	"context"
	"strings"
	"testing"

	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"

	"switchyard/config"
	"switchyard/httpfront/tracing/tracingtest"
)

// The client's trace: the router's server span must continue it.
const (
	clientTraceID     = "4bf92f3577b34da6a3ce929d0e0e4736"
	clientSpanID      = "00f067aa0ba902b7"
	clientTraceparent = "00-" + clientTraceID + "-" + clientSpanID + "-01"
)

// traced turns tracing on in cfg towards rcv over protocol, every trace sampled.
func traced(cfg *config.Config, rcv *tracingtest.Receiver, protocol string) *config.Config {
	cfg.Tracing.Enabled = true
	cfg.Tracing.Endpoint = "http://" + rcv.Endpoint
	cfg.Tracing.Protocol = protocol
	return cfg
}

// spanTree indexes received spans.
type spanTree struct {
	t     *testing.T
	spans []tracingtest.Span
}

// one returns the only span named name whose parent is parent ("" for any parent).
func (st spanTree) one(name, parent string) tracingtest.Span {
	st.t.Helper()
	all := st.all(name, parent)
	if len(all) != 1 {
		st.t.Fatalf("%d spans %q under %q, want 1; received %v", len(all), name, parent, st.names())
	}
	return all[0]
}

// all returns the spans named name under parent ("" for any), in start order.
func (st spanTree) all(name, parent string) []tracingtest.Span {
	var out []tracingtest.Span
	for _, s := range st.spans {
		if s.Name == name && (parent == "" || s.ParentSpanID == parent) {
			out = append(out, s)
		}
	}
	for i := 1; i < len(out); i++ {
		for j := i; j > 0 && out[j].Start.Before(out[j-1].Start); j-- {
			out[j], out[j-1] = out[j-1], out[j]
		}
	}
	return out
}

func (st spanTree) names() []string {
	var n []string
	for _, s := range st.spans {
		n = append(n, s.Name+"("+s.SpanID+"<"+s.ParentSpanID+")")
	}
	return n
}

// stopAndCollect stops the server, which flushes its exporter, and returns what rcv got.
func stopAndCollect(t *testing.T, ts *testServer, rcv *tracingtest.Receiver) spanTree {
	t.Helper()
	ts.stop(t)
	return spanTree{t: t, spans: rcv.Spans()}
}

func wantAttr(t *testing.T, what string, attrs map[string]any, key string, want any) {
	t.Helper()
	if got := attrs[key]; got != want {
		t.Errorf("%s: %s = %v (%T), want %v (%T)", what, key, got, got, want, want)
	}
}

// traceparentOf returns the traceparent the engine received with its request i.
func traceparentOf(t *testing.T, e *fakeEngine, i int) string {
	t.Helper()
	_, hs := e.received()
	if len(hs) <= i {
		t.Fatalf("engine %s got %d requests, want more than %d", e.id, len(hs), i)
	}
	return hs[i].Get("Traceparent")
}

// TestTracedPlainRequest: a traced request's span tree at an OTLP/HTTP receiver. The server
// span continues the client's trace (its parent is the client's span), the selection
// records each bucket attempt (the first bucket has no healthy engine), the dispatch names
// the engine, and the engine gets the dispatch's span context as its traceparent.
func TestTracedPlainRequest(t *testing.T) {
	rcv := tracingtest.NewHTTP(t)
	z, a := newFakeEngine(t, "Z", "llama"), newFakeEngine(t, "A", "llama")
	cfg := baseConfig()
	cfg.Workers = []config.Worker{plainWorker("Z", z.url, "llama"), plainWorker("A", a.url, "llama")}
	cfg.Models = map[string]config.Model{"llama": {Buckets: []config.Bucket{
		plainBucket("short", ptr(int64(4096)), nil, "Z"), plainBucket("long", nil, nil, "A")}}}
	ts := startServer(t, traced(cfg, rcv, config.TracingHTTP), Options{SkipStartupChecks: true, NoTelemetry: true})
	z.health.Store(503)
	for range cfg.Health.FailureThreshold {
		ts.workers.CheckOnce(context.Background(), ts.workers.Member("Z"))
	}
	if ts.Workers().Worker("Z").Healthy() {
		t.Fatal("Z is still healthy")
	}

	r := post(t, ts.url+"/v1/chat/completions", chatBody("llama", "hi", ""), "Traceparent", clientTraceparent,
		"Tracestate", "vendor=abc")
	if r.status != 200 || r.header.Get(headerWorker) != "A" {
		t.Fatalf("status %d from %q: %s", r.status, r.header.Get(headerWorker), r.body)
	}
	st := stopAndCollect(t, ts, rcv)

	root := st.one("POST /v1/chat/completions", "")
	if root.TraceID != clientTraceID || root.ParentSpanID != clientSpanID || root.Kind != tracepb.Span_SPAN_KIND_SERVER {
		t.Errorf("server span trace %s parent %s kind %v, want the client's trace and span", root.TraceID, root.ParentSpanID, root.Kind)
	}
	wantAttr(t, "server span", root.Attrs, "http.response.status_code", int64(200))
	wantAttr(t, "server span", root.Attrs, "http.request.method", "POST")
	wantAttr(t, "server span", root.Attrs, "http.route", "/v1/chat/completions")
	wantAttr(t, "server span", root.Attrs, "gen_ai.request.model", "llama")
	wantAttr(t, "server span", root.Attrs, "switchyard.attempts", int64(1))
	wantAttr(t, "resource", root.Resource, "service.name", "switchyard")

	prep := st.one("prepare", root.SpanID)
	wantAttr(t, "prepare", prep.Attrs, "switchyard.token_source", "estimate")
	if n, _ := prep.Attrs["switchyard.input_tokens"].(int64); n <= 0 {
		t.Errorf("prepare: input tokens %v", prep.Attrs["switchyard.input_tokens"])
	}

	sel := st.one("select", root.SpanID)
	wantAttr(t, "select", sel.Attrs, "switchyard.bucket", "long")
	wantAttr(t, "select", sel.Attrs, "switchyard.engine", "A")
	wantAttr(t, "select", sel.Attrs, "switchyard.outcome", "selected")
	if len(sel.Events) != 2 {
		t.Fatalf("select events %+v, want two bucket attempts", sel.Events)
	}
	first, second := sel.Events[0], sel.Events[1]
	wantAttr(t, "first attempt", first.Attrs, "switchyard.bucket", "short")
	wantAttr(t, "first attempt", first.Attrs, "switchyard.outcome", "no_candidates")
	wantAttr(t, "first attempt", first.Attrs, "switchyard.policy", "round_robin")
	wantAttr(t, "first attempt", first.Attrs, "switchyard.stage", "plain")
	if reason, _ := first.Attrs["switchyard.reason"].(string); !strings.Contains(reason, "no_candidates") {
		t.Errorf("first attempt's reason %q", reason)
	}
	wantAttr(t, "second attempt", second.Attrs, "switchyard.bucket", "long")
	wantAttr(t, "second attempt", second.Attrs, "switchyard.outcome", "selected")
	wantAttr(t, "second attempt", second.Attrs, "switchyard.policy", "round_robin")

	disp := st.one("dispatch", root.SpanID)
	if disp.Kind != tracepb.Span_SPAN_KIND_CLIENT {
		t.Errorf("dispatch kind %v", disp.Kind)
	}
	wantAttr(t, "dispatch", disp.Attrs, "switchyard.engine", "A")
	wantAttr(t, "dispatch", disp.Attrs, "switchyard.engine.url", a.url)
	wantAttr(t, "dispatch", disp.Attrs, "switchyard.attempt", int64(1))
	wantAttr(t, "dispatch", disp.Attrs, "http.response.status_code", int64(200))
	if disp.StatusCode == tracepb.Status_STATUS_CODE_ERROR {
		t.Errorf("dispatch status %v %q", disp.StatusCode, disp.StatusMessage)
	}
	if got, want := traceparentOf(t, a, 0), "00-"+clientTraceID+"-"+disp.SpanID+"-01"; got != want {
		t.Errorf("engine got traceparent %q, want %q (the dispatch span)", got, want)
	}
	if _, hs := a.received(); hs[0].Get("Tracestate") != "vendor=abc" {
		t.Errorf("engine got tracestate %q", hs[0].Get("Tracestate"))
	}
	if n := len(st.spans); n != 4 {
		t.Errorf("%d spans, want 4: %v", n, st.names())
	}
}

// TestTracedStream: a stream's span is the dispatch's child, with its first token as an
// event and its events and tokens counted when it ends; a request without a traceparent
// starts a trace of its own.
func TestTracedStream(t *testing.T) {
	rcv := tracingtest.NewHTTP(t)
	a := newFakeEngine(t, "A", "llama")
	cfg := baseConfig()
	cfg.Workers = []config.Worker{plainWorker("A", a.url, "llama")}
	cfg.Models = map[string]config.Model{"llama": {Buckets: []config.Bucket{plainBucket("b", nil, nil, "A")}}}
	ts := startServer(t, traced(cfg, rcv, config.TracingHTTP), Options{SkipStartupChecks: true, NoTelemetry: true})
	r := post(t, ts.url+"/v1/chat/completions", chatBody("llama", "hi", `"stream":true`))
	if r.status != 200 || !strings.HasSuffix(string(r.body), "data: [DONE]\n\n") {
		t.Fatalf("status %d: %q", r.status, r.body)
	}
	ts.waitBackground(t) // the relay ended its spans
	st := stopAndCollect(t, ts, rcv)

	root := st.one("POST /v1/chat/completions", "")
	if root.ParentSpanID != "" {
		t.Errorf("server span has parent %s without a traceparent", root.ParentSpanID)
	}
	wantAttr(t, "server span", root.Attrs, "switchyard.stream", true)
	wantAttr(t, "server span", root.Attrs, "http.response.status_code", int64(200))
	disp := st.one("dispatch", root.SpanID)
	stream := st.one("stream", disp.SpanID)
	if stream.TraceID != root.TraceID {
		t.Errorf("stream in trace %s, request in %s", stream.TraceID, root.TraceID)
	}
	// The engine sends tok0, three chunks and [DONE]: five data events, four tokens.
	wantAttr(t, "stream", stream.Attrs, "switchyard.stream.events", int64(5))
	wantAttr(t, "stream", stream.Attrs, "switchyard.stream.tokens", int64(4))
	wantAttr(t, "stream", stream.Attrs, "switchyard.stream.end", "complete")
	if len(stream.Events) != 1 || stream.Events[0].Name != "first_token" {
		t.Fatalf("stream events %+v, want first_token", stream.Events)
	}
	if ttft, ok := stream.Events[0].Attrs["switchyard.ttft_ms"].(float64); !ok || ttft < 0 {
		t.Errorf("first_token ttft %v", stream.Events[0].Attrs["switchyard.ttft_ms"])
	}
	if stream.End.After(root.End) || disp.End.After(root.End) {
		t.Errorf("the request span ended before its stream")
	}
	if got := traceparentOf(t, a, 0); got != "00-"+root.TraceID+"-"+disp.SpanID+"-01" {
		t.Errorf("engine got traceparent %q", got)
	}
}

// TestTracedPDRequest: over OTLP/gRPC, a prefill/decode request's dispatch names both
// engines, and both get the dispatch's span context as their traceparent.
func TestTracedPDRequest(t *testing.T) {
	rcv := tracingtest.NewGRPC(t)
	p := newFakeEngine(t, "P", "llama", withMode("prefill"))
	p.bootstrapPort = 8998
	d := newFakeEngine(t, "D", "llama", withMode("decode"))
	d.expectHost, d.expectPort = "127.0.0.1", 8998
	ts := startServer(t, traced(pdConfig(p, d, ptr(8998)), rcv, config.TracingGRPC), Options{NoTelemetry: true})
	for _, stream := range []string{"", `"stream":true`} {
		r := post(t, ts.url+"/v1/chat/completions", chatBody("llama", "hi", stream), "Traceparent", clientTraceparent)
		if r.status != 200 || !contains(r.body, "D") {
			t.Fatalf("stream=%q: status %d: %s", stream, r.status, r.body)
		}
	}
	ts.waitBackground(t)
	st := stopAndCollect(t, ts, rcv)

	roots := st.all("POST /v1/chat/completions", clientSpanID)
	if len(roots) != 2 {
		t.Fatalf("%d server spans under the client's span, want 2: %v", len(roots), st.names())
	}
	for i, root := range roots {
		disp := st.one("dispatch", root.SpanID)
		wantAttr(t, "pd dispatch", disp.Attrs, "switchyard.engine", "D")
		wantAttr(t, "pd dispatch", disp.Attrs, "switchyard.prefill.engine", "P")
		wantAttr(t, "pd dispatch", disp.Attrs, "switchyard.prefill.status", int64(200))
		wantAttr(t, "pd dispatch", disp.Attrs, "http.response.status_code", int64(200))
		want := "00-" + clientTraceID + "-" + disp.SpanID + "-01"
		if got := traceparentOf(t, p, i); got != want {
			t.Errorf("request %d: prefill engine got traceparent %q, want %q", i, got, want)
		}
		if got := traceparentOf(t, d, i); got != want {
			t.Errorf("request %d: decode engine got traceparent %q, want %q", i, got, want)
		}
		sel := st.one("select", root.SpanID)
		wantAttr(t, "pd select", sel.Attrs, "switchyard.prefill.engine", "P")
		wantAttr(t, "pd select", sel.Events[0].Attrs, "switchyard.policy", "round_robin/round_robin")
	}
	st.one("stream", st.one("dispatch", roots[1].SpanID).SpanID)
}

// TestTracedRetry: a request retried after an engine's 503 has a selection and a dispatch
// span per attempt; the failed one says so, the retry says why it was made, and each
// engine got its own attempt's span as the parent.
func TestTracedRetry(t *testing.T) {
	rcv := tracingtest.NewHTTP(t)
	a, b := newFakeEngine(t, "A", "llama"), newFakeEngine(t, "B", "llama")
	a.fail.Store(503)
	cfg := retryConfig(a, b)
	cfg.Health.BreakerEnabled = false
	ts := startServer(t, traced(cfg, rcv, config.TracingHTTP), Options{NoTelemetry: true, SkipStartupChecks: true})
	r := post(t, ts.url+"/v1/chat/completions", chatBody("llama", "hi", ""), "Traceparent", clientTraceparent)
	if r.status != 200 || r.header.Get(headerWorker) != "B" || attemptsOf(t, r) != 2 {
		t.Fatalf("status %d from %q: %s", r.status, r.header.Get(headerWorker), r.body)
	}
	st := stopAndCollect(t, ts, rcv)

	root := st.one("POST /v1/chat/completions", clientSpanID)
	wantAttr(t, "server span", root.Attrs, "switchyard.attempts", int64(2))
	wantAttr(t, "server span", root.Attrs, "http.response.status_code", int64(200))
	if n := len(st.all("select", root.SpanID)); n != 2 {
		t.Errorf("%d selections, want 2", n)
	}
	disps := st.all("dispatch", root.SpanID)
	if len(disps) != 2 {
		t.Fatalf("%d dispatch spans, want 2: %v", len(disps), st.names())
	}
	failed, retried := disps[0], disps[1]
	wantAttr(t, "failed attempt", failed.Attrs, "switchyard.engine", "A")
	wantAttr(t, "failed attempt", failed.Attrs, "switchyard.attempt", int64(1))
	wantAttr(t, "failed attempt", failed.Attrs, "http.response.status_code", int64(503))
	wantAttr(t, "failed attempt", failed.Attrs, "switchyard.outcome", "retried")
	if failed.StatusCode != tracepb.Status_STATUS_CODE_ERROR {
		t.Errorf("failed attempt's status %v", failed.StatusCode)
	}
	wantAttr(t, "retry", retried.Attrs, "switchyard.engine", "B")
	wantAttr(t, "retry", retried.Attrs, "switchyard.attempt", int64(2))
	wantAttr(t, "retry", retried.Attrs, "switchyard.retry.reason", "status_503")
	wantAttr(t, "retry", retried.Attrs, "http.response.status_code", int64(200))
	if ms, ok := retried.Attrs["switchyard.retry.backoff_ms"].(float64); !ok || ms <= 0 || ms > 2 {
		t.Errorf("retry backoff %v ms, want in (0, 2] (retry.max_backoff)", retried.Attrs["switchyard.retry.backoff_ms"])
	}
	if _, ok := failed.Attrs["switchyard.retry.backoff_ms"]; ok {
		t.Error("the first attempt has a backoff")
	}
	if got := traceparentOf(t, a, 0); got != "00-"+clientTraceID+"-"+failed.SpanID+"-01" {
		t.Errorf("A got traceparent %q, want the first attempt's", got)
	}
	if got := traceparentOf(t, b, 0); got != "00-"+clientTraceID+"-"+retried.SpanID+"-01" {
		t.Errorf("B got traceparent %q, want the retry's", got)
	}
}

// TestTracingSampling: at sampling ratio 0 a new trace is not recorded, yet the engine still
// gets a traceparent (not sampled) of the router's trace; a client's sampled traceparent is
// followed.
func TestTracingSampling(t *testing.T) {
	rcv := tracingtest.NewHTTP(t)
	a := newFakeEngine(t, "A", "llama")
	cfg := baseConfig()
	cfg.Workers = []config.Worker{plainWorker("A", a.url, "llama")}
	cfg.Models = map[string]config.Model{"llama": {Buckets: []config.Bucket{plainBucket("b", nil, nil, "A")}}}
	traced(cfg, rcv, config.TracingHTTP).Tracing.SamplingRatio = 0
	ts := startServer(t, cfg, Options{SkipStartupChecks: true, NoTelemetry: true})
	if r := post(t, ts.url+"/v1/chat/completions", chatBody("llama", "hi", "")); r.status != 200 {
		t.Fatalf("status %d", r.status)
	}
	if r := post(t, ts.url+"/v1/chat/completions", chatBody("llama", "hi", ""), "Traceparent", clientTraceparent); r.status != 200 {
		t.Fatalf("status %d", r.status)
	}
	st := stopAndCollect(t, ts, rcv)
	for _, s := range st.spans {
		if s.TraceID != clientTraceID {
			t.Errorf("span %s of an unsampled trace %s exported", s.Name, s.TraceID)
		}
	}
	st.one("POST /v1/chat/completions", clientSpanID)
	tp := traceparentOf(t, a, 0)
	if len(tp) != 55 || !strings.HasPrefix(tp, "00-") || !strings.HasSuffix(tp, "-00") || strings.Contains(tp, clientTraceID) {
		t.Errorf("unsampled request: engine got traceparent %q, want one of the router's trace, not sampled", tp)
	}
}

// TestTracedAdmission: with a concurrency limit, a request's admission has its span; one
// refused because the limit's queue is full says why.
func TestTracedAdmission(t *testing.T) {
	rcv := tracingtest.NewHTTP(t)
	a := newFakeEngine(t, "A", "llama")
	a.hold, a.entered = make(chan struct{}), make(chan struct{}, 1)
	cfg := baseConfig()
	cfg.Workers = []config.Worker{plainWorker("A", a.url, "llama")}
	cfg.Models = map[string]config.Model{"llama": {Buckets: []config.Bucket{plainBucket("b", nil, nil, "A")}}}
	cfg.Server.MaxConcurrentRequests, cfg.Server.QueueSize = 1, 0
	ts := startServer(t, traced(cfg, rcv, config.TracingHTTP), Options{SkipStartupChecks: true, NoTelemetry: true})
	held := make(chan response, 1)
	go func() { held <- post(t, ts.url+"/v1/chat/completions", chatBody("llama", "first", "")) }()
	waitFor(t, a.entered, "the first request to reach the engine")
	r := post(t, ts.url+"/v1/chat/completions", chatBody("llama", "second", ""), "Traceparent", clientTraceparent)
	if r.status != 429 || r.errorCode() != CodeQueueFull {
		t.Fatalf("second request: %d %s", r.status, r.body)
	}
	close(a.hold)
	if r := <-held; r.status != 200 {
		t.Fatalf("first request: %d %s", r.status, r.body)
	}
	st := stopAndCollect(t, ts, rcv)
	refused := st.one("POST /v1/chat/completions", clientSpanID)
	wantAttr(t, "refused request", refused.Attrs, "http.response.status_code", int64(429))
	adm := st.one("admission", refused.SpanID)
	wantAttr(t, "refused admission", adm.Attrs, "switchyard.error.code", CodeQueueFull)
	if adm.StatusCode != tracepb.Status_STATUS_CODE_ERROR {
		t.Errorf("refused admission's status %v", adm.StatusCode)
	}
	if n := len(st.all("dispatch", refused.SpanID)); n != 0 {
		t.Errorf("the refused request has %d dispatch spans", n)
	}
	for _, root := range st.all("POST /v1/chat/completions", "") {
		if root.SpanID == refused.SpanID {
			continue
		}
		if adm := st.one("admission", root.SpanID); adm.StatusCode == tracepb.Status_STATUS_CODE_ERROR {
			t.Errorf("the admitted request's admission failed: %q", adm.StatusMessage)
		}
	}
}
