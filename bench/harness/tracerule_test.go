package harness

import (
	"fmt"
	"math"
	"os"
	"slices"
	"strings"
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
			hit, ttft := run(latencyRule(simRule{credit: float64(credit), view: view}, perToken))
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

// TestTraceColdPlacementSimulation places four windows of 1,500 requests of the shipped
// trace (SWITCHYARD_BENCH_TRACE; skipped without it), each replayed at the speed that offers
// the fleet of the trace scenario (8 engines) a given prefill load, on the simulated engines
// by cache_aware's latency rule with each tie order for cold work (coldOrder), and logs each
// one's share of the holder placement's hits and the share lost to prefixes gone from every
// engine; one window's figures swing by several points with the placement of a few requests,
// the mean over the windows much less. At the trace scenario's load (68%) it checks that the
// default rule with the engines' queues keeps at least 95% of the holder placement's hits.
func TestTraceColdPlacementSimulation(t *testing.T) {
	path := os.Getenv("SWITCHYARD_BENCH_TRACE")
	if path == "" {
		t.Skip("SWITCHYARD_BENCH_TRACE names the trace to simulate")
	}
	const window, engines = 1500, 8
	o := Options{Trace: path, Engines: engines, TimeScale: 1, Seed: 1}.withDefaults()
	o.EngineCache = DefaultTraceEngineCache
	wl, err := readTrace(&o)
	if err != nil {
		t.Fatal(err)
	}
	h := &harness{opts: o, tok: tokenizer.NewSimple()}
	all, err := h.newTraceSim(wl.Requests)
	if err != nil {
		t.Fatal(err)
	}
	perToken := o.Costs.PrefillPerToken.Seconds()
	starts := []int{0, 800, 1600, 2400}
	if len(all.reqs) < starts[len(starts)-1]+window {
		t.Fatalf("the trace has %d requests, want at least %d", len(all.reqs), starts[len(starts)-1]+window)
	}
	var defaultShare float64
	for _, offered := range []float64{0.2, 0.68} {
		for _, view := range []queueView{engineQueues, routerLeft} {
			if view != engineQueues && offered < 0.5 {
				continue // little queues: the views agree
			}
			var mean [len(coldOrderNames)]float64
			for _, start := range starts {
				// The window's arrivals from 0, sped up to offer the load.
				reqs := slices.Clone(all.reqs[start : start+window])
				first, work := reqs[0].At, 0.0
				for i := range reqs {
					reqs[i].At -= first
					work += (o.Costs.PrefillOverhead + time.Duration(reqs[i].PromptTokens)*o.Costs.PrefillPerToken).Seconds()
				}
				scale := offered * engines * reqs[window-1].At.Seconds() / work
				for i := range reqs {
					reqs[i].At = time.Duration(float64(reqs[i].At) / scale)
				}
				sim := &traceSim{cfg: all.cfg, reqs: reqs, oracle: map[int][]mockengine.SimOutcome{}}
				orc, err := sim.holder(window)
				if err != nil {
					t.Fatal(err)
				}
				held := sim.result(orc)
				var line strings.Builder
				for c := range coldOrderNames {
					out, err := mockengine.Simulate(sim.cfg, sim.reqs, latencyRule(simRule{credit: 1, view: view, cold: coldOrder(c)}, perToken))
					if err != nil {
						t.Fatal(err)
					}
					share := sim.result(out).HitRate / held.HitRate
					mean[c] += share / float64(len(starts))
					fmt.Fprintf(&line, "; %s %.1f%% (gone %.1f%%)", coldOrderNames[c], 100*share, 100*goneShare(orc, out))
				}
				t.Logf("load %.0f%%, %s, requests %d-%d (time scale %.2f, holder placement %.1f%% hits)%s",
					100*offered, view, start, start+window-1, scale, 100*held.HitRate, line.String())
			}
			var line strings.Builder
			for c, m := range mean {
				fmt.Fprintf(&line, "; %s %.1f%%", coldOrderNames[c], 100*m)
			}
			t.Logf("load %.0f%%, %s, mean share of the holder placement's hits%s", 100*offered, view, line.String())
			if offered == 0.68 && view == engineQueues {
				defaultShare = mean[coldDecode]
			}
		}
	}
	if defaultShare < 0.95 {
		t.Errorf("at 68%% load the default rule with the engines' queues keeps %.1f%% of the holder placement's hits, want at least 95%%", 100*defaultShare)
	}
}

// goneShare is the share of the holder placement's cached tokens (orc) that out lost on
// requests whose prefix no engine held at arrival (HitLoss.Gone).
func goneShare(orc, out []mockengine.SimOutcome) float64 {
	var gone, total int
	for i := range out {
		want, at := orc[i].Cached, &out[i]
		total += want
		if lossOf(want, at.Cached, at) == lossGone {
			gone += want - at.Cached
		}
	}
	if total == 0 {
		return 0
	}
	return float64(gone) / float64(total)
}

// coldOrder is the tie order a simulated rule gives a request no engine holds any page of
// (cold work, whose prefill evicts the LRU pages of the engine it goes to).
type coldOrder uint8

const (
	// coldDecode is the rule's own order: fewer running requests, then the longer prefix.
	coldDecode coldOrder = iota
	// coldFree: the most KV left free after the prompt (no eviction first), then coldDecode.
	coldFree
	// coldVictim: an engine that need not evict first, then the one whose least recently
	// used page was released longest ago (a fleet-wide LRU), then coldDecode.
	coldVictim
	// coldChurn: the fewest uncached prompt tokens placed there lately (decayed with a
	// half-life of 300 s, about an engine's cache turnover on the trace), then coldDecode.
	coldChurn
)

var coldOrderNames = [...]string{"decode load", "free KV", "LRU victim", "churn"}

// simRule is cache_aware's latency decision on simulated engines (latencyRule).
type simRule struct {
	credit float64   // credits for a hit beyond its own prefill (1: the default)
	view   queueView // how the rule sees an engine's queue
	cold   coldOrder // the tie order of a request no engine holds any page of
}

// latencyRule is cache_aware's latency decision (engine.CacheAware.pickByLatency) on
// simulated engines: each engine's expected TTFT is its queued prefill plus the request's
// prompt less the prefix it holds, at perToken seconds a token; its score that TTFT less
// r.credit times the held prefix's prefill; scores within 10% of the fastest TTFT tie, and a
// tie goes to fewer running requests, then the longer prefix (a cold request: r.cold first).
// r.view says how the queue is seen.
func latencyRule(r simRule, perToken float64) mockengine.Placer {
	type key struct {
		score, ttft float64
		held, run   int
		free        int
		age         time.Duration
	}
	var keys []key
	var churn []float64
	var last time.Duration
	const halfLife = 300 // seconds
	return mockengine.PlaceFunc(func(_ int, now time.Duration, req *mockengine.SimRequest, fleet []mockengine.EngineView) int {
		if churn == nil {
			churn = make([]float64, len(fleet))
		}
		decay := math.Exp2(-(now - last).Seconds() / halfLife)
		for i := range churn {
			churn[i] *= decay
		}
		last = now
		keys = keys[:0]
		best, fastest := 0.0, 0.0
		cold := true
		for i, e := range fleet {
			held := e.Held(req)
			cold = cold && held == 0
			queue := e.Backlog(now)
			switch started := e.Started(now); r.view {
			case routerFull:
				queue += started
			case routerLeft:
				if n := e.Waiting() + e.Prefilling(now); n > 0 {
					queue += max(started-(queue+started)/time.Duration(n), 0)
				}
			}
			ttft := queue.Seconds() + float64(req.PromptTokens-held)*perToken
			k := key{score: ttft - r.credit*float64(held)*perToken, ttft: ttft, held: held, run: e.Running(),
				free: e.Free() - (req.PromptTokens - held), age: e.VictimAge(now)}
			keys = append(keys, k)
			if i == 0 || k.score < best {
				best = k.score
			}
			if i == 0 || k.ttft < fastest {
				fastest = k.ttft
			}
		}
		// before says whether a cold request prefers candidate i to j (prefer), when the tie
		// order for cold work decides (decided); otherwise the rule's own order does.
		before := func(i, j int) (prefer, decided bool) {
			a, b := &keys[i], &keys[j]
			switch r.cold {
			case coldFree:
				return a.free > b.free, a.free != b.free
			case coldVictim:
				if fa, fb := a.free >= 0, b.free >= 0; fa != fb {
					return fa, true
				} else if !fa && a.age != b.age {
					return a.age > b.age, true
				}
			case coldChurn:
				return churn[i] < churn[j], churn[i] != churn[j]
			}
			return false, false
		}
		pick := -1
		for i, k := range keys {
			if k.score > best+0.1*fastest {
				continue
			}
			if pick < 0 {
				pick = i
				continue
			}
			if cold {
				if prefer, decided := before(i, pick); decided {
					if prefer {
						pick = i
					}
					continue
				}
			}
			if b := keys[pick]; k.run < b.run || (k.run == b.run && k.held > b.held) {
				pick = i
			}
		}
		churn[pick] += float64(req.PromptTokens - keys[pick].held)
		return pick
	})
}
