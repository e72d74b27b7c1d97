package engine

import (
	"fmt"
	"math"
	"slices"
	"sync/atomic"
	"time"
)

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
	// partner and rule are set by PickFor for the duration of one pick: the engine already
	// chosen for the other side of the pair and the bucket's compatibility rule (symmetric);
	// compatible is the scratch of the candidates that pass it.
	partner    *Worker
	rule       Compatibility
	compatible []*Worker
	// loadAdapters: with no candidate holding a request's adapter, the engines loading it, else
	// those with the most free adapter slots, are the candidates, and the pick reserves a slot for
	// loadTimeout and loads it (lora.auto_load).
	loadAdapters bool
	loadTimeout  time.Duration
	// evictable are the adapters the group may unload from a full engine to make room
	// (lora.evict: those it can load again); nil evicts none.
	evictable map[string]struct{}
	// replicateAbove, when more than 0, loads a held adapter with more than that many
	// requests in flight onto one more engine when its holders are more than that many
	// requests busier than it (see replica); 0 never does.
	replicateAbove int64
	// adapted is the scratch of an adapter request's candidates.
	adapted []*Worker
	// ranks chooses the DP rank of a multi-rank engine (dp_dispatch); nil leaves it to the
	// engine.
	ranks *rankPicker

	// shared caches the healthy members of one registry snapshot for readers outside the
	// group's owner (SLO estimates); replaced, never modified, when the snapshot changes.
	shared atomic.Pointer[sharedMembers]
}

// sharedMembers are a group's healthy members in one registry snapshot.
type sharedMembers struct {
	reg     *Registry
	workers []*Worker
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

// Member reports whether w belongs to the group's membership (every worker when the group
// names none). It reads only what construction set, so any goroutine may call it; model,
// stage and health are not checked.
func (g *EngineGroup) Member(w *Worker) bool {
	if g.members == nil {
		return true
	}
	_, ok := g.members[w.ID]
	return ok
}

// HealthyMembers returns the group's healthy members in reg, sorted by ID: what
// Candidates returns, for any goroutine. The slice is shared and must not be modified; it
// is computed once per registry snapshot.
func (g *EngineGroup) HealthyMembers(reg *Registry) []*Worker {
	if m := g.shared.Load(); m != nil && m.reg == reg {
		return m.workers
	}
	// Slow path: the registry changed since the last call.
	var ws []*Worker
	if reg != nil {
		for _, w := range reg.Healthy(g.model, g.stage) {
			if g.Member(w) {
				ws = append(ws, w)
			}
		}
	}
	g.shared.Store(&sharedMembers{reg: reg, workers: ws})
	return ws
}

// Model returns the group's model.
func (g *EngineGroup) Model() string { return g.model }

// PickFor is Pick for one side of a PD pair whose other engine is already chosen (partner):
// the candidates are the group's engines that rule pairs with it. A decode group picks for
// the chosen prefill engine; with a bucket's PD bypass on, the decode group picks first and
// the prefill group picks for it. When no candidate pairs, it fails with
// OutcomePDIncompatible (the bucket loop moves on, discarding the other pick). An empty rule
// or a nil partner is Pick.
func (g *EngineGroup) PickFor(reg *Registry, bucketID string, req *BucketRequest, partner *Worker, rule Compatibility) (Pick, error) {
	if partner == nil || len(rule) == 0 {
		return g.Pick(reg, bucketID, req)
	}
	g.partner, g.rule = partner, rule
	defer func() { g.partner, g.rule = nil, nil }()
	return g.Pick(reg, bucketID, req)
}

// keepCompatible returns the candidates of c that g.rule pairs with g.partner, in c's
// order, in the group's scratch (valid until the next pick).
func (g *EngineGroup) keepCompatible(c []*Worker) []*Worker {
	g.compatible = g.compatible[:0]
	for _, w := range c {
		if g.rule.Pairs(g.partner, w) {
			g.compatible = append(g.compatible, w)
		}
	}
	return g.compatible
}

// incompatible is the failure of a pick that found no engine g.rule pairs with g.partner.
func (g *EngineGroup) incompatible(bucketID string) *PickError {
	side, other := "decode", "prefill"
	if g.stage == StagePrefill {
		side, other = other, side
	}
	return &PickError{Outcome: OutcomePDIncompatible, Stage: g.stage, BucketID: bucketID,
		Rejections: []Rejection{{BucketID: bucketID, Stage: g.stage, WorkerID: g.partner.ID, Limit: LimitPDIncompatible}},
		Detail:     "no " + side + " engine shares " + g.rule.describe(g.partner) + " with " + other + " engine " + g.partner.ID}
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
	if g.partner != nil {
		// One side of a PD pair: only engines compatible with the other side's engine.
		if c = g.keepCompatible(c); len(c) == 0 {
			return Pick{}, g.incompatible(bucketID)
		}
	}
	load := false
	var replica *Worker // the engine that may load the adapter beside its holders
	var now time.Time
	if req.Adapter != "" {
		// Slow path: a LoRA adapter request.
		if now = req.Now; now.IsZero() {
			now = time.Now()
		}
		all := c
		if c, load, replica = g.withAdapter(c, req.Adapter, now); len(c) == 0 {
			detail := "no eligible engine of the group holds adapter " + req.Adapter
			if g.loadAdapters {
				detail += " or has a free adapter slot"
			}
			e := pickErr(OutcomeNoCandidates, g.stage, bucketID, detail)
			if g.evictable != nil {
				e.Detail += " or an adapter to evict that no request uses"
				if g.slotsInUse(all, now) {
					e.Err = ErrAdapterSlotsInUse
				}
			}
			return Pick{}, e
		}
	}
	p, err := g.pickFrom(c, req, bucketID)
	if err != nil {
		return Pick{}, err
	}
	evictable := g.evictable
	if replica != nil {
		// Slow path: a held adapter with one more engine offered; only it loads, into a
		// free slot (a replica never evicts).
		load, evictable = p.Worker == replica, nil
		p.ReplicateAdapter = load
	}
	reserved, returned := false, false
	if load {
		p.Reservation, reserved = p.Worker.ReserveAdapter(req.Adapter, now, now.Add(g.loadTimeout), evictable)
		if reserved {
			// Slow path: until the pick is returned, a panic (the rank dispatch below reads
			// the load table and the prefix lookup) must not lose the share it holds.
			defer func() {
				if !returned {
					p.AbandonAdapter()
				}
			}()
		}
		if reserved && p.Reservation == (AdapterReservation{}) {
			load, p.ReplicateAdapter = false, false // the engine holds it already: nothing to load
		}
	}
	if load && !reserved {
		// Slow path: another group took the engine's last free slot since the candidates
		// were read.
		if replica == nil {
			e := pickErr(OutcomeNoCandidates, g.stage, bucketID, "engine "+p.Worker.ID+" has no free adapter slot left for "+req.Adapter)
			if evictable != nil && g.slotsInUse([]*Worker{p.Worker}, now) {
				e.Err = ErrAdapterSlotsInUse
			}
			return Pick{}, e
		}
		// The adapter's holders are still there: one of them serves the request.
		c = slices.DeleteFunc(c, func(w *Worker) bool { return w == replica })
		if p, err = g.pickFrom(c, req, bucketID); err != nil {
			return Pick{}, err
		}
		load = false
	}
	p.LoadAdapter = load
	if g.ranks != nil && p.Worker.DPSize > 1 {
		// Slow path: the router chooses the engine's data-parallel rank.
		now := req.Now
		if now.IsZero() {
			now = time.Now()
		}
		rank, limit := g.ranks.pick(p.Worker, now, req.Prefix)
		if limit != "" {
			p.AbandonAdapter() // the slot it reserved is free again
			return Pick{}, &PickError{Outcome: OutcomeAdmissionRejected, Stage: g.stage, BucketID: bucketID,
				Rejections: []Rejection{{BucketID: bucketID, Stage: g.stage, WorkerID: p.Worker.ID, Limit: limit}}}
		}
		p.Rank, p.HasRank = rank, true
	}
	returned = true
	return p, nil
}

// pickFrom asks the policy for one of candidates c and checks its answer is one of them.
func (g *EngineGroup) pickFrom(c []*Worker, req *BucketRequest, bucketID string) (Pick, error) {
	g.req = PickRequest{BucketRequest: req, Stage: g.stage, BucketID: bucketID}
	p, err := g.policy.Pick(c, &g.req)
	g.req.BucketRequest = nil // do not retain the request
	if err != nil {
		return Pick{}, err
	}
	if _, ok := g.inSet[p.Worker]; !ok || p.Worker == nil || req.Retry.Excluded.Has(p.Worker) ||
		g.partner != nil && !g.rule.Pairs(g.partner, p.Worker) || req.Adapter != "" && !slices.Contains(c, p.Worker) {
		id := "<nil>"
		if p.Worker != nil {
			id = p.Worker.ID
		}
		return Pick{}, pickErr(OutcomeOutsideCandidates, g.stage, bucketID,
			fmt.Sprintf("policy %s returned %s, not one of its %d candidates", g.policy.Name(), id, len(c)))
	}
	return p, nil
}

// withAdapter returns the candidates of c holding adapter name (a reservation of theirs that
// lapsed at now before its load began gives back the adapter it evicted first), in c's
// order, in the group's scratch, and with replication on, the replica (one more engine that
// may load it; nil when none) among them; when none holds it and the group loads adapters,
// the candidates loading it, else those with the most free adapter slots at now, else
// (evicting) those with an adapter to evict, and load true.
func (g *EngineGroup) withAdapter(c []*Worker, name string, now time.Time) (out []*Worker, load bool, replica *Worker) {
	g.adapted = g.adapted[:0]
	for _, w := range c {
		w.expireLoads(now) // a lapsed reservation's victim is held again (no load evicted it)
		if w.Adapters().Has(name) {
			g.adapted = append(g.adapted, w)
		}
	}
	if len(g.adapted) > 0 {
		if g.replicateAbove > 0 && g.loadAdapters && len(g.adapted) < len(c) {
			if replica = g.replica(c, name, now); replica != nil {
				// Slow path: the holders again, with the replica in its place in c's order.
				g.adapted = g.adapted[:0]
				for _, w := range c {
					if w == replica || w.Adapters().Has(name) {
						g.adapted = append(g.adapted, w)
					}
				}
				return g.adapted, true, replica
			}
		}
		return g.adapted, false, nil
	}
	if !g.loadAdapters {
		return g.adapted, false, nil
	}
	for _, w := range c {
		if w.Adapters().Loading(name, now) {
			g.adapted = append(g.adapted, w)
		}
	}
	if len(g.adapted) > 0 {
		return g.adapted, true, nil // wait for the load under way rather than start another
	}
	// The engines with the most free slots: an adapter no engine holds goes where the fewest
	// adapters are, so that the first loads spread over the fleet rather than gather on the
	// engine the policy happens to prefer while every engine is still idle.
	most := 0
	for _, w := range c {
		if n := w.Adapters().FreeSlots(now); n > most {
			most = n
		}
	}
	for _, w := range c {
		if most > 0 && w.Adapters().FreeSlots(now) == most {
			g.adapted = append(g.adapted, w)
		}
	}
	if len(g.adapted) > 0 || g.evictable == nil {
		return g.adapted, true, nil
	}
	// Slow path: every slot full; the engines that could evict an adapter no request uses.
	for _, w := range c {
		if w.Adapters().CanEvict(g.evictable) {
			g.adapted = append(g.adapted, w)
		}
	}
	return g.adapted, true, nil
}

// slotsInUse reports whether an engine of c has an adapter slot that the end of a request or
// of a load under way may free for eviction at now (AdapterSet.InUse).
func (g *EngineGroup) slotsInUse(c []*Worker, now time.Time) bool {
	return slices.ContainsFunc(c, func(w *Worker) bool { return w.Adapters().InUse(g.evictable, now) })
}

// replicaSpareSlots are the free adapter slots a replica leaves on its engine: a replica
// never takes an engine's last free slot, which stays for an adapter no engine holds.
const replicaSpareSlots = 1

// replica returns the engine of c that may load adapter name beside its holders (g.adapted,
// not empty), or nil. It is the engine not holding the adapter with the fewest requests in
// flight (router-local, cluster peers included; the first in c's order on a tie) among those
// with more than replicaSpareSlots free slots at now, offered when the adapter has more than
// g.replicateAbove requests in flight on its holders together, every holder has more than
// g.replicateAbove requests in flight beyond that engine, and no engine of c is loading the
// adapter already (one replica load at a time, so requests do not herd onto loads). The
// first condition keeps a cold adapter on a busy engine where it is: moving its few requests
// would not relieve the engine, and its replica would take a slot a hot adapter may need.
// O(len(c)).
func (g *EngineGroup) replica(c []*Worker, name string, now time.Time) *Worker {
	busy, own := int64(math.MaxInt64), int64(0)
	for _, w := range g.adapted {
		busy, own = min(busy, w.Counters.InFlight()), own+w.Adapters().InFlight(name)
	}
	if own <= g.replicateAbove {
		return nil // fast path: the adapter is not busy
	}
	var best *Worker
	var least int64
	for _, w := range c {
		s := w.Adapters()
		if s.Has(name) {
			continue
		}
		if s.Loading(name, now) {
			return nil
		}
		if s.FreeSlots(now) <= replicaSpareSlots {
			continue
		}
		if n := w.Counters.InFlight(); best == nil || n < least {
			best, least = w, n
		}
	}
	if best == nil || busy-least <= g.replicateAbove {
		return nil
	}
	return best
}

// SetAdapterLoading makes the group offer the engines loading a request's LoRA adapter, else
// those with the most free adapter slots, when no candidate holds it; the pick then reserves
// the slot for loadTimeout (a load lasts at most that long) and says to load it (Pick.LoadAdapter). With
// evictable non-nil, when every candidate's slots are full, the engines holding an adapter of
// evictable that no request uses are offered too: the pick evicts the engine's least recently
// used such adapter (AdapterSet.Evicting names it, for dispatch to unload first).
func (g *EngineGroup) SetAdapterLoading(loadTimeout time.Duration, evictable map[string]struct{}) {
	g.loadAdapters, g.loadTimeout = loadTimeout > 0, loadTimeout
	if g.loadAdapters {
		g.evictable = evictable
	}
}

// SetAdapterReplication makes a group that loads adapters (SetAdapterLoading first) offer,
// beside the holders of a request's adapter, the least busy engine with a spare free slot
// when every holder has more than above requests in flight beyond it (see replica); a pick of
// it reserves the slot and says to load the adapter (Pick.LoadAdapter and
// Pick.ReplicateAdapter). 0 turns replication off.
func (g *EngineGroup) SetAdapterReplication(above int64) {
	g.replicateAbove = max(above, 0)
}

// SetRankDispatch makes the group choose the data-parallel rank of the multi-rank engines
// it picks (see rankPicker), reading loads; maxWaitingPerRank (0: none) caps each rank's
// waiting requests.
func (g *EngineGroup) SetRankDispatch(loads LoadReader, maxWaitingPerRank int64) {
	g.ranks = newRankPicker(loads, maxWaitingPerRank)
}

// SetRankPrefix makes the group's rank dispatch (SetRankDispatch first) prefer the ranks that
// hold the request's longest prefix on the engine picked (a cache_aware group), unless such a
// rank waits more than guard requests beyond the least loaded rank.
func (g *EngineGroup) SetRankPrefix(guard int64) {
	if g.ranks != nil {
		g.ranks.prefix, g.ranks.guard = true, max(guard, 0)
	}
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
