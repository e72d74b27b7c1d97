package engine

import (
	"cmp"
	"fmt"
	"slices"

	"switchyard/load"
)

// BucketResolver holds one model's buckets in selection order and filters them by request
// length. It never looks at workers or policies. It is immutable and safe for concurrent use.
type BucketResolver struct {
	model   string
	buckets []*Bucket // ordered by capacity, then rank, then ID
	// slo, when set, orders the buckets of a request with latency targets by expected
	// violation (OrderBySLO), reading loads.
	slo   bool
	loads LoadReader
}

// ResolverOption configures a BucketResolver.
type ResolverOption func(*BucketResolver)

// WithSLOOrder makes Order apply the slo rule (OrderBySLO) with the engine loads of loads
// (nil: none reported).
func WithSLOOrder(loads LoadReader) ResolverOption {
	return func(r *BucketResolver) { r.slo, r.loads = true, loads }
}

// NewBucketResolver orders buckets by ascending capacity (the lesser of the input upper bound
// and the context capacity; unbounded last), then rank, then ID.
func NewBucketResolver(model string, buckets []*Bucket, opts ...ResolverOption) *BucketResolver {
	sorted := slices.Clone(buckets)
	slices.SortStableFunc(sorted, func(a, b *Bucket) int {
		if c := cmp.Compare(a.Capacity(), b.Capacity()); c != 0 {
			return c
		}
		if c := cmp.Compare(a.Rank, b.Rank); c != 0 {
			return c
		}
		return cmp.Compare(a.ID, b.ID)
	})
	r := &BucketResolver{model: model, buckets: sorted}
	for _, o := range opts {
		o(r)
	}
	return r
}

// Order applies the resolver's bucket order to buckets, a Resolve result, in place, and
// returns the rule that ordered them: OrderSLO when the resolver orders by SLO and req
// carries a target, else OrderCapacity (Resolve's order, unchanged). reg is the registry
// the estimates read. It never removes a bucket.
func (r *BucketResolver) Order(buckets []*Bucket, req *BucketRequest, reg *Registry) BucketOrder {
	if !r.slo || !req.SLO.Any() {
		return OrderCapacity
	}
	var snap *load.Snapshot
	if r.loads != nil {
		snap = r.loads.Load()
	}
	OrderBySLO(buckets, req, reg, snap)
	return OrderSLO
}

// Model returns the resolver's model.
func (r *BucketResolver) Model() string { return r.model }

// Buckets returns every bucket in selection order. The caller must not modify the slice.
func (r *BucketResolver) Buckets() []*Bucket { return r.buckets }

// Resolve appends to dst the buckets compatible with a request of input tokens and expected
// peak (input plus requested output; -1 when the output budget is unknown), in selection
// order. A bucket is compatible when its inclusive input range holds input and its context
// capacity holds the peak (or the input when the peak is unknown). A known peak below the
// input, or a negative input, is an invalid signal. An empty result is not an error here; the
// caller maps it to NoMatchingBucket.
func (r *BucketResolver) Resolve(dst []*Bucket, input, peak int64) ([]*Bucket, error) {
	if input < 0 {
		return dst, &PickError{Outcome: OutcomeInvalidSignal, Detail: fmt.Sprintf("negative input length %d", input)}
	}
	need := input
	if peak >= 0 {
		if peak < input {
			return dst, &PickError{Outcome: OutcomeInvalidSignal,
				Detail: fmt.Sprintf("expected peak %d is below input length %d", peak, input)}
		}
		need = peak
	}
	for _, b := range r.buckets {
		if input < b.MinInput || input > b.MaxInput || need > b.MaxContext {
			continue
		}
		dst = append(dst, b)
	}
	return dst, nil
}
