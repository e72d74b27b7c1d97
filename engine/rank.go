package engine

import (
	"time"

	"switchyard/load"
)

// LimitWaitingPerRank names the per-rank admission cap (dp_dispatch.max_waiting_per_rank).
const LimitWaitingPerRank = "max_waiting_per_rank"

// rankPicker chooses the data-parallel rank inside an engine a group picked, when the
// engine runs more than one rank and dp_dispatch is enabled: the router then sends the rank
// with the request (SGLang's data_parallel_rank) instead of leaving it to the engine's own
// balancer, which does not see the ranks' queues the router sees.
//
// When every rank of the engine has a fresh report, the rank with the fewest waiting
// requests (counting the requests this picker sent to it since that report was captured) wins,
// then the fewest running; otherwise the rank this picker has sent the fewest requests to.
// Ties rotate, so equal ranks share requests in turn. A rank whose waiting requests (with
// those sent since its report) reach max_waiting_per_rank is passed over; when every rank is,
// the pick is AdmissionRejected.
//
// In a cache_aware group (prefix), a request whose prefix lookup says which ranks of the
// engine hold its longest prefix (RankMatcher) goes to the least loaded of those ranks, unless
// its waiting requests exceed the least loaded rank's by more than guard (the cache_aware
// pressure guard) or it is at the cap: the rank that already holds the prefix prefills only
// the rest, within the load rules.
//
// It is owned by its group (one goroutine at a time). Its counts are its own: two groups
// that pick the same engine balance its ranks separately, each correcting for its own
// dispatches, and the engine's reports correct both.
type rankPicker struct {
	loads      LoadReader
	maxWaiting int64
	state      map[*Worker]*rankState
	// prefix: prefer the ranks holding the request's longest prefix, within guard waiting
	// requests of the least loaded rank.
	prefix bool
	guard  int64
}

// rankState is one engine's ranks as this picker sent to them.
type rankState struct {
	sent   []int64     // requests sent to the rank since its report captured at seen
	seen   []time.Time // capture time of the rank's report sent is counted against
	total  []uint64    // requests ever sent to the rank
	cursor int
}

// maxRankStates bounds the engines a picker remembers; past it, the memory starts over.
const maxRankStates = 4096

func newRankPicker(loads LoadReader, maxWaitingPerRank int64) *rankPicker {
	return &rankPicker{loads: loads, maxWaiting: maxWaitingPerRank, state: make(map[*Worker]*rankState)}
}

// pick returns w's rank for one request at now (with its prefix lookup, or nil), or the
// per-rank limit that refused every rank. w.DPSize must be at least 2.
func (p *rankPicker) pick(w *Worker, now time.Time, prefix PrefixMatcher) (int, string) {
	st := p.state[w]
	if st == nil || len(st.sent) != w.DPSize {
		if len(p.state) >= maxRankStates {
			clear(p.state)
		}
		st = &rankState{sent: make([]int64, w.DPSize), seen: make([]time.Time, w.DPSize), total: make([]uint64, w.DPSize)}
		p.state[w] = st
	}
	var snap *load.Snapshot
	if p.loads != nil {
		snap = p.loads.Load()
	}
	n := w.DPSize
	var obs [maxRanksOnStack]load.Observation
	ob := obs[:0]
	if n > maxRanksOnStack {
		ob = make([]load.Observation, 0, n) // slow path: a very wide engine
	}
	known := snap != nil
	for r := range n {
		var o load.Observation
		if snap != nil {
			o = snap.ObserveRank(w.ID, r, now)
		}
		if !o.Has(load.HasWaiting | load.HasRunning) {
			known = false
		} else if !o.CapturedAt.Equal(st.seen[r]) {
			st.seen[r], st.sent[r] = o.CapturedAt, 0
		}
		ob = append(ob, o)
	}
	var holders uint64
	if p.prefix && prefix != nil {
		holders = prefixRanks(prefix, w.ID)
	}
	best, held := -1, -1
	for i := range n {
		r := (st.cursor + i) % n
		if known && p.maxWaiting > 0 && ob[r].Waiting+st.sent[r] >= p.maxWaiting {
			continue
		}
		if best < 0 || p.less(st, ob, known, r, best) {
			best = r
		}
		if r < 64 && holders&(1<<r) != 0 && (held < 0 || p.less(st, ob, known, r, held)) {
			held = r
		}
	}
	if best < 0 {
		return -1, LimitWaitingPerRank
	}
	if held >= 0 && (!known || ob[held].Waiting+st.sent[held]-(ob[best].Waiting+st.sent[best]) <= p.guard) {
		// The least loaded rank holding the prefix, within the guard of the least loaded.
		best = held
	}
	st.sent[best]++
	st.total[best]++
	st.cursor = (best + 1) % n
	return best, ""
}

// prefixRanks returns the ranks of worker id holding the request's longest prefix, when the
// lookup succeeded, found a prefix there and knows its ranks; else 0.
func prefixRanks(m PrefixMatcher, id string) uint64 {
	rm, ok := m.(RankMatcher)
	if !ok {
		return 0
	}
	if ok, _, _ := m.Status(); !ok || m.MatchedTokens(id) <= 0 {
		return 0
	}
	return rm.MatchedRanks(id)
}

// maxRanksOnStack is the widest engine whose observations are gathered without allocating.
const maxRanksOnStack = 16

// less reports whether rank a is less loaded than rank b.
func (p *rankPicker) less(st *rankState, ob []load.Observation, known bool, a, b int) bool {
	if !known {
		return st.total[a] < st.total[b]
	}
	wa, wb := ob[a].Waiting+st.sent[a], ob[b].Waiting+st.sent[b]
	if wa != wb {
		return wa < wb
	}
	return ob[a].Running < ob[b].Running
}
