package subscribe

import (
	"math/rand/v2"

	"switchyard/internal/mix"
)

// keyTable maps one owner's engine block hashes to the router's keys
// (index.BlockKeyRouter). It is an open-addressing table of 16-byte slots: linear probing
// from the first slot of a cache line, so that a probe usually reads one line; deletion by
// backward shift, so that constant churn (every BlockRemoved deletes) leaves no tombstones
// and no rehash; doubling past 3/4 occupancy. A hash's home slot is computed from the hash
// mixed with a seed of the table's own, so an engine cannot choose hashes that pile up in one
// run. Unlike a Go map's, the line a hash lives in is known before it is read: touch loads it
// ahead, so that the cache misses of a batch's blocks overlap instead of following one
// another. Written here rather than kept as a Go map because the map measured wrong for
// this job: its lookups took 23% of the router-key ingest's CPU at 10M resident blocks, one
// miss after another, and with this table that ingest costs 0.73× the CPU per event
// (docs/benchmarks.md, KV ingest).
//
// Engine hash 0 marks an empty slot, so its key is kept aside. A keyTable belongs to one
// goroutine (its applier's).
type keyTable struct {
	slots []keySlot
	mask  uint64
	shift uint8 // 64 - log2(len(slots))
	seed  uint64
	n     int // entries, the one of hash 0 included
	// zero is the key of engine hash 0, when hasZero.
	zero    int64
	hasZero bool
}

// keySlot is an engine hash (0: empty) and its router key.
type keySlot struct{ h, key int64 }

// keyTableMinSlots is a new table's size.
const keyTableMinSlots = 64

// keySlotsPerLine is how many slots share a 64-byte cache line.
const keySlotsPerLine = 4

// home is h's first slot: the first of a cache line.
func (t *keyTable) home(h int64) uint64 {
	return mix.Mix64(uint64(h)^t.seed) >> t.shift &^ (keySlotsPerLine - 1)
}

// len returns the number of entries.
func (t *keyTable) len() int { return t.n }

// get returns the key of engine hash h.
func (t *keyTable) get(h int64) (int64, bool) {
	if h == 0 {
		return t.zero, t.hasZero
	}
	if t.slots == nil {
		return 0, false
	}
	for i := t.home(h); ; i = (i + 1) & t.mask {
		s := &t.slots[i]
		if s.h == h {
			return s.key, true
		}
		if s.h == 0 {
			return 0, false
		}
	}
}

// touch loads h's home line ahead of a get, put or del, and returns a word of it for the
// caller to keep (a load nobody uses could be dropped).
func (t *keyTable) touch(h int64) int64 {
	if t.slots == nil {
		return 0
	}
	return t.slots[t.home(h)].h
}

// put maps h to key, replacing its key if h is present.
func (t *keyTable) put(h, key int64) {
	if h == 0 {
		if !t.hasZero {
			t.n++
		}
		t.zero, t.hasZero = key, true
		return
	}
	if t.slots == nil {
		t.resize(keyTableMinSlots)
	}
	for i := t.home(h); ; i = (i + 1) & t.mask {
		s := &t.slots[i]
		if s.h == h {
			s.key = key
			return
		}
		if s.h == 0 {
			if (t.n+1)*4 > len(t.slots)*3 {
				t.resize(2 * len(t.slots))
				t.put(h, key) // probes the new slots
				return
			}
			*s = keySlot{h, key}
			t.n++
			return
		}
	}
}

// del removes h, shifting back the entries of its probe run that may move.
func (t *keyTable) del(h int64) {
	if h == 0 {
		if t.hasZero {
			t.hasZero, t.zero = false, 0
			t.n--
		}
		return
	}
	if t.slots == nil {
		return
	}
	i := t.home(h)
	for ; t.slots[i].h != h; i = (i + 1) & t.mask {
		if t.slots[i].h == 0 {
			return
		}
	}
	t.n--
	for {
		j := i
		for {
			j = (j + 1) & t.mask
			s := t.slots[j]
			if s.h == 0 {
				t.slots[i] = keySlot{}
				return
			}
			// The entry at j may move to i unless its home lies cyclically in (i, j].
			k := t.home(s.h)
			if i <= j {
				if i < k && k <= j {
					continue
				}
			} else if i < k || k <= j {
				continue
			}
			t.slots[i] = s
			i = j
			break
		}
	}
}

// resize moves the entries into a table of size slots (a power of two larger than them), under
// a new seed.
func (t *keyTable) resize(size int) {
	old := t.slots
	shift := uint8(64)
	for s := size; s > 1; s >>= 1 {
		shift--
	}
	t.slots, t.mask, t.shift, t.seed = make([]keySlot, size), uint64(size-1), shift, rand.Uint64()
	for _, s := range old {
		if s.h == 0 {
			continue
		}
		i := t.home(s.h)
		for t.slots[i].h != 0 {
			i = (i + 1) & t.mask
		}
		t.slots[i] = s
	}
}
