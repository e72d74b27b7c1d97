package index

import "sync/atomic"

// blockTable is an open-addressing hash table of entries keyed by block hash: linear
// probing over a power-of-two array, entries stored inline (one cache miss per lookup, not
// a map probe and then a slab access), deletion by backward shift (no tombstones, so a
// table with constant churn keeps short probe sequences). A block's home is the first slot of
// a cache line (homeSlot), so that a probe, and the shift after a removal, usually stay in
// the one line the lookup's read-ahead loaded. It grows by doubling past
// maxLoadNum/maxLoadDen occupancy and never shrinks.
//
// One goroutine writes the table (the shard's owner); readers may probe it at the same time
// (Index.matchDirect). Every word of a slot is therefore stored with sync/atomic, an empty
// slot is one whose meta word is not live (its hash word keeps whatever it held), and an
// entry that moves (backward shift) does so under its stripe's sequence, so that a reader
// validating its block's stripe never takes a torn or half-moved entry for a state of the
// table. Growth builds a new array; the shard publishes it, and readers still holding the old
// one read a state the table had.
//
// Deletion moves later entries of a probe run back: an index held across a remove or an
// insert (which may grow the table) is no longer valid.
type blockTable struct {
	slots []entry
	mask  uint64
	shift uint8 // 64 - log2(len(slots))
	n     int
	seqs  *stripes // the shard's sequences: entries moved by a remove are written under theirs
}

// Occupancy beyond which the table doubles.
const (
	maxLoadNum     = 7
	maxLoadDen     = 10
	minTableSlots  = 1024
	hashMultiplier = 0x9E3779B97F4A7C15 // Fibonacci hashing spreads any key pattern
)

func newBlockTable(slots int, seqs *stripes) blockTable {
	size := minTableSlots
	for size < slots {
		size <<= 1
	}
	shift := uint8(64)
	for s := size; s > 1; s >>= 1 {
		shift--
	}
	return blockTable{slots: make([]entry, size), mask: uint64(size - 1), shift: shift, seqs: seqs}
}

// home is h's preferred slot.
func (t *blockTable) home(h int64) uint64 { return homeSlot(h, t.shift) }

// homeSlot is the preferred slot of h in a table of 64-shift bits of slots: the first slot of
// a cache line (slotsPerLine entries), so that a probe usually reads one line.
func homeSlot(h int64, shift uint8) uint64 {
	return (uint64(h) * hashMultiplier) >> shift &^ (slotsPerLine - 1)
}

// slotsPerLine is how many entries share a 64-byte cache line.
const slotsPerLine = 4

// find returns the slot holding h.
func (t *blockTable) find(h int64) (uint32, bool) {
	for i := t.home(h); ; i = (i + 1) & t.mask {
		e := &t.slots[i]
		if !e.load().live() {
			return 0, false
		}
		if e.key() == h {
			return uint32(i), true
		}
	}
}

// insert claims a slot for h, which must be absent, growing the table first if needed, and
// stores m (live) in it. It reports whether the table grew (the caller publishes it).
func (t *blockTable) insert(h int64, m meta) (uint32, bool) {
	grew := false
	if (t.n+1)*maxLoadDen > len(t.slots)*maxLoadNum {
		t.grow()
		grew = true
	}
	i := t.home(h)
	for t.slots[i].load().live() {
		i = (i + 1) & t.mask
	}
	// The hash first: a reader that sees the live meta sees this hash (or a later one).
	t.slots[i].setKey(h)
	t.slots[i].put(m)
	t.n++
	return uint32(i), grew
}

// remove empties slot i and shifts back the entries of its probe run that may move. Each
// moving entry is copied back (hash, then meta) under its stripe's sequence before the slot
// it leaves is reused or emptied, so it stays reachable throughout; the last slot left is
// emptied by clearing its meta word.
func (t *blockTable) remove(slot uint32) {
	i := uint64(slot)
	t.n--
	for {
		j := i
		for {
			j = (j + 1) & t.mask
			e := &t.slots[j]
			if !e.load().live() {
				t.slots[i].put(0)
				return
			}
			h := e.key()
			k := t.home(h)
			// The entry at j may move to i unless its home lies cyclically in (i, j].
			if i <= j {
				if i < k && k <= j {
					continue
				}
			} else if i < k || k <= j {
				continue
			}
			q := t.seqs.lock(h)
			t.slots[i].setKey(h)
			t.slots[i].put(e.load())
			q.unlock()
			i = j
			break
		}
	}
}

// grow doubles the table into a new array; the old one is left as it was (readers may hold
// it).
func (t *blockTable) grow() {
	old := t.slots
	*t = newBlockTable(2*len(old), t.seqs)
	for i := range old {
		e := &old[i]
		m := e.load()
		if !m.live() {
			continue
		}
		h := e.key()
		j := t.home(h)
		for meta(t.slots[j].meta).live() {
			j = (j + 1) & t.mask
		}
		t.slots[j] = entry{hash: h, meta: uint64(m)} // not yet published
		t.n++
	}
}

// stripes are a shard's write sequences, one per stripe of block hashes: the writer makes
// a stripe's sequence odd before it changes an entry of the stripe in a way a reader could
// see half done (an insert, a move, a delete, any change of an owner run) and even again
// after it. A reader of a block loads its stripe's sequence before and after the read and
// keeps the read only if both are the same even value.
type stripes [stripeCount]atomic.Uint64

// stripeCount is the number of stripes per shard (32 KiB of sequences): enough that a
// reader seldom shares one with the block being written.
const stripeCount = 4096

// of is h's stripe.
func (s *stripes) of(h int64) *atomic.Uint64 { return &s[uint64(h)&(stripeCount-1)] }

// stripeLock is a held stripe, or nil when the stripe was already held (a nested write).
type stripeLock struct{ q *atomic.Uint64 }

// lock makes h's stripe odd unless the writer holds it already (then unlocking the result
// does nothing: the outer write unlocks). Only the shard's writer calls it.
func (s *stripes) lock(h int64) stripeLock {
	q := s.of(h)
	v := q.Load()
	if v&1 != 0 {
		return stripeLock{}
	}
	q.Store(v + 1)
	return stripeLock{q}
}

func (l stripeLock) unlock() {
	if l.q != nil {
		l.q.Store(l.q.Load() + 1)
	}
}

// release makes every stripe even (after a failed writer left some held).
func (s *stripes) release() {
	for i := range s {
		if v := s[i].Load(); v&1 != 0 {
			s[i].Store(v + 1)
		}
	}
}
