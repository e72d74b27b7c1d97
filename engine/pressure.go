package engine

import (
	"cmp"
	"math"

	"switchyard/load"
)

// loadKey is one engine's pressure as the load policies judge it: its observation corrected
// for the dispatches the router made since the report was captured, plus router-local
// in-flight. Keys compare lexicographically (lessLoad over a set, comparePressure for a pair).
type loadKey struct {
	queueMs  float64
	uncached int64
	waiting  int64
	running  int64
	kvUsage  float64
	used     int64
	inflight int64
	// pending is the number of dispatches since the report (0 without a native report).
	pending int64
	native  bool
	// fields are the reported fields whose corrected value is known: a metric that cannot be
	// corrected for pending dispatches is cleared here and is not compared.
	fields load.Field
}

// keyOf interprets w's observation o (POLICY_DESIGN section 4, with the dispatch correction
// of its follow-ups). Without a fresh, complete native report only in-flight is known.
// With one, the dispatches the router made to w since the report was ingested
// (Counters.Dispatched − Observation.DispatchesAtCapture) are not in the report yet:
//   - each counts as one more waiting request;
//   - each adds perDispatch uncached prompt tokens (the caller's estimate, normally the
//     current request's input tokens) to the waiting uncached tokens; with no estimate
//     (perDispatch <= 0) the uncached tokens cannot be corrected and are not compared;
//   - the estimated prefill queue grows at the report's own rate, queueMs per waiting
//     uncached token; when that rate is unknown (no queued tokens in the report) or the
//     uncached tokens were not corrected, the queue estimate is not compared.
//
// Running requests, KV usage and used tokens are taken as reported. With no dispatch since
// the report every metric is exactly as reported. keyOf adds no counter of its own: it reads
// the worker's dispatch and in-flight counters.
func keyOf(w *Worker, o *load.Observation, perDispatch int64) loadKey {
	k := loadKey{inflight: w.Counters.InFlight(), native: o.Native()}
	if !k.native {
		return k
	}
	k.fields = o.Fields
	if d := w.Counters.Dispatched(); d > o.DispatchesAtCapture {
		k.pending = int64(min(d-o.DispatchesAtCapture, math.MaxInt64))
	}
	k.queueMs = o.PrefillQueueMs
	k.uncached = o.WaitingUncachedTokens
	k.waiting = satAdd(o.Waiting, k.pending)
	k.running = o.Running
	k.kvUsage = o.KVUsage()
	k.used = o.UsedTokens
	if k.pending == 0 {
		return k
	}
	if perDispatch <= 0 || !o.Has(load.HasWaitingUncached) {
		k.fields &^= load.HasWaitingUncached | load.HasPrefillQueue
		return k
	}
	extra := satMul(k.pending, perDispatch)
	k.uncached = satAdd(o.WaitingUncachedTokens, extra)
	if o.Has(load.HasPrefillQueue) {
		if o.WaitingUncachedTokens > 0 && o.PrefillQueueMs > 0 {
			k.queueMs = o.PrefillQueueMs * (float64(k.uncached) / float64(o.WaitingUncachedTokens))
		} else {
			k.fields &^= load.HasPrefillQueue
		}
	}
	return k
}

// perDispatchTokens is the uncached-token estimate of one pending dispatch: the current
// request's input tokens, or 0 when unknown.
func perDispatchTokens(req *PickRequest) int64 {
	if req == nil || req.BucketRequest == nil {
		return 0
	}
	return max(req.InputTokens, 0)
}

// comparePressure orders two engines by corrected stage pressure (keyOf): negative when a is
// less loaded than b, positive when more, 0 on a tie of every compared metric. Both keys
// must be native.
//
// Plain and prefill compare the estimated prefill queue time when both keys have it, then
// waiting uncached tokens when both have them, then waiting requests (dispatches since the
// report included), then running requests. Decode compares waiting requests (dispatches
// since the report included), running requests, KV usage fraction, then used KV tokens.
func comparePressure(stage Stage, a, b *loadKey) int {
	if stage == StageDecode {
		if c := cmp.Compare(a.waiting, b.waiting); c != 0 {
			return c
		}
		if c := cmp.Compare(a.running, b.running); c != 0 {
			return c
		}
		if c := cmp.Compare(a.kvUsage, b.kvUsage); c != 0 {
			return c
		}
		return cmp.Compare(a.used, b.used)
	}
	if a.fields&b.fields&load.HasPrefillQueue != 0 {
		if c := cmp.Compare(a.queueMs, b.queueMs); c != 0 {
			return c
		}
	}
	if a.fields&b.fields&load.HasWaitingUncached != 0 {
		if c := cmp.Compare(a.uncached, b.uncached); c != 0 {
			return c
		}
	}
	if c := cmp.Compare(a.waiting, b.waiting); c != 0 {
		return c
	}
	return cmp.Compare(a.running, b.running)
}

// compareInFlight orders two workers by router-local in-flight requests.
func compareInFlight(a, b *Worker) int {
	return cmp.Compare(a.Counters.InFlight(), b.Counters.InFlight())
}

func satAdd(a, b int64) int64 {
	if b > 0 && a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

func satMul(a, b int64) int64 {
	if a <= 0 || b <= 0 {
		return 0
	}
	if a > math.MaxInt64/b {
		return math.MaxInt64
	}
	return a * b
}
