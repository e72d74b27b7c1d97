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
//
// A Guard's storage can be the caller's and reused (AcquirePrefillInto): the generation in
// its state word tells the acquisitions of one storage apart, so that a reference kept past
// a release (the due table of expected first tokens, the scan of ReleaseStale) acts on the
// acquisition it was taken for or on none. What such a reference reads is atomic. The scan
// releases an acquisition only where it found it registered (its generation and its slot or
// list in one word, reg), and takes a listed guard out of its list before it claims it: the
// storage's next acquisition never meets its former registration's links.
type Guard struct {
	// state holds guardReleased once the guard was released, guardPrefill while it holds
	// its pending-prefill slot of prefill tokens, then the index of its shard (a guard in a
	// list), its slot in the Tracker's table plus one (0: in a list), and above guardGenShift
	// the storage's generation, one more at every acquisition.
	state   atomic.Uint64
	prefill atomic.Int32
	c       atomic.Pointer[Counters]
	t       *Tracker     // written by the acquiring owner; read by it only
	at      atomic.Int64 // unix nanoseconds of Acquire
	// prev and next link live guards within a shard's list; guarded by its mu.
	prev, next *Guard
}

// Guard state bits.
const (
	guardReleased uint64 = 1 << iota
	guardPrefill
	guardShardShift = iota
	guardSlotShift  = guardShardShift + 5 // guardShards = 1<<5
	guardGenShift   = 32                  // above the slot index (guardSlots = 1<<13)
)

// gen is the generation of a guard's state word s.
func gen(s uint64) uint64 { return s >> guardGenShift }

// reg is the registration of a guard's state word s: its generation, and its slot or
// shard. It is set when the guard is acquired and kept after its release.
func reg(s uint64) uint64 { return s &^ (guardReleased | guardPrefill) }

// slot is the index plus one of the slot a guard of state s is in (0: in a list).
func slot(s uint64) uint64 { return s >> guardSlotShift & (1<<(guardGenShift-guardSlotShift) - 1) }

// shard is the index of the list a guard of state s is in when slot(s) is 0.
func shard(s uint64) uint64 { return s >> guardShardShift & (guardShards - 1) }

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
	return t.AcquirePrefillInto(new(Guard), c, now, uncached)
}

// AcquirePrefillInto is AcquirePrefill in storage the caller owns: g is a zero Guard or one
// of this Tracker's released before, and is returned. Fast path: no allocation. Once the
// guard is released the caller may acquire in g again, and must not call g's methods for
// the former acquisition; the Tracker tells the two apart. Acquiring in a guard that is not
// released panics.
func (t *Tracker) AcquirePrefillInto(g *Guard, c *Counters, now time.Time, uncached int64) *Guard {
	if c == nil {
		panic("BUG: load: Acquire with nil Counters")
	}
	old := g.state.Load()
	if gen(old) != 0 && old&guardReleased == 0 {
		panic("BUG: load: Acquire in a Guard that is not released")
	}
	ns := now.UnixNano()
	c.dispatched.Add(1)
	c.lastDispatch.Store(ns)
	st := (gen(old) + 1) << guardGenShift
	var prefill int32
	if uncached >= 0 {
		prefill = int32(min(uncached, math.MaxInt32))
		st |= guardPrefill
		c.addPrefill(ns, prefill)
	}
	g.prefill.Store(prefill)
	return t.hold(g, c, ns, st)
}

// AcquireWaiting takes an in-flight slot on c for a request assigned to the worker at now
// that waits before it is dispatched there (for a LoRA adapter the worker loads first): from
// now on it counts in the worker's in-flight requests, which admission caps and policies
// read, but neither as a dispatch nor in the pending prefill until the guard's Dispatch. The
// caller must Release the guard on every path, dispatched or not. Slow path: one allocation.
func (t *Tracker) AcquireWaiting(c *Counters, now time.Time) *Guard {
	if c == nil {
		panic("BUG: load: Acquire with nil Counters")
	}
	return t.hold(new(Guard), c, now.UnixNano(), 1<<guardGenShift)
}

// Dispatch counts the request of a guard from AcquireWaiting as dispatched at now, and from
// then on as AcquirePrefill with uncached tokens would have (negative: as Acquire would):
// the guard keeps its one in-flight slot, so the request counts in flight once from its
// AcquireWaiting to its Release. It returns g. Call it once, from the acquiring owner,
// before the guard's other methods; on a guard released meanwhile (ReleaseStale) it counts
// the dispatch and holds no pending-prefill slot.
func (g *Guard) Dispatch(now time.Time, uncached int64) *Guard {
	s := g.state.Load()
	c := g.c.Load()
	ns := now.UnixNano()
	c.dispatched.Add(1)
	c.lastDispatch.Store(ns)
	if uncached < 0 {
		return g
	}
	prefill := int32(min(uncached, math.MaxInt32))
	g.prefill.Store(prefill) // before the state says the guard holds it
	c.addPrefill(ns, prefill)
	gn := gen(s)
	for {
		if s&guardReleased != 0 || gen(s) != gn {
			givePrefill(c, prefill) // released meanwhile: nobody else gives it back
			return g
		}
		if g.state.CompareAndSwap(s, s|guardPrefill) {
			return g
		}
		s = g.state.Load()
	}
}

// addPrefill counts a request of prefill uncached tokens dispatched at ns in c's pending
// prefill.
func (c *Counters) addPrefill(ns int64, prefill int32) {
	if d := c.dueNext.Load(); d != 0 && d <= ns {
		c.settle(ns)
	}
	if c.pendingReqs.Load() <= 0 {
		// Nothing pending: the worker begins this prompt now (if a running slot is free:
		// Counters.PendingPrefillLeft).
		storeLater(&c.prefillFrom, ns)
	}
	c.pendingReqs.Add(1)
	c.pendingTokens.Add(int64(prefill))
}

// hold takes g's in-flight slot on c, acquired at ns, and publishes the complete guard, of
// state st without its registration, in a free slot of the table, else in a locked list; it
// returns g.
func (t *Tracker) hold(g *Guard, c *Counters, ns int64, st uint64) *Guard {
	c.inflight.Add(1)
	g.t = t
	g.c.Store(c)
	g.at.Store(ns)
	r := rand.Uint32()
	for i := range uint32(guardProbes) {
		k := (r + i) & (guardSlots - 1)
		if t.slots[k].Load() != nil {
			continue
		}
		// The guard is complete before it is published.
		g.state.Store(st | uint64(k+1)<<guardSlotShift)
		if t.slots[k].CompareAndSwap(nil, g) {
			return g
		}
	}
	// Slow path: no free slot nearby; a locked list.
	k := r >> 19 & (guardShards - 1)
	g.state.Store(st | uint64(k)<<guardShardShift)
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
	if g == nil {
		return
	}
	c, ok := g.claim(reg(g.state.Load()))
	if !ok {
		return
	}
	c.inflight.Add(-1)
	g.unregister()
}

// unregister takes a released guard out of its slot or list; the releasing call only. A
// sweep may have taken a listed guard out already (ReleaseStale).
func (g *Guard) unregister() {
	st := g.state.Load()
	if k := slot(st); k > 0 {
		g.t.slots[k-1].CompareAndSwap(g, nil)
		return
	}
	sh := &g.t.shards[shard(st)]
	sh.mu.Lock()
	if g.prev != nil || sh.head == g {
		sh.unlink(g)
	}
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
	g.firstToken(gen(g.state.Load()), now)
}

// firstToken is FirstToken for the acquisition of generation gn: nothing when the guard's
// storage has moved on to another.
func (g *Guard) firstToken(gn uint64, now time.Time) {
	for {
		s := g.state.Load()
		if s&guardPrefill == 0 || gen(s) != gn {
			return
		}
		c, prefill := g.c.Load(), g.prefill.Load() // this generation's, if the swap succeeds
		if g.state.CompareAndSwap(s, s&^guardPrefill) {
			storeLater(&c.prefillFrom, now.UnixNano())
			givePrefill(c, prefill)
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
	if g == nil {
		return false
	}
	s := g.state.Load()
	if s&guardPrefill == 0 {
		return false
	}
	ns := at.UnixNano()
	if ns <= 0 {
		return false
	}
	c := g.c.Load()
	if ok, ended := c.registerDue(g, gen(s), ns); ok || !ended {
		// Registered, or full of requests still waiting for their first token: settling
		// would free nothing (under load, with dueSlots such requests, each later one ends
		// here after one scan).
		return ok
	}
	// Full: free the entries of requests that ended, then look once more.
	c.settle(math.MinInt64)
	ok, _ := c.registerDue(g, gen(s), ns)
	return ok
}

// registerDue puts g's acquisition of generation gn, expected at ns, in a free entry of
// c.due; when none is free, ended reports whether an entry holds a request that no longer
// waits for its first token (one settle frees).
func (c *Counters) registerDue(g *Guard, gn uint64, ns int64) (ok, ended bool) {
	for i := range c.due {
		e := &c.due[i]
		h := e.g.Load()
		if h == nil {
			if e.g.CompareAndSwap(nil, g) {
				e.gen.Store(gn)
				e.at.Store(ns)
				storeEarlier(&c.dueNext, ns)
				return true, false
			}
			continue
		}
		if e.at.Load() != 0 && !e.waiting(h) {
			ended = true
		}
	}
	return false, ended
}

// claim marks the acquisition registered as r (reg) released and gives its pending-prefill
// slot back if it still held one; it returns the acquisition's Counters and whether this
// call released it (false when it already was, or the storage moved on).
func (g *Guard) claim(r uint64) (*Counters, bool) {
	for {
		s := g.state.Load()
		if s&guardReleased != 0 || reg(s) != r {
			return nil, false
		}
		c, prefill := g.c.Load(), g.prefill.Load() // this generation's, if the swap succeeds
		if g.state.CompareAndSwap(s, s&^guardPrefill|guardReleased) {
			if s&guardPrefill != 0 {
				givePrefill(c, prefill)
			}
			return c, true
		}
	}
}

func givePrefill(c *Counters, prefill int32) {
	c.pendingReqs.Add(-1)
	c.pendingTokens.Add(-int64(prefill))
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
	return t.releaseStale(now, maxAge, nil)
}

// releaseStale is ReleaseStale; seen, when not nil, is called with each guard the scan
// finds, before it reads the guard's state (claimed false), and with each guard it
// released, before it takes it out of its slot (claimed true; a listed guard is out
// already). It is called with the shard's lock held for a listed guard.
func (t *Tracker) releaseStale(now time.Time, maxAge time.Duration, seen func(g *Guard, claimed bool)) int {
	cutoff := now.Add(-maxAge).UnixNano()
	released := 0
	for i := range t.slots {
		g := t.slots[i].Load()
		if g == nil {
			continue
		}
		if seen != nil {
			seen(g, false)
		}
		// The state first: the time read after it is its acquisition's or a later one's,
		// and a later one fails the claim. An acquisition registered elsewhere is a later
		// one of the storage (released meanwhile): that slot is its own.
		s := g.state.Load()
		if slot(s) != uint64(i)+1 || g.at.Load() >= cutoff {
			continue
		}
		c, ok := g.claim(reg(s))
		if !ok {
			continue
		}
		c.inflight.Add(-1)
		if seen != nil {
			seen(g, true)
		}
		// The storage's next acquisition (its owner's Release found it released) probes
		// past this slot while g is in it: only g's former registration is cleared.
		t.slots[i].CompareAndSwap(g, nil)
		released++
	}
	for i := range t.shards {
		sh := &t.shards[i]
		sh.mu.Lock()
		for g := sh.head; g != nil; {
			next := g.next
			if seen != nil {
				seen(g, false)
			}
			// A listed guard is its storage's latest acquisition: the next one comes only
			// once it is out of its list (its owner's Release takes it out, and this scan
			// does before it claims), under this lock.
			s := g.state.Load()
			if s&guardReleased == 0 && g.at.Load() < cutoff {
				// Out of the list before the claim: once claimed, the owner may acquire
				// the storage again and link it elsewhere. Should the owner claim first,
				// its Release finds the guard out.
				sh.unlink(g)
				if c, ok := g.claim(reg(s)); ok {
					c.inflight.Add(-1)
					if seen != nil {
						seen(g, true)
					}
					released++
				}
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
