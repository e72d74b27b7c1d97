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
//   - the compared pressure is each report corrected for the dispatches the router made
//     since it was captured (keyOf, comparePressure): plain and prefill compare the
//     estimated prefill queue time, then waiting uncached tokens (each when both corrected
//     keys have it), then waiting requests and running requests; decode compares waiting
//     requests, running requests, KV usage fraction and used KV tokens. A pending dispatch
//     counts as a waiting request of the current request's input tokens, so an engine
//     whose report is older than a burst of dispatches no longer looks idle;
//   - a pressure tie falls back to in-flight; a complete tie keeps the first sample;
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
	w, reason, obs := choosePair(req.Stage, snap, now, perDispatchTokens(req), c[i], c[j])
	if p.admission != nil {
		if err := admit(p.admission, w, obs, req); err != nil {
			return Pick{}, err
		}
	}
	return Pick{Worker: w, Reason: reason}, nil
}

// choosePair compares two sampled engines and returns the winner, the reason, and the
// winner's observation (as reported, uncorrected) for admission. a wins complete ties.
func choosePair(stage Stage, snap *load.Snapshot, now time.Time, perDispatch int64, a, b *Worker) (*Worker, string, load.Observation) {
	oa, ob := observe(snap, a, now), observe(snap, b, now)
	if oa.Native() && ob.Native() {
		ka, kb := keyOf(a, &oa, perDispatch), keyOf(b, &ob, perDispatch)
		switch c := comparePressure(stage, &ka, &kb); {
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
