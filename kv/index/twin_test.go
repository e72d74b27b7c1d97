package index

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"switchyard/kv"
)

// splitAt returns a Config.matchRest that matches blocks [1, n) as the twin and the lookup
// goroutine do, in two parts split at the block *m (n when *m > n), both on the lookup
// goroutine, the back part first so that it cannot read anything of the front's; *m < 1
// matches them in one part (matchDirect), the single-goroutine matcher. The twin keys the
// back part from the last key the front part published: by turns none past block 0, up to
// 70 blocks before m, up to m, and 64 blocks past it.
func splitAt(m *int) func(x *Index, sc *lookupScratch, w, n int) (int, bool) {
	turn := 0
	return func(x *Index, sc *lookupScratch, w, n int) (int, bool) {
		if *m < 1 {
			return x.matchDirect(sc, w, 1, n, true)
		}
		at := min(*m, n)
		turn++
		sc.reserveHashes(n)
		sc.hashUpTo([]int{1, max(1, at-70), at, min(n, at+64)}[turn%4])
		t := newTwin(MinSplitBlocks)
		t.offer(sc, w, n)
		t.keyed.Store(int64(sc.hashed))
		t.matchBack(x, at)
		frontEnd, frontAlive := x.matchDirect(sc, w, 1, at, true)
		return sc.joinBack(&t.sc, frontEnd, frontAlive, at, t.end, t.alive)
	}
}

// TestSplitMatchEqualsSingle: a lookup matched in two parts split at block m gives every
// owner what the single-goroutine matcher gives it, over random indexes and prompts (fixed
// seed) and split points at every edge: m at 1 (no front part), 2, a batch's edge, the
// middle, n-1 and n (no back part); owners whose prefix ends at m-1, m and m+1, at 0 and 1
// blocks, and at the whole prompt; a block removed past m; owners cleared (a new epoch) and
// holding a shorter prefix again; queries of one, two and three words; and a block whose
// stripe a writer holds before, at and after m (the rest left to the shards' host).
func TestSplitMatchEqualsSingle(t *testing.T) {
	rng := rand.New(rand.NewPCG(13, 20))
	for round := range 24 {
		owners := []int{12, 100, 140}[round%3]
		t.Run(fmt.Sprintf("round=%d/owners=%d", round, owners), func(t *testing.T) {
			h := &answeringHost{release: func() {}}
			var m int
			x, err := New(Config{Shards: 3, MaxBlocks: 1 << 20, BlockKey: BlockKeyRouter, matchRest: splitAt(&m), Host: func(s []*Shard) (ShardHost, error) {
				h.LockedShards = NewLockedShards(s)
				return h, nil
			}})
			if err != nil {
				t.Fatal(err)
			}
			defer x.Close()
			n := 200 + rng.IntN(400)
			prompt := make([]uint32, n*16-rng.IntN(2)*5) // sometimes a short last block
			for i := range prompt {
				prompt[i] = rng.Uint32()
			}
			focus := 2 + rng.IntN(n-3) // the split the owners' prefixes gather around
			splits := []int{1, 2, pipeBatch, n / 2, n - 1, n, focus - 1, focus, focus + 1, 1 + rng.IntN(n)}
			var keys []int64
			for i := range owners {
				id := register(t, x, fmt.Sprintf("w%03d", i), 1, 16)[0]
				var held int
				switch i % 10 {
				case 0:
					held = n
				case 1:
					held = 1
				case 2, 3, 4, 5:
					held = focus - 1 + i%10 - 2 // focus-1 … focus+2
				case 6:
					held = focus + rng.IntN(n-focus+1)
				default:
					held = rng.IntN(n + 1)
				}
				if held == 0 {
					continue
				}
				hs := hold(t, x, id, prompt[:min(len(prompt), held*16)], 16, TierGPU)
				if len(hs) == n {
					keys = hs
				}
				switch rng.IntN(6) {
				case 0: // a block removed past the focus
					if cut := focus + 1; cut < len(hs) {
						drop(t, x, id, hs[cut:cut+1], TierGPU)
					}
				case 1: // cleared, then a shorter prefix held at the new epoch
					x.ClearOwner(id, kv.ClearRemoved)
					hold(t, x, id, prompt[:min(len(prompt), (held/2)*16)], 16, TierGPU)
				}
			}
			if keys == nil {
				keys = x.AppendBlockKeys(nil, prompt, 16)
			}
			// Some rounds hold a stripe while each lookup reads: a writer mid-change.
			var held int64
			stripe := -1
			if round%4 == 3 {
				stripe = []int{focus - 1, focus, focus + 1}[rng.IntN(3)]
				held = keys[stripe]
			}
			look := func() map[string]int64 {
				t.Helper()
				if stripe >= 0 {
					s := x.shards[x.shardOf(held)]
					s.seqs.of(held).Add(1)
					h.release = func() { s.seqs.release() }
				}
				got := lookup(t, x, "m", prompt)
				h.release()
				h.release = func() {}
				return got
			}
			m = 0
			want := look()
			if len(want) == 0 {
				t.Fatal("the single matcher matched nobody: the fixture is wrong")
			}
			for _, at := range splits {
				m = at
				if got := look(); !maps.Equal(got, want) {
					t.Fatalf("split at %d of %d blocks (focus %d, stripe %d): %s", at, n, focus, stripe, mapDiff(got, want))
				}
			}
		})
	}
}

// TestTwinLookupsEqualAlone: lookups of long prompts on an index with its twin (some of them
// from two goroutines at once, so that one finds it busy) give what the same holds give on
// an index without it, and Close stops the twin's goroutine.
func TestTwinLookupsEqualAlone(t *testing.T) {
	x := newSplitIndex(t)
	alone := newKeyedIndex(t, 2, 1<<20, BlockKeyRouter)
	if x.twin == nil || alone.twin != nil {
		t.Fatalf("twins: %v with, %v alone", x.twin != nil, alone.twin != nil)
	}
	rng := rand.New(rand.NewPCG(20, 13))
	const n = 2 * MinSplitBlocks
	prompts := make([][]uint32, 4)
	for i := range prompts {
		prompts[i] = make([]uint32, n*16)
		for k := range prompts[i] {
			prompts[i][k] = rng.Uint32()
		}
	}
	for i := range 20 {
		p := prompts[i%len(prompts)]
		held := []int{n, n / 2, n/2 - 1, n/2 + 1, 1, MinSplitBlocks, rng.IntN(n + 1)}[i%7]
		for _, y := range []*Index{x, alone} {
			if held > 0 {
				hold(t, y, register(t, y, fmt.Sprintf("w%02d", i), 1, 16)[0], p[:held*16], 16, TierGPU)
			} else {
				register(t, y, fmt.Sprintf("w%02d", i), 1, 16)
			}
		}
	}
	want := make([]map[string]int64, len(prompts))
	for i, p := range prompts {
		want[i] = lookup(t, alone, "m", p)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	for g := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var l kv.Lookup
			for r := range 50 {
				i := (g + r) % len(prompts)
				if err := x.Lookup(ctx, "m", prompts[i], &l); err != nil {
					errs <- err
					return
				}
				got := map[string]int64{}
				for _, m := range l.Matches {
					got[m.Worker] = m.Tokens
				}
				if !maps.Equal(got, want[i]) {
					errs <- fmt.Errorf("lookup %d of prompt %d: %v, want %v", r, i, got, want[i])
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	closeStopsTwin(t, x)
	if got := lookup(t, x, "m", prompts[0]); !maps.Equal(got, want[0]) {
		t.Fatalf("after Close (no twin): %v, want %v", got, want[0])
	}
}

// TestSplitBlocksSwitch: Config.SplitBlocks is off by default and then no index has a twin;
// on, only an index keyed by the router's keys on more than one processor has one, which
// starts its goroutine with the first lookup of at least SplitBlocks blocks (not before),
// and Close stops it; a value between 0 and MinSplitBlocks is refused.
func TestSplitBlocksSwitch(t *testing.T) {
	tests := []struct {
		name     string
		key      string
		split    int
		procs    int  // GOMAXPROCS while New runs; 0: as it is
		wantTwin bool // the index has a twin
		wantErr  bool
	}{
		{name: "off, engine keys", key: BlockKeyEngine},
		{name: "off, router keys", key: BlockKeyRouter},
		{name: "on, engine keys: ignored", key: BlockKeyEngine, split: MinSplitBlocks},
		{name: "on, router keys", key: BlockKeyRouter, split: MinSplitBlocks, procs: 2, wantTwin: true},
		{name: "on, router keys, higher", key: BlockKeyRouter, split: 3 * MinSplitBlocks / 2, procs: 2, wantTwin: true},
		{name: "on, one processor: ignored", key: BlockKeyRouter, split: MinSplitBlocks, procs: 1},
		{name: "below the least", key: BlockKeyRouter, split: MinSplitBlocks - 1, wantErr: true},
		{name: "one block", key: BlockKeyEngine, split: 1, wantErr: true},
		{name: "negative", key: BlockKeyRouter, split: -1, wantErr: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if tc.procs > 0 {
				defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(tc.procs))
			}
			x, err := New(Config{Shards: 2, MaxBlocks: 1 << 20, BlockKey: tc.key, SplitBlocks: tc.split})
			if tc.wantErr {
				if err == nil {
					x.Close()
				}
				if err == nil || !strings.Contains(err.Error(), "split blocks") {
					t.Fatalf("got %v, want an error naming the split blocks", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer x.Close()
			if (x.twin != nil) != tc.wantTwin || (x.SplitBlocks() != 0) != tc.wantTwin {
				t.Fatalf("twin %v (SplitBlocks %d), want %v", x.twin != nil, x.SplitBlocks(), tc.wantTwin)
			}
			split := max(tc.split, MinSplitBlocks)
			prompt := seqTokens(5, 16*(split+MinSplitBlocks))
			id := register(t, x, "w", 1, 16)[0]
			hold(t, x, id, prompt, 16, TierGPU)
			want := map[string]int64{"w": int64(16 * (split - 1))}
			if got := lookup(t, x, "m", prompt[:16*(split-1)]); !maps.Equal(got, want) { // one block short
				t.Fatalf("short lookup: %s", mapDiff(got, want))
			}
			if x.twin != nil && x.twin.started {
				t.Fatalf("a lookup of %d blocks started the twin of an index splitting %d", split-1, split)
			}
			want = map[string]int64{"w": int64(len(prompt))}
			if got := lookup(t, x, "m", prompt); !maps.Equal(got, want) {
				t.Fatalf("long lookup: %s", mapDiff(got, want))
			}
			if x.twin == nil {
				return
			}
			if !x.twin.started {
				t.Fatalf("a lookup of %d blocks did not start the twin of an index splitting %d", len(prompt)/16, split)
			}
			closeStopsTwin(t, x)
		})
	}
}

// TestTwinWithdrawn: a back part the twin has not taken by the time the front part is
// matched is matched by the lookup goroutine, which releases the twin for the next lookup at
// once; the twin's wake-up, when it runs, does not touch the withdrawn job, and the twin
// serves the lookups after it.
func TestTwinWithdrawn(t *testing.T) {
	x := newKeyedIndex(t, 2, 1<<20, BlockKeyRouter)
	tw := newTwin(MinSplitBlocks)
	tw.started = true // but not running: every job waits
	tw.live.Store(true)
	x.twin = tw
	running := false
	t.Cleanup(func() {
		if !running { // so that Close, which waits for it, returns
			go tw.run(x)
		}
	})
	prompt := seqTokens(3, 16*2*MinSplitBlocks)
	hold(t, x, register(t, x, "full", 1, 16)[0], prompt, 16, TierGPU)
	hold(t, x, register(t, x, "front", 1, 16)[0], prompt[:16*MinSplitBlocks-16], 16, TierGPU)
	hold(t, x, register(t, x, "back", 1, 16)[0], prompt[:16*MinSplitBlocks+16], 16, TierGPU)
	want := map[string]int64{"full": int64(len(prompt)), "front": 16*MinSplitBlocks - 16, "back": 16*MinSplitBlocks + 16}
	for i := range 3 { // the later ones find the first wake-up still queued
		if got := lookup(t, x, "m", prompt); !maps.Equal(got, want) {
			t.Fatalf("withdrawn %d: %s", i, mapDiff(got, want))
		}
		if tw.busy.Load() || len(tw.jobs) != 1 || tw.state.Load() != twinWithdrawn || tw.sc.tokens != nil {
			t.Fatalf("withdrawn %d: busy %v, %d wake-ups queued, state %d, prompt kept %v: want the job withdrawn, the twin free",
				i, tw.busy.Load(), len(tw.jobs), tw.state.Load(), tw.sc.tokens != nil)
		}
	}
	running = true
	go tw.run(x)
	for i := range 20 {
		if got := lookup(t, x, "m", prompt); !maps.Equal(got, want) {
			t.Fatalf("lookup %d with the twin running: %s", i, mapDiff(got, want))
		}
	}
}

// closeStopsTwin closes x, whose twin started, and fails unless its goroutine has returned
// and a long lookup after it would match alone.
func closeStopsTwin(t *testing.T, x *Index) {
	t.Helper()
	if err := x.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-x.twin.ended:
	default:
		t.Fatal("Close left the twin running")
	}
	if x.twin.acquire(x, x.twin.minBlocks) {
		t.Fatal("a lookup after Close was offered to the stopped twin")
	}
}

// mapDiff lists the workers whose matches differ, as "worker got/want".
func mapDiff(got, want map[string]int64) string {
	var out []string
	for w := range maps.Keys(got) {
		if got[w] != want[w] {
			out = append(out, fmt.Sprintf("%s %d/%d", w, got[w], want[w]))
		}
	}
	for w := range maps.Keys(want) {
		if _, ok := got[w]; !ok {
			out = append(out, fmt.Sprintf("%s missing/%d", w, want[w]))
		}
	}
	slices.Sort(out)
	return strings.Join(out, ", ")
}

// newSplitIndex returns a router-keyed index that splits lookups of MinSplitBlocks blocks or
// more (it has a twin), closed when the test ends; it skips the test on one processor, where
// an index has no twin.
func newSplitIndex(t *testing.T) *Index {
	t.Helper()
	if runtime.GOMAXPROCS(0) < 2 {
		t.Skip("no twin on one processor")
	}
	x, err := New(Config{Shards: 2, MaxBlocks: 1 << 20, BlockKey: BlockKeyRouter, SplitBlocks: MinSplitBlocks})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = x.Close() })
	return x
}
