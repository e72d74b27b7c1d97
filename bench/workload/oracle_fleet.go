package workload

import (
	"container/heap"
	"container/list"
	"fmt"
	"math"
	"time"
)

// FleetConfig describes the engines FleetOracle places a replayed workload on: their number,
// each one's KV capacity and the cost model that says how long a request holds its KV.
type FleetConfig struct {
	// Engines is the number of engines (at least 1).
	Engines int
	// CacheTokens is each engine's KV capacity, tokens (at least one page).
	CacheTokens int
	// PageSize is the KV page size, tokens (at least 1).
	PageSize int
	// TimeScale divides the requests' arrival times (Request.At), as the replay does; 0 is 1.
	TimeScale float64
	// PrefillOverhead and PrefillPerToken are the cost of a prefill: fixed, and per uncached
	// prompt token.
	PrefillOverhead, PrefillPerToken time.Duration
	// DecodeStep and DecodePerRequest are the cost of one decode step: fixed, and per request
	// running on the engine.
	DecodeStep, DecodePerRequest time.Duration
}

// FleetOracle is the best cache hit rate a router can reach on reqs (arriving at their At)
// over cfg.Engines engines that each keep their own prefix cache of cfg.CacheTokens tokens,
// under the rules the engines follow:
//
//   - A request goes to the engine holding its longest cached prefix (the placement that
//     maximises its hit); when none holds more than another, to the engine with the most
//     free KV, else to the one whose least recently used evictable page is oldest.
//   - It hits its longest cached prefix of whole pages, less the last prompt token, as in
//     Oracle; its prompt's pages enter that engine's cache and, with the KV reserved for its
//     output, stay pinned until it ends; then its output's whole pages enter the cache too
//     (the engines cache them; a replayed trace never reuses them), and its pages become the
//     most recently used, as the engines release them.
//   - It ends after its prefill (PrefillOverhead + uncached tokens × PrefillPerToken) and its
//     output's decode steps at the engine's running count: the service time without a
//     queue. The oracle never queues a request nor pins its KV longer than a router could,
//     and admits a request even when pinned pages and reservations fill the engine.
//   - Each engine evicts its least recently used unpinned pages, leaves first, to keep its
//     pages and reservations within CacheTokens.
//
// Result.Pooled is left nil; Oracle of the same requests over the fleet's total capacity is
// the pooled figure (one cache that every request reaches and nothing pins).
func FleetOracle(reqs []Request, tok Templater, cfg FleetConfig) (OracleResult, error) {
	switch {
	case cfg.Engines < 1:
		return OracleResult{}, fmt.Errorf("cannot compute oracle: %w: %d engines", ErrInvalidConfig, cfg.Engines)
	case cfg.PageSize < 1:
		return OracleResult{}, fmt.Errorf("cannot compute oracle: %w: page size %d", ErrInvalidConfig, cfg.PageSize)
	case cfg.CacheTokens < cfg.PageSize:
		return OracleResult{}, fmt.Errorf("cannot compute oracle: %w: capacity %d tokens is below one page (%d)", ErrInvalidConfig, cfg.CacheTokens, cfg.PageSize)
	case cfg.TimeScale < 0 || math.IsNaN(cfg.TimeScale) || math.IsInf(cfg.TimeScale, 0):
		return OracleResult{}, fmt.Errorf("cannot compute oracle: %w: time scale %g", ErrInvalidConfig, cfg.TimeScale)
	}
	scale := cfg.TimeScale
	if scale == 0 {
		scale = 1
	}
	f := &fleet{cfg: cfg, engines: make([]*engineCache, cfg.Engines)}
	for i := range f.engines {
		f.engines[i] = newEngineCache(cfg.CacheTokens/cfg.PageSize, cfg.PageSize)
	}
	return runOracle(reqs, tok, cfg.PageSize, func(i int, hashes []int64, promptLen int) int {
		now := time.Duration(float64(reqs[i].At) / scale)
		f.finishUntil(now)
		return f.place(now, hashes, promptLen, max(reqs[i].MaxTokens, 0))
	})
}

// fleet is FleetOracle's state: the engines' caches and the requests running on them.
type fleet struct {
	cfg     FleetConfig
	engines []*engineCache
	running runningHeap
	stamp   uint64 // use order: larger is more recent
	outputs int64  // synthetic hashes of output pages, never matched by a prompt
}

// running is one request holding KV on an engine until end.
type running struct {
	end      time.Duration
	engine   *engineCache
	path     []*cachePage // pinned prompt pages
	reserve  int          // output tokens reserved, whole pages
	outPages int          // whole output pages cached on finishing
}

type runningHeap []*running

func (h runningHeap) Len() int           { return len(h) }
func (h runningHeap) Less(i, j int) bool { return h[i].end < h[j].end }
func (h runningHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *runningHeap) Push(x any)        { *h = append(*h, x.(*running)) }
func (h *runningHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// finishUntil ends every request that finishes at or before now, in order of finishing.
func (f *fleet) finishUntil(now time.Duration) {
	for f.running.Len() > 0 && f.running[0].end <= now {
		r := heap.Pop(&f.running).(*running)
		e := r.engine
		e.running--
		e.reserved -= r.reserve
		for _, p := range r.path {
			p.pins--
		}
		for range r.outPages {
			f.outputs--
			r.path = append(r.path, e.add(f.outputs))
		}
		// Released leaf first, the path becomes the most recently used, as on the engines.
		f.stamp++
		e.use(r.path, f.stamp)
		e.evict()
	}
}

// place runs one request of promptLen tokens (its whole pages' hashes) arriving at now and
// returns the prompt tokens it hits.
func (f *fleet) place(now time.Duration, hashes []int64, promptLen, output int) int {
	ps := f.cfg.PageSize
	best, bestMatch := -1, -1
	for i, e := range f.engines {
		m := min(e.match(hashes), (promptLen-1)/ps)
		if promptLen < 1 {
			m = 0
		}
		if m > bestMatch || (m == bestMatch && e.roomier(f.engines[best])) {
			best, bestMatch = i, m
		}
	}
	e := f.engines[best]
	f.stamp++
	path := make([]*cachePage, 0, len(hashes))
	for _, h := range hashes {
		p := e.add(h)
		p.pins++
		path = append(path, p)
	}
	e.use(path, f.stamp)
	reserve := roundUp(output, ps)
	e.reserved += reserve
	e.evict()
	cached := CachedTokens(bestMatch, promptLen, ps)
	uncached := promptLen - cached
	step := f.cfg.DecodeStep + time.Duration(e.running+1)*f.cfg.DecodePerRequest
	end := now + f.cfg.PrefillOverhead + time.Duration(uncached)*f.cfg.PrefillPerToken + time.Duration(output)*step
	e.running++
	heap.Push(&f.running, &running{
		end: end, engine: e, path: path, reserve: reserve,
		outPages: (promptLen+output)/ps - len(hashes),
	})
	return cached
}

func roundUp(n, page int) int {
	return (n + page - 1) / page * page
}

// cachePage is one page of an engine's cache.
type cachePage struct {
	hash  int64
	stamp uint64 // last use
	pins  int    // running requests using it
	elem  *list.Element
}

// engineCache is one engine's page-granular prefix cache: pages pinned by running requests
// are not evictable; the others are evicted least recently used first. A page is used no
// later than its parent (uses touch whole root paths), so the least recently used unpinned
// page has no cached child.
type engineCache struct {
	pageSize int
	capacity int // pages
	reserved int // tokens reserved for running requests' output
	running  int
	lru      *list.List // front: most recently used
	pages    map[int64]*cachePage
}

func newEngineCache(capacityPages, pageSize int) *engineCache {
	return &engineCache{pageSize: pageSize, capacity: capacityPages, lru: list.New(), pages: make(map[int64]*cachePage)}
}

// match returns how many leading pages of hashes are cached.
func (e *engineCache) match(hashes []int64) int {
	for i, h := range hashes {
		if _, ok := e.pages[h]; !ok {
			return i
		}
	}
	return len(hashes)
}

// free is the tokens neither cached nor reserved.
func (e *engineCache) free() int {
	return e.capacity*e.pageSize - e.lru.Len()*e.pageSize - e.reserved
}

// oldest is the last use of the least recently used unpinned page, or MaxUint64 without one.
func (e *engineCache) oldest() uint64 {
	for el := e.lru.Back(); el != nil; el = el.Prev() {
		if p := el.Value.(*cachePage); p.pins == 0 {
			return p.stamp
		}
	}
	return math.MaxUint64
}

// roomier reports whether a new prompt costs e less history than o: e has more free KV, or
// neither has any and e's stalest evictable page is older.
func (e *engineCache) roomier(o *engineCache) bool {
	ef, of := e.free(), o.free()
	if ef > 0 || of > 0 {
		return ef > of
	}
	return e.oldest() < o.oldest()
}

// add returns the page hash, cached as the least recently used page when new (use orders
// it).
func (e *engineCache) add(hash int64) *cachePage {
	p, ok := e.pages[hash]
	if !ok {
		p = &cachePage{hash: hash}
		e.pages[hash] = p
		p.elem = e.lru.PushBack(p)
	}
	return p
}

// use makes a root path the most recently used pages at stamp, its root first in the LRU
// order, so that no page is older than its child.
func (e *engineCache) use(path []*cachePage, stamp uint64) {
	for i := len(path) - 1; i >= 0; i-- {
		path[i].stamp = stamp
		e.lru.MoveToFront(path[i].elem)
	}
}

// evict removes least recently used unpinned pages until pages and reservations fit the
// capacity, or nothing more is evictable.
func (e *engineCache) evict() {
	el := e.lru.Back()
	for el != nil && e.free() < 0 {
		prev := el.Prev()
		if p := el.Value.(*cachePage); p.pins == 0 {
			delete(e.pages, p.hash)
			e.lru.Remove(el)
		}
		el = prev
	}
}
