package subscribe

import (
	"encoding/binary"
	"math/rand/v2"
	"testing"

	"switchyard/kv/hashing"
)

// checkKeySlots fails unless a holds n entries, each reachable from its home: every slot
// from an entry's home to the entry's own is occupied (the probe invariant, which deletion
// by backward shift and growth must keep).
func checkKeySlots[V any](t *testing.T, a *keySlots[V], what string) {
	t.Helper()
	n := 0
	for j := range uint64(a.size) {
		s := a.at(j)
		if s == nil || s.h == 0 {
			continue
		}
		n++
		for i := a.home(s.h); i != j; i = (i + 1) & a.mask {
			if e := a.at(i); e == nil || e.h == 0 {
				t.Fatalf("%s: the entry at slot %d is cut from its home by the empty slot %d", what, j, i)
			}
		}
	}
	if n != a.n {
		t.Fatalf("%s: %d entries, counted %d", what, n, a.n)
	}
}

// keyTableModel applies operations to a keyTable and to a Go map, and checks that the table
// holds exactly the map's entries.
type keyTableModel[V comparable] struct {
	kt   keyTable[V]
	want map[int64]V
	// opsGrowing counts puts and dels applied while the table grew, deletes among them.
	opsGrowing, delsGrowing int
}

func (m *keyTableModel[V]) put(h int64, v V) {
	if m.kt.old.c != nil {
		m.opsGrowing++
	}
	m.kt.put(h, v)
	m.want[h] = v
}

func (m *keyTableModel[V]) del(h int64) {
	if m.kt.old.c != nil {
		m.opsGrowing++
		m.delsGrowing++
	}
	m.kt.del(h)
	delete(m.want, h)
}

// check compares the table with the map on keys and checks its slots' invariants.
func (m *keyTableModel[V]) check(t *testing.T, op int, keys []int64) {
	t.Helper()
	if m.kt.len() != len(m.want) {
		t.Fatalf("op %d: %d entries, want %d", op, m.kt.len(), len(m.want))
	}
	for _, h := range keys {
		got, ok := m.kt.get(h)
		w, wok := m.want[h]
		if ok != wok || got != w {
			t.Fatalf("op %d: get(%d) = %v, %v, want %v, %v", op, h, got, ok, w, wok)
		}
	}
	checkKeySlots(t, &m.kt.cur, "current slots")
	checkKeySlots(t, &m.kt.old, "old slots")
}

// TestKeyTableAgainstMap applies random puts, replacements and deletes to a keyTable and to a
// Go map, and after each (or every few) checks every key of the universe in both: the table
// holds exactly the map's entries, and its slots keep the probe invariant. Small universes
// keep the table small, so that probe runs wrap around its end and deletions shift entries
// back across it; larger ones make it grow, with puts, replacements and deletes while its
// entries move; hash 0 (the empty mark) is in every one. Both kinds of value are checked:
// router keys and SHA-256 digests.
func TestKeyTableAgainstMap(t *testing.T) {
	tests := []struct {
		name     string
		universe int // distinct engine hashes, 0 among them
		ops      int
		delShare float64
		// growing: the fewest deletes that must land while the table grows.
		growing int
	}{
		{"tiny", 8, 2_000, 0.4, 0},
		{"one-table", 40, 5_000, 0.3, 0},
		{"grows", 500, 20_000, 0.2, 1},
		{"churn", 3_000, 60_000, 0.5, 30},
		{"grows-large", 100_000, 150_000, 0.3, 200},
	}
	for _, tt := range tests {
		t.Run(tt.name+"/key", func(t *testing.T) {
			runKeyTableModel(t, tt.universe, tt.ops, tt.delShare, tt.growing, func(r *rand.Rand) int64 { return int64(r.Uint64()) })
		})
		t.Run(tt.name+"/digest", func(t *testing.T) {
			runKeyTableModel(t, tt.universe, tt.ops, tt.delShare, tt.growing, func(r *rand.Rand) hashing.Digest {
				var d hashing.Digest
				for i := 0; i < len(d); i += 8 {
					binary.LittleEndian.PutUint64(d[i:], r.Uint64())
				}
				return d
			})
		})
	}
}

func runKeyTableModel[V comparable](t *testing.T, universe, ops int, delShare float64, growing int, value func(*rand.Rand) V) {
	t.Helper()
	rng := rand.New(rand.NewPCG(7, uint64(universe)))
	keys := make([]int64, universe)
	for i := 1; i < len(keys); i++ {
		keys[i] = int64(rng.Uint64())
	}
	m := &keyTableModel[V]{want: map[int64]V{}}
	for op := range ops {
		h := keys[rng.IntN(len(keys))]
		if rng.Float64() < delShare {
			m.del(h)
		} else {
			m.put(h, value(rng))
		}
		switch {
		case universe <= 40, universe <= 500 && op%7 == 0, universe <= 3_000 && op%97 == 0, op%5_003 == 0:
			m.check(t, op, keys)
		case m.kt.old.c != nil && op%31 == 0:
			m.check(t, op, keys[:200]) // the slots' invariants while entries move
		}
	}
	m.check(t, ops, keys)
	if m.delsGrowing < growing {
		t.Fatalf("%d deletes while the table grew (%d operations), want %d or more", m.delsGrowing, m.opsGrowing, growing)
	}
	// Deleting everything leaves no mark behind: every slot empty again.
	for _, h := range keys {
		m.del(h)
	}
	if m.kt.len() != 0 {
		t.Fatalf("%d entries after deleting every key", m.kt.len())
	}
	for _, a := range []*keySlots[V]{&m.kt.cur, &m.kt.old} {
		for _, c := range a.c {
			for i, s := range c {
				if s != (keySlot[V]{}) {
					t.Fatalf("slot %d holds %+v after deleting every key", i, s)
				}
			}
		}
	}
}

// TestKeyTableGrowsIncrementally: the put that fills the slots past 3/4 moves none of their
// entries and allocates none of the new chunks but the one it lands in; each put after it
// moves at most keyGrowStep entries and the rest of the run it stopped in, and drops the old
// chunks it has wholly visited, until the old slots are empty and released.
func TestKeyTableGrowsIncrementally(t *testing.T) {
	const size = 4 * keyChunkSlots
	var kt keyTable[int64]
	rng := rand.New(rand.NewPCG(3, 3))
	for kt.old.c == nil || kt.old.size < size {
		growing, before := kt.old.c != nil, kt.cur.n
		kt.put(int64(rng.Uint64()|1), 1)
		if !growing && kt.old.c != nil {
			if kt.old.n != before {
				t.Fatalf("growth moved %d of %d entries at once", before-kt.old.n, before)
			}
			allocated := 0
			for _, c := range kt.cur.c {
				if c != nil {
					allocated++
				}
			}
			if allocated != 1 {
				t.Fatalf("growth allocated %d chunks at once", allocated)
			}
		}
	}
	longest, run := 0, 0
	for i := range uint64(2 * size) { // runs may wrap around the end
		if kt.old.at(i&kt.old.mask).h == 0 {
			run = 0
			continue
		}
		run++
		longest = max(longest, run)
	}
	puts, dropped := 0, 0
	for kt.old.c != nil {
		before := kt.old.n
		kt.put(int64(rng.Uint64()|1), 2)
		puts++
		if moved := before - kt.old.n; moved > keyGrowStep+longest {
			t.Fatalf("put %d moved %d entries, want at most %d + the longest run, %d", puts, moved, keyGrowStep, longest)
		}
		if kt.old.c == nil {
			break
		}
		if kt.old.n == before {
			t.Fatalf("put %d moved nothing", puts)
		}
		// Chunks wholly between start and next are dropped; the others are kept.
		dropped = 0
		for k, c := range kt.old.c {
			first, last := uint64(k)*keyChunkSlots, uint64(k+1)*keyChunkSlots-1
			visited := func(i uint64) bool { return (i-kt.start-1)&kt.old.mask < (kt.next-kt.start-1)&kt.old.mask }
			if whole := visited(first) && visited(last) && uint64(k) != kt.start>>keyChunkBits; whole != (c == nil) {
				t.Fatalf("put %d: chunk %d dropped %v, wholly visited %v (start %d, next %d)", puts, k, c == nil, whole, kt.start, kt.next)
			}
			if c == nil {
				dropped++
			}
		}
	}
	if dropped < 2 {
		t.Fatalf("%d of 4 old chunks dropped before growth ended, want 2 or more", dropped)
	}
	if min := size * 3 / 4 / (keyGrowStep + longest); puts < min {
		t.Fatalf("growth took %d puts, want %d or more", puts, min)
	}
	checkKeySlots(t, &kt.cur, "current slots")
}

// TestKeyTableTouch: touch reads h's home line, of an empty table too, and of both slot
// arrays while the table grows.
func TestKeyTableTouch(t *testing.T) {
	var kt keyTable[int64]
	if got := kt.touch(5); got != 0 {
		t.Fatalf("touch of an empty table = %d", got)
	}
	kt.put(5, 50)
	if got := kt.touch(5); got != 5 {
		t.Fatalf("touch(5) = %d, want the hash in its home slot, 5", got)
	}
	for h := int64(6); kt.old.c == nil; h++ {
		kt.put(h, h)
	}
	if s := kt.old.find(5); s == nil || kt.touch(5) != 5+kt.cur.at(kt.cur.home(5)).h {
		t.Fatalf("touch(5) while growing = %d, want 5 from the old slots and the new home's word", kt.touch(5))
	}
}

// FuzzKeyTable applies the operations data spells (three bytes each: put, replace or delete;
// which of 256 hashes, 0 among them, so that the table grows twice; a value) to a keyTable and a Go map, and checks that
// they agree and that the slots keep the probe invariant.
func FuzzKeyTable(f *testing.F) {
	f.Add([]byte{0, 0, 1, 0, 1, 2, 1, 0, 0})
	f.Add([]byte{0, 5, 9, 0, 6, 9, 2, 5, 0, 0, 7, 1})
	seed := make([]byte, 3*600)
	for i := range seed {
		seed[i] = byte(i * 7 % 251)
	}
	f.Add(seed)
	grow := make([]byte, 0, 3*256)
	for i := range 256 {
		grow = append(grow, 0, byte(i), 1)
	}
	f.Add(grow)
	keys := make([]int64, 256)
	rng := rand.New(rand.NewPCG(5, 5))
	for i := 1; i < len(keys); i++ {
		keys[i] = int64(rng.Uint64())
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		m := &keyTableModel[int64]{want: map[int64]int64{}}
		for i := 0; i+3 <= len(data) && i < 3*4096; i += 3 {
			h := keys[data[i+1]]
			if data[i]%3 == 2 {
				m.del(h)
			} else {
				m.put(h, int64(data[i+2]))
			}
			if m.kt.old.c != nil {
				checkKeySlots(t, &m.kt.cur, "current slots")
				checkKeySlots(t, &m.kt.old, "old slots")
			}
		}
		m.check(t, len(data)/3, keys)
	})
}
