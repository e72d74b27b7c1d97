package engine

import (
	"time"

	"math/rand/v2"

	"switchyard/load"
)

// PowerOfTwo samples two distinct candidates uniformly and keeps the one with the lower stage
// pressure, then checks admission exactly once on it (POLICY_DESIGN section 4):
//   - one candidate is taken directly (its load is still read for admission);
//   - pressure is compared only when both samples have a fresh, complete native report with
//     valid capacity; otherwise both are compared by router-local in-flight;
//   - plain and prefill compare the request's expected time to first token on each
//     (latency.go: the router's own pending prefill, the queue the report adds and the
//     request's own uncached tokens, in time by each engine's learned rate); estimates
//     within 10% of each other tie, and a tie goes to the lower decode load (running or
//     in-flight requests), then the lower in-flight;
//   - decode compares each report corrected for the dispatches the router made since it
//     was captured (keyOf, comparePressure): waiting requests (a pending dispatch counts
//     as one more), running requests, KV usage fraction and used KV tokens; a tie falls
//     back to in-flight;
//   - a complete tie keeps the first sample;
//   - a rejection returns AdmissionRejected: no resampling, no second choice, no fallback.
type PowerOfTwo struct {
	admission EngineAdmission
	loads     LoadReader
	rng       *rand.Rand
}

var _ Policy = (*PowerOfTwo)(nil)

// NewPowerOfTwo returns a power-of-two policy reading loads and drawing from rng.
func NewPowerOfTwo(adm EngineAdmission, loads LoadReader, rng *rand.Rand) *PowerOfTwo {
	return &PowerOfTwo{admission: adm, loads: loads, rng: rng}
}

// Name implements Policy.
func (*PowerOfTwo) Name() string { return PolicyPowerOfTwo }

// Pick implements Policy.
func (p *PowerOfTwo) Pick(c []*Worker, req *PickRequest) (Pick, error) {
	switch len(c) {
	case 0:
		return Pick{}, pickErr(OutcomeNoCandidates, req.Stage, req.BucketID, "")
	case 1:
		return finish(p.admission, p.loads, c[0], req, ReasonSingle)
	}
	var snap *load.Snapshot
	if p.loads != nil {
		snap = p.loads.Load()
	}
	now := nowOf(req)
	i := p.rng.IntN(len(c))
	j := p.rng.IntN(len(c) - 1)
	if j >= i {
		j++
	}
	w, reason, obs := choosePair(req, snap, now, c[i], c[j])
	if p.admission != nil {
		if err := admit(p.admission, w, obs, req); err != nil {
			return Pick{}, err
		}
	}
	return Pick{Worker: w, Reason: reason}, nil
}

// choosePair compares two sampled engines and returns the winner, the reason, and the
// winner's observation (as reported, uncorrected) for admission. a wins complete ties.
func choosePair(req *PickRequest, snap *load.Snapshot, now time.Time, a, b *Worker) (*Worker, string, load.Observation) {
	oa, ob := observe(snap, a, now), observe(snap, b, now)
	if oa.Native() && ob.Native() && req.Stage != StageDecode {
		pair := [2]latencyKey{latencyOf(a, &oa, uncachedOf(req, a), now), latencyOf(b, &ob, uncachedOf(req, b), now)}
		var buf [2]float64
		timed, _ := prepareKeys(pair[:], buf[:0])
		va, vb := pair[0].score(timed), pair[1].score(timed)
		slack := latencySlack * min(pair[0].ttft(timed), pair[1].ttft(timed))
		switch {
		case vb+slack < va:
			return b, ReasonPressure, ob
		case va+slack < vb:
			return a, ReasonPressure, oa
		}
		switch ka, kb := &pair[0], &pair[1]; {
		case ka.decode != kb.decode && kb.decode < ka.decode:
			return b, ReasonPressure, ob
		case ka.decode != kb.decode:
			return a, ReasonPressure, oa
		case kb.inflight < ka.inflight:
			return b, ReasonInFlight, ob
		}
		return a, ReasonTie, oa
	}
	if oa.Native() && ob.Native() {
		perDispatch := perDispatchTokens(req)
		ka, kb := keyOf(a, &oa, perDispatch), keyOf(b, &ob, perDispatch)
		switch c := comparePressure(req.Stage, &ka, &kb); {
		case c < 0:
			return a, ReasonPressure, oa
		case c > 0:
			return b, ReasonPressure, ob
		}
		if compareInFlight(b, a) < 0 {
			return b, ReasonInFlight, ob
		}
		return a, ReasonTie, oa
	}
	if compareInFlight(b, a) < 0 {
		return b, ReasonInFlight, ob
	}
	return a, ReasonInFlight, oa
}
