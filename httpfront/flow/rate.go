package flow

import (
	"hash/maphash"
	"math"
	"math/bits"
	"sync"
	"sync/atomic"
	"time"
)

// TokenBucket is one rate limit: rate requests per second on average, up to burst at once.
// It is the generic cell rate algorithm: the bucket is one atomic "theoretical arrival time"
// (the instant the bucket would be full again), advanced by one interval per request, and a
// request is refused while that instant lies more than burst intervals ahead. Safe for
// concurrent use; no lock.
type TokenBucket struct {
	interval int64 // nanoseconds per request
	span     int64 // burst × interval
	tat      atomic.Int64
}

// NewTokenBucket returns a bucket of rate requests per second (> 0) and burst (at least 1).
func NewTokenBucket(rate float64, burst int) *TokenBucket {
	tb := &TokenBucket{}
	tb.init(rate, burst)
	return tb
}

// maxSpan bounds how far ahead a bucket's arrival time may run, so that the arithmetic on
// wall-clock nanoseconds cannot overflow for absurd rates or bursts.
const maxSpan = math.MaxInt64 / 4

func (tb *TokenBucket) init(rate float64, burst int) {
	iv := float64(time.Second) / rate
	tb.interval = int64(min(max(iv, 1), 1e18)) // rate 0: one request per 1e9 seconds
	b := int64(max(burst, 1))
	if tb.interval > maxSpan/b {
		tb.span = maxSpan
	} else {
		tb.span = tb.interval * b
	}
}

// Allow takes one request's token at now. When the bucket is empty it refuses and says how
// long until a token is back.
func (tb *TokenBucket) Allow(now time.Time) (ok bool, retryAfter time.Duration) {
	t := now.UnixNano()
	for {
		tat := tb.tat.Load()
		next := max(tat, t) + tb.interval
		if ahead := next - t; ahead > tb.span {
			return false, time.Duration(ahead - tb.span)
		}
		if tb.tat.CompareAndSwap(tat, next) {
			return true, 0
		}
	}
}

// full reports whether the bucket has refilled by now: it holds no state a fresh bucket
// would not.
func (tb *TokenBucket) full(now time.Time) bool { return tb.tat.Load() <= now.UnixNano() }

// KeyLimiter is one TokenBucket per key (an API key), for at most maxKeys keys at once. Keys
// are hashed (a per-process random seed), so the table's memory does not depend on what
// clients send. Beyond maxKeys a key is forgotten to make room, CLOCK order (an
// approximation of least recently used), and its bucket starts full when it returns.
//
// A key in the table is found without a lock: each shard is an open-addressing table of
// atomic entry pointers (linear probing, at most half full) that readers probe while the
// shard's mutex serialises the writers (a key added, a key forgotten). A reader that misses
// while a writer moves entries takes the lock and looks again, so a miss is never wrong.
type KeyLimiter struct {
	rate   float64
	burst  int
	seed   maphash.Seed
	shards []keyShard
}

type keyShard struct {
	// table holds the shard's entries at their key's home slot (the hash's top bits) or the
	// first free slot after it. Stored under mu, loaded without it.
	table []atomic.Pointer[keyEntry]
	shift uint // 64 - log2(len(table))

	mu      sync.Mutex // adding and forgetting keys; the fields below
	entries []*keyEntry
	hand    int
	cap     int
	_       [24]byte
}

type keyEntry struct {
	key uint64
	tb  TokenBucket
	// used is set when the key is used again and cleared by the CLOCK hand passing by.
	used atomic.Bool
}

// maxKeyShards bounds the shards of a KeyLimiter; minShardKeys is the fewest keys a shard
// holds when the table has more than one.
const (
	maxKeyShards = 32
	minShardKeys = 64
)

// NewKeyLimiter returns per-key buckets of rate requests per second and burst, for at most
// maxKeys keys (at least 1).
func NewKeyLimiter(rate float64, burst, maxKeys int) *KeyLimiter {
	maxKeys = max(maxKeys, 1)
	// At least minShardKeys keys a shard, so that a small table is not split into slots
	// that collide long before it is full.
	n := min(maxKeyShards, max(1, maxKeys/minShardKeys))
	k := &KeyLimiter{rate: rate, burst: burst, seed: maphash.MakeSeed(), shards: make([]keyShard, n)}
	for i := range k.shards {
		// Shards split maxKeys among them: the table never holds more.
		c := maxKeys / n
		if i < maxKeys%n {
			c++
		}
		// At least twice the slots of the keys: a probe ends at a free slot within a few.
		lg := bits.Len(uint(2*c - 1))
		k.shards[i] = keyShard{table: make([]atomic.Pointer[keyEntry], 1<<lg), shift: uint(64 - lg), cap: c}
	}
	return k
}

// Allow takes a token of key's bucket at now. key may be empty (requests without a key
// share one bucket). It does not retain key.
func (k *KeyLimiter) Allow(key []byte, now time.Time) (ok bool, retryAfter time.Duration) {
	h := hashKey(k, key)
	sh := &k.shards[h%uint64(len(k.shards))]
	e := sh.find(h)
	if e == nil {
		// Slow path: a key not seen lately. It enters unmarked, so that a key used once is
		// the first to go.
		e = k.insert(sh, h, now)
	} else if !e.used.Load() {
		e.used.Store(true)
	}
	return e.tb.Allow(now)
}

// refund gives back the token key's bucket gave a request that another limit refused.
func (k *KeyLimiter) refund(key []byte) {
	h := hashKey(k, key)
	sh := &k.shards[h%uint64(len(k.shards))]
	e := sh.find(h)
	if e == nil {
		// Slow path: missed while a writer moved entries, or forgotten meanwhile.
		sh.mu.Lock()
		e = sh.find(h)
		sh.mu.Unlock()
	}
	if e != nil {
		e.tb.tat.Add(-e.tb.interval)
	}
}

// Len is the number of keys tracked.
func (k *KeyLimiter) Len() int {
	n := 0
	for i := range k.shards {
		sh := &k.shards[i]
		sh.mu.Lock()
		n += len(sh.entries)
		sh.mu.Unlock()
	}
	return n
}

// find returns key hash h's entry, or nil. Without the lock it can miss an entry a
// concurrent forget is moving (never return a wrong one); under the lock it is exact.
func (sh *keyShard) find(h uint64) *keyEntry {
	mask := uint64(len(sh.table) - 1)
	i := h >> sh.shift
	for range sh.table {
		e := sh.table[i].Load()
		if e == nil || e.key == h {
			return e
		}
		i = (i + 1) & mask
	}
	return nil
}

// place stores e in the first free slot from its home. Under mu; the table is never full.
func (sh *keyShard) place(e *keyEntry) {
	mask := uint64(len(sh.table) - 1)
	i := e.key >> sh.shift
	for sh.table[i].Load() != nil {
		i = (i + 1) & mask
	}
	sh.table[i].Store(e)
}

// forget takes key hash h out of the table, under mu: it empties h's slot and moves later
// entries of the probe run back into the hole (so that no free slot lies between an entry
// and its home), never leaving an entry out of the run.
func (sh *keyShard) forget(h uint64) {
	mask := uint64(len(sh.table) - 1)
	i := h >> sh.shift
	for {
		e := sh.table[i].Load()
		if e == nil {
			panic("BUG: flow: a key limiter entry is missing from its table")
		}
		if e.key == h {
			break
		}
		i = (i + 1) & mask
	}
	sh.table[i].Store(nil)
	for j := (i + 1) & mask; ; j = (j + 1) & mask {
		e := sh.table[j].Load()
		if e == nil {
			return
		}
		// e stays when its home lies cyclically in (i, j]: the hole is not on its path.
		if home := e.key >> sh.shift; (j-home)&mask < (j-i)&mask {
			continue
		}
		sh.table[i].Store(e) // present twice for a moment, never absent
		sh.table[j].Store(nil)
		i = j
	}
}

// insert adds key hash h to sh, evicting when sh is full, and returns its entry.
func (k *KeyLimiter) insert(sh *keyShard, h uint64, now time.Time) *keyEntry {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if e := sh.find(h); e != nil {
		return e // a concurrent request added it, or a lock-free probe missed it
	}
	e := &keyEntry{key: h}
	e.tb.init(k.rate, k.burst)
	if len(sh.entries) < sh.cap {
		sh.entries = append(sh.entries, e)
		sh.place(e)
		return e
	}
	// CLOCK: the hand clears recently used marks until it finds an entry not used since
	// its last pass, or one whose bucket has refilled (forgetting it loses nothing). Two
	// rounds always find one.
	for range 2 * len(sh.entries) {
		v := sh.entries[sh.hand]
		if !v.used.Load() || v.tb.full(now) {
			break
		}
		v.used.Store(false)
		sh.hand = (sh.hand + 1) % len(sh.entries)
	}
	sh.forget(sh.entries[sh.hand].key)
	sh.entries[sh.hand] = e
	sh.place(e)
	sh.hand = (sh.hand + 1) % len(sh.entries)
	return e
}

// hashKey is key's table hash.
func hashKey(k *KeyLimiter, key []byte) uint64 { return maphash.Bytes(k.seed, key) }
