package httpfront

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"os"
	"time"

	"github.com/valyala/fasthttp"
	"go.opentelemetry.io/otel/trace"

	"switchyard/engine"
	"switchyard/httpfront/fleet"
	"switchyard/httpfront/flow"
	"switchyard/load"
)

// relayEnd is why a stream relay stopped.
type relayEnd uint8

const (
	endEOF relayEnd = iota
	endUpstream
	endTruncated
	endClientGone
	endIdle
	endTimeout
	endShutdown
)

// maxEventBytes bounds the part of one SSE event a relay holds back until the event is
// complete. An engine's longer event is relayed as it arrives; a failure in its middle
// closes it (the client sees a malformed event, then the error event).
const maxEventBytes = 4 << 20

var heartbeat = []byte(": keep-alive\n\n")
var doneEvent = []byte("data: [DONE]\n\n")
var eventSep = []byte("\n\n")

// chunk is one read of the upstream body, handed from the reader to the writer.
type chunk struct {
	b   *[]byte
	err error
}

// relay streams an engine's SSE response to the client. It owns everything the request
// still holds once the handler returns: the upstream response, the in-flight guard, and the
// request's metrics and in-flight count. run executes on fasthttp's stream-writer goroutine
// and never touches the RequestCtx; a reader goroutine feeds it the upstream body.
//
// The client only ever receives whole events: the relay writes up to the last event
// boundary it has seen and holds the rest (up to maxEventBytes) until the event completes.
// So when the stream fails (engine error, idle or request timeout, drain), the partial event
// is dropped and the error event starts on a boundary, where every SSE parser reads it; a
// stream that ends without its [DONE] event ends with an error event too, so no client takes
// a truncated answer for a complete one.
type relay struct {
	s        *Server
	kind     routeKind
	mm       *modelMetrics
	start    time.Time
	deadline time.Time
	resp     *fasthttp.Response
	body     io.Reader
	worker   *engine.Worker
	// engine is the dispatch's ticket of the engine's lifecycle: the stream's end is
	// charged to the engine's breaker through it.
	engine fleet.Ticket
	guard  *load.Guard
	// conn is the client's connection (nil when not one of ours): its writes are bounded by
	// the request deadline too (plus Options.StreamEndGrace for the error event), so a client
	// that stops reading cannot hold the stream past it.
	conn *clientConn
	// transform rewrites one complete SSE event (PD logprob merge); nil relays events as they
	// are.
	transform func(dst, event []byte) []byte
	// stop is the engine stopped when the stream ends early (the client left, a timeout):
	// closing the body stream closes its connection; rid names the request to its abort API.
	stop *fleet.Member
	rid  string
	// ticket is the request's concurrency slots, held until the stream ends.
	ticket flow.Ticket

	// sse tracks the event boundaries of what was received.
	sse sseFramer
	// held is the received part of the current event, not yet written.
	held []byte
	// midEvent: bytes of an unfinished event were written (an event over maxEventBytes).
	midEvent bool
	// done: the [DONE] event was relayed.
	done bool
	// chunks carries the engine's body from the reader goroutine prime starts; first is
	// its first read, which prime waited for and run writes first.
	chunks chan chunk
	first  *[]byte
	// idle and dl are the stream's idle and deadline timers, started by prime.
	idle, dl *time.Timer
	// slo records the stream's first token and token gaps (SLO estimates and metrics).
	slo sloTrack
	// holds are the request's holds of its LoRA adapter, released when the stream ends.
	holds adapterHolds
	// tr is the request's spans when it is traced (the relay ends them), span the stream's.
	tr   reqTrace
	span trace.Span
}

func (s *Server) newRelay(d *dispatch, mm *modelMetrics, resp *fasthttp.Response, w *engine.Worker, et fleet.Ticket,
	guard *load.Guard, transform func(dst, event []byte) []byte) *relay {
	s.bg.Add(1)
	conn, _ := d.ctx.Conn().(*clientConn)
	return &relay{
		s:         s,
		kind:      d.kind,
		mm:        mm,
		start:     d.start,
		deadline:  d.deadline(),
		resp:      resp,
		body:      resp.BodyStream(),
		worker:    w,
		engine:    et,
		guard:     guard,
		conn:      conn,
		transform: transform,
		ticket:    d.ticket,
		rid:       d.ridIfAborting(),
		slo:       d.slo,
		holds:     d.holds,
	}
}

// trace gives the relay the request's spans (from its exchange) before prime: the stream's
// span starts, and a stream that runs ends them all.
func (r *relay) trace(t *reqTrace) {
	if !t.on() {
		return
	}
	// Slow path: the request is traced.
	r.tr = *t
	r.tr.tp, r.tr.ts = nil, nil
	r.span = r.tr.startStream()
}

// ridIfAborting is the request's rid as a string when aborts are on, else "".
func (d *dispatch) ridIfAborting() string {
	if !d.s.cfg.Abort.Enabled {
		return ""
	}
	return d.rid.String()
}

func (r *relay) read(out chan<- chunk) {
	defer close(out)
	for {
		b := getBuf()
		buf := (*b)[:cap(*b)]
		n, err := r.body.Read(buf)
		if n > 0 {
			*b = buf[:n]
			out <- chunk{b: b}
		} else {
			putBuf(b)
		}
		if err != nil {
			if err != io.EOF {
				out <- chunk{err: err}
			}
			return
		}
	}
}

// idleAfter is server.stream_idle_timeout: the longest an engine's stream may send nothing.
func (s *Server) idleAfter() time.Duration {
	if d := s.cfg.Server.StreamIdleTimeout; d > 0 {
		return d
	}
	return 60 * time.Second
}

// errEmptyStream: the engine ended its stream before sending anything.
var errEmptyStream = errors.New("the stream ended before its first event")

// errPrimeStopped: the drain's hard stop came while a stream waited for its first bytes.
var errPrimeStopped = errors.New("the router is shutting down")

// prime starts reading the engine's stream and waits for its first bytes before anything of
// the answer goes to the client: an engine that answers a stream's headers and then fails
// before its first event (a crash during prefill) has sent the client nothing, so the
// attempt loop may retry it. A failure is a *fleet.Error, the engine's; errPrimeStopped
// when the drain's hard stop came first. The wait is bounded by server.stream_idle_timeout
// and the request's deadline. On failure the caller calls abandon.
func (r *relay) prime() error {
	r.chunks = make(chan chunk, 4)
	go r.read(r.chunks)
	idleAfter := r.s.idleAfter()
	r.idle = time.NewTimer(idleAfter)
	r.dl = time.NewTimer(time.Until(r.deadline))
	select {
	case c, ok := <-r.chunks:
		switch {
		case !ok:
			return &fleet.Error{Kind: fleet.KindTransport, Detail: "ended its stream before its first event", Err: errEmptyStream}
		case c.err != nil && fleet.IsTimeout(c.err):
			return &fleet.Error{Kind: fleet.KindTimeout, Detail: "did not answer in time", Err: c.err}
		case c.err != nil:
			return &fleet.Error{Kind: fleet.KindTransport, Detail: "failed before its stream's first event", Err: c.err}
		}
		r.first = c.b
		now := r.s.now()
		r.mm.routes[r.kind].ttft.Update(since(r.start, now))
		if r.span != nil {
			firstToken(r.span, float64(now.Sub(r.start))/float64(time.Millisecond))
		}
		r.guard.FirstToken()
		r.slo.chunk(*c.b, now)
		r.idle.Reset(idleAfter)
		return nil
	case <-r.idle.C:
		return &fleet.Error{Kind: fleet.KindTimeout, Detail: "sent no event within " + idleAfter.String() + " (server.stream_idle_timeout)",
			Err: errEmptyStream}
	case <-r.dl.C:
		return &fleet.Error{Kind: fleet.KindTimeout, Detail: "did not answer in time", Err: os.ErrDeadlineExceeded}
	case <-r.s.hardStop:
		return errPrimeStopped
	}
}

// abandon gives up a stream that failed in prime: it cancels the engine's request, ends the
// reader and the timers, and releases the relay's hold on the Server. The response, guard
// and tickets stay the caller's.
func (r *relay) abandon() {
	_ = r.resp.CloseBodyStream()
	for c := range r.chunks {
		if c.b != nil {
			putBuf(c.b)
		}
	}
	r.idle.Stop()
	r.dl.Stop()
	abandonStream(r.span, nil)
	r.s.bg.Done()
}

// run is the fasthttp StreamWriter. prime has started the reader and read the first bytes.
func (r *relay) run(w *bufio.Writer) {
	s := r.s
	if r.conn != nil {
		// The writes after the deadline deliver the timeout's error event.
		r.conn.setWriteLimit(r.deadline.Add(s.opts.StreamEndGrace))
		defer r.conn.setWriteLimit(time.Time{})
	}
	chunks := r.chunks
	// The client is watched: one that leaves ends the stream at once, not at the next write.
	var gone <-chan struct{}
	if r.conn != nil && s.cfg.Abort.Enabled {
		if w, ok := watchConn(r.conn, nil); ok {
			gone = w.Gone()
			defer w.Stop()
		}
	}
	hbEvery := s.opts.HeartbeatInterval
	idleAfter := s.idleAfter()
	hb := time.NewTimer(hbEvery)
	idle, dl := r.idle, r.dl
	defer hb.Stop()
	defer idle.Stop()
	defer dl.Stop()

	end := endEOF
	if r.first != nil {
		r.relayChunk(w, *r.first)
		putBuf(r.first)
		r.first = nil
		if err := w.Flush(); err != nil {
			end = endClientGone
		}
	}
loop:
	for end == endEOF {
		select {
		case c, ok := <-chunks:
			if !ok {
				break loop
			}
			// A drain that ran out of time wins over a stream that always has data.
			select {
			case <-s.hardStop:
				if c.b != nil {
					putBuf(c.b)
				}
				end = endShutdown
				break loop
			default:
			}
			if c.err != nil {
				end = endUpstream
				if fleet.IsTimeout(c.err) || !time.Now().Before(r.deadline) {
					end = endTimeout // the upstream read hit the request deadline first
				}
				break loop
			}
			r.slo.chunk(*c.b, s.now())
			r.relayChunk(w, *c.b)
			putBuf(c.b)
			if err := w.Flush(); err != nil {
				end = endClientGone
				break loop
			}
			hb.Reset(hbEvery)
			idle.Reset(idleAfter)
		case <-hb.C:
			if r.midEvent {
				// A comment inside an unfinished event would corrupt it.
				hb.Reset(hbEvery)
				continue
			}
			_, _ = w.Write(heartbeat)
			if err := w.Flush(); err != nil {
				end = endClientGone
				break loop
			}
			hb.Reset(hbEvery)
		case <-gone:
			end = endClientGone
			break loop
		case <-idle.C:
			end = endIdle
			break loop
		case <-dl.C:
			end = endTimeout
			break loop
		case <-s.hardStop:
			end = endShutdown
			break loop
		}
	}
	if end == endEOF {
		end = r.finishEvents(w)
	}
	if e := r.endError(end, idleAfter); e != nil {
		r.writeError(w, e)
	}
	// Cancel the upstream request unless it completed: closing an unfinished body stream
	// closes its connection, which makes an engine that watches it abort the request; one
	// with an abort API is told.
	_ = r.resp.CloseBodyStream()
	switch end {
	case endClientGone:
		s.abort(causeClientGone, r.rid, engineStop{m: r.stop})
	case endTimeout:
		s.abort(causeTimeout, r.rid, engineStop{m: r.stop})
	case endIdle:
		s.abort(causeStreamIdle, r.rid, engineStop{m: r.stop})
	}
	for c := range chunks {
		if c.b != nil {
			putBuf(c.b)
		}
	}
	r.slo.end(end == endEOF)
	r.finish(end)
}

// relayChunk writes the whole events that b completes (through the transform) and holds the
// unfinished rest.
func (r *relay) relayChunk(w *bufio.Writer, b []byte) {
	if r.midEvent {
		// Slow path: the rest of an event already partly written goes out as it is.
		n := r.sse.next(b)
		if n < 0 {
			_, _ = w.Write(b)
			return
		}
		_, _ = w.Write(b[:n])
		r.midEvent = false
		b = b[n:]
	}
	cut := -1 // past the last event boundary in b
	for off := 0; off < len(b); {
		n := r.sse.next(b[off:])
		if n < 0 {
			break
		}
		off += n
		cut = off
	}
	if cut < 0 {
		r.hold(w, b)
		return
	}
	if len(r.held) == 0 {
		r.writeEvents(w, b[:cut]) // fast path: nothing held, no copy
	} else {
		r.held = append(r.held, b[:cut]...)
		r.writeEvents(w, r.held)
		r.held = r.held[:0]
	}
	r.hold(w, b[cut:])
}

// hold keeps b, the start of an unfinished event; past maxEventBytes the event is written
// as it is.
func (r *relay) hold(w *bufio.Writer, b []byte) {
	if len(b) == 0 {
		return
	}
	if len(r.held)+len(b) <= maxEventBytes {
		r.held = append(r.held, b...)
		return
	}
	// Slow path: an event too long to hold.
	_, _ = w.Write(r.held)
	_, _ = w.Write(b)
	r.held = r.held[:0]
	r.midEvent = true
}

// writeEvents writes complete events (a run of them ending on a boundary), each through the
// transform when there is one, and notes the [DONE] event.
func (r *relay) writeEvents(w *bufio.Writer, events []byte) {
	if !r.done && hasDoneEvent(events) {
		r.done = true
	}
	if r.transform == nil {
		_, _ = w.Write(events)
		return
	}
	for len(events) > 0 {
		n := eventLen(events)
		buf := getBuf()
		*buf = r.transform((*buf)[:0], events[:n])
		_, _ = w.Write(*buf)
		putBuf(buf)
		events = events[n:]
	}
}

// finishEvents settles a stream the engine ended: complete when the [DONE] event was
// relayed (a [DONE] missing only its blank line is completed), truncated otherwise.
func (r *relay) finishEvents(w *bufio.Writer) relayEnd {
	if !r.midEvent && len(r.held) > 0 && hasDoneEvent(r.held) && len(bytes.TrimSpace(r.held)) <= len("data: [DONE]") {
		_, _ = w.Write(doneEvent)
		r.held, r.done = r.held[:0], true
	}
	if r.done && !r.midEvent && len(bytes.TrimSpace(r.held)) == 0 {
		return endEOF
	}
	return endTruncated
}

// endError is the error event a stream ending for end carries, nil for a complete one or a
// client that has gone.
func (r *relay) endError(end relayEnd, idleAfter time.Duration) *apiError {
	switch end {
	case endUpstream:
		return newAPIError(CodeUpstream, "engine "+r.worker.ID+" failed during the stream")
	case endTruncated:
		return newAPIError(CodeUpstream, "engine "+r.worker.ID+" ended the stream before its [DONE] event")
	case endIdle:
		return newAPIError(CodeStreamIdleTimeout, "engine "+r.worker.ID+" sent nothing for "+idleAfter.String())
	case endTimeout:
		return newAPIError(CodeUpstreamTimeout, "the request timed out")
	case endShutdown:
		return errShuttingDown
	}
	return nil
}

// writeError ends the stream with e as an event, then [DONE]. An unfinished event that was
// partly written is closed first; one held back is dropped.
func (r *relay) writeError(w *bufio.Writer, e *apiError) {
	buf := getBuf()
	b := (*buf)[:0]
	if r.midEvent {
		b = append(b, eventSep...)
	}
	b = append(b, "data: "...)
	b = appendErrorJSON(b, e)
	b = append(b, eventSep...)
	b = append(b, doneEvent...)
	_, _ = w.Write(b)
	*buf = b
	putBuf(buf)
	_ = w.Flush()
	r.held = r.held[:0]
}

// finish releases what the stream held and records its outcome.
func (r *relay) finish(end relayEnd) {
	s := r.s
	fasthttp.ReleaseResponse(r.resp)
	r.guard.Release()
	r.ticket.Release()
	r.holds.release(s.opts.Now())
	status := fasthttp.StatusOK
	// The stream's end says something of the engine only when it completed, broke or went
	// silent; the request's own deadline, the client leaving and shutdown do not.
	verdict := fleet.OutcomeNeutral
	switch end {
	case endEOF:
		verdict = fleet.OutcomeSuccess
	case endUpstream, endTruncated:
		status = fasthttp.StatusBadGateway
		s.metrics.upstreamError(r.worker.ID, upstreamTransport)
		verdict = fleet.OutcomeFailure
	case endIdle:
		status = fasthttp.StatusGatewayTimeout
		s.metrics.upstreamError(r.worker.ID, upstreamIdle)
		verdict = fleet.OutcomeFailure
	case endTimeout:
		status = fasthttp.StatusGatewayTimeout
		s.metrics.upstreamError(r.worker.ID, upstreamTimeout)
	case endClientGone:
		status = 499
		s.metrics.disconnects.Inc()
	case endShutdown:
		status = fasthttp.StatusServiceUnavailable
	}
	r.engine.Done(verdict)
	r.tr.endStream(r.span, end, status, r.slo.events, r.slo.done)
	rm := r.mm.routes[r.kind]
	rm.response(status).Inc()
	rm.duration.Update(since(r.start, s.now()))
	s.metrics.inflight.Add(-1)
	s.bg.Done()
}

// sseFramer finds SSE event boundaries (a blank line: two line terminators in a row, each
// CRLF, LF or CR) in a byte stream split at arbitrary points.
type sseFramer struct {
	lineLen int  // bytes of the current line so far
	cr      bool // the last byte was a CR (an LF right after it ends the same line)
}

// next consumes b up to its first event boundary and returns the offset just past it (with
// the LF of a CRLF that ended the blank line), or -1 when b holds none; b is then consumed
// whole.
func (f *sseFramer) next(b []byte) int {
	for i, c := range b {
		switch c {
		case '\n':
			if f.cr {
				f.cr = false
				continue
			}
			if f.lineLen == 0 {
				return i + 1
			}
			f.lineLen = 0
		case '\r':
			f.cr = true
			if f.lineLen == 0 {
				if i+1 < len(b) && b[i+1] == '\n' {
					f.cr = false
					return i + 2
				}
				return i + 1
			}
			f.lineLen = 0
		default:
			f.cr = false
			f.lineLen++
		}
	}
	return -1
}

// eventLen returns the length of the first event of b, which starts on a boundary (up to
// and including its blank line), or len(b).
func eventLen(b []byte) int {
	var f sseFramer
	if n := f.next(b); n > 0 {
		return n
	}
	return len(b)
}

// hasDoneEvent reports whether b holds a "data: [DONE]" line.
func hasDoneEvent(b []byte) bool {
	for {
		i := bytes.Index(b, []byte("[DONE]"))
		if i < 0 {
			return false
		}
		line := b[:i]
		if j := bytes.LastIndexAny(line, "\r\n"); j >= 0 {
			line = line[j+1:]
		}
		if string(bytes.TrimRight(line, " ")) == "data:" {
			return true
		}
		b = b[i+len("[DONE]"):]
	}
}
