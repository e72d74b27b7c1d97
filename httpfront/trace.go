package httpfront

import (
	"context"
	"strconv"
	"strings"
	"time"

	"github.com/valyala/fasthttp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"switchyard/engine"
	"switchyard/httpfront/tracing"
)

// Tracing (tracing.enabled): one server span per inference request, continuing the client's
// traceparent, with children where the work is:
//
//	POST /v1/chat/completions        (server; method, route, model, status, attempts)
//	├── admission                    (with concurrency or rate limits: the wait for a slot,
//	│                                 and the refusal's code)
//	├── prepare                      (tokenization: input tokens, expected peak, source)
//	│   └── prefix_lookup            (cache_aware's lookup: its status)
//	├── select                       (one per selection: a bucket_attempt event per bucket
//	│                                 with its outcome, policy and reason; the bucket and
//	│                                 engines chosen)
//	└── dispatch                     (client; one per attempt: engines, attempt number,
//	    │                             retry reason, status; its context is the traceparent
//	    │                             the engines get, both of a prefill/decode pair)
//	    └── stream                   (a relayed stream: first_token event with the TTFT;
//	                                  events, tokens and how it ended)
//
// Every hook is a method of reqTrace whose zero value (tracing off, or a request not traced)
// returns at once: the request path pays one comparison per hook and allocates nothing. A
// request whose trace is not sampled gets its server span only (the children would record
// nothing either): the engines get that span's context, not sampled.

// Span and attribute names.
const (
	spanAdmission    = "admission"
	spanPrepare      = "prepare"
	spanPrefixLookup = "prefix_lookup"
	spanSelect       = "select"
	spanDispatch     = "dispatch"
	spanStream       = "stream"

	eventBucketAttempt = "bucket_attempt"
	eventFirstToken    = "first_token"
	eventEngineRefused = "engine_refused"

	attrMethod      = attribute.Key("http.request.method")
	attrRoute       = attribute.Key("http.route")
	attrStatus      = attribute.Key("http.response.status_code")
	attrModel       = attribute.Key("gen_ai.request.model")
	attrStream      = attribute.Key("switchyard.stream")
	attrAttempts    = attribute.Key("switchyard.attempts")
	attrAttempt     = attribute.Key("switchyard.attempt")
	attrInput       = attribute.Key("switchyard.input_tokens")
	attrPeak        = attribute.Key("switchyard.expected_peak")
	attrTokenSource = attribute.Key("switchyard.token_source")
	attrLookup      = attribute.Key("switchyard.prefix.status")
	attrBucket      = attribute.Key("switchyard.bucket")
	attrStage       = attribute.Key("switchyard.stage")
	attrPolicy      = attribute.Key("switchyard.policy")
	attrOutcome     = attribute.Key("switchyard.outcome")
	attrReason      = attribute.Key("switchyard.reason")
	attrOrder       = attribute.Key("switchyard.bucket_order")
	attrEngine      = attribute.Key("switchyard.engine")
	attrEngineURL   = attribute.Key("switchyard.engine.url")
	attrPrefill     = attribute.Key("switchyard.prefill.engine")
	attrPrefillURL  = attribute.Key("switchyard.prefill.url")
	attrPrefillStat = attribute.Key("switchyard.prefill.status")
	attrRetryReason = attribute.Key("switchyard.retry.reason")
	attrBackoff     = attribute.Key("switchyard.retry.backoff_ms")
	attrErrorCode   = attribute.Key("switchyard.error.code")
	attrTTFT        = attribute.Key("switchyard.ttft_ms")
	attrEvents      = attribute.Key("switchyard.stream.events")
	attrTokens      = attribute.Key("switchyard.stream.tokens")
	attrEnd         = attribute.Key("switchyard.stream.end")
	attrBypass      = attribute.Key("switchyard.pd_bypass")
)

// routeSpanNames are the server spans' names by route.
var routeSpanNames = func() (n [numRoutes]string) {
	for k := range numRoutes {
		n[k] = "POST " + routePaths[k]
	}
	return n
}()

// reqTrace is one request's spans, in its exchange (moved to its relay for a stream). The
// zero value records nothing.
type reqTrace struct {
	// ctx holds the request's server span (root); dctx the current dispatch span.
	ctx, dctx context.Context
	root      trace.Span
	tracer    trace.Tracer
	prep      trace.Span
	sel       trace.Span
	disp      trace.Span
	// recording: the request's trace is sampled (its spans record attributes and events).
	recording bool
	// tp and ts are the traceparent and tracestate sent to the engines (tp is kept across
	// requests with the exchange: it never allocates again).
	tp, ts []byte
}

// on reports whether the request is traced.
func (t *reqTrace) on() bool { return t.root != nil }

// reset clears t for the exchange's next request, keeping its buffer.
func (t *reqTrace) reset() { *t = reqTrace{tp: t.tp[:0]} }

// traceRequest starts the request's server span, continuing the client's traceparent.
func (s *Server) traceRequest(ctx *fasthttp.RequestCtx, kind routeKind, t *reqTrace) {
	parent := tracing.Propagator.Extract(context.Background(), requestCarrier{&ctx.Request.Header})
	t.tracer = s.tracer
	t.ctx, t.root = s.tracer.Start(parent, routeSpanNames[kind], trace.WithSpanKind(trace.SpanKindServer))
	t.recording = t.root.IsRecording()
	if t.recording {
		t.root.SetAttributes(attrMethod.String(string(ctx.Method())), attrRoute.String(routePaths[kind]))
	}
}

// endRequest ends the server span with the request's status.
func (t *reqTrace) endRequest(status int) {
	if !t.on() {
		return
	}
	t.root.SetAttributes(attrStatus.Int(status))
	if status >= 500 {
		t.root.SetStatus(codes.Error, strconv.Itoa(status))
	}
	t.root.End()
}

// startAdmission opens the span of the request's admission through the concurrency limits
// and their queues; nil when the request is not traced (or not sampled).
func (t *reqTrace) startAdmission() trace.Span {
	if !t.recording {
		return nil
	}
	_, sp := t.tracer.Start(t.ctx, spanAdmission)
	return sp
}

// endAdmission ends sp: admitted, or refused with e.
func endAdmission(sp trace.Span, e *apiError) {
	if sp == nil {
		return
	}
	if e != nil {
		sp.SetAttributes(attrErrorCode.String(e.code))
		sp.SetStatus(codes.Error, e.message)
	}
	sp.End()
}

// startPrepare opens the preparation span of a request for model (tokenization and the
// prefix lookup).
func (t *reqTrace) startPrepare(model string, stream bool) {
	if !t.recording {
		return
	}
	t.root.SetAttributes(attrModel.String(model), attrStream.Bool(stream))
	_, t.prep = t.tracer.Start(t.ctx, spanPrepare)
}

// endPrepare ends the preparation span with what it found.
func (t *reqTrace) endPrepare(breq *engine.BucketRequest, source string) {
	if t.prep == nil {
		return
	}
	if t.recording {
		t.prep.SetAttributes(attrInput.Int64(breq.InputTokens), attrPeak.Int64(breq.ExpectedPeak), attrTokenSource.String(source))
	}
	t.prep.End()
	t.prep = nil
}

// tokenSource says how a request's input tokens were counted: the token IDs of its body,
// the model's tokenizer, or the body-size estimate.
func tokenSource(f *requestFacts, ids []uint32) string {
	switch {
	case f.tokenCount >= 0:
		return "input_ids"
	case ids != nil:
		return "tokenizer"
	}
	return "estimate"
}

// startPrefixLookup opens the prefix lookup's span (a child of the preparation span); nil
// when the request is not traced.
func (t *reqTrace) startPrefixLookup() trace.Span {
	if t.prep == nil {
		return nil
	}
	_, sp := t.tracer.Start(trace.ContextWithSpan(t.ctx, t.prep), spanPrefixLookup)
	return sp
}

// endPrefixLookup ends sp with the lookup's status.
func endPrefixLookup(sp trace.Span, m engine.PrefixMatcher) {
	if sp == nil {
		return
	}
	ok, unavailable, err := m.Status()
	status := "ok"
	switch {
	case err != nil:
		status = "rejected"
		sp.SetStatus(codes.Error, err.Error())
	case unavailable:
		status = "unavailable"
	case !ok:
		status = "miss"
	}
	sp.SetAttributes(attrLookup.String(status))
	sp.End()
}

// startSelect opens the span of the request's selection for its attempt n (1 the first).
func (t *reqTrace) startSelect(n int) {
	if !t.recording {
		return
	}
	_, t.sel = t.tracer.Start(t.ctx, spanSelect, trace.WithAttributes(attrAttempt.Int(n)))
}

// BucketAttempted implements engine.AttemptObserver: one event per bucket attempt on the
// selection span.
func (t *reqTrace) BucketAttempted(b *engine.Bucket, pick engine.BucketPick, err error) {
	if t.sel == nil {
		return
	}
	attrs := make([]attribute.KeyValue, 0, 5)
	attrs = append(attrs, attrBucket.String(b.ID), attrPolicy.String(bucketPolicy(b)))
	if err == nil {
		attrs = append(attrs, attrOutcome.String("selected"), attrReason.String(pickReason(&pick)))
	} else {
		attrs = append(attrs, attrOutcome.String(engine.OutcomeOf(err).String()), attrReason.String(err.Error()))
		if pe, ok := err.(*engine.PickError); ok {
			attrs = append(attrs, attrStage.String(pe.Stage.String()))
		}
	}
	t.sel.AddEvent(eventBucketAttempt, trace.WithAttributes(attrs...))
}

// bucketPolicy names the policy of b's groups: "plain's", or "prefill's/decode's".
func bucketPolicy(b *engine.Bucket) string {
	name := func(g *engine.EngineGroup) string {
		if g == nil || g.Policy() == nil {
			return "none"
		}
		return g.Policy().Name()
	}
	if !b.IsPD() {
		return name(b.Plain)
	}
	return name(b.Prefill) + "/" + name(b.Decode)
}

// pickReason is why the engines of p were picked: the plain pick's reason, or the prefill's
// and the decode's.
func pickReason(p *engine.BucketPick) string {
	if !p.IsPD() {
		return p.Plain.Reason
	}
	return p.Prefill.Reason + "/" + p.Decode.Reason
}

// endSelect ends the selection span with its result.
func (t *reqTrace) endSelect(pick *engine.BucketPick, err error) {
	if t.sel == nil {
		return
	}
	if err != nil {
		t.sel.SetStatus(codes.Error, err.Error())
		t.sel.SetAttributes(attrOutcome.String(engine.OutcomeOf(err).String()))
	} else {
		t.sel.SetAttributes(attrOutcome.String("selected"), attrBucket.String(pick.BucketID),
			attrOrder.String(string(orderValues[pick.Order])), attrReason.String(pickReason(pick)))
		if pick.IsPD() {
			t.sel.SetAttributes(attrPrefill.String(pick.Prefill.Worker.ID), attrEngine.String(pick.Decode.Worker.ID))
		} else {
			t.sel.SetAttributes(attrEngine.String(pick.Plain.Worker.ID), attrBypass.Bool(pick.Bypass))
		}
	}
	t.sel.End()
	t.sel = nil
}

// refused records on the latest selection's span that engine w refused the dispatch.
func (t *reqTrace) refused(w *engine.Worker) {
	if !t.recording {
		return
	}
	t.root.AddEvent(eventEngineRefused, trace.WithAttributes(attrEngine.String(w.ID)))
}

// startDispatch opens the span of dispatch attempt n of d (a retry, when retried names why,
// made after waiting backoff) and makes its context the traceparent (and the client's
// tracestate) d sends to its engines.
func (t *reqTrace) startDispatch(d *dispatch, n int, retried string, backoff time.Duration) {
	if !t.on() {
		return
	}
	sp := t.root
	if t.recording {
		t.dctx, t.disp = t.tracer.Start(t.ctx, spanDispatch, trace.WithSpanKind(trace.SpanKindClient))
		sp = t.disp
		t.root.SetAttributes(attrAttempts.Int(n))
		p := &d.pick
		attrs := []attribute.KeyValue{attrAttempt.Int(n), attrBucket.String(p.BucketID)}
		if p.IsPD() {
			attrs = append(attrs, attrEngine.String(p.Decode.Worker.ID), attrEngineURL.String(p.Decode.Worker.URL),
				attrPrefill.String(p.Prefill.Worker.ID), attrPrefillURL.String(p.Prefill.Worker.URL))
		} else {
			attrs = append(attrs, attrEngine.String(p.Plain.Worker.ID), attrEngineURL.String(p.Plain.Worker.URL))
		}
		if retried != "" {
			attrs = append(attrs, attrRetryReason.String(retried), attrBackoff.Float64(float64(backoff)/float64(time.Millisecond)))
		}
		t.disp.SetAttributes(attrs...)
	}
	sc := sp.SpanContext()
	t.tp = tracing.AppendTraceparent(t.tp[:0], sc)
	d.hdr[fwdTraceparent] = t.tp
	d.hdr[fwdTracestate] = nil
	if ts := sc.TraceState(); ts.Len() > 0 {
		t.ts = append(t.ts[:0], ts.String()...)
		d.hdr[fwdTracestate] = t.ts
	}
}

// prefillDone records how a prefill/decode dispatch's prefill ended.
func (t *reqTrace) prefillDone(status int, err error) {
	if t.disp == nil {
		return
	}
	if err != nil {
		t.disp.AddEvent("prefill_failed", trace.WithAttributes(attrReason.String(err.Error())))
		return
	}
	t.disp.SetAttributes(attrPrefillStat.Int(status))
}

// endDispatch ends the dispatch span of an attempt answered status, or failed and retried
// (failed set).
func (t *reqTrace) endDispatch(status int, failed *failedAnswer) {
	if t.disp == nil {
		return
	}
	switch {
	case failed != nil:
		msg := "retried"
		if failed.api != nil {
			msg = failed.api.message
		} else {
			status = failed.status
		}
		if status != 0 {
			t.disp.SetAttributes(attrStatus.Int(status))
		}
		t.disp.SetAttributes(attrOutcome.String("retried"))
		t.disp.SetStatus(codes.Error, msg)
	default:
		t.disp.SetAttributes(attrStatus.Int(status))
		if status >= 400 {
			t.disp.SetStatus(codes.Error, strconv.Itoa(status))
		}
	}
	t.disp.End()
	t.disp, t.dctx = nil, nil
}

// startStream opens a stream's span (a child of its dispatch span); nil when not traced.
func (t *reqTrace) startStream() trace.Span {
	if t.disp == nil {
		return nil
	}
	_, sp := t.tracer.Start(t.dctx, spanStream)
	return sp
}

// firstToken records a stream's first token, ttftMs after the request started.
func firstToken(sp trace.Span, ttftMs float64) {
	if sp == nil {
		return
	}
	sp.AddEvent(eventFirstToken, trace.WithAttributes(attrTTFT.Float64(ttftMs)))
}

// relayEndNames name a stream's ends (switchyard.stream.end).
var relayEndNames = [...]string{endEOF: "complete", endUpstream: "upstream_error", endTruncated: "truncated",
	endClientGone: "client_gone", endIdle: "idle_timeout", endTimeout: "timeout", endShutdown: "shutdown"}

// endStream ends a relayed stream's spans: the stream's with its events and tokens (data
// events without the [DONE] marker) and how it ended, then its dispatch and the request.
func (t *reqTrace) endStream(sp trace.Span, end relayEnd, status, events, done int) {
	if sp != nil {
		sp.SetAttributes(attrEvents.Int(events), attrTokens.Int(max(events-done, 0)), attrEnd.String(relayEndNames[end]))
		if end != endEOF {
			sp.SetStatus(codes.Error, relayEndNames[end])
		}
		sp.End()
	}
	t.endDispatch(status, nil)
	t.endRequest(status)
}

// abandonStream ends the span of a stream given up before its first bytes (the attempt
// failed).
func abandonStream(sp trace.Span, err error) {
	if sp == nil {
		return
	}
	msg := "abandoned"
	if err != nil {
		msg = err.Error()
	}
	sp.SetStatus(codes.Error, msg)
	sp.End()
}

// requestCarrier reads the trace-context headers of a request (propagation.TextMapCarrier).
type requestCarrier struct{ h *fasthttp.RequestHeader }

func (c requestCarrier) Get(key string) string { return string(c.h.Peek(key)) }

func (c requestCarrier) Set(string, string) {}

func (c requestCarrier) Keys() []string {
	var keys []string
	for k := range c.h.All() {
		keys = append(keys, strings.ToLower(string(k)))
	}
	return keys
}
