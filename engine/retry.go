package engine

// MaxExcluded is how many engines one request can exclude across its retries: two per failed
// attempt (a prefill/decode pair) for up to eight retries. config.MaxRetries keeps the
// configured retry count within it.
const MaxExcluded = 16

// Exclusions is the set of engines that failed for one request. It is a fixed array, so a
// request carries it without allocating, and the empty set (the first attempt) costs one
// length check per group pick. Engines are compared by identity: a worker removed and added
// again is a new *Worker and is not excluded.
type Exclusions struct {
	n int
	w [MaxExcluded]*Worker
}

// Add excludes w and reports whether w is now excluded: false when w is nil or the set is
// full (MaxExcluded engines), in which case nothing changed.
func (e *Exclusions) Add(w *Worker) bool {
	if w == nil {
		return false
	}
	if e.Has(w) {
		return true
	}
	if e.n == len(e.w) {
		return false
	}
	e.w[e.n] = w
	e.n++
	return true
}

// Has reports whether w is excluded.
func (e *Exclusions) Has(w *Worker) bool {
	for _, x := range e.w[:e.n] {
		if x == w {
			return true
		}
	}
	return false
}

// Len is the number of excluded engines.
func (e *Exclusions) Len() int { return e.n }

// Retry is what a retried request carries into the bucket loop (the retry rule): the bucket
// its failed attempt was picked from, where the loop resumes, and the engines that failed for
// it, which every group leaves out of its candidates. The zero value is a first attempt.
type Retry struct {
	// Bucket is the ID of the bucket the failed dispatch was picked from; "" on the first
	// attempt.
	Bucket string
	// Excluded are the engines that failed for this request.
	Excluded Exclusions
}

// RetryAfter records that the dispatch of pick failed on its engine of stage failed, so that
// the next selection for r re-runs the pick in pick's bucket first, without that engine, and
// then in the later compatible buckets (never the earlier ones). For a plain pick the stage
// is ignored; for a prefill/decode pick it names the side that failed (call once per side
// when both did), and the next selection picks a whole new pair in one bucket.
//
// It reports false when the engine could not be excluded (the set is full, or pick holds no
// engine of that stage): the caller must not retry then, or the same engine could be picked
// again.
func (r *BucketRequest) RetryAfter(pick *BucketPick, failed Stage) bool {
	var w *Worker
	switch {
	case !pick.IsPD():
		w = pick.Plain.Worker
	case failed == StagePrefill:
		w = pick.Prefill.Worker
	case failed == StageDecode:
		w = pick.Decode.Worker
	}
	if !r.Retry.Excluded.Add(w) {
		return false
	}
	r.Retry.Bucket = pick.BucketID
	return true
}

// resume returns the part of buckets the bucket loop runs for req: all of them on a first
// attempt; from the bucket of the failed attempt on for a retry. A retry whose bucket is not
// among buckets (the caller resolved another request's buckets) is an invalid signal.
func resume(buckets []*Bucket, req *BucketRequest) ([]*Bucket, *PickError) {
	if req == nil || req.Retry.Bucket == "" {
		return buckets, nil
	}
	for i, b := range buckets {
		if b.ID == req.Retry.Bucket {
			return buckets[i:], nil
		}
	}
	return nil, &PickError{Outcome: OutcomeInvalidSignal, BucketID: req.Retry.Bucket,
		Detail: "a retry resumes at a bucket that is not compatible with the request"}
}
