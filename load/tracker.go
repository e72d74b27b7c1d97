package load

import (
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"
)

// guardShards is the number of independently locked sets of live guards. A power of two.
const guardShards = 32

// Tracker is the router-local request accounting of every worker: one Counters per worker
// ID, and the Guards that hold in-flight slots. It is safe for concurrent use.
type Tracker struct {
	counters sync.Map // string -> *Counters
	shards   [guardShards]guardShard
	// reaped counts guards released by ReleaseStale.
	reaped atomic.Uint64
}

// guardShard is one locked, intrusive list of live guards.
type guardShard struct {
	mu   sync.Mutex
	head *Guard
	n    int
	_    [40]byte // keep neighbouring shards off one cache line
}

// Guard holds one in-flight slot on a worker's Counters, from Acquire until Release.
type Guard struct {
	released atomic.Bool
	c        *Counters
	shard    *guardShard
	at       int64 // unix nanoseconds of Acquire
	// prev and next link live guards within shard; guarded by shard.mu.
	prev, next *Guard
}

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
// small allocation and an uncontended shard lock.
func (t *Tracker) Acquire(c *Counters, now time.Time) *Guard {
	if c == nil {
		panic("BUG: load: Acquire with nil Counters")
	}
	ns := now.UnixNano()
	c.inflight.Add(1)
	c.dispatched.Add(1)
	c.lastDispatch.Store(ns)
	sh := &t.shards[rand.Uint32()&(guardShards-1)]
	g := &Guard{c: c, shard: sh, at: ns}
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
	if g == nil || !g.released.CompareAndSwap(false, true) {
		return
	}
	g.c.inflight.Add(-1)
	sh := g.shard
	sh.mu.Lock()
	sh.unlink(g)
	sh.mu.Unlock()
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
// periodically (for example every minute, with the configured load.guard_max_age). It holds one shard lock
// at a time.
func (t *Tracker) ReleaseStale(now time.Time, maxAge time.Duration) int {
	cutoff := now.Add(-maxAge).UnixNano()
	released := 0
	for i := range t.shards {
		sh := &t.shards[i]
		sh.mu.Lock()
		for g := sh.head; g != nil; {
			next := g.next
			if g.at < cutoff && g.released.CompareAndSwap(false, true) {
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
