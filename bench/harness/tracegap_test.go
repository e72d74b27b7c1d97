package harness

import (
	"encoding/json"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"switchyard/bench/loadgen"
	"switchyard/bench/mockengine"
	"switchyard/bench/report"
	"switchyard/engine"
	"switchyard/tokenizer"
)

// benchSeeds are the bench seeds whose quiet engine runs docs/benchmarks.md reports.
const benchSeeds = 8

// TestTraceSeedSimulation places exactly the trace scenario's default run (the first 1,500
// requests, 8 engines, --time-scale 2.5) of each --seed 1-8 on the simulated engines by the
// default latency rule with the router's view of the queues (SWITCHYARD_BENCH_TRACE; skipped
// without it): the seed maps each hash ID to its tokens and nothing else, so every seed is
// the same workload and the simulation the same placement. It logs each seed's holder
// placement and the rule's share of it, and checks that they agree to 0.1 point across the
// seeds. Then it replays seed 1's requests with each arrival delayed by up to 1, 5 or 50 ms
// (in order, as the load generator sends them; 16 draws each) and logs the rule's share of
// the exact replay's holder placement, as the bench's rows are judged: the spread of one
// workload's runs under timing noise alone. It checks that 1 ms of noise already moves a
// run's share by more than a point: the trace's figure for one run is chaotic in timing.
func TestTraceSeedSimulation(t *testing.T) {
	var shares []float64
	for seed := range uint64(benchSeeds) {
		sim, o := traceSimOf(t, Options{Trace: tracePathOf(t), Requests: 1500, Engines: 8, TimeScale: 2.5, Seed: seed + 1})
		orc, err := sim.holder(len(sim.reqs))
		if err != nil {
			t.Fatal(err)
		}
		out, err := mockengine.Simulate(sim.cfg, sim.reqs, latencyRule(benchRule(), o.Costs.PrefillPerToken.Seconds()))
		if err != nil {
			t.Fatal(err)
		}
		var x ruleRuns
		x.add(sim, orc, out)
		t.Logf("seed %d: holder placement %.2f%% hits; default rule %.1f%% of it (gone %.1f%%, away %.1f%%, gained %.1f%%), TTFT p90 %.0f ms",
			seed+1, 100*sim.result(orc).HitRate, 100*x.share[0], 100*x.gone[0], 100*x.away[0], 100*x.gained[0], 1000*x.p90[0])
		shares = append(shares, x.share[0])
	}
	if d := slices.Max(shares) - slices.Min(shares); d > 0.001 {
		t.Errorf("the default rule's share differs by %.2f points across seeds, want the same workload", 100*d)
	}

	sim, o := traceSimOf(t, Options{Trace: tracePathOf(t), Requests: 1500, Engines: 8, TimeScale: 2.5, Seed: 1})
	orc, err := sim.holder(len(sim.reqs))
	if err != nil {
		t.Fatal(err)
	}
	perToken := o.Costs.PrefillPerToken.Seconds()
	var spread1ms float64
	for _, late := range []time.Duration{time.Millisecond, 5 * time.Millisecond, 50 * time.Millisecond} {
		var rule, holder ruleRuns
		for draw := range uint64(16) {
			late := sim.late(draw+1, late)
			out, err := mockengine.Simulate(late.cfg, late.reqs, latencyRule(benchRule(), perToken))
			if err != nil {
				t.Fatal(err)
			}
			rule.add(late, orc, out)
			own, err := late.holder(len(late.reqs))
			if err != nil {
				t.Fatal(err)
			}
			holder.add(late, orc, own)
		}
		t.Logf("arrivals up to %v late, 16 draws: default rule %.1f%% of the exact holder placement (%.1f-%.1f%%, %d of 16 at or above 98%%; gone %.1f%%, away %.1f%%, gained %.1f%%); the holder placement itself %.1f%% (%.1f-%.1f%%)",
			late, 100*meanOf(rule.share), 100*slices.Min(rule.share), 100*slices.Max(rule.share), atLeast(rule.share, 0.98),
			100*meanOf(rule.gone), 100*meanOf(rule.away), 100*meanOf(rule.gained),
			100*meanOf(holder.share), 100*slices.Min(holder.share), 100*slices.Max(holder.share))
		if late == time.Millisecond {
			spread1ms = slices.Max(rule.share) - slices.Min(rule.share)
		}
	}
	if spread1ms <= 0.01 {
		t.Errorf("1 ms of arrival noise moves the default rule's share over %.2f points, want more than 1", 100*spread1ms)
	}
}

// benchRule is the default rule as the router runs it: the router's view of the queues.
func benchRule() simRule {
	r := defaultRule
	r.view = routerLeft
	return r
}

// late is s with each arrival delayed by up to max (uniform, seeded by seed), the order
// kept (a request is sent no earlier than the one before it, as the replay sends them).
func (s *traceSim) late(seed uint64, max time.Duration) *traceSim {
	reqs := slices.Clone(s.reqs)
	rng := rand.New(rand.NewPCG(seed, 0x1a7e))
	for i := range reqs {
		reqs[i].At += time.Duration(rng.Int64N(int64(max)))
		if i > 0 && reqs[i].At < reqs[i-1].At {
			reqs[i].At = reqs[i-1].At
		}
	}
	return &traceSim{cfg: s.cfg, reqs: reqs, keys: s.keys, oracle: map[int][]mockengine.SimOutcome{}}
}

// atLeast counts the xs at or above v.
func atLeast(xs []float64, v float64) int {
	n := 0
	for _, x := range xs {
		if x >= v {
			n++
		}
	}
	return n
}

// engineRun is one trace row measured on the engines, as TestTraceEnginePlacement keeps it:
// each request's engine (index, -1 when it failed), its cached tokens as the engine
// reported them, when it was sent (simulated time from the start of the run) and the
// router's latency decision for it (nil when none was recorded).
type engineRun struct {
	Seed     uint64                    `json:"seed"`
	Load     string                    `json:"load_average"`
	Engine   []int                     `json:"engine"`
	Cached   []int                     `json:"cached"`
	Start    []time.Duration           `json:"start_ns"`
	TTFT     []time.Duration           `json:"ttft_ns,omitempty"` // simulated time; 0 when failed
	Decision []*engine.LatencyDecision `json:"decision"`
}

// measureEngineRun runs cache_aware on the trace scenario's default run of seed on the
// engines (as `switchyard bench --scenario trace --requests 1500 --engines 8 --time-scale
// 2.5 --speedup 1 --seed N --policies cache_aware`), recording every latency decision.
func measureEngineRun(t *testing.T, seed uint64) *engineRun {
	t.Helper()
	o := Options{Trace: tracePathOf(t), Requests: 1500, Engines: 8, TimeScale: 2.5, Speedup: 1, Seed: seed,
		Scenarios: []string{report.ScenarioTrace}, Policies: mustPolicies(engine.PolicyCacheAware)}
	if err := o.Validate(); err != nil {
		t.Fatal(err)
	}
	o = o.withDefaults()
	o.EngineCache, o.Duration = o.traceCache, o.traceDuration
	h := &harness{opts: o, tok: tokenizer.NewSimple(), progress: newProgress(os.Stderr)}
	wl, err := readTrace(&h.opts)
	if err != nil {
		t.Fatal(err)
	}
	orc, err := h.newFleetOracles(wl.Requests, true)
	if err != nil {
		t.Fatal(err)
	}
	pr := h.opts.plainRun(report.ScenarioTrace, wl, orc)
	pr.path, pr.replay = h.opts.tracePath(), h.opts.TimeScale*h.opts.Speedup
	pr.decisions = true
	run := &engineRun{Seed: seed, Load: loadAverage()}
	pr.loss = func(c *cluster, m *loadgen.Measurement, d *decisionLog) (*report.HitLoss, error) {
		workers := ids(c.plain)
		for i := range m.Results {
			r := &m.Results[i]
			e := slices.Index(workers, r.Worker)
			if !r.OK() {
				e = -1
			}
			run.Engine = append(run.Engine, e)
			run.Cached = append(run.Cached, r.CachedTokens)
			run.Start = append(run.Start, time.Duration(float64(r.Start)*h.opts.Speedup))
			run.TTFT = append(run.TTFT, time.Duration(float64(r.TTFT)*h.opts.Speedup))
			run.Decision = append(run.Decision, d.take(orc.sim.keys[i], r.Worker))
		}
		return nil, nil
	}
	if _, err := h.policyRow(t.Context(), pr, h.opts.Policies[0]); err != nil {
		t.Fatal(err)
	}
	run.Load += " -> " + loadAverage()
	return run
}

// TestTraceEnginePlacement compares cache_aware's placement on the engines with the
// simulated rule's on the same requests. SWITCHYARD_BENCH_TRACE_RUN names a file: when it
// does not exist, the test runs the trace scenario's default run of seed
// SWITCHYARD_BENCH_TRACE_SEED (default 1) on the engines (about 3 minutes) and keeps what
// it needs there (engineRun); then, or when the file exists, it analyses it. Skipped
// without SWITCHYARD_BENCH_TRACE and SWITCHYARD_BENCH_TRACE_RUN.
//
// It replays the engines' placement on the simulated engines (the row's `hits` line does
// the same) and at each request asks the default rule, seeing the simulated fleet in that
// state, where it would go: where the two differ the router saw the fleet differently from
// the simulation. Each divergence is classed by which of the router's terms, put in place
// of the simulation's, makes the rule choose as the router did: its view of the caches
// (matched prefixes: the index fed by KV events and the dispatch memory), of the queues,
// both, or neither (the tie order's decode load). It logs the first divergences, the count
// and tokens of each class (the prefix the router's choice held against the rule's, in the
// simulation), and what each class costs over the 16 timing-noise draws of
// TestTraceSeedSimulation: the rule run with the router's choices of that class forced
// where they occurred, against the rule alone.
func TestTraceEnginePlacement(t *testing.T) {
	path := os.Getenv("SWITCHYARD_BENCH_TRACE_RUN")
	tracePathOf(t)
	if path == "" {
		t.Skip("SWITCHYARD_BENCH_TRACE_RUN names the engine run to analyse (measured when missing)")
	}
	run := &engineRun{}
	if b, err := os.ReadFile(path); err == nil {
		if err := json.Unmarshal(b, run); err != nil {
			t.Fatal(err)
		}
	} else {
		seed := uint64(1)
		if s := os.Getenv("SWITCHYARD_BENCH_TRACE_SEED"); s != "" {
			if seed, err = strconv.ParseUint(s, 10, 64); err != nil {
				t.Fatal(err)
			}
		}
		run = measureEngineRun(t, seed)
		b, err := json.Marshal(run)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	analyseEngineRun(t, run)
}

// fleetView is what the default rule weighs of each engine for one request: the prefix it
// holds (tokens), its queue as the rule sees it and its backlog (seconds at the engines'
// cost: the queue ahead of the request, and the work counted for the hit weight), its
// decode load, and how slow it is taken to be (its expected TTFT and credit are multiplied
// by it: 1 in the simulation; the router's learned rate over the median of the
// candidates', when outside its rate band).
type fleetView struct {
	held           []int
	queue, backlog []float64
	run            []float64
	slow           []float64
}

// simView is the simulated fleet as benchRule sees it for req at now.
func simView(fleet []mockengine.EngineView, now time.Duration, req *mockengine.SimRequest) fleetView {
	var v fleetView
	for _, e := range fleet {
		v.held = append(v.held, e.Held(req))
		v.queue = append(v.queue, routerLeft.queue(e, now).Seconds())
		v.backlog = append(v.backlog, e.Backlog(now).Seconds())
		v.run = append(v.run, float64(e.Running()))
		v.slow = append(v.slow, 1)
	}
	return v
}

// routerView is the fleet as the router saw it in decision d (candidates named e0, e1, ...
// for the simulated engines 0, 1, ...), its work ahead converted to seconds at perToken.
func routerView(d *engine.LatencyDecision, engines int, perToken float64) (fleetView, bool) {
	v := fleetView{held: make([]int, engines), queue: make([]float64, engines), backlog: make([]float64, engines),
		run: make([]float64, engines), slow: make([]float64, engines)}
	if len(d.Candidates) != engines {
		return v, false
	}
	rates := make([]float64, 0, engines)
	for _, c := range d.Candidates {
		rates = append(rates, c.PerToken)
	}
	slices.Sort(rates)
	median := rates[(len(rates)-1)/2]
	for _, c := range d.Candidates {
		e, err := strconv.Atoi(strings.TrimPrefix(c.WorkerID, "e"))
		if err != nil || e < 0 || e >= engines {
			return v, false
		}
		q := (c.Work - float64(c.Uncached)) * perToken
		v.held[e], v.queue[e], v.backlog[e], v.run[e], v.slow[e] = int(c.Matched), q, q, c.Decode, 1
		if median > 0 {
			v.slow[e] = c.PerToken / median
		}
	}
	return v, true
}

// pickDefault is benchRule's choice (latencyRule with defaultRule) on view v for a prompt of
// prompt tokens.
func pickDefault(v *fleetView, prompt int, perToken float64) int {
	hit := 1
	for _, h := range v.held {
		hit = max(hit, h)
	}
	busy := 0
	for _, b := range v.backlog {
		if b >= float64(hit)*perToken {
			busy++
		}
	}
	n := len(v.held)
	weight := float64(n+1) / float64(n+1-busy)
	best, fastest := math.Inf(1), math.Inf(1)
	ttft, score := make([]float64, n), make([]float64, n)
	for i := range n {
		ttft[i] = v.slow[i] * (v.queue[i] + float64(prompt-v.held[i])*perToken)
		score[i] = ttft[i] - v.slow[i]*weight*defaultRule.credit*float64(v.held[i])*perToken
		best, fastest = min(best, score[i]), min(fastest, ttft[i])
	}
	pick := -1
	for i := range n {
		switch {
		case score[i] > best+0.1*fastest:
		case pick < 0:
			pick = i
		case v.held[i] != v.held[pick]:
			if v.held[i] > v.held[pick] {
				pick = i
			}
		case v.run[i] < v.run[pick]:
			pick = i
		}
	}
	return pick
}

// divergence classes: which of the router's terms, put in the simulation's view alone,
// makes the default rule choose as the router did.
const (
	divCaches   = iota // the prefixes held
	divQueues          // the queues
	divDecode          // the decode load (the tie order)
	divRates           // the learned prefill rates
	divSeveral         // more than one of them alone
	divCombined        // none alone, all together
	divOther           // not even all together
	numDivs
)

var divNames = [numDivs]string{"caches", "queues", "decode load", "rates", "several alone", "only together", "unexplained"}

// divergence is a request the router placed elsewhere than the rule would have, seeing the
// simulated fleet of the router's placement.
type divergence struct {
	i, router, rule int
	class           int
	// heldRouter and heldRule are the prefixes the two choices held in the simulation;
	// seenRouter and seenRule what the router saw of them.
	heldRouter, heldRule, seenRouter, seenRule int
	// cachedRule is what the rule's choice had cached (the rest of heldRule was queued).
	cachedRule int
	// queueRouter and queueRule are the two choices' queues in the simulation, seen* as the
	// router saw them (seconds).
	queueRouter, queueRule, seenQRouter, seenQRule float64
}

func classify(sim, rv *fleetView, router, prompt int, perToken float64) int {
	swap := func(held, queue, run, slow bool) int {
		v := *sim
		if held {
			v.held = rv.held
		}
		if queue {
			v.queue, v.backlog = rv.queue, rv.backlog
		}
		if run {
			v.run = rv.run
		}
		if slow {
			v.slow = rv.slow
		}
		return pickDefault(&v, prompt, perToken)
	}
	single := []bool{swap(true, false, false, false) == router, swap(false, true, false, false) == router,
		swap(false, false, true, false) == router, swap(false, false, false, true) == router}
	k, which := 0, 0
	for i, ok := range single {
		if ok {
			k, which = k+1, i
		}
	}
	switch {
	case k == 1:
		return which
	case k > 1:
		return divSeveral
	case swap(true, true, true, true) == router:
		return divCombined
	}
	return divOther
}

// analyseEngineRun: see TestTraceEnginePlacement.
func analyseEngineRun(t *testing.T, run *engineRun) {
	t.Helper()
	n := len(run.Engine)
	sim, o := traceSimOf(t, Options{Trace: tracePathOf(t), Requests: n, Engines: 8, TimeScale: 2.5, Seed: run.Seed})
	engines := sim.cfg.Engines
	perToken := o.Costs.PrefillPerToken.Seconds()
	orc, err := sim.holder(n)
	if err != nil {
		t.Fatal(err)
	}
	placed := make([]int, n)
	var cached, prompts, late float64
	for i, e := range run.Engine {
		placed[i] = e
		if e < 0 {
			placed[i] = i % engines
		}
		cached += float64(run.Cached[i])
		prompts += float64(sim.reqs[i].PromptTokens)
		late = max(late, (run.Start[i] - sim.reqs[i].At).Seconds())
	}
	t.Logf("engine run of seed %d (load average %s): %d requests, measured %.1f%% of the holder placement's hits (%.2f%%), sent at most %.0f ms after the recorded arrival",
		run.Seed, run.Load, n, 100*cached/prompts/sim.result(orc).HitRate, 100*sim.result(orc).HitRate, 1000*late)
	if ttft := slices.Sorted(slices.Values(run.TTFT)); len(ttft) > 0 {
		q := func(p float64) time.Duration { return ttft[int(p*float64(len(ttft)-1))].Round(time.Millisecond) }
		t.Logf("measured TTFT p50 %v, p90 %v, p99 %v", q(0.5), q(0.9), q(0.99))
	}

	// The engines' placement replayed, the rule asked at each request.
	rule := latencyRule(benchRule(), perToken)
	var divs []divergence
	mismatch, unrecorded, agree := 0, 0, 0
	replay := mockengine.PlaceFunc(func(i int, now time.Duration, req *mockengine.SimRequest, fleet []mockengine.EngineView) int {
		s := rule.Place(i, now, req, fleet)
		sv := simView(fleet, now, req)
		if pickDefault(&sv, req.PromptTokens, perToken) != s {
			mismatch++
		}
		r := placed[i]
		d := run.Decision[i]
		rv, ok := fleetView{}, false
		if d != nil {
			rv, ok = routerView(d, engines, perToken)
		}
		if !ok {
			unrecorded++
			return r
		}
		if pickDefault(&rv, req.PromptTokens, perToken) == r {
			agree++
		}
		if s != r && run.Engine[i] >= 0 {
			divs = append(divs, divergence{i: i, router: r, rule: s, class: classify(&sv, &rv, r, req.PromptTokens, perToken),
				heldRouter: sv.held[r], heldRule: sv.held[s], seenRouter: rv.held[r], seenRule: rv.held[s],
				cachedRule:  fleet[s].Cached(req),
				queueRouter: sv.queue[r], queueRule: sv.queue[s], seenQRouter: rv.queue[r], seenQRule: rv.queue[s]})
		}
		return r
	})
	out, err := mockengine.Simulate(sim.cfg, sim.reqs[:n], replay)
	if err != nil {
		t.Fatal(err)
	}
	if mismatch > 0 {
		t.Errorf("pickDefault differs from the simulated rule on %d requests, want none", mismatch)
	}
	var x ruleRuns
	x.add(sim, orc, out)
	t.Logf("the engines' placement simulated: %.1f%% of the holder placement's hits (gone %.1f%%, away %.1f%%, gained %.1f%%); the router's recorded view gives its own choice for %d of %d requests (%d unrecorded)",
		100*x.share[0], 100*x.gone[0], 100*x.away[0], 100*x.gained[0], agree, n-unrecorded, unrecorded)

	// The divergences, by class.
	var count [numDivs]int
	var lostTokens, heldSeen, heldUnseen [numDivs]float64
	for k, d := range divs {
		count[d.class]++
		lostTokens[d.class] += float64(d.heldRule - d.heldRouter)
		if k < 12 {
			t.Logf("divergence %d: request %d at %.1f s, prompt %d: router e%d (held %d, seen %d; queue %.2f s, seen %.2f), rule e%d (held %d of which cached %d, seen %d; queue %.2f s, seen %.2f): %s",
				k+1, d.i, sim.reqs[d.i].At.Seconds(), sim.reqs[d.i].PromptTokens, d.router, d.heldRouter, d.seenRouter, d.queueRouter, d.seenQRouter,
				d.rule, d.heldRule, d.cachedRule, d.seenRule, d.queueRule, d.seenQRule, divNames[d.class])
		}
		if d.heldRule > d.heldRouter {
			if d.seenRule >= d.heldRule-dispatchedStepTokens {
				heldSeen[d.class] += float64(d.heldRule - d.heldRouter)
			} else {
				heldUnseen[d.class] += float64(d.heldRule - d.heldRouter)
			}
		}
	}
	var total float64
	for i := range orc {
		total += float64(orc[i].Cached)
	}
	for c := range numDivs {
		t.Logf("%s: %d divergences; the rule's choice held %.1f%% of the holder placement's cached tokens more than the router's (the router saw that prefix within a step: %.1f%%, did not: %.1f%%)",
			divNames[c], count[c], 100*lostTokens[c]/total, 100*heldSeen[c]/total, 100*heldUnseen[c]/total)
	}

	// What each class costs: the rule with the router's choices of a class forced where
	// they occurred, over timing-noise draws (a minute of CPU: not with -short).
	if testing.Short() {
		return
	}
	forced := make([]int, n)
	for i := range forced {
		forced[i] = -1
	}
	classOf := make([]int, n)
	for _, d := range divs {
		forced[d.i], classOf[d.i] = d.router, d.class
	}
	const draws = 16
	sets := []struct {
		name string
		in   func(c int) bool
	}{
		{"none (the rule alone)", func(int) bool { return false }},
		{"caches", func(c int) bool { return c == divCaches }},
		{"queues", func(c int) bool { return c == divQueues }},
		{"decode load", func(c int) bool { return c == divDecode }},
		{"rates", func(c int) bool { return c == divRates }},
		{"several, together or unexplained", func(c int) bool { return c >= divSeveral }},
		{"all", func(int) bool { return true }},
	}
	var base []float64
	for si, set := range sets {
		var res ruleRuns
		for draw := range uint64(draws) {
			s := sim.late(draw+1, time.Millisecond)
			inner := latencyRule(benchRule(), perToken)
			p := mockengine.PlaceFunc(func(i int, now time.Duration, req *mockengine.SimRequest, fleet []mockengine.EngineView) int {
				r := inner.Place(i, now, req, fleet)
				if forced[i] >= 0 && set.in(classOf[i]) {
					return forced[i]
				}
				return r
			})
			out, err := mockengine.Simulate(s.cfg, s.reqs[:n], p)
			if err != nil {
				t.Fatal(err)
			}
			res.add(s, orc, out)
		}
		if si == 0 {
			base = res.share
		}
		wins, losses := winsOf(res.share, base)
		t.Logf("forced: %s: %.1f%% of the holder placement's hits (%.1f-%.1f%%; %d above, %d below the rule alone in %d draws); gone %.1f%%, away %.1f%%, gained %.1f%%",
			set.name, 100*meanOf(res.share), 100*slices.Min(res.share), 100*slices.Max(res.share), wins, losses, draws,
			100*meanOf(res.gone), 100*meanOf(res.away), 100*meanOf(res.gained))
	}
}

// dispatchedStepTokens is the router's dispatch memory's step (engine's dispatchedStep).
const dispatchedStepTokens = 1024

// TestTraceSlowRateSimulation asks what a learned prefill rate outside the rate band costs:
// in the seed-1 engine run of TestTraceEnginePlacement one engine (e5), whose first request
// was a 28-token prompt, was taken to be 2.1 times slower than the others for the first 350
// requests. The default rule with engine 5 seen so for the first 350 requests, against the
// rule alone, on the 16 timing-noise draws of the bench's run (seed 1) and on the 21 runs of
// traceSim.runRules at 68% (SWITCHYARD_BENCH_TRACE; skipped without it). It logs the
// shares of the holder placement's hits, wins and losses, gone and the request spread.
func TestTraceSlowRateSimulation(t *testing.T) {
	slow := benchRule()
	slow.slowEngine, slow.slowUntil, slow.slowFactor = 5, 350, 2.1
	compareSimRules(t, "engine 5 seen 2.1x slower for 350 requests", slow)
}

// TestTraceInFlightTieSimulation asks what the router's decode load costs in the tie order:
// the router counts the requests it has in flight on an engine (waiting ones too) where the
// simulated rule counts the running ones; in the seed-1 engine run of
// TestTraceEnginePlacement 131 of the 431 requests the rule would have placed elsewhere are
// explained by that term alone. The default rule with an engine's waiting requests counted
// in its decode load, against the rule alone, as TestTraceSlowRateSimulation
// (SWITCHYARD_BENCH_TRACE; skipped without it).
func TestTraceInFlightTieSimulation(t *testing.T) {
	r := benchRule()
	r.inFlight = true
	compareSimRules(t, "waiting requests in the decode load", r)
}

// compareSimRules logs the default rule and alt (named name) on the 16 timing-noise draws
// of the bench's run (seed 1) and on the 21 runs of traceSim.runRules at 68%.
func compareSimRules(t *testing.T, name string, alt simRule) {
	t.Helper()
	sim, o := traceSimOf(t, Options{Trace: tracePathOf(t), Requests: 1500, Engines: 8, TimeScale: 2.5, Seed: 1})
	orc, err := sim.holder(len(sim.reqs))
	if err != nil {
		t.Fatal(err)
	}
	perToken := o.Costs.PrefillPerToken.Seconds()
	var res [2]ruleRuns
	for draw := range uint64(16) {
		late := sim.late(draw+1, time.Millisecond)
		for k, r := range []simRule{benchRule(), alt} {
			out, err := mockengine.Simulate(late.cfg, late.reqs, latencyRule(r, perToken))
			if err != nil {
				t.Fatal(err)
			}
			res[k].add(late, orc, out)
		}
	}
	all, ao := fullTraceSim(t, 8)
	runs := all.runRules(t, &ao, 0.68, []simRule{defaultRule, alt}) // each seen with the router's view
	for k, name := range []string{"the rule alone", name} {
		wins, losses := winsOf(res[k].share, res[0].share)
		rw, rl := winsOf(runs[k].share, runs[0].share)
		t.Logf("%s: bench run, 16 draws: %.1f%% of the holder placement's hits (%.1f-%.1f%%, %d above / %d below the rule alone), gone %.1f%%, spread at most %.2f; 21 runs at 68%%: %.1f%% (lowest %.1f%%, %d / %d), gone %.1f%%, spread at most %.2f",
			name, 100*meanOf(res[k].share), 100*slices.Min(res[k].share), 100*slices.Max(res[k].share), wins, losses, 100*meanOf(res[k].gone), slices.Max(res[k].spread),
			100*meanOf(runs[k].share), 100*slices.Min(runs[k].share), rw, rl, 100*meanOf(runs[k].gone), slices.Max(runs[k].spread))
	}
}
