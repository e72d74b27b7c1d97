package index

import (
	"math/rand/v2"
	"testing"
)

// TestShardAgainstModel runs random stores, removes, owner clears and prunes on a shard and
// compares every block's valid owners (as Match reports them) with a plain model, and,
// after each prune, the resident blocks and extra owner records. Few hashes and owners, so
// blocks move between one owner inline and several in a run many times.
func TestShardAgainstModel(t *testing.T) {
	for seed := range uint64(3) {
		r := rand.New(rand.NewPCG(seed, 11))
		owners := NewOwners()
		var ids []OwnerID
		for _, w := range []string{"a", "b", "c", "d", "e", "f"} {
			got, err := owners.SetWorker(w, "m", 1, 16)
			if err != nil {
				t.Fatal(err)
			}
			ids = append(ids, got[0])
		}
		type rec struct {
			epoch uint32
			tiers Tiers
		}
		model := map[int64]map[OwnerID]rec{}
		hashes := make([]int64, 300)
		for i := range hashes {
			hashes[i] = int64(r.IntN(32)) << 40 // few home slots: long probe runs
			if i%2 == 1 {
				hashes[i] = int64(r.Uint64())
			}
		}
		first := make([]bool, len(hashes)) // the first occurrence of its hash
		seen := map[int64]bool{}
		for i, h := range hashes {
			first[i], seen[h] = !seen[h], true
		}
		bits := make([]uint16, 16)
		for i, id := range ids {
			bits[id] = uint16(i + 1)
		}
		s := NewShard(owners, 1<<20)
		for step := range 1000 {
			b := &ShardBatch{}
			for range 1 + r.IntN(20) {
				h := hashes[r.IntN(len(hashes))]
				o := ids[r.IntN(len(ids))]
				epoch := owners.Epoch(o)
				if r.IntN(8) == 0 {
					epoch-- // from before a clear: dropped
				}
				op := ShardOp{Hash: h, Owner: o, Epoch: epoch, Tiers: Tiers(1 + r.IntN(int(AllTiers))), Remove: r.IntN(3) == 0}
				b.Ops = append(b.Ops, op)
				if !owners.Valid(o, epoch) {
					continue
				}
				m := model[h]
				if m == nil {
					m = map[OwnerID]rec{}
					model[h] = m
				}
				old, ok := m[o]
				switch {
				case op.Remove:
					if ok && old.epoch == epoch {
						if old.tiers &^= op.Tiers; old.tiers == 0 {
							delete(m, o)
						} else {
							m[o] = old
						}
					}
				case ok && old.epoch == epoch:
					m[o] = rec{epoch, old.tiers | op.Tiers}
				default:
					m[o] = rec{epoch, op.Tiers}
				}
			}
			s.Apply(b)
			if r.IntN(50) == 0 {
				owners.Clear(ids[r.IntN(len(ids))])
			}
			pruned := r.IntN(40) == 0
			if pruned {
				s.Prune()
			}
			q := &ShardQuery{Hash: hashes, Bits: bits, Words: 1}
			s.Match(q)
			blocks, extra := 0, 0
			for i, h := range hashes {
				var want uint64
				valid := 0
				for o, rc := range model[h] {
					if owners.Valid(o, rc.epoch) {
						want |= 1 << (bits[o] - 1)
						valid++
					}
				}
				if q.Sets[i] != want {
					t.Fatalf("seed %d step %d: block %x held by %b, want %b", seed, step, h, q.Sets[i], want)
				}
				if valid > 0 && first[i] {
					blocks++
					extra += valid - 1
				}
			}
			if st := s.Stats(); pruned && (st.Blocks != int64(blocks) || st.Spilled != int64(extra)) {
				t.Fatalf("seed %d step %d: %d blocks, %d extra owners after prune, want %d and %d", seed, step, st.Blocks, st.Spilled, blocks, extra)
			}
		}
	}
}

// TestEntryLayout: a table slot is 16 bytes (four to a cache line, none straddling two) and
// an owner record in a run 8.
func TestEntryLayout(t *testing.T) {
	if entryBytes != 16 || slotBytes != 8 {
		t.Fatalf("table slot %d bytes, owner record %d: want 16 and 8", entryBytes, slotBytes)
	}
}
