package load

import (
	"math"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"
)

// Live guards are registered (so that ReleaseStale can find leaked ones) in a table of
// guardSlots slots, each claimed and cleared with one compare-and-swap: no lock per
// request. A guard that finds no free slot among guardProbes from a random start (more
// than a few thousand requests in flight) goes to one of guardShards locked lists.
const (
	guardSlots  = 1 << 13
	guardProbes = 8
	guardShards = 32 // a power of two
)

// Tracker is the router-local request accounting of every worker: one Counters per worker
// ID, and the Guards that hold in-flight slots. It is safe for concurrent use.
type Tracker struct {
	counters sync.Map // string -> *Counters
	slots    [guardSlots]atomic.Pointer[Guard]
	shards   [guardShards]guardShard
	// reaped counts guards released by ReleaseStale.
	reaped atomic.Uint64
}

// guardShard is one locked, intrusive list of live guards that found no slot.
type guardShard struct {
	mu   sync.Mutex
	head *Guard
	n    int
	_    [40]byte // keep neighbouring shards off one cache line
}

// Guard holds one in-flight slot on a worker's Counters, from Acquire until Release. A
// Guard from AcquirePrefill also holds a pending-prefill slot until FirstToken or Release.
type Guard struct {
	// state holds guardReleased once the guard was released, guardPrefill while it holds
	// its pending-prefill slot of prefill tokens, then the index of its shard (a guard in a
	// list), and above them its slot in the Tracker's table plus one (0: in a list): one
	// word, so that a Guard stays in the 48-byte allocation class.
	state   atomic.Uint32
	prefill int32
	c       *Counters
	t       *Tracker
	at      int64 // unix nanoseconds of Acquire
	// prev and next link live guards within a shard's list; guarded by its mu.
	prev, next *Guard
}

// Guard state bits.
const (
	guardReleased uint32 = 1 << iota
	guardPrefill
	guardShardShift = iota
	guardSlotShift  = guardShardShift + 5 // guardShards = 1<<5
)

// NewTracker returns an empty Tracker.
func NewTracker() *Tracker { return &Tracker{} }

// Counters returns worker id's counters, creating them on first use. The pointer is stable
// for the Tracker's lifetime.
func (t *Tracker) Counters(id string) *Counters {
	if c, ok := t.counters.Load(id); ok {
		return c.(*Counters)
	}
	c, _ := t.counters.LoadOrStore(id, &Counters{})
	return c.(*Counters)
}

// Acquire takes an in-flight slot on c for a request dispatched at now: it increments the
// in-flight and dispatch counts and records now as the latest dispatch. The caller must call
// Release on the returned Guard when the request finishes, on every path. Fast path: one
// small allocation and a compare-and-swap on a free slot of the table.
func (t *Tracker) Acquire(c *Counters, now time.Time) *Guard {
	return t.AcquirePrefill(c, now, -1)
}

// AcquirePrefill is Acquire for a request the worker prefills (a plain or prefill engine)
// with uncached prompt tokens: until the guard's FirstToken or Release, the request counts
// in the worker's pending prefill (Counters.PendingPrefill). Negative tokens acquire a
// plain guard, as Acquire does; tokens beyond 2^31−1 count as that.
func (t *Tracker) AcquirePrefill(c *Counters, now time.Time, uncached int64) *Guard {
	if c == nil {
		panic("BUG: load: Acquire with nil Counters")
	}
	ns := now.UnixNano()
	c.inflight.Add(1)
	c.dispatched.Add(1)
	c.lastDispatch.Store(ns)
	g := &Guard{c: c, t: t, at: ns}
	var st uint32
	if uncached >= 0 {
		g.prefill = int32(min(uncached, math.MaxInt32))
		st = guardPrefill
		if d := c.dueNext.Load(); d != 0 && d <= ns {
			c.settle(ns)
		}
		if c.pendingReqs.Load() <= 0 {
			// Nothing pending: the worker begins this prompt now (if a running slot is
			// free: Counters.PendingPrefillLeft).
			storeLater(&c.prefillFrom, ns)
		}
		c.pendingReqs.Add(1)
		c.pendingTokens.Add(int64(g.prefill))
	}
	r := rand.Uint32()
	for i := range uint32(guardProbes) {
		k := (r + i) & (guardSlots - 1)
		if t.slots[k].Load() != nil {
			continue
		}
		// The guard is complete before it is published.
		g.state.Store(st | (k+1)<<guardSlotShift)
		if t.slots[k].CompareAndSwap(nil, g) {
			return g
		}
	}
	// Slow path: no free slot nearby; a locked list.
	k := r >> 19 & (guardShards - 1)
	g.state.Store(st | k<<guardShardShift)
	sh := &t.shards[k]
	sh.mu.Lock()
	g.next = sh.head
	if sh.head != nil {
		sh.head.prev = g
	}
	sh.head = g
	sh.n++
	sh.mu.Unlock()
	return g
}

// Release gives the guard's in-flight slot back. Only the first call, among any number of
// sequential or concurrent calls (and ReleaseStale), has an effect; Release on a nil Guard
// does nothing.
func (g *Guard) Release() {
	if g == nil || !g.claim() {
		return
	}
	g.c.inflight.Add(-1)
	g.unregister()
}

// unregister takes a released guard out of its slot or list; the releasing call only.
func (g *Guard) unregister() {
	st := g.state.Load()
	if k := st >> guardSlotShift; k > 0 {
		g.t.slots[k-1].CompareAndSwap(g, nil)
		return
	}
	sh := &g.t.shards[st>>guardShardShift&(guardShards-1)]
	sh.mu.Lock()
	sh.unlink(g)
	sh.mu.Unlock()
}

// FirstToken gives the guard's pending-prefill slot back: the request's first token
// arrived at now, so its prefill is no longer ahead of anyone, and the worker's progress on
// what is still pending counts from now (Counters.PendingPrefillLeft). Only the first call
// (or Release) has an effect; it does nothing on a guard from Acquire or on nil.
func (g *Guard) FirstToken(now time.Time) {
	if g == nil {
		return
	}
	for {
		s := g.state.Load()
		if s&guardPrefill == 0 {
			return
		}
		if g.state.CompareAndSwap(s, s&^guardPrefill) {
			storeLater(&g.c.prefillFrom, now.UnixNano())
			g.givePrefill()
			return
		}
	}
}

// FirstTokenAt is for a request that will not report its first token (a buffered
// answer): its pending-prefill slot is given back as FirstToken(at) would, once the
// worker's next estimate or dispatch at or after at finds it due (Counters.PendingPrefillLeft,
// Tracker.AcquirePrefill), unless FirstToken or Release gave it back first. at is the
// expected first token: the dispatch plus the expected time to first token. It reports
// whether the worker had room for it (dueSlots requests at a time); without, the slot waits
// for FirstToken or Release. It does nothing on a guard from Acquire or on nil.
func (g *Guard) FirstTokenAt(at time.Time) bool {
	if g == nil || g.state.Load()&guardPrefill == 0 {
		return false
	}
	ns := at.UnixNano()
	if ns <= 0 {
		return false
	}
	c := g.c
	if ok, ended := c.registerDue(g, ns); ok || !ended {
		// Registered, or full of requests still waiting for their first token: settling
		// would free nothing (under load, with dueSlots such requests, each later one ends
		// here after one scan).
		return ok
	}
	// Full: free the entries of requests that ended, then look once more.
	c.settle(math.MinInt64)
	ok, _ := c.registerDue(g, ns)
	return ok
}

// registerDue puts g, expected at ns, in a free entry of c.due; when none is free, ended
// reports whether an entry holds a request that no longer waits for its first token (one
// settle frees).
func (c *Counters) registerDue(g *Guard, ns int64) (ok, ended bool) {
	for i := range c.due {
		e := &c.due[i]
		h := e.g.Load()
		if h == nil {
			if e.g.CompareAndSwap(nil, g) {
				e.at.Store(ns)
				storeEarlier(&c.dueNext, ns)
				return true, false
			}
			continue
		}
		if h.state.Load()&guardPrefill == 0 {
			ended = true
		}
	}
	return false, ended
}

// claim marks the guard released and gives its pending-prefill slot back if it still held
// one; it reports whether this call released the guard (false when it already was).
func (g *Guard) claim() bool {
	for {
		s := g.state.Load()
		if s&guardReleased != 0 {
			return false
		}
		if g.state.CompareAndSwap(s, s&^guardPrefill|guardReleased) {
			if s&guardPrefill != 0 {
				g.givePrefill()
			}
			return true
		}
	}
}

func (g *Guard) givePrefill() {
	g.c.pendingReqs.Add(-1)
	g.c.pendingTokens.Add(-int64(g.prefill))
}

// unlink removes g from the live list; sh.mu must be held.
func (sh *guardShard) unlink(g *Guard) {
	if g.prev != nil {
		g.prev.next = g.next
	} else {
		sh.head = g.next
	}
	if g.next != nil {
		g.next.prev = g.prev
	}
	g.prev, g.next = nil, nil
	sh.n--
}

// ReleaseStale releases every guard acquired more than maxAge before now — requests whose
// owner leaked the guard — and returns how many it released. The caller runs it
// periodically (for example every minute, with the configured load.guard_max_age). It scans
// the slot table, then holds one shard lock at a time.
func (t *Tracker) ReleaseStale(now time.Time, maxAge time.Duration) int {
	cutoff := now.Add(-maxAge).UnixNano()
	released := 0
	for i := range t.slots {
		if g := t.slots[i].Load(); g != nil && g.at < cutoff && g.claim() {
			g.c.inflight.Add(-1)
			t.slots[i].CompareAndSwap(g, nil)
			released++
		}
	}
	for i := range t.shards {
		sh := &t.shards[i]
		sh.mu.Lock()
		for g := sh.head; g != nil; {
			next := g.next
			if g.at < cutoff && g.claim() {
				g.c.inflight.Add(-1)
				sh.unlink(g)
				released++
			}
			g = next
		}
		sh.mu.Unlock()
	}
	t.reaped.Add(uint64(released))
	return released
}

// Outstanding is the number of guards acquired and not yet released.
func (t *Tracker) Outstanding() int {
	n := 0
	for i := range t.slots {
		if t.slots[i].Load() != nil {
			n++
		}
	}
	for i := range t.shards {
		sh := &t.shards[i]
		sh.mu.Lock()
		n += sh.n
		sh.mu.Unlock()
	}
	return n
}

// StaleReleased is the total number of guards ReleaseStale has released.
func (t *Tracker) StaleReleased() uint64 { return t.reaped.Load() }
