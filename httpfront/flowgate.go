package httpfront

import (
	"errors"
	"math"
	"net"
	"strconv"
	"time"

	"github.com/valyala/fasthttp"

	"switchyard/config"
	"switchyard/httpfront/flow"
	"switchyard/httpfront/hangup"
)

// newGate returns the admission gate (rate limits, concurrency limits and queues) of cfg,
// or opts.Flow when set; nil when nothing is limited.
func newGate(cfg *config.Config, opts Options) *flow.Gate {
	if opts.Flow != nil {
		return opts.Flow
	}
	return flow.NewGate(cfg, flow.Options{Metrics: opts.Metrics})
}

// limitRate checks the request against the rate limits: the router's, and its API key's
// (the Authorization bearer token; requests without one share a bucket).
func (s *Server) limitRate(ctx *fasthttp.RequestCtx) *apiError {
	if s.gate == nil {
		return nil
	}
	after, err := s.gate.Allow(apiKey(&ctx.Request.Header), s.now())
	if err == nil {
		return nil
	}
	// Slow path: refused.
	msg := "rate limit exceeded"
	var le *flow.LimitError
	if errors.As(err, &le) && le.Scope == flow.ScopeKey {
		msg = "rate limit of this API key exceeded"
	}
	secs := retryAfterSeconds(after)
	return &apiError{code: CodeRateLimited, message: msg + "; retry after " + strconv.Itoa(secs) + "s", retryAfter: secs}
}

// retryAfterSeconds is a wait as Retry-After's whole seconds: rounded up, at least 1.
func retryAfterSeconds(d time.Duration) int {
	return int(max(1, min(math.Ceil(d.Seconds()), 1<<31-1)))
}

// apiKey is the request's API key: the Authorization bearer token, the whole header when it
// is not a bearer token, or nil. It aliases the request.
func apiKey(h *fasthttp.RequestHeader) []byte {
	v := h.Peek(fasthttp.HeaderAuthorization)
	const prefix = "Bearer "
	if len(v) > len(prefix) && equalFoldASCII(v[:len(prefix)], prefix) {
		return v[len(prefix):]
	}
	return v
}

// admit takes the request's concurrency slots (its model's, then the router's), waiting in
// their queues when a limit is reached, ordered by the request's class (classOf). The wait
// counts from the request's arrival; it ends early when the client leaves (the connection is
// watched only while the request waits) or when the drain timeout has passed.
func (s *Server) admit(ctx *fasthttp.RequestCtx, model string, f *requestFacts) (flow.Ticket, *apiError) {
	if s.gate == nil {
		return flow.Ticket{}, nil
	}
	cls, e := s.classOf(&ctx.Request.Header, f)
	if e != nil {
		return flow.Ticket{}, e
	}
	t, err := s.gate.Admit(model, ctx.Time(), cls, flow.Cancel{Client: (*clientWatch)(ctx), Stop: s.hardStop})
	if err == nil {
		return t, nil
	}
	// Slow path: refused.
	whose := "the router's"
	var le *flow.LimitError
	if errors.As(err, &le) && le.Scope != flow.ScopeRouter {
		whose = "model " + model + "'s"
	}
	switch {
	case errors.Is(err, flow.ErrQueueFull):
		return t, newAPIError(CodeQueueFull, "too many requests: "+whose+" concurrency limit is reached and its queue is full")
	case errors.Is(err, flow.ErrQueueTimeout):
		return t, newAPIError(CodeQueueTimeout, "the request waited in "+whose+" queue until its timeout")
	case errors.Is(err, flow.ErrClientGone):
		return t, errClientGone
	}
	return t, errShuttingDown
}

// classOf is the request's queue class: its priority (the body's "priority", else the
// server.priority_header, else 0; outside ±server.max_priority a 400) and its tenant (the
// server.tenant_header's value, else its API key). The tenant aliases the request.
func (s *Server) classOf(h *fasthttp.RequestHeader, f *requestFacts) (flow.Class, *apiError) {
	var cls flow.Class
	prio, from := f.priority, "priority"
	if !f.hasPriority && len(s.prioHeader) > 0 {
		if v := h.PeekBytes(s.prioHeader); len(v) > 0 {
			// Slow path: a priority header.
			n, err := strconv.ParseInt(string(v), 10, 64)
			if err != nil {
				return cls, paramError(CodeInvalidParameter, "priority", "the "+s.cfg.Server.PriorityHeader+" header must be an integer")
			}
			prio, from = n, s.cfg.Server.PriorityHeader
		}
	}
	if limit := int64(s.cfg.Server.MaxPriority); prio < -limit || prio > limit {
		return cls, paramError(CodeInvalidParameter, "priority", from+" must be in -"+strconv.FormatInt(limit, 10)+".."+strconv.FormatInt(limit, 10))
	}
	cls.Priority = int(prio)
	if len(s.tenantHeader) > 0 {
		cls.Tenant = h.PeekBytes(s.tenantHeader)
	}
	if len(cls.Tenant) == 0 {
		cls.Tenant, cls.Keyed = apiKey(h), true
	}
	return cls, nil
}

// clientWatch watches a request's client connection while the request waits in a queue
// (flow.Watcher).
type clientWatch fasthttp.RequestCtx

var _ flow.Watcher = (*clientWatch)(nil)

// Watch implements flow.Watcher: a goroutine waits, through the runtime's poller, until the
// connection is readable and peeks at it without consuming anything: an orderly close or a
// reset means the client has left; bytes mean it is still there (a pipelined request) and
// end the watch. stop wakes the goroutine with a read deadline in the past, waits for it,
// and clears that deadline again (the server sets its own before it next reads). Where the
// connection cannot be watched, the wait is bounded by the queue timeout alone.
func (w *clientWatch) Watch() (<-chan struct{}, func()) {
	hw, ok := watchConn((*fasthttp.RequestCtx)(w).Conn(), nil)
	if !ok {
		return nil, func() {}
	}
	return hw.Gone(), hw.Stop
}

// watchConn starts a hang-up watch of a request's client connection c while nothing reads
// from it (hangup.Start; onGone runs on the watch's goroutine). The read deadline is cleared
// first and moved at once, not lazily: a deadline left armed (a past one by an earlier
// watch's Stop, or the request's read timeout) would end the watch without a word. The
// server sets its own deadline again before it next reads.
func watchConn(c net.Conn, onGone func()) (*hangup.Watch, bool) {
	set := c.SetReadDeadline
	if cc, ok := c.(*clientConn); ok {
		set = cc.setReadDeadlineNow
	}
	if set(time.Time{}) != nil {
		return nil, false // closed
	}
	return hangup.Start(c, set, onGone)
}

// NetConn returns the connection c wraps.
func (c *clientConn) NetConn() net.Conn { return c.Conn }

// errClientGone answers (to nobody) a request whose client left while it waited.
var errClientGone = newAPIError(CodeClientClosed, "the client closed the connection while the request waited")
