package engine

import (
	"strings"

	"switchyard/config"
	"switchyard/kv"
	"switchyard/kv/approx"
)

// ReasonLoadBalance: cache_aware with the approximate source found the group imbalanced and
// sent the request to the engine with the fewest requests in flight, whatever it holds.
const ReasonLoadBalance = "load_balance"

// ApproxSettings tune cache_aware with the approximate source (cache_aware.approximate),
// with the meanings of sgl-router's cache-aware flags.
type ApproxSettings struct {
	// CacheThreshold: an engine holding more than this share of the prompt is a hit.
	CacheThreshold float64
	// BalanceAbs and BalanceRel: the group is imbalanced when the most and least loaded
	// candidates (router-local in-flight requests) differ by more than BalanceAbs and the
	// most loaded one has more than BalanceRel times the least loaded one's.
	BalanceAbs int64
	BalanceRel float64
}

// approxSettingsFromConfig returns the approximate tuning when cfg selects that source, else
// nil.
func approxSettingsFromConfig(c config.CacheAware) *ApproxSettings {
	if c.Source != config.CacheSourceApproximate {
		return nil
	}
	a := c.Approximate
	return &ApproxSettings{CacheThreshold: a.CacheThreshold, BalanceAbs: int64(a.BalanceAbsThreshold), BalanceRel: a.BalanceRelThreshold}
}

// residentCounter is a prefix source that can say how much of its tree a worker holds
// (approx.Index).
type residentCounter interface {
	Resident(worker string) int64
}

// queryLength is a prefix answer that knows the length of the prompt looked up
// (kv.PrefixResult, kv.PrefixMemo).
type queryLength interface {
	QueryTokens() int
}

var (
	_ residentCounter = (*approx.Index)(nil)
	_ queryLength     = (*kv.PrefixResult)(nil)
	_ queryLength     = (*kv.PrefixMemo)(nil)
)

// pickApprox is cache_aware's pick with the approximate source, sgl-router's cache-aware
// algorithm within the group's candidates:
//
//  1. Imbalance: when the most and least loaded candidates (router-local in-flight) differ
//     by more than BalanceAbs and the most loaded one has more than BalanceRel times the
//     least loaded one's, the least loaded candidate (then the lowest ID):
//     ReasonLoadBalance.
//  2. Hit: the candidate holding the longest prefix (then the fewest in flight, then the
//     lowest ID), when it holds more than CacheThreshold of the prompt:
//     ReasonCacheCandidate.
//  3. Miss: the candidate holding the least of the tree (most room for a new prefix; then
//     the fewest in flight, then the lowest ID): ReasonCacheMissFallback.
//
// Hard admission is checked on the chosen engine; a rejected hit falls to the miss rule
// among the other candidates, and a rejected miss ends the pick (AdmissionRejected, or
// NoAdmissibleEngine with both rejections).
func (p *CacheAware) pickApprox(c []*Worker, req *PickRequest) (Pick, error) {
	var snap = p.snapshot()
	now := nowOf(req)
	if w := p.imbalanced(c); w != nil {
		if limit := p.check(w, observe(snap, w, now)); limit != "" {
			return Pick{}, &PickError{Outcome: OutcomeAdmissionRejected, Stage: req.Stage, BucketID: req.BucketID,
				Rejections: []Rejection{{BucketID: req.BucketID, Stage: req.Stage, WorkerID: w.ID, Limit: limit}}}
		}
		p.metrics.decisions[outcomeBalance].Inc()
		return Pick{Worker: w, Reason: ReasonLoadBalance}, nil
	}
	pm, miss, err := p.prefix(req)
	if err != nil {
		return Pick{}, &PickError{Outcome: OutcomeInvalidSignal, Stage: req.Stage, BucketID: req.BucketID,
			Detail: "prefix query rejected", Err: err}
	}
	var rejections []Rejection
	if pm != nil {
		var best *Worker
		var matched int64
		for _, w := range c {
			m := pm.MatchedTokens(w.ID)
			if m <= 0 {
				continue
			}
			if best == nil || m > matched || m == matched && lessInFlight(w, best) {
				best, matched = w, m
			}
		}
		query := int64(req.InputTokens)
		if ql, ok := pm.(queryLength); ok && ql.QueryTokens() > 0 {
			query = int64(ql.QueryTokens())
		}
		switch {
		case best == nil:
			miss = missNoHolder
		case query > 0 && float64(matched) > p.cfg.Approx.CacheThreshold*float64(query):
			if limit := p.check(best, observe(snap, best, now)); limit == "" {
				p.metrics.decisions[outcomeCandidate].Inc()
				p.metrics.matched.Update(float64(matched))
				return Pick{Worker: best, Reason: ReasonCacheCandidate}, nil
			} else {
				rejections = append(rejections, Rejection{BucketID: req.BucketID, Stage: req.Stage, WorkerID: best.ID, Limit: limit})
				miss = missRejected
			}
		default:
			miss = missBelowThreshold
		}
	}
	// Miss: the candidate holding the least of the tree.
	rc, _ := p.source.(residentCounter)
	var w *Worker
	var held int64
	for _, cand := range c {
		if rejected(rejections, cand.ID) {
			continue
		}
		var r int64
		if rc != nil {
			r = rc.Resident(cand.ID)
		}
		if w == nil || r < held || r == held && lessInFlight(cand, w) {
			w, held = cand, r
		}
	}
	if w == nil {
		return Pick{}, &PickError{Outcome: OutcomeNoAdmissibleEngine, Stage: req.Stage, BucketID: req.BucketID,
			Rejections: rejections, Detail: "the prefix holder was rejected and no other engine remains"}
	}
	if limit := p.check(w, observe(snap, w, now)); limit != "" {
		rej := Rejection{BucketID: req.BucketID, Stage: req.Stage, WorkerID: w.ID, Limit: limit}
		if len(rejections) == 0 {
			return Pick{}, &PickError{Outcome: OutcomeAdmissionRejected, Stage: req.Stage, BucketID: req.BucketID, Rejections: []Rejection{rej}}
		}
		return Pick{}, &PickError{Outcome: OutcomeNoAdmissibleEngine, Stage: req.Stage, BucketID: req.BucketID,
			Rejections: append(rejections, rej), Detail: "the prefix holder and the fallback engine were rejected"}
	}
	p.metrics.decisions[outcomeFallback].Inc()
	p.metrics.misses[miss].Inc()
	return Pick{Worker: w, Reason: ReasonCacheMissFallback}, nil
}

// imbalanced returns the least loaded candidate when the group is imbalanced (sgl-router's
// two balance thresholds over router-local in-flight requests), else nil.
func (p *CacheAware) imbalanced(c []*Worker) *Worker {
	var least, most *Worker
	for _, w := range c {
		if least == nil || lessInFlight(w, least) {
			least = w
		}
		if most == nil || w.Counters.InFlight() > most.Counters.InFlight() {
			most = w
		}
	}
	lo, hi := least.Counters.InFlight(), most.Counters.InFlight()
	if hi-lo > p.cfg.Approx.BalanceAbs && float64(hi) > float64(lo)*p.cfg.Approx.BalanceRel {
		return least
	}
	return nil
}

// lessInFlight orders engines by router-local in-flight requests, then ID.
func lessInFlight(a, b *Worker) bool {
	if c := compareInFlight(a, b); c != 0 {
		return c < 0
	}
	return strings.Compare(a.ID, b.ID) < 0
}
