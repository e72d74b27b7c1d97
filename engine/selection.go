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
//
// A retried request (req.Retry set by RetryAfter) resumes at the bucket its failed attempt
// was picked from, so the same bucket is asked first and then only the later compatible
// ones; its groups leave out the engines that failed (EngineGroup.Pick). Every attempt is
// still one complete selection from one bucket, so a prefill/decode pair never mixes
// buckets. req may be nil (a first attempt).
func SelectEngines(buckets []*Bucket, req *BucketRequest, attempt Attempt) (BucketPick, error) {
	if len(buckets) == 0 {
		return BucketPick{}, &PickError{Outcome: OutcomeNoMatchingBucket, Detail: "no bucket supports the requested length"}
	}
	buckets, perr := resume(buckets, req)
	if perr != nil {
		return BucketPick{}, perr
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
