package subscribe

import (
	"math/rand/v2"
	"unsafe"

	"switchyard/internal/mix"
)

// keyTable maps one owner's engine block hashes to what they were re-keyed to: the router's
// keys (index.BlockKeyRouter, V int64) or the SHA-256 chain's digests (index.BlockKeyEngine,
// V hashing.Digest, kept whole because a child block's digest chains from its parent's). It
// is an open-addressing table of slots holding a hash and its value: linear probing (from
// the first slot of a cache line when a line holds whole slots, so that a probe usually
// reads one line); deletion by backward shift, so that constant churn (every BlockRemoved
// deletes) leaves no tombstones and no rehash. A hash's home slot is computed from the hash
// mixed with a seed of the slot array's own, so an engine cannot choose hashes that pile up
// in one run. Unlike a Go map's, the line a hash lives in is known before it is read: touch
// loads it ahead, so that the cache misses of a batch's blocks overlap instead of following
// one another. Written here rather than kept as a Go map because the map measured wrong for
// this job: its lookups took 23% of the router-key ingest's CPU at 10M resident blocks, one
// miss after another (docs/benchmarks.md, KV ingest).
//
// Past 3/4 occupancy the table grows into slots of twice the size, incrementally: the old
// slots stay beside the new ones (get and del look in both) and each put moves a few of
// their runs over (keyGrowStep entries at least), so that no put pauses to move millions of
// entries at once. New entries go into the new slots only. The slots are allocated in
// chunks, each when a first entry lands in it, and an old chunk is dropped once its entries
// have moved, so that no put waits for the runtime to clear tens of megabytes either.
//
// Engine hash 0 marks an empty slot, so its value is kept aside. A keyTable belongs to one
// goroutine (its applier's).
type keyTable[V any] struct {
	cur keySlots[V]
	// old, while the table grows, are the slots being moved into cur; empty otherwise. The
	// old slots from the one after an empty slot (start, where growth started) up to next
	// have been moved; left counts those still to visit. next is an empty slot or the first
	// of a run, so that every entry still in old has its home in old's unvisited part.
	old               keySlots[V]
	start, next, left uint64
	// zero is the value of engine hash 0, when hasZero.
	zero    V
	hasZero bool
}

// keySlots is one array of a keyTable's slots, in chunks, with its seed.
type keySlots[V any] struct {
	// c are the chunks of keyChunkSlots slots (one of the array's size when it is smaller);
	// a nil chunk's slots are all empty.
	c     [][]keySlot[V]
	size  int
	mask  uint64
	shift uint8  // 64 - log2(size)
	line  uint64 // slots per cache line - 1 when a line holds whole slots, else 0
	seed  uint64
	n     int // entries
}

// keySlot is an engine hash (0: empty) and its value.
type keySlot[V any] struct {
	h int64
	v V
}

// keyTableMinSlots is a new table's size.
const keyTableMinSlots = 64

// keyGrowStep is the fewest old entries a put moves while the table grows (it finishes the
// run it is in). The old slots are empty before the new ones are 3/4 full as long as it is
// 2 or more; larger steps end growth sooner, smaller ones keep each put's pause short.
const keyGrowStep = 32

// keyChunkBits sets the slots of a chunk (keyChunkSlots: 512 KiB of 16-byte slots), which
// one put may have to allocate and clear.
const (
	keyChunkBits  = 15
	keyChunkSlots = 1 << keyChunkBits
	keyChunkMask  = keyChunkSlots - 1
)

// cacheLine is the size of a cache line, in bytes.
const cacheLine = 64

func newKeySlots[V any](size int) keySlots[V] {
	shift := uint8(64)
	for s := size; s > 1; s >>= 1 {
		shift--
	}
	var line uint64
	if sz := unsafe.Sizeof(keySlot[V]{}); cacheLine%sz == 0 {
		line = uint64(cacheLine/sz) - 1
	}
	return keySlots[V]{c: make([][]keySlot[V], (size+keyChunkSlots-1)/keyChunkSlots), size: size,
		mask: uint64(size - 1), shift: shift, line: line, seed: rand.Uint64()}
}

// home is h's first slot: the first of a cache line when a line holds whole slots.
func (a *keySlots[V]) home(h int64) uint64 {
	return mix.Mix64(uint64(h)^a.seed) >> a.shift &^ a.line
}

// at returns slot i, or nil when its chunk holds nothing yet.
func (a *keySlots[V]) at(i uint64) *keySlot[V] {
	c := a.c[i>>keyChunkBits]
	if c == nil {
		return nil
	}
	return &c[i&keyChunkMask]
}

// find returns h's slot (h not 0), or nil.
func (a *keySlots[V]) find(h int64) *keySlot[V] {
	if a.c == nil {
		return nil
	}
	for i := a.home(h); ; i = (i + 1) & a.mask {
		s := a.at(i)
		if s == nil || s.h == 0 {
			return nil
		}
		if s.h == h {
			return s
		}
	}
}

// insert puts h, which is not 0 and not present, into an empty slot of its run; the caller
// keeps the occupancy below 1.
func (a *keySlots[V]) insert(h int64, v V) {
	i := a.home(h)
	for {
		s := a.at(i)
		if s == nil {
			// Slow path: the chunk's first entry.
			a.c[i>>keyChunkBits] = make([]keySlot[V], min(a.size, keyChunkSlots))
			s = a.at(i)
		}
		if s.h == 0 {
			*s = keySlot[V]{h, v}
			a.n++
			return
		}
		i = (i + 1) & a.mask
	}
}

// del removes h (not 0), shifting back the entries of its probe run that may move, and
// reports whether it was present.
func (a *keySlots[V]) del(h int64) bool {
	if a.c == nil {
		return false
	}
	i := a.home(h)
	var hole *keySlot[V]
	for ; ; i = (i + 1) & a.mask {
		hole = a.at(i)
		if hole == nil || hole.h == 0 {
			return false
		}
		if hole.h == h {
			break
		}
	}
	a.n--
	for {
		j := i
		for {
			j = (j + 1) & a.mask
			s := a.at(j)
			if s == nil || s.h == 0 {
				*hole = keySlot[V]{}
				return true
			}
			// The entry at j may move to i unless its home lies cyclically in (i, j].
			k := a.home(s.h)
			if i <= j {
				if i < k && k <= j {
					continue
				}
			} else if i < k || k <= j {
				continue
			}
			*hole = *s
			i, hole = j, s
			break
		}
	}
}

// len returns the number of entries.
func (t *keyTable[V]) len() int {
	n := t.cur.n + t.old.n
	if t.hasZero {
		n++
	}
	return n
}

// get returns the value of engine hash h.
func (t *keyTable[V]) get(h int64) (V, bool) {
	if h == 0 {
		return t.zero, t.hasZero
	}
	if s := t.cur.find(h); s != nil {
		return s.v, true
	}
	if s := t.old.find(h); s != nil {
		return s.v, true
	}
	var zero V
	return zero, false
}

// touch loads h's home line (both of them while the table grows) ahead of a get, put or
// del, and returns a word of it for the caller to keep (a load nobody uses could be dropped).
func (t *keyTable[V]) touch(h int64) int64 {
	var w int64
	if t.cur.c != nil {
		if s := t.cur.at(t.cur.home(h)); s != nil {
			w = s.h
		}
	}
	if t.old.c != nil {
		if s := t.old.at(t.old.home(h)); s != nil {
			w += s.h
		}
	}
	return w
}

// put maps h to v, replacing its value if h is present.
func (t *keyTable[V]) put(h int64, v V) {
	if h == 0 {
		t.zero, t.hasZero = v, true
		return
	}
	if t.old.c != nil {
		// Slow path: the table grows.
		t.grow(keyGrowStep)
		if s := t.old.find(h); s != nil {
			s.v = v
			return
		}
	}
	if t.cur.c == nil {
		t.cur = newKeySlots[V](keyTableMinSlots)
	}
	if s := t.cur.find(h); s != nil {
		s.v = v
		return
	}
	if (t.cur.n+1)*4 > t.cur.size*3 {
		t.startGrowth()
	}
	t.cur.insert(h, v)
}

// startGrowth makes the current slots old and new slots of twice their size current, moving
// nothing yet. Growth starts after an empty slot, so that no run is cut.
func (t *keyTable[V]) startGrowth() {
	if t.old.c != nil {
		t.grow(t.old.n) // not reached while keyGrowStep >= 2
	}
	t.old, t.cur = t.cur, newKeySlots[V](2*t.cur.size)
	start := uint64(0)
	for s := t.old.at(start); s != nil && s.h != 0; s = t.old.at(start) {
		start++ // at most 3/4 of the slots are occupied
	}
	t.start, t.next, t.left = start, (start+1)&t.old.mask, t.old.mask
}

// grow moves at least step old entries into cur (all of them when fewer remain), stopping at
// the end of a run. It drops each old chunk it has wholly visited, and the old slots once
// they are empty.
func (t *keyTable[V]) grow(step int) {
	o := &t.old
	moved := 0
	for ; t.left > 0; t.left-- {
		s := o.at(t.next)
		if s == nil || s.h == 0 {
			if moved >= step {
				return
			}
		} else {
			t.cur.insert(s.h, s.v)
			*s = keySlot[V]{}
			o.n--
			moved++
		}
		t.next = (t.next + 1) & o.mask
		if done := (t.next - 1) & o.mask >> keyChunkBits; t.next&keyChunkMask == 0 && done != t.start>>keyChunkBits {
			o.c[done] = nil // visited from its first slot to its last
		}
	}
	if o.n != 0 {
		panic("BUG: keyTable growth left entries behind")
	}
	t.old = keySlots[V]{}
}

// del removes h.
func (t *keyTable[V]) del(h int64) {
	if h == 0 {
		var zero V
		t.zero, t.hasZero = zero, false
		return
	}
	if !t.cur.del(h) {
		t.old.del(h)
	}
}
