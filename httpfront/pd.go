package httpfront

import (
	"bytes"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/valyala/fasthttp"

	"switchyard/engine"
	"switchyard/httpfront/fleet"
	"switchyard/httpfront/jsontext"
	"switchyard/httpfront/retry"
	"switchyard/load"
)

// prefillResult is how a prefill request ended.
type prefillResult struct {
	status int
	// body is kept when the client needs it: a 4xx answer, or the input logprobs.
	body []byte
	err  error
	// api, when set, is the client's error for a failure of the router's own.
	api *apiError
	// cancelled: the dispatch was cancelled (its client left).
	cancelled bool
}

// injectBootstrap appends body with the PD bootstrap fields added (INTEROP "Prefill/decode
// dispatch"): bootstrap_host, bootstrap_port (null when unknown) and a random bootstrap_room;
// for a batch of n items, each field is a list of n values with one room per item. body must
// be a validated JSON object. Duplicate keys sent by the client are overridden: JSON readers
// keep the last occurrence.
func injectBootstrap(dst, body []byte, host string, port int, batch int) []byte {
	dst = openObject(dst, body)
	appendHost := func(dst []byte) []byte { return jsontext.AppendString(dst, host) }
	appendPort := func(dst []byte) []byte {
		if port <= 0 {
			return append(dst, "null"...)
		}
		return strconv.AppendInt(dst, int64(port), 10)
	}
	appendRoom := func(dst []byte) []byte { return strconv.AppendUint(dst, rand.Uint64()>>1, 10) }
	field := func(dst []byte, name string, val func([]byte) []byte) []byte {
		dst = append(dst, '"')
		dst = append(dst, name...)
		dst = append(dst, `":`...)
		if batch == 0 {
			return val(dst)
		}
		dst = append(dst, '[')
		for i := range batch {
			if i > 0 {
				dst = append(dst, ',')
			}
			dst = val(dst)
		}
		return append(dst, ']')
	}
	dst = field(dst, "bootstrap_host", appendHost)
	dst = append(dst, ',')
	dst = field(dst, "bootstrap_port", appendPort)
	dst = append(dst, ',')
	dst = field(dst, "bootstrap_room", appendRoom)
	return append(dst, '}')
}

// intField is one integer member injected into a forwarded body.
type intField struct {
	name string
	v    int
}

// injectInts appends body with the fields added (a later duplicate key wins for JSON
// readers, so a client's own value is overridden).
func injectInts(dst, body []byte, fields ...intField) []byte {
	dst = openObject(dst, body)
	for i, f := range fields {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = append(dst, '"')
		dst = append(dst, f.name...)
		dst = append(dst, `":`...)
		dst = strconv.AppendInt(dst, int64(f.v), 10)
	}
	return append(dst, '}')
}

// Data-parallel rank fields (SGLang): the rank a request runs on, and for a decode request
// the rank of the prefill engine that holds its KV cache.
const (
	fieldDPRank        = "data_parallel_rank"
	fieldPrefillDPRank = "prefill_dp_rank"
)

// pd dispatches to the prefill and decode engines concurrently: the same JSON, with the
// bootstrap fields, goes to both; the client gets the decode engine's answer, streamed when
// asked, once the prefill engine has answered (so that no byte reaches the client before
// the pair's outcome is known). The prefill request runs on its own goroutine. Until the
// answer (a stream's first bytes) arrives, the client is watched: a client that leaves
// stops both engines (only the decode with abort.prefill_to_completion, which lets the
// prefill run to completion). A prefill 4xx is returned as is; a prefill 5xx or
// transport failure is prefill_failed. A failure of either engine that the attempt loop
// retries answers nothing: the pair is picked again, without the engine that failed.
func (d *dispatch) pd(ex *exchange, o outcome) (outcome, *failedAnswer) {
	s := d.s
	pw, dw := d.pick.Prefill.Worker, d.pick.Decode.Worker
	pm, dm := d.adm.prefill, d.adm.decode
	tDecode := d.adm.tDecode
	ex.pd = injectBootstrap(ex.pd[:0], d.body, pm.BootstrapHost(), pw.BootstrapPort, d.facts.batch)
	if s.prepareRID(d) {
		ex.pd = append(appendRID(append(ex.pd[:len(ex.pd)-1], ','), &d.rid), '}')
	}
	pbody, dbody := ex.pd, ex.pd
	if pp, dp := d.pick.Prefill, d.pick.Decode; (pp.HasRank || dp.HasRank) && d.facts.batch == 0 {
		// Slow path: the router chose data-parallel ranks, so the two engines get different
		// bodies: each its own rank, and the decode engine the prefill engine's rank.
		var dfields [2]intField
		df := dfields[:0]
		if dp.HasRank {
			df = append(df, intField{fieldDPRank, dp.Rank})
		}
		if pp.HasRank {
			ex.rank = injectInts(ex.rank[:0], ex.pd, intField{fieldDPRank, pp.Rank})
			pbody = ex.rank
			df = append(df, intField{fieldPrefillDPRank, pp.Rank})
		}
		ex.rank2 = injectInts(ex.rank2[:0], ex.pd, df...)
		dbody = ex.rank2
	}
	// The selection's time stamps the guards, with no clock read, as a plain dispatch's: the
	// request's start on the first attempt, a retry's own time on a retry.
	var gp, gd *load.Guard
	if d.waited[0] != nil {
		// Slow path: the pair waited for its adapter's load, in flight since its pick.
		now := s.now()
		gp, gd = d.waited[0].Dispatch(now, d.slo.uncached), d.waited[1].Dispatch(now, -1)
	} else {
		at := ex.breq.Now
		gp = s.tracker.AcquirePrefill(pw.Counters, at, d.slo.uncached) // pending until the prefill answers
		gd = s.tracker.Acquire(dw.Counters, at)
	}
	deadline := d.deadline()

	preq := fasthttp.AcquireRequest()
	d.buildUpstream(preq, pm.Upstream().HostPort(), pbody)
	dreq := fasthttp.AcquireRequest()
	d.buildUpstream(dreq, dm.Upstream().HostPort(), dbody)
	var pc, dc fleet.Cancel
	if s.cfg.Abort.Enabled {
		pc = pm.Upstream().Cancellable(preq)
		dc = dm.Upstream().Cancellable(dreq)
	}
	stops := [2]engineStop{{m: dm, cancel: dc}, {m: pm, cancel: pc}}
	n := len(stops)
	if s.cfg.Abort.PrefillToCompletion {
		n = 1 // only the decode is stopped
	}
	watch := s.watchClient(d.ctx, ex.gone.set(d, stops[:n]...))
	done := make(chan prefillResult, 1)
	keepBody := d.facts.returnLogprob
	s.bg.Add(1)
	go s.runPrefill(pm, pw, d.adm.tPrefill, preq, gp, deadline, keepBody, pc, done)

	dresp := fasthttp.AcquireResponse()
	dresp.StreamBody = d.facts.stream
	derr := dm.Upstream().Do(dreq, dresp, deadline)
	fasthttp.ReleaseRequest(dreq)

	pr := <-done
	ex.tr.prefillDone(pr.status, pr.err)
	release := func() {
		if dresp.StreamBody {
			_ = dresp.CloseBodyStream()
		}
		fasthttp.ReleaseResponse(dresp)
		gd.Release()
	}
	var pLogprobs [][]byte
	if keepBody && pr.err == nil {
		pLogprobs = inputLogprobs(pr.body)
	}
	var (
		r    *relay
		perr error
	)
	if derr == nil && pr.err == nil && pr.status < 400 && d.facts.stream && dresp.StatusCode() == fasthttp.StatusOK && isEventStream(dresp) {
		// The decode stream's first bytes, still watched.
		var transform func(dst, ev []byte) []byte
		if len(pLogprobs) > 0 {
			transform = func(dst, ev []byte) []byte { return mergeEventLogprobs(dst, ev, pLogprobs) }
		}
		r = s.newRelay(nil, d, o.mm, dresp, dw, tDecode, gd, transform)
		r.trace(&ex.tr)
		perr = r.prime()
	}
	dc.End()
	if watch.stop() {
		// Slow path: the client left before the answer (the watch stopped the engines).
		if r != nil {
			r.abandon()
		}
		release()
		tDecode.Done(fleet.OutcomeNeutral)
		s.metrics.disconnects.Inc()
		return s.fail(d.ctx, o, errClientLeft), nil
	}
	if pr.err != nil && !pr.cancelled {
		// A router timeout: both engines may still be working.
		s.abortTimedOut(pr.err, d.rid.String(), engineStop{m: dm}, engineStop{m: pm})
	} else if derr != nil {
		s.abortTimedOut(derr, d.rid.String(), engineStop{m: dm}, engineStop{m: pm})
	}
	switch {
	case pr.err != nil || pr.status >= 500:
		// The decode engine waited for a prefill that failed: nothing to charge it with,
		// and it is not left out of the pair's next pick.
		release()
		tDecode.Done(fleet.OutcomeNeutral)
		e := pr.api
		if e == nil {
			msg := "prefill engine " + pw.ID + " failed"
			if pr.err != nil {
				msg += ": " + pr.err.Error()
			} else {
				msg += " with status " + strconv.Itoa(pr.status)
			}
			e = newAPIError(CodePrefillFailed, msg)
		}
		retried := false
		if pr.err != nil {
			retried = d.retryFailed(pr.err, sidePrefill)
		} else {
			retried = d.att.retry(retry.Failure{Kind: retry.KindStatus, Status: pr.status}, &d.pick, sidePrefill)
		}
		if retried {
			return o, &failedAnswer{api: e, pick: d.pick}
		}
		return s.fail(d.ctx, o, e), nil
	case pr.status >= 400:
		release()
		tDecode.Done(fleet.OutcomeNeutral)
		if d.att.retry(retry.Failure{Kind: retry.KindStatus, Status: pr.status}, &d.pick, sidePrefill) {
			// Slow path: a configured 408 or 429 of the prefill engine.
			return o, &failedAnswer{status: pr.status, ctype: "application/json", body: pr.body, pick: d.pick}
		}
		d.ctx.SetStatusCode(pr.status)
		d.ctx.SetContentType("application/json")
		d.routerHeaders()
		d.ctx.SetBody(pr.body)
		o.status = pr.status
		return o, nil
	}
	if derr != nil {
		release()
		e, verdict := s.upstreamFailure(dw, derr)
		tDecode.Done(verdict)
		if d.retryFailed(derr, sideDecode) {
			return o, &failedAnswer{api: e, pick: d.pick}
		}
		return s.fail(d.ctx, o, e), nil
	}
	status := dresp.StatusCode()
	verdict := s.statusOutcome(dw, status)
	if status >= 400 && d.att.retry(retry.Failure{Kind: retry.KindStatus, Status: status}, &d.pick, sideDecode) {
		// Slow path: the decode engine's error answer; the pair is retried.
		f := engineAnswer(dresp, &d.pick)
		release()
		tDecode.Done(verdict)
		return o, f
	}
	if r != nil {
		if perr != nil {
			// Slow path: the decode engine failed before its stream's first byte.
			s.abortTimedOut(perr, d.rid.String(), engineStop{m: dm})
			return d.streamFailed(o, r, perr, dw, tDecode, release, sideDecode)
		}
		r.stop = dm
		d.ctx.SetStatusCode(status)
		copyResponseHeaders(&d.ctx.Response.Header, dresp)
		d.routerHeaders()
		d.ctx.Response.Header.Set("Cache-Control", "no-cache")
		d.ctx.Response.Header.Set("X-Accel-Buffering", "no")
		r.respond(d.ctx)
		o.async = true
		o.status = status
		return o, nil
	}
	d.ctx.SetStatusCode(status)
	copyResponseHeaders(&d.ctx.Response.Header, dresp)
	d.routerHeaders()
	var body []byte
	if dresp.StreamBody && dresp.BodyStream() != nil {
		body = readAllLimited(dresp.BodyStream(), maxErrorBody)
	} else {
		body = dresp.Body()
	}
	if len(pLogprobs) > 0 && status == fasthttp.StatusOK {
		buf := getBuf()
		*buf = mergeLogprobs((*buf)[:0], body, pLogprobs)
		d.ctx.SetBody(*buf)
		putBuf(buf)
	} else {
		d.ctx.SetBody(body)
	}
	release()
	tDecode.Done(verdict)
	o.status = status
	return o, nil
}

// runPrefill sends the prefill request and reports how it ended. It owns req, guard and
// ticket and runs to completion (bounded by the request deadline) unless cancel stops it (a
// cancelled prefill is charged to nobody); ended ends the cancellable dispatch.
func (s *Server) runPrefill(m *fleet.Member, w *engine.Worker, ticket fleet.Ticket, req *fasthttp.Request, guard *load.Guard,
	deadline time.Time, keepBody bool, cancel fleet.Cancel, done chan<- prefillResult) {
	defer s.bg.Done()
	var res prefillResult
	verdict := fleet.OutcomeNeutral
	defer func() {
		if r := recover(); r != nil {
			s.logger.Error("prefill dispatch panicked", slog.String("worker", w.ID), slog.Any("panic", r))
			res = prefillResult{err: errPanicked}
			verdict = fleet.OutcomeNeutral
		}
		guard.Release()
		ticket.Done(verdict)
		done <- res
	}()
	resp := fasthttp.AcquireResponse()
	err := m.Upstream().Do(req, resp, deadline)
	cancel.End()
	fasthttp.ReleaseRequest(req)
	if err != nil && cancel.Cancelled() {
		fasthttp.ReleaseResponse(resp)
		res = prefillResult{err: err, api: errClientLeft, cancelled: true}
		return
	}
	if err != nil {
		var e *apiError
		e, verdict = s.upstreamFailure(w, err)
		fasthttp.ReleaseResponse(resp)
		res = prefillResult{err: err}
		if verdict == fleet.OutcomeNeutral {
			res.api = e // the router's own failure keeps its own code
		}
		return
	}
	// The prefill engine answers once it has prefilled the prompt: its first token.
	guard.FirstToken(s.now())
	res.status = resp.StatusCode()
	verdict = s.statusOutcome(w, res.status)
	if keepBody || (res.status >= 400 && res.status < 500) {
		res.body = append([]byte(nil), resp.Body()...)
	}
	fasthttp.ReleaseResponse(resp)
}

type panicError string

func (e panicError) Error() string { return string(e) }

const errPanicked = panicError("prefill dispatch panicked")

// inputLogprobs extracts meta_info.input_token_logprobs from a prefill answer: one raw array
// per item (an object answer has one item, a batch answer one per element). An SSE answer
// is read from its first data event.
func inputLogprobs(body []byte) [][]byte {
	doc := bytes.TrimSpace(body)
	if bytes.HasPrefix(doc, []byte("data:")) {
		doc = doc[len("data:"):]
		if i := bytes.Index(doc, eventSep); i >= 0 {
			doc = doc[:i]
		}
		doc = bytes.TrimSpace(doc)
	}
	v, end, err := scanValue(doc, 0, 0)
	if err != nil || skipWS(doc, end) != len(doc) {
		return nil
	}
	var out [][]byte
	switch v.kind {
	case kindObject:
		if a, ok := logprobSpan(v); ok {
			out = append(out, a.raw)
		}
	case kindArray:
		_ = v.elems(func(_ int, e jsonValue) error {
			a, _ := logprobSpan(e)
			out = append(out, a.raw)
			return nil
		})
	}
	return out
}

// logprobSpan returns the meta_info.input_token_logprobs array of an answer object.
func logprobSpan(obj jsonValue) (jsonValue, bool) {
	var found jsonValue
	if obj.kind != kindObject {
		return found, false
	}
	_ = obj.members(func(k []byte, v jsonValue) error {
		if keyIs(k, "meta_info") && v.kind == kindObject {
			_ = v.members(func(k2 []byte, v2 jsonValue) error {
				if keyIs(k2, "input_token_logprobs") && v2.kind == kindArray {
					found = v2
				}
				return nil
			})
		}
		return nil
	})
	return found, found.kind == kindArray
}

// offsetIn returns the offset of sub within doc; sub must be a subslice of doc.
func offsetIn(doc, sub []byte) int { return cap(doc) - cap(sub) }

// mergeLogprobs appends body (a decode answer: an object, or a batch list of objects) with
// each item's meta_info.input_token_logprobs prefixed by the prefill's list for that item.
// A body it cannot read is appended unchanged.
func mergeLogprobs(dst, body []byte, p [][]byte) []byte {
	v, end, err := scanValue(body, 0, 0)
	if err != nil || skipWS(body, end) != len(body) {
		return append(dst, body...)
	}
	pos := 0
	splice := func(i int, obj jsonValue) {
		a, ok := logprobSpan(obj)
		if !ok || i >= len(p) || p[i] == nil {
			return
		}
		off := offsetIn(body, a.raw)
		dst = append(dst, body[pos:off]...)
		dst = spliceArrays(dst, p[i], a.raw)
		pos = off + len(a.raw)
	}
	switch v.kind {
	case kindObject:
		idx := 0
		_ = v.members(func(k []byte, iv jsonValue) error {
			if keyIs(k, "index") {
				if n, ok := iv.asInt(); ok && n >= 0 && n < int64(len(p)) {
					idx = int(n)
				}
			}
			return nil
		})
		splice(idx, v)
	case kindArray:
		_ = v.elems(func(i int, e jsonValue) error {
			splice(i, e)
			return nil
		})
	}
	return append(dst, body[pos:]...)
}

// spliceArrays appends the JSON array holding p's elements followed by d's.
func spliceArrays(dst, p, d []byte) []byte {
	pi := bytes.TrimSpace(p[1 : len(p)-1])
	di := bytes.TrimSpace(d[1 : len(d)-1])
	dst = append(dst, '[')
	dst = append(dst, pi...)
	if len(pi) > 0 && len(di) > 0 {
		dst = append(dst, ',')
	}
	dst = append(dst, di...)
	return append(dst, ']')
}

// mergeEventLogprobs applies mergeLogprobs to one SSE event "data: {...}\n\n".
func mergeEventLogprobs(dst, ev []byte, p [][]byte) []byte {
	if !bytes.HasPrefix(ev, []byte("data:")) {
		return append(dst, ev...)
	}
	payload := bytes.TrimSpace(ev[len("data:"):])
	if len(payload) == 0 || payload[0] != '{' {
		return append(dst, ev...)
	}
	dst = append(dst, "data: "...)
	dst = mergeLogprobs(dst, payload, p)
	return append(dst, eventSep...)
}
