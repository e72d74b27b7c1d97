package engine

import "fmt"

// EngineGroup owns one role group's membership and its policy. Pick resolves the live
// candidates (model, health, stage, membership; sorted by ID), invokes the policy, and
// rejects any result outside that exact candidate set.
//
// A group is owned by one goroutine at a time (its group actor): it caches the candidate set
// derived from the latest registry snapshot and reuses a request scratch, so it takes no locks.
type EngineGroup struct {
	model   string
	stage   Stage
	members map[string]struct{} // nil: every healthy worker of the model and stage
	policy  Policy

	// Cache of the candidates derived from reg; recomputed when the snapshot changes.
	reg        *Registry
	candidates []*Worker
	inSet      map[*Worker]struct{}
	req        PickRequest
	// kept is the scratch of a retried request's candidates without its excluded engines.
	kept []*Worker
}

// NewEngineGroup returns a group of model and stage using policy. memberIDs nil means every
// healthy engine of that model and stage; an empty non-nil slice means none.
func NewEngineGroup(model string, stage Stage, memberIDs []string, policy Policy) *EngineGroup {
	g := &EngineGroup{model: model, stage: stage, policy: policy}
	if memberIDs != nil {
		g.members = make(map[string]struct{}, len(memberIDs))
		for _, id := range memberIDs {
			g.members[id] = struct{}{}
		}
	}
	return g
}

// Stage returns the group's stage.
func (g *EngineGroup) Stage() Stage { return g.stage }

// Policy returns the group's policy.
func (g *EngineGroup) Policy() Policy { return g.policy }

// Candidates returns the group's current candidates in reg, sorted by ID. The slice is
// owned by the group and valid until the next call.
func (g *EngineGroup) Candidates(reg *Registry) []*Worker {
	if reg != g.reg {
		g.refresh(reg)
	}
	return g.candidates
}

func (g *EngineGroup) refresh(reg *Registry) {
	g.reg = reg
	g.candidates = g.candidates[:0]
	clear(g.inSet)
	if g.inSet == nil {
		g.inSet = make(map[*Worker]struct{})
	}
	if reg == nil {
		return
	}
	for _, w := range reg.Healthy(g.model, g.stage) {
		if g.members != nil {
			if _, ok := g.members[w.ID]; !ok {
				continue
			}
		}
		g.candidates = append(g.candidates, w)
		g.inSet[w] = struct{}{}
	}
}

// Pick selects one engine for req from the group's candidates in reg. The engines that
// failed for a retried request (req.Retry.Excluded) are not candidates: the policy never sees
// them, so an affinity binding that points at one is rebound by its policy's rules, and a
// group whose every candidate failed answers NoCandidates (the bucket loop moves on).
func (g *EngineGroup) Pick(reg *Registry, bucketID string, req *BucketRequest) (Pick, error) {
	if g.policy == nil {
		return Pick{}, pickErr(OutcomeInvalidConfiguration, g.stage, bucketID, "group has no policy")
	}
	if req.Model != g.model {
		return Pick{}, pickErr(OutcomeInvalidSignal, g.stage, bucketID,
			fmt.Sprintf("request for model %q reached a group of model %q", req.Model, g.model))
	}
	c := g.Candidates(reg)
	if len(c) == 0 {
		return Pick{}, pickErr(OutcomeNoCandidates, g.stage, bucketID, "no eligible engine in group")
	}
	ex := &req.Retry.Excluded
	if ex.Len() > 0 {
		// Slow path: a retried request.
		c = g.without(c, ex)
		if len(c) == 0 {
			return Pick{}, pickErr(OutcomeNoCandidates, g.stage, bucketID, "every eligible engine of the group failed for this request")
		}
	}
	g.req = PickRequest{BucketRequest: req, Stage: g.stage, BucketID: bucketID}
	p, err := g.policy.Pick(c, &g.req)
	g.req.BucketRequest = nil // do not retain the request
	if err != nil {
		return Pick{}, err
	}
	if _, ok := g.inSet[p.Worker]; !ok || p.Worker == nil || ex.Has(p.Worker) {
		id := "<nil>"
		if p.Worker != nil {
			id = p.Worker.ID
		}
		return Pick{}, pickErr(OutcomeOutsideCandidates, g.stage, bucketID,
			fmt.Sprintf("policy %s returned %s, not one of its %d candidates", g.policy.Name(), id, len(c)))
	}
	return p, nil
}

// without returns c less the excluded engines, in c's order, in the group's scratch (valid
// until the next pick).
func (g *EngineGroup) without(c []*Worker, ex *Exclusions) []*Worker {
	g.kept = g.kept[:0]
	for _, w := range c {
		if !ex.Has(w) {
			g.kept = append(g.kept, w)
		}
	}
	return g.kept
}
