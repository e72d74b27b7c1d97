package index

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"switchyard/kv"
)

// TestDirectMatcherAgainstHolds: lookups of a long prompt (hundreds of the matcher's batches,
// several waves with engine keys) give every owner the prefix it holds, under both key
// schemes and block sizes, over three shards: owners holding the whole prompt, prefixes
// ending inside and at the edge of a batch, one block, a prefix cut by a block removed in
// the middle of the prompt, a tier removed from a block another tier still holds, an owner
// cleared, the last block held by one owner alone (inline in its entry), and 12, 100 and 140
// owners in one lookup (queries of one, two and three 64-bit words).
func TestDirectMatcherAgainstHolds(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 9))
	prompt := make([]uint32, 16*1000+5) // a short last block at 16 tokens
	for i := range prompt {
		prompt[i] = rng.Uint32()
	}
	for _, key := range []string{BlockKeyEngine, BlockKeyRouter} {
		for _, bs := range []int{16, 64} {
			for _, owners := range []int{12, 100, 140} { // queries of one, two and three words
				t.Run(fmt.Sprintf("%s/bs=%d/owners=%d", key, bs, owners), func(t *testing.T) {
					x := newKeyedIndex(t, 3, 1<<20, key)
					n := (len(prompt) + bs - 1) / bs
					want := map[string]int64{}
					tokens := func(blocks int) int64 { return int64(min(blocks*bs, len(prompt))) }
					for i := range owners {
						worker := fmt.Sprintf("w%03d", i)
						id := register(t, x, worker, 1, bs)[0]
						var held int
						switch i % 12 {
						case 0:
							held = n - 1
						case 1:
							held = 1
						case 2:
							held = pipeBatch // up to a batch's edge
						case 3:
							held = 3*pipeBatch + 5
						case 4:
							held = n / 2
						case 5:
							held = n - 1
						case 6:
							held = n - 1
						default:
							held = 1 + rng.IntN(n)
						}
						if i == owners-1 {
							held = n
						}
						hs := hold(t, x, id, prompt[:min(len(prompt), held*bs)], bs, TierGPU)
						switch i % 12 {
						case 6: // a block removed in the middle of the prompt
							cut := len(hs) / 3
							drop(t, x, id, hs[cut:cut+1], TierGPU)
							held = cut
						case 7: // the same block held in two tiers, one removed
							hold(t, x, id, prompt[:min(len(prompt), held*bs)], bs, TierCPUPinned)
							drop(t, x, id, hs[len(hs)/2:len(hs)/2+1], TierGPU)
						case 8: // cleared
							x.ClearOwner(id, kv.ClearRemoved)
							held = 0
						}
						if held > 0 {
							want[worker] = tokens(held)
						}
					}
					for range 2 { // the second finds every block of the prompt at the matched age
						got := lookup(t, x, "m", prompt)
						if len(got) != len(want) {
							t.Fatalf("%d owners matched, want %d", len(got), len(want))
						}
						for w, n := range want {
							if got[w] != n {
								t.Fatalf("%s matched %d tokens, want %d", w, got[w], n)
							}
						}
					}
					if got := lookup(t, x, "m", prompt[:bs]); len(got) != owners-owners/12-min(1, owners%12/9) {
						t.Fatalf("the first block alone matched %d owners", len(got))
					}
				})
			}
		}
	}
}

// TestRouterKeyColdPromptProbesOneBlock: with the router's keys, a prompt nobody holds costs
// one probe: the first block is matched alone, not the matcher's first batches.
func TestRouterKeyColdPromptProbesOneBlock(t *testing.T) {
	x := newKeyedIndex(t, 4, 1<<16, BlockKeyRouter)
	hold(t, x, register(t, x, "a", 1, 16)[0], seqTokens(1, 4096), 16, TierGPU)
	before := x.Stats().Probes
	if got := lookup(t, x, "m", seqTokens(1<<20, 16*4096)); len(got) != 0 {
		t.Fatalf("a cold prompt matched %v", got)
	}
	if probes := x.Stats().Probes - before; probes != 1 {
		t.Fatalf("a cold prompt of 4,096 blocks took %d probes", probes)
	}
}

// TestDirectMatcherFallsBackMidPrompt: a block in the middle of the prompt whose stripe a
// writer holds is left, with the rest of the prompt, to the shards' host, which answers once
// the write is over; the lookup gives the same matches as without the write.
func TestDirectMatcherFallsBackMidPrompt(t *testing.T) {
	for _, key := range []string{BlockKeyEngine, BlockKeyRouter} {
		t.Run(key, func(t *testing.T) {
			h := &answeringHost{release: func() {}}
			x, err := New(Config{Shards: 2, MaxBlocks: 1 << 16, BlockKey: key, Host: func(s []*Shard) (ShardHost, error) {
				h.LockedShards = NewLockedShards(s)
				return h, nil
			}})
			if err != nil {
				t.Fatal(err)
			}
			defer x.Close()
			prompt := seqTokens(0, 16*500)
			hs := hold(t, x, register(t, x, "a", 1, 16)[0], prompt, 16, TierGPU)
			hold(t, x, register(t, x, "b", 1, 16)[0], prompt[:16*300], 16, TierGPU)
			want := map[string]int64{"a": int64(len(prompt)), "b": 16 * 300}
			check := func(what string) {
				t.Helper()
				got := lookup(t, x, "m", prompt)
				if len(got) != 2 || got["a"] != want["a"] || got["b"] != want["b"] {
					t.Fatalf("%s: matched %v, want %v", what, got, want)
				}
			}
			check("direct")
			if h.queries != 0 {
				t.Fatalf("a direct lookup asked the host %d times", h.queries)
			}
			// Hold block 200's stripe, as its shard's writer does while it changes it.
			mid := hs[200]
			s := x.shards[x.shardOf(mid)]
			s.seqs.of(mid).Add(1)
			h.release = func() { s.seqs.release() }
			fallbacks := x.Stats().Fallbacks
			check("fallback")
			if h.queries == 0 || x.Stats().Fallbacks == fallbacks {
				t.Fatalf("%d host queries, %d fallbacks: the held block was not left to the host", h.queries, x.Stats().Fallbacks-fallbacks)
			}
		})
	}
}

// TestAskTableJudgesRecords: the direct matcher's table of asked owners matches a record (or
// a single owner's meta word) of an asked owner at the epoch it was asked at, and nothing
// else: another epoch, an owner not asked, owner 0, an owner past the table.
func TestAskTableJudgesRecords(t *testing.T) {
	asked, wide := make(askTable, 8), make(askTable, 8) // for queries of two words, and more
	asked[0].key, wide[0].key = askNone, askNone
	for _, a := range []struct {
		o     OwnerID
		epoch uint32
		bit   int
	}{{3, 7, 5}, {5, 0, maxQueryOwners - 1}, {6, 1<<32 - 1, 64}} {
		asked.setAsked(a.o, a.epoch, a.bit, 2)
		wide.setAsked(a.o, a.epoch, a.bit, maxQueryOwners/64+1)
	}
	tests := []struct {
		name    string
		v       uint64
		wantBit uint64
		want    bool
	}{
		{"asked, at its epoch", packSlot(slot{7, 3, TierGPU}), 5, true},
		{"a single owner's meta word", uint64(newMeta(7, 3, TierDisk, entryLive|ageMatched<<ageShift)), 5, true},
		{"asked, epoch 0, the last bit", packSlot(slot{0, 5, AllTiers}), maxQueryOwners - 1, true},
		{"asked, the last epoch", packSlot(slot{1<<32 - 1, 6, TierCPUPinned}), 64, true},
		{"asked, an older epoch", packSlot(slot{6, 3, TierGPU}), 0, false},
		{"asked, a newer epoch", packSlot(slot{8, 3, TierGPU}), 0, false},
		{"not asked", packSlot(slot{7, 4, TierGPU}), 0, false},
		{"not asked, epoch 0", packSlot(slot{0, 4, TierGPU}), 0, false},
		{"owner 0, a zero word", 0, 0, false},
		{"owner 0, epoch 0", packSlot(slot{0, 0, TierGPU}), 0, false},
		{"past the table", packSlot(slot{7, 8, TierGPU}), 0, false},
		{"the last owner ID", packSlot(slot{7, MaxOwners - 1, TierGPU}), 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			bit, ok := asked.bit(tt.v)
			if ok != tt.want || ok && bit != tt.wantBit {
				t.Errorf("bit(%#x) = %d, %v, want %d, %v", tt.v, bit, ok, tt.wantBit, tt.want)
			}
			var want [2]uint64
			if tt.want && tt.wantBit < 128 {
				want[tt.wantBit/64] = 1 << (tt.wantBit % 64)
			}
			if lo, hi := asked.bits1(tt.v); tt.wantBit < 128 && (lo != want[0] || hi != want[1]) {
				t.Errorf("bits1(%#x) = %#x, %#x, want %#x, %#x", tt.v, lo, hi, want[0], want[1])
			}
			set := make([]uint64, maxQueryOwners/64+1)
			wide.setOne(tt.v, set)
			wantSet := make([]uint64, len(set))
			if tt.want {
				wantSet[tt.wantBit/64] = 1 << (tt.wantBit % 64)
			}
			if !slices.Equal(set, wantSet) {
				t.Errorf("setOne(%#x): the set differs from {%d: %v}", tt.v, tt.wantBit, tt.want)
			}
		})
	}
	run := []uint64{
		packSlot(slot{7, 3, TierGPU}), packSlot(slot{6, 3, TierGPU}), packSlot(slot{1<<32 - 1, 6, TierGPU}),
		packSlot(slot{7, 4, TierGPU}), 0,
	}
	if lo, hi := asked.bits2(run); lo != 1<<5 || hi != 1 {
		t.Errorf("bits2 = %#x, %#x, want %#x, %#x", lo, hi, uint64(1<<5), 1)
	}
	v := &shardView{arena: append(run, packSlot(slot{0, 5, TierGPU}))}
	set := make([]uint64, 1024)
	if !wide.set(v, meta(0).withRun(0, uint32(len(v.arena))), set) {
		t.Fatal("set: a run inside the arena reported out of it")
	}
	want := make([]uint64, 1024)
	want[0], want[1], want[(maxQueryOwners-1)/64] = 1<<5, 1, 1<<((maxQueryOwners-1)%64)
	if !slices.Equal(set, want) {
		t.Errorf("set: the owners set differ from 5, 64 and %d", maxQueryOwners-1)
	}
	if wide.set(v, meta(0).withRun(2, uint32(len(v.arena))), set) {
		t.Error("set: a run past the arena's end reported read")
	}
	clear(set)
	if !wide.set(v, newMeta(7, 3, TierGPU, entryLive), set) || !slices.Equal(set[:2], []uint64{1 << 5, 0}) {
		t.Errorf("set of a single owner's meta word: %#x, want owner bit 5", set[:2])
	}
	if short := make([]uint64, 1); !wide.set(v, newMeta(1<<32-1, 6, TierGPU, entryLive), short) || short[0] != 0 {
		t.Errorf("set of an owner past a short set: %#x, want nothing set", short)
	}
}

// TestLookupJudgesOwnersAtItsStart: an owner cleared while a lookup reads the prompt is judged
// at the lookup's start, as if the clear came after it (askTable); the next lookup sees it.
func TestLookupJudgesOwnersAtItsStart(t *testing.T) {
	const bs = 16
	var clearing OwnerID
	x, err := New(Config{Shards: 2, MaxBlocks: 1 << 16, BlockKey: BlockKeyRouter,
		matchRest: func(x *Index, sc *lookupScratch, w, n int) (int, bool) {
			if clearing != 0 {
				x.Owners().Clear(clearing) // after block 0 was read
			}
			return x.matchDirect(sc, w, 1, n, true)
		}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = x.Close() })
	prompt := seqTokens(1, 100*bs)
	a, b := register(t, x, "a", 1, bs)[0], register(t, x, "b", 1, bs)[0]
	hold(t, x, a, prompt, bs, TierGPU)
	hold(t, x, b, prompt, bs, TierGPU)
	var l kv.Lookup
	clearing = a
	if err := x.Lookup(context.Background(), "m", prompt, &l); err != nil {
		t.Fatal(err)
	}
	if l.Tokens("a") != int64(len(prompt)) || l.Tokens("b") != int64(len(prompt)) {
		t.Errorf("during the clear: a holds %d tokens, b %d, want %d each", l.Tokens("a"), l.Tokens("b"), len(prompt))
	}
	clearing = 0
	if err := x.Lookup(context.Background(), "m", prompt, &l); err != nil {
		t.Fatal(err)
	}
	if l.Tokens("a") != 0 || l.Tokens("b") != int64(len(prompt)) {
		t.Errorf("after the clear: a holds %d tokens, b %d, want 0 and %d", l.Tokens("a"), l.Tokens("b"), len(prompt))
	}
}

// TestAskKeepsTablesUntilAClear: a lookup scratch's owner tables are built for a match's
// owners and kept for the next match of the same owners, rebuilt after a clear (at the new
// epoch) and for other owners (whose old entries are cleared).
func TestAskKeepsTablesUntilAClear(t *testing.T) {
	reg := NewOwners()
	a, err := reg.SetWorker("a", "m", 2, 16)
	if err != nil {
		t.Fatal(err)
	}
	b, err := reg.SetWorker("b", "m", 1, 16)
	if err != nil {
		t.Fatal(err)
	}
	sc := &lookupScratch{bits: make([]uint16, 8), asked: make(askTable, 8)}
	sc.asked[0].key = askNone
	check := func(step string, want ...OwnerID) {
		t.Helper()
		for id := OwnerID(1); id < 8; id++ {
			bit := slices.Index(want, id)
			got, ok := sc.asked.bit(packSlot(slot{reg.Epoch(id), uint16(id), TierGPU}))
			switch {
			case bit < 0 && (sc.bits[id] != 0 || sc.asked[id] != askEntry{}):
				t.Errorf("%s: owner %d not asked has bits %d, entry %+v", step, id, sc.bits[id], sc.asked[id])
			case bit >= 0 && (sc.bits[id] != uint16(bit+1) || !ok || got != uint64(bit)):
				t.Errorf("%s: owner %d has bits %d, bit %d %v at its epoch, want bit %d", step, id, sc.bits[id], got, ok, bit)
			}
		}
	}
	g := []OwnerID{a[0], a[1], b[0]}
	sc.ask(reg, g)
	check("built", g...)
	sc.ask(reg, g)
	check("kept", g...)
	reg.Clear(a[1])
	sc.ask(reg, g)
	check("after a clear", g...)
	sc.ask(reg, b)
	check("other owners", b...)
	sc.ask(reg, slices.Clone(b))
	check("the same owners in another slice", b...)
}

// bit returns the bit number of record v's owner (a packed slot, or a single owner's meta
// word, which shares its layout in bits 0-47), and whether the owner is asked about and v is
// of its epoch.
func (t askTable) bit(v uint64) (uint64, bool) {
	o := uint16(v >> 32)
	if int(o) >= len(t) {
		return 0, false
	}
	r := t[o].key
	return r >> 48, (v^r)<<16 == 0
}
