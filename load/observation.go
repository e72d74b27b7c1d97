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
	rates         Rates
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
// prefill whose first token has not arrived yet, and the sum of their uncached prompt
// tokens.
func (c *Counters) PendingPrefill() (requests, tokens int64) {
	return c.pendingReqs.Load(), c.pendingTokens.Load()
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
