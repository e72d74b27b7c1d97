package engine

import (
	"math"
	"slices"
	"time"

	"switchyard/load"
)

// Expected latency: how the plain and prefill stages weigh load (load_based, power_of_two,
// and cache_aware's latency decision). For each candidate engine e, the request's expected
// time to first token there is
//
//	TTFT(e) = work(e) / rate(e),   work(e) = pending(e) + queued(e) + uncached(e)
//
// work(e) is load.PrefillWork: pending(e) is the uncached prompt tokens of the router's own
// requests sent to e that have no first token yet (current: it covers the prompt e is
// prefilling, which its report counts as running, and every dispatch since the report),
// less what e has done of the one at their head at its learned rate since it began it, at
// most one prompt's worth and nothing while e cannot be prefilling (its running slots full
// of decoding requests, or its report showing them all waiting):
// load.Counters.PendingPrefillLeft, so a long prompt half prefilled counts half.
// queued(e) is what e's last report queued beyond them, uncached(e) the request's prompt
// tokens e does not hold in cache. rate(e) is e's learned prefill rate in tokens per
// second: load.Rates.PrefillSecondsPerToken, e's smoothed time to first token over its
// smoothed prefill work, its fixed part included, so that how the learned line split its
// fit between fixed part and slope does not matter (a slope alone near zero would make e
// look infinitely fast) and a first request of a few tokens does not make e look many
// times slower for dozens of requests. Cache hits, queues and engine speeds are
// thus weighed in one unit. Until every candidate has learned a rate, all are compared by
// work(e) in tokens (equal speeds assumed).
//
// cache_aware's latency decision credits a prefix hit twice more (credit, hitCredits),
// weighted by how busy the group's engines are (weighHits): its score is
// TTFT(e) − 2f × matched(e)/rate(e)
// (TTFT(e) already leaves the matched tokens out), with f = (n+1)/(n+1−b) for n candidates
// of which b have at least the hit's prefill queued ahead of the request (the longest
// prefix any candidate holds). A hit saves the fleet its prefill: that time is not only
// the request's own wait, it is also the wait of every request that will queue behind that
// prefill on the engine that would do it instead, and how many do grows with the fleet's
// prefill utilization ρ as 1/(1−ρ) (a queue's mean number in system, ρ/(1−ρ), plus the
// request itself). ρ is estimated at this arrival as the share of engines whose queue is
// at least as long as the saved prefill, b/(n+1), the arrival itself counted as one more
// sample of an idle engine so that the estimate stays below 1 (f at most n+1); a queue
// shorter than the hit clears within the hit's own prefill time and is counted idle, so
// that small, frequent queues (many short requests sharing a system prompt) leave f near 1
// and their holders do not herd. The second credit is measured, not derived: on the
// trace's simulated engines, with ties going to the holder (tieBefore), it keeps 1.3-1.7
// points more of the holder placement's hits than one credit at 40-85% load, as many as a
// flat three without its request spread (docs/benchmarks.md, "Where gone starts"). An idle
// fleet gives f = 1: an engine holding matched(e) tokens is kept unless its queue exceeds
// another's by more than three times matched(e); with every engine busy, by (2n+3) times.
// load_based and power_of_two score TTFT(e) alone.
//
// Scores within latencySlack of the best engine's TTFT are a tie, broken by the decode load
// the request would join (load.DecodeLoad: the larger of reported running requests and
// router in-flight), then by router in-flight, then by the policy's own order; cache_aware
// breaks them by the longer prefix first (tieBefore): within the margin the expected TTFTs
// are equal within the noise of the learned rates, and the hit is a saving the fleet
// certainly makes.

// weighHits multiplies each key's credit (a held prefix, matched tokens of input) by the
// fleet's hit weight (n+1)/(n+1−b), b the candidates with at least the longest held prefix
// (and at least a token) of prefill queued ahead of the request's own (the request's
// uncached part, at least 1, is the rest of a key's work), and returns the weight.
func weighHits(keys []latencyKey, matched []int64, input int64) float64 {
	hit := int64(1)
	for _, m := range matched {
		hit = max(hit, m)
	}
	busy := 0
	for i := range keys {
		if keys[i].work-float64(max(input-matched[i], 1)) >= float64(hit) {
			busy++
		}
	}
	if busy == 0 {
		return 1
	}
	f := float64(len(keys)+1) / float64(len(keys)+1-busy)
	for i := range keys {
		keys[i].credit *= f
	}
	return f
}

// hitCredits is how many times cache_aware's latency decision credits a held prefix's
// prefill beyond the request's own (each times the fleet's hit weight): see above.
const hitCredits = 2

// latencySlack is the margin, a fraction of the best expected TTFT, within which scores
// count as equal: the learned rates of identical engines differ by noise, and an idle fleet
// must spread its requests by decode load rather than by that noise.
const latencySlack = 0.10

// rateBand is the factor within which learned prefill rates count as equal.
const rateBand = 1.5

// latencyKey is one candidate's expected latency for a request.
type latencyKey struct {
	work     float64 // prefill tokens up to the request's first token
	credit   float64 // tokens credited against the score (a cache hit)
	perToken float64 // seconds per prefill token, when learned
	decode   float64 // requests decoding there with this one
	inflight int64
}

// latencyOf computes w's key for a request with uncached prompt tokens there at now, from
// w's observation o (the zero Observation when unknown) and its counters.
func latencyOf(w *Worker, o *load.Observation, uncached int64, now time.Time) latencyKey {
	k := latencyKey{
		work:     load.PrefillWork(o, w.Counters, uncached, now),
		decode:   load.DecodeLoad(o, w.Counters),
		inflight: w.Counters.InFlight(),
	}
	k.perToken = w.Counters.Rates().PrefillSecondsPerToken()
	return k
}

// timed reports whether the key converts work to time.
func (k *latencyKey) timed() bool { return k.perToken > 0 }

// ttft is the expected time to first token (timed), or the work.
func (k *latencyKey) ttft(timed bool) float64 {
	if timed {
		return k.work * k.perToken
	}
	return k.work
}

// score is the compared figure: ttft less the credit, in the same unit.
func (k *latencyKey) score(timed bool) float64 {
	if timed {
		return (k.work - k.credit) * k.perToken
	}
	return k.work - k.credit
}

// prepareKeys readies a set of keys for comparison and says whether they are compared in
// time: when every key has a learned rate, each rate within rateBand of the set's median
// becomes the median. scratch (returned for reuse) holds the sorted rates.
func prepareKeys(keys []latencyKey, scratch []float64) (timed bool, _ []float64) {
	if len(keys) == 0 {
		return false, scratch
	}
	for i := range keys {
		if !keys[i].timed() {
			return false, scratch
		}
	}
	scratch = scratch[:0]
	for i := range keys {
		scratch = append(scratch, keys[i].perToken)
	}
	slices.Sort(scratch)
	median := scratch[(len(scratch)-1)/2]
	for i := range keys {
		if r := keys[i].perToken / median; r < rateBand && r > 1/rateBand {
			keys[i].perToken = median
		}
	}
	return true, scratch
}

// latencyCeiling is the largest score that ties with the best of the keys; +Inf without
// any.
func latencyCeiling(keys []latencyKey, timed bool) float64 {
	best, fastest := math.Inf(1), math.Inf(1)
	for i := range keys {
		best = min(best, keys[i].score(timed))
		fastest = min(fastest, keys[i].ttft(timed))
	}
	return best + latencySlack*fastest
}

// compareBusy orders two tied candidates: lower decode load first, then lower in-flight.
func compareBusy(a, b *latencyKey) int {
	switch {
	case a.decode != b.decode:
		if a.decode < b.decode {
			return -1
		}
		return 1
	case a.inflight != b.inflight:
		if a.inflight < b.inflight {
			return -1
		}
		return 1
	}
	return 0
}

// fastest returns the index of the candidate with the best score among keys compared as
// prepareKeys says (timed), ties (within latencySlack) going to the least busy
// (compareBusy), then to the earliest; -1 without keys.
func fastest(keys []latencyKey, timed bool) int {
	ceiling := latencyCeiling(keys, timed)
	best := -1
	for i := range keys {
		if keys[i].score(timed) > ceiling {
			continue
		}
		if best < 0 || compareBusy(&keys[i], &keys[best]) < 0 {
			best = i
		}
	}
	return best
}

// uncachedOf is the request's prompt tokens w would prefill: the input less the prefix w
// holds when the request made a prefix lookup (UncachedTokens); 0 without a request.
func uncachedOf(req *PickRequest, w *Worker) int64 {
	if req == nil || req.BucketRequest == nil {
		return 0
	}
	return UncachedTokens(req.BucketRequest, w)
}
