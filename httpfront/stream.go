package httpfront

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"
	"go.opentelemetry.io/otel/trace"

	"switchyard/engine"
	"switchyard/httpfront/fleet"
	"switchyard/httpfront/flow"
	"switchyard/httpfront/hangup"
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

// heldInline is the room in a relay for the held part of an event (relay.heldArr): an
// OpenAI chunk event is a few hundred bytes; a longer held part moves to the heap.
const heldInline = 512

var heartbeat = []byte(": keep-alive\n\n")
var doneEvent = []byte("data: [DONE]\n\n")
var eventSep = []byte("\n\n")

// maxEmptyReads bounds the reads in a row that return neither bytes nor an error.
const maxEmptyReads = 100

// errNoProgress: the engine's body stream kept returning nothing without an error.
var errNoProgress = errors.New("the stream's reads returned nothing")

// errClientWrite ends WriteTo when the client took no more (a failed write, a heartbeat it
// did not take, or its hang-up): the connection then closes.
var errClientWrite = errors.New("the client left during the stream")

// relay streams an engine's SSE response to the client on one goroutine. Once the stream
// has its first event (prime, in the handler), the relay takes the client's connection over
// from fasthttp (respond, hijacked): fasthttp's serving goroutine returns, with its read and
// write buffers and the request context, and a fresh goroutine (serve) writes the response
// headers and the body itself, each write one HTTP chunk (chunkWriter; the headers go in
// the same write as the first). WriteTo reads the engine's body directly and gathers the
// whole events of successive reads until the engine has nothing more to read (Waiting, run
// on the read's EAGAIN), then writes them; CloseWithError then releases everything, and the
// connection serves the client's next requests (fasthttp's ServeConn, the bytes the client
// pipelined first) or closes. There is no goroutine, channel or timer of the stream's own
// besides the one goroutine, and no hand-off per chunk: a held idle stream costs that
// goroutine (its stack shallow: it started fresh), the relay's read buffer (the engine
// connection's reads go straight into it) and this struct.
//
// The stream's waits are read deadlines on the engine connection (fleet.Stream.Pace): the
// next heartbeat, server.stream_idle_timeout and the request's deadline, whichever comes
// first. When one passes, Woke runs on the same goroutine, inside the read: it writes the
// heartbeat and the read goes on where it was, or it ends the stream (idle, timeout). What
// must end a stream from outside records why and closes the engine connection's socket,
// which ends the blocked read at once: the client hanging up (Gone, run by the Server's
// hang-up poller) and the drain's hard stop (fleet.Fleet.InterruptStreams).
//
// The relay owns everything the request still holds once the handler returns: the upstream
// response, the in-flight guard, the tickets, LoRA holds, spans and the request's metrics
// and in-flight count; CloseWithError (which serve, or fasthttp for a body stream, calls
// exactly once, also when the body was never written) releases them.
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
	// up is the engine connection body is read from: its read deadlines pace the stream.
	up     fleet.Stream
	worker *engine.Worker
	// engine is the dispatch's ticket of the engine's lifecycle: the stream's end is
	// charged to the engine's breaker through it.
	engine fleet.Ticket
	guard  *load.Guard
	// guardStore is where a plain stream's guard lives (load.Tracker.AcquirePrefillInto):
	// its dispatch allocates the relay before it acquires the guard, one allocation for both.
	guardStore load.Guard
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
	// held is the received part of the current event, not yet written: in heldArr while it
	// fits (most events do), no allocation.
	held    []byte
	heldArr [heldInline]byte
	// out is the bytes of one read to write when they are not a slice of it (events
	// completing held ones, transformed events, the stream's end): a pooled buffer (getBuf),
	// taken at its first use (outBuf) and returned when the stream closes.
	out *[]byte
	// midEvent: bytes of an unfinished event were written (an event over maxEventBytes).
	midEvent bool
	// done: the [DONE] event was relayed (or, while gathering, is held for the engine's
	// end); doneBy is when the engine's answer must have ended after it (Options.
	// StreamDoneWait), zero until the [DONE] was read. primed: firstOut (below) is not
	// relayed yet. (The flags side by side: TestRelaySize.)
	done, primed bool
	doneBy       time.Time

	// buf is the engine body's read buffer. firstOut is what prime's read gave for the
	// client (framed there, so that its data lines count as the first token), not relayed
	// yet while primed. rerr is an error that came with the last read's bytes.
	buf      *[]byte
	firstOut []byte
	rerr     error
	// idleAfter and hbEvery are server.stream_idle_timeout and the heartbeat interval;
	// idleAt is when the engine's silence ends the stream, hbAt the next heartbeat.
	idleAfter, hbEvery time.Duration
	idleAt, hbAt       time.Time
	// w is the client's body writer while WriteTo runs (heartbeats and gathered events go
	// to it). gather: successive reads' events are gathered in pend, written when the engine
	// has nothing more to read (Waiting); pendOut: next returned pend, released at its next
	// call.
	w       io.Writer
	gather  bool
	pend    *[]byte
	pendOut bool
	// woke is the end Woke decided, when wokeEnd.
	woke    relayEnd
	wokeEnd bool
	// gone: the client hung up (set by Gone, on the poller's goroutine).
	gone atomic.Bool
	// watch is the watch of the client's connection while the body is written.
	watch dispatchWatch
	// end is how the stream ended, once ended; closed: CloseWithError ran.
	end           relayEnd
	ended, closed bool
	opened        bool
	// pending is what Read has not handed out yet (Read serves a caller that does not use
	// WriteTo).
	pending []byte
	// slo records the stream's first token and token gaps (SLO estimates and metrics).
	slo sloTrack
	// holds are the request's holds of its LoRA adapter, released when the stream ends.
	holds adapterHolds
	// tr is the request's spans when it is traced (the relay ends them), span the stream's.
	tr   reqTrace
	span trace.Span

	// ctx is the request between respond and hijacked, when the relay takes the client's
	// connection over; taken: it did, and cw writes the body.
	ctx   *fasthttp.RequestCtx
	taken bool
	cw    chunkWriter
	// keep: the connection serves requests again after the stream (when it reached the
	// client).
	keep bool
}

var (
	_ fasthttp.BodyWriterTo        = (*relay)(nil)
	_ fasthttp.ReadCloserWithError = (*relay)(nil)
	_ fleet.Pacer                  = (*relay)(nil)
	_ hangup.Target                = (*relay)(nil)
)

func (s *Server) newRelay(r *relay, d *dispatch, mm *modelMetrics, resp *fasthttp.Response, w *engine.Worker,
	et fleet.Ticket, guard *load.Guard, transform func(dst, event []byte) []byte) *relay {
	if r == nil {
		r = new(relay)
	}
	s.bg.Add(1)
	// Field by field: r may hold the stream's guard already (guardStore).
	r.s, r.kind, r.mm, r.start, r.deadline = s, d.kind, mm, d.start, d.deadline()
	r.resp, r.body, r.up = resp, resp.BodyStream(), fleet.StreamOf(resp)
	r.worker, r.engine, r.guard = w, et, guard
	r.conn, _ = d.ctx.Conn().(*clientConn)
	r.transform, r.ticket, r.rid = transform, d.ticket, d.ridIfAborting()
	r.slo, r.holds = d.slo, d.holds
	r.held = r.heldArr[:0]
	return r
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

// prime reads the engine's stream until its first bytes, on the handler's goroutine, before
// anything of the answer goes to the client: an engine that answers a stream's headers and
// then fails before its first event (a crash during prefill) has sent the client nothing, so
// the attempt loop may retry it. A failure is a *fleet.Error, the engine's; errPrimeStopped
// when the drain's hard stop came first. The wait is bounded by server.stream_idle_timeout
// and the request's deadline (the engine connection's read deadline). On failure the caller
// calls abandon.
func (r *relay) prime() error {
	s := r.s
	r.buf = readBufs.Get().(*[]byte)
	r.idleAfter, r.hbEvery = s.idleAfter(), s.opts.HeartbeatInterval
	r.idleAt = time.Now().Add(r.idleAfter)
	if !r.up.Pace(r) {
		return errPrimeStopped
	}
	buf := (*r.buf)[:cap(*r.buf)]
	n, err := 0, error(nil)
	for range maxEmptyReads {
		if n, err = r.body.Read(buf); n > 0 || err != nil {
			break
		}
	}
	if n == 0 {
		switch {
		case r.wokeEnd && r.woke == endIdle:
			return &fleet.Error{Kind: fleet.KindTimeout, Detail: "sent no event within " + r.idleAfter.String() + " (server.stream_idle_timeout)",
				Err: errEmptyStream}
		case r.wokeEnd:
			return &fleet.Error{Kind: fleet.KindTimeout, Detail: "did not answer in time", Err: os.ErrDeadlineExceeded}
		case r.stopping():
			return errPrimeStopped
		case err == io.EOF:
			return &fleet.Error{Kind: fleet.KindTransport, Detail: "ended its stream before its first event", Err: errEmptyStream}
		case err == nil:
			err = errNoProgress
		case fleet.IsTimeout(err):
			return &fleet.Error{Kind: fleet.KindTimeout, Detail: "did not answer in time", Err: err}
		}
		return &fleet.Error{Kind: fleet.KindTransport, Detail: "failed before its stream's first event", Err: err}
	}
	r.rerr = err
	ev := r.sse.dataLines
	r.firstOut, r.primed = r.frame(buf[:n]), true
	now := s.now()
	r.mm.routes[r.kind].ttft.Update(since(r.start, now))
	if r.span != nil {
		firstToken(r.span, float64(now.Sub(r.start))/float64(time.Millisecond))
	}
	r.guard.FirstToken(now)
	r.slo.chunk(r.sse.dataLines-ev, now)
	r.idleAt = time.Now().Add(r.idleAfter)
	return nil
}

// stopping reports whether the drain's hard stop has come.
func (r *relay) stopping() bool {
	select {
	case <-r.s.hardStop:
		return true
	default:
		return false
	}
}

// abandon gives up a stream that failed in prime, or whose client left before its answer:
// it cancels the engine's request and releases the relay's buffer and hold on the Server.
// The response, guard and tickets stay the caller's.
func (r *relay) abandon() {
	r.up.Unpace()
	_ = r.resp.CloseBodyStream()
	readBufs.Put(r.buf)
	putBuf(r.out)
	r.buf, r.out = nil, nil
	abandonStream(r.span, nil)
	r.s.bg.Done()
}

// Due implements fleet.Pacer: the engine connection's read deadline is the earliest of the
// request's deadline, the idle bound and, while the body is written and no event is cut in
// two, the next heartbeat.
func (r *relay) Due() time.Time {
	t := r.idleAt
	if !r.deadline.IsZero() && r.deadline.Before(t) {
		t = r.deadline
	}
	if r.w != nil && !r.midEvent && r.hbAt.Before(t) {
		t = r.hbAt
	}
	if !r.doneBy.IsZero() && r.doneBy.Before(t) {
		t = r.doneBy
	}
	return t
}

// Woke implements fleet.Pacer: the engine sent nothing until Due. Past the deadline or the
// idle bound the stream ends; at a heartbeat the events gathered, or else the comment, are
// written and the read goes on.
func (r *relay) Woke() bool {
	now := time.Now()
	switch {
	case !r.doneBy.IsZero() && !now.Before(r.doneBy):
		// The [DONE] came and the engine has not ended its answer since: the stream is
		// complete for the client; the engine connection, mid-answer, is not reused.
		r.woke, r.wokeEnd = endEOF, true
		return false
	case !r.deadline.IsZero() && !now.Before(r.deadline):
		r.woke, r.wokeEnd = endTimeout, true
		return false
	case !now.Before(r.idleAt):
		r.woke, r.wokeEnd = endIdle, true
		return false
	case r.w != nil && !r.midEvent && !now.Before(r.hbAt):
		r.hbAt = now.Add(r.hbEvery)
		if r.pend != nil && len(*r.pend) > 0 {
			// Events gathered and not yet written (the read began after the heartbeat was
			// due) go out instead: a heartbeat never overtakes an event.
			return r.Waiting()
		}
		if _, err := r.w.Write(heartbeat); err != nil {
			r.woke, r.wokeEnd = endClientGone, true
			return false
		}
	}
	return true
}

// Gone implements hangup.Target: the client hung up while its stream is written. The read
// waiting on the engine ends at once (its socket is closed); the stream ends as the
// client's.
func (r *relay) Gone() {
	r.gone.Store(true)
	r.up.Interrupt()
}

// SupportsBodyWriteTo implements fasthttp.BodyWriterTo: fasthttp writes the body with
// WriteTo, one chunk per write.
func (r *relay) SupportsBodyWriteTo() bool { return true }

// open starts writing the body: the client's writes are bounded by the request's deadline
// (plus the grace that delivers a timeout's error event), and the client is watched, so that
// one that leaves ends the stream at once, not at the next write.
func (r *relay) open() {
	if r.opened {
		return
	}
	r.opened = true
	r.hbAt = time.Now().Add(r.hbEvery)
	if r.conn != nil {
		r.conn.setWriteLimit(r.deadline.Add(r.s.opts.StreamEndGrace))
		if r.s.cfg.Abort.Enabled {
			r.watch = r.s.watchTarget(r.conn, r)
		}
	}
}

// WriteTo writes the stream to the client's body writer w (fasthttp's chunked writer: each
// Write is one chunk, flushed), heartbeats included, up to its end: complete, or an error
// event and [DONE]. It fails when the client took no more.
func (r *relay) WriteTo(w io.Writer) (int64, error) {
	r.open()
	r.w, r.gather = w, r.up.Waits()
	defer func() { r.w, r.gather = nil, false }()
	var total int64
	for {
		b, err := r.next()
		if err != nil {
			if r.end == endClientGone {
				return total, errClientWrite
			}
			return total, nil
		}
		if r.taken {
			// The end's bytes carry the last chunk, unless the client has gone.
			r.cw.last = r.ended && r.end != endClientGone
			if r.cw.last {
				// The slots go back before the client can read the end, as on fasthttp's
				// path (which ends the body after CloseWithError): a client that sends its
				// next request on reading the end finds the slot free.
				r.ticket.Release()
				r.ticket = flow.Ticket{}
				r.guard.Release()
			}
		}
		n, err := w.Write(b)
		total += int64(n)
		if err != nil {
			if !r.ended {
				r.end, r.ended = endClientGone, true
			}
			return total, err
		}
	}
}

// respond answers the request with the primed stream. The client's connection is taken over
// (fasthttp's Hijack, without a response of fasthttp's): once the handler has returned,
// hijacked writes the response headers and the body itself, on a goroutine of its own, and
// fasthttp's serving goroutine lets go of the connection, its read and write buffers and the
// request context. The body goes in chunks to an HTTP/1.1 client; to an HTTP/1.0 client,
// which reads no chunks, as it is, up to the connection's end. A connection that is not one
// of the Server's gets the stream as the response's body stream, written by fasthttp
// (WriteTo).
func (r *relay) respond(ctx *fasthttp.RequestCtx) {
	if r.conn == nil {
		ctx.SetBodyStream(r, -1)
		return
	}
	if ctx.Request.Header.IsHTTP11() {
		ctx.Response.Header.SetContentLength(-1) // chunked
	} else {
		ctx.Response.Header.SetContentLength(-2) // up to the connection's end: Connection: close
		r.cw.plain = true
	}
	r.ctx = ctx
	ctx.HijackSetNoResponse(true)
	ctx.Hijack(r.hijacked)
}

// hijacked runs on fasthttp's hijack goroutine once the handler has returned (with the
// response headers final: fasthttp has added Connection: close when the connection ends with
// this request). It keeps what the client pipelined after the request, which fasthttp's
// reader holds, and serializes the headers; then it returns, and fasthttp releases its
// reader and the request context and closes the connection (Server.KeepHijackedConns is
// off): that Close starts the stream on a fresh goroutine instead (clientConn.Close, serve),
// so that nothing of the request's handling (its grown stack, fasthttp's buffers, the request
// context) stays with a held stream.
func (r *relay) hijacked(c net.Conn) {
	ctx, cc := r.ctx, r.conn
	r.ctx = nil
	r.keep = !ctx.Response.Header.ConnectionClose()
	// Nothing read from here on waits: what is buffered is taken, the socket is left alone.
	_ = cc.setReadDeadlineNow(time.Unix(1, 0))
	if body := ctx.RequestBodyStream(); body != nil {
		// A request body the handler did not read to its end would be read as the next
		// request: the connection then closes after the stream.
		var one [1]byte
		n, err := body.Read(one[:])
		r.keep = r.keep && n == 0 && err == io.EOF
	}
	if r.keep {
		cc.pending = takeBuffered(c)
	}
	_ = cc.setReadDeadlineNow(time.Time{})
	head := getBuf()
	*head = ctx.Response.Header.AppendBytes((*head)[:0])
	r.taken = true
	r.cw.c, r.cw.head = cc, head
	cc.handoff.Store(r)
}

// takeBuffered returns what c (the taken-over connection fasthttp hands its hijack handler)
// has buffered, without reading the socket: its read deadline has passed.
func takeBuffered(c net.Conn) []byte {
	var out []byte
	buf := getBuf()
	b := (*buf)[:cap(*buf)]
	for range maxEmptyReads {
		n, err := c.Read(b)
		out = append(out, b[:n]...)
		if err != nil || n == 0 {
			break
		}
	}
	putBuf(buf)
	return out
}

// serve writes the stream to the client's connection, taken over, and then serves the
// connection's next requests (fasthttp's ServeConn, on a warm goroutine: resumers), or closes it: when
// the stream failed to reach the client, the request asked for it to close, the server
// drains, or the request body was not read to its end.
func (r *relay) serve() {
	s, cc := r.s, r.conn
	_, err := r.WriteTo(&r.cw)
	if err == nil {
		err = r.cw.finish()
	}
	r.cw.release()
	keep := r.keep
	_ = r.CloseWithError(err)
	if err != nil || !keep {
		_ = cc.Close()
		return
	}
	// Idle between requests as after any answer (the drain's closeIdle ends the wait); the
	// next request's read is then bounded by server.read_timeout from its first byte on.
	cc.state.Store(connIdle)
	if s.draining.Load() || !cc.awaitRequest(s.opts.IdleTimeout) {
		_ = cc.Close()
		return
	}
	s.resumed.serve(cc)
}

// chunkWriter writes the body of a stream whose connection the relay took over: each Write is
// one HTTP/1.1 chunk in one write of the connection, the response headers before the first;
// with last set, the last chunk follows. With plain set (an HTTP/1.0 client) the bytes go
// as they are.
type chunkWriter struct {
	c     *clientConn
	plain bool
	// head is the response headers, until the first write sends them.
	head *[]byte
	// last: the next write is the body's last (set by WriteTo); done: the last chunk went out.
	last, done bool
}

func (w *chunkWriter) Write(b []byte) (int, error) {
	if len(b) == 0 && !w.last {
		return 0, nil
	}
	buf := w.head
	w.head = nil
	if buf == nil {
		buf = getBuf()
	}
	out := *buf
	switch {
	case w.plain:
		out = append(out, b...)
	case w.last && len(b) > len(doneEvent) && bytes.HasSuffix(b, doneEvent):
		// The [DONE] event goes in a chunk of its own before the last chunk: a client
		// that reads a long chunk's data straight from its socket (Go's chunked reader
		// does, past its 4 KiB buffer) then still finds the body's end buffered with the
		// [DONE], and one that stops reading at [DONE] keeps its connection.
		out = appendChunk(out, b[:len(b)-len(doneEvent)])
		out = appendChunk(out, doneEvent)
	case len(b) > 0:
		out = appendChunk(out, b)
	}
	if w.last {
		w.done = true
		if !w.plain {
			out = append(out, lastChunk...)
		}
	}
	var err error
	if len(out) > 0 {
		_, err = w.c.Write(out)
	}
	*buf = out
	putBuf(buf)
	if err != nil {
		return 0, err
	}
	return len(b), nil
}

// appendChunk appends b to dst as one HTTP/1.1 chunk.
func appendChunk(dst, b []byte) []byte {
	dst = strconv.AppendInt(dst, int64(len(b)), 16)
	dst = append(dst, '\r', '\n')
	dst = append(dst, b...)
	return append(dst, '\r', '\n')
}

// lastChunk ends a chunked body (no trailers).
var lastChunk = []byte("0\r\n\r\n")

// finish writes the last chunk unless the last write carried it (and the headers, when
// nothing was written).
func (w *chunkWriter) finish() error {
	if w.done {
		return nil
	}
	w.last = true
	_, err := w.Write(nil)
	return err
}

// release returns the headers' buffer when they were never written.
func (w *chunkWriter) release() {
	putBuf(w.head)
	w.head = nil
}

// Read implements io.Reader for a caller that does not use WriteTo (fasthttp uses WriteTo
// for a chunked body): the same bytes, without heartbeats.
func (r *relay) Read(p []byte) (int, error) {
	r.open()
	for len(r.pending) == 0 {
		b, err := r.next()
		if err != nil {
			return 0, err
		}
		r.pending = b
	}
	n := copy(p, r.pending)
	r.pending = r.pending[n:]
	return n, nil
}

// readBytes is the size of a relay's read buffer, which a stream holds while it waits for
// the engine (the read that waits has it): the engine connection is read straight into it
// (fleet's streamed body holds no buffer of its own once the bytes read with the headers
// are out), and one read takes every chunk the connection has brought, their framing
// removed in place. A longer event takes more reads.
const readBytes = 4 << 10

// readBufs pools the relays' read buffers (*[]byte of capacity readBytes).
var readBufs = sync.Pool{New: func() any { b := make([]byte, 0, readBytes); return &b }}

// gatherMax is what a relay gathers from the engine's reads at most before it writes.
const gatherMax = 4 << 10

// gatherDoneMax is what a relay gathers at most once it has read the [DONE] event: the
// [DONE] waits for the engine's end, so that both reach the client in one write (a client
// that stops reading at [DONE] keeps its connection only then); an engine that sends more
// after its [DONE] has it written past this bound.
const gatherDoneMax = 64 << 10

// next returns the next bytes for the client (valid until the next call): the whole events
// of the engine's next reads, then the stream's end; io.EOF once the end was returned. When
// gathering (WriteTo on a connection whose waits the relay hears of), the events of
// successive reads are gathered and written by Waiting when the engine has nothing more to
// read, or returned here past gatherMax or with the end.
func (r *relay) next() ([]byte, error) {
	if r.pendOut {
		putBuf(r.pend)
		r.pend, r.pendOut = nil, false
	}
	if r.ended {
		return nil, io.EOF
	}
	if r.primed {
		out := r.firstOut
		r.firstOut, r.primed = nil, false
		if r.done {
			r.noteDoneAt(time.Now())
		}
		if len(out) > 0 {
			if !r.gather {
				return out, nil
			}
			r.gatherOut(out)
		}
	}
	buf := (*r.buf)[:cap(*r.buf)]
	for empty := 0; ; {
		n, err := 0, r.rerr
		r.rerr = nil
		if err == nil {
			n, err = r.body.Read(buf)
		}
		if n > 0 {
			empty = 0
			// A drain that ran out of time wins over a stream that always has data.
			if r.stopping() {
				return r.end1(endShutdown), nil
			}
			// One clock reading per read when the Server's clock is the wall clock.
			now := time.Now()
			at := now
			if !r.s.wallNow {
				at = r.s.now()
			}
			r.idleAt, r.hbAt = now.Add(r.idleAfter), now.Add(r.hbEvery)
			r.rerr = err
			ev := r.sse.dataLines
			out := r.frame(buf[:n])
			r.slo.chunk(r.sse.dataLines-ev, at)
			r.noteDoneAt(now)
			if len(out) > 0 {
				if !r.gather {
					return out, nil
				}
				if n := r.gatherOut(out); n >= gatherMax && (!r.done || n >= gatherDoneMax) {
					return r.takePend(), nil
				}
			}
			continue
		}
		if err == nil {
			if empty++; empty < maxEmptyReads {
				continue
			}
			err = errNoProgress
		}
		return r.end1(r.endOf(err)), nil
	}
}

// end1 ends the stream for end and returns what is left to write: the events gathered,
// then the end.
func (r *relay) end1(end relayEnd) []byte {
	tail := r.closeOut(end)
	if r.pend == nil || len(*r.pend) == 0 {
		return tail
	}
	*r.pend = append(*r.pend, tail...)
	return r.takePend()
}

// gatherOut adds b to the gathered events and returns their length.
func (r *relay) gatherOut(b []byte) int {
	if r.pend == nil {
		r.pend = getBuf()
	}
	*r.pend = append(*r.pend, b...)
	return len(*r.pend)
}

// takePend returns the gathered events for next's caller to write; the next call releases
// them.
func (r *relay) takePend() []byte {
	r.pendOut = true
	return *r.pend
}

// Waiting implements fleet.Pacer: the engine has nothing more to read for now, so the events
// gathered go out. A client that takes no more ends the read.
func (r *relay) Waiting() bool {
	if r.pend == nil || len(*r.pend) == 0 || r.w == nil {
		return true
	}
	if r.done {
		// The [DONE] waits for the engine's end (at most until doneBy), so that both go to
		// the client in one write.
		return true
	}
	_, err := r.w.Write(*r.pend)
	putBuf(r.pend)
	r.pend = nil
	if err != nil {
		r.woke, r.wokeEnd = endClientGone, true
		return false
	}
	return true
}

// endOf is why a read that failed with err ends the stream.
func (r *relay) endOf(err error) relayEnd {
	switch {
	case r.wokeEnd:
		return r.woke
	case err == io.EOF:
		return endEOF
	case r.done && !r.gone.Load():
		// Whatever broke after the [DONE] (the engine's framing, a close before its
		// answer's end, the deadline), the client's stream is complete.
		return endEOF
	case r.gone.Load():
		return endClientGone
	case r.stopping():
		return endShutdown
	case fleet.IsTimeout(err) || !r.deadline.IsZero() && !time.Now().Before(r.deadline):
		return endTimeout // the upstream read hit the request deadline first
	}
	return endUpstream
}

// closeOut ends the stream for end and returns its last bytes: a [DONE] completed, or the
// error event and [DONE] (nothing for a client that has gone).
func (r *relay) closeOut(end relayEnd) []byte {
	out := r.outBuf()
	if end == endEOF {
		out, end = r.finishEvents(out)
	}
	if e := r.endError(end); e != nil {
		out = r.appendError(out, e)
	}
	*r.out = out
	r.end, r.ended = end, true
	return out
}

// CloseWithError implements fasthttp.ReadCloserWithError: fasthttp is done with the body
// (written, or given up: err). It cancels the engine's request unless it completed, and
// releases everything the stream held.
func (r *relay) CloseWithError(error) error {
	if r.closed {
		return nil
	}
	r.closed = true
	s := r.s
	end := r.end
	if !r.ended {
		end = endClientGone // the body was never written (the client's connection failed)
	}
	// The watch ends before the engine connection can go back to the pool.
	r.watch.stop()
	r.watch = dispatchWatch{}
	if r.opened && r.conn != nil {
		r.conn.setWriteLimit(time.Time{})
	}
	r.up.Unpace()
	if rc, ok := r.body.(fasthttp.ReadCloserWithError); ok && r.up.Interrupted() {
		_ = rc.CloseWithError(fleet.ErrInterrupted) // its socket is closed: never pooled
	}
	// An engine with an abort API is told (and the abort counted) before the body stream
	// closes: closing an unfinished body stream closes its connection, which makes an
	// engine that watches it abort the request, and whoever sees that abort must find it
	// counted already.
	switch end {
	case endClientGone:
		s.abort(causeClientGone, r.rid, engineStop{m: r.stop})
	case endTimeout:
		s.abort(causeTimeout, r.rid, engineStop{m: r.stop})
	case endIdle:
		s.abort(causeStreamIdle, r.rid, engineStop{m: r.stop})
	}
	_ = r.resp.CloseBodyStream()
	if r.buf != nil {
		readBufs.Put(r.buf)
	}
	putBuf(r.pend)
	putBuf(r.out)
	r.buf, r.pend, r.out, r.held, r.pending = nil, nil, nil, nil, nil
	r.slo.done = r.sse.doneLines
	r.slo.end(end == endEOF, r.start) // r.start: the request's arrival
	r.finish(end)
	return nil
}

// frame returns what of b, the engine's next bytes, goes to the client now: the whole events
// b completes (through the transform), a slice of b when nothing was held. The unfinished
// rest is held.
func (r *relay) frame(b []byte) []byte {
	out := r.frameEvents(b)
	if r.sse.doneEvent {
		r.done = true // a complete event with a [DONE] line went through
	}
	return out
}

// frameEvents is frame but for the [DONE] event.
func (r *relay) frameEvents(b []byte) []byte {
	if !r.midEvent && len(r.held) == 0 && r.transform == nil {
		// Fast path: no copy.
		cut := r.lastBoundary(b)
		if cut < 0 {
			out := r.hold(r.outBuf(), b)
			*r.out = out
			return out
		}
		r.held = append(r.held, b[cut:]...) // shorter than b: within maxEventBytes
		return b[:cut]
	}
	out := r.outBuf()
	if r.midEvent {
		// Slow path: the rest of an event already partly written goes out as it is.
		n := r.sse.next(b)
		if n < 0 {
			return b
		}
		out = append(out, b[:n]...)
		r.midEvent = false
		b = b[n:]
	}
	cut := r.lastBoundary(b)
	if cut < 0 {
		out = r.hold(out, b)
		*r.out = out
		return out
	}
	switch {
	case len(r.held) == 0:
		out = r.appendEvents(out, b[:cut])
	case r.transform == nil:
		// The held start of an event, then the events b completes, copied once.
		out = append(out, r.held...)
		out = append(out, b[:cut]...)
		r.held = r.held[:0]
	default:
		r.held = append(r.held, b[:cut]...)
		out = r.appendEvents(out, r.held)
		r.held = r.held[:0]
	}
	out = r.hold(out, b[cut:])
	*r.out = out
	return out
}

// outBuf returns r.out emptied, taking it from the pool at its first use.
func (r *relay) outBuf() []byte {
	if r.out == nil {
		r.out = getBuf()
	}
	return (*r.out)[:0]
}

// lastBoundary consumes b and returns the offset past its last event boundary, -1 when it
// has none.
func (r *relay) lastBoundary(b []byte) int {
	cut := -1
	for off := 0; off < len(b); {
		n := r.sse.next(b[off:])
		if n < 0 {
			break
		}
		off += n
		cut = off
	}
	return cut
}

// hold keeps b, the start of an unfinished event; past maxEventBytes the event is appended
// to out as it is.
func (r *relay) hold(out, b []byte) []byte {
	if len(b) == 0 {
		return out
	}
	if len(r.held)+len(b) <= maxEventBytes {
		r.held = append(r.held, b...)
		return out
	}
	// Slow path: an event too long to hold.
	out = append(out, r.held...)
	out = append(out, b...)
	r.held = r.held[:0]
	r.midEvent = true
	return out
}

// noteDoneAt starts the wait for the engine's end once the [DONE] was read (at now).
func (r *relay) noteDoneAt(now time.Time) {
	if r.done && r.doneBy.IsZero() {
		r.doneBy = now.Add(r.s.opts.StreamDoneWait)
	}
}

// appendEvents appends complete events (a run of them ending on a boundary), each through
// the transform when there is one.
func (r *relay) appendEvents(out, events []byte) []byte {
	if r.transform == nil {
		return append(out, events...)
	}
	for len(events) > 0 {
		n := eventLen(events)
		out = r.transform(out, events[:n])
		events = events[n:]
	}
	return out
}

// finishEvents settles a stream the engine ended: complete when the [DONE] event was
// relayed (a [DONE] missing only its blank line is completed), truncated otherwise.
func (r *relay) finishEvents(out []byte) ([]byte, relayEnd) {
	if !r.midEvent && len(r.held) > 0 && hasDoneEvent(r.held) && len(bytes.TrimSpace(r.held)) <= len("data: [DONE]") {
		out = append(out, doneEvent...)
		r.held, r.done = r.held[:0], true
	}
	if r.done && !r.midEvent && len(bytes.TrimSpace(r.held)) == 0 {
		return out, endEOF
	}
	return out, endTruncated
}

// endError is the error event a stream ending for end carries, nil for a complete one or a
// client that has gone.
func (r *relay) endError(end relayEnd) *apiError {
	switch end {
	case endUpstream:
		return newAPIError(CodeUpstream, "engine "+r.worker.ID+" failed during the stream")
	case endTruncated:
		return newAPIError(CodeUpstream, "engine "+r.worker.ID+" ended the stream before its [DONE] event")
	case endIdle:
		return newAPIError(CodeStreamIdleTimeout, "engine "+r.worker.ID+" sent nothing for "+r.idleAfter.String())
	case endTimeout:
		return newAPIError(CodeUpstreamTimeout, "the request timed out")
	case endShutdown:
		return errShuttingDown
	}
	return nil
}

// appendError appends e as the stream's last event, then [DONE]. An unfinished event that
// was partly written is closed first; one held back is dropped.
func (r *relay) appendError(out []byte, e *apiError) []byte {
	if r.midEvent {
		out = append(out, eventSep...)
	}
	out = append(out, "data: "...)
	out = appendErrorJSON(out, e)
	out = append(out, eventSep...)
	out = append(out, doneEvent...)
	r.held = r.held[:0]
	return out
}

// finish releases what the stream held and records its outcome.
func (r *relay) finish(end relayEnd) {
	s := r.s
	fasthttp.ReleaseResponse(r.resp)
	r.guard.Release()
	r.ticket.Release()
	r.holds.release(s.opts.Now(), s.lora, r.worker.Model)
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
// CRLF, LF or CR) in a byte stream split at arbitrary points. In the same pass it counts the
// stream's data lines ("data:" at a line's start) and its [DONE] lines ("data:", spaces,
// then "[DONE]"), so that no other scan of the bytes is needed for the SLO's token count or
// the relay's [DONE] (one pass per line instead of four scans of every read).
//
// It is part of every relay, which a held stream keeps for its whole life: its fields are
// kept small (flags, not counts, where a flag is all the relay needs).
type sseFramer struct {
	inLine bool // the current line has text (a terminator now ends the line, not the event)
	cr     bool // the last byte was a CR (an LF right after it ends the same line)
	// head is how far the current line's start matches "data:", then spaces, then
	// "[DONE]" (headData, headSpaces, headDone+i), headNone once it cannot.
	head int8
	// doneLine: the current event has a [DONE] line; doneEvent: a complete event (its
	// blank line seen) had one.
	doneLine, doneEvent bool
	// dataLines and doneLines count the lines seen.
	dataLines, doneLines int
}

// The states of sseFramer.head: matching "data:" (0..4), the spaces after it, "[DONE]"
// (headDone..headDone+5); headNone: the line is neither.
const (
	headSpaces = int8(len("data:"))
	headDone   = headSpaces + 1
	headNone   = int8(-1)
)

// next consumes b up to its first event boundary and returns the offset just past it (with
// the LF of a CRLF that ended the blank line), or -1 when b holds none; b is then consumed
// whole.
func (f *sseFramer) next(b []byte) int {
	for i := 0; i < len(b); i++ {
		switch c := b[i]; c {
		case '\n':
			if f.cr {
				f.cr = false
				continue
			}
			if !f.inLine {
				f.endEvent()
				return i + 1
			}
			f.inLine, f.head = false, 0
		case '\r':
			f.cr = true
			if !f.inLine {
				f.endEvent()
				if i+1 < len(b) && b[i+1] == '\n' {
					f.cr = false
					return i + 2
				}
				return i + 1
			}
			f.inLine, f.head = false, 0
		default:
			// Fast path: the rest of the line's text is skipped at once (two vectorized
			// scans instead of a step per byte); only a line's first bytes are looked at.
			f.cr = false
			rest := b[i:]
			n := bytes.IndexByte(rest, '\n')
			if n < 0 {
				n = len(rest)
			}
			if k := bytes.IndexByte(rest[:n], '\r'); k >= 0 {
				n = k
			}
			if f.head != headNone {
				f.matchHead(rest[:n])
			}
			f.inLine = true
			i += n - 1
		}
	}
	return -1
}

// matchHead goes on matching the current line's start against "data:", spaces, "[DONE]"
// with t, the line's next text (no terminator in it), and counts the line when it matches.
func (f *sseFramer) matchHead(t []byte) {
	const data, done = "data:", "[DONE]"
	for _, c := range t {
		switch h := f.head; {
		case h < headSpaces:
			if c != data[h] {
				f.head = headNone
				return
			}
			if f.head++; f.head == headSpaces {
				f.dataLines++
			}
		case h == headSpaces && c == ' ':
		case h == headSpaces:
			if c != done[0] {
				f.head = headNone
				return
			}
			f.head = headDone + 1
		default:
			if c != done[h-headDone] {
				f.head = headNone
				return
			}
			if f.head++; f.head == headDone+int8(len(done)) {
				f.doneLines++
				f.doneLine = true
				f.head = headNone
				return
			}
		}
	}
}

// endEvent notes a blank line: the event it ends is complete.
func (f *sseFramer) endEvent() {
	if f.doneLine {
		f.doneEvent, f.doneLine = true, false
	}
	f.head = 0
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
