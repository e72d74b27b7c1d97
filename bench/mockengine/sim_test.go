package mockengine

import (
	"context"
	"encoding/json"
	"errors"
	"math/rand/v2"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	"switchyard/kv/hashing"
)

// simCosts are round costs for hand-computed simulations.
var simCosts = Costs{PrefillOverhead: 5 * time.Millisecond, PrefillPerToken: 50 * time.Microsecond,
	DecodeStep: 8 * time.Millisecond, DecodePerRequest: 100 * time.Microsecond}

// simReq is a request of prompt at (ms), with out output tokens, hashed at page size ps.
func simReq(prompt []uint32, atMs float64, out, ps int) SimRequest {
	full := len(prompt) / ps
	h, _ := hashing.AppendChainHashes(nil, nil, prompt[:full*ps], ps)
	return SimRequest{At: time.Duration(atMs * float64(time.Millisecond)), Hashes: h, PromptTokens: len(prompt), MaxTokens: out}
}

func TestSimulateKnownInputs(t *testing.T) {
	const ps = 16
	p1000 := ids(1, 1000)
	other := ids(50_000, 1000)
	hit := 999 / ps * ps // 992: whole pages, less the last prompt token
	prefill1000 := simCosts.PrefillOverhead + 1000*simCosts.PrefillPerToken
	cfg := func(engines, cache, budget int) SimConfig {
		c := simCosts
		return SimConfig{Engines: engines, Engine: Config{PageSize: ps, CacheTokens: cache, MaxPrefillTokens: budget, Costs: &c}}
	}
	cases := []struct {
		name       string
		cfg        SimConfig
		reqs       []SimRequest
		place      Placer
		wantCached []int
		wantEngine []int
		wantFirst  []time.Duration // 0: not checked
	}{
		{
			// The second arrives while the first is prefilled: it is admitted after that
			// prefill, which cached the prompt.
			name:       "queued behind its prefix's prefill hits",
			cfg:        cfg(1, 1<<16, 16384),
			reqs:       []SimRequest{simReq(p1000, 0, 1, ps), simReq(p1000, 1, 1, ps)},
			wantCached: []int{0, hit},
			wantFirst: []time.Duration{prefill1000,
				2*prefill1000 - time.Duration(hit)*simCosts.PrefillPerToken - time.Millisecond},
		},
		{
			// Both arrive during a decode step of a third request and are admitted in one
			// batch: neither finds the other's pages, as on the engine.
			name:       "one prefill batch: no hit",
			cfg:        cfg(1, 1<<16, 16384),
			reqs:       []SimRequest{simReq(other, 0, 50, ps), simReq(p1000, 60, 1, ps), simReq(p1000, 61, 1, ps)},
			wantCached: []int{0, 0, 0},
		},
		{
			// The same with a prefill budget below both: the second waits for the next
			// batch, after the first's pages are cached.
			name:       "prefill budget splits the batch: hit",
			cfg:        cfg(1, 1<<16, 1500),
			reqs:       []SimRequest{simReq(other, 0, 50, ps), simReq(p1000, 60, 1, ps), simReq(p1000, 61, 1, ps)},
			wantCached: []int{0, 0, hit},
		},
		{
			// A cache of 2,048 tokens holds two of these prompts' 62 pages: the third prompt
			// evicts 59 pages of the first, released before the second's, leaves first, so
			// a repeat of the first finds its first 3 pages.
			name:       "eviction",
			cfg:        cfg(1, 2048, 16384),
			reqs:       []SimRequest{simReq(p1000, 0, 1, ps), simReq(other, 100, 1, ps), simReq(ids(90_000, 1000), 200, 1, ps), simReq(p1000, 300, 1, ps)},
			wantCached: []int{0, 0, 0, 3 * ps},
		},
		{
			// The holder placement sends the repeat to the engine about to cache its
			// prefix (queued there), and a cold prompt to the idle engine.
			name:       "holder placement follows a queued prefix",
			cfg:        cfg(2, 1<<16, 16384),
			reqs:       []SimRequest{simReq(p1000, 0, 1, ps), simReq(p1000, 1, 1, ps), simReq(other, 2, 1, ps)},
			place:      HolderPlacement(),
			wantEngine: []int{0, 0, 1},
			wantCached: []int{0, hit, 0},
		},
		{
			// A fixed placement that splits the repeat from its prefix misses it.
			name:       "fixed placement",
			cfg:        cfg(2, 1<<16, 16384),
			reqs:       []SimRequest{simReq(p1000, 0, 1, ps), simReq(p1000, 100, 1, ps)},
			place:      FixedPlacement([]int{0, 1}),
			wantEngine: []int{0, 1},
			wantCached: []int{0, 0},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			place := tc.place
			if place == nil {
				place = FixedPlacement(make([]int, len(tc.reqs)))
			}
			out, err := Simulate(tc.cfg, tc.reqs, place)
			if err != nil {
				t.Fatal(err)
			}
			for i, o := range out {
				if o.Cached != tc.wantCached[i] {
					t.Errorf("request %d: cached %d, want %d", i, o.Cached, tc.wantCached[i])
				}
				if tc.wantEngine != nil && o.Engine != tc.wantEngine[i] {
					t.Errorf("request %d: engine %d, want %d", i, o.Engine, tc.wantEngine[i])
				}
				if tc.wantFirst != nil && tc.wantFirst[i] != 0 && o.FirstToken != tc.wantFirst[i] {
					t.Errorf("request %d: first token after %v, want %v", i, o.FirstToken, tc.wantFirst[i])
				}
			}
		})
	}
}

func TestSimulateHeldCountsWhatIsAboutToBeCached(t *testing.T) {
	const ps = 16
	p := ids(1, 1000)
	c := simCosts
	out, err := Simulate(SimConfig{Engines: 2, Engine: Config{PageSize: ps, Costs: &c}},
		[]SimRequest{simReq(p, 0, 1, ps), simReq(p, 1, 1, ps)}, FixedPlacement([]int{0, 1}))
	if err != nil {
		t.Fatal(err)
	}
	// At the second's arrival engine 0 is prefilling the first: held, not yet cached.
	if o := out[1]; o.Held != 992 || o.HeldCached != 0 || o.OnEngine != 0 || o.Cached != 0 {
		t.Errorf("second request: %+v, want held 992, held cached 0, on engine 0, cached 0", o)
	}
}

// TestSimulateHolderBacklog: an outcome carries the backlog of the engine that had the
// longest prefix cached when the request arrived, there the rest of another prompt's prefill.
func TestSimulateHolderBacklog(t *testing.T) {
	const ps = 16
	p, q := ids(1, 1000), ids(5000, 2000)
	c := simCosts
	longer := append(append([]uint32(nil), p...), ids(9000, 100)...)
	out, err := Simulate(SimConfig{Engines: 2, Engine: Config{PageSize: ps, Costs: &c}},
		[]SimRequest{simReq(p, 0, 1, ps), simReq(q, 60, 1, ps), simReq(longer, 100, 1, ps)}, FixedPlacement([]int{0, 0, 1}))
	if err != nil {
		t.Fatal(err)
	}
	// p's prefill ends at 55 ms; q's runs from 60 to 165 ms (5 ms + 2,000 × 50 µs).
	if o := out[2]; o.HeldCached != 992 || o.HolderBacklog != 65*time.Millisecond || o.Cached != 0 {
		t.Errorf("third request: %+v, want 992 held cached on an engine 65 ms from its next prefill, nothing cached", o)
	}
	if o := out[0]; o.HolderBacklog != 0 {
		t.Errorf("first request: holder backlog %v, want 0 (nothing cached anywhere)", o.HolderBacklog)
	}
}

// TestSimulateEvictionView: at the third request's arrival (100 ms), engine 0's least
// recently used page is one of the first prompt's, released when its prefill ended (55 ms),
// and its free KV is its capacity less that prompt's 62 cached pages and the reservation of
// the second (2,000 prompt tokens and 1 output token); engine 1 has nothing to evict. Taking
// its free KV evicts nothing on engine 0; three pages more evict the first prompt's last
// three pages, leaf first; engine 1 evicts nothing whatever it takes.
func TestSimulateEvictionView(t *testing.T) {
	const ps = 16
	c := simCosts
	var age [2]time.Duration
	var free [2]int
	var within, beyond, empty []int64
	place := PlaceFunc(func(i int, now time.Duration, _ *SimRequest, fleet []EngineView) int {
		if i == 2 {
			for k, v := range fleet {
				age[k], free[k] = v.VictimAge(now), v.Free()
			}
			within = fleet[0].EvictionOrder(nil, fleet[0].Free())
			beyond = fleet[0].EvictionOrder(nil, fleet[0].Free()+3*ps)
			empty = fleet[1].EvictionOrder(nil, 1<<20)
			return 1
		}
		return 0
	})
	first := simReq(ids(1, 1000), 0, 1, ps)
	_, err := Simulate(SimConfig{Engines: 2, Engine: Config{PageSize: ps, CacheTokens: 8192, Costs: &c}},
		[]SimRequest{first, simReq(ids(5000, 2000), 60, 1, ps), simReq(ids(9000, 100), 100, 1, ps)}, place)
	if err != nil {
		t.Fatal(err)
	}
	if age != [2]time.Duration{45 * time.Millisecond, -1} || free != [2]int{8192 - 62*ps - 2001, 8192} {
		t.Errorf("victim ages %v, free %v; want [45ms -1], [%d 8192]", age, free, 8192-62*ps-2001)
	}
	h := first.Hashes
	if want := []int64{h[61], h[60], h[59]}; len(within) != 0 || !slices.Equal(beyond, want) || len(empty) != 0 {
		t.Errorf("eviction orders %v, %v, %v; want [], %v, []", within, beyond, empty, want)
	}
}

func TestSimulateRejects(t *testing.T) {
	ok := simReq(ids(1, 100), 0, 1, 16)
	cases := map[string]struct {
		cfg   SimConfig
		reqs  []SimRequest
		place Placer
	}{
		"no engines":     {cfg: SimConfig{}, reqs: []SimRequest{ok}, place: HolderPlacement()},
		"speeds":         {cfg: SimConfig{Engines: 2, Speeds: []float64{1}}, reqs: []SimRequest{ok}, place: HolderPlacement()},
		"zero speed":     {cfg: SimConfig{Engines: 1, Speeds: []float64{0}}, reqs: []SimRequest{ok}, place: HolderPlacement()},
		"no placement":   {cfg: SimConfig{Engines: 1}, reqs: []SimRequest{ok}},
		"out of order":   {cfg: SimConfig{Engines: 1}, reqs: []SimRequest{simReq(ids(1, 100), 5, 1, 16), ok}, place: HolderPlacement()},
		"too long":       {cfg: SimConfig{Engines: 1, Engine: Config{CacheTokens: 64}}, reqs: []SimRequest{ok}, place: HolderPlacement()},
		"empty prompt":   {cfg: SimConfig{Engines: 1}, reqs: []SimRequest{{}}, place: HolderPlacement()},
		"bad engine idx": {cfg: SimConfig{Engines: 1}, reqs: []SimRequest{ok}, place: FixedPlacement([]int{3})},
	}
	for name, tc := range cases {
		if _, err := Simulate(tc.cfg, tc.reqs, tc.place); err == nil {
			t.Errorf("%s: no error", name)
		} else if name != "bad engine idx" && !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("%s: %v does not wrap ErrInvalidConfig", name, err)
		}
	}
}

// TestSimulateMatchesEngines replays a workload on real mock engines, each on its own
// manual clock, with the simulation's holder placement, and checks that every request's
// engine reports the cached tokens and the time to first token the simulation predicted.
// Conversations that extend their prompt, arrivals close enough to queue, a prefill budget,
// a running-request cap and a cache that evicts exercise every rule of the scheduler.
func TestSimulateMatchesEngines(t *testing.T) {
	const (
		ps      = 16
		engines = 3
	)
	c := simCosts
	ecfg := Config{PageSize: ps, CacheTokens: 4096, MaxPrefillTokens: 1024, MaxRunning: 4, Costs: &c,
		LoadPublish: LoadPublish{Disabled: true}, KVEvents: KVEvents{Disabled: true}}
	rng := rand.New(rand.NewPCG(7, 7))
	type conv struct{ prompt []uint32 }
	convs := make([]conv, 8)
	for i := range convs {
		convs[i].prompt = ids(100_000*(i+1), 100+rng.IntN(500))
	}
	var prompts [][]uint32
	var reqs []SimRequest
	at := 0.0
	for range 90 {
		at += float64(rng.IntN(25))
		var p []uint32
		if k := rng.IntN(len(convs) + 2); k < len(convs) {
			cv := &convs[k]
			if len(cv.prompt) > 2500 { // a new conversation
				cv.prompt = ids(rng.IntN(1<<30), 100+rng.IntN(500))
			}
			cv.prompt = append(cv.prompt, ids(rng.IntN(1<<30), 30+rng.IntN(250))...)
			p = cv.prompt
		} else {
			p = ids(rng.IntN(1<<30), 50+rng.IntN(900)) // unrelated
		}
		p = append([]uint32(nil), p...)
		prompts = append(prompts, p)
		reqs = append(reqs, simReq(p, at, 1+rng.IntN(30), ps))
	}
	sim, err := Simulate(SimConfig{Engine: ecfg, Engines: engines}, reqs, HolderPlacement())
	if err != nil {
		t.Fatal(err)
	}
	hits := 0
	for _, o := range sim {
		if o.Cached > 0 {
			hits++
		}
	}
	if hits < 10 {
		t.Fatalf("the workload has %d hits: too few to test the cache", hits)
	}

	start := time.Unix(1_800_000_000, 0)
	var wg sync.WaitGroup
	got := make([]struct {
		cached int
		ttft   time.Duration
		err    error
	}, len(reqs))
	for k := range engines {
		clk := NewManualClock(start)
		cfg := ecfg
		cfg.Clock = clk
		e := startEngine(t, cfg)
		client := newClient(t)
		var mine []int
		for i, o := range sim {
			if o.Engine == k {
				mine = append(mine, i)
			}
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			driveEngine(e, clk, start, client, mine, reqs, prompts, func(i int, cached int, ttft time.Duration, err error) {
				got[i].cached, got[i].ttft, got[i].err = cached, ttft, err
			})
		}()
	}
	wg.Wait()
	for i, o := range sim {
		g := got[i]
		if g.err != nil {
			t.Errorf("request %d: %v", i, g.err)
			continue
		}
		if g.cached != o.Cached {
			t.Errorf("request %d on engine %d: engine cached %d tokens, simulation %d", i, o.Engine, g.cached, o.Cached)
		}
		if !near(g.ttft, o.FirstToken) {
			t.Errorf("request %d on engine %d: engine TTFT %v, simulation %v", i, o.Engine, g.ttft, o.FirstToken)
		}
	}
}

// driveEngine sends requests mine of reqs to e at their arrival times on clk, moving clk
// from step to step only once the engine has settled (its next step's timer is pending, or
// it has nothing left to run), so the engine runs exactly as a discrete-event simulation.
func driveEngine(e *Engine, clk *ManualClock, start time.Time, client *http.Client, mine []int,
	reqs []SimRequest, prompts [][]uint32, record func(i, cached int, ttft time.Duration, err error)) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*testDeadline)
	defer cancel()
	var inflight sync.WaitGroup
	defer inflight.Wait()
	settle := func() bool {
		return waitFor(ctx, func() bool { return clk.Pending() > 0 || e.Running()+e.Waiting() == 0 })
	}
	// runUntil fires every step due by then, one at a time, each after the engine settled.
	runUntil := func(until time.Time, all bool) bool {
		for {
			if !settle() {
				return false
			}
			next, ok := clk.Next()
			if !ok || (!all && next.After(until)) {
				return true
			}
			if _, err := clk.AdvanceToNext(ctx); err != nil {
				return false
			}
		}
	}
	for _, i := range mine {
		arrive := start.Add(reqs[i].At)
		if !runUntil(arrive, false) {
			record(i, 0, 0, errors.New("engine did not settle"))
			return
		}
		clk.Advance(arrive.Sub(clk.Now()))
		idle, waiting := clk.Pending() == 0, e.Waiting()
		inflight.Add(1)
		go func() {
			defer inflight.Done()
			r, err := tryDo(client, "POST", e.URL()+"/generate", map[string]any{
				"input_ids": prompts[i], "sampling_params": map[string]any{"max_new_tokens": reqs[i].MaxTokens}})
			if err == nil && r.status != 200 {
				err = errors.New(string(r.body))
			}
			if err != nil {
				record(i, 0, 0, err)
				return
			}
			var m map[string]any
			if err := json.Unmarshal(r.body, &m); err != nil {
				record(i, 0, 0, err)
				return
			}
			mi, _ := m["meta_info"].(map[string]any)
			cached, _ := mi["cached_tokens"].(float64)
			ttft, _ := mi["first_token_latency"].(float64)
			record(i, int(cached), time.Duration(ttft*float64(time.Second)), nil)
		}()
		// The request is queued (a busy engine) or admitted with its step's timer set (an
		// idle one) before the clock moves or the next request arrives.
		if !waitFor(ctx, func() bool {
			if idle {
				return clk.Pending() > 0
			}
			return e.Waiting() > waiting
		}) {
			record(i, 0, 0, errors.New("request did not reach the engine"))
			return
		}
	}
	runUntil(time.Time{}, true)
}

// waitFor calls cond until it holds or ctx ends: for state behind a real socket and an
// engine's scheduler goroutine, which no channel signals.
func waitFor(ctx context.Context, cond func() bool) bool {
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-tick.C:
		case <-ctx.Done():
			return false
		}
	}
	return true
}
