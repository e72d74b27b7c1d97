package engine

// AttemptObserver is told of every bucket attempt of a selection, in order: the bucket, and
// its complete selection or why it had none (a *PickError). It runs on the selecting
// goroutine, after the attempt; tracing records the attempts with it
// (BucketRequest.Observer).
type AttemptObserver interface {
	BucketAttempted(b *Bucket, pick BucketPick, err error)
}

// BucketLoop is the bucket loop over a request's compatible buckets in order (POLICY_DESIGN
// sections 2 and 3): the first complete selection wins; missing candidates and admission
// rejections move on to the next bucket, where every required engine is picked again; any
// other failure (invalid signal or configuration, a pick outside the candidates, overload,
// timeout, internal) stops the loop and is returned as is. Exhaustion returns
// NoAdmissibleEngine carrying every admission rejection accumulated, or, when there was none,
// the last stage-specific failure. An empty bucket list is NoMatchingBucket.
//
// A retried request (req.Retry set by RetryAfter) resumes at the bucket its failed attempt
// was picked from, so the same bucket is asked first and then only the compatible ones its
// attempts have not asked (the order may differ between attempts); its groups leave out the
// engines that failed (EngineGroup.Pick). Every attempt is still one complete selection from
// one bucket, so a prefill/decode pair never mixes buckets.
//
// The caller asks each bucket Next returns for its complete selection (Bucket.FirstStage and
// PickStage; in the router, on the bucket's actors) and reports it to Attempted, which says
// whether the loop is over:
//
//	loop := engine.StartBucketLoop(buckets, req)
//	for b := loop.Next(); b != nil; b = loop.Next() {
//		pick, err := selectFrom(b)
//		if done, err := loop.Attempted(b, pick, err); done {
//			return pick, err // pick is zero when err is not nil
//		}
//	}
//	return engine.BucketPick{}, loop.Err()
//
// A BucketLoop belongs to one goroutine. It records in req.Retry the buckets asked, and tells
// req.Observer of every attempt; req may be nil (a first attempt, not traced).
type BucketLoop struct {
	buckets    []*Bucket
	req        *BucketRequest
	at         int // a retry's failed bucket, asked first; -1 for none
	i          int // the next position in buckets; -1 while at is still to be asked
	rejections []Rejection
	last       *PickError
	err        *PickError // the error that ended the loop early
	// slotsInUse: a bucket failed for ErrAdapterSlotsInUse.
	slotsInUse bool
}

// StartBucketLoop starts the loop over buckets for req.
func StartBucketLoop(buckets []*Bucket, req *BucketRequest) BucketLoop {
	l := BucketLoop{buckets: buckets, req: req, at: -1, i: -1}
	if len(buckets) == 0 {
		l.err = &PickError{Outcome: OutcomeNoMatchingBucket, Detail: "no bucket supports the requested length"}
		return l
	}
	l.at, l.err = resume(buckets, req)
	return l
}

// Next returns the next bucket to ask, or nil when the loop is over: then Err says why.
func (l *BucketLoop) Next() *Bucket {
	if l.err != nil {
		return nil
	}
	// The order: a retry's failed bucket first (at), then the others in order.
	for ; l.i < len(l.buckets); l.i++ {
		switch {
		case l.i < 0 && l.at < 0:
			continue
		case l.i < 0:
			l.i++
			return l.buckets[l.at]
		case l.at >= 0 && (l.i == l.at || l.req.Retry.skips(l.i, l.at, l.buckets[l.i].ID)):
			continue
		}
		b := l.buckets[l.i]
		l.i++
		return b
	}
	return nil
}

// Attempted records bucket b's attempt: its complete selection pick, or err. It returns
// done true when the selection is over: with a nil error pick is the selection, otherwise
// the error ends it (pick is then zero). With done false the loop goes on to the next bucket.
func (l *BucketLoop) Attempted(b *Bucket, pick BucketPick, err error) (done bool, _ error) {
	if l.req != nil && l.req.Observer != nil {
		// Slow path: the selection is traced. The pick goes by value: a pointer would
		// move every selection to the heap, traced or not.
		l.req.Observer.BucketAttempted(b, pick, err)
	}
	if err == nil {
		return true, nil
	}
	pe, ok := err.(*PickError)
	if !ok {
		l.err = &PickError{Outcome: OutcomeInternal, BucketID: b.ID, Err: err}
		return true, l.err
	}
	if !pe.Advances() {
		l.err = pe
		return true, pe
	}
	if l.req != nil {
		l.req.Retry.asked.add(b.ID)
	}
	l.rejections = append(l.rejections, pe.Rejections...)
	l.last = pe
	l.slotsInUse = l.slotsInUse || pe.Err == ErrAdapterSlotsInUse
	return false, nil
}

// Err is why the loop ended without a selection: the error that stopped it, or, once every
// bucket failed and moved on, NoAdmissibleEngine with every rejection, or the last failure.
// When a bucket failed for ErrAdapterSlotsInUse, the error returned after every bucket
// failed unwraps to it.
func (l *BucketLoop) Err() error {
	switch {
	case l.err != nil:
		return l.err
	case len(l.rejections) > 0:
		e := &PickError{
			Outcome:    OutcomeNoAdmissibleEngine,
			Stage:      l.last.Stage,
			Rejections: l.rejections,
			Detail:     "every compatible bucket rejected the request",
		}
		if l.slotsInUse {
			e.Err = ErrAdapterSlotsInUse
		}
		return e
	case l.last != nil:
		if l.slotsInUse && l.last.Err == nil {
			// Slow path: an earlier bucket's slots were in use, the last failed otherwise.
			e := *l.last
			e.Err = ErrAdapterSlotsInUse
			return &e
		}
		return l.last
	}
	return &PickError{Outcome: OutcomeInternal, Detail: "the bucket loop ended before its last bucket"}
}
