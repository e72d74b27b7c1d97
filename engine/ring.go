package engine

import (
	"math"
	"slices"

	"switchyard/internal/mix"
)

// hashRing is the consistent-hash ring of consistent_hash and prefix_hash: each candidate
// owns a number of points placed by a hash of its worker ID alone, so every router replica
// and every restart builds the same ring from the same engines, and adding or removing an
// engine moves only the keys whose nearest point it gains or loses (about 1/n of them).
//
// A key is served by the first engine clockwise from the key's hash whose router-local
// in-flight requests are below the bounded-load capacity ceil(loadFactor × (total + 1) / n)
// ("consistent hashing with bounded loads"): no engine carries more than loadFactor times
// the group's average, and a key moves off its home engine only while that engine is at the
// bound. In-flight counts are local to a replica, so replicas agree on every key whose home
// engine is under the bound.
//
// A ring is owned by its policy (one goroutine at a time); it is rebuilt only when the
// candidate set changes.
type hashRing struct {
	vnodes     int
	loadFactor float64

	members []*Worker   // candidates the ring was built from, in the group's order
	points  []ringPoint // sorted by hash, then member index
	seen    []bool      // walk scratch, one per member
}

type ringPoint struct {
	hash uint64
	idx  int32 // index into members
}

// Ring reasons: the key's home engine, or a later engine on the ring because the home
// engine (and any before it) was at the load bound.
const (
	ReasonHashHome    = "hash_home"
	ReasonHashBounded = "hash_bounded"
)

func newHashRing(vnodes int, loadFactor float64) *hashRing {
	return &hashRing{vnodes: max(vnodes, 1), loadFactor: max(loadFactor, 1)}
}

// pick returns the candidate serving key and whether it is the key's home engine. c must
// not be empty.
func (r *hashRing) pick(c []*Worker, key uint64) (*Worker, bool) {
	if !slices.Equal(r.members, c) {
		// Slow path: the candidates changed (a worker joined, left, or a retry excluded one).
		r.build(c)
	}
	start, _ := slices.BinarySearchFunc(r.points, key, func(p ringPoint, k uint64) int {
		switch {
		case p.hash < k:
			return -1
		case p.hash > k:
			return 1
		}
		return 0
	})
	if home := r.members[r.points[start%len(r.points)].idx]; home.Counters.InFlight() == 0 {
		// Fast path: an idle home engine is under any bound (the capacity is at least 1).
		return home, true
	}
	n := len(r.members)
	var total int64
	for _, w := range r.members {
		total += w.Counters.InFlight()
	}
	capacity := int64(math.Ceil(r.loadFactor * float64(total+1) / float64(n)))
	clear(r.seen)
	var home *Worker
	for i, visited := 0, 0; i < len(r.points) && visited < n; i++ {
		p := r.points[(start+i)%len(r.points)]
		if r.seen[p.idx] {
			continue
		}
		r.seen[p.idx] = true
		visited++
		w := r.members[p.idx]
		if home == nil {
			home = w
		}
		if w.Counters.InFlight() < capacity {
			return w, w == home
		}
	}
	// Unreachable while capacity × n exceeds the total; keep the home engine regardless.
	return home, true
}

// build places every candidate's points.
func (r *hashRing) build(c []*Worker) {
	r.members = append(r.members[:0], c...)
	r.points = r.points[:0]
	for i, w := range c {
		base := fnv64(fnvOffset, w.ID)
		for v := range r.vnodes {
			r.points = append(r.points, ringPoint{hash: mix.Mix64(base ^ uint64(v)*0x9e3779b97f4a7c15), idx: int32(i)})
		}
	}
	slices.SortFunc(r.points, func(a, b ringPoint) int {
		switch {
		case a.hash < b.hash:
			return -1
		case a.hash > b.hash:
			return 1
		}
		return int(a.idx - b.idx)
	})
	r.seen = slices.Grow(r.seen[:0], len(c))[:len(c)]
}

// FNV-1a, 64 bits: a hash every replica computes alike (no per-process seed).
const (
	fnvOffset uint64 = 14695981039346656037
	fnvPrime  uint64 = 1099511628211
)

// FNVOffset starts an FNV-1a hash for FNV64.
const FNVOffset = fnvOffset

// FNV64 continues the 64-bit FNV-1a hash h over s (start from FNVOffset): the hash every
// replica computes alike, for the hashing policies and the cluster's key partitions.
func FNV64(h uint64, s string) uint64 { return fnv64(h, s) }

func fnv64(h uint64, s string) uint64 {
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= fnvPrime
	}
	return h
}

// fnv64Tokens hashes token IDs as 4 little-endian bytes each.
func fnv64Tokens(h uint64, ids []uint32) uint64 {
	for _, t := range ids {
		for range 4 {
			h ^= uint64(t & 0xff)
			h *= fnvPrime
			t >>= 8
		}
	}
	return h
}

// leastInFlight returns the candidate with the fewest router-local in-flight requests, the
// lowest ID on a tie (c is sorted by ID): the hashing policies' choice for a request without
// a key.
func leastInFlight(c []*Worker) *Worker {
	best := c[0]
	bl := best.Counters.InFlight()
	for _, w := range c[1:] {
		if l := w.Counters.InFlight(); l < bl {
			best, bl = w, l
		}
	}
	return best
}
