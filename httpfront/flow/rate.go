package flow

import (
	"hash/maphash"
	"math"
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
type KeyLimiter struct {
	rate   float64
	burst  int
	seed   maphash.Seed
	shards []keyShard
}

type keyShard struct {
	mu      sync.RWMutex
	index   map[uint64]int
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
		k.shards[i] = keyShard{index: make(map[uint64]int, c), cap: c}
	}
	return k
}

// Allow takes a token of key's bucket at now. key may be empty (requests without a key
// share one bucket). It does not retain key.
func (k *KeyLimiter) Allow(key []byte, now time.Time) (ok bool, retryAfter time.Duration) {
	h := hashKey(k, key)
	sh := &k.shards[h%uint64(len(k.shards))]
	sh.mu.RLock()
	i, found := sh.index[h]
	var e *keyEntry
	if found {
		e = sh.entries[i]
	}
	sh.mu.RUnlock()
	if e == nil {
		// Slow path: a key not seen lately. It enters unmarked, so that a key used once is
		// the first to go.
		e = k.insert(sh, h, now)
	} else if !e.used.Load() {
		e.used.Store(true)
	}
	return e.tb.Allow(now)
}

// Len is the number of keys tracked.
func (k *KeyLimiter) Len() int {
	n := 0
	for i := range k.shards {
		sh := &k.shards[i]
		sh.mu.RLock()
		n += len(sh.entries)
		sh.mu.RUnlock()
	}
	return n
}

// insert adds key hash h to sh, evicting when sh is full, and returns its entry.
func (k *KeyLimiter) insert(sh *keyShard, h uint64, now time.Time) *keyEntry {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if i, ok := sh.index[h]; ok {
		return sh.entries[i] // a concurrent request added it
	}
	e := &keyEntry{key: h}
	e.tb.init(k.rate, k.burst)
	if len(sh.entries) < sh.cap {
		sh.index[h] = len(sh.entries)
		sh.entries = append(sh.entries, e)
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
	old := sh.entries[sh.hand]
	delete(sh.index, old.key)
	sh.entries[sh.hand] = e
	sh.index[h] = sh.hand
	sh.hand = (sh.hand + 1) % len(sh.entries)
	return e
}

// hashKey is key's table hash.
func hashKey(k *KeyLimiter, key []byte) uint64 { return maphash.Bytes(k.seed, key) }
