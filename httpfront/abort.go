package httpfront

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"log/slog"
	"net"

	"github.com/VictoriaMetrics/metrics"
	"github.com/valyala/fasthttp"

	"switchyard/httpfront/fleet"
	"switchyard/httpfront/hangup"
)

// Aborts. When a request's client leaves (before or during the answer) or a router timeout
// fires, the engines still working on it are stopped: the dispatch's connection is closed
// (which stops an engine that aborts on a closed connection, vLLM), and an engine with an
// abort API (SGLang) is told the request's rid, which the router sets in the body when the
// client did not. A prefill/decode request stops both engines, unless
// abort.prefill_to_completion leaves the prefill to finish.

// abortCause is why a request's engines are stopped: the label of switchyard_aborts_total.
type abortCause uint8

const (
	causeClientGone abortCause = iota
	causeTimeout
	causeStreamIdle
	numAbortCauses
)

var abortCauseLabels = [numAbortCauses]string{"client_disconnect", "timeout", "stream_idle_timeout"}

// Metric names of aborts.
const (
	metricAborts         = "switchyard_aborts_total"
	metricAbortAPIErrors = "switchyard_abort_api_errors_total"
)

// abortMetrics count aborts by cause and the abort-API calls that failed.
type abortMetrics struct {
	byCause  [numAbortCauses]*metrics.Counter
	apiFails *metrics.Counter
}

func newAbortMetrics(set *metrics.Set) abortMetrics {
	var m abortMetrics
	for c := range numAbortCauses {
		m.byCause[c] = set.NewCounter(metricAborts + `{cause="` + abortCauseLabels[c] + `"}`)
	}
	m.apiFails = set.NewCounter(metricAbortAPIErrors)
	return m
}

// ridLen is the length of a rid the router makes: "switchyard-" and 32 hex digits.
const ridLen = len("switchyard-") + 32

// rid is a request's ID on the engines that abort by rid: the client's, or one the router
// made, held in the dispatch (no allocation, nothing aliasing the request) until an abort
// needs it as a string.
type rid struct {
	own  [64]byte
	n    int    // bytes of own in use: the router's rid, or a client's that fits
	long string // a client's rid longer than own
}

// String is the rid, "" when the request has none the router can name (a batch, whose rid
// is a list).
func (r *rid) String() string {
	if r.long != "" {
		return r.long
	}
	return string(r.own[:r.n])
}

// setClient keeps the client's rid (a JSON string literal, unquoted here).
func (r *rid) setClient(raw []byte) {
	if len(raw) <= len(r.own) {
		r.n = len(appendUnquoted(r.own[:0], raw)) // unquoting never lengthens
		return
	}
	r.long = string(appendUnquoted(nil, raw))
}

// ridPrefix is the start of every rid the router makes: "switchyard-" and the process's
// random base in 16 hex digits, made once (newRIDPrefix).
type ridPrefix [ridLen - 16]byte

func newRIDPrefix(base uint64) ridPrefix {
	var p ridPrefix
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], base)
	hex.Encode(p[copy(p[:], "switchyard-"):], b[:])
	return p
}

// newRID makes a rid unique to the process: the random base and a counter.
func (s *Server) newRID(r *rid) {
	var seq [8]byte
	binary.BigEndian.PutUint64(seq[:], s.ridSeq.Add(1))
	n := copy(r.own[:], s.ridPrefix[:])
	r.n = n + hex.Encode(r.own[n:], seq[:])
}

// prepareRID settles the request's rid: the client's (a JSON string), or, when the body has
// none and some engine of the pick aborts by API, a new one that inject adds to the body.
// It reports whether the body needs the router's rid.
func (s *Server) prepareRID(d *dispatch) (inject bool) {
	v := d.facts.rid
	switch v.kind {
	case kindString:
		d.rid.setClient(v.raw)
		return false
	case 0, kindNull:
	default:
		return false // a list (a batch): the connection alone stops the engines
	}
	if !s.cfg.Abort.Enabled || d.facts.batch > 0 || !ridRoute(d.kind) || !d.pickAbortsByAPI() {
		return false
	}
	s.newRID(&d.rid)
	return true
}

// ridRoute reports whether the router may add a rid to a request of kind: the generation
// routes, whose SGLang request types take one (chat, completions, /generate). Other routes
// are sent as the client wrote them; their connection alone stops the engine.
func ridRoute(kind routeKind) bool {
	return kind == routeChat || kind == routeCompletions || kind == routeGenerate
}

// pickAbortsByAPI reports whether an engine of the request's pick is stopped by its abort API.
func (d *dispatch) pickAbortsByAPI() bool {
	if d.pick.IsPD() {
		return d.adm.prefill.AbortsByAPI() || d.adm.decode.AbortsByAPI()
	}
	return d.adm.plain.AbortsByAPI()
}

// openObject appends body (a validated JSON object) without its closing brace, and a comma
// when the object has members: the caller appends members, then '}'. Duplicate keys sent by
// the client are overridden: JSON readers keep the last occurrence.
func openObject(dst, body []byte) []byte {
	end := len(body) - 1
	for end >= 0 && body[end] != '}' {
		end--
	}
	dst = append(dst, body[:end]...)
	if i := skipWS(body, bytes.IndexByte(body, '{')+1); i < end {
		dst = append(dst, ',')
	}
	return dst
}

// appendRID appends the member "rid":"<r>".
func appendRID(dst []byte, r *rid) []byte {
	dst = append(dst, `"rid":"`...)
	dst = append(dst, r.own[:r.n]...)
	return append(dst, '"')
}

// abortTimedOut stops the engines of a dispatch that failed with err when err is a router
// timeout (the request's deadline, or server.stream_idle_timeout before a stream's first
// event): the engines may still be working on it.
func (s *Server) abortTimedOut(err error, rid string, stops ...engineStop) {
	var fe *fleet.Error
	switch {
	case errors.Is(err, errEmptyStream) && errors.As(err, &fe) && fe.Kind == fleet.KindTimeout:
		s.abort(causeStreamIdle, rid, stops...)
	case fleet.IsTimeout(err) || errors.As(err, &fe) && fe.Kind == fleet.KindTimeout:
		s.abort(causeTimeout, rid, stops...)
	}
}

// errClientLeft answers (to nobody) a request whose client left before its answer.
var errClientLeft = newAPIError(CodeClientClosed, "the client closed the connection before the answer")

// engineStop is one engine of a request to stop: its lifecycle state and the dispatch's
// Cancel.
type engineStop struct {
	m      *fleet.Member
	cancel fleet.Cancel
}

// abort stops the request's engines for cause: each dispatch's connection is closed, and
// each engine that aborts by API is told the rid, on a goroutine of the Server's (bounded by
// abort.timeout). rid may be "" (a batch): the connections alone stop the engines.
func (s *Server) abort(cause abortCause, rid string, stops ...engineStop) {
	if !s.cfg.Abort.Enabled {
		return
	}
	s.aborts.byCause[cause].Inc()
	for _, st := range stops {
		st.cancel.Cancel()
		if st.m == nil || rid == "" || !st.m.AbortsByAPI() {
			continue
		}
		s.bg.Add(1)
		go func(m *fleet.Member) {
			defer s.bg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), s.cfg.Abort.Timeout)
			defer cancel()
			if err := m.Abort(ctx, rid, s.cfg.Abort.Timeout); err != nil {
				s.aborts.apiFails.Inc()
				s.logger.Debug("engine abort failed", slog.String("worker", m.ID()), slog.String("rid", rid), slog.Any("error", err))
			}
		}(st.m)
	}
}

// clientGone is what a dispatch's watch of its client does when the client leaves: it
// stops the request's engines. It lives in the request's exchange (no allocation).
type clientGone struct {
	s     *Server
	rid   *rid
	stops [2]engineStop
	n     int
}

var _ hangup.Target = (*clientGone)(nil)

// set fills g for a dispatch to stops.
func (g *clientGone) set(d *dispatch, stops ...engineStop) *clientGone {
	g.s, g.rid = d.s, &d.rid
	g.n = copy(g.stops[:], stops)
	return g
}

// Gone implements hangup.Target.
func (g *clientGone) Gone() { g.s.abort(causeClientGone, g.rid.String(), g.stops[:g.n]...) }

// dispatchWatch is a dispatching request's watch of its client connection: on the Server's
// poller (no goroutine, no allocation), or where that is not possible (no poller, a
// connection that is not one of the listener's) a goroutine of its own. The zero value
// watches nothing.
type dispatchWatch struct {
	p  *hangup.Poller
	pc *hangup.Conn
	w  *hangup.Watch
}

// watchClient starts watching the client of ctx while its request is dispatched, when aborts
// are on: g.Gone runs when the client hangs up. stop ends the watch and must run before the
// handler returns.
func (s *Server) watchClient(ctx *fasthttp.RequestCtx, g *clientGone) dispatchWatch {
	if !s.cfg.Abort.Enabled {
		return dispatchWatch{}
	}
	return s.watchTarget(ctx.Conn(), g)
}

// watchTarget watches c until stop: t.Gone runs when its peer hangs up. Nothing may read c
// meanwhile.
func (s *Server) watchTarget(c net.Conn, t hangup.Target) dispatchWatch {
	if cc, ok := c.(*clientConn); ok && s.poller != nil {
		if s.poller.Watch(&cc.hup, cc.Conn, t) {
			return dispatchWatch{p: s.poller, pc: &cc.hup}
		}
	}
	// Slow path: a goroutine watches the connection.
	w, ok := watchConn(c, t.Gone)
	if !ok {
		return dispatchWatch{}
	}
	return dispatchWatch{w: w}
}

// stop ends the watch and reports whether the client left (its Gone has then run).
func (dw dispatchWatch) stop() bool {
	switch {
	case dw.pc != nil:
		return dw.p.Stop(dw.pc)
	case dw.w != nil:
		dw.w.Stop()
		return dw.w.Left()
	}
	return false
}
