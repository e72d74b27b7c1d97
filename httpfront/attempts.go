package httpfront

import (
	"errors"
	"strconv"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/valyala/fasthttp"

	"switchyard/engine"
	"switchyard/httpfront/fleet"
	"switchyard/httpfront/retry"
)

// The attempt loop. A request is selected and dispatched; a dispatch that fails before any
// byte of its answer reached the client is tried again (package retry's rules) on a new
// selection that runs in the same bucket first, without the engines that failed for the
// request (engine.BucketRequest.RetryAfter), then in the later compatible buckets. An
// engine that refuses the dispatch before anything is sent (its half-open breaker's probe
// is taken, it was removed, or every connection the router may open to it is busy) is
// left out the same way and the selection runs again at once: no backoff, no budget. The
// request's concurrency slots (flow.Ticket) cover every attempt.

// headerAttempts names the response header that says how many dispatches a request took
// (a prefill/decode pair counts once).
const headerAttempts = "X-Switchyard-Attempts"

var keyAttempts = []byte(headerAttempts)

// maxAdmitRounds bounds the selections of one request whose selected engines refuse the
// dispatch before anything is sent; the next selection leaves each refusing engine out.
const maxAdmitRounds = 4

// sides names the engines of a pick that failed: the plain engine, or the prefill engine,
// the decode engine or both.
type sides uint8

const (
	sidePlain sides = 1 << iota
	sidePrefill
	sideDecode
)

// attempts is one request's attempt loop, on its handler goroutine.
type attempts struct {
	s    *Server
	breq *engine.BucketRequest
	// n is the dispatches sent so far; refusals the selections whose engines refused.
	n, refusals int
	// budgeted: the request is counted in the retry budget (once, at its first dispatch).
	budgeted bool
	// dl is the request's end-to-end deadline, fixed at its first dispatch (wall clock).
	dl time.Time
	// retrying: the latest attempt failed and is retried after wait (0: an engine refused
	// the dispatch; nothing to wait for, and the budget is not asked). failure is why.
	retrying bool
	wait     time.Duration
	failure  retry.Failure
	// last is how the latest failed attempt is answered when no retry takes its place.
	last *failedAnswer
	// slotUntil ends the request's waits for a LoRA adapter slot (Server.awaitAdapterSlot),
	// fixed at its first (Options.Clock); zero before.
	slotUntil time.Time
}

// failedAnswer is how a failed attempt is answered when it is the request's last: the
// router's error, or the engine's own error answer, with the pick it came from.
type failedAnswer struct {
	api    *apiError
	status int
	ctype  string
	body   []byte
	pick   engine.BucketPick
}

// write answers the client with f.
func (f *failedAnswer) write(ctx *fasthttp.RequestCtx) int {
	if f.api != nil {
		writeError(ctx, f.api)
		return f.api.status()
	}
	ctx.Response.Reset()
	ctx.SetStatusCode(f.status)
	if f.ctype != "" {
		ctx.SetContentType(f.ctype)
	}
	setRouterHeaders(&ctx.Response.Header, &f.pick)
	ctx.SetBody(f.body)
	return f.status
}

// engineAnswer returns the failed answer of an engine's error response: its status,
// content type and body (bounded), which it consumes.
func engineAnswer(resp *fasthttp.Response, pick *engine.BucketPick) *failedAnswer {
	f := &failedAnswer{status: resp.StatusCode(), ctype: string(resp.Header.ContentType()), pick: *pick}
	if resp.StreamBody && resp.BodyStream() != nil {
		f.body, _ = readLimited(nil, resp.BodyStream(), maxErrorBody)
		_ = resp.CloseBodyStream()
	} else {
		f.body = append([]byte(nil), resp.Body()...)
	}
	return f
}

// deadline is the request's end-to-end deadline (server.request_timeout), fixed at its first
// dispatch: retries share it.
func (a *attempts) deadline() time.Time {
	if a.dl.IsZero() {
		t := a.s.cfg.Server.RequestTimeout
		if t <= 0 {
			t = 600 * time.Second
		}
		a.dl = time.Now().Add(t)
	}
	return a.dl
}

// exclude leaves the failed engines of pick out of the request's next selection, which
// resumes at pick's bucket; false when one cannot be left out (the set is full).
func (a *attempts) exclude(pick *engine.BucketPick, failed sides) bool {
	if !pick.IsPD() {
		return a.breq.RetryAfter(pick, engine.StagePlain)
	}
	if failed&sidePrefill != 0 && !a.breq.RetryAfter(pick, engine.StagePrefill) {
		return false
	}
	return failed&sideDecode == 0 || a.breq.RetryAfter(pick, engine.StageDecode)
}

// retry decides whether the request is tried again after its latest dispatch (of pick)
// failed with f before any byte reached the client: the failure is retryable, retries
// remain, the backoff ends before the request's deadline, and the failed engines can be
// left out. The budget is asked once the next selection has found engines (grant): a
// request with no engine left answers at once, spending neither budget nor backoff.
func (a *attempts) retry(f retry.Failure, pick *engine.BucketPick, failed sides) bool {
	p := a.s.retry
	if a.n > p.MaxRetries() || !p.Retryable(f) {
		return false
	}
	wait := p.Backoff(a.n)
	if !time.Now().Add(wait).Before(a.deadline()) {
		return false
	}
	if !a.exclude(pick, failed) {
		return false
	}
	a.retrying, a.wait, a.failure = true, wait, f
	return true
}

// grant lets a retry whose selection found engines go ahead: an engine's refusal always,
// a failure when the retry budget allows it (the retry is then counted).
func (a *attempts) grant() bool {
	a.retrying = false
	if a.wait <= 0 && a.failure.Kind == 0 {
		return true
	}
	if !a.s.retryBudget.Withdraw(a.s.now()) {
		a.s.metrics.retryBudgetExhausted.Inc()
		return false
	}
	a.s.metrics.retried(a.failure)
	return true
}

// refuse decides whether the request is selected again after an engine of pick refused the
// dispatch before anything was sent: it is, at once, while it has refusal rounds left and
// the engine can be left out. The dispatch, if one was counted, is not one.
func (a *attempts) refuse(pick *engine.BucketPick, failed sides, counted bool) bool {
	a.refusals++
	if a.refusals >= maxAdmitRounds || !a.exclude(pick, failed) {
		return false
	}
	if counted {
		a.n--
	}
	a.retrying, a.wait, a.failure = true, 0, retry.Failure{}
	return true
}

// reselect decides whether the request is selected again at once, with no engine left out,
// after a picked engine's adapter slot reservation went before its load began
// (errAdapterReservationGone): it is, while it has refusal rounds left. The dispatch
// counted is not one.
func (a *attempts) reselect() bool {
	a.refusals++
	if a.refusals >= maxAdmitRounds {
		return false
	}
	a.n--
	return true
}

// backoff waits before the next attempt, on the Server's clock; it ends early with the
// client's error when the client leaves or the drain's hard stop comes.
func (a *attempts) backoff(ctx *fasthttp.RequestCtx) *apiError {
	if a.wait <= 0 {
		return nil
	}
	// Slow path: a retry waits.
	gone, stop := (*clientWatch)(ctx).Watch()
	defer stop()
	fired := make(chan struct{})
	cancel := a.s.opts.Clock.AfterFunc(a.wait, func() { close(fired) })
	select {
	case <-fired:
		return nil
	case <-gone:
		cancel()
		return errClientGoneRetry
	case <-a.s.hardStop:
		cancel()
		return errShuttingDown
	}
}

// retryReason is why the next dispatch is a retry (retry.Failure.Reason), "" for a first
// dispatch or one after an engine refused.
func (a *attempts) retryReason() string {
	if a.n <= 1 || a.failure.Kind == 0 {
		return ""
	}
	return a.failure.Reason()
}

// errClientGoneRetry answers (to nobody) a request whose client left while it waited to be
// retried.
var errClientGoneRetry = newAPIError(CodeClientClosed, "the client closed the connection while the request waited for a retry")

// setHeader says on the response how many dispatches the request took.
func (a *attempts) setHeader(ctx *fasthttp.RequestCtx) {
	if a.n <= 0 {
		return
	}
	var buf [8]byte
	ctx.Response.Header.SetCanonical(keyAttempts, strconv.AppendInt(buf[:0], int64(a.n), 10))
}

// failureOf classifies a failed exchange with an engine for the retry rules. refused: the
// router's own connection limit kept it from sending anything (retried at once elsewhere);
// ok false: a failure of the router's own that is not retried.
func failureOf(err error) (f retry.Failure, refused, ok bool) {
	var ue *fleet.Error
	if !errors.As(err, &ue) {
		return retry.Failure{Kind: retry.KindTransport}, false, true
	}
	switch ue.Kind {
	case fleet.KindConnLimit:
		return f, true, false
	case fleet.KindResources:
		return f, false, false
	case fleet.KindTimeout:
		return retry.Failure{Kind: retry.KindTimeout}, false, true
	}
	return retry.Failure{Kind: retry.KindTransport}, false, true
}

// retryMetrics are the retries' metric handles.
type retryMetrics struct {
	byReason map[string]*metrics.Counter // read-only after construction
	other    *metrics.Counter
	// retryBudgetExhausted counts retries the budget refused.
	retryBudgetExhausted *metrics.Counter
}

// newRetryMetrics registers switchyard_retries_total for every reason the policy can retry
// (transport, timeout, and each retryable status) and the budget's refusals.
func newRetryMetrics(set *metrics.Set, statuses []int) retryMetrics {
	m := retryMetrics{byReason: map[string]*metrics.Counter{}}
	add := func(f retry.Failure) {
		r := f.Reason()
		if m.byReason[r] == nil {
			m.byReason[r] = set.NewCounter(metricRetries + `{reason="` + r + `"}`)
		}
	}
	add(retry.Failure{Kind: retry.KindTransport})
	add(retry.Failure{Kind: retry.KindTimeout})
	for _, s := range statuses {
		add(retry.Failure{Kind: retry.KindStatus, Status: s})
	}
	m.other = set.NewCounter(metricRetries + `{reason="other"}`)
	m.retryBudgetExhausted = set.NewCounter(metricRetryBudgetExhausted)
	return m
}

// retried counts one retry.
func (m *retryMetrics) retried(f retry.Failure) {
	if c := m.byReason[f.Reason()]; c != nil {
		c.Inc()
		return
	}
	m.other.Inc()
}
