package harness

import (
	"os"
	"slices"
	"testing"
	"time"

	"switchyard/bench/mockengine"
	"switchyard/tokenizer"
)

// TestTraceDecisionRuleSimulation places the shipped trace (SWITCHYARD_BENCH_TRACE names
// the file; skipped without it) on the simulated engines of the trace scenario's default
// run (1,500 requests, 8 engines, --time-scale 2.5) by cache_aware's latency rule with
// perfect knowledge of each engine's cache and of the prompts queued there (what the index
// and the dispatch memory give the router), with one to four credits for a hit beyond its
// own prefill (one is the default), and with each engine's queue as the engine has it or as
// the router sees it (queueView: the prompts being prefilled counted in full, or what is
// left of them). It logs each one's hit rate against the holder placement and its TTFT, and
// checks that the default rule keeps at least 97% of the holder placement's hits with the
// engines' queues, and more counting what is left of the prefill in progress than counting
// it in full.
func TestTraceDecisionRuleSimulation(t *testing.T) {
	path := os.Getenv("SWITCHYARD_BENCH_TRACE")
	if path == "" {
		t.Skip("SWITCHYARD_BENCH_TRACE names the trace to simulate")
	}
	o := Options{Trace: path, Requests: 1500, Engines: 8, TimeScale: 2.5, Seed: 1}.withDefaults()
	o.EngineCache = DefaultTraceEngineCache
	wl, err := readTrace(&o)
	if err != nil {
		t.Fatal(err)
	}
	h := &harness{opts: o, tok: tokenizer.NewSimple()}
	sim, err := h.newTraceSim(wl.Requests)
	if err != nil {
		t.Fatal(err)
	}
	run := func(p mockengine.Placer) (hit float64, ttft []time.Duration) {
		out, err := mockengine.Simulate(sim.cfg, sim.reqs, p)
		if err != nil {
			t.Fatal(err)
		}
		for _, x := range out {
			ttft = append(ttft, x.FirstToken)
		}
		slices.Sort(ttft)
		return sim.result(out).HitRate, ttft
	}
	oracle, _ := run(mockengine.HolderPlacement())
	perToken := o.Costs.PrefillPerToken.Seconds()
	var got [3]float64
	for view := range queueView(len(got)) {
		for credit := 1; credit <= 4; credit++ {
			hit, ttft := run(latencyRule(float64(credit), perToken, view))
			q := func(p float64) time.Duration { return ttft[int(p*float64(len(ttft)-1))] }
			t.Logf("%s, %d credits: %.1f%% of the holder placement's hits; TTFT p50 %v p90 %v p99 %v",
				view, credit, 100*hit/oracle, q(0.5).Round(time.Millisecond), q(0.9).Round(time.Millisecond), q(0.99).Round(time.Millisecond))
			if credit == 1 {
				got[view] = hit / oracle
			}
		}
	}
	if got[engineQueues] < 0.97 {
		t.Errorf("the default rule with the engines' queues keeps %.1f%% of the holder placement's hits, want at least 97%%", 100*got[engineQueues])
	}
	if got[routerLeft] <= got[routerFull] {
		t.Errorf("the default rule keeps %.1f%% of the holder placement's hits counting what is left of the prefill in progress, %.1f%% counting it in full: want more",
			100*got[routerLeft], 100*got[routerFull])
	}
}

// queueView is how the simulated latency rule sees an engine's queue.
type queueView int

const (
	// engineQueues: the engine's queue as the engine has it.
	engineQueues queueView = iota
	// routerFull: the prompts of the prefill in progress counted in full until their
	// first token, as the router's pending prefill did before it counted progress.
	routerFull
	// routerLeft: the router's pending prefill (load.Counters.PendingPrefillLeft) at an
	// exact rate: the prefill in progress less the time spent on it, at most one prompt's
	// worth (the mean pending prompt).
	routerLeft
)

func (v queueView) String() string {
	return [...]string{"engine's queue", "router's view, in full", "router's view, what is left"}[v]
}

// latencyRule is cache_aware's latency decision (engine.CacheAware.pickByLatency) on
// simulated engines: each engine's expected TTFT is its queued prefill plus the request's
// prompt less the prefix it holds, at perToken seconds a token; its score that TTFT less
// credit times the held prefix's prefill; scores within 10% of the fastest TTFT tie, and a tie
// goes to fewer running requests, then the longer prefix. view says how the queue is seen.
func latencyRule(credit, perToken float64, view queueView) mockengine.Placer {
	type key struct {
		score, ttft float64
		held, run   int
	}
	var keys []key
	return mockengine.PlaceFunc(func(_ int, now time.Duration, r *mockengine.SimRequest, fleet []mockengine.EngineView) int {
		keys = keys[:0]
		best, fastest := 0.0, 0.0
		for i, e := range fleet {
			held := e.Held(r)
			queue := e.Backlog(now)
			switch started := e.Started(now); view {
			case routerFull:
				queue += started
			case routerLeft:
				if n := e.Waiting() + e.Prefilling(now); n > 0 {
					queue += max(started-(queue+started)/time.Duration(n), 0)
				}
			}
			ttft := queue.Seconds() + float64(r.PromptTokens-held)*perToken
			k := key{score: ttft - credit*float64(held)*perToken, ttft: ttft, held: held, run: e.Running()}
			keys = append(keys, k)
			if i == 0 || k.score < best {
				best = k.score
			}
			if i == 0 || k.ttft < fastest {
				fastest = k.ttft
			}
		}
		pick := -1
		for i, k := range keys {
			if k.score > best+0.1*fastest {
				continue
			}
			if b := keys[max(pick, 0)]; pick < 0 || k.run < b.run || (k.run == b.run && k.held > b.held) {
				pick = i
			}
		}
		return pick
	})
}
