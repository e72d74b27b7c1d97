package harness

import (
	"hash/fnv"
	"sync"

	"switchyard/engine"
)

// maxDecisions bounds a decision log: past it, decisions are not kept.
const maxDecisions = 1 << 20

// decisionLog records the router's cache_aware latency decisions of one row
// (engine.CacheAwareObserver), by prompt: the trace scenario reads, for each request that
// left the engine holding its prefix, what the router saw.
type decisionLog struct {
	mu sync.Mutex
	n  int
	by map[uint64][]engine.LatencyDecision // by promptKey, in the order made
}

func newDecisionLog() *decisionLog {
	return &decisionLog{by: make(map[uint64][]engine.LatencyDecision)}
}

// LatencyDecided implements engine.CacheAwareObserver: a copy of d under the prompt's key.
func (l *decisionLog) LatencyDecided(req *engine.PickRequest, d *engine.LatencyDecision) {
	if req.BucketRequest == nil || len(req.TokenIDs) == 0 {
		return
	}
	c := *d
	c.Candidates = append([]engine.LatencyCandidate(nil), d.Candidates...)
	k := promptKey(req.TokenIDs)
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.n >= maxDecisions {
		return
	}
	l.n++
	l.by[k] = append(l.by[k], c)
}

// recorded reports whether the log holds any decision (a row whose policy makes latency
// decisions); false for a nil log.
func (l *decisionLog) recorded() bool {
	if l == nil {
		return false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.n > 0
}

// take returns the earliest decision recorded for the prompt of key that chose worker, and
// forgets it; nil without one. Identical prompts sent to the same engine are told apart by
// order only.
func (l *decisionLog) take(key uint64, worker string) *engine.LatencyDecision {
	if l == nil {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	ds := l.by[key]
	for i := range ds {
		if d := &ds[i]; d.Candidates[d.Chosen].WorkerID == worker {
			out := *d
			l.by[key] = append(ds[:i:i], ds[i+1:]...)
			return &out
		}
	}
	return nil
}

// promptKey is the decision log's key of a prompt's token IDs.
func promptKey(tokens []uint32) uint64 {
	h := fnv.New64a()
	var b [4]byte
	for _, t := range tokens {
		b[0], b[1], b[2], b[3] = byte(t), byte(t>>8), byte(t>>16), byte(t>>24)
		_, _ = h.Write(b[:])
	}
	return h.Sum64()
}
