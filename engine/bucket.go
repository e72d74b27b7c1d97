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
