package actors

import (
	"context"
	"sync/atomic"
	"time"
)

// call is the request/reply state of one round trip to one or more actors, the one call
// type of this package: a reply channel, a deadline timer that answers on the same channel,
// and an abandoned flag. Commands embed it in pooled structs (pickCall, affinityCall,
// matchCall), so a round trip allocates nothing.
//
// Ownership moves with the message: the caller arms the deadline (arm) and sends the
// command; the actor that answers (or a mailbox refusing the command) calls answer exactly
// once per expected reply. The caller owns the call again once wait has returned true (or
// once waitCtx has collected every reply). A caller that stops waiting marks the call
// abandoned and never returns it to its pool, so a late answer lands in a call nobody
// reuses; actors skip abandoned calls.
type call[R any] struct {
	reply     chan reply[R]
	timer     *time.Timer // sends the expiry marker on reply when it fires
	abandoned atomic.Bool
}

// reply is one answer, or the deadline's marker.
type reply[R any] struct {
	v       R
	expired bool
}

// init prepares c for up to n answers per round trip; it must be called once, on the call's
// final address (the timer's callback refers to c).
func (c *call[R]) init(n int) {
	c.reply = make(chan reply[R], n+1) // n answers and the expiry never block
	c.timer = time.AfterFunc(time.Hour, c.expire)
	c.timer.Stop()
}

// expire runs on the timer's goroutine when the deadline passes.
func (c *call[R]) expire() { c.reply <- reply[R]{expired: true} }

// arm starts the deadline of the next round trip.
func (c *call[R]) arm(d time.Duration) { c.timer.Reset(d) }

// answer delivers one reply. It never blocks.
func (c *call[R]) answer(v R) { c.reply <- reply[R]{v: v} }

// wait returns the reply, or false when the deadline passed first (the call is then
// abandoned). Fast path: one channel receive; the deadline answers on the same channel, so
// no select is needed.
func (c *call[R]) wait() (R, bool) {
	r := <-c.reply
	if !r.expired {
		if !c.timer.Stop() {
			<-c.reply // the deadline fired meanwhile: take its marker before reuse
		}
		return r.v, true
	}
	// Slow path: deadline missed. A reply may have raced the timer.
	select {
	case r = <-c.reply:
		return r.v, true
	default:
	}
	c.abandoned.Store(true)
	var zero R
	return zero, false
}

// waitCtx receives one reply without a timer, or returns false when ctx ends first (the
// call is then abandoned). It serves fan-outs whose deadline is the caller's context.
func (c *call[R]) waitCtx(ctx context.Context) (R, bool) {
	// Fast path: the answer is already there.
	select {
	case r := <-c.reply:
		return r.v, true
	default:
	}
	select {
	case r := <-c.reply:
		return r.v, true
	case <-ctx.Done():
		c.abandoned.Store(true)
		var zero R
		return zero, false
	}
}

// offer delivers v unless the call already holds an undelivered answer, so that a panic path
// can answer a command without knowing whether it was answered. It never blocks.
func (c *call[R]) offer(v R) {
	select {
	case c.reply <- reply[R]{v: v}:
	default:
	}
}

// adminCallTimeout bounds the round trips of administrative commands (adding or removing a
// worker's telemetry, a forced publish), which no request waits on.
const adminCallTimeout = 5 * time.Second

// newCall returns an unpooled call for one answer, for administrative commands.
func newCall[R any]() *call[R] {
	c := &call[R]{}
	c.init(1)
	return c
}
