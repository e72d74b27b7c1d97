package index

import (
	"fmt"
	"math/rand/v2"
	"runtime"
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
		for step := range 700 {
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
			// One query per block: a query stops at its first block nobody holds
			// (TestShardMatchStopsAtPrefixEnd).
			q := &ShardQuery{Bits: bits, Words: 1}
			blocks, extra := 0, 0
			for i, h := range hashes {
				q.Hash = hashes[i : i+1]
				s.Match(q)
				var want uint64
				valid := 0
				for o, rc := range model[h] {
					if owners.Valid(o, rc.epoch) {
						want |= 1 << (bits[o] - 1)
						valid++
					}
				}
				if q.Sets[0] != want {
					t.Fatalf("seed %d step %d: block %x held by %b, want %b", seed, step, h, q.Sets[0], want)
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

// TestShardMatchStopsAtPrefixEnd: a query stops at its first block none of the asked owners
// holds; the blocks after it are not looked up.
func TestShardMatchStopsAtPrefixEnd(t *testing.T) {
	owners := NewOwners()
	a, _ := owners.SetWorker("a", "m", 1, 16)
	b, _ := owners.SetWorker("b", "m", 1, 16)
	s := NewShard(owners, 1000)
	batch := &ShardBatch{}
	for h := range int64(100) {
		batch.Ops = append(batch.Ops, ShardOp{Hash: h, Owner: a[0], Epoch: owners.Epoch(a[0]), Tiers: TierGPU})
	}
	batch.Ops = append(batch.Ops, ShardOp{Hash: 1000, Owner: b[0], Epoch: owners.Epoch(b[0]), Tiers: TierGPU})
	s.Apply(batch)
	bits := make([]uint16, 8)
	bits[a[0]] = 1 // b is not asked about
	for _, c := range []struct {
		name   string
		hashes []int64
		probes uint64
	}{
		{"cold", []int64{500, 1, 2, 3}, 1},
		{"held by another owner", []int64{1000, 1, 2, 3}, 1},
		{"ends in the first group", []int64{0, 1, 500, 3, 4}, 5},
		{"held", []int64{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19}, 20},
	} {
		before := s.Stats().Probes
		q := &ShardQuery{Hash: c.hashes, Bits: bits, Words: 1}
		s.Match(q)
		if got := s.Stats().Probes - before; got != c.probes {
			t.Errorf("%s: %d probes, want %d", c.name, got, c.probes)
		}
		for i, h := range c.hashes {
			want := uint64(0)
			if h < 100 && (i == 0 || q.Sets[i-1] != 0) {
				want = 1
			}
			if q.Sets[i] != want {
				t.Errorf("%s: block %d held by %b, want %b", c.name, i, q.Sets[i], want)
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

// TestLookupColdPromptProbesOneBlockPerShard: a prompt nobody holds costs each shard one
// probe, not the first wave's 64.
func TestLookupColdPromptProbesOneBlockPerShard(t *testing.T) {
	x, err := New(Config{Shards: 4, MaxBlocks: 1 << 16})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = x.Close() })
	hold(t, x, register(t, x, "a", 1, 16)[0], seqTokens(1, 4096), 16, TierGPU)
	before := x.Stats().Probes
	if got := lookup(t, x, "m", seqTokens(1<<20, 4096)); len(got) != 0 {
		t.Fatalf("a cold prompt matched %v", got)
	}
	if probes := x.Stats().Probes - before; probes > 4 {
		t.Fatalf("a cold prompt of 256 blocks took %d probes over 4 shards", probes)
	}
	if got := lookup(t, x, "m", seqTokens(1, 4096)); got["a"] != 4096 {
		t.Fatalf("the held prompt matched %v", got)
	}
}

// TestShardMemoryBytesMatchesHeap: a shard's memory estimate (ShardStats.MemoryBytes) counts
// everything a resident block costs on the heap: the block table, the owner-set table and
// the records of the owner runs.
func TestShardMemoryBytesMatchesHeap(t *testing.T) {
	const n = 1 << 17
	for _, holders := range []int{1, 2, 3} {
		owners := NewOwners()
		var ids []OwnerID
		for i := range holders {
			got, err := owners.SetWorker(fmt.Sprintf("w%d", i), "m", 1, 16)
			if err != nil {
				t.Fatal(err)
			}
			ids = append(ids, got[0])
		}
		rng := rand.New(rand.NewPCG(5, 5))
		b := &ShardBatch{Ops: make([]ShardOp, 0, n*holders)}
		for range n {
			h := int64(rng.Uint64())
			for _, id := range ids {
				b.Ops = append(b.Ops, ShardOp{Hash: h, Owner: id, Epoch: owners.Epoch(id), Tiers: TierGPU})
			}
		}
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		s := NewShard(owners, 2*n)
		s.Apply(b)
		runtime.GC()
		runtime.ReadMemStats(&after)
		heap := int64(after.HeapAlloc) - int64(before.HeapAlloc)
		est := s.Stats().MemoryBytes()
		if d := float64(est-heap) / float64(heap); d < -0.03 || d > 0.03 {
			t.Errorf("%d holders: estimate %.1f B per block, heap %.1f", holders, float64(est)/n, float64(heap)/n)
		}
		runtime.KeepAlive(s)
		runtime.KeepAlive(b)
	}
}
