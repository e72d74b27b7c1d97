package index

import (
	"context"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"unsafe"
)

// TestShardAgainstModel runs random stores, removes, owner clears and prunes on a shard and
// compares every block's valid owners (as Match reports them) with a plain model, and,
// after each prune, the resident blocks, the extra owner records and the room of the runs.
// Few hashes and owners, so blocks move between one owner inline and several in a run many
// times.
func TestShardAgainstModel(t *testing.T) {
	for seed := range uint64(3) {
		r := rand.New(rand.NewPCG(seed, 11))
		owners, ids := testOwners(t, "a", "b", "c", "d", "e", "f")
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
				op := ShardOp{Hash: h, Owner: uint16(o), Epoch: epoch, Tiers: Tiers(1 + r.IntN(int(AllTiers))), Remove: r.IntN(3) == 0}
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
			// A run has room for at most twice its records: one that lost owners gave back
			// the room it no longer needs (a run of n owners holds n-1 extra records).
			if st := s.Stats(); pruned && st.SpillCap > 2*st.Spilled {
				t.Fatalf("seed %d step %d: runs have room for %d records, holding %d extra owners", seed, step, st.SpillCap, st.Spilled)
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
		batch.Ops = append(batch.Ops, ShardOp{Hash: h, Owner: uint16(a[0]), Epoch: owners.Epoch(a[0]), Tiers: TierGPU})
	}
	batch.Ops = append(batch.Ops, ShardOp{Hash: 1000, Owner: uint16(b[0]), Epoch: owners.Epoch(b[0]), Tiers: TierGPU})
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

// TestShardOpLayout: a block operation is 16 bytes, and an owner ID out of range is never
// taken for the owner its low 16 bits name: its operations are stale and store nothing.
func TestShardOpLayout(t *testing.T) {
	if n := unsafe.Sizeof(ShardOp{}); n != 16 {
		t.Fatalf("ShardOp is %d bytes, want 16", n)
	}
	x := newTestIndex(t, 1, 1<<10)
	ids := register(t, x, "a", 1, 16)
	if ids[0] != 1 {
		t.Fatalf("first owner %d, want 1", ids[0])
	}
	w := x.NewWriter()
	w.Store(ids[0]+MaxOwners, x.Owners().Epoch(ids[0]), 42, TierGPU)
	if d := w.Flush(); d != 0 {
		t.Fatalf("%d ops dropped", d)
	}
	if st := x.Stats(); st.Blocks != 0 || st.Stale != 1 {
		t.Fatalf("%d blocks resident, %d stale operations: want 0 and 1", st.Blocks, st.Stale)
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
// everything a resident block costs on the heap: the block table and the records of the
// owner runs.
func TestShardMemoryBytesMatchesHeap(t *testing.T) {
	const n = 1 << 17
	for _, holders := range []int{1, 2, 3} {
		owners, ids := testOwners(t, []string{"w0", "w1", "w2"}[:holders]...)
		rng := rand.New(rand.NewPCG(5, 5))
		b := &ShardBatch{Ops: make([]ShardOp, 0, n*holders)}
		for range n {
			h := int64(rng.Uint64())
			for _, id := range ids {
				b.Ops = append(b.Ops, ShardOp{Hash: h, Owner: uint16(id), Epoch: owners.Epoch(id), Tiers: TierGPU})
			}
		}
		// The heap is the whole process's: memory another goroutine of the run frees or
		// allocates between the two readings (a previous test's actors winding down) moves
		// it. A miss is measured again, up to three times; an estimate off by more than 3%
		// misses every time.
		var est, heap int64
		for range 3 {
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			s := NewShard(owners, 2*n)
			s.Apply(b)
			runtime.GC()
			runtime.ReadMemStats(&after)
			heap = int64(after.HeapAlloc) - int64(before.HeapAlloc)
			est = s.Stats().MemoryBytes()
			runtime.KeepAlive(s)
			if d := float64(est-heap) / float64(heap); d >= -0.03 && d <= 0.03 {
				break
			}
		}
		if d := float64(est-heap) / float64(heap); d < -0.03 || d > 0.03 {
			t.Errorf("%d holders: estimate %.1f B per block, heap %.1f", holders, float64(est)/n, float64(heap)/n)
		}
		runtime.KeepAlive(b)
	}
}

// TestShardSeveralOwnersCostOneRun: a block held by several owners costs its table slot and
// one run of their records, which its entry names (no table of owner sets beside it: a
// reader waits for the table line, then the run), with little more than the arena's growth
// room on top.
func TestShardSeveralOwnersCostOneRun(t *testing.T) {
	const n = 1 << 15
	for _, c := range []struct{ holders, room int }{{2, 2}, {3, 4}} { // room: records of a run
		holders := c.holders
		owners, ids := testOwners(t, []string{"w0", "w1", "w2"}[:holders]...)
		rng := rand.New(rand.NewPCG(7, 7))
		s := NewShard(owners, 2*n)
		b := &ShardBatch{}
		for range n {
			h := int64(rng.Uint64())
			for _, id := range ids {
				b.Ops = append(b.Ops, ShardOp{Hash: h, Owner: uint16(id), Epoch: owners.Epoch(id), Tiers: TierGPU})
			}
		}
		s.Apply(b)
		st := s.Stats()
		room := int64(c.room)
		beyond := float64(st.MemoryBytes()-st.TableSlots*entryBytes) / n
		if limit := 1.25 * float64(room*slotBytes); beyond > limit {
			t.Errorf("%d holders: %.1f B per block beyond the table, want at most %.1f (one run of %d records)", holders, beyond, limit, room)
		}
	}
}

// TestShardConcurrentReadersAgainstModel runs random stores, removes, owner clears and
// prunes on a shard's writer goroutine while two goroutines read it through the index's
// direct matcher (as MatchHashes does, runs of blocks; a read the matcher leaves to the host
// is refused and skipped), and checks every answer against a model that keeps each block's
// history: the owners a lookup read a block as held by, among those still holding the
// prefix before it, must be those of a state the block had at some version between the
// read's start and end (an owner's validity may be read at any moment of that span, as owner
// epochs are read without the shard). Blocks collide in few home slots (long probe runs,
// backward-shift moves), move between one owner inline and several in a run, and the table
// grows while they are read.
func TestShardConcurrentReadersAgainstModel(t *testing.T) {
	workers := []string{"a", "b", "c", "d", "e", "f"}
	for seed := range uint64(2) {
		r := rand.New(rand.NewPCG(seed, 17))
		x, err := New(Config{Shards: 1, MaxBlocks: 1 << 20, Host: func(s []*Shard) (ShardHost, error) {
			return refusingHost{NewLockedShards(s)}, nil
		}})
		if err != nil {
			t.Fatal(err)
		}
		defer x.Close()
		owners, s := x.owners, x.shards[0] // the test is the shard's writer
		var ids []OwnerID
		for _, w := range workers {
			ids = append(ids, register(t, x, w, 1, 16)[0])
		}
		bits := make([]uint16, 16)
		for i, id := range ids {
			bits[id] = uint16(i + 1)
		}
		hashes := make([]int64, 6000)
		for i := range hashes {
			hashes[i] = int64(r.IntN(48)) << 40 // few home slots: long probe runs
			if i%2 == 1 {
				hashes[i] = int64(r.Uint64())
			}
		}
		slices.Sort(hashes)
		hashes = slices.Compact(hashes)
		r.Shuffle(len(hashes), func(i, j int) { hashes[i], hashes[j] = hashes[j], hashes[i] })

		type rec struct{ epoch uint32 }
		type state struct {
			ver  int64
			recs map[OwnerID]uint32
		}
		type epochAt struct {
			ver   int64
			epoch uint32
		}
		hist := map[int64][]state{}
		epochs := map[OwnerID][]epochAt{}
		for _, id := range ids {
			epochs[id] = []epochAt{{0, owners.Epoch(id)}}
		}
		cur := map[int64]map[OwnerID]rec{}
		tiers := map[int64]map[OwnerID]Tiers{}

		var ver atomic.Int64
		var done atomic.Bool
		type answer struct {
			from, to int64
			hashes   []int64
			counts   []int64 // blocks of the prefix each owner holds, in ids' order
		}
		answers := make([][]answer, 2)
		var wg sync.WaitGroup
		for g := range answers {
			rr := rand.New(rand.NewPCG(seed, uint64(g)))
			wg.Go(func() {
				ctx := context.Background()
				for i := 0; i < 200_000 && !done.Load(); i++ {
					lo := rr.IntN(len(hashes))
					run := hashes[lo:min(len(hashes), lo+1+rr.IntN(24))]
					from := ver.Load()
					// MatchHashes without the result's assembly: more reads overlap writes.
					sc := x.getScratch(owners.snap.Load().maxID)
					sc.hashes = append(sc.hashes[:0], run...)
					sc.tokens, sc.hashed, sc.keys = nil, len(run), nil
					if err := x.matchGroup(ctx, sc, ids, len(run)); err != nil {
						continue // left to the host
					}
					to := ver.Load() + 1 // the write after the last published may be visible
					// Keep the reads that overlapped a write, and a sample of the others.
					if len(answers[g]) < 20_000 && (to > from+1 || i%16 == 0) {
						counts := make([]int64, len(workers))
						for k := range workers {
							counts[k] = int64(sc.count[k])
						}
						answers[g] = append(answers[g], answer{from, to, run, counts})
					}
					x.scratch.Put(sc)
				}
			})
		}
		const steps = 20_000
		for step := int64(1); step <= steps; step++ {
			if r.IntN(400) == 0 {
				o := ids[r.IntN(len(ids))]
				owners.Clear(o)
				epochs[o] = append(epochs[o], epochAt{step, owners.Epoch(o)})
				ver.Store(step)
				continue
			}
			h := hashes[r.IntN(len(hashes))]
			o := ids[r.IntN(len(ids))]
			epoch := owners.Epoch(o)
			if r.IntN(8) == 0 {
				epoch-- // from before a clear: dropped
			}
			op := ShardOp{Hash: h, Owner: uint16(o), Epoch: epoch, Tiers: Tiers(1 + r.IntN(int(AllTiers))), Remove: r.IntN(3) == 0}
			s.Apply(&ShardBatch{Ops: []ShardOp{op}})
			if r.IntN(500) == 0 {
				s.Prune()
			}
			if owners.Valid(o, epoch) {
				m, tm := cur[h], tiers[h]
				if m == nil {
					m, tm = map[OwnerID]rec{}, map[OwnerID]Tiers{}
					cur[h], tiers[h] = m, tm
				}
				old, ok := m[o]
				switch {
				case op.Remove:
					if ok && old.epoch == epoch {
						if tm[o] &^= op.Tiers; tm[o] == 0 {
							delete(m, o)
						}
					}
				case ok && old.epoch == epoch:
					tm[o] |= op.Tiers
				default:
					m[o], tm[o] = rec{epoch}, op.Tiers
				}
				recs := make(map[OwnerID]uint32, len(m))
				for id, rc := range m {
					recs[id] = rc.epoch
				}
				hist[h] = append(hist[h], state{step, recs})
			}
			ver.Store(step)
		}
		done.Store(true)
		wg.Wait()
		if st := s.Stats(); st.TableSlots < 2*minTableSlots {
			t.Fatalf("seed %d: the table did not grow: %d slots", seed, st.TableSlots)
		}

		// validIn reports whether owner o's record of epoch e can have been read as valid
		// (and as invalid) at some version in [from, to].
		validIn := func(o OwnerID, e uint32, from, to int64) (canValid, canInvalid bool) {
			eh := epochs[o]
			for i, ea := range eh {
				if i+1 < len(eh) && eh[i+1].ver <= from {
					continue // superseded before the span
				}
				if ea.ver > to {
					break
				}
				if ea.epoch == e {
					canValid = true
				} else {
					canInvalid = true
				}
			}
			return canValid, canInvalid
		}
		// possible reports whether the owners of known can have been read as got (a bit
		// per owner, bits' numbering) for block h at some version in [from, to].
		possible := func(h int64, from, to int64, got, known uint64) bool {
			hs := hist[h]
			states := []map[OwnerID]uint32{nil} // before its first change: empty
			for i, st := range hs {
				if st.ver > to {
					break
				}
				if i+1 < len(hs) && hs[i+1].ver <= from {
					continue
				}
				if st.ver <= from {
					states = states[:0] // this one is in force at the start
				}
				states = append(states, st.recs)
			}
		next:
			for _, recs := range states {
				for _, id := range ids {
					if known>>(bits[id]-1)&1 == 0 {
						continue
					}
					bit := got>>(bits[id]-1)&1 != 0
					e, held := recs[id]
					if !held {
						if bit {
							continue next
						}
						continue
					}
					canValid, canInvalid := validIn(id, e, from, to)
					if (bit && !canValid) || (!bit && !canInvalid) {
						continue next
					}
				}
				return true
			}
			return false
		}
		n, overlapped := 0, 0
		for _, as := range answers {
			for _, a := range as {
				n++
				if a.to > a.from+1 {
					overlapped++
				}
				// Block i was read for the owners holding blocks [0, i) (known); those
				// holding more held it.
				for i, h := range a.hashes {
					var got, known uint64
					for k, c := range a.counts {
						if c >= int64(i) {
							known |= 1 << k
						}
						if c > int64(i) {
							got |= 1 << k
						}
					}
					if known == 0 {
						break // the prefix ended before block i: not read
					}
					if !possible(h, a.from, a.to, got, known) {
						t.Fatalf("seed %d: block %x read as %b of %b between versions %d and %d: no state of the block then (history %v)", seed, h, got, known, a.from, a.to, hist[h])
					}
				}
			}
		}
		if overlapped == 0 {
			t.Fatalf("seed %d: no direct read overlapped a write (%d reads)", seed, n)
		}
		t.Logf("seed %d: %d reads checked, %d overlapped writes, %d left to the owner", seed, n, overlapped, s.Stats().Fallbacks)
	}
}

// refusingHost is a host that answers no query: a read left to it fails.
type refusingHost struct{ *LockedShards }

func (refusingHost) Match(context.Context, []*ShardQuery) error { return ErrShardBusy }

// testOwners registers workers (model "m", one rank, 16-token pages) and returns their
// owner IDs in order.
func testOwners(t *testing.T, workers ...string) (*Owners, []OwnerID) {
	t.Helper()
	owners := NewOwners()
	var ids []OwnerID
	for _, w := range workers {
		got, err := owners.SetWorker(w, "m", 1, 16)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, got[0])
	}
	return owners, ids
}

// TestShardEvictionFreesRuns: blocks with several owners evicted by the memory bound give
// their runs back: the runs' room (SpillCap) and extra records (Spilled) are those of the
// resident blocks' runs, and the arena does not grow past what they and the free runs of
// each class need.
func TestShardEvictionFreesRuns(t *testing.T) {
	owners, ids := testOwners(t, "a", "b", "c", "d", "e")
	s := NewShard(owners, 64)
	r := rand.New(rand.NewPCG(9, 9))
	for range 200 {
		b := &ShardBatch{}
		for range 20 {
			h := int64(r.Uint64())
			for _, id := range ids[:1+r.IntN(len(ids))] {
				b.Ops = append(b.Ops, ShardOp{Hash: h, Owner: uint16(id), Epoch: owners.Epoch(id), Tiers: TierGPU})
			}
		}
		s.Apply(b)
		var room, extra int64
		for i := range s.tab.slots {
			if m := s.tab.slots[i].load(); m.live() && m.multi() {
				_, n := m.run()
				room += 1 << runClass(n)
				extra += int64(n) - 1
			}
		}
		if st := s.Stats(); st.Blocks > 64 || st.SpillCap != room || st.Spilled != extra {
			t.Fatalf("%d blocks, runs with room for %d and %d extra records; the resident blocks' runs: %d and %d", st.Blocks, st.SpillCap, st.Spilled, room, extra)
		}
	}
	st := s.Stats()
	if st.Evicted == 0 {
		t.Fatal("nothing evicted")
	}
	// Freed runs are reused: the arena holds at most the resident blocks' runs of every
	// class (2, 4 and 8 records for up to five owners) and its growth room.
	if limit := int64(64 * (2 + 4 + 8) * 5 / 4); st.ArenaSlots > limit {
		t.Fatalf("arena of %d records after %d evictions, want at most %d", st.ArenaSlots, st.Evicted, limit)
	}
}
