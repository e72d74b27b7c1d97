package harness

import (
	"testing"
	"time"

	"switchyard/bench/loadgen"
	"switchyard/bench/report"
	"switchyard/bench/workload"
	"switchyard/engine"
	"switchyard/tokenizer"
)

// TestTraceSimLoss classifies a made-up row's hits against the simulated oracle: each class
// of HitLoss from a request whose fate is known.
func TestTraceSimLoss(t *testing.T) {
	const block = 256
	req := func(at time.Duration, blocks ...int64) workload.Request {
		return workload.Request{Tokens: &workload.TokenPrompt{Blocks: blocks, Len: len(blocks) * block, BlockSize: block},
			MaxTokens: 1, At: at, After: -1}
	}
	reqs := []workload.Request{
		req(0, 1, 2, 3, 4),
		req(time.Second, 1, 2, 3, 4, 5),                     // the oracle hits 4 blocks on engine 0
		req(2*time.Second, 10, 11, 12),                      // a miss for both
		req(2*time.Second+time.Millisecond, 10, 11, 12, 13), // arrives during the prefill of the one before
		req(3*time.Second, 1, 2, 3, 4, 5, 6),                // the oracle hits 5 blocks on engine 0
		req(4*time.Second, 30, 31),                          // failed in the row
	}
	o := Options{Engines: 2, PageSize: 16, EngineCache: 1 << 16, TimeScale: 1, MaxRunning: 64}.withDefaults()
	h := &harness{opts: o, tok: tokenizer.NewSimple()}
	sim, err := h.newTraceSim(reqs)
	if err != nil {
		t.Fatal(err)
	}
	orc, err := sim.holder(len(reqs))
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []int{0, 4 * block, 0, 3 * block, 5 * block, 0} {
		if orc[i].Cached != want || orc[i].Engine != 0 {
			t.Fatalf("oracle request %d: engine %d cached %d, want engine 0 cached %d", i, orc[i].Engine, orc[i].Cached, want)
		}
	}
	res := func(worker string, cached int) loadgen.Result {
		return loadgen.Result{Status: 200, Worker: worker, CachedTokens: cached}
	}
	m := &loadgen.Measurement{Results: []loadgen.Result{
		res("e0", 0),
		res("e1", 0),  // sent away from engine 0, which had the prefix cached
		res("e0", 16), // 16 tokens beyond the oracle
		res("e1", 0),  // sent away from engine 0, about to cache the prefix
		res("e1", 0),  // sent to engine 1, which holds 5 blocks since request 1: missed there
		{Status: 500, Error: "internal_error", Worker: "e1"},
	}}
	l, err := sim.loss(m, []string{"e0", "e1"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := report.HitLoss{
		Simulated:    float64(5*block) / float64(24*block),
		OracleCached: 12 * block,
		Elsewhere:    report.LossClass{Tokens: 4 * block, Requests: 1},
		Queued:       report.LossClass{Tokens: 3 * block, Requests: 1},
		OnHolder:     report.LossClass{Tokens: 5 * block, Requests: 1},
		Gained:       report.LossClass{Tokens: 16, Requests: 1},
	}
	if *l != want {
		t.Errorf("loss %+v\nwant %+v", *l, want)
	}

	// With the router's decisions, the requests lost elsewhere (1) and queued (3) are split
	// by what the router saw.
	decide := func(log *decisionLog, i int, chosen int, cands ...engine.LatencyCandidate) {
		p, err := reqs[i].Prompt(h.tok)
		if err != nil {
			t.Fatal(err)
		}
		log.LatencyDecided(&engine.PickRequest{BucketRequest: &engine.BucketRequest{TokenIDs: p}},
			&engine.LatencyDecision{Candidates: cands, Chosen: chosen, Timed: true, Ceiling: 0.11})
	}
	seen := engine.LatencyCandidate{WorkerID: "e0", Matched: 4 * block, Uncached: block, Work: 3000, PerToken: 1e-3, Score: 2.0}
	away := engine.LatencyCandidate{WorkerID: "e1", Uncached: 5 * block, Work: 5 * block, PerToken: 1e-3, Score: 0.1}
	log := newDecisionLog()
	decide(log, 1, 1, seen, away)                                                // e0 judged slower
	decide(log, 3, 1, engine.LatencyCandidate{WorkerID: "e0", Score: 0.2}, away) // nothing seen on e0
	if l, err = sim.loss(m, []string{"e0", "e1"}, log); err != nil {
		t.Fatal(err)
	}
	wantLeft := report.LeftHolder{Slower: report.LossClass{Tokens: 4 * block, Requests: 1}, Unseen: report.LossClass{Tokens: 3 * block, Requests: 1},
		HolderQueue: float64(3000-block) * 1e-3, ChosenQueue: 0}
	if l.Left == nil || *l.Left != wantLeft {
		t.Errorf("left %+v\nwant %+v", l.Left, wantLeft)
	}
	seen.Score = 0.105 // within the ceiling: a tie the holder lost
	log = newDecisionLog()
	decide(log, 1, 1, seen, away)
	if l, err = sim.loss(m, []string{"e0", "e1"}, log); err != nil {
		t.Fatal(err)
	}
	wantLeft = report.LeftHolder{Tie: report.LossClass{Tokens: 4 * block, Requests: 1}, Unrecorded: report.LossClass{Tokens: 3 * block, Requests: 1}}
	if l.Left == nil || *l.Left != wantLeft {
		t.Errorf("left %+v\nwant %+v", l.Left, wantLeft)
	}

	r := sim.result(orc)
	if r.Requests != 6 || r.CachedTokens != 12*block || r.PromptTokens != 24*block {
		t.Errorf("oracle result %+v", r)
	}
}
