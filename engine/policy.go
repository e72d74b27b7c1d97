package engine

import (
	"switchyard/config"
	"time"

	"switchyard/load"
)

// Policy selects one engine from a group's candidates. Implementations own their state and
// the shared-state handles injected at construction (load table, affinity store, cache
// source), read their observations themselves, and decide where admission is checked.
//
// Pick is synchronous: anything needing I/O (a remote prefix lookup) is resolved before the
// pick and carried in the request (see PickRequest.Prefix). candidates is non-nil, sorted by
// ID, and must not be modified or retained. A policy instance is owned by one group and is
// called by one goroutine at a time (its group actor); it needs no locks for its own state.
type Policy interface {
	// Pick returns one candidate with a reason, or a *PickError.
	Pick(candidates []*Worker, req *PickRequest) (Pick, error)
	// Name is the policy's configuration name ("power_of_two").
	Name() string
}

// Pick is one chosen engine and the reason it was chosen (for metrics and tracing), and,
// when the group chose one (dp_dispatch), the engine's data-parallel rank.
type Pick struct {
	Worker *Worker
	Reason string
	// Rank is the data-parallel rank to send the request to when HasRank.
	Rank    int
	HasRank bool
	// LoadAdapter: the engine does not hold the request's adapter yet and has a free slot;
	// dispatch loads the adapter before it forwards the request.
	LoadAdapter bool
	// ReplicateAdapter: LoadAdapter onto an engine picked beside engines that hold the
	// adapter already (lora.replicate_above).
	ReplicateAdapter bool
	// Reservation is the pick's share in the reservation of its adapter slot, with
	// LoadAdapter: a pick that is not dispatched gives it back (AbandonAdapter).
	Reservation AdapterReservation
}

// Selection reasons of the load policies.
const (
	ReasonRoundRobin = "round_robin"
	ReasonRandom     = "random"
	ReasonSingle     = "single_candidate"
	ReasonPressure   = "lower_pressure"
	ReasonInFlight   = "inflight_fallback"
	ReasonTie        = "tie"
	ReasonLeastLoad  = "least_load"
)

// BucketRequest carries the prepared routing facts of one request: everything a bucket
// attempt needs and nothing of HTTP. The handler builds it once; every bucket attempt reads it.
type BucketRequest struct {
	// Model is the requested model.
	Model string
	// InputTokens is the prompt length in tokens.
	InputTokens int64
	// ExpectedPeak is input plus requested output, or -1 when the output budget is unknown.
	ExpectedPeak int64
	// TokenIDs are the prompt's token IDs when tokenized; nil otherwise.
	TokenIDs []uint32
	// SessionKey is the session-affinity key, or "".
	SessionKey string
	// RoutingKey is the sticky routing key, or "".
	RoutingKey string
	// Adapter is the LoRA adapter the request names (its model field), or "": the groups'
	// candidates are then the engines holding it (see EngineGroup.Pick).
	Adapter string
	// HashKey is consistent_hash's key: the value of the first configured hashing header
	// present (hashing.key_headers), or "".
	HashKey string
	// Prefix is the request's prefix-lookup memo, shared by every bucket attempt; nil when no
	// policy of the model needs it.
	Prefix PrefixMatcher
	// Now is the request's observation time: freshness and expiry are judged against it.
	Now time.Time
	// Retry is zero on a first attempt; RetryAfter fills it when a dispatch failed, and the
	// next selection follows the retry rule (same bucket first, failed engines excluded).
	Retry Retry
	// SLO are the request's latency targets (zero: none); they order the buckets of a
	// model whose bucket_order is slo.
	SLO SLOTargets
	// Observer, when set, is told of each bucket attempt of the selections (BucketLoop);
	// nil records nothing (tracing off).
	Observer AttemptObserver
}

// HasPeak reports whether the expected peak is known.
func (r *BucketRequest) HasPeak() bool { return r.ExpectedPeak >= 0 }

// PickRequest is a BucketRequest as seen by one group of one bucket: the bucket adds its ID
// and the group's stage.
type PickRequest struct {
	*BucketRequest
	// Stage is the stage of the group being asked.
	Stage Stage
	// BucketID is the bucket the pick is for.
	BucketID string
}

// PrefixMatcher answers how many leading prompt tokens an engine already holds in cache. It
// is the request-scoped memo of one prefix lookup (local index or remote indexer), made once
// per request before any pick and shared by every bucket attempt; each policy restricts it to
// its own candidates. Implemented by the kv package (which cannot import engine, hence IDs).
type PrefixMatcher interface {
	// MatchedTokens returns the number of leading prompt tokens worker workerID holds.
	MatchedTokens(workerID string) int64
	// Status reports whether the lookup succeeded (ok), and otherwise whether the source was
	// unavailable (a miss that stays distinguishable in metrics, unavailable=true) or the
	// query was rejected (err, an invalid signal).
	Status() (ok, unavailable bool, err error)
}

// RankMatcher is a PrefixMatcher that also knows which data-parallel ranks of an engine hold
// its longest prefix (the kv package's memo, over a local index or a remote indexer that
// reports ranks). Rank dispatch of a cache_aware group prefers those ranks.
type RankMatcher interface {
	// MatchedRanks returns the ranks of worker workerID (bit r for rank r, ranks below 64)
	// holding its MatchedTokens; 0 when unknown or none.
	MatchedRanks(workerID string) uint64
}

// LoadReader gives a policy its load observations: the engine-reported load table.
type LoadReader interface {
	Load() *load.Snapshot
}

// observe reads w's observation from snap at now, or the unknown observation without a table.
func observe(snap *load.Snapshot, w *Worker, now time.Time) load.Observation {
	if snap == nil {
		return load.Observation{}
	}
	return snap.Observe(w.ID, now)
}

// Policy names, as configured.
const (
	PolicyRoundRobin     = config.PolicyRoundRobin
	PolicyRandom         = config.PolicyRandom
	PolicyPowerOfTwo     = config.PolicyPowerOfTwo
	PolicyLoadBased      = config.PolicyLoadBased
	PolicySessionAware   = config.PolicySessionAware
	PolicySticky         = config.PolicySticky
	PolicyCacheAware     = config.PolicyCacheAware
	PolicyConsistentHash = config.PolicyConsistentHash
	PolicyPrefixHash     = config.PolicyPrefixHash
)
