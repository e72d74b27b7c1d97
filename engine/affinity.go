package engine

import (
	"cmp"
	"crypto/sha256"
	"errors"
	"slices"
	"strings"
	"time"

	"switchyard/kv"
	"switchyard/load"
)

// AffinityScope names one set of bindings: the bindings of one engine group, identified by
// its model, bucket and stage. Keys of different scopes never interact, so a session bound in
// one bucket (or in the prefill group) says nothing about another bucket (or the decode group).
type AffinityScope struct {
	Model    string
	BucketID string
	Stage    Stage
}

// String returns "model/bucket/stage".
func (s AffinityScope) String() string {
	return s.Model + "/" + s.BucketID + "/" + s.Stage.String()
}

// AffinityStore holds the session and routing-key bindings that the affinity policies
// (session_aware, sticky) consume: per scope, key → worker ID (POLICY_DESIGN section 6,
// "Affinity state"). The store owns idle expiry, worker invalidation, the per-scope bound and
// atomic updates; the policies decide when to reuse or replace a binding. Expiry sweeps and
// invalidation are driven by the application through the implementation, never by policies.
//
// Bindings hold worker IDs, not *Worker, so that a store shared by several router replicas
// (a cluster-backed store) can implement the same contract. Calls are synchronous, made by a
// policy from its group's goroutine; an implementation bounds each call with a deadline.
// An error unwrapping to ErrTimeout (a missed deadline) sends the request to the policy's
// fallback, unbound; one unwrapping to ErrOverloaded is reported as that outcome; any other
// error is an internal failure.
type AffinityStore interface {
	// Lookup returns the worker ID key is bound to in scope, or "" when the key has no live
	// binding (never bound, expired, evicted or invalidated). A hit is a use: it refreshes
	// the binding's idle time at now.
	Lookup(scope AffinityScope, key string, now time.Time) (workerID string, err error)
	// Bind is a compare-and-set: when key's live binding in scope is expect ("" for none),
	// it binds key to workerID at now and returns (workerID, true); otherwise it changes
	// nothing and returns the binding in force ("" when there is none) and false. Concurrent
	// first assignments of one key therefore converge: exactly one Bind with expect "" sets
	// the binding, the others learn the winner.
	Bind(scope AffinityScope, key, expect, workerID string, now time.Time) (bound string, set bool, err error)
}

// Selection reasons of the affinity policies.
const (
	// ReasonNoSession: session_aware had no session key; power_of_two chose, nothing was bound.
	ReasonNoSession = "no_session"
	// ReasonNoRoutingKey: sticky had no routing key; its fallback chose, nothing was bound.
	ReasonNoRoutingKey = "no_routing_key"
	// ReasonAssigned: a new binding was created for the chosen engine.
	ReasonAssigned = "assigned"
	// ReasonSessionPrimary: session_aware reused the session's bound engine.
	ReasonSessionPrimary = "session_primary"
	// ReasonSessionRebound: the session's engine left the group; it was bound to a new one.
	ReasonSessionRebound = "session_rebound"
	// ReasonHit: sticky reused the routing key's bound engine.
	ReasonHit = "hit"
	// ReasonRemap: the routing key's engine left the candidates; it was pinned to a new one.
	ReasonRemap = "remap"
	// ReasonPrefixHolder: the key had no live binding (new, expired, or lost with a crashed
	// cluster replica's partition); it was bound to the candidate holding the request's
	// longest cached prefix rather than the fallback's choice (affinity.prefix_rebind).
	ReasonPrefixHolder = "prefix_holder"
	// ReasonStoreTimeout: the affinity store missed its deadline on the key's lookup or
	// bind; the prefix holder (affinity.prefix_rebind) or else the fallback chose, and
	// nothing was bound by this request.
	ReasonStoreTimeout = "store_timeout"
)

// MaxAffinityKeyBytes is the longest session or routing key stored as is. A longer key (a
// header value can be kilobytes) is bound under a fixed-size digest instead, so that a
// scope's bound on bindings also bounds its memory; the digest is stable across processes,
// so replicas sharing a store agree on it.
const MaxAffinityKeyBytes = 128

// digestPrefix marks a digested key; a header value cannot contain NUL, so no literal key
// collides with a digest.
const digestPrefix = "\x00sha256:"

// storeKey returns the key under which key is bound.
func storeKey(key string) string {
	if len(key) <= MaxAffinityKeyBytes {
		return key
	}
	// Slow path: an oversized key.
	sum := sha256.Sum256([]byte(key))
	return digestPrefix + string(sum[:16])
}

// maxBindAttempts bounds the compare-and-set rounds of one pick. A round is lost only when a
// concurrent writer bound the key to an engine that is not one of this group's candidates
// (a winner that is a candidate is adopted at once), so two rounds settle any realistic race;
// the third is slack.
const maxBindAttempts = 3

// affinityReasons are the reasons one affinity policy reports.
type affinityReasons struct {
	noKey, reuse, rebound string
}

// affinity is the selection shared by session_aware and sticky: reuse an admitted binding;
// otherwise ask the fallback (built with default admission), check its engine, and bind it
// with a compare-and-set, adopting (after checking it) a concurrent winner. A store that
// misses its deadline (ErrTimeout) leaves the request to the slow path's engine (prefix
// holder or fallback), unbound; any other store failure fails the pick.
type affinity struct {
	store     AffinityStore
	admission EngineAdmission
	loads     LoadReader
	fallback  Policy
	reasons   affinityReasons

	// prefixSource, when set, makes a key without a live binding prefer the prefix holder
	// (PreferPrefixHolders); holders is its scratch (one goroutine owns the policy).
	prefixOn     bool
	prefixSource kv.CacheSource
	prefixMin    int64
	holders      []prefixHolder
}

// prefixHolder is a candidate holding part of the request's prompt in its cache.
type prefixHolder struct {
	w       *Worker
	matched int64
}

// PreferPrefixHolders makes a key that has no live binding in scope (a new key, an expired
// or evicted binding, or one lost with a crashed cluster replica's partition) bind to the
// candidate holding the longest cached prefix of the request, at least minMatchedTokens,
// that passes this policy's admission (reason prefix_holder), before asking the fallback.
// The matches come from the request's prefix memo (req.Prefix) resolved against source
// (the process's cache source; nil reads req.Prefix as it is);
// without a memo, or when no candidate holds enough, the fallback chooses as before. A
// session whose binding is lost therefore returns to the engine that still caches its
// conversation. Call it once, at construction.
func (a *affinity) PreferPrefixHolders(source kv.CacheSource, minMatchedTokens int64) {
	a.prefixOn, a.prefixSource = true, source
	a.prefixMin = max(minMatchedTokens, 1)
}

// pick runs the affinity selection for key (possibly "") over the candidates c.
func (a *affinity) pick(c []*Worker, req *PickRequest, key string) (Pick, error) {
	if len(c) == 0 {
		return Pick{}, pickErr(OutcomeNoCandidates, req.Stage, req.BucketID, "")
	}
	if a.fallback == nil {
		return Pick{}, pickErr(OutcomeInvalidConfiguration, req.Stage, req.BucketID, "affinity policy has no fallback")
	}
	if key == "" {
		// No key: the fallback chooses and nothing is bound.
		p, err := a.fallback.Pick(c, req)
		if err != nil {
			return Pick{}, err
		}
		return finish(a.admission, a.loads, p.Worker, req, a.reasons.noKey)
	}
	if a.store == nil {
		return Pick{}, pickErr(OutcomeInvalidConfiguration, req.Stage, req.BucketID, "affinity policy has no store")
	}
	scope := AffinityScope{Model: req.Model, BucketID: req.BucketID, Stage: req.Stage}
	key = storeKey(key)
	now := nowOf(req)
	bound, err := a.store.Lookup(scope, key, now)
	lookedUp := err == nil
	if err != nil && !errors.Is(err, ErrTimeout) {
		return Pick{}, storeErr(err, req, "look up binding")
	}
	// Fast path: the key is bound to a candidate. Reuse it whatever its pressure when admitted;
	// a rejection keeps the binding and ends this attempt (the bucket loop moves on).
	if w := candidateByID(c, bound); w != nil {
		return finish(a.admission, a.loads, w, req, a.reasons.reuse)
	}

	// Slow path: a new key, a binding outside the candidates, or a lookup that missed the
	// store's deadline. The prefix holder (when configured) or else the fallback chooses with
	// default admission, then this policy checks its engine; a binding follows admission.
	w, fromPrefix := a.prefixHolder(c, req), true
	if w == nil {
		fromPrefix = false
		p, err := a.fallback.Pick(c, req)
		if err != nil {
			return Pick{}, err
		}
		w = candidateByID(c, workerID(p.Worker))
		if w == nil || w != p.Worker {
			return Pick{}, pickErr(OutcomeOutsideCandidates, req.Stage, req.BucketID,
				"fallback "+a.fallback.Name()+" returned an engine outside its candidates")
		}
		if err := admit(a.admission, w, observeFor(a.admission, a.loads, w, req), req); err != nil {
			return Pick{}, err
		}
	}
	if !lookedUp {
		// The store did not answer in time: the host was starved of CPU for a moment, or the
		// scope is stuck. A binding is a preference for a warm cache, not a condition of
		// service: serve the admitted engine unbound rather than fail the request, and bind
		// nothing while the binding in force is unknown.
		return Pick{Worker: w, Reason: ReasonStoreTimeout}, nil
	}
	expect := bound
	for range maxBindAttempts {
		reason := ReasonAssigned
		switch {
		case fromPrefix:
			reason = ReasonPrefixHolder
		case expect != "":
			reason = a.reasons.rebound
		}
		got, set, err := a.store.Bind(scope, key, expect, w.ID, now)
		if errors.Is(err, ErrTimeout) {
			// As a lookup past its deadline: w is an admitted candidate; serve it unbound.
			return Pick{Worker: w, Reason: ReasonStoreTimeout}, nil
		}
		if err != nil {
			return Pick{}, storeErr(err, req, "bind")
		}
		if set {
			return Pick{Worker: w, Reason: reason}, nil
		}
		// A concurrent binding won. When it is this very engine, w's check stands; another
		// winner among the candidates is adopted, but only after this policy's own check (a
		// rejection leaves it bound).
		if got == w.ID {
			return Pick{Worker: w, Reason: a.reasons.reuse}, nil
		}
		if cw := candidateByID(c, got); cw != nil {
			return finish(a.admission, a.loads, cw, req, a.reasons.reuse)
		}
		// The winner is not a candidate here (or vanished): replace it, at most a few times.
		expect = got
	}
	// Contention never settled. w is an admitted candidate: serve the request unbound rather
	// than fail it; the next request of the key binds again.
	return Pick{Worker: w, Reason: ReasonAssigned}, nil
}

// prefixHolder returns the admitted candidate holding the longest cached prefix of the
// request (at least prefixMin tokens; ties to the lower ID), or nil: not configured, no
// prefix lookup, none holds enough, or every holder fails admission. A rejected or
// unavailable lookup is not an error here: the fallback chooses.
func (a *affinity) prefixHolder(c []*Worker, req *PickRequest) *Worker {
	if !a.prefixOn {
		return nil
	}
	pm, _, err := prefixOf(req, a.prefixSource)
	if pm == nil || err != nil {
		return nil
	}
	hs := a.holders[:0]
	for _, w := range c {
		m := pm.MatchedTokens(w.ID)
		if req.InputTokens > 0 {
			m = min(m, req.InputTokens)
		}
		if m >= a.prefixMin {
			hs = append(hs, prefixHolder{w: w, matched: m})
		}
	}
	a.holders = hs
	// Candidates come sorted by ID, so a stable sort on matched keeps the lower ID first.
	slices.SortStableFunc(hs, func(x, y prefixHolder) int { return cmp.Compare(y.matched, x.matched) })
	for i := range hs {
		w := hs[i].w
		if admit(a.admission, w, observeFor(a.admission, a.loads, w, req), req) == nil {
			clear(a.holders)
			return w
		}
	}
	clear(a.holders)
	return nil
}

// observeFor reads w's observation for adm, or nothing when there is no admission to feed.
func observeFor(adm EngineAdmission, loads LoadReader, w *Worker, req *PickRequest) (obs load.Observation) {
	if adm == nil || loads == nil {
		return obs
	}
	return observe(loads.Load(), w, nowOf(req))
}

// candidateByID returns the candidate with the given ID, or nil. Groups pass candidates
// sorted by ID, so a hit is a binary search; a miss (a binding outside the group, which is
// rare) is confirmed by a scan, so that a caller passing unsorted candidates is still right.
func candidateByID(c []*Worker, id string) *Worker {
	if id == "" {
		return nil
	}
	if len(c) > 8 {
		if i, ok := slices.BinarySearchFunc(c, id, func(w *Worker, id string) int { return strings.Compare(w.ID, id) }); ok {
			return c[i]
		}
	}
	for _, w := range c {
		if w.ID == id {
			return w
		}
	}
	return nil
}

// workerID returns w's ID, or "" for nil.
func workerID(w *Worker) string {
	if w == nil {
		return ""
	}
	return w.ID
}

// storeErr turns an affinity store failure into the pick's error: overload and deadline keep
// their outcome, anything else is internal. (pick itself serves a missed deadline unbound.)
func storeErr(err error, req *PickRequest, op string) *PickError {
	out := OutcomeInternal
	switch {
	case errors.Is(err, ErrOverloaded):
		out = OutcomeOverloaded
	case errors.Is(err, ErrTimeout):
		out = OutcomeTimeout
	}
	detail := "cannot " + op + " in affinity store"
	var pe *PickError
	if errors.As(err, &pe) {
		// Keep the store's own detail and cause without nesting its outcome twice.
		if pe.Detail != "" {
			detail += ": " + pe.Detail
		}
		err = pe.Err
	}
	return &PickError{Outcome: out, Stage: req.Stage, BucketID: req.BucketID, Detail: detail, Err: err}
}
