package load

import (
	"sync/atomic"
	"time"
)

// Field flags say which metrics of an Observation were reported.
type Field uint8

// Reported fields.
const (
	HasRunning Field = 1 << iota
	HasWaiting
	HasUsedTokens
	HasWaitingUncached
	HasCapacity     // MaxTotalTokens > 0
	HasPrefillQueue // PrefillQueueMs is valid
	HasNative       // the report came from the native /v1/loads or extended gauge shape
)

// Observation is one worker's engine-reported load as seen by a pick: the sum over a complete
// set of fresh DP ranks. The zero value is "unknown": no field is set, and a policy must never
// read an unknown metric as zero.
type Observation struct {
	Fields Field
	// Running is the number of running requests.
	Running int64
	// Waiting is the number of queued requests.
	Waiting int64
	// UsedTokens is the number of KV tokens in use.
	UsedTokens int64
	// MaxTotalTokens is the KV capacity in tokens.
	MaxTotalTokens int64
	// WaitingUncachedTokens is the uncached prompt tokens of queued requests.
	WaitingUncachedTokens int64
	// PrefillQueueMs is the estimated prefill queue time in milliseconds.
	PrefillQueueMs float64
	// CapturedAt is the oldest capture time among the aggregated ranks.
	CapturedAt time.Time
	// DispatchesAtCapture is the worker's dispatch count when the report was ingested; the
	// difference to Counters.Dispatched corrects for dispatches made since.
	DispatchesAtCapture uint64
	// PendingRequestsAtCapture and PendingTokensAtCapture are the router's own requests
	// waiting for their first token on the worker, and their uncached prompt tokens
	// (Counters.PendingPrefill), when the report was ingested: the part of the reported
	// queue the router sent itself, which the SLO estimate replaces by its current value.
	PendingRequestsAtCapture int64
	PendingTokensAtCapture   int64
}

// Has reports whether every field in f was reported.
func (o *Observation) Has(f Field) bool { return o.Fields&f == f }

// Known reports whether the observation holds any reported metric.
func (o *Observation) Known() bool { return o.Fields != 0 }

// Native reports whether the observation is a fresh, complete native report with valid
// capacity: the condition under which pressure metrics may be compared.
func (o *Observation) Native() bool { return o.Has(HasNative | HasCapacity) }

// KVUsage is UsedTokens/MaxTotalTokens, or 0 without capacity.
func (o *Observation) KVUsage() float64 {
	if o.MaxTotalTokens <= 0 {
		return 0
	}
	return float64(o.UsedTokens) / float64(o.MaxTotalTokens)
}

// Counters are one worker's router-local request accounting. All fields are atomic; a
// Counters is shared by every pick and dispatch that concerns its worker.
type Counters struct {
	inflight     atomic.Int64
	dispatched   atomic.Uint64
	lastDispatch atomic.Int64 // unix nanoseconds
	// The other router replicas' counts of the worker (a cluster shares them); 0 alone.
	peerInflight   atomic.Int64
	peerDispatched atomic.Uint64
	// pendingReqs and pendingTokens count the requests dispatched for prefill (Guards from
	// Tracker.AcquirePrefill) that have no first token yet, and their uncached tokens.
	pendingReqs   atomic.Int64
	pendingTokens atomic.Int64
	// prefillFrom (unix nanoseconds) is when the worker began the prefill at the head of
	// the router's pending prompts, as far as the router can tell: the latest first token
	// (a prefill batch ended, the next begins), or the dispatch that found nothing pending.
	// stalledAt (unix nanoseconds) is the latest time an estimate found the worker unable to
	// be prefilling any of them. See PendingPrefillLeft.
	prefillFrom atomic.Int64
	stalledAt   atomic.Int64
	// slots is the worker's running-request slots, summed over its DP ranks: its reported
	// max_running_requests, else the most running requests a report showed while requests
	// waited; 0 while unknown. Written by the Aggregator at ingest.
	slots atomic.Int64
	// due holds the guards of requests that report no first token, with the time it is
	// expected (Guard.FirstTokenAt); dueNext is the earliest of those times (unix
	// nanoseconds, 0 when none), and sweeping is held by the one call that settles them.
	due      [dueSlots]dueEntry
	dueNext  atomic.Int64
	sweeping atomic.Bool
	rates    Rates
}

// dueSlots is how many requests per worker can carry an expected first-token time
// (Guard.FirstTokenAt); a request beyond them stays pending until its FirstToken or
// Release.
const dueSlots = 16

// dueEntry is one request with an expected first-token time. g is set by the request
// (from nil) and cleared by Counters.settle; at (unix nanoseconds) is 0 until g's request
// stores it, and cleared before g.
type dueEntry struct {
	g   atomic.Pointer[Guard]
	gen atomic.Uint64 // g's generation when it registered (Guard)
	at  atomic.Int64
}

// waiting reports whether the entry's request, g (as loaded from the entry), still waits for
// its first token: g holds the pending-prefill slot of the acquisition that registered.
func (e *dueEntry) waiting(g *Guard) bool {
	s := g.state.Load()
	return s&guardPrefill != 0 && gen(s) == e.gen.Load()
}

// InFlight is the number of requests the router — with a cluster, every replica — has
// dispatched to the worker and not yet finished.
func (c *Counters) InFlight() int64 { return c.inflight.Load() + c.peerInflight.Load() }

// LocalInFlight is the number of requests this router replica has dispatched to the worker
// and not yet finished.
func (c *Counters) LocalInFlight() int64 { return c.inflight.Load() }

// Dispatched is the total number of dispatches to the worker, by every replica of a cluster.
func (c *Counters) Dispatched() uint64 { return c.dispatched.Load() + c.peerDispatched.Load() }

// LocalDispatched is the number of dispatches to the worker by this router replica.
func (c *Counters) LocalDispatched() uint64 { return c.dispatched.Load() }

// SetPeers records the other replicas' counts of the worker: their in-flight requests now
// and their dispatches so far. The dispatch total never moves backwards (a replica that
// leaves keeps its past dispatches counted), so dispatch corrections stay non-negative.
func (c *Counters) SetPeers(inflight int64, dispatched uint64) {
	c.peerInflight.Store(max(inflight, 0))
	for {
		old := c.peerDispatched.Load()
		if dispatched <= old || c.peerDispatched.CompareAndSwap(old, dispatched) {
			return
		}
	}
}

// PendingPrefill is the number of requests the router dispatched to the worker for
// prefill whose first token has not arrived yet (for a request that reports none, whose
// expected first token was not yet found due: Guard.FirstTokenAt), and the sum of their
// uncached prompt tokens.
func (c *Counters) PendingPrefill() (requests, tokens int64) {
	return c.pendingReqs.Load(), c.pendingTokens.Load()
}

// PendingPrefillLeft is the part of the pending prefill (PendingPrefill's tokens) the
// worker has not done yet at now, given its latest load observation o (the zero Observation
// when unknown).
//
// An engine admits prompts first come, first served, and prefills the admitted ones (whole,
// or in chunks between decode steps) before the next: of the router's pending prompts, the
// one at the head is being prefilled, unless no running slot is free or the engine queues
// work ahead of it, and the others wait. So the pending tokens count in full, less the
// progress on the head prompt: the time since the engine began it (the latest first token,
// or the dispatch that found nothing pending), at its learned prefill rate
// (Rates.PrefillSecondsPerToken), at most one prompt's worth (the mean pending prompt). A
// prompt half prefilled thus counts half, and prompts behind it in full.
//
// No progress counts while the worker cannot be prefilling any of them: when the router's
// own requests past their first token fill its running slots (InFlight less the pending
// requests, against the slots its reports give), or when its latest report, captured since
// the head began, showed at least as many requests waiting as the router had pending then
// (none of them admitted). Such a call records now (stalledAt), and progress counts from
// the latest such time once the worker can go on: a prompt waiting behind full slots
// begins at the earliest when a slot frees. Before a rate is learned the pending tokens
// count in full. The result is never negative. Requests whose expected first token
// (Guard.FirstTokenAt) is due by now leave the pending prefill first.
func (c *Counters) PendingPrefillLeft(o *Observation, now time.Time) float64 {
	ns := now.UnixNano()
	if d := c.dueNext.Load(); d != 0 && d <= ns {
		c.settle(ns)
	}
	reqs, tokens := c.pendingReqs.Load(), c.pendingTokens.Load()
	if tokens <= 0 || reqs <= 0 {
		return float64(max(tokens, 0))
	}
	full := float64(tokens)
	perToken := c.rates.PrefillSecondsPerToken()
	if !(perToken > 0) {
		return full
	}
	from := c.prefillFrom.Load()
	if c.stalled(o, reqs, from) {
		storeLater(&c.stalledAt, ns)
		return full
	}
	elapsed := float64(ns-max(from, c.stalledAt.Load())) / 1e9
	if !(elapsed > 0) {
		return full
	}
	return full - min(elapsed/perToken, full/float64(reqs))
}

// stalled reports whether the worker cannot be prefilling any of the router's reqs pending
// prompts (PendingPrefillLeft), the head having begun at from (unix nanoseconds).
func (c *Counters) stalled(o *Observation, reqs, from int64) bool {
	if m := c.slots.Load(); m > 0 && c.inflight.Load()-reqs >= m {
		return true
	}
	return o != nil && o.Has(HasWaiting) && o.Waiting > 0 && o.Waiting >= o.PendingRequestsAtCapture &&
		unixNanoSat(o.CapturedAt) >= from
}

// settle gives back the pending-prefill slots of the requests whose expected first token
// (Guard.FirstTokenAt) is at or before now (unix nanoseconds), as their FirstToken at that
// time would, and frees the entries of those and of requests that ended. One call at a time
// settles; a concurrent call returns at once.
func (c *Counters) settle(now int64) {
	if !c.sweeping.CompareAndSwap(false, true) {
		return
	}
	// A request registering meanwhile stores its time in dueNext after its entry's, so
	// either this scan sees the entry or its own store comes after this one.
	c.dueNext.Store(0)
	var next int64
	for i := range c.due {
		e := &c.due[i]
		g := e.g.Load()
		if g == nil {
			continue
		}
		at := e.at.Load()
		if at == 0 {
			continue // being registered
		}
		if at > now && e.waiting(g) {
			if next == 0 || at < next {
				next = at
			}
			continue
		}
		g.firstToken(e.gen.Load(), time.Unix(0, at)) // nothing when it already had one or ended
		e.at.Store(0)
		e.g.Store(nil)
	}
	if next != 0 {
		storeEarlier(&c.dueNext, next)
	}
	c.sweeping.Store(false)
}

// storeEarlier stores ns (non-zero) in v unless v holds an earlier non-zero time.
func storeEarlier(v *atomic.Int64, ns int64) {
	for {
		old := v.Load()
		if old != 0 && old <= ns || v.CompareAndSwap(old, ns) {
			return
		}
	}
}

// storeLater stores ns in v unless v already holds a later time.
func storeLater(v *atomic.Int64, ns int64) {
	for {
		old := v.Load()
		if old >= ns || v.CompareAndSwap(old, ns) {
			return
		}
	}
}

// Rates are the worker's learned service rates.
func (c *Counters) Rates() *Rates { return &c.rates }

// LastDispatch is the time of the latest dispatch, or the zero time.
func (c *Counters) LastDispatch() time.Time {
	ns := c.lastDispatch.Load()
	if ns == 0 {
		return time.Time{}
	}
	return time.Unix(0, ns)
}
