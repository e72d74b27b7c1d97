package index

// blockTable is an open-addressing hash table of entries keyed by block hash: linear
// probing over a power-of-two array, entries stored inline (one cache miss per lookup, not
// a map probe and then a slab access), deletion by backward shift (no tombstones, so a
// table with constant churn keeps short probe sequences). It grows by doubling past
// maxLoadNum/maxLoadDen occupancy and never shrinks.
//
// Deletion moves later entries of a probe run back: an index held across a remove or an
// insert (which may grow the table) is no longer valid.
type blockTable struct {
	slots []entry
	mask  uint64
	shift uint8 // 64 - log2(len(slots))
	n     int
}

// Occupancy beyond which the table doubles.
const (
	maxLoadNum     = 7
	maxLoadDen     = 10
	minTableSlots  = 1024
	hashMultiplier = 0x9E3779B97F4A7C15 // Fibonacci hashing spreads any key pattern
)

func newBlockTable(slots int) blockTable {
	size := minTableSlots
	for size < slots {
		size <<= 1
	}
	shift := uint8(64)
	for s := size; s > 1; s >>= 1 {
		shift--
	}
	return blockTable{slots: make([]entry, size), mask: uint64(size - 1), shift: shift}
}

// home is h's preferred slot.
func (t *blockTable) home(h int64) uint64 { return (uint64(h) * hashMultiplier) >> t.shift }

// find returns the slot holding h.
func (t *blockTable) find(h int64) (uint32, bool) {
	for i := t.home(h); ; i = (i + 1) & t.mask {
		e := &t.slots[i]
		if e.flags&entryLive == 0 {
			return 0, false
		}
		if e.hash == h {
			return uint32(i), true
		}
	}
}

// insert claims a slot for h, which must be absent, growing the table first if needed. The
// slot is live with only its hash set.
func (t *blockTable) insert(h int64) uint32 {
	if (t.n+1)*maxLoadDen > len(t.slots)*maxLoadNum {
		t.grow()
	}
	i := t.home(h)
	for t.slots[i].flags&entryLive != 0 {
		i = (i + 1) & t.mask
	}
	t.slots[i] = entry{hash: h, flags: entryLive}
	t.n++
	return uint32(i)
}

// remove empties slot i and shifts back the entries of its probe run that may move.
func (t *blockTable) remove(slot uint32) {
	i := uint64(slot)
	t.n--
	for {
		t.slots[i] = entry{}
		j := i
		for {
			j = (j + 1) & t.mask
			e := &t.slots[j]
			if e.flags&entryLive == 0 {
				return
			}
			k := t.home(e.hash)
			// The entry at j may move to i unless its home lies cyclically in (i, j].
			if i <= j {
				if i < k && k <= j {
					continue
				}
			} else if i < k || k <= j {
				continue
			}
			t.slots[i] = *e
			i = j
			break
		}
	}
}

func (t *blockTable) grow() {
	old := t.slots
	*t = newBlockTable(2 * len(old))
	for i := range old {
		e := &old[i]
		if e.flags&entryLive == 0 {
			continue
		}
		j := t.home(e.hash)
		for t.slots[j].flags&entryLive != 0 {
			j = (j + 1) & t.mask
		}
		t.slots[j] = *e
		t.n++
	}
}
