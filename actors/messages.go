package actors

import (
	"github.com/asynkron/protoactor-go/actor"

	"switchyard/engine"
)

// PickEngines asks a bucket actor for the bucket's complete selection: a plain engine, or a
// prefill engine then a decode engine. The sender sets every field before sending and never
// changes them; the reply arrives on the call's reply channel as a *PickEnginesResult.
type PickEngines struct {
	// Request is the prepared request. Actors only read it.
	Request *engine.BucketRequest

	call *pickCall
}

// PickEngine asks a group actor for its stage's step of a bucket's selection
// (engine.Bucket.PickStage): a group whose step leaves the selection incomplete forwards the
// same message to the group of the next stage; the last step (or any failure) replies. The
// bucket actor sets every field before sending and never changes them.
type PickEngine struct {
	// Request is the prepared request. Actors only read it.
	Request *engine.BucketRequest
	// Groups are the bucket's group actors by stage (engine.Stage): plain, prefill, decode.
	Groups *[3]*actor.PID

	call *pickCall
}

// PickEnginesResult is the reply to PickEngines: a complete selection, or the error of the
// stage that failed (a decode failure discards the tentative prefill pick).
type PickEnginesResult struct {
	Pick engine.BucketPick
	Err  error
}

// pickCall is the pooled state of one PickEngines round trip: both command messages, the
// result slot and the call (reply channel and deadline).
//
// Ownership moves with the message: the caller fills engines and sends it; the bucket actor
// fills engine and forwards it; group actors write result (the prefill pick, then the
// final result) and exactly one of them — or a mailbox refusing the message — answers the
// call with &result.
type pickCall struct {
	call[*PickEnginesResult]
	engines PickEngines
	engine  PickEngine
	result  PickEnginesResult
}

func newPickCall() *pickCall {
	c := &pickCall{}
	c.init(1)
	c.engines.call = c
	c.engine.call = c
	return c
}

// fail replies with err, discarding any partial selection (the adapter slots its picks
// reserved are given back).
func (c *pickCall) fail(err error) {
	c.result.Pick.AbandonAdapters()
	c.result = PickEnginesResult{Err: err}
	c.answer(&c.result)
}

// finish replies with the selection in result. When the caller stopped waiting meanwhile,
// whichever of it (Selector.await) and finish takes the reply back gives back the adapter
// slots the selection reserved: the caller marks the call abandoned before it looks, and
// finish looks after it answered, so one of them finds the reply.
func (c *pickCall) finish() {
	c.answer(&c.result)
	if c.abandoned.Load() {
		c.reclaim() // slow path: nobody waits for the reply
	}
}

// reclaim takes an undelivered reply back, if any, and gives back the adapter slots its
// selection reserved.
func (c *pickCall) reclaim() {
	select {
	case r := <-c.reply:
		if !r.expired {
			r.v.Pick.AbandonAdapters()
		}
	default:
	}
}

// skip drops a call its caller abandoned before the selection ended: the adapter slots the
// stages made so far reserved are given back.
func (c *pickCall) skip() { c.result.Pick.AbandonAdapters() }

// reset drops the call's references before it returns to the pool.
func (c *pickCall) reset() {
	c.engines.Request = nil
	c.engine = PickEngine{call: c}
	c.result = PickEnginesResult{}
}

func (m *PickEngines) reject(err *engine.PickError) { m.call.fail(err) }

func (m *PickEngine) reject(err *engine.PickError) { m.call.fail(err) }

var (
	_ rejecter = (*PickEngines)(nil)
	_ rejecter = (*PickEngine)(nil)
)
