package engine

import (
	"context"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"github.com/VictoriaMetrics/metrics"

	"switchyard/config"
	"switchyard/kv"
	"switchyard/kv/index"
	"switchyard/load"
	"switchyard/load/series"
)

// Selection reasons of cache_aware.
const (
	// ReasonCacheCandidate: an admitted prefix holder won the cache tournament.
	ReasonCacheCandidate = "cache_candidate"
	// ReasonSaturationPin: every usable holder was past the soft queue gate, the group was
	// saturated, and the least pressured admitted holder was kept rather than trading the
	// prefix for the same wait elsewhere.
	ReasonSaturationPin = "saturation_pin"
	// ReasonCacheMissFallback: no usable holder; the power-of-k load fallback chose.
	ReasonCacheMissFallback = "cache_miss_fallback"
)

// CacheAwareDecision is cache_aware's decision rule.
type CacheAwareDecision uint8

// Decision rules.
const (
	// DecisionLatency sends the request where its expected time to first token is lowest
	// (latency.go), a prefix hit counting for the prefill it saves.
	DecisionLatency CacheAwareDecision = iota
	// DecisionThreshold is the rule of POLICY_DESIGN section 5: thresholds, candidate
	// bounds, the soft queue gate, the tournament, the saturation pin and the power-of-k
	// fallback.
	DecisionThreshold
)

// CacheAwareSettings tune the cache_aware policy (POLICY_DESIGN section 5, defaults of
// section 7). The zero value is not useful; start from CacheAwareSettingsFromConfig.
type CacheAwareSettings struct {
	// Decision is the decision rule; the settings below apply to DecisionThreshold only.
	Decision CacheAwareDecision
	// MinMatchedTokens is the smallest prefix hit, in tokens, that makes a holder usable.
	MinMatchedTokens int64
	// MinMatchRatio, when > 0, also requires matched/input of at least this ratio.
	MinMatchRatio float64
	// MinCandidates, CandidateRatio and MaxCandidates bound the holders considered:
	// min(group size, MaxCandidates, max(MinCandidates, ceil(CandidateRatio × group size))).
	MinCandidates  int
	CandidateRatio float64
	MaxCandidates  int
	// WorkerQueueLimit is the soft queue gate: a holder reporting at least this many waiting
	// requests is avoided while another option exists. 0 disables the gate. Unknown load
	// passes the gate (fails open).
	WorkerQueueLimit int64
	// SaturationFloor is the fraction of the group's candidates that must be past the soft
	// gate (an unknown queue counts as past: it is no proof of a better destination) before
	// a gated holder is pinned instead of falling back.
	SaturationFloor float64
	// SwitchMargin: holders with at most this many more uncached tokens than the best one
	// stay in the tournament, where the pressure guard may prefer them.
	SwitchMargin int64
	// PressureGuard: within the switch margin, a holder reporting more than this many
	// waiting requests above another loses to it despite less uncached work.
	PressureGuard int64
	// MinLoadChoices is k of the power-of-k fallback (at least 2); k at or above the pool
	// size chooses the exact minimum.
	MinLoadChoices int
	// DispatchWindow, when > 0, makes the latency decision count a prompt it dispatched
	// within this window as held by its engine until the index shows it
	// (cache_aware_dispatched.go).
	DispatchWindow time.Duration
	// Approx, when set, selects the approximate source's algorithm (pickApprox), which the
	// settings above do not tune.
	Approx *ApproxSettings
	// Observer, when set, is told of every latency decision (cache_aware_observe.go); nil
	// records nothing.
	Observer CacheAwareObserver
}

// CacheAwareSettingsFromConfig converts the configured tuning.
func CacheAwareSettingsFromConfig(c config.CacheAware) CacheAwareSettings {
	d := DecisionLatency
	if c.Decision == config.CacheDecisionThreshold {
		d = DecisionThreshold
	}
	return CacheAwareSettings{
		Decision:         d,
		MinMatchedTokens: int64(c.MinMatchedTokens),
		MinMatchRatio:    c.MinMatchRatio,
		MinCandidates:    c.MinCandidates,
		CandidateRatio:   c.CandidateRatio,
		MaxCandidates:    c.MaxCandidates,
		WorkerQueueLimit: int64(c.WorkerQueueLimit),
		SaturationFloor:  c.SaturationFloor,
		SwitchMargin:     int64(c.SwitchMargin),
		PressureGuard:    int64(c.PressureGuard),
		MinLoadChoices:   c.MinLoadChoices,
		DispatchWindow:   c.DispatchWindow,
		Approx:           approxSettingsFromConfig(c),
	}
}

// candidateLimit is how many holders a group of n candidates considers.
func (s *CacheAwareSettings) candidateLimit(n int) int {
	prop := int(math.Ceil(s.CandidateRatio * float64(n)))
	return min(n, s.MaxCandidates, max(s.MinCandidates, prop))
}

// CacheAwareMetrics are cache_aware's metric handles, created once and shared by every
// cache_aware policy of a process.
type CacheAwareMetrics struct {
	decisions   [numCacheOutcomes]*metrics.Counter
	misses      [numMissReasons]*metrics.Counter
	unavailable *metrics.Counter
	checks      *metrics.Counter
	rejections  *metrics.Counter
	matched     *series.Histogram
}

type cacheOutcome uint8

const (
	outcomeCandidate cacheOutcome = iota
	outcomePin
	outcomeFallback
	outcomeBalance
	numCacheOutcomes
)

var cacheOutcomeNames = [numCacheOutcomes]string{ReasonCacheCandidate, ReasonSaturationPin, ReasonCacheMissFallback, ReasonLoadBalance}

// missReason says why a pick fell back to the load fallback.
type missReason uint8

const (
	missNoLookup       missReason = iota // no prefix memo or no tokens for this request
	missUnavailable                      // the source could not answer
	missNoHolder                         // no candidate holds any prefix
	missBelowThreshold                   // holders exist, none passes the min-hit gates
	missQueued                           // every usable holder is past the soft gate
	missRejected                         // every evaluated holder failed hard admission
	missSlower                           // latency: an engine without the prefix was expected faster
	numMissReasons
)

var missReasonNames = [numMissReasons]string{"no_lookup", "source_unavailable", "no_holder", "below_threshold",
	"holders_queued", "holders_rejected", "holders_slower"}

// matchedTokenBuckets are the `le` upper bounds, in tokens, of
// switchyard_cache_aware_matched_tokens (the default minimum hit is 1,024 tokens).
var matchedTokenBuckets = []float64{64, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072, 262144}

// NewCacheAwareMetrics creates the handles on set; nil keeps them private.
func NewCacheAwareMetrics(set *metrics.Set) *CacheAwareMetrics {
	if set == nil {
		set = metrics.NewSet()
	}
	m := &CacheAwareMetrics{}
	for o := range numCacheOutcomes {
		m.decisions[o] = set.GetOrCreateCounter(`switchyard_cache_aware_decisions_total{outcome="` + cacheOutcomeNames[o] + `"}`)
	}
	for r := range numMissReasons {
		m.misses[r] = set.GetOrCreateCounter(`switchyard_cache_aware_fallbacks_total{reason="` + missReasonNames[r] + `"}`)
	}
	m.unavailable = set.GetOrCreateCounter(`switchyard_cache_aware_source_unavailable_total`)
	m.checks = set.GetOrCreateCounter(`switchyard_cache_aware_admission_checks_total`)
	m.rejections = set.GetOrCreateCounter(`switchyard_cache_aware_admission_rejections_total`)
	m.matched = series.NewHistogramFamily(set, `switchyard_cache_aware_matched_tokens`).New(`switchyard_cache_aware_matched_tokens`, matchedTokenBuckets)
	return m
}

// CacheAwareCounts are cache_aware's decision counters.
type CacheAwareCounts struct {
	Candidate, Pin, Fallback, Balance uint64
	// Fallbacks by reason.
	NoLookup, Unavailable, NoHolder, BelowThreshold, Queued, Rejected, Slower uint64
	// SourceUnavailable counts picks that found the prefix source unavailable.
	SourceUnavailable uint64
}

// Counts returns the decision counters.
func (m *CacheAwareMetrics) Counts() CacheAwareCounts {
	return CacheAwareCounts{
		Candidate: m.decisions[outcomeCandidate].Get(), Pin: m.decisions[outcomePin].Get(),
		Fallback: m.decisions[outcomeFallback].Get(), Balance: m.decisions[outcomeBalance].Get(),
		NoLookup: m.misses[missNoLookup].Get(), Unavailable: m.misses[missUnavailable].Get(),
		NoHolder: m.misses[missNoHolder].Get(), BelowThreshold: m.misses[missBelowThreshold].Get(),
		Queued: m.misses[missQueued].Get(), Rejected: m.misses[missRejected].Get(), Slower: m.misses[missSlower].Get(),
		SourceUnavailable: m.unavailable.Get(),
	}
}

// CacheAware (configured as "cache_aware") prefers the engine already holding the request's
// prefix, under cache and pressure rules, within its group's candidates (POLICY_DESIGN
// section 5). Allowed on plain and prefill groups only.
//
//  1. Prefix ownership comes from the request's PrefixMemo (one lookup per request, keyed by
//     source; a local index is consulted on first use, a remote indexer only by the handler).
//     A rejected query is an InvalidSignal; an unavailable source is a miss.
//  2. Holders need MinMatchedTokens matched (and MinMatchRatio of the input when set).
//  3. They are ordered by matched tokens (most first), then pressure, then ID — a total
//     order — and bounded to candidateLimit(group size).
//  4. The soft queue gate sets aside holders reporting WorkerQueueLimit or more waiting
//     requests; every other holder is checked against hard admission explicitly.
//  5. Among admitted holders within SwitchMargin uncached tokens of the best, a tournament
//     picks the fewest uncached tokens, then the lower pressure, then the lower ID, except
//     that one reporting more than PressureGuard waiting requests above another loses to
//     it: ReasonCacheCandidate.
//  6. When holders were set aside by the gate and at least SaturationFloor of the group is
//     past it, the least pressured gated holder that passes hard admission is pinned:
//     ReasonSaturationPin.
//  7. Otherwise the power-of-k load fallback samples MinLoadChoices engines (the exact
//     minimum when k covers the pool) among the candidates not rejected above, preferring
//     those the soft gate admits, and checks admission once on its winner:
//     ReasonCacheMissFallback. Rejection is AdmissionRejected, or NoAdmissibleEngine with
//     every rejection when holders were rejected too.
//
// Pressure: reported metrics corrected for the dispatches made since each report (keyOf,
// with the request's input tokens per pending dispatch), compared as power_of_two does
// (comparePressure) when both engines have a fresh native report, else router-local
// in-flight. Sorts and exact minima use a per-set total order over the same corrected keys
// (as load_based ranks), never a pairwise comparator. The soft queue gate, the saturation
// count and the PressureGuard compare reported waiting requests as reported.
type CacheAware struct {
	admission EngineAdmission
	loads     LoadReader
	source    kv.CacheSource
	cfg       CacheAwareSettings
	rng       *rand.Rand
	metrics   *CacheAwareMetrics

	// Scratch, reused across picks (the policy is owned by one goroutine at a time).
	holders []cacheHolder
	order   []int
	pool    []*Worker
	keys    []loadKey
	latency []latencyKey
	matched []int64
	rates   []float64

	// dispatched remembers the latency decision's recent dispatches (DispatchWindow).
	dispatched dispatchedMemory
	// decision is the record handed to cfg.Observer.
	decision LatencyDecision
}

// cacheHolder is one candidate holding a usable prefix.
type cacheHolder struct {
	w        *Worker
	matched  int64
	uncached int64
	obs      load.Observation
	key      loadKey
	gated    bool
}

var _ Policy = (*CacheAware)(nil)

// NewCacheAware returns a cache_aware policy. src may be nil (every pick is a miss); m may
// be nil (private metrics). Settings outside their valid ranges are clamped.
func NewCacheAware(adm EngineAdmission, loads LoadReader, src kv.CacheSource, cfg CacheAwareSettings, rng *rand.Rand, m *CacheAwareMetrics) *CacheAware {
	cfg.MinCandidates = max(cfg.MinCandidates, 1)
	cfg.MaxCandidates = max(cfg.MaxCandidates, cfg.MinCandidates)
	cfg.MinLoadChoices = max(cfg.MinLoadChoices, 2)
	if m == nil {
		m = NewCacheAwareMetrics(nil)
	}
	return &CacheAware{admission: adm, loads: loads, source: src, cfg: cfg, rng: rng, metrics: m}
}

// Name implements Policy.
func (*CacheAware) Name() string { return PolicyCacheAware }

// Metrics returns the policy's metric handles.
func (p *CacheAware) Metrics() *CacheAwareMetrics { return p.metrics }

// Pick implements Policy.
func (p *CacheAware) Pick(c []*Worker, req *PickRequest) (Pick, error) {
	if req.Stage == StageDecode {
		return Pick{}, pickErr(OutcomeInvalidConfiguration, req.Stage, req.BucketID,
			"cache_aware is only valid on plain or prefill groups")
	}
	if len(c) == 0 {
		return Pick{}, pickErr(OutcomeNoCandidates, req.Stage, req.BucketID, "")
	}
	if p.cfg.Approx != nil {
		return p.pickApprox(c, req)
	}
	snap := p.snapshot()
	now := nowOf(req)
	pm, miss, err := p.prefix(req)
	if err != nil {
		return Pick{}, &PickError{Outcome: OutcomeInvalidSignal, Stage: req.Stage, BucketID: req.BucketID,
			Detail: "prefix query rejected", Err: err}
	}
	if p.cfg.Decision == DecisionLatency {
		return p.pickByLatency(c, req, pm, snap, now, miss)
	}
	var rejections []Rejection
	if pm != nil {
		var pick Pick
		var done bool
		pick, rejections, miss, done = p.pickHolder(c, req, pm, snap, now)
		if done {
			return pick, nil
		}
	}
	return p.fallback(c, req, snap, now, rejections, miss)
}

// snapshot returns the load table's current snapshot, nil without one.
func (p *CacheAware) snapshot() *load.Snapshot {
	if p.loads == nil {
		return nil
	}
	return p.loads.Load()
}

// prefix returns the request's prefix matches for this policy's source, or why there are
// none; err is a rejected query.
func (p *CacheAware) prefix(req *PickRequest) (PrefixMatcher, missReason, error) {
	pm, miss, err := prefixOf(req, p.source)
	if miss == missUnavailable {
		p.metrics.unavailable.Inc()
	}
	return pm, miss, err
}

// prefixOf returns the request's prefix matches from source (the one lookup the handler
// prepared in req.Prefix, made here on first use when source is the local index), or why
// there are none; err is a rejected query. Shared by cache_aware and the affinity policies.
func prefixOf(req *PickRequest, source kv.CacheSource) (PrefixMatcher, missReason, error) {
	if req.BucketRequest == nil || req.Prefix == nil {
		return nil, missNoLookup, nil
	}
	var pm PrefixMatcher = req.Prefix
	memo, isMemo := req.Prefix.(*kv.PrefixMemo)
	if isMemo && memo == nil {
		return nil, missNoLookup, nil // a typed nil: no lookup was prepared
	}
	if isMemo && source != nil {
		if r, ok := memo.Resolved(source); ok {
			pm = r
		} else if idx, ok := source.(*index.Index); ok {
			// A local index answers on first use: CPU work on the index shards, no network.
			pm = memo.Resolve(context.Background(), idx)
		} else {
			return nil, missUnavailable, nil
		}
	}
	ok, unavailable, err := pm.Status()
	switch {
	case err != nil:
		return nil, 0, err
	case !ok && unavailable:
		return nil, missUnavailable, nil
	case !ok:
		return nil, missNoLookup, nil
	}
	return pm, 0, nil
}

// pickHolder runs steps 2–6. done reports a pick; otherwise rejections and the miss reason
// go to the fallback.
func (p *CacheAware) pickHolder(c []*Worker, req *PickRequest, pm PrefixMatcher, snap *load.Snapshot, now time.Time) (Pick, []Rejection, missReason, bool) {
	input := req.InputTokens
	hs := p.holders[:0]
	anyHolder := false
	for _, w := range c {
		m := pm.MatchedTokens(w.ID)
		if m <= 0 {
			continue
		}
		anyHolder = true
		if input > 0 {
			m = min(m, input)
		}
		if m < p.cfg.MinMatchedTokens || (p.cfg.MinMatchRatio > 0 && float64(m) < p.cfg.MinMatchRatio*float64(input)) {
			continue
		}
		obs := observe(snap, w, now)
		hs = append(hs, cacheHolder{w: w, matched: m, uncached: max(input-m, 0), obs: obs, key: keyOf(w, &obs, input)})
	}
	p.holders = hs
	if len(hs) == 0 {
		if anyHolder {
			return Pick{}, nil, missBelowThreshold, false
		}
		return Pick{}, nil, missNoHolder, false
	}
	flags := holderFlags(hs, req.Stage)
	slices.SortFunc(hs, func(a, b cacheHolder) int {
		if a.matched != b.matched {
			if a.matched > b.matched {
				return -1
			}
			return 1
		}
		return compareKeys(&a.key, &b.key, a.w, b.w, flags)
	})
	hs = hs[:min(len(hs), p.cfg.candidateLimit(len(c)))]

	// Soft gate, then explicit hard admission of every evaluated holder.
	var rejections []Rejection
	admitted := p.order[:0]
	gated := 0
	for i := range hs {
		h := &hs[i]
		h.gated = p.queued(&h.obs)
		if h.gated {
			gated++
			continue
		}
		if limit := p.check(h.w, h.obs); limit != "" {
			rejections = append(rejections, Rejection{BucketID: req.BucketID, Stage: req.Stage, WorkerID: h.w.ID, Limit: limit})
			continue
		}
		admitted = append(admitted, i)
	}
	p.order = admitted
	if len(admitted) > 0 {
		h := &hs[p.tournament(hs, admitted, req.Stage)]
		p.metrics.decisions[outcomeCandidate].Inc()
		p.metrics.matched.Update(float64(h.matched))
		return Pick{Worker: h.w, Reason: ReasonCacheCandidate}, nil, 0, true
	}
	if gated > 0 && p.saturated(c, snap, now) {
		h, rej := p.pin(hs, req, flags)
		if h != nil {
			p.metrics.decisions[outcomePin].Inc()
			p.metrics.matched.Update(float64(h.matched))
			return Pick{Worker: h.w, Reason: ReasonSaturationPin}, nil, 0, true
		}
		rejections = append(rejections, rej...)
	}
	if gated > 0 && len(rejections) == 0 {
		return Pick{}, nil, missQueued, false
	}
	return Pick{}, rejections, missRejected, false
}

// pickByLatency is the latency decision: the candidate with the best score (latency.go):
// its expected time to first token, each one's uncached tokens being the input less the
// prefix it holds, less that prefix's prefill time twice more (hitCredits), times the
// fleet's hit weight (weighHits). Scores within 10% of the best expected time tie; a tie
// goes to the longer prefix, then the lower decode load, then the lower in-flight, then
// the lower ID. Hard admission is checked once, on the winner; a
// rejection is AdmissionRejected. pm is nil when the request has no usable lookup (miss
// says why).
func (p *CacheAware) pickByLatency(c []*Worker, req *PickRequest, pm PrefixMatcher, snap *load.Snapshot, now time.Time, miss missReason) (Pick, error) {
	input := max(req.InputTokens, 0)
	keys, matched := p.latency[:0], p.matched[:0]
	anyHolder := false
	remembered, notBefore := false, now.Add(-p.cfg.DispatchWindow)
	if p.cfg.DispatchWindow > 0 {
		remembered = p.dispatched.fingerprint(promptTokens(req))
	}
	for _, w := range c {
		m := int64(0)
		if pm != nil {
			m = min(max(pm.MatchedTokens(w.ID), 0), input)
		}
		if remembered {
			m = max(m, min(p.dispatched.matched(w, notBefore), input))
		}
		anyHolder = anyHolder || m > 0
		o := observe(snap, w, now)
		k := latencyOf(w, &o, max(input-m, 1), now)
		k.credit = hitCredits * float64(m) // weighed by the fleet (weighHits): see latency.go
		keys = append(keys, k)
		matched = append(matched, m)
	}
	weight := weighHits(keys, matched, input)
	var timed bool
	timed, p.rates = prepareKeys(keys, p.rates)
	p.latency, p.matched = keys, matched
	best := fastestHolder(keys, matched, timed)
	w := c[best]
	limit := p.check(w, observe(snap, w, now))
	if p.cfg.Observer != nil {
		p.observeLatency(c, req, keys, matched, timed, weight, best, limit)
	}
	if limit != "" {
		return Pick{}, &PickError{Outcome: OutcomeAdmissionRejected, Stage: req.Stage, BucketID: req.BucketID,
			Rejections: []Rejection{{BucketID: req.BucketID, Stage: req.Stage, WorkerID: w.ID, Limit: limit}}}
	}
	if remembered {
		p.dispatched.remember(w, now)
	}
	if matched[best] > 0 {
		p.metrics.decisions[outcomeCandidate].Inc()
		p.metrics.matched.Update(float64(matched[best]))
		return Pick{Worker: w, Reason: ReasonCacheCandidate}, nil
	}
	switch {
	case anyHolder:
		miss = missSlower
	case pm != nil:
		miss = missNoHolder
	}
	p.metrics.decisions[outcomeFallback].Inc()
	p.metrics.misses[miss].Inc()
	return Pick{Worker: w, Reason: ReasonCacheMissFallback}, nil
}

// fastestHolder is fastest (latency.go) with its own tie order (tieBefore): the index of
// the candidate to take.
func fastestHolder(keys []latencyKey, matched []int64, timed bool) int {
	ceiling := latencyCeiling(keys, timed)
	best := -1
	for i := range keys {
		if keys[i].score(timed) > ceiling {
			continue
		}
		if best < 0 || tieBefore(&keys[i], &keys[best], matched[i], matched[best]) {
			best = i
		}
	}
	return best
}

// tieBefore orders tied candidates for the latency decision: the longer prefix, then lower
// decode load, then lower in-flight.
func tieBefore(a, b *latencyKey, ma, mb int64) bool {
	switch {
	case ma != mb:
		return ma > mb
	case a.decode != b.decode:
		return a.decode < b.decode
	}
	return a.inflight < b.inflight
}

// queued reports whether an observation is past the soft queue gate. Unknown load passes.
func (p *CacheAware) queued(o *load.Observation) bool {
	return p.cfg.WorkerQueueLimit > 0 && o.Has(load.HasWaiting) && o.Waiting >= p.cfg.WorkerQueueLimit
}

// saturated reports whether at least SaturationFloor of the group is past the soft gate,
// counting an unknown queue as past (it proves no better destination).
func (p *CacheAware) saturated(c []*Worker, snap *load.Snapshot, now time.Time) bool {
	past := 0
	for _, w := range c {
		o := observe(snap, w, now)
		if !o.Has(load.HasWaiting) || o.Waiting >= p.cfg.WorkerQueueLimit {
			past++
		}
	}
	return float64(past) >= p.cfg.SaturationFloor*float64(len(c))
}

// check runs hard admission on w, counting it; "" admits.
func (p *CacheAware) check(w *Worker, obs load.Observation) string {
	if p.admission == nil {
		return ""
	}
	p.metrics.checks.Inc()
	limit := p.admission.Check(w, obs)
	if limit != "" {
		p.metrics.rejections.Inc()
	}
	return limit
}

// tournament returns the index in hs of the winner among the admitted holders idx.
func (p *CacheAware) tournament(hs []cacheHolder, idx []int, stage Stage) int {
	floor := int64(math.MaxInt64)
	for _, i := range idx {
		floor = min(floor, hs[i].uncached)
	}
	ceiling := floor + p.cfg.SwitchMargin
	if ceiling < floor { // overflow
		ceiling = math.MaxInt64
	}
	best := -1
	for _, i := range idx {
		if hs[i].uncached > ceiling {
			continue
		}
		if best < 0 || p.better(&hs[i], &hs[best], stage) {
			best = i
		}
	}
	return best
}

// better reports whether a beats b in the tournament.
func (p *CacheAware) better(a, b *cacheHolder, stage Stage) bool {
	if p.morePressured(&b.obs, &a.obs) {
		return true
	}
	if p.morePressured(&a.obs, &b.obs) {
		return false
	}
	if a.uncached != b.uncached {
		return a.uncached < b.uncached
	}
	if c := pairPressure(stage, a, b); c != 0 {
		return c < 0
	}
	return a.w.ID < b.w.ID
}

// morePressured reports whether x reports more than PressureGuard waiting requests above y.
func (p *CacheAware) morePressured(x, y *load.Observation) bool {
	return x.Has(load.HasWaiting) && y.Has(load.HasWaiting) && x.Waiting-y.Waiting > p.cfg.PressureGuard
}

// pin returns the least pressured gated holder that passes hard admission, or nil with the
// rejections met.
func (p *CacheAware) pin(hs []cacheHolder, req *PickRequest, flags keyFlags) (*cacheHolder, []Rejection) {
	gated := p.order[:0]
	for i := range hs {
		if hs[i].gated {
			gated = append(gated, i)
		}
	}
	p.order = gated
	slices.SortFunc(gated, func(a, b int) int { return compareKeys(&hs[a].key, &hs[b].key, hs[a].w, hs[b].w, flags) })
	var rejections []Rejection
	for _, i := range gated {
		h := &hs[i]
		if limit := p.check(h.w, h.obs); limit != "" {
			rejections = append(rejections, Rejection{BucketID: req.BucketID, Stage: req.Stage, WorkerID: h.w.ID, Limit: limit})
			continue
		}
		return h, nil
	}
	return nil, rejections
}

// fallback runs the power-of-k load fallback (step 7).
func (p *CacheAware) fallback(c []*Worker, req *PickRequest, snap *load.Snapshot, now time.Time, rejections []Rejection, miss missReason) (Pick, error) {
	pool := p.pool[:0]
	for _, w := range c {
		if !rejected(rejections, w.ID) {
			pool = append(pool, w)
		}
	}
	// Prefer the engines the soft gate admits: move them to the front.
	keys := p.keys[:0]
	preferred := 0
	for i, w := range pool {
		o := observe(snap, w, now)
		if !p.queued(&o) {
			pool[preferred], pool[i] = pool[i], pool[preferred]
			preferred++
		}
	}
	p.pool = pool
	if preferred > 0 {
		pool = pool[:preferred]
	}
	if len(pool) == 0 {
		return Pick{}, &PickError{Outcome: OutcomeNoAdmissibleEngine, Stage: req.Stage, BucketID: req.BucketID,
			Rejections: rejections, Detail: "every prefix holder was rejected and no other engine remains"}
	}
	// Power-of-k: sample k distinct engines (partial Fisher-Yates), or take the whole pool
	// from a random rotation so that exact-minimum ties do not always go to the same engine.
	k := p.cfg.MinLoadChoices
	if k >= len(pool) {
		k = len(pool)
		if off := p.rng.IntN(len(pool)); off > 0 {
			slices.Reverse(pool[:off])
			slices.Reverse(pool[off:])
			slices.Reverse(pool)
		}
	} else {
		for i := range k {
			j := i + p.rng.IntN(len(pool)-i)
			pool[i], pool[j] = pool[j], pool[i]
		}
	}
	sample := pool[:k]
	for _, w := range sample {
		o := observe(snap, w, now)
		keys = append(keys, keyOf(w, &o, perDispatchTokens(req)))
	}
	p.keys = keys
	flags := sampleFlags(keys, req.Stage)
	best := 0
	for i := 1; i < len(sample); i++ {
		if lessLoad(&keys[i], &keys[best], flags.native, flags.useQueue, flags.useUncached, req.Stage) {
			best = i
		}
	}
	w := sample[best]
	p.metrics.decisions[outcomeFallback].Inc()
	p.metrics.misses[miss].Inc()
	if limit := p.check(w, observe(snap, w, now)); limit != "" {
		rej := Rejection{BucketID: req.BucketID, Stage: req.Stage, WorkerID: w.ID, Limit: limit}
		if len(rejections) == 0 {
			return Pick{}, &PickError{Outcome: OutcomeAdmissionRejected, Stage: req.Stage, BucketID: req.BucketID, Rejections: []Rejection{rej}}
		}
		return Pick{}, &PickError{Outcome: OutcomeNoAdmissibleEngine, Stage: req.Stage, BucketID: req.BucketID,
			Rejections: append(rejections, rej), Detail: "prefix holders and the fallback engine were rejected"}
	}
	return Pick{Worker: w, Reason: ReasonCacheMissFallback}, nil
}

func rejected(rs []Rejection, id string) bool {
	for i := range rs {
		if rs[i].WorkerID == id {
			return true
		}
	}
	return false
}

// keyFlags say which pressure fields a set of keys may be compared on: native only when
// every member has a native report, queue and uncached only when every member reports them.
type keyFlags struct {
	native, useQueue, useUncached bool
}

func sampleFlags(keys []loadKey, stage Stage) keyFlags {
	native := allNative(keys)
	return keyFlags{
		native:      native,
		useQueue:    native && stage != StageDecode && allHave(keys, load.HasPrefillQueue),
		useUncached: native && stage != StageDecode && allHave(keys, load.HasWaitingUncached),
	}
}

func holderFlags(hs []cacheHolder, stage Stage) keyFlags {
	f := keyFlags{native: true, useQueue: stage != StageDecode, useUncached: stage != StageDecode}
	for i := range hs {
		k := &hs[i].key
		f.native = f.native && k.native
		f.useQueue = f.useQueue && k.fields&load.HasPrefillQueue != 0
		f.useUncached = f.useUncached && k.fields&load.HasWaitingUncached != 0
	}
	f.useQueue = f.useQueue && f.native
	f.useUncached = f.useUncached && f.native
	return f
}

// compareKeys is a total order: pressure by the set's flags, then worker ID.
func compareKeys(a, b *loadKey, wa, wb *Worker, f keyFlags) int {
	if lessLoad(a, b, f.native, f.useQueue, f.useUncached, StagePrefill) {
		return -1
	}
	if lessLoad(b, a, f.native, f.useQueue, f.useUncached, StagePrefill) {
		return 1
	}
	return strings.Compare(wa.ID, wb.ID)
}

// pairPressure compares two holders as power_of_two compares its samples: corrected stage
// pressure (comparePressure on their keys) when both have a fresh native report, then
// router-local in-flight.
func pairPressure(stage Stage, a, b *cacheHolder) int {
	if a.key.native && b.key.native {
		if c := comparePressure(stage, &a.key, &b.key); c != 0 {
			return c
		}
	}
	return compareInFlight(a.w, b.w)
}
