package engine

// CacheAwareObserver is told of every latency decision cache_aware makes
// (CacheAwareSettings.Observer, Deps.CacheAwareObserver): the candidates' expected time to
// first token as the policy saw them. It is a diagnostic seam (the bench's trace scenario
// records why a request left the engine holding its prefix); without one, a pick records
// nothing and costs nothing more.
type CacheAwareObserver interface {
	// LatencyDecided runs on the selecting goroutine after each latency pick, the pick
	// admitted or not. d and its candidates are the policy's scratch: valid during the call
	// only.
	LatencyDecided(req *PickRequest, d *LatencyDecision)
}

// LatencyDecision is one pick of cache_aware's latency decision (latency.go).
type LatencyDecision struct {
	// Candidates are the group's candidates in the group's order.
	Candidates []LatencyCandidate
	// Chosen is the index in Candidates of the engine picked.
	Chosen int
	// Timed says the candidates were compared in seconds (every one had learned a prefill
	// rate); otherwise in tokens, PerToken being 0.
	Timed bool
	// HitWeight is the fleet's hit weight the credits were multiplied by (weighHits):
	// (n+1)/(n+1−b) for n candidates, b of them with at least the longest held prefix's
	// prefill queued ahead; 1 when none.
	HitWeight float64
	// Ceiling is the largest score that tied with the best (the best score plus the slack
	// of the fastest expected TTFT); among the candidates at or below it the tie order
	// chose.
	Ceiling float64
	// Rejected is the admission limit the chosen engine failed, "" when admitted.
	Rejected string
}

// LatencyCandidate is one candidate's terms in a latency decision.
type LatencyCandidate struct {
	// WorkerID is the engine.
	WorkerID string
	// Matched is the prefix of the prompt the engine holds, tokens: the prefix index's
	// match, or the dispatch memory's when longer.
	Matched int64
	// Uncached is the prompt tokens the engine would prefill (at least 1).
	Uncached int64
	// Work is the prefill work up to the request's first token there, tokens: the router's
	// pending prefill, the report's queue beyond it, and Uncached (load.PrefillWork).
	Work float64
	// PerToken is the prefill cost compared, seconds per token (the learned rate, or the
	// group's median within the rate band); 0 when compared in tokens.
	PerToken float64
	// TTFT is the expected time to first token (seconds; tokens when not timed); Score is
	// TTFT less the hit's credit (the matched tokens' prefill times HitWeight), the figure
	// compared.
	TTFT, Score float64
	// Decode is the decode load the request would join; InFlight the router's requests in
	// flight there (the tie order).
	Decode   float64
	InFlight int64
}

// Queue is the work ahead of the request's own prefill there: seconds when timed, else
// tokens.
func (c *LatencyCandidate) Queue() float64 {
	q := c.Work - float64(c.Uncached)
	if c.PerToken > 0 {
		return q * c.PerToken
	}
	return q
}

// observeLatency tells the observer of a latency pick: keys and matched are the decision's
// candidates (c's order), best the index picked.
func (p *CacheAware) observeLatency(c []*Worker, req *PickRequest, keys []latencyKey, matched []int64, timed bool, weight float64, best int, limit string) {
	d := &p.decision
	d.Candidates = d.Candidates[:0]
	for i := range keys {
		k := &keys[i]
		per := 0.0
		if timed {
			per = k.perToken
		}
		d.Candidates = append(d.Candidates, LatencyCandidate{
			WorkerID: c[i].ID, Matched: matched[i], Uncached: max(req.InputTokens-matched[i], 1), Work: k.work,
			PerToken: per, TTFT: k.ttft(timed), Score: k.score(timed), Decode: k.decode, InFlight: k.inflight,
		})
	}
	d.Chosen, d.Timed, d.HitWeight, d.Ceiling, d.Rejected = best, timed, weight, latencyCeiling(keys, timed), limit
	p.cfg.Observer.LatencyDecided(req, d)
}
