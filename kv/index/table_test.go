package index

import (
	"math/rand/v2"
	"testing"
	"unsafe"
)

// TestBlockTableAgainstMap checks inserts, finds and backward-shift removals against a Go
// map, with keys chosen to collide (a few home slots, wrapping around the array's end) and
// through growth.
func TestBlockTableAgainstMap(t *testing.T) {
	for _, keys := range []struct {
		name string
		gen  func(r *rand.Rand) int64
	}{
		{"random", func(r *rand.Rand) int64 { return int64(r.Uint64()) }},
		{"small integers", func(r *rand.Rand) int64 { return int64(r.IntN(4000)) }},
		{"dense runs", func(r *rand.Rand) int64 { return int64(r.IntN(64)) << 40 }},
	} {
		t.Run(keys.name, func(t *testing.T) {
			r := rand.New(rand.NewPCG(1, 2))
			tab := newBlockTable(0, new(stripes))
			ref := map[int64]Tiers{}
			for step := range 200_000 {
				k := keys.gen(r)
				idx, ok := tab.find(k)
				_, want := ref[k]
				if ok != want {
					t.Fatalf("step %d: find(%d) = %v, want %v", step, k, ok, want)
				}
				switch {
				case ok && r.IntN(2) == 0:
					tab.remove(idx)
					delete(ref, k)
				case ok:
					if got := tab.slots[idx].load().single().tiers; got != ref[k] {
						t.Fatalf("step %d: key %d carries %d, want %d", step, k, got, ref[k])
					}
				case len(ref) < 20_000:
					tag := Tiers(step)
					tab.insert(k, newMeta(1, 1, tag, entryLive))
					ref[k] = tag
				}
				if tab.n != len(ref) {
					t.Fatalf("step %d: %d entries, want %d", step, tab.n, len(ref))
				}
			}
			for k, tag := range ref {
				idx, ok := tab.find(k)
				if !ok || tab.slots[idx].load().single().tiers != tag {
					t.Fatalf("key %d lost", k)
				}
			}
			if len(tab.slots) < len(ref)*maxLoadDen/maxLoadNum {
				t.Fatalf("%d slots for %d entries", len(tab.slots), len(ref))
			}
		})
	}
}

// TestBlockTableProbesStayInTheHomeLine: a block's home is the first slot of a cache line, so
// that at the table's highest occupancy most blocks are found in the one line their probe
// starts in (a home anywhere in the line leaves a block in the next line more often), and
// the slot array starts on a line.
func TestBlockTableProbesStayInTheHomeLine(t *testing.T) {
	tab := newBlockTable(1<<16, new(stripes))
	if p := uintptr(unsafe.Pointer(unsafe.SliceData(tab.slots))); p%64 != 0 {
		t.Fatalf("slot array at %#x, not on a cache line", p)
	}
	r := rand.New(rand.NewPCG(3, 4))
	keys := make([]int64, 0, len(tab.slots)*maxLoadNum/maxLoadDen)
	for len(keys) < cap(keys) {
		k := int64(r.Uint64())
		if _, ok := tab.find(k); ok {
			continue
		}
		tab.insert(k, newMeta(1, 1, TierGPU, entryLive))
		keys = append(keys, k)
	}
	if len(tab.slots) != 1<<16 {
		t.Fatalf("the table grew to %d slots", len(tab.slots))
	}
	// A held block is found, and a new block's probe ends at an empty slot, in the home line.
	inLine, emptyInLine := 0, 0
	for _, k := range keys {
		idx, ok := tab.find(k)
		if !ok {
			t.Fatalf("key %d lost", k)
		}
		if uint64(idx)/slotsPerLine == tab.home(k)/slotsPerLine {
			inLine++
		}
		absent := int64(r.Uint64())
		i := tab.home(absent)
		for tab.slots[i].load().live() {
			i = (i + 1) & tab.mask
		}
		if i/slotsPerLine == tab.home(absent)/slotsPerLine {
			emptyInLine++
		}
	}
	// Measured at 70% occupancy: 89% of the held blocks and 60% of the new ones (homes
	// anywhere in the line: 81% and 49%).
	n := float64(len(keys))
	if held, absent := float64(inLine)/n, float64(emptyInLine)/n; held < 0.86 || absent < 0.55 {
		t.Fatalf("%.1f%% of the held blocks and %.1f%% of the new ones in their home line, want at least 86%% and 55%%", 100*held, 100*absent)
	}
}
