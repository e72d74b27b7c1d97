package httpfront

import (
	"bufio"
	"bytes"
	"io"
	"time"

	"github.com/valyala/fasthttp"

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
	endClientGone
	endIdle
	endTimeout
	endShutdown
)

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
	// the request deadline too, so a client that stops reading cannot hold the stream past it.
	conn *clientConn
	// transform rewrites one complete SSE event (PD logprob merge); nil relays bytes as they
	// arrive.
	transform func(dst, event []byte) []byte
	// ticket is the request's concurrency slots, held until the stream ends.
	ticket flow.Ticket
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
	}
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

// run is the fasthttp StreamWriter.
func (r *relay) run(w *bufio.Writer) {
	s := r.s
	if r.conn != nil {
		r.conn.setWriteLimit(r.deadline)
		defer r.conn.setWriteLimit(time.Time{})
	}
	chunks := make(chan chunk, 4)
	go r.read(chunks)

	hbEvery := s.opts.HeartbeatInterval
	idleAfter := s.cfg.Server.StreamIdleTimeout
	if idleAfter <= 0 {
		idleAfter = 60 * time.Second
	}
	hb := time.NewTimer(hbEvery)
	idle := time.NewTimer(idleAfter)
	dl := time.NewTimer(time.Until(r.deadline))
	defer hb.Stop()
	defer idle.Stop()
	defer dl.Stop()

	var pending []byte
	first := true
	end := endEOF
loop:
	for {
		select {
		case c, ok := <-chunks:
			if !ok {
				break loop
			}
			if c.err != nil {
				end = endUpstream
				break loop
			}
			if first {
				first = false
				r.mm.routes[r.kind].ttft.Update(since(r.start, s.now()))
			}
			if r.transform == nil {
				_, _ = w.Write(*c.b)
			} else {
				pending = append(pending, *c.b...)
				pending = r.writeEvents(w, pending)
			}
			putBuf(c.b)
			if err := w.Flush(); err != nil {
				end = endClientGone
				break loop
			}
			hb.Reset(hbEvery)
			idle.Reset(idleAfter)
		case <-hb.C:
			_, _ = w.Write(heartbeat)
			if err := w.Flush(); err != nil {
				end = endClientGone
				break loop
			}
			hb.Reset(hbEvery)
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
	if end == endEOF && len(pending) > 0 {
		_, _ = w.Write(pending)
	}
	var e *apiError
	switch end {
	case endUpstream:
		e = newAPIError(CodeUpstream, "engine "+r.worker.ID+" failed during the stream")
	case endIdle:
		e = newAPIError(CodeStreamIdleTimeout, "engine "+r.worker.ID+" sent nothing for "+idleAfter.String())
	case endTimeout:
		e = newAPIError(CodeUpstreamTimeout, "the request timed out")
	case endShutdown:
		e = errShuttingDown
	}
	if e != nil {
		buf := getBuf()
		b := append((*buf)[:0], "data: "...)
		b = appendErrorJSON(b, e)
		b = append(b, "\n\n"...)
		b = append(b, doneEvent...)
		_, _ = w.Write(b)
		*buf = b
		putBuf(buf)
		_ = w.Flush()
	}
	// Cancel the upstream request unless it completed: closing an unfinished body stream
	// closes its connection, which makes the engine abort the request.
	_ = r.resp.CloseBodyStream()
	for c := range chunks {
		if c.b != nil {
			putBuf(c.b)
		}
	}
	r.finish(end)
}

// writeEvents writes every complete event of pending through the transform and returns the
// incomplete rest.
func (r *relay) writeEvents(w *bufio.Writer, pending []byte) []byte {
	for {
		i := bytes.Index(pending, eventSep)
		if i < 0 {
			return pending
		}
		ev := pending[:i+len(eventSep)]
		buf := getBuf()
		*buf = r.transform((*buf)[:0], ev)
		_, _ = w.Write(*buf)
		putBuf(buf)
		pending = append(pending[:0], pending[i+len(eventSep):]...)
	}
}

// finish releases what the stream held and records its outcome.
func (r *relay) finish(end relayEnd) {
	s := r.s
	fasthttp.ReleaseResponse(r.resp)
	r.guard.Release()
	r.ticket.Release()
	status := fasthttp.StatusOK
	// The stream's end says something of the engine only when it completed, broke or went
	// silent; the request's own deadline, the client leaving and shutdown do not.
	verdict := fleet.OutcomeNeutral
	switch end {
	case endEOF:
		verdict = fleet.OutcomeSuccess
	case endUpstream:
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
	rm := r.mm.routes[r.kind]
	rm.response(status).Inc()
	rm.duration.Update(since(r.start, s.now()))
	s.metrics.inflight.Add(-1)
	s.bg.Done()
}
