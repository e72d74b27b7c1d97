package harness

import (
	"cmp"
	"fmt"
	"math"
	"math/rand/v2"
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
// and the dispatch memory give the router): a hit credited once beyond its own prefill (the
// rule that weighs only the request's own TTFT), three times, and once times the fleet's
// hit weight (the default), each with each engine's queue as the engine has it or as the
// router sees it (queueView: the prompts being prefilled counted in full, or what is left of
// them). It logs each one's hit rate against the holder placement and its TTFT, and checks
// that the own-TTFT rule keeps at least 97% of the holder placement's hits with the
// engines' queues, and more counting what is left of the prefill in progress than counting
// it in full. One run of one window swings by several points with the placement of a few
// requests: TestTraceHitWeightSimulation compares the rules over many.
func TestTraceDecisionRuleSimulation(t *testing.T) {
	sim, o := traceSimOf(t, Options{Trace: tracePathOf(t), Requests: 1500, Engines: 8, TimeScale: 2.5, Seed: 1})
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
		for _, r := range simRules {
			r.rule.view = view
			hit, ttft := run(latencyRule(r.rule, perToken))
			q := func(p float64) time.Duration { return ttft[int(p*float64(len(ttft)-1))] }
			t.Logf("%s, %s: %.1f%% of the holder placement's hits; TTFT p50 %v p90 %v p99 %v",
				view, r.name, 100*hit/oracle, q(0.5).Round(time.Millisecond), q(0.9).Round(time.Millisecond), q(0.99).Round(time.Millisecond))
			if r.rule == ownTTFTRule(view) {
				got[view] = hit / oracle
			}
		}
	}
	if got[engineQueues] < 0.97 {
		t.Errorf("the own-TTFT rule with the engines' queues keeps %.1f%% of the holder placement's hits, want at least 97%%", 100*got[engineQueues])
	}
	if got[routerLeft] <= got[routerFull] {
		t.Errorf("the own-TTFT rule keeps %.1f%% of the holder placement's hits counting what is left of the prefill in progress, %.1f%% counting it in full: want more",
			100*got[routerLeft], 100*got[routerFull])
	}
}

// simRules are the latency rules the simulations compare: the own-TTFT rule (a hit
// credited once beyond its own prefill, the default until the hit weight), a flat credit of
// three, one credit times the fleet's hit weight (the default until two), and the default,
// last: two credits times the hit weight, ties going to the longer prefix first.
var simRules = []struct {
	name string
	rule simRule
}{
	{"own TTFT (1 credit)", simRule{credit: 1}},
	{"3 credits", simRule{credit: 3}},
	{"hit weight, 1 credit", simRule{credit: 1, weigh: true}},
	{"hit weight, 2 credits, holder first in ties (default)", defaultRule},
}

// defaultRule is cache_aware's default latency decision (engine.CacheAware.pickByLatency):
// two credits times the fleet's hit weight, ties to the longer prefix first.
var defaultRule = simRule{credit: 2, weigh: true, holderFirst: true}

// ownTTFTRule is the rule that weighs a hit by the request's own TTFT alone, seeing queues
// by view.
func ownTTFTRule(view queueView) simRule { return simRule{credit: 1, view: view} }

// TestTraceHitWeightSimulation compares the latency rules of simRules with the router's view
// of the queues on the simulated engines of the trace scenario (SWITCHYARD_BENCH_TRACE;
// skipped without it): seven windows of 1,500 requests of the trace (from requests 0, 400,
// ..., 2,400), each sped up to offer the 8 engines 40%, 68% (the trace scenario's load) or
// 85% of their prefill capacity, each replayed as recorded and with two seeds of arrival
// jitter (up to 50 ms a request, the timing noise of a run), 21 runs a load. It logs, for
// each rule and load, the share of the holder placement's hits (the mean over the runs, the
// lowest, and the runs it wins and loses against the own-TTFT rule and against one weighted
// credit), the shares of the
// holder placement's cached tokens lost to prefixes gone from every engine, lost away from
// a holder (elsewhere or queued) and gained, the mean TTFT percentiles and the largest
// request and prefill spreads. It checks that at 68% the default keeps at least 98% of
// the holder placement's hits on the mean and at least a point more than the own-TTFT rule,
// that at 40% it keeps at least as many less a point, and that at every load it keeps at
// least half a point more than one weighted credit. It takes several minutes of CPU (go
// test -timeout 30m on a busy machine).
func TestTraceHitWeightSimulation(t *testing.T) {
	const engines = 8
	all, o := fullTraceSim(t, engines)
	rules := make([]simRule, len(simRules))
	for i, r := range simRules {
		rules[i] = r.rule
	}
	for _, offered := range []float64{0.4, 0.68, 0.85} {
		res := all.runRules(t, &o, offered, rules)
		for ri, r := range simRules {
			x := &res[ri]
			wins, losses := winsOf(x.share, res[0].share)
			wins1, losses1 := winsOf(x.share, res[2].share)
			t.Logf("load %.0f%%, %s: %.1f%% of the holder placement's hits (lowest %.1f%%, %d wins, %d losses in %d runs; against one weighted credit %d / %d); gone %.1f%%, away %.1f%%, gained %.1f%%; TTFT p50 %.0f p90 %.0f p99 %.0f ms; spread at most %.2f / %.2f",
				100*offered, r.name, 100*meanOf(x.share), 100*slices.Min(x.share), wins, losses, len(x.share), wins1, losses1,
				100*meanOf(x.gone), 100*meanOf(x.away), 100*meanOf(x.gained),
				1000*meanOf(x.p50), 1000*meanOf(x.p90), 1000*meanOf(x.p99), slices.Max(x.spread), slices.Max(x.prefill))
		}
		own, one, def := meanOf(res[0].share), meanOf(res[2].share), meanOf(res[len(res)-1].share)
		if def < one+0.005 {
			t.Errorf("at %.0f%% load the default keeps %.1f%% of the holder placement's hits, one weighted credit %.1f%%: want at least half a point more",
				100*offered, 100*def, 100*one)
		}
		switch offered {
		case 0.68:
			if def < 0.98 || def < own+0.01 {
				t.Errorf("at 68%% load the default keeps %.1f%% of the holder placement's hits, the own-TTFT rule %.1f%%: want at least 98%% and a point more",
					100*def, 100*own)
			}
		case 0.4:
			if def < own-0.01 {
				t.Errorf("at 40%% load the default keeps %.1f%% of the holder placement's hits, the own-TTFT rule %.1f%%: want at least as many less a point",
					100*def, 100*own)
			}
		}
	}
}

// ruleRuns are one rule's figures over the runs of traceSim.runRules, one entry a run: its
// share of the holder placement's hits, the shares of the holder placement's cached tokens
// lost to prefixes gone from every engine, lost away from a holder (elsewhere or queued)
// and gained, its TTFT percentiles (seconds) and its request and prefill spreads.
type ruleRuns struct{ share, gone, away, gained, p50, p90, p99, spread, prefill []float64 }

// runRules places 21 runs on s's simulated engines (the whole trace, as fullTraceSim reads
// it) by each of rules with the router's view of the queues: seven windows of 1,500
// requests (from requests 0, 400, ..., 2,400), each sped up to offer the engines the share
// offered of their prefill capacity, each replayed as recorded and with two seeds of
// arrival jitter (window). The runs of every rule are the same, entry for entry.
func (s *traceSim) runRules(t *testing.T, o *Options, offered float64, rules []simRule) []ruleRuns {
	t.Helper()
	const window = 1500
	perToken := o.Costs.PrefillPerToken.Seconds()
	res := make([]ruleRuns, len(rules))
	for start := 0; start <= 2400; start += 400 {
		for jitter := range uint64(3) {
			sim, _ := s.window(t, o, start, window, offered, jitter)
			orc, err := sim.holder(window)
			if err != nil {
				t.Fatal(err)
			}
			var uses *pageUses
			for ri, r := range rules {
				r.view = routerLeft
				if r.cold == coldFuture {
					if uses == nil {
						uses = usesOf(sim.reqs)
					}
					r.uses = uses
				}
				out, err := mockengine.Simulate(sim.cfg, sim.reqs, latencyRule(r, perToken))
				if err != nil {
					t.Fatal(err)
				}
				res[ri].add(sim, orc, out)
			}
		}
	}
	return res
}

// add appends one run's figures: out, the placement of sim's requests, against orc, the
// holder placement's outcome of the same requests.
func (x *ruleRuns) add(sim *traceSim, orc, out []mockengine.SimOutcome) {
	held := sim.result(orc).HitRate
	x.share = append(x.share, sim.result(out).HitRate/held)
	var lost [lossGone + 1]float64
	var total float64
	served, prefilled := make([]float64, sim.cfg.Engines), make([]float64, sim.cfg.Engines)
	ttft := make([]time.Duration, 0, len(out))
	for i := range out {
		want, at := orc[i].Cached, &out[i]
		total += float64(want)
		lost[lossOf(want, at.Cached, at)] += math.Abs(float64(want - at.Cached))
		served[at.Engine]++
		prefilled[at.Engine] += float64(sim.reqs[i].PromptTokens - at.Cached)
		ttft = append(ttft, at.FirstToken)
	}
	slices.Sort(ttft)
	q := func(p float64) float64 { return ttft[int(p*float64(len(ttft)-1))].Seconds() }
	x.gone = append(x.gone, lost[lossGone]/total)
	x.away = append(x.away, (lost[lossElsewhere]+lost[lossQueued])/total)
	x.gained = append(x.gained, lost[lossGained]/total)
	x.p50, x.p90, x.p99 = append(x.p50, q(0.5)), append(x.p90, q(0.9)), append(x.p99, q(0.99))
	x.spread = append(x.spread, slices.Max(served)/meanOf(served))
	x.prefill = append(x.prefill, slices.Max(prefilled)/meanOf(prefilled))
}

// TestTraceGoneSimulation finds where the prefixes that the latency rule loses to eviction
// (gone: no engine held them when the next request needing them arrived, while the holder
// placement's caches kept them) came from, on the simulated engines of the trace scenario
// (SWITCHYARD_BENCH_TRACE; skipped without it): the seven windows and three arrival jitters
// of TestTraceHitWeightSimulation at 68% load, placed by one weighted credit (the default
// when this was measured) with the router's
// view of the queues, exact and with each queue seen times e^(0.7 × N(0,1)) (a host's timing
// error). For each request the rule lost to `gone` or gained over the holder placement it
// finds the provider (the latest earlier request whose prompt holds the prefix in question)
// and logs how the rule placed the provider (on the engine holding its own prefix, away from
// it, or cold: no engine held any of it), how many tokens the provider's engine took in
// until the request came, under the rule and under the holder placement, and the time
// between them. It checks that providers sent away from a holder start less than 5% of the
// gone tokens (a duplicated prefix does not push out the ones lost), and that the timing
// error raises the tokens lost away from a holder by more than a point while gone moves by
// less than one.
func TestTraceGoneSimulation(t *testing.T) {
	const window, engines = 1500, 8
	all, o := fullTraceSim(t, engines)
	perToken := o.Costs.PrefillPerToken.Seconds()
	ps := o.PageSize
	type class struct {
		tokens, requests             float64
		provider                     [3]float64 // tokens by the provider's placement: on its holder, away, cold
		inflowRule, inflowHeld, gaps []float64
	}
	type result struct {
		gone, gained         class
		goneShare, awayShare []float64
	}
	var res [2]result
	for start := 0; start <= 2400; start += 400 {
		for jitter := range uint64(3) {
			sim, _ := all.window(t, &o, start, window, 0.68, jitter)
			orc, err := sim.holder(window)
			if err != nil {
				t.Fatal(err)
			}
			for ni, noise := range []float64{0, 0.7} {
				out, err := mockengine.Simulate(sim.cfg, sim.reqs, latencyRule(simRule{credit: 1, weigh: true, view: routerLeft, noise: noise}, perToken))
				if err != nil {
					t.Fatal(err)
				}
				x := &res[ni]
				var lost [lossGone + 1]float64
				var total float64
				latest := make(map[int64]int) // a prompt page's hash: the latest request holding it
				for i := range out {
					want, at := orc[i].Cached, &out[i]
					total += float64(want)
					l := lossOf(want, at.Cached, at)
					lost[l] += math.Abs(float64(want - at.Cached))
					c, pages := &x.gone, want/ps
					if l == lossGained {
						c, pages = &x.gained, at.Cached/ps
					}
					p, ok := -1, false
					if pages > 0 && (l == lossGone || l == lossGained) {
						p, ok = latest[sim.reqs[i].Hashes[pages-1]]
					}
					if ok {
						d := math.Abs(float64(want - at.Cached))
						c.tokens += d
						c.requests++
						c.provider[placedAs(&out[p])] += d
						c.inflowRule = append(c.inflowRule, inflowOf(sim, out, out[p].Engine, p, i))
						c.inflowHeld = append(c.inflowHeld, inflowOf(sim, orc, orc[p].Engine, p, i))
						c.gaps = append(c.gaps, (sim.reqs[i].At - sim.reqs[p].At).Seconds())
					}
					for _, h := range sim.reqs[i].Hashes {
						latest[h] = i
					}
				}
				x.goneShare = append(x.goneShare, lost[lossGone]/total)
				x.awayShare = append(x.awayShare, (lost[lossElsewhere]+lost[lossQueued])/total)
			}
		}
	}
	for ni, name := range []string{"exact view", "view with timing error"} {
		x := &res[ni]
		t.Logf("%s: gone %.1f%%, away %.1f%% of the holder placement's cached tokens (mean of %d runs)", name, 100*meanOf(x.goneShare), 100*meanOf(x.awayShare), len(x.goneShare))
		for _, c := range []struct {
			name string
			c    *class
		}{{"gone", &x.gone}, {"gained", &x.gained}} {
			k := c.c
			t.Logf("%s, %s: %.0f requests, %.0fk tokens; the provider placed on its holder %.0f%%, away from it %.0f%%, cold %.0f%%; tokens its engine took in until the request %.0fk (holder placement %.0fk), %.0f s later (medians)",
				name, c.name, k.requests, k.tokens/1000, 100*k.provider[0]/k.tokens, 100*k.provider[1]/k.tokens, 100*k.provider[2]/k.tokens,
				median(k.inflowRule)/1000, median(k.inflowHeld)/1000, median(k.gaps))
		}
	}
	if away := res[0].gone.provider[1] / res[0].gone.tokens; away >= 0.05 {
		t.Errorf("providers sent away from a holder start %.1f%% of the gone tokens, want less than 5%%", 100*away)
	}
	exact, noisy := &res[0], &res[1]
	if d := meanOf(noisy.awayShare) - meanOf(exact.awayShare); d <= 0.01 {
		t.Errorf("the timing error raises the tokens lost away from a holder by %.1f points, want more than 1", 100*d)
	}
	if d := meanOf(noisy.goneShare) - meanOf(exact.goneShare); math.Abs(d) >= 0.01 {
		t.Errorf("the timing error moves gone by %.1f points, want less than 1", 100*d)
	}
}

// placedAs classes a request's placement: 0 on an engine holding its longest held prefix
// (or about to), 1 away from it, 2 cold (no engine held any of its prompt).
func placedAs(x *mockengine.SimOutcome) int {
	switch {
	case x.Held == 0 && x.HeldCached == 0:
		return 2
	case x.OnEngine < x.Held:
		return 1
	}
	return 0
}

// inflowOf is the tokens engine e took in (uncached prompt and output) from the requests
// placed on it (out) after request from and before request to.
func inflowOf(s *traceSim, out []mockengine.SimOutcome, e, from, to int) float64 {
	n := 0
	for k := from + 1; k < to; k++ {
		if out[k].Engine == e {
			n += s.reqs[k].PromptTokens - out[k].Cached + s.reqs[k].MaxTokens
		}
	}
	return float64(n)
}

// tracePathOf is the trace the simulations replay, SWITCHYARD_BENCH_TRACE; without it the
// test is skipped.
func tracePathOf(t *testing.T) string {
	t.Helper()
	path := os.Getenv("SWITCHYARD_BENCH_TRACE")
	if path == "" {
		t.Skip("SWITCHYARD_BENCH_TRACE names the trace to simulate")
	}
	return path
}

// fullTraceSim is the whole trace (tracePathOf), at its recorded rate, on the given number of
// simulated engines of the trace scenario, with the options it was read with.
func fullTraceSim(t *testing.T, engines int) (*traceSim, Options) {
	t.Helper()
	return traceSimOf(t, Options{Trace: tracePathOf(t), Engines: engines, TimeScale: 1, Seed: 1})
}

// traceSimOf is the trace of o (its defaults applied, with the trace scenario's engine
// cache) on its simulated engines, with the options it was read with.
func traceSimOf(t *testing.T, o Options) (*traceSim, Options) {
	t.Helper()
	o = o.withDefaults()
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
	return all, o
}

// window is n requests of s from start, arriving from 0 at the speed that offers s's engines
// the share offered of their prefill capacity (o's cost model, no cache hits), and the
// factor by which their recorded arrivals were sped up; jitter > 0 delays each arrival by up
// to 50 ms, seeded by jitter.
func (s *traceSim) window(t *testing.T, o *Options, start, n int, offered float64, jitter uint64) (*traceSim, float64) {
	t.Helper()
	if len(s.reqs) < start+n {
		t.Fatalf("the trace has %d requests, want at least %d", len(s.reqs), start+n)
	}
	reqs := slices.Clone(s.reqs[start : start+n])
	first, work := reqs[0].At, 0.0
	for i := range reqs {
		reqs[i].At -= first
		work += (o.Costs.PrefillOverhead + time.Duration(reqs[i].PromptTokens)*o.Costs.PrefillPerToken).Seconds()
	}
	scale := offered * float64(s.cfg.Engines) * reqs[n-1].At.Seconds() / work
	rng := rand.New(rand.NewPCG(jitter, 0))
	for i := range reqs {
		reqs[i].At = time.Duration(float64(reqs[i].At) / scale)
		if jitter > 0 {
			reqs[i].At += time.Duration(rng.Int64N(int64(50 * time.Millisecond)))
		}
	}
	slices.SortStableFunc(reqs, func(a, b mockengine.SimRequest) int { return cmp.Compare(a.At, b.At) })
	return &traceSim{cfg: s.cfg, reqs: reqs, oracle: map[int][]mockengine.SimOutcome{}}, scale
}

// winsOf counts the runs in which shares beat base by more than 0.05 point, and those in
// which base beats shares.
func winsOf(shares, base []float64) (wins, losses int) {
	for i, s := range shares {
		switch d := s - base[i]; {
		case d > 0.0005:
			wins++
		case d < -0.0005:
			losses++
		}
	}
	return wins, losses
}

func meanOf(xs []float64) float64 {
	sum := 0.0
	for _, x := range xs {
		sum += x
	}
	return sum / float64(len(xs))
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

// queue is e's prefill queue at now (the work ahead of a new request's own) as v sees it.
func (v queueView) queue(e mockengine.EngineView, now time.Duration) time.Duration {
	queue := e.Backlog(now)
	switch started := e.Started(now); v {
	case routerFull:
		queue += started
	case routerLeft:
		if n := e.Waiting() + e.Prefilling(now); n > 0 {
			queue += max(started-(queue+started)/time.Duration(n), 0)
		}
	}
	return queue
}

func (v queueView) String() string {
	return [...]string{"engine's queue", "router's view, in full", "router's view, what is left"}[v]
}

// TestTraceColdPlacementSimulation places four windows of 1,500 requests of the shipped
// trace (SWITCHYARD_BENCH_TRACE; skipped without it), each replayed at the speed that offers
// the fleet of the trace scenario (8 engines) a given prefill load, on the simulated engines
// by cache_aware's latency rule with each tie order for cold work (coldOrder, the rules
// before the coldFuture bound), and logs each
// one's share of the holder placement's hits and the share lost to prefixes gone from every
// engine; one window's figures swing by several points with the placement of a few requests,
// the mean over the windows much less. At the trace scenario's load (68%) it checks that the
// default rule with the engines' queues keeps at least 95% of the holder placement's hits.
func TestTraceColdPlacementSimulation(t *testing.T) {
	const window, engines = 1500, 8
	all, o := fullTraceSim(t, engines)
	perToken := o.Costs.PrefillPerToken.Seconds()
	starts := []int{0, 800, 1600, 2400}
	var defaultShare float64
	for _, offered := range []float64{0.2, 0.68} {
		for _, view := range []queueView{engineQueues, routerLeft} {
			if view != engineQueues && offered < 0.5 {
				continue // little queues: the views agree
			}
			var mean [coldFuture]float64 // the orders that are rules
			for _, start := range starts {
				sim, scale := all.window(t, &o, start, window, offered, 0)
				orc, err := sim.holder(window)
				if err != nil {
					t.Fatal(err)
				}
				held := sim.result(orc)
				var line strings.Builder
				for c := range mean {
					r := defaultRule
					r.view, r.cold = view, coldOrder(c)
					out, err := mockengine.Simulate(sim.cfg, sim.reqs, latencyRule(r, perToken))
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

// TestTraceColdValueSimulation asks how much a tie order for cold work can keep at the trace
// scenario's load: the 21 runs of traceSim.runRules at 68% (SWITCHYARD_BENCH_TRACE; skipped
// without it) placed by the default rule with its own tie order, with the fewest uncached
// tokens placed lately first (coldChurn: the order the router could keep from its own
// dispatches), with the fewest evicted pages that a request uses again within 60 s first
// (coldFuture: future knowledge, a bound), and with the value order the router can keep
// (coldSteps: the fewest steps of conversations in progress evicted from its shadow of each
// engine's cache, after a share guard: an engine past 1.1 times the mean of the requests
// placed lately, half-life 300 s, loses first). It logs each one's share of the holder
// placement's hits (mean, lowest, runs won and lost against the default), gone, away and
// gained, TTFT p90 and the largest spreads, and checks the bound: it keeps at least 3
// points more than the default on the mean, winning at least 18 of the 21 runs, without a
// higher TTFT p90; the tie set of cold work is large enough at this load, what a rule
// lacks is which evicted pages return. It checks that the value order from the shadow
// keeps as many hits as the default within half a point, no more than a point more, and
// no larger request spread: what the router can know of the evicted pages does not move
// the share at this load. It takes a few minutes of CPU.
func TestTraceColdValueSimulation(t *testing.T) {
	all, o := fullTraceSim(t, 8)
	churn, bound, shadow := defaultRule, defaultRule, defaultRule
	churn.cold = coldChurn
	bound.cold, bound.horizon = coldFuture, 60*time.Second
	shadow.cold, shadow.share, shadow.shareHalfLife = coldSteps, 1.1, 300
	names := []string{"default", "churn", "future (bound)", "value from the router's shadow, share guard"}
	res := all.runRules(t, &o, 0.68, []simRule{defaultRule, churn, bound, shadow})
	for i, name := range names {
		x := &res[i]
		wins, losses := winsOf(x.share, res[0].share)
		t.Logf("%s: %.1f%% of the holder placement's hits (lowest %.1f%%, %d wins, %d losses in %d runs); gone %.1f%%, away %.1f%%, gained %.1f%%; TTFT p90 %.0f ms; spread at most %.2f / %.2f",
			name, 100*meanOf(x.share), 100*slices.Min(x.share), wins, losses, len(x.share),
			100*meanOf(x.gone), 100*meanOf(x.away), 100*meanOf(x.gained), 1000*meanOf(x.p90), slices.Max(x.spread), slices.Max(x.prefill))
	}
	def, b, sh := &res[0], &res[2], &res[3]
	wins, _ := winsOf(b.share, def.share)
	if meanOf(b.share) < meanOf(def.share)+0.03 || wins < 18 || meanOf(b.p90) > meanOf(def.p90) {
		t.Errorf("the bound keeps %.1f%% of the holder placement's hits (wins %d of %d, TTFT p90 %.0f ms), the default %.1f%% (%.0f ms): want 3 points more, 18 wins and no higher p90",
			100*meanOf(b.share), wins, len(b.share), 1000*meanOf(b.p90), 100*meanOf(def.share), 1000*meanOf(def.p90))
	}
	if d := meanOf(sh.share) - meanOf(def.share); d < -0.005 || d > 0.01 || slices.Max(sh.spread) > slices.Max(def.spread) {
		t.Errorf("the value order from the shadow keeps %.1f%% of the holder placement's hits (request spread at most %.2f), the default %.1f%% (%.2f): want within -0.5 to +1 point and no larger spread",
			100*meanOf(sh.share), slices.Max(sh.spread), 100*meanOf(def.share), slices.Max(def.spread))
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
	// coldFuture: the fewest pages evicted (EngineView.EvictionOrder, for the prompt's
	// uncached part and output) that a later request uses within simRule.horizon: future
	// knowledge, a bound on what any tie order for cold work can keep, not a rule.
	coldFuture
	// coldValue: the fewest pages evicted (EngineView.EvictionOrder) whose last use was by
	// a request that had a held prefix at arrival (a conversation in progress), then
	// coldDecode: the engine's own eviction order, which the router does not know.
	coldValue
	// coldSteps: coldValue with the router's shadow of each engine's cache (shadowLRU) in
	// place of the engine's eviction order: the whole 1,024-token steps of the prompts it
	// sent there (the granularity of the dispatch memory's fingerprints), by the time it
	// sent them, the prompts' tails and outputs as filler steps, within the engine's
	// capacity.
	coldSteps
)

var coldOrderNames = [...]string{"decode load", "free KV", "LRU victim", "churn", "future (bound)", "value (engine's LRU)", "value (shadow of steps)"}

// shadowLRU is a router's model of one engine's prefix cache: the steps of the prompts it
// sent there and filler for their tails and output, by the time it sent them (most recent
// last), at most cap steps, each marked valued when the request that last used it had a
// held prefix at arrival.
type shadowLRU struct {
	cap   int
	pages map[int64]*shadowPage
	head  shadowPage // sentinel: head.next is the oldest page
	out   int64      // the next filler step's key (negative: no prompt page has it)
	rest  int        // tokens of filler not yet a whole step
}

type shadowPage struct {
	hash       int64
	valued     bool
	prev, next *shadowPage
}

func newShadowLRU(capPages int) *shadowLRU {
	s := &shadowLRU{cap: capPages, pages: make(map[int64]*shadowPage), out: -1}
	s.head.prev, s.head.next = &s.head, &s.head
	return s
}

func (s *shadowLRU) unlink(p *shadowPage) { p.prev.next, p.next.prev = p.next, p.prev }

func (s *shadowLRU) touch(h int64, valued bool) {
	p, ok := s.pages[h]
	if ok {
		s.unlink(p)
	} else {
		p = &shadowPage{hash: h}
		s.pages[h] = p
	}
	p.valued = valued
	p.prev, p.next = s.head.prev, &s.head
	s.head.prev.next = p
	s.head.prev = p
	for len(s.pages) > s.cap {
		old := s.head.next
		s.unlink(old)
		delete(s.pages, old.hash)
	}
}

// placeSteps records a request at the granularity of step-token steps (each step keyed by
// its last page's chained hash), its tail and output counted as filler.
func (s *shadowLRU) placeSteps(hashes []int64, promptTokens, outTokens, pageSize, step int, valued bool) {
	per := step / pageSize
	n := len(hashes) / per
	for k := range n {
		s.touch(hashes[(k+1)*per-1], valued)
	}
	s.rest += promptTokens - n*step + outTokens
	for ; s.rest >= step; s.rest -= step {
		s.touch(s.out, false)
		s.out--
	}
}

// valuedVictims is how many valued steps taking n more steps would evict.
func (s *shadowLRU) valuedVictims(n int) int {
	k := 0
	for p, need := s.head.next, len(s.pages)+n-s.cap; p != &s.head && need > 0; p, need = p.next, need-1 {
		if p.valued {
			k++
		}
	}
	return k
}

// pageUses is when each page of a run's prompts is used: its requests' arrivals, in order.
type pageUses struct{ at map[int64][]time.Duration }

// usesOf is the page uses of reqs (in order of arrival).
func usesOf(reqs []mockengine.SimRequest) *pageUses {
	u := &pageUses{at: map[int64][]time.Duration{}}
	for _, r := range reqs {
		for _, h := range r.Hashes {
			u.at[h] = append(u.at[h], r.At)
		}
	}
	return u
}

// usedWithin reports whether a request arriving after now and at most horizon later uses
// page h.
func (u *pageUses) usedWithin(h int64, now, horizon time.Duration) bool {
	at := u.at[h]
	i, _ := slices.BinarySearch(at, now+1)
	return i < len(at) && at[i] <= now+horizon
}

// simRule is cache_aware's latency decision on simulated engines (latencyRule).
type simRule struct {
	credit      float64   // credits for a hit beyond its own prefill (1: the default)
	weigh       bool      // the credit times the fleet's hit weight (the default)
	holderFirst bool      // ties go to the longer prefix first, then to fewer running requests
	view        queueView // how the rule sees an engine's queue
	noise       float64   // each queue seen times e^(noise × N(0,1)) (a host's timing error)
	cold        coldOrder // the tie order of a request no engine holds any page of
	// uses and horizon are coldFuture's knowledge of the run (set by traceSim.runRules).
	uses    *pageUses
	horizon time.Duration
	// runGap: a cold tie between engines whose running requests differ by more than runGap
	// goes to the fewer first (0: no such guard).
	runGap int
	// share: a cold tie goes first to an engine whose requests placed lately (decayed with
	// half-life shareHalfLife seconds; 0: never decayed) are at most share times the fleet's
	// mean (0: no such guard).
	share, shareHalfLife float64
	// slowEngine is taken to be slowFactor times slower than it is (its expected TTFT and
	// its hit credit times slowFactor: a learned prefill rate outside the rate band) for
	// the requests before slowUntil (0: none is).
	slowEngine, slowUntil int
	slowFactor            float64
	// inFlight: the tie order's decode load counts an engine's waiting requests with its
	// running ones (as the router's in-flight count does), not its running ones alone.
	inFlight bool
}

// latencyRule is cache_aware's latency decision (engine.CacheAware.pickByLatency) on
// simulated engines: each engine's expected TTFT is its queued prefill plus the request's
// prompt less the prefix it holds, at perToken seconds a token; its score that TTFT less
// r.credit times the held prefix's prefill, with r.weigh times the fleet's hit weight
// (n+1)/(n+1−b), b the engines with at least the longest held prefix's prefill queued
// ahead (as the engine has it); scores within 10% of the fastest TTFT tie, and a tie goes
// to fewer running requests, then the longer prefix (r.holderFirst: the longer prefix
// first; a cold request: r.cold first). r.view says how the queue is seen, r.noise how far
// off (each engine's queue times its own draw of e^(noise × N(0,1)), seeded by noise).
func latencyRule(r simRule, perToken float64) mockengine.Placer {
	const pageSize = 16     // the trace scenario's
	const stepTokens = 1024 // the dispatch memory's step
	type key struct {
		score, ttft float64
		held, run   int
		free        int
		age         time.Duration
		returning   int // coldFuture: pages evicted that return within r.horizon
		valued      int // coldValue, coldShadow: valued pages evicted
		over        bool
	}
	var keys []key
	var evicted []int64
	var churn []float64
	var last time.Duration
	const halfLife = 300 // seconds
	noise := rand.New(rand.NewPCG(uint64(1000*r.noise), 1))
	var queues []time.Duration
	var valued map[int64]bool // coldValue: whether a page's last use had a held prefix
	var shadows []*shadowLRU  // coldSteps
	var placed []float64      // requests placed, for the share guard
	var lastShare time.Duration
	return mockengine.PlaceFunc(func(ri int, now time.Duration, req *mockengine.SimRequest, fleet []mockengine.EngineView) int {
		if churn == nil {
			churn = make([]float64, len(fleet))
			placed = make([]float64, len(fleet))
			valued = map[int64]bool{}
			shadows = make([]*shadowLRU, len(fleet))
			for i := range shadows {
				shadows[i] = newShadowLRU(fleet[i].Free() / stepTokens)
			}
		}
		if r.shareHalfLife > 0 {
			d := math.Exp2(-(now - lastShare).Seconds() / r.shareHalfLife)
			for i := range placed {
				placed[i] *= d
			}
			lastShare = now
		}
		decay := math.Exp2(-(now - last).Seconds() / halfLife)
		for i := range churn {
			churn[i] *= decay
		}
		last = now
		keys = keys[:0]
		best, fastest := 0.0, 0.0
		cold := true
		weight := 1.0
		queues = queues[:0]
		for _, e := range fleet {
			queue := r.view.queue(e, now)
			if r.noise > 0 {
				queue = time.Duration(float64(queue) * math.Exp(r.noise*noise.NormFloat64()))
			}
			queues = append(queues, queue)
		}
		if r.weigh {
			hit := 1
			for _, e := range fleet {
				hit = max(hit, e.Held(req))
			}
			busy := 0
			for _, e := range fleet {
				if e.Backlog(now).Seconds() >= float64(hit)*perToken {
					busy++
				}
			}
			weight = float64(len(fleet)+1) / float64(len(fleet)+1-busy)
		}
		for i, e := range fleet {
			held := e.Held(req)
			cold = cold && held == 0
			queue := queues[i]
			ttft := queue.Seconds() + float64(req.PromptTokens-held)*perToken
			credit := weight * r.credit * float64(held) * perToken
			if i == r.slowEngine && ri < r.slowUntil {
				ttft, credit = ttft*r.slowFactor, credit*r.slowFactor
			}
			run := e.Running()
			if r.inFlight {
				run += e.Waiting()
			}
			k := key{score: ttft - credit, ttft: ttft, held: held, run: run,
				free: e.Free() - (req.PromptTokens - held), age: e.VictimAge(now)}
			switch r.cold {
			case coldValue:
				evicted = e.EvictionOrder(evicted[:0], req.PromptTokens-held+req.MaxTokens)
				for _, h := range evicted {
					if valued[h] {
						k.valued++
					}
				}
			case coldSteps:
				k.valued = shadows[i].valuedVictims((req.PromptTokens - held + req.MaxTokens) / stepTokens)
			}
			if r.cold == coldFuture {
				evicted = e.EvictionOrder(evicted[:0], req.PromptTokens-held+req.MaxTokens)
				for _, h := range evicted {
					if r.uses.usedWithin(h, now, r.horizon) {
						k.returning++
					}
				}
			}
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
			if r.share > 0 && a.over != b.over {
				return b.over, true
			}
			if r.runGap > 0 && (a.run-b.run > r.runGap || b.run-a.run > r.runGap) {
				return a.run < b.run, true
			}
			switch r.cold {
			case coldValue, coldSteps:
				return a.valued < b.valued, a.valued != b.valued
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
			case coldFuture:
				return a.returning < b.returning, a.returning != b.returning
			}
			return false, false
		}
		if r.share > 0 {
			mean := meanOf(placed)
			for i := range keys {
				keys[i].over = placed[i] > r.share*mean
			}
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
			b := keys[pick]
			if r.holderFirst && k.held != b.held {
				if k.held > b.held {
					pick = i
				}
				continue
			}
			if k.run < b.run || (k.run == b.run && k.held > b.held) {
				pick = i
			}
		}
		churn[pick] += float64(req.PromptTokens - keys[pick].held)
		placed[pick]++
		switch hadHeld := !cold; r.cold {
		case coldValue:
			for _, h := range req.Hashes {
				valued[h] = hadHeld
			}
		case coldSteps:
			shadows[pick].placeSteps(req.Hashes, req.PromptTokens, req.MaxTokens, pageSize, stepTokens, hadHeld)
		}
		return pick
	})
}
