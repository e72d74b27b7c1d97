package engine

import "switchyard/internal/mix"

// ConsistentHash (configured as "consistent_hash") routes by a key the handler reads from the
// configured headers (hashing.key_headers, the first one present) on a consistent-hash ring
// with bounded load (see hashRing). It keeps no shared state: router replicas and restarts
// agree on every key by construction, and adding or removing an engine moves only that
// engine's share of the keys. A request without a key goes to the candidate with the fewest
// router-local in-flight requests (no_hash_key). Admission is checked once on the engine
// chosen; a rejection returns AdmissionRejected (the key does not move to another engine).
type ConsistentHash struct {
	admission EngineAdmission
	loads     LoadReader
	ring      *hashRing
}

var _ Policy = (*ConsistentHash)(nil)

// ReasonNoHashKey: the request carried no key in any configured header.
const ReasonNoHashKey = "no_hash_key"

// NewConsistentHash returns a consistent_hash policy whose ring places vnodes points per
// engine and bounds each engine at loadFactor (at least 1) times the average in-flight.
func NewConsistentHash(adm EngineAdmission, loads LoadReader, vnodes int, loadFactor float64) *ConsistentHash {
	return &ConsistentHash{admission: adm, loads: loads, ring: newHashRing(vnodes, loadFactor)}
}

// Name implements Policy.
func (*ConsistentHash) Name() string { return PolicyConsistentHash }

// Pick implements Policy.
func (p *ConsistentHash) Pick(c []*Worker, req *PickRequest) (Pick, error) {
	if len(c) == 0 {
		return Pick{}, pickErr(OutcomeNoCandidates, req.Stage, req.BucketID, "")
	}
	if req.HashKey == "" {
		return finish(p.admission, p.loads, leastInFlight(c), req, ReasonNoHashKey)
	}
	w, home := p.ring.pick(c, mix.Mix64(fnv64(fnvOffset, req.HashKey)))
	reason := ReasonHashHome
	if !home {
		reason = ReasonHashBounded
	}
	return finish(p.admission, p.loads, w, req, reason)
}
