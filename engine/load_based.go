package engine

import (
	"time"

	"switchyard/load"
)

// LoadBased (configured as "load_based") chooses the least loaded candidate, then checks
// admission once on it.
//
// When every candidate has a fresh, complete native report:
//   - plain and prefill candidates are ranked by the request's expected time to first
//     token (latency.go: the router's own pending prefill, the queue the report adds, the
//     request's own uncached tokens, in time by each engine's learned rate), estimates
//     within 10% of the best tying; ties go to the lower decode load (running or
//     in-flight requests), then the lower in-flight;
//   - decode candidates are ranked by waiting requests corrected for the dispatches since
//     each report (keyOf), running requests, KV usage fraction and used KV tokens, then
//     router in-flight.
//
// When any candidate lacks such a report, all are ranked by in-flight alone (telemetry
// fallback). Remaining ties go to the lowest worker ID, so the choice is deterministic for
// a given state.
type LoadBased struct {
	admission EngineAdmission
	loads     LoadReader
	scratch   []loadKey
	latency   []latencyKey
	rates     []float64
}

var _ Policy = (*LoadBased)(nil)

// NewLoadBased returns a least-load policy reading loads.
func NewLoadBased(adm EngineAdmission, loads LoadReader) *LoadBased {
	return &LoadBased{admission: adm, loads: loads}
}

// Name implements Policy.
func (*LoadBased) Name() string { return PolicyLoadBased }

// Pick implements Policy.
func (p *LoadBased) Pick(c []*Worker, req *PickRequest) (Pick, error) {
	if len(c) == 0 {
		return Pick{}, pickErr(OutcomeNoCandidates, req.Stage, req.BucketID, "")
	}
	var snap *load.Snapshot
	if p.loads != nil {
		snap = p.loads.Load()
	}
	now := nowOf(req)
	best, reason := 0, ReasonLeastLoad
	if req.Stage != StageDecode {
		// One pass: each candidate's observation is read once.
		lk, native := p.latency[:0], true
		for _, w := range c {
			o := observe(snap, w, now)
			native = native && o.Native()
			lk = append(lk, latencyOf(w, &o, uncachedOf(req, w), now))
		}
		p.latency = lk
		if native {
			var timed bool
			timed, p.rates = prepareKeys(lk, p.rates)
			best = fastest(lk, timed)
		} else {
			reason = ReasonInFlight
			for i := 1; i < len(lk); i++ {
				if lk[i].inflight < lk[best].inflight {
					best = i
				}
			}
		}
	} else {
		keys := p.keys(c, snap, now, perDispatchTokens(req))
		native := allNative(keys)
		if !native {
			reason = ReasonInFlight
		}
		for i := 1; i < len(keys); i++ {
			if lessLoad(&keys[i], &keys[best], native, false, false, req.Stage) {
				best = i
			}
		}
	}
	w := c[best]
	if p.admission != nil {
		if err := admit(p.admission, w, observe(snap, w, now), req); err != nil {
			return Pick{}, err
		}
	}
	return Pick{Worker: w, Reason: reason}, nil
}

func (p *LoadBased) keys(c []*Worker, snap *load.Snapshot, now time.Time, perDispatch int64) []loadKey {
	keys := p.scratch[:0]
	for _, w := range c {
		o := observe(snap, w, now)
		keys = append(keys, keyOf(w, &o, perDispatch))
	}
	p.scratch = keys
	return keys
}

func allNative(keys []loadKey) bool {
	for i := range keys {
		if !keys[i].native {
			return false
		}
	}
	return true
}

func allHave(keys []loadKey, f load.Field) bool {
	for i := range keys {
		if keys[i].fields&f != f {
			return false
		}
	}
	return true
}

// lessLoad reports whether a ranks strictly before b.
func lessLoad(a, b *loadKey, native, useQueue, useUncached bool, stage Stage) bool {
	if native {
		if stage == StageDecode {
			if a.waiting != b.waiting {
				return a.waiting < b.waiting
			}
			if a.running != b.running {
				return a.running < b.running
			}
			if a.kvUsage != b.kvUsage {
				return a.kvUsage < b.kvUsage
			}
			if a.used != b.used {
				return a.used < b.used
			}
		} else {
			if useQueue && a.queueMs != b.queueMs {
				return a.queueMs < b.queueMs
			}
			if useUncached && a.uncached != b.uncached {
				return a.uncached < b.uncached
			}
			if a.waiting != b.waiting {
				return a.waiting < b.waiting
			}
			if a.running != b.running {
				return a.running < b.running
			}
		}
	}
	return a.inflight < b.inflight
}
