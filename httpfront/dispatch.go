package httpfront

import (
	"errors"
	"io"
	"math/bits"
	"time"

	"github.com/valyala/fasthttp"

	"switchyard/engine"
	"switchyard/httpfront/fleet"
	"switchyard/httpfront/flow"
	"switchyard/httpfront/retry"
	"switchyard/kv"
	"switchyard/load"
)

// maxErrorBody bounds an engine's non-SSE answer read from a streamed response.
const maxErrorBody = 4 << 20

// The client headers forwarded to engines (INTEROP "Headers"), by slot: the allow-list, then
// the configured affinity headers. Nothing else is, hop-by-hop headers included.
const (
	fwdAuthorization = iota
	fwdRequestID
	fwdCorrelationID
	fwdTraceparent
	fwdTracestate
	fwdSession // Affinity.SessionHeader
	fwdRouting // Affinity.RoutingKeyHeader
	numForward
)

// The client headers read in the same pass and never forwarded: the SLO targets (slo.go).
const (
	readSLOTTFT = numForward + iota
	readSLOTPOT
	numRead
)

// forwardHeaders are the allow-listed names in the canonical form the server gives received
// header names.
var forwardHeaders = [fwdSession]string{"Authorization", "X-Request-Id", "X-Correlation-Id", "Traceparent", "Tracestate"}

// clientHeaders holds a request's forwarded (and read) header values by slot, found in one pass over
// the received headers (the first occurrence of a name counts; empty values are not
// forwarded). The values alias the request: valid until its handler returns.
type clientHeaders [numRead][]byte

// forwardNames are a Server's forwarded (then read) header names by slot, canonical; an
// unconfigured affinity header is empty.
type forwardNames struct {
	names [numRead][]byte
	// byLen has bit i set when slot i's name is that many bytes long (the last entry: that
	// long or longer), so a received name is compared only with the names of its length.
	byLen [64]uint16
}

func newForwardNames(sessionHeader, routingHeader string) forwardNames {
	var n forwardNames
	for i, name := range forwardHeaders {
		n.names[i] = []byte(name)
	}
	if sessionHeader != "" {
		n.names[fwdSession] = fasthttp.AppendNormalizedHeaderKey(nil, sessionHeader)
	}
	if routingHeader != "" {
		n.names[fwdRouting] = fasthttp.AppendNormalizedHeaderKey(nil, routingHeader)
	}
	n.names[readSLOTTFT] = fasthttp.AppendNormalizedHeaderKey(nil, headerSLOTTFT)
	n.names[readSLOTPOT] = fasthttp.AppendNormalizedHeaderKey(nil, headerSLOTPOT)
	for i, name := range n.names {
		if len(name) > 0 {
			n.byLen[min(len(name), len(n.byLen)-1)] |= 1 << i
		}
	}
	return n
}

// scan fills ch from h in one pass. Received names are already canonical (the server
// normalizes them), so no name is normalized per request.
func (n *forwardNames) scan(h *fasthttp.RequestHeader, ch *clientHeaders) {
	for k, v := range h.All() {
		if len(v) == 0 {
			continue
		}
		for m := n.byLen[min(len(k), len(n.byLen)-1)]; m != 0; m &= m - 1 {
			i := bits.TrailingZeros16(m)
			if ch[i] == nil && string(n.names[i]) == string(k) {
				ch[i] = v
			}
		}
	}
}

// string returns the value in slot i as a string, or "" (no allocation) when it is absent.
func (ch *clientHeaders) string(i int) string {
	if len(ch[i]) == 0 {
		return ""
	}
	return string(ch[i])
}

// Response headers set by the router.
const (
	headerWorker        = "X-Switchyard-Worker"
	headerPrefillWorker = "X-Switchyard-Prefill-Worker"
	headerBucket        = "X-Switchyard-Bucket"
)

// exchange is one inference request's pooled scratch: the parsed facts, the decompressed
// body, the PD body, the body forwarded with input_ids, unescaped prompt text and the
// bucket request (whose TokenIDs alias facts.tokenIDs). It never leaves the handler
// goroutine, except that a selection actor may read breq until it answers (an exchange whose
// selection timed out is not reused).
type exchange struct {
	facts requestFacts
	body  []byte
	// held is what the body holds of the body budget, released when the handler returns.
	held int64
	pd   []byte
	fwd  []byte
	text []byte
	// ridBody is the body with the router's rid added (abort.go).
	ridBody []byte
	breq    engine.BucketRequest
	// rank and rank2 are bodies with data-parallel rank fields (plain; PD prefill and decode).
	rank, rank2 []byte
	// memo is the request's prefix lookup (cache_aware); breq.Prefix points to it.
	memo kv.PrefixMemo
	// att is the request's attempt loop.
	att attempts
	// d is the attempt's dispatch: the client watch points into it (its rid), so on the
	// handler's stack it would move to the heap for every request.
	d dispatch
	// symbols are the prompt's text as the approximate source keys it, without a tokenizer.
	symbols []uint32
	// gone is what the watch of the client does when it leaves (abort.go).
	gone clientGone
	// tr is the request's spans (tracing.enabled); zero when not traced.
	tr reqTrace
	// guard is the storage of a buffered answer's load guard (plain dispatch), released
	// before the dispatch returns and acquired again by the next; trim leaves it, as its
	// generation tells the tracker's late references to a former acquisition apart
	// (load.Tracker.AcquirePrefillInto). A stream's relay holds a guard of its own.
	guard load.Guard
}

func (ex *exchange) trim() {
	ex.breq = engine.BucketRequest{}
	ex.att = attempts{}
	ex.d = dispatch{}
	ex.gone = clientGone{}
	ex.tr.reset()
	ex.memo.Reset("", nil) // it aliases facts.tokenIDs
	if cap(ex.body) > maxPooledBuf {
		ex.body = nil
	}
	if cap(ex.pd) > maxPooledBuf {
		ex.pd = nil
	}
	if cap(ex.fwd) > maxPooledBuf {
		ex.fwd = nil
	}
	if cap(ex.ridBody) > maxPooledBuf {
		ex.ridBody = nil
	}
	if cap(ex.text) > maxPooledBuf {
		ex.text = nil
	}
	if cap(ex.rank) > maxPooledBuf {
		ex.rank = nil
	}
	if cap(ex.rank2) > maxPooledBuf {
		ex.rank2 = nil
	}
	if cap(ex.facts.scratch) > maxPooledBuf {
		ex.facts.scratch = nil
	}
	if cap(ex.facts.tokenIDs) > maxPooledBuf/4 {
		ex.facts.tokenIDs = nil
	}
	if cap(ex.symbols) > maxPooledBuf/4 {
		ex.symbols = nil
	}
	clear(ex.facts.messages)
	clear(ex.facts.prompts)
	ex.facts.rid = jsonValue{}   // it aliases the body
	ex.facts.chat = chatFields{} // it aliases the body
}

// outcome is how an inference request ended in its handler.
type outcome struct {
	mm     *modelMetrics
	status int
	// async: a stream relay owns the rest of the request (metrics, guards, in-flight).
	async bool
	// keep: the exchange must not be reused (an actor may still read it).
	keep bool
	// end is the Server's clock at the answer when the dispatch read it (a buffered answer's
	// first token): the request's end, one reading for both. Zero: not read.
	end time.Time
	// ticket holds the request's concurrency slots; a stream relay releases it (async).
	ticket flow.Ticket
}

// inference serves one inference route.
func (s *Server) inference(ctx *fasthttp.RequestCtx, kind routeKind) {
	start := s.requestStart(ctx)
	s.metrics.inflight.Add(1)
	ex := s.exPool.Get().(*exchange)
	if s.tracer != nil {
		// Slow path: tracing is on.
		s.traceRequest(ctx, kind, &ex.tr)
	}
	o := s.serveInference(ctx, kind, ex, start)
	rm := o.mm.routes[kind]
	rm.requests.Inc()
	if !o.async {
		ex.tr.endRequest(o.status)
		o.ticket.Release()
		rm.response(o.status).Inc()
		end := o.end
		if end.IsZero() {
			end = s.now()
		}
		rm.duration.Update(since(start, end))
		s.metrics.inflight.Add(-1)
	}
	s.budget.release(ex.held)
	ex.held = 0
	if !o.keep {
		ex.trim()
		s.exPool.Put(ex)
	}
}

// requestStart is the start of ctx's request on the Server's clock: on the wall clock,
// fasthttp's reading right before it called the handler (RequestCtx.Time), one reading less
// per request; on another clock, a reading of it.
func (s *Server) requestStart(ctx *fasthttp.RequestCtx) time.Time {
	if t := ctx.Time(); s.wallNow && !t.IsZero() {
		return t
	}
	return s.now()
}

func (s *Server) fail(ctx *fasthttp.RequestCtx, o outcome, e *apiError) outcome {
	writeError(ctx, e)
	o.status = e.status()
	return o
}

func (s *Server) serveInference(ctx *fasthttp.RequestCtx, kind routeKind, ex *exchange, start time.Time) outcome {
	o := outcome{mm: s.metrics.unknown}
	if !ctx.IsPost() {
		skipBody(ctx)
		return s.fail(ctx, o, errMethodNotAllowed)
	}
	if s.draining.Load() {
		skipBody(ctx)
		return s.fail(ctx, o, errShuttingDown)
	}
	if e := checkKey(ctx, s.cfg.Server.APIKey); e != nil {
		skipBody(ctx)
		return s.fail(ctx, o, e)
	}
	if e := s.limitRate(ctx); e != nil {
		skipBody(ctx)
		return s.fail(ctx, o, e)
	}
	body, held, e := s.readBody(ctx, ex.body[:0], s.maxBody())
	ex.body, ex.held = body, held
	if e != nil {
		return s.fail(ctx, o, e)
	}
	f := &ex.facts
	if e := parseRequest(kind, body, f); e != nil {
		return s.fail(ctx, o, e)
	}
	mr := s.only
	if len(f.model) > 0 || kind.needsModel() {
		mr = s.models[string(f.model)]
	}
	var adapter string
	if mr == nil && s.lora != nil {
		// Slow path: the model may name a LoRA adapter of a configured model.
		mr, adapter = s.adapterRoute(f.model)
	}
	if mr == nil {
		if len(f.model) == 0 {
			return s.fail(ctx, o, paramError(CodeMissingModel, "model", "more than one model is configured: name one in the model parameter"))
		}
		return s.fail(ctx, o, paramError(CodeModelNotFound, "model", "the model "+quoteClient(f.model)+" does not exist"))
	}
	o.mm = mr.metrics
	if s.gate != nil {
		sp := ex.tr.startAdmission()
		tk, e := s.admit(ctx, mr.name, f)
		endAdmission(sp, e)
		if e != nil {
			return s.fail(ctx, o, e)
		}
		o.ticket = tk
		defer func() {
			if r := recover(); r != nil {
				tk.Release() // a panicking request gives its slots back
				panic(r)
			}
		}()
	}
	// The client's headers are scanned into the dispatch's, zero here (trim): the dispatch
	// holds them without a copy (fast path).
	hdr := &ex.d.hdr
	s.fwd.scan(&ctx.Request.Header, hdr)
	ex.tr.startPrepare(mr.name, f.stream)
	var (
		input int64
		ids   []uint32
	)
	if mr.tok.forwards(f) {
		ex.fwd, input, ids = f.forwardInputIDs(mr.tok, body, ex.fwd[:0], &ex.text)
		body = ex.fwd
	} else {
		var e *apiError
		if input, ids, e = f.inputTokens(mr.tok, body, &ex.text); e != nil {
			return s.fail(ctx, o, e)
		}
	}
	peak, e := expectedPeak(input, f.maxTokens)
	if e != nil {
		return s.fail(ctx, o, e)
	}
	targets, e := sloTargets(hdr, mr.slo)
	if e != nil {
		return s.fail(ctx, o, e)
	}
	// The pooled exchange's request is zero here (trim). Its fields are set in place: a
	// composite literal would be built on the stack and copied whole (fast path).
	b := &ex.breq
	b.Model, b.InputTokens, b.ExpectedPeak, b.TokenIDs, b.Adapter = mr.name, input, peak, ids, adapter
	b.SessionKey, b.RoutingKey = hdr.string(fwdSession), hdr.string(fwdRouting)
	b.Now, b.SLO = start, targets
	if mr.hashKey {
		ex.breq.HashKey = s.hashKey(&ctx.Request.Header)
	}
	if ex.tr.recording {
		ex.breq.Observer = &ex.tr
	}
	if mr.prefix && kind.generates() {
		seq := ids
		if len(seq) == 0 && mr.tok == nil && s.cache.Approximate() != nil {
			ex.symbols = approxSymbols(ex.symbols[:0], f)
			seq = ex.symbols
		}
		if len(seq) > 0 {
			sp := ex.tr.startPrefixLookup()
			ex.breq.Prefix = s.preparePrefix(ex, mr.name, seq)
			endPrefixLookup(sp, ex.breq.Prefix)
		}
	}
	if ex.tr.on() {
		ex.tr.endPrepare(&ex.breq, tokenSource(f, ids))
	}
	return s.attempt(ctx, kind, ex, mr, body, start, o)
}

// abandonPick gives back the adapter slots a selection reserved for a request that is not
// dispatched with it (engine.BucketPick.AbandonAdapters); nothing for a request without an
// adapter.
func (s *Server) abandonPick(ex *exchange, pick *engine.BucketPick) {
	if ex.breq.Adapter != "" {
		pick.AbandonAdapters() // slow path: a LoRA adapter request
	}
}

// attempt runs the request's attempt loop (see attempts): select, admit, dispatch, and
// after a failure that allows it, back off and select again. The client's headers are in
// ex.d.hdr (serveInference).
func (s *Server) attempt(ctx *fasthttp.RequestCtx, kind routeKind, ex *exchange, mr *modelRoute, body []byte,
	start time.Time, o outcome) outcome {
	// The loop's state lives in the pooled exchange: a dispatch points to it, and a pointer
	// to the handler's stack would move it to the heap for every request.
	ex.att = attempts{s: s, breq: &ex.breq}
	att := &ex.att
	for first := true; ; first = false {
		if !first {
			// Slow path: a selection after the first (a retry, after an engine's refusal, a
			// slot wait or a reservation that went) runs at the clock's now, not at the
			// request's start: its adapter slot reservations, rank picks and adapter slot
			// counts are for now. One reading per selection; the first keeps start.
			ex.breq.Now = s.now()
		}
		var slotGen uint64
		if ex.breq.Adapter != "" {
			slotGen = s.lora.slotGeneration(mr.name) // slow path: a LoRA adapter request
		}
		ex.tr.startSelect(att.n + 1)
		pick, err := s.sel.Select(mr.resolver, &ex.breq)
		ex.tr.endSelect(&pick, err)
		if err != nil {
			if ex.breq.Adapter != "" && errors.Is(err, engine.ErrAdapterSlotsInUse) {
				// Slow path: every slot that could take the adapter is taken by one in use;
				// the request waits for a slot to free, bounded, then is selected again.
				again, e := s.awaitAdapterSlot(ctx, att, mr.name, slotGen)
				if e != nil {
					return s.fail(ctx, o, e)
				}
				if again {
					continue
				}
			}
			s.metrics.selectionFailed(err)
			if engine.OutcomeOf(err) == engine.OutcomeTimeout {
				o.keep = true
			}
			if att.last != nil {
				// Slow path: no engine for a retry; the client gets the failure that led to it.
				return att.answerLast(ctx, o)
			}
			return s.fail(ctx, o, selectionError(err))
		}
		if att.retrying {
			// Slow path: a retry has engines; the budget allows it, then it waits.
			if !att.grant() {
				s.abandonPick(ex, &pick)
				return att.answerLast(ctx, o)
			}
			if e := att.backoff(ctx); e != nil {
				s.abandonPick(ex, &pick)
				o = s.fail(ctx, o, e)
				att.setHeader(ctx)
				return o
			}
			if att.wait > 0 {
				// The retry waited after its selection: it is dispatched at the clock's now,
				// and its breaker ticket, guard and SLO estimates count from then.
				ex.breq.Now = s.now()
			}
		}
		// BucketRequest.Now is the dispatch's time in its engines' breaker windows: the
		// request's start on the first attempt; a retry's selection, or its backoff's end,
		// on a retry, so that a retry's outcome counts in the window it ends in.
		adm, refused := admitPicked(&pick, ex.breq.Now)
		if refused != nil {
			// Slow path: a picked engine refused the dispatch (its half-open breaker's probe
			// is taken, or it was removed). It is withdrawn from picks, and left out of this
			// request's next selection.
			ex.tr.refused(refused)
			s.abandonPick(ex, &pick)
			if att.refuse(&pick, sideOf(&pick, refused), false) {
				continue
			}
			if att.last != nil {
				return att.answerLast(ctx, o)
			}
			return s.fail(ctx, o, newAPIError(CodeNoAvailableEngine, "every engine selected for the request refused it"))
		}
		if !att.budgeted && s.retry.MaxRetries() > 0 {
			att.budgeted = true
			s.retryBudget.Request(start)
		}
		att.n++
		s.metrics.selected(mr.metrics, &pick, ex.breq.InputTokens)
		var (
			holds  adapterHolds
			waited waitGuards
		)
		if ex.breq.Adapter != "" {
			// Slow path: a LoRA adapter request; an engine picked to load it loads it now,
			// the request counted in flight there meanwhile.
			waited = s.waitGuards(&pick, s.now())
			if e := s.prepareAdapter(mr.name, ex.breq.Adapter, &pick, &adm); e != nil {
				pick.AbandonAdapters() // the picks whose loads never began
				waited.release()
				adm.done(fleet.OutcomeNeutral)
				if e == errAdapterReservationGone && att.reselect() {
					// Slow path: a picked engine's slot reservation went before its load
					// began; a new selection reserves one, waits for one or is refused, as
					// any selection.
					continue
				}
				o = s.fail(ctx, o, e)
				att.setHeader(ctx)
				return o
			}
			var lost *engine.Worker
			if holds, lost = s.lora.hold(ex.breq.Adapter, &pick, s.opts.Now()); lost != nil {
				// Slow path: another pick evicted the adapter from a picked engine meanwhile;
				// the request selects again without that engine.
				waited.release()
				adm.done(fleet.OutcomeNeutral)
				if att.refuse(&pick, sideOf(&pick, lost), true) {
					continue
				}
				if att.last != nil {
					return att.answerLast(ctx, o)
				}
				return s.fail(ctx, o, newAPIError(CodeNoAvailableEngine, "adapter "+ex.breq.Adapter+" was unloaded from engine "+lost.ID+" to make room for another"))
			}
		}
		s.recordDispatch(ex, &pick)
		abody := body
		if pick.Plain.HasRank && ex.facts.batch == 0 {
			// Slow path: the router chose the engine's data-parallel rank.
			ex.rank = injectInts(ex.rank[:0], body, intField{fieldDPRank, pick.Plain.Rank})
			abody = ex.rank
		}
		// The dispatch is built in place: a composite literal would be built on the stack and
		// copied whole (fast path). The first attempt's is zero but for the client's headers
		// (serveInference); a retry's is cleared but for them.
		d := &ex.d
		if d.s != nil {
			hdr := d.hdr // slow path: a retry
			*d = dispatch{hdr: hdr}
		}
		d.s, d.ctx, d.kind, d.body, d.facts, d.start, d.mm = s, ctx, kind, abody, &ex.facts, start, mr.metrics
		d.pick, d.adm = pick, adm
		d.dl, d.ticket, d.att, d.holds, d.waited = att.deadline(), o.ticket, att, holds, waited
		if pick.IsPD() && !kind.generates() {
			// A route that generates nothing goes to one engine: the pair's prefill engine.
			d.adm.tDecode.Done(fleet.OutcomeNeutral)
			d.waited[1].Release()
			d.waited[1] = nil
			d.pick = engine.BucketPick{BucketID: pick.BucketID, Plain: pick.Prefill, Order: pick.Order}
			d.adm = picked{plain: adm.prefill, tPlain: adm.tPrefill}
		}
		s.sloStart(&d.slo, mr, &ex.breq, &d.pick)
		if ex.tr.on() {
			// Slow path: the attempt is traced, and its span is the engines' parent.
			ex.tr.startDispatch(d, att.n, att.retryReason(), att.wait)
		}
		var failed *failedAnswer
		if d.pick.IsPD() {
			o, failed = d.pd(ex, o)
		} else {
			o, failed = d.plain(ex, o)
		}
		if !o.async {
			if holds.any() {
				holds.release(s.opts.Now(), s.lora, mr.name) // a stream's relay releases them when it ends
			}
			ex.tr.endDispatch(o.status, failed)
		}
		if failed == nil {
			att.setHeader(ctx)
			return o
		}
		// Slow path: the attempt failed and the request is tried again.
		att.last = failed
	}
}

// answerLast answers the request with its latest failed attempt.
func (a *attempts) answerLast(ctx *fasthttp.RequestCtx, o outcome) outcome {
	o.status = a.last.write(ctx)
	a.setHeader(ctx)
	return o
}

// sideOf says which engine of pick w is.
func sideOf(pick *engine.BucketPick, w *engine.Worker) sides {
	switch {
	case !pick.IsPD():
		return sidePlain
	case w == pick.Prefill.Worker:
		return sidePrefill
	}
	return sideDecode
}

// hashKey is consistent_hash's key: the value of the first configured hashing header the
// request carries, or "".
func (s *Server) hashKey(h *fasthttp.RequestHeader) string {
	for _, name := range s.hashHeaders {
		if v := h.PeekBytes(name); len(v) > 0 {
			return string(v)
		}
	}
	return ""
}

// picked is a selection's engines once they admitted the dispatch: their lifecycle state and
// dispatch tickets.
type picked struct {
	plain, prefill, decode    *fleet.Member
	tPlain, tPrefill, tDecode fleet.Ticket
}

// done ends every dispatch ticket a picks holds with outcome o (a request that is not
// dispatched after all).
func (a *picked) done(o fleet.Outcome) {
	a.tPlain.Done(o)
	a.tPrefill.Done(o)
	a.tDecode.Done(o)
}

// admitPicked asks the picked engines to take a dispatch that starts at start, the time of
// its selection (fleet.Member.Admit). refused is the engine that did not, nil when all did;
// any ticket already taken was then given back.
func admitPicked(p *engine.BucketPick, start time.Time) (a picked, refused *engine.Worker) {
	var ok bool
	if !p.IsPD() {
		if a.plain = fleet.MemberOf(p.Plain.Worker); a.plain == nil {
			return a, p.Plain.Worker
		}
		if a.tPlain, ok = a.plain.Admit(start); !ok {
			return a, p.Plain.Worker
		}
		return a, nil
	}
	a.prefill, a.decode = fleet.MemberOf(p.Prefill.Worker), fleet.MemberOf(p.Decode.Worker)
	if a.prefill == nil {
		return a, p.Prefill.Worker
	}
	if a.decode == nil {
		return a, p.Decode.Worker
	}
	if a.tPrefill, ok = a.prefill.Admit(start); !ok {
		return a, p.Prefill.Worker
	}
	if a.tDecode, ok = a.decode.Admit(start); !ok {
		a.tPrefill.Done(fleet.OutcomeNeutral)
		return a, p.Decode.Worker
	}
	return a, nil
}

func (s *Server) maxBody() int64 {
	if s.cfg.Server.MaxBodyBytes > 0 {
		return s.cfg.Server.MaxBodyBytes
	}
	return 32 << 20
}

// dispatch is one selected request's forwarding, on the handler goroutine.
type dispatch struct {
	s     *Server
	ctx   *fasthttp.RequestCtx
	kind  routeKind
	body  []byte
	facts *requestFacts
	// pick is held by value: a pointer would make every request's pick escape to the heap.
	pick  engine.BucketPick
	adm   picked
	hdr   clientHeaders
	start time.Time
	mm    *modelMetrics
	dl    time.Time
	// ticket is the request's concurrency slots, handed to a stream's relay.
	ticket flow.Ticket
	// att is the request's attempt loop: it decides whether a failed dispatch is retried.
	att *attempts
	// rid is the request's ID on engines that abort by rid (abort.go).
	rid rid
	// slo is the request's SLO estimates and, for a stream, what its relay records.
	slo sloTrack
	// holds are the request's holds of its LoRA adapter on the picked engines; a stream's
	// relay releases them.
	holds adapterHolds
	// waited are the in-flight guards of a request that waited for its adapter's load,
	// which the dispatch takes for its own (nil when it did not wait).
	waited waitGuards
}

// timeout is the request's end-to-end timeout.
func (d *dispatch) timeout() time.Duration {
	if t := d.s.cfg.Server.RequestTimeout; t > 0 {
		return t
	}
	return 600 * time.Second
}

// deadline is the request's end-to-end deadline, on the wall clock (network deadlines are
// real time even when the Server's clock is a fake).
func (d *dispatch) deadline() time.Time {
	if d.dl.IsZero() {
		d.dl = time.Now().Add(d.timeout())
	}
	return d.dl
}

// buildUpstream fills req to send a copy of body to the engine at hostPort on the request's
// route with the forwarded headers.
func (d *dispatch) buildUpstream(req *fasthttp.Request, hostPort string, body []byte) {
	d.upstreamHeaders(req, hostPort)
	req.SetBody(body)
}

// upstreamHeaders fills req's request line and headers to the engine at hostPort on the
// request's route: the forwarded client headers, set under their canonical names without
// normalizing them again.
func (d *dispatch) upstreamHeaders(req *fasthttp.Request, hostPort string) {
	req.Header.SetMethod(fasthttp.MethodPost)
	// The route's URI, parsed once; the request's Host header is its host when it is written.
	req.SetURI(&routeURIs[d.kind])
	req.URI().SetHost(hostPort)
	req.Header.SetContentType("application/json")
	// The router's own key authenticates the client to the router, not to the engine.
	dropAuth := d.s.cfg.Server.APIKey != ""
	for i, v := range d.hdr[:numForward] {
		name := d.s.fwd.names[i]
		if len(v) == 0 || dropAuth && string(name) == fasthttp.HeaderAuthorization {
			continue
		}
		req.Header.SetCanonical(name, v)
	}
}

// skipResponseHeader reports the upstream response headers not copied to the client.
func skipResponseHeader(k []byte) bool {
	switch string(k) {
	case "Date", "Server", "Connection", "Keep-Alive", "Content-Length", "Transfer-Encoding":
		return true // fast path: the canonical names the engine client gives
	}
	switch len(k) {
	case 4:
		return equalFoldASCII(k, "Date")
	case 6:
		return equalFoldASCII(k, "Server")
	case 10:
		return equalFoldASCII(k, "Connection") || equalFoldASCII(k, "Keep-Alive")
	case 14:
		return equalFoldASCII(k, "Content-Length")
	case 17:
		return equalFoldASCII(k, "Transfer-Encoding")
	}
	return false
}

// copyResponseHeaders copies resp's end-to-end headers to the client response. The engine
// client gives response header names in canonical form, so they are set as they are.
func copyResponseHeaders(dst *fasthttp.ResponseHeader, resp *fasthttp.Response) {
	for k, v := range resp.Header.All() {
		copyResponseHeader(dst, k, v) // a call: the loop's body stays small enough to inline
	}
}

// copyResponseHeader copies the engine's header k: v to dst unless it is skipped.
func copyResponseHeader(dst *fasthttp.ResponseHeader, k, v []byte) {
	switch {
	case skipResponseHeader(k):
	case string(k) == fasthttp.HeaderContentType:
		// What SetCanonical does with it, without copying and scanning the value twice.
		dst.SetContentTypeBytes(v)
	default:
		dst.SetCanonical(k, v)
	}
}

// Canonical names of the router's response headers.
var (
	keyWorker        = []byte(headerWorker)
	keyPrefillWorker = []byte(headerPrefillWorker)
	keyBucket        = []byte(headerBucket)
)

func (d *dispatch) routerHeaders() {
	setRouterHeaders(&d.ctx.Response.Header, &d.pick)
	d.slo.headers(&d.ctx.Response.Header)
}

// setRouterHeaders names the bucket and engines of p on a response.
func setRouterHeaders(h *fasthttp.ResponseHeader, p *engine.BucketPick) {
	h.SetCanonical(keyBucket, []byte(p.BucketID))
	if p.IsPD() {
		h.SetCanonical(keyWorker, []byte(p.Decode.Worker.ID))
		h.SetCanonical(keyPrefillWorker, []byte(p.Prefill.Worker.ID))
		return
	}
	h.SetCanonical(keyWorker, []byte(p.Plain.Worker.ID))
}

// isEventStream reports whether resp is Server-Sent Events.
func isEventStream(resp *fasthttp.Response) bool {
	ct := resp.Header.ContentType()
	return len(ct) >= len("text/event-stream") && equalFoldASCII(ct[:len("text/event-stream")], "text/event-stream")
}

// plain forwards to the plain engine: buffered for a non-streaming request, relayed for a
// stream. Guards are released and the ticket ended on every path. A failure the attempt
// loop retries answers nothing and returns how it would have been answered. Until the
// engine's answer (a stream's first bytes) arrives, the client is watched: a client that
// leaves cancels the dispatch and aborts the engine's work.
func (d *dispatch) plain(ex *exchange, o outcome) (outcome, *failedAnswer) {
	s := d.s
	w := d.pick.Plain.Worker
	m, ticket := d.adm.plain, d.adm.tPlain
	// The selection's time stamps the guard, with no clock read: the request's start on the
	// first attempt, a retry's own reading on a retry (the guard's age, its pending prefill
	// and the expected first token of a buffered answer count from the attempt). Until its
	// first token the request is pending prefill on the engine. A buffered answer releases
	// its guard before this returns: the exchange holds it, no allocation (fast path).
	// A stream's guard lives in its relay, allocated here (one allocation for both).
	var (
		guard *load.Guard
		rs    *relay
	)
	at := ex.breq.Now
	if d.facts.stream {
		rs = new(relay)
	}
	switch {
	case d.waited[0] != nil:
		// Slow path: the request waited for its adapter's load, in flight since its pick;
		// that guard is the dispatch's.
		at = s.now()
		guard = d.waited[0].Dispatch(at, d.slo.uncached)
	case d.facts.stream:
		guard = s.tracker.AcquirePrefillInto(&rs.guardStore, w.Counters, at, d.slo.uncached)
	default:
		guard = s.tracker.AcquirePrefillInto(&ex.guard, w.Counters, at, d.slo.uncached)
	}
	if !d.facts.stream && d.slo.hasTTFT {
		// A buffered answer reports no first token: it leaves the pending prefill when the
		// estimate made at dispatch expects it, or with the answer if that comes first.
		guard.FirstTokenAt(at.Add(time.Duration(d.slo.estTTFT * float64(time.Second))))
	}
	req := fasthttp.AcquireRequest()
	resp := fasthttp.AcquireResponse()
	d.upstreamHeaders(req, m.Upstream().HostPort())
	// The body outlives the upstream call (it is the client request's or the exchange's),
	// so it is sent without a copy.
	body := d.body
	if s.prepareRID(d) {
		ex.ridBody = append(appendRID(openObject(ex.ridBody[:0], body), &d.rid), '}')
		body = ex.ridBody
	}
	req.SetBodyRaw(body)
	resp.StreamBody = d.facts.stream
	var cancel fleet.Cancel
	if s.cfg.Abort.Enabled {
		cancel = m.Upstream().Cancellable(req)
	}
	watch := s.watchClient(d.ctx, ex.gone.set(d, engineStop{m: m, cancel: cancel}))
	// A stream's relay enforces the same absolute deadline.
	err := m.Upstream().Do(req, resp, d.deadline())
	fasthttp.ReleaseRequest(req)
	var (
		r    *relay
		perr error
	)
	if err == nil && d.facts.stream && resp.StatusCode() == fasthttp.StatusOK && isEventStream(resp) {
		// The stream's first bytes, still watched.
		r = s.newRelay(rs, d, o.mm, resp, w, ticket, guard, nil)
		r.trace(&ex.tr)
		perr = r.prime()
	}
	cancel.End()
	if watch.stop() {
		// Slow path: the client left before the answer (the watch stopped the engine);
		// nobody reads what follows.
		switch {
		case r != nil:
			r.abandon()
		case err == nil && resp.StreamBody:
			_ = resp.CloseBodyStream()
		}
		fasthttp.ReleaseResponse(resp)
		guard.Release()
		ticket.Done(fleet.OutcomeNeutral)
		s.metrics.disconnects.Inc()
		return s.fail(d.ctx, o, errClientLeft), nil
	}
	if err != nil {
		fasthttp.ReleaseResponse(resp)
		guard.Release()
		e, verdict := s.upstreamFailure(w, err)
		s.abortTimedOut(err, d.rid.String(), engineStop{m: m})
		ticket.Done(verdict)
		if d.retryFailed(err, sidePlain) {
			return o, &failedAnswer{api: e, pick: d.pick}
		}
		return s.fail(d.ctx, o, e), nil
	}
	status := resp.StatusCode()
	verdict := s.statusOutcome(w, status)
	if status >= 400 && d.att.retry(retry.Failure{Kind: retry.KindStatus, Status: status}, &d.pick, sidePlain) {
		// Slow path: an error answer the request is retried after.
		f := engineAnswer(resp, &d.pick)
		fasthttp.ReleaseResponse(resp)
		guard.Release()
		ticket.Done(verdict)
		return o, f
	}
	if r != nil {
		if perr != nil {
			// Slow path: the engine failed before its stream's first byte.
			s.abortTimedOut(perr, d.rid.String(), engineStop{m: m})
			return d.streamFailed(o, r, perr, w, ticket, func() {
				fasthttp.ReleaseResponse(resp)
				guard.Release()
			}, sidePlain)
		}
		r.stop = m
		d.ctx.SetStatusCode(status)
		copyResponseHeaders(&d.ctx.Response.Header, resp)
		d.routerHeaders()
		d.ctx.Response.Header.Set("Cache-Control", "no-cache")
		d.ctx.Response.Header.Set("X-Accel-Buffering", "no")
		r.respond(d.ctx)
		o.async = true
		o.status = status
		return o, nil
	}
	// Buffered answer (non-streaming, or an engine error in answer to a stream).
	d.ctx.SetStatusCode(status)
	copyResponseHeaders(&d.ctx.Response.Header, resp)
	d.routerHeaders()
	if resp.StreamBody && resp.BodyStream() != nil {
		buf := getBuf()
		*buf, _ = readLimited((*buf)[:0], resp.BodyStream(), maxErrorBody)
		_ = resp.CloseBodyStream()
		d.ctx.SetBody(*buf)
		putBuf(buf)
	} else {
		d.ctx.SetBody(resp.Body())
	}
	fasthttp.ReleaseResponse(resp)
	if !d.facts.stream {
		// The first token came with the answer at the latest (FirstTokenAt); the reading is
		// also the request's end.
		o.end = s.now()
		guard.FirstToken(o.end)
	}
	guard.Release()
	ticket.Done(verdict)
	o.status = status
	return o, nil
}

// streamFailed ends a stream whose engine failed before its first bytes (relay.prime
// returned err): the relay is abandoned, release gives back the response and guard, and the
// engine is charged. The attempt loop retries it when it may; else the client gets the
// error.
func (d *dispatch) streamFailed(o outcome, r *relay, err error, w *engine.Worker, ticket fleet.Ticket, release func(),
	failed sides) (outcome, *failedAnswer) {
	r.abandon()
	release()
	if errors.Is(err, errPrimeStopped) {
		ticket.Done(fleet.OutcomeNeutral)
		return d.s.fail(d.ctx, o, errShuttingDown), nil
	}
	e, verdict := d.s.upstreamFailure(w, err)
	ticket.Done(verdict)
	if d.retryFailed(err, failed) {
		return o, &failedAnswer{api: e, pick: d.pick}
	}
	return d.s.fail(d.ctx, o, e), nil
}

// retryFailed decides whether the request is tried again after the exchange with the
// failed engines of the pick ended in err before any byte reached the client.
func (d *dispatch) retryFailed(err error, failed sides) bool {
	f, refused, ok := failureOf(err)
	switch {
	case refused:
		return d.att.refuse(&d.pick, failed, true)
	case ok:
		return d.att.retry(f, &d.pick, failed)
	}
	return false
}

// readAllLimited reads r up to limit bytes into a new slice.
func readAllLimited(r io.Reader, limit int64) []byte {
	b, _ := readLimited(nil, r, limit)
	return b
}
