package engine

// Attempt asks one bucket for its complete selection. Implementations are the direct call
// (Bucket.PickEngines) or a round trip to the bucket's actor.
type Attempt func(b *Bucket) (BucketPick, error)

// AttemptObserver is told of every bucket attempt of a selection, in order: the bucket, and
// its complete selection or why it had none (a *PickError). It runs on the selecting
// goroutine, after the attempt; tracing records the attempts with it
// (BucketRequest.Observer).
type AttemptObserver interface {
	BucketAttempted(b *Bucket, pick BucketPick, err error)
}

// SelectEngines runs the bucket loop over buckets in order (POLICY_DESIGN sections 2 and 3):
// the first complete selection wins; missing candidates and admission rejections move on to
// the next bucket, where every required engine is picked again; any other failure (invalid
// signal or configuration, a pick outside the candidates, overload, timeout, internal) stops
// the loop and is returned as is. Exhaustion returns NoAdmissibleEngine carrying every
// admission rejection accumulated, or, when there was none, the last stage-specific failure.
// An empty bucket list is NoMatchingBucket.
//
// A retried request (req.Retry set by RetryAfter) resumes at the bucket its failed attempt
// was picked from, so the same bucket is asked first and then only the compatible ones its
// attempts have not asked (the order may differ between attempts); its groups leave out the engines that failed (EngineGroup.Pick). Every attempt is
// still one complete selection from one bucket, so a prefill/decode pair never mixes
// buckets. req may be nil (a first attempt).
func SelectEngines(buckets []*Bucket, req *BucketRequest, attempt Attempt) (BucketPick, error) {
	if len(buckets) == 0 {
		return BucketPick{}, &PickError{Outcome: OutcomeNoMatchingBucket, Detail: "no bucket supports the requested length"}
	}
	at, perr := resume(buckets, req)
	if perr != nil {
		return BucketPick{}, perr
	}
	var (
		rejections []Rejection
		last       *PickError
	)
	// The loop's order: a retry's failed bucket first (at), then the others in order.
	for i := -1; i < len(buckets); i++ {
		var b *Bucket
		switch {
		case i < 0 && at < 0:
			continue
		case i < 0:
			b = buckets[at]
		case at >= 0 && (i == at || req.Retry.skips(i, at, buckets[i].ID)):
			continue
		default:
			b = buckets[i]
		}
		pick, err := attempt(b)
		if req != nil && req.Observer != nil {
			// Slow path: the selection is traced. The pick goes by value: a pointer would
			// move every selection to the heap, traced or not.
			req.Observer.BucketAttempted(b, pick, err)
		}
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
		if req != nil {
			req.Retry.asked.add(b.ID)
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
