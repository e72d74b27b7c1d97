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
	// asked are the buckets the request's attempts asked without getting a selection; a
	// retry does not ask them again. The bucket order may change between attempts
	// (bucket_order slo), so the retry rule keeps the set, not a position.
	asked askedBuckets
}

// maxAsked bounds the buckets one request remembers as asked; past it, a retry falls back to
// the buckets after the failed one in the current order.
const maxAsked = 16

// askedBuckets is a fixed set of bucket IDs, carried without allocating.
type askedBuckets struct {
	n    int
	full bool
	ids  [maxAsked]string
}

func (a *askedBuckets) add(id string) {
	if a.has(id) {
		return
	}
	if a.n == len(a.ids) {
		a.full = true
		return
	}
	a.ids[a.n] = id
	a.n++
}

func (a *askedBuckets) has(id string) bool {
	for _, x := range a.ids[:a.n] {
		if x == id {
			return true
		}
	}
	return false
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

// resume returns where the bucket loop starts for req: -1 on a first attempt (every bucket in
// order); for a retry, the index in buckets of the failed attempt's bucket, which is asked
// first, then the others its attempts have not asked (Retry.skips). A retry whose bucket is
// not among buckets (the caller resolved another request's buckets) is an invalid signal.
func resume(buckets []*Bucket, req *BucketRequest) (int, *PickError) {
	if req == nil || req.Retry.Bucket == "" {
		return -1, nil
	}
	for i, b := range buckets {
		if b.ID == req.Retry.Bucket {
			return i, nil
		}
	}
	return -1, &PickError{Outcome: OutcomeInvalidSignal, BucketID: req.Retry.Bucket,
		Detail: "a retry resumes at a bucket that is not compatible with the request"}
}

// skips reports whether a retry resuming at buckets[at] leaves out buckets[i] (id): a bucket
// its attempts asked already; when they asked more than it can remember, every bucket before
// the failed one in this order.
func (r *Retry) skips(i, at int, id string) bool {
	if r.asked.full {
		return i < at
	}
	return r.asked.has(id)
}
