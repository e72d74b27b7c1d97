package load

import "time"

// SLO estimates: what a request's time to first token (TTFT) and time per output token
// (TPOT) would be on one engine, from what the router already holds: the engine's load
// observation, its router-local counters and its learned Rates. Nothing here does I/O,
// takes a lock or allocates.

// PrefillWork is the prefill work, in tokens, a request with uncached prompt tokens would
// wait for and then do on an engine: the work queued ahead of it plus its own.
//
// The queue ahead is the router's own pending prefill at now (Counters.PendingPrefillLeft:
// the uncached tokens of requests it sent that have no first token yet, less what the
// engine has done of the one it is prefilling, if it can be prefilling one), plus what others queued
// as of the engine's last report: its waiting uncached tokens less the router's pending
// tokens when the report was ingested (Observation.PendingTokensAtCapture), or, from an
// engine that reports only waiting requests, its waiting requests less the router's then,
// each counted at this request's uncached tokens. Without a fresh report only the router's
// own pending work is known.
func PrefillWork(o *Observation, c *Counters, uncached int64, now time.Time) float64 {
	uncached = max(uncached, 0)
	q := c.PendingPrefillLeft(o, now)
	switch {
	case o.Has(HasWaitingUncached):
		q += float64(max(o.WaitingUncachedTokens-o.PendingTokensAtCapture, 0))
	case o.Has(HasWaiting):
		q += float64(max(o.Waiting-o.PendingRequestsAtCapture, 0)) * float64(uncached)
	}
	return q + float64(uncached)
}

// DecodeLoad is the decode load, in requests, a new request would join on an engine: the
// larger of its reported running requests and the router's in-flight requests there, plus
// the request itself.
func DecodeLoad(o *Observation, c *Counters) float64 {
	r := max(c.InFlight(), 0)
	if o.Has(HasRunning) {
		r = max(r, o.Running)
	}
	return float64(r + 1)
}

// EstimateTTFT estimates, in seconds, the time to first token of a request with uncached
// prompt tokens on an engine with observation o (the zero Observation when unknown) and
// counters c at now: the learned prefill line at PrefillWork. Before the line has learned
// anything, an engine that reports its prefill queue time gives the prior
// PrefillWork × queue time per waiting uncached token (its own measured prefill rate).
// ok is false when neither is known.
func EstimateTTFT(o *Observation, c *Counters, uncached int64, now time.Time) (seconds float64, ok bool) {
	return EstimateTTFTAtWork(o, c, PrefillWork(o, c, uncached, now))
}

// EstimateTTFTAtWork is EstimateTTFT for a request whose PrefillWork is work, for a caller
// that needs the work as well: the router's pending prefill is read once.
func EstimateTTFTAtWork(o *Observation, c *Counters, work float64) (seconds float64, ok bool) {
	if y, ok := c.rates.Prefill.At(work); ok {
		return y, true
	}
	if o.Has(HasPrefillQueue) && o.WaitingUncachedTokens > 0 && o.PrefillQueueMs > 0 {
		return work * o.PrefillQueueMs / 1000 / float64(o.WaitingUncachedTokens), true
	}
	return 0, false
}

// EstimateTPOT estimates, in seconds, the time per output token of a new request on an
// engine with observation o and counters c: the learned decode line at DecodeLoad. ok is
// false before the line has learned anything.
func EstimateTPOT(o *Observation, c *Counters) (seconds float64, ok bool) {
	return EstimateTPOTAtLoad(c, DecodeLoad(o, c))
}

// EstimateTPOTAtLoad is EstimateTPOT on an engine whose DecodeLoad is dload, for a caller
// that needs the load as well.
func EstimateTPOTAtLoad(c *Counters, dload float64) (seconds float64, ok bool) {
	return c.rates.Decode.At(dload)
}
