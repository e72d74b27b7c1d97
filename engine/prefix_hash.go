package engine

import "switchyard/internal/mix"

// PrefixHash (configured as "prefix_hash") routes by a hash of the prompt's first K token IDs
// (hashing.prefix_tokens) on the same bounded-load consistent-hash ring as consistent_hash:
// prompts that share their first K tokens (a system prompt, a few-shot preamble) meet on one
// engine and reuse its prefix cache, without KV events or any shared state. Replicas and
// restarts agree by construction; adding or removing an engine moves only its share of the
// prefixes. A request without token IDs (no tokenizer, and the body-size estimate in use)
// goes to the candidate with the fewest router-local in-flight requests (no_token_ids).
// Admission is checked once on the engine chosen.
type PrefixHash struct {
	admission EngineAdmission
	loads     LoadReader
	ring      *hashRing
	tokens    int
}

var _ Policy = (*PrefixHash)(nil)

// ReasonNoTokenIDs: the request was not tokenized, so it has no prefix to hash.
const ReasonNoTokenIDs = "no_token_ids"

// NewPrefixHash returns a prefix_hash policy hashing the first tokens (at least 1) token IDs,
// on a ring of vnodes points per engine bounded at loadFactor times the average in-flight.
func NewPrefixHash(adm EngineAdmission, loads LoadReader, tokens, vnodes int, loadFactor float64) *PrefixHash {
	return &PrefixHash{admission: adm, loads: loads, ring: newHashRing(vnodes, loadFactor), tokens: max(tokens, 1)}
}

// Name implements Policy.
func (*PrefixHash) Name() string { return PolicyPrefixHash }

// Pick implements Policy.
func (p *PrefixHash) Pick(c []*Worker, req *PickRequest) (Pick, error) {
	if len(c) == 0 {
		return Pick{}, pickErr(OutcomeNoCandidates, req.Stage, req.BucketID, "")
	}
	ids := req.TokenIDs
	if len(ids) == 0 {
		return finish(p.admission, p.loads, leastInFlight(c), req, ReasonNoTokenIDs)
	}
	ids = ids[:min(len(ids), p.tokens)]
	w, home := p.ring.pick(c, mix.Mix64(fnv64Tokens(fnvOffset, ids)))
	reason := ReasonHashHome
	if !home {
		reason = ReasonHashBounded
	}
	return finish(p.admission, p.loads, w, req, reason)
}
