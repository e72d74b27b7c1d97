package engine

import "math"

// Unbounded marks a bucket limit without an upper bound.
const Unbounded int64 = math.MaxInt64

// Bucket is one token-length bucket: an inclusive input range, a context capacity, a rank,
// and either one plain group or a prefill and a decode group. A PD selection always takes
// both engines from the same bucket.
type Bucket struct {
	ID         string
	Rank       int
	MinInput   int64
	MaxInput   int64 // Unbounded when open-ended
	MaxContext int64 // Unbounded when open-ended

	Plain   *EngineGroup
	Prefill *EngineGroup
	Decode  *EngineGroup
	// Compat is a PD bucket's pairing rule: the decode engine is picked among those
	// compatible with the chosen prefill engine. Empty: any pair.
	Compat Compatibility
	// BypassBelow, when positive, sends a PD request whose uncached prefill is below it to
	// the picked decode engine alone, when that engine can prefill (see PickEngines).
	BypassBelow int64
}

// IsPD reports whether the bucket selects a prefill/decode pair.
func (b *Bucket) IsPD() bool { return b.Prefill != nil }

// Capacity is the lesser of the input upper bound and the context capacity.
func (b *Bucket) Capacity() int64 { return min(b.MaxInput, b.MaxContext) }

// Groups returns the bucket's groups (one for plain, prefill then decode for PD).
func (b *Bucket) Groups() []*EngineGroup {
	if b.IsPD() {
		return []*EngineGroup{b.Prefill, b.Decode}
	}
	return []*EngineGroup{b.Plain}
}

// BucketPick is a complete selection from one bucket: a plain engine, or a prefill and a
// decode engine.
type BucketPick struct {
	BucketID string
	Plain    Pick
	Prefill  Pick
	Decode   Pick
	// Order is the rule that ordered the compatible buckets the selection came from.
	Order BucketOrder
	// Bypass marks a PD bucket's request sent to its decode engine alone: Plain holds the
	// decode group's pick, dispatched like a plain request.
	Bypass bool
}

// IsPD reports whether the selection is a prefill/decode pair.
func (p *BucketPick) IsPD() bool { return p.Prefill.Worker != nil }

// PickEngines returns the bucket's complete selection for req: the plain pick, or the
// prefill pick then the decode pick among the decode engines compatible with it (Compat).
// A decode failure, no compatible decode engine included, discards the tentative prefill
// pick; failures keep their stage. The bucket and its groups must be used by one goroutine at a time.
func (b *Bucket) PickEngines(reg *Registry, req *BucketRequest) (BucketPick, error) {
	if !b.IsPD() {
		if b.Plain == nil {
			return BucketPick{}, pickErr(OutcomeInvalidConfiguration, StagePlain, b.ID, "bucket has no groups")
		}
		p, err := b.Plain.Pick(reg, b.ID, req)
		if err != nil {
			return BucketPick{}, err
		}
		return BucketPick{BucketID: b.ID, Plain: p}, nil
	}
	if b.Decode == nil {
		return BucketPick{}, pickErr(OutcomeInvalidConfiguration, StageDecode, b.ID, "PD bucket has no decode group")
	}
	if b.BypassBelow > 0 {
		return b.pickBypass(reg, req)
	}
	pp, err := b.Prefill.Pick(reg, b.ID, req)
	if err != nil {
		return BucketPick{}, err
	}
	dp, err := b.Decode.PickFor(reg, b.ID, req, pp.Worker, b.Compat)
	if err != nil {
		return BucketPick{}, err
	}
	return BucketPick{BucketID: b.ID, Prefill: pp, Decode: dp}, nil
}

// pickBypass is PickEngines for a PD bucket with the bypass on: the decode group picks
// first; when its engine can prefill and the request's uncached prefill on it is below
// BypassBelow, the request goes to that engine alone (Bypass, the pick in Plain) and the
// prefill group is not asked. Otherwise the prefill group picks among the engines compatible
// with that decode engine (Compat) and the pair is complete.
// Both engines still come from this bucket.
func (b *Bucket) pickBypass(reg *Registry, req *BucketRequest) (BucketPick, error) {
	dp, err := b.Decode.Pick(reg, b.ID, req)
	if err != nil {
		return BucketPick{}, err
	}
	if Bypasses(req, dp.Worker, b.BypassBelow) {
		return BucketPick{BucketID: b.ID, Plain: dp, Bypass: true}, nil
	}
	pp, err := b.Prefill.PickFor(reg, b.ID, req, dp.Worker, b.Compat)
	if err != nil {
		return BucketPick{}, err
	}
	return BucketPick{BucketID: b.ID, Prefill: pp, Decode: dp}, nil
}

// Bypasses reports whether req goes to decode engine w alone under a bypass threshold of
// below tokens: w can prefill and req's uncached prefill on it is below the threshold.
func Bypasses(req *BucketRequest, w *Worker, below int64) bool {
	return below > 0 && w.CanPrefill && UncachedPrefill(req, w) < below
}

// UncachedPrefill is the prompt tokens w would have to prefill for req: the input less the
// prefix the request's prefix lookup says w holds, or the whole input when the lookup is
// missing or failed.
func UncachedPrefill(req *BucketRequest, w *Worker) int64 {
	if req.Prefix == nil {
		return req.InputTokens
	}
	if ok, _, _ := req.Prefix.Status(); !ok {
		return req.InputTokens
	}
	return max(req.InputTokens-req.Prefix.MatchedTokens(w.ID), 0)
}
