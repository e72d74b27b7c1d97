package harness

import (
	"fmt"
	"slices"
	"sync"
	"time"

	"switchyard/bench/loadgen"
	"switchyard/bench/mockengine"
	"switchyard/bench/report"
	"switchyard/bench/workload"
	"switchyard/engine"
	"switchyard/kv/hashing"
)

// traceSim is a replayed workload on simulated engines (mockengine.Simulate) configured as
// the scenario's: the trace's oracle (the holder placement) and the replay of a row's
// placement that explains its hits.
type traceSim struct {
	cfg  mockengine.SimConfig
	reqs []mockengine.SimRequest
	keys []uint64 // promptKey of each request's prompt

	mu     sync.Mutex
	oracle map[int][]mockengine.SimOutcome // the holder placement of the first n requests
}

// newTraceSim prepares reqs, arriving at their At divided by opts.TimeScale, for the
// simulated engines of opts.
func (h *harness) newTraceSim(reqs []workload.Request) (*traceSim, error) {
	o := &h.opts
	ps := o.PageSize
	s := &traceSim{cfg: mockengine.SimConfig{Engine: o.engineConfig(false), Engines: o.Engines},
		reqs: make([]mockengine.SimRequest, len(reqs)), keys: make([]uint64, len(reqs)), oracle: make(map[int][]mockengine.SimOutcome)}
	if len(o.EngineSpeeds) == o.Engines {
		s.cfg.Speeds = o.EngineSpeeds
	}
	scale := o.TimeScale
	if !(scale > 0) {
		scale = 1
	}
	for i := range reqs {
		p, err := reqs[i].Prompt(h.tok)
		if err != nil {
			return nil, fmt.Errorf("cannot simulate the trace: %w", err)
		}
		s.keys[i] = promptKey(p)
		full := len(p) / ps
		hashes, _ := hashing.AppendChainHashes(make([]int64, 0, full), nil, p[:full*ps], ps)
		s.reqs[i] = mockengine.SimRequest{At: time.Duration(float64(reqs[i].At) / scale), Hashes: hashes,
			PromptTokens: len(p), MaxTokens: max(reqs[i].MaxTokens, 0)}
	}
	return s, nil
}

// holder returns the holder placement's outcome of the first n requests.
func (s *traceSim) holder(n int) ([]mockengine.SimOutcome, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if out, ok := s.oracle[n]; ok {
		return out, nil
	}
	out, err := mockengine.Simulate(s.cfg, s.reqs[:n], mockengine.HolderPlacement())
	if err != nil {
		return nil, err
	}
	s.oracle[n] = out
	return out, nil
}

// result sums outcomes into an oracle result.
func (s *traceSim) result(out []mockengine.SimOutcome) workload.OracleResult {
	var r workload.OracleResult
	for i, o := range out {
		r.PromptTokens += int64(s.reqs[i].PromptTokens)
		r.CachedTokens += int64(o.Cached)
	}
	r.Requests = len(out)
	if r.PromptTokens > 0 {
		r.HitRate = float64(r.CachedTokens) / float64(r.PromptTokens)
	}
	return r
}

// loss explains the hits of a row's measurement m on the engines named workers (engine i is
// workers[i]) against the holder placement of the same requests (HitLoss). Requests that
// failed, or that a worker outside workers served, count for the placement replay (on the
// engine a rotation gives them) but not in the classes. With the router's decisions (d
// holding any), the requests lost elsewhere or queued are also split by what the router saw
// (leftHolder).
func (s *traceSim) loss(m *loadgen.Measurement, workers []string, d *decisionLog) (*report.HitLoss, error) {
	n := len(m.Results)
	if n == 0 || n > len(s.reqs) {
		return nil, nil
	}
	orc, err := s.holder(n)
	if err != nil {
		return nil, err
	}
	index := make(map[string]int, len(workers))
	for i, w := range workers {
		index[w] = i
	}
	placed := make([]int, n)
	for i := range m.Results {
		k, ok := index[m.Results[i].Worker]
		if !ok {
			k = i % len(workers)
		}
		placed[i] = k
	}
	out, err := mockengine.Simulate(s.cfg, s.reqs[:n], mockengine.FixedPlacement(placed))
	if err != nil {
		return nil, err
	}
	l := &report.HitLoss{Simulated: s.result(out).HitRate}
	var left *leftHolder
	if d.recorded() {
		left = &leftHolder{}
	}
	for i := range m.Results {
		r := &m.Results[i]
		if _, ok := index[r.Worker]; !ok || !r.OK() {
			continue
		}
		want, got, at := orc[i].Cached, r.CachedTokens, out[i]
		l.OracleCached += int64(want)
		switch lossOf(want, got, &at) {
		case lossGained:
			add(&l.Gained, got-want)
		case lossOnHolder:
			add(&l.OnHolder, want-got)
		case lossElsewhere:
			add(&l.Elsewhere, want-got)
			left.add(d.take(s.keys[i], r.Worker), want-got, &at)
		case lossQueued:
			add(&l.Queued, want-got)
			left.add(d.take(s.keys[i], r.Worker), want-got, &at)
		case lossGone:
			add(&l.Gone, want-got)
		}
	}
	l.Left = left.result()
	return l, nil
}

// loss is the class of a request's cached tokens against the oracle's (report.HitLoss).
type loss uint8

const (
	lossNone      loss = iota // as many as the oracle's
	lossGained                // more than the oracle's
	lossOnHolder              // fewer, though the engine it went to held more (host timing)
	lossElsewhere             // fewer: another engine held more when it arrived
	lossQueued                // fewer: another engine was about to hold more (its prefill queued)
	lossGone                  // fewer: no engine held more (evicted under the placement)
)

// lossOf classes a request that got got cached tokens where the oracle's placement got
// want, at its outcome in the simulation of the placement it was given.
func lossOf(want, got int, at *mockengine.SimOutcome) loss {
	switch {
	case got > want:
		return lossGained
	case got == want:
		return lossNone
	case at.OnEngine > got:
		return lossOnHolder
	case at.HeldCached > got:
		return lossElsewhere
	case at.Held > got:
		return lossQueued
	default:
		return lossGone
	}
}

func add(c *report.LossClass, tokens int) {
	c.Tokens += int64(tokens)
	c.Requests++
}

// leftHolder gathers report.LeftHolder: why the router sent requests away from the engine
// that held their prefix, from its decision records. A nil leftHolder gathers nothing.
type leftHolder struct {
	report.LeftHolder
	holderQ, chosenQ, actual []float64 // over the Slower requests
}

// add classes one request that lost the oracle's cached tokens (lost) away from the
// holder: d is the router's decision for it (nil: none recorded), at its simulated outcome.
// Unseen: no candidate held more, as the router saw it, than the engine it chose; otherwise
// it saw a longer prefix and judged its holder slower (beyond the tie ceiling), or let the
// tie order choose.
func (x *leftHolder) add(d *engine.LatencyDecision, lost int, at *mockengine.SimOutcome) {
	if x == nil {
		return
	}
	if d == nil {
		add(&x.Unrecorded, lost)
		return
	}
	// The holder as the router saw it: the longest prefix, the lower score among equals.
	h := -1
	for i := range d.Candidates {
		c := &d.Candidates[i]
		if h < 0 || c.Matched > d.Candidates[h].Matched || (c.Matched == d.Candidates[h].Matched && c.Score < d.Candidates[h].Score) {
			h = i
		}
	}
	hc := &d.Candidates[h]
	switch {
	case hc.Matched <= d.Candidates[d.Chosen].Matched:
		add(&x.Unseen, lost) // the router chose the longest prefix it saw
	case hc.Score > d.Ceiling:
		add(&x.Slower, lost)
		x.holderQ = append(x.holderQ, hc.Queue())
		x.chosenQ = append(x.chosenQ, d.Candidates[d.Chosen].Queue())
		x.actual = append(x.actual, at.HolderBacklog.Seconds())
	default:
		add(&x.Tie, lost)
	}
}

// result is the gathered classes, nil for a nil leftHolder.
func (x *leftHolder) result() *report.LeftHolder {
	if x == nil {
		return nil
	}
	out := x.LeftHolder
	out.HolderQueue, out.ChosenQueue, out.HolderActual = median(x.holderQ), median(x.chosenQ), median(x.actual)
	return &out
}

// median is the middle value of xs (the lower of the middle two), 0 for none. It sorts xs.
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	slices.Sort(xs)
	return xs[(len(xs)-1)/2]
}
