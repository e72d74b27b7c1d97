package engine

// Attempt asks one bucket for its complete selection. Implementations are the direct call
// (Bucket.PickEngines) or a round trip to the bucket's actor.
type Attempt func(b *Bucket) (BucketPick, error)

// SelectEngines runs the bucket loop over buckets in order (POLICY_DESIGN sections 2 and 3):
// the first complete selection wins; missing candidates and admission rejections move on to
// the next bucket, where every required engine is picked again; any other failure (invalid
// signal or configuration, a pick outside the candidates, overload, timeout, internal) stops
// the loop and is returned as is. Exhaustion returns NoAdmissibleEngine carrying every
// admission rejection accumulated, or, when there was none, the last stage-specific failure.
// An empty bucket list is NoMatchingBucket.
func SelectEngines(buckets []*Bucket, attempt Attempt) (BucketPick, error) {
	if len(buckets) == 0 {
		return BucketPick{}, &PickError{Outcome: OutcomeNoMatchingBucket, Detail: "no bucket supports the requested length"}
	}
	var (
		rejections []Rejection
		last       *PickError
	)
	for _, b := range buckets {
		pick, err := attempt(b)
		if err == nil {
			return pick, nil
		}
		pe, ok := err.(*PickError)
		if !ok {
			return BucketPick{}, &PickError{Outcome: OutcomeInternal, BucketID: b.ID, Err: err}
		}
		if !pe.Advances() {
			return BucketPick{}, pe
		}
		rejections = append(rejections, pe.Rejections...)
		last = pe
	}
	if len(rejections) > 0 {
		return BucketPick{}, &PickError{
			Outcome:    OutcomeNoAdmissibleEngine,
			Stage:      last.Stage,
			Rejections: rejections,
			Detail:     "every compatible bucket rejected the request",
		}
	}
	return BucketPick{}, last
}
