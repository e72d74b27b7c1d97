package mockengine

import (
	"container/heap"
	"fmt"
	"math"
	"time"
)

// SimRequest is one request of a simulated fleet (Simulate).
type SimRequest struct {
	// At is the arrival time, simulated, from the start of the run.
	At time.Duration
	// Hashes are the chained hashes of the prompt's whole pages, as the engine computes
	// them (hashing.AppendChainHashes at the page size).
	Hashes []int64
	// PromptTokens is the prompt's length (at least len(Hashes) whole pages).
	PromptTokens int
	// MaxTokens is the output length (the engine generates exactly this many tokens).
	MaxTokens int
}

// SimOutcome is what the simulation did with one request.
type SimOutcome struct {
	// Engine is the engine the placement chose.
	Engine int
	// Cached is the prompt tokens served from the cache, as the engine reports them
	// (usage cached_tokens).
	Cached int
	// Held is, at arrival, the longest prefix (whole pages, tokens, less the last prompt
	// token) any engine held or was about to hold (EngineView.Held); HeldCached the longest
	// any engine had cached; OnEngine what the chosen engine held.
	Held, HeldCached, OnEngine int
	// HolderBacklog is, at arrival, the Backlog of the engine with HeldCached (the first such
	// engine; 0 when none had any of the prompt cached).
	HolderBacklog time.Duration
	// FirstToken is the time from arrival to the first output token.
	FirstToken time.Duration
}

// SimConfig is the fleet Simulate runs.
type SimConfig struct {
	// Engine is every engine's configuration: page size, cache capacity, max running
	// requests, prefill batch budget and cost model (defaults as Start applies them; the
	// Speedup is ignored: the simulation runs in simulated time).
	Engine Config
	// Engines is the number of engines (at least 1).
	Engines int
	// Speeds, when it has Engines entries, divides engine i's costs by Speeds[i] (each
	// positive), as the bench's --engine-speeds does.
	Speeds []float64
}

// Placer chooses the engine of each request of a simulated fleet.
type Placer interface {
	// Place returns the index in fleet of the engine request i (r) goes to, arriving at now.
	Place(i int, now time.Duration, r *SimRequest, fleet []EngineView) int
}

// PlaceFunc adapts a function to Placer.
type PlaceFunc func(i int, now time.Duration, r *SimRequest, fleet []EngineView) int

// Place calls f.
func (f PlaceFunc) Place(i int, now time.Duration, r *SimRequest, fleet []EngineView) int {
	return f(i, now, r, fleet)
}

// FixedPlacement places request i on engines[i]: a placement recorded from a run.
func FixedPlacement(engines []int) Placer {
	return PlaceFunc(func(i int, _ time.Duration, _ *SimRequest, _ []EngineView) int { return engines[i] })
}

// HolderPlacement is the placement that follows the cache: a request goes to the engine
// holding, cached or about to be cached, its longest prefix (EngineView.Held), among equal
// ones the least loaded (EngineView.Backlog, then fewer running requests, then the lowest
// index); a request no engine holds any page of goes to the least loaded engine.
func HolderPlacement() Placer {
	return PlaceFunc(func(_ int, now time.Duration, r *SimRequest, fleet []EngineView) int {
		best, bestHeld := 0, -1
		var bestLoad time.Duration
		for i, e := range fleet {
			held, load := e.Held(r), e.Backlog(now)
			switch {
			case held > bestHeld,
				held == bestHeld && load < bestLoad,
				held == bestHeld && load == bestLoad && e.Running() < fleet[best].Running():
				best, bestHeld, bestLoad = i, held, load
			}
		}
		return best
	})
}

// EngineView is what a Placer sees of one simulated engine at a request's arrival.
type EngineView struct{ e *simEngine }

// Held is the whole pages of r's prompt (tokens, at most the prompt less its last token,
// as an engine matches) that the engine has cached or will cache when the prefill of a
// request waiting or being prefilled there ends.
func (v EngineView) Held(r *SimRequest) int {
	return v.e.tokens(r, v.e.held(r.Hashes))
}

// Cached is the whole pages of r's prompt (tokens, as Held) the engine has cached now.
func (v EngineView) Cached(r *SimRequest) int {
	return v.e.tokens(r, v.e.cache.match(r.Hashes))
}

// Backlog is the prefill time queued before a new request's own: what is left of a prefill
// in progress and the uncached prompts waiting, at the engine's cost model.
func (v EngineView) Backlog(now time.Duration) time.Duration {
	e := v.e
	var d time.Duration
	if e.prefilling && e.stepEnd > now {
		d = e.stepEnd - now
	}
	for _, s := range e.waiting {
		d += e.costs.PrefillOverhead + time.Duration(s.estUncached)*e.costs.PrefillPerToken
	}
	return d
}

// Started is the prefill time of the step in progress already spent (0 without one).
func (v EngineView) Started(now time.Duration) time.Duration {
	e := v.e
	if !e.prefilling || e.stepEnd <= now {
		return 0
	}
	d := e.costs.PrefillOverhead
	for _, s := range e.batch {
		d += time.Duration(s.r.PromptTokens-s.cached) * e.costs.PrefillPerToken
	}
	return d - (e.stepEnd - now)
}

// VictimAge is the time since the page the engine would evict first was released; -1 when
// nothing is evictable.
func (v EngineView) VictimAge(now time.Duration) time.Duration {
	p := v.e.cache.lru.next
	if p == &v.e.cache.lru {
		return -1
	}
	return now - time.Duration(p.released)
}

// EvictionOrder appends to dst the hashes of the pages the engine would evict, in the order
// it would evict them, to take n more tokens now: none while n fits its free KV (Free),
// then its least recently used unreferenced pages (leaves first) until they cover the rest
// or none is left.
func (v EngineView) EvictionOrder(dst []int64, n int) []int64 {
	need := n - v.Free()
	for p := v.e.cache.lru.next; p != &v.e.cache.lru && need > 0; p = p.next {
		dst = append(dst, p.hash)
		need -= v.e.cfg.PageSize
	}
	return dst
}

// Free is the tokens the engine can take without evicting.
func (v EngineView) Free() int { return v.e.cfg.CacheTokens - v.e.cache.tokens - v.e.reserved }

// Running is the requests admitted (being prefilled or decoding).
func (v EngineView) Running() int { return len(v.e.running) }

// Waiting is the requests queued.
func (v EngineView) Waiting() int { return len(v.e.waiting) }

// Prefilling is the requests of the prefill step in progress (0 without one).
func (v EngineView) Prefilling(now time.Duration) int {
	if !v.e.prefilling || v.e.stepEnd <= now {
		return 0
	}
	return len(v.e.batch)
}

// Simulate runs reqs (in order of At) on a fleet of mock engines as discrete events,
// following the rules of the engine's scheduler (rank.run): a request queues on arrival;
// between steps the engine admits waiting requests first come first served while a running
// slot, the prefill token budget (one request always) and the KV capacity (after evicting
// least recently released unreferenced pages) allow, referencing its cached prefix and
// reserving KV for the rest of its prompt and its output; a step is one prefill of the
// admitted batch (its prompts' pages enter the cache when it ends, each request has its first
// token) or, with none admitted, one decode step of every running request; a finished
// request's output pages enter the cache and its pages are released, leaf first. Steps take
// the cost model's time. A request arriving at the moment a step ends is queued after that
// step's admission.
//
// Output pages get hashes no prompt has (a replayed trace never reuses an output). Each
// request's placement is place's choice at its arrival.
func Simulate(cfg SimConfig, reqs []SimRequest, place Placer) ([]SimOutcome, error) {
	c := cfg.Engine.withDefaults()
	switch {
	case cfg.Engines < 1:
		return nil, fmt.Errorf("cannot simulate: %w: %d engines", ErrInvalidConfig, cfg.Engines)
	case len(cfg.Speeds) != 0 && len(cfg.Speeds) != cfg.Engines:
		return nil, fmt.Errorf("cannot simulate: %w: %d speeds for %d engines", ErrInvalidConfig, len(cfg.Speeds), cfg.Engines)
	case place == nil:
		return nil, fmt.Errorf("cannot simulate: %w: no placement", ErrInvalidConfig)
	}
	for i, r := range reqs {
		switch {
		case i > 0 && r.At < reqs[i-1].At:
			return nil, fmt.Errorf("cannot simulate: %w: request %d arrives before request %d", ErrInvalidConfig, i, i-1)
		case r.PromptTokens < 1 || len(r.Hashes)*c.PageSize > r.PromptTokens || r.MaxTokens < 0:
			return nil, fmt.Errorf("cannot simulate: %w: request %d: %d prompt tokens, %d pages, %d output tokens",
				ErrInvalidConfig, i, r.PromptTokens, len(r.Hashes), r.MaxTokens)
		case r.PromptTokens+r.MaxTokens > c.CacheTokens:
			return nil, fmt.Errorf("cannot simulate: %w: request %d needs %d tokens, more than an engine's %d",
				ErrInvalidConfig, i, r.PromptTokens+r.MaxTokens, c.CacheTokens)
		}
	}
	f := &simFleet{out: make([]SimOutcome, len(reqs)), reqs: reqs}
	f.engines = make([]*simEngine, cfg.Engines)
	views := make([]EngineView, cfg.Engines)
	for i := range f.engines {
		costs := *c.Costs
		if len(cfg.Speeds) == cfg.Engines {
			sp := cfg.Speeds[i]
			if !(sp > 0) || math.IsInf(sp, 0) {
				return nil, fmt.Errorf("cannot simulate: %w: engine %d speed %g", ErrInvalidConfig, i, sp)
			}
			costs = Costs{
				PrefillOverhead:  time.Duration(float64(costs.PrefillOverhead) / sp),
				PrefillPerToken:  time.Duration(float64(costs.PrefillPerToken) / sp),
				DecodeStep:       time.Duration(float64(costs.DecodeStep) / sp),
				DecodePerRequest: time.Duration(float64(costs.DecodePerRequest) / sp),
			}
		}
		f.engines[i] = &simEngine{id: i, fleet: f, cfg: &c, costs: costs, cache: newPageCache(c.PageSize),
			pending: make(map[int64]int)}
		views[i] = EngineView{f.engines[i]}
	}
	for i := range reqs {
		r := &reqs[i]
		for len(f.steps) > 0 && f.steps[0].stepEnd <= r.At {
			e := heap.Pop(&f.steps).(*simEngine)
			e.endStep()
		}
		held, cached, holder := 0, 0, -1
		for j, v := range views {
			held = max(held, v.Held(r))
			if c := v.Cached(r); c > cached {
				cached, holder = c, j
			}
		}
		k := place.Place(i, r.At, r, views)
		if k < 0 || k >= len(views) {
			return nil, fmt.Errorf("cannot simulate: placement chose engine %d of %d for request %d", k, len(views), i)
		}
		f.out[i] = SimOutcome{Engine: k, Held: held, HeldCached: cached, OnEngine: views[k].Held(r)}
		if holder >= 0 {
			f.out[i].HolderBacklog = views[holder].Backlog(r.At)
		}
		f.engines[k].submit(i, r.At)
	}
	for len(f.steps) > 0 {
		heap.Pop(&f.steps).(*simEngine).endStep()
	}
	return f.out, nil
}

// simFleet is Simulate's state.
type simFleet struct {
	engines []*simEngine
	steps   stepHeap // busy engines by the end of their step
	reqs    []SimRequest
	out     []SimOutcome
	outputs int64 // synthetic hashes of output pages: negative, never a prompt's
}

// simSeq is one simulated request on its engine.
type simSeq struct {
	req         int
	r           *SimRequest
	arrived     time.Duration
	state       seqState
	path        []*page
	reserve     int
	cached      int
	produced    int
	estUncached int
}

// simEngine is one simulated engine: the scheduler state of a rank.
type simEngine struct {
	id       int
	fleet    *simFleet
	cfg      *Config
	costs    Costs
	cache    *pageCache
	waiting  []*simSeq
	running  []*simSeq
	reserved int
	// pending counts the prompt pages of requests waiting or being prefilled: pages the
	// engine will cache when their prefill ends.
	pending map[int64]int

	busy       bool
	prefilling bool // the step in progress is a prefill of batch
	batch      []*simSeq
	stepEnd    time.Duration
}

// held returns how many leading hashes are cached or pending.
func (e *simEngine) held(hashes []int64) int {
	for i, h := range hashes {
		if _, ok := e.cache.pages[h]; !ok && e.pending[h] == 0 {
			return i
		}
	}
	return len(hashes)
}

// tokens is what a match of n whole pages of r's prompt serves: at least one prompt token is
// computed.
func (e *simEngine) tokens(r *SimRequest, n int) int {
	return min(n, (r.PromptTokens-1)/e.cfg.PageSize) * e.cfg.PageSize
}

// submit queues request i arriving at now, and starts a step when the engine is idle.
func (e *simEngine) submit(i int, now time.Duration) {
	r := &e.fleet.reqs[i]
	e.cache.now = int64(now)
	s := &simSeq{req: i, r: r, arrived: now, state: stWaiting}
	s.estUncached = r.PromptTokens - e.tokens(r, e.cache.match(r.Hashes))
	e.waiting = append(e.waiting, s)
	for _, h := range r.Hashes {
		e.pending[h]++
	}
	if !e.busy {
		e.iterate(now)
	}
}

// iterate is one turn of the scheduler loop at now: admit, then start a prefill of the
// admitted batch, else a decode step of the running requests, else go idle.
func (e *simEngine) iterate(now time.Duration) {
	e.batch = e.admit(e.batch[:0], now)
	var cost time.Duration
	if len(e.batch) > 0 {
		uncached := 0
		for _, s := range e.batch {
			uncached += s.r.PromptTokens - s.cached
		}
		cost = e.costs.PrefillOverhead + time.Duration(uncached)*e.costs.PrefillPerToken
	} else {
		decoding := 0
		for _, s := range e.running {
			if s.state == stRunning {
				decoding++
			}
		}
		if decoding == 0 {
			e.busy, e.prefilling = false, false
			return
		}
		cost = e.costs.DecodeStep + time.Duration(decoding)*e.costs.DecodePerRequest
	}
	e.busy, e.prefilling, e.stepEnd = true, len(e.batch) > 0, now+cost
	heap.Push(&e.fleet.steps, e)
}

// endStep completes the step in progress at its end and starts the next.
func (e *simEngine) endStep() {
	now := e.stepEnd
	e.cache.now = int64(now)
	if e.prefilling {
		for _, s := range e.batch {
			e.insertPrompt(s)
			s.state = stRunning
			if s.r.MaxTokens > 0 {
				s.produced = 1
				e.fleet.out[s.req].FirstToken = now - s.arrived
			}
			if s.produced >= s.r.MaxTokens {
				e.finish(s)
			}
		}
	} else {
		for _, s := range e.running {
			if s.state != stRunning {
				continue
			}
			s.produced++
			if s.produced == 1 {
				e.fleet.out[s.req].FirstToken = now - s.arrived
			}
			if s.produced >= s.r.MaxTokens {
				e.finish(s)
			}
		}
	}
	keep := e.running[:0]
	for _, s := range e.running {
		if s.state != stDone {
			keep = append(keep, s)
		}
	}
	clear(e.running[len(keep):])
	e.running = keep
	e.iterate(now)
}

// admit is rank.admit: first come first served while a slot, the budget and KV allow.
func (e *simEngine) admit(batch []*simSeq, now time.Duration) []*simSeq {
	budget := e.cfg.MaxPrefillTokens
	for len(e.waiting) > 0 && len(e.running) < e.cfg.MaxRunning {
		s := e.waiting[0]
		uncached, ok := e.tryAdmit(s, budget, len(batch) == 0)
		if !ok {
			break
		}
		e.waiting[0] = nil
		e.waiting = e.waiting[1:]
		e.running = append(e.running, s)
		batch = append(batch, s)
		budget -= uncached
	}
	return batch
}

// tryAdmit is rank.tryAdmit for a plain engine.
func (e *simEngine) tryAdmit(s *simSeq, budget int, first bool) (int, bool) {
	ps := e.cfg.PageSize
	matched := min(e.cache.match(s.r.Hashes), (s.r.PromptTokens-1)/ps)
	uncached := s.r.PromptTokens - matched*ps
	if !first && uncached > budget {
		return 0, false
	}
	s.path = e.cache.lockPath(s.path[:0], s.r.Hashes[:matched])
	need := uncached + s.r.MaxTokens
	if !e.makeRoom(need) {
		e.cache.unlockPath(s.path)
		s.path = s.path[:0]
		return 0, false
	}
	s.reserve = need
	e.reserved += need
	s.cached = matched * ps
	e.fleet.out[s.req].Cached = s.cached
	s.state = stPrefill
	return uncached, true
}

// makeRoom is rank.makeRoom.
func (e *simEngine) makeRoom(need int) bool {
	_, ok := e.cache.evictFor(nil, e.reserved, need, e.cfg.CacheTokens)
	return ok
}

// insertPrompt is rank.insertPrompt: the prompt's pages enter the cache under its path.
func (e *simEngine) insertPrompt(s *simSeq) {
	have := len(s.path)
	var parent *page
	if have > 0 {
		parent = s.path[have-1]
	}
	for i := have; i < len(s.r.Hashes); i++ {
		p, _ := e.cache.insert(parent, s.r.Hashes[i])
		s.path = append(s.path, p)
		parent = p
	}
	for _, h := range s.r.Hashes {
		if e.pending[h]--; e.pending[h] == 0 {
			delete(e.pending, h)
		}
	}
	covered := (len(s.r.Hashes) - have) * e.cfg.PageSize
	s.reserve -= covered
	e.reserved -= covered
}

// finish is rank.finish after success: output pages enter the cache, the path is released
// leaf first and the reservation returned.
func (e *simEngine) finish(s *simSeq) {
	ps := e.cfg.PageSize
	have := len(s.path)
	if full := (s.r.PromptTokens + s.produced) / ps; have == len(s.r.Hashes) && full > have {
		var parent *page
		if have > 0 {
			parent = s.path[have-1]
		}
		for range full - have {
			e.fleet.outputs--
			p, _ := e.cache.insert(parent, e.fleet.outputs)
			s.path = append(s.path, p)
			parent = p
		}
	}
	e.cache.unlockPath(s.path)
	s.path = nil
	e.reserved -= s.reserve
	s.reserve = 0
	s.state = stDone
}

// stepHeap orders busy engines by the end of their step, then by index.
type stepHeap []*simEngine

func (h stepHeap) Len() int { return len(h) }
func (h stepHeap) Less(i, j int) bool {
	if h[i].stepEnd != h[j].stepEnd {
		return h[i].stepEnd < h[j].stepEnd
	}
	return h[i].id < h[j].id
}
func (h stepHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *stepHeap) Push(x any)   { *h = append(*h, x.(*simEngine)) }
func (h *stepHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	return x
}
