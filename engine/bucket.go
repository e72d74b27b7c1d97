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
	// the picked decode engine alone, when that engine can prefill (see PickStage).
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

// Check reports a bucket that cannot select: a plain bucket without its group, or a PD
// bucket without its decode group (OutcomeInvalidConfiguration); nil otherwise.
func (b *Bucket) Check() *PickError {
	switch {
	case !b.IsPD() && b.Plain == nil:
		return pickErr(OutcomeInvalidConfiguration, StagePlain, b.ID, "bucket has no groups")
	case b.IsPD() && b.Decode == nil:
		return pickErr(OutcomeInvalidConfiguration, StageDecode, b.ID, "PD bucket has no decode group")
	}
	return nil
}

// FirstStage is the stage whose group picks first: plain, prefill, or decode when the PD
// bypass is on.
func (b *Bucket) FirstStage() Stage {
	switch {
	case !b.IsPD():
		return StagePlain
	case b.BypassBelow > 0:
		return StageDecode
	}
	return StagePrefill
}

// PickStage is one step of the bucket's selection for req: stage's group picks and the pick
// is recorded in sel (which holds the earlier steps' picks). It returns the stage that picks
// next, with more false once sel is complete. It uses only stage's group, which must be used
// by one goroutine at a time; check the bucket first (Check).
//
// This is the one place a bucket's selection is defined (the bucket and group actors run it,
// one stage on each stage's group actor):
//
//   - plain: the plain group picks.
//   - PD: the prefill group picks, then the decode group picks among the decode engines
//     compatible with that prefill engine (Compat). A decode failure, no compatible decode
//     engine included, discards the tentative prefill pick; failures keep their stage.
//   - PD with the bypass on (BypassBelow > 0): the decode group picks first; when its engine
//     can prefill and the request's uncached prefill on it is below BypassBelow, the request
//     goes to that engine alone (Bypass, the pick in Plain) and the prefill group is not
//     asked. Otherwise the prefill group picks among the engines compatible with that decode
//     engine and the pair is complete.
//
// Every pick leaves out the engines a retried request excludes and takes its DP rank
// (EngineGroup.Pick); both engines of a pair come from this bucket.
func (b *Bucket) PickStage(reg *Registry, req *BucketRequest, stage Stage, sel *BucketPick) (next Stage, more bool, err error) {
	sel.BucketID = b.ID
	bypass := b.BypassBelow > 0
	switch stage {
	case StagePlain:
		p, err := b.Plain.Pick(reg, b.ID, req)
		if err != nil {
			return 0, false, err
		}
		sel.Plain = p
		return 0, false, nil
	case StagePrefill:
		if bypass { // the decode engine was picked first
			p, err := b.Prefill.PickFor(reg, b.ID, req, sel.Decode.Worker, b.Compat)
			if err != nil {
				sel.Decode.AbandonAdapter() // the pair is not made: its slot is free again
				return 0, false, err
			}
			sel.Prefill = p
			return 0, false, nil
		}
		p, err := b.Prefill.Pick(reg, b.ID, req)
		if err != nil {
			return 0, false, err
		}
		sel.Prefill = p
		return StageDecode, true, nil
	default:
		if bypass {
			p, err := b.Decode.Pick(reg, b.ID, req)
			if err != nil {
				return 0, false, err
			}
			sel.Decode = p // before the bypass test: a panic there finds the pick, and its slot, in sel
			if Bypasses(req, p.Worker, b.BypassBelow) {
				*sel = BucketPick{BucketID: b.ID, Plain: p, Bypass: true}
				return 0, false, nil
			}
			return StagePrefill, true, nil
		}
		p, err := b.Decode.PickFor(reg, b.ID, req, sel.Prefill.Worker, b.Compat)
		if err != nil {
			sel.Prefill.AbandonAdapter() // the pair is not made: its slot is free again
			return 0, false, err
		}
		sel.Decode = p
		return 0, false, nil
	}
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
