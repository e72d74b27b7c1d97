package index

import (
	"math/rand/v2"
	"testing"
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
