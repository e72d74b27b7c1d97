package engine

import (
	"time"

	"switchyard/load"
)

// RoundRobin rotates over the candidates with a cursor owned by this policy instance, then
// checks admission once on the chosen engine.
type RoundRobin struct {
	admission EngineAdmission
	loads     LoadReader
	cursor    uint64
}

var _ Policy = (*RoundRobin)(nil)

// NewRoundRobin returns a round-robin policy. loads may be nil when admission needs no
// reported metrics.
func NewRoundRobin(adm EngineAdmission, loads LoadReader) *RoundRobin {
	return &RoundRobin{admission: adm, loads: loads}
}

// Name implements Policy.
func (*RoundRobin) Name() string { return PolicyRoundRobin }

// Pick implements Policy.
func (p *RoundRobin) Pick(c []*Worker, req *PickRequest) (Pick, error) {
	if len(c) == 0 {
		return Pick{}, pickErr(OutcomeNoCandidates, req.Stage, req.BucketID, "")
	}
	w := c[p.cursor%uint64(len(c))]
	p.cursor++
	return finish(p.admission, p.loads, w, req, ReasonRoundRobin)
}

// finish checks admission on a policy's single chosen engine, reading its observation only
// when there is an admission to feed.
func finish(adm EngineAdmission, loads LoadReader, w *Worker, req *PickRequest, reason string) (Pick, error) {
	if adm == nil {
		return Pick{Worker: w, Reason: reason}, nil
	}
	var obs load.Observation
	if loads != nil {
		obs = observe(loads.Load(), w, nowOf(req))
	}
	if err := admit(adm, w, obs, req); err != nil {
		return Pick{}, err
	}
	return Pick{Worker: w, Reason: reason}, nil
}

func nowOf(req *PickRequest) time.Time {
	if req.BucketRequest == nil || req.Now.IsZero() {
		return time.Now()
	}
	return req.Now
}
