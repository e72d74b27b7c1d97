package engine

import "math/rand/v2"

// Random chooses uniformly among the candidates, then checks admission once.
type Random struct {
	admission EngineAdmission
	loads     LoadReader
	rng       *rand.Rand
}

var _ Policy = (*Random)(nil)

// NewRandom returns a random policy drawing from rng (owned by the policy from now on).
func NewRandom(adm EngineAdmission, loads LoadReader, rng *rand.Rand) *Random {
	return &Random{admission: adm, loads: loads, rng: rng}
}

// Name implements Policy.
func (*Random) Name() string { return PolicyRandom }

// Pick implements Policy.
func (p *Random) Pick(c []*Worker, req *PickRequest) (Pick, error) {
	if len(c) == 0 {
		return Pick{}, pickErr(OutcomeNoCandidates, req.Stage, req.BucketID, "")
	}
	return finish(p.admission, p.loads, c[p.rng.IntN(len(c))], req, ReasonRandom)
}
