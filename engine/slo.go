package engine

import (
	"math"
	"time"

	"switchyard/load"
)

// SLOTargets are a request's latency targets; a zero target is none.
type SLOTargets struct {
	// TTFT is the time-to-first-token target.
	TTFT time.Duration
	// TPOT is the time-per-output-token target.
	TPOT time.Duration
}

// Any reports whether some target is set.
func (t SLOTargets) Any() bool { return t.TTFT > 0 || t.TPOT > 0 }

// BucketOrder is the rule that orders a request's compatible buckets.
type BucketOrder uint8

// Bucket orders.
const (
	// OrderCapacity is the resolver's order: ascending capacity, then rank, then ID.
	OrderCapacity BucketOrder = iota
	// OrderSLO puts the buckets expected to meet the request's targets first (in capacity
	// order among themselves), then the others by least expected violation.
	OrderSLO
)

// String returns the order's configuration name.
func (o BucketOrder) String() string {
	if o == OrderSLO {
		return "slo"
	}
	return "capacity"
}

// BucketEstimate is what a request can expect of a bucket: the best time to first token
// among its first-stage engines (plain, or prefill) and the best time per output token
// among its last-stage engines (plain, or decode), in seconds. An engine the router knows
// nothing of yet counts as 0 (it may be fast; sending it requests is how its rates are
// learned), and then the figure is not Known.
type BucketEstimate struct {
	TTFT, TPOT           float64
	KnownTTFT, KnownTPOT bool
	// Engines is false when the bucket has no healthy engine in one of its groups.
	Engines bool
}

// Violation is how far the estimate misses t: the sum over the set targets of the
// relative excess (estimate/target − 1, or 0 when met). A bucket without engines misses by
// +Inf.
func (e *BucketEstimate) Violation(t SLOTargets) float64 {
	if !e.Engines {
		return math.Inf(1)
	}
	v := 0.0
	if t.TTFT > 0 {
		v += max(e.TTFT/t.TTFT.Seconds()-1, 0)
	}
	if t.TPOT > 0 {
		v += max(e.TPOT/t.TPOT.Seconds()-1, 0)
	}
	return v
}

// UncachedTokens is the prompt tokens of req that w would have to prefill: its input less
// the prefix w already holds when the request made a prefix lookup (cache_aware), at least
// one token (an engine always computes one).
func UncachedTokens(req *BucketRequest, w *Worker) int64 {
	in := max(req.InputTokens, 0)
	if req.Prefix != nil {
		if ok, _, _ := req.Prefix.Status(); ok {
			in -= min(max(req.Prefix.MatchedTokens(w.ID), 0), in)
		}
	}
	return max(in, 1)
}

// Estimate returns what req can expect of b with the workers of reg and the load of snap
// (nil: unknown). It reads only immutable group facts, atomics and snapshots, so any
// goroutine may call it; it does not allocate. Each engine's load is observed once.
//
// In a PD bucket with the bypass on, a decode engine that would take the request alone
// (Bypasses) prefills it itself: its own time to first token counts, and the prefill
// group's only when some decode engine would not; a bucket whose prefill group has no
// engine then still serves the requests the bypass takes.
func (b *Bucket) Estimate(reg *Registry, req *BucketRequest, snap *load.Snapshot) BucketEstimate {
	var e BucketEstimate
	if reg == nil {
		return e
	}
	if !b.IsPD() {
		if b.Plain == nil {
			return e
		}
		e.Engines, _, _ = scan(&e, reg, b.Plain, snap, req, true, true, 0)
		return e
	}
	if b.Prefill == nil || b.Decode == nil {
		return e
	}
	var pe BucketEstimate
	okP, _, _ := scan(&pe, reg, b.Prefill, snap, req, true, false, 0)
	okD, bypassed, n := scan(&e, reg, b.Decode, snap, req, false, true, b.BypassBelow)
	switch {
	case bypassed == 0:
		e.TTFT, e.KnownTTFT = pe.TTFT, pe.KnownTTFT
	case bypassed < n && okP:
		// Slow path: some decode engines would take the request alone, others not.
		e.TTFT, e.KnownTTFT = min(e.TTFT, pe.TTFT), e.KnownTTFT && pe.KnownTTFT
	}
	e.Engines = okD && (okP || bypassed > 0)
	return e
}

// scan sets e's TTFT (ttft) and TPOT (tpot) to the lowest estimates over g's healthy
// members, with whether every member had one, and reports whether g had any member that
// has not failed for the request (a retry excludes those). The members of a snapshot are
// computed once (HealthyMembers), so a request costs one load observation per member.
// With bypass > 0 (a PD bucket's decode group) the TTFT is that of the members that would
// take the request alone (Bypasses); bypassed counts them, of the n members scanned.
func scan(e *BucketEstimate, reg *Registry, g *EngineGroup, snap *load.Snapshot, req *BucketRequest, ttft, tpot bool,
	bypass int64) (ok bool, bypassed, n int) {
	ws := g.HealthyMembers(reg)
	if len(ws) == 0 {
		return false, 0, 0
	}
	bestT, bestP := math.Inf(1), math.Inf(1)
	knownT, knownP := true, true
	ex := &req.Retry.Excluded
	for _, w := range ws {
		if ex.Len() > 0 && ex.Has(w) {
			continue // failed for this request: the retry will not pick it
		}
		n++
		o := observe(snap, w, req.Now)
		if ttft || bypass > 0 && Bypasses(req, w, bypass) {
			if !ttft {
				bypassed++
			}
			v, ok := load.EstimateTTFT(&o, w.Counters, UncachedTokens(req, w), req.Now)
			if !ok {
				v, knownT = 0, false
			}
			bestT = min(bestT, v)
		}
		if tpot {
			v, ok := load.EstimateTPOT(&o, w.Counters)
			if !ok {
				v, knownP = 0, false
			}
			bestP = min(bestP, v)
		}
	}
	if n == 0 {
		return false, 0, 0
	}
	if ttft || bypassed > 0 {
		e.TTFT, e.KnownTTFT = bestT, knownT
	}
	if tpot {
		e.TPOT, e.KnownTPOT = bestP, knownP
	}
	return true, bypassed, n
}

// maxOrdered is how many buckets OrderBySLO orders without allocating.
const maxOrdered = 16

// OrderBySLO reorders buckets (in the resolver's capacity order) for req's targets: the
// buckets whose estimate meets every target first, keeping their order, then the others by
// least violation, ties in their order. It only orders: every bucket stays in the list and
// the bucket loop still tries them one after the other. Without targets nothing moves.
func OrderBySLO(buckets []*Bucket, req *BucketRequest, reg *Registry, snap *load.Snapshot) {
	if !req.SLO.Any() || len(buckets) < 2 {
		return
	}
	var local [maxOrdered]float64
	v := local[:0]
	if len(buckets) > maxOrdered {
		v = make([]float64, 0, len(buckets)) // slow path: an unusually long bucket list
	}
	for _, b := range buckets {
		e := b.Estimate(reg, req, snap)
		v = append(v, e.Violation(req.SLO))
	}
	// Stable insertion sort by violation: the lists are a handful of buckets long.
	for i := 1; i < len(buckets); i++ {
		for j := i; j > 0 && v[j] < v[j-1]; j-- {
			v[j], v[j-1] = v[j-1], v[j]
			buckets[j], buckets[j-1] = buckets[j-1], buckets[j]
		}
	}
}
