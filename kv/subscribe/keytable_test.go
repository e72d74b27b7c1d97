package subscribe

import (
	"math/rand/v2"
	"testing"
)

// TestKeyTableAgainstMap applies random puts, replacements and deletes to a keyTable and to a
// Go map, and after each checks every key of the universe in both: the table holds exactly
// the map's entries. Small universes keep the table small, so that probe runs wrap around its
// end and deletions shift entries back across it; hash 0 (the empty mark) is in every one.
func TestKeyTableAgainstMap(t *testing.T) {
	tests := []struct {
		name     string
		universe int // distinct engine hashes, 0 among them
		ops      int
		delShare float64
	}{
		{"tiny", 8, 2_000, 0.4},
		{"one-table", 40, 5_000, 0.3},
		{"grows", 500, 20_000, 0.2},
		{"churn", 3_000, 60_000, 0.5},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(7, uint64(tt.universe)))
			keys := make([]int64, tt.universe)
			for i := 1; i < len(keys); i++ {
				keys[i] = int64(rng.Uint64())
			}
			var kt keyTable
			want := map[int64]int64{}
			check := func(op int) {
				t.Helper()
				if kt.len() != len(want) {
					t.Fatalf("op %d: %d entries, want %d", op, kt.len(), len(want))
				}
				for _, h := range keys {
					got, ok := kt.get(h)
					w, wok := want[h]
					if ok != wok || got != w {
						t.Fatalf("op %d: get(%d) = %d, %v, want %d, %v", op, h, got, ok, w, wok)
					}
				}
			}
			for op := range tt.ops {
				h := keys[rng.IntN(len(keys))]
				if rng.Float64() < tt.delShare {
					kt.del(h)
					delete(want, h)
				} else {
					v := int64(rng.Uint64())
					kt.put(h, v)
					want[h] = v
				}
				if tt.universe <= 40 || op%7 == 0 && tt.universe <= 500 || op%97 == 0 {
					check(op)
				}
			}
			check(tt.ops)
			// Deleting everything leaves no mark behind: every slot empty again.
			for _, h := range keys {
				kt.del(h)
			}
			if kt.len() != 0 {
				t.Fatalf("%d entries after deleting every key", kt.len())
			}
			for i, s := range kt.slots {
				if s != (keySlot{}) {
					t.Fatalf("slot %d holds %+v after deleting every key", i, s)
				}
			}
		})
	}
}

// TestKeyTableTouch: touch reads h's home line, of an empty table too.
func TestKeyTableTouch(t *testing.T) {
	var kt keyTable
	if got := kt.touch(5); got != 0 {
		t.Fatalf("touch of an empty table = %d", got)
	}
	kt.put(5, 50)
	if got := kt.touch(5); got != 5 {
		t.Fatalf("touch(5) = %d, want the hash in its home slot, 5", got)
	}
}
