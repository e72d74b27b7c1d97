package index

import (
	"context"
	"errors"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"switchyard/kv"
	"switchyard/kv/events"
	"switchyard/kv/hashing"
)

// seqTokens returns n tokens starting at base.
func seqTokens(base, n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = uint32(base + i)
	}
	return out
}

// newTestIndex returns an index of shards shards and maxBlocks blocks on locked shards.
func newTestIndex(t testing.TB, shards, maxBlocks int) *Index {
	t.Helper()
	return newKeyedIndex(t, shards, maxBlocks, BlockKeyEngine)
}

// newKeyedIndex is newTestIndex keyed by key (Config.BlockKey).
func newKeyedIndex(t testing.TB, shards, maxBlocks int, key string) *Index {
	t.Helper()
	x, err := New(Config{Shards: shards, MaxBlocks: maxBlocks, BlockKey: key})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = x.Close() })
	return x
}

// register registers worker with dp ranks and block size bs for model "m".
func register(t testing.TB, x *Index, worker string, dp, bs int) []OwnerID {
	t.Helper()
	ids, err := x.SetWorker(worker, "m", dp, bs)
	if err != nil {
		t.Fatal(err)
	}
	return ids
}

// hold stores the blocks of tokens for owner id in tiers, under the index's keys.
func hold(t testing.TB, x *Index, id OwnerID, tokens []uint32, bs int, tiers Tiers) []int64 {
	t.Helper()
	hs := x.AppendBlockKeys(nil, tokens, bs)
	w := x.NewWriter()
	for _, h := range hs {
		w.Store(id, x.Owners().Epoch(id), h, tiers)
	}
	if d := w.Flush(); d != 0 {
		t.Fatalf("%d ops dropped", d)
	}
	return hs
}

func drop(t testing.TB, x *Index, id OwnerID, hashes []int64, tiers Tiers) {
	t.Helper()
	w := x.NewWriter()
	for _, h := range hashes {
		w.Remove(id, x.Owners().Epoch(id), h, tiers)
	}
	w.Flush()
}

func lookup(t testing.TB, x *Index, model string, tokens []uint32) map[string]int64 {
	t.Helper()
	var l kv.Lookup
	// A deadline of its own: the index's default (100 ms) is not what these tests check, and
	// a loaded machine can take longer (a lookup falling back to the host, say).
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := x.Lookup(ctx, model, tokens, &l); err != nil {
		t.Fatal(err)
	}
	if !slices.IsSortedFunc(l.Matches, func(a, b kv.Match) int { return compareStrings(a.Worker, b.Worker) }) {
		t.Fatalf("matches not sorted: %v", l.Matches)
	}
	out := map[string]int64{}
	for _, m := range l.Matches {
		if _, dup := out[m.Worker]; dup {
			t.Fatalf("worker %s twice in %v", m.Worker, l.Matches)
		}
		out[m.Worker] = m.Tokens
	}
	return out
}

func compareStrings(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func TestIndexDefaultShardsOnePerCore(t *testing.T) {
	for _, shards := range []int{0, -1} {
		x, err := New(Config{Shards: shards})
		if err != nil {
			t.Fatal(err)
		}
		if got, want := x.Shards(), runtime.GOMAXPROCS(0); got != want {
			t.Errorf("Shards %d: %d shards, want GOMAXPROCS = %d", shards, got, want)
		}
		_ = x.Close()
	}
	x := newTestIndex(t, 3, 1024)
	if got := x.Shards(); got != 3 {
		t.Errorf("Shards 3: %d shards", got)
	}
}

func TestIndexLongestPrefixPerWorker(t *testing.T) {
	prompt := seqTokens(0, 1000) // 62 whole blocks of 16 and a short one
	tests := []struct {
		name  string
		setup func(t *testing.T, x *Index)
		want  map[string]int64
	}{
		{"empty index", func(t *testing.T, x *Index) {}, map[string]int64{}},
		{"whole prompt including the short block", func(t *testing.T, x *Index) {
			hold(t, x, register(t, x, "a", 1, 16)[0], prompt, 16, TierGPU)
		}, map[string]int64{"a": 1000}},
		{"a shorter shared prefix", func(t *testing.T, x *Index) {
			hold(t, x, register(t, x, "a", 1, 16)[0], prompt[:320], 16, TierGPU)
			hold(t, x, register(t, x, "b", 1, 16)[0], prompt[:64], 16, TierGPU)
		}, map[string]int64{"a": 320, "b": 64}},
		{"a diverging suffix does not count", func(t *testing.T, x *Index) {
			other := append(slices.Clone(prompt[:160]), seqTokens(50000, 200)...)
			hold(t, x, register(t, x, "a", 1, 16)[0], other, 16, TierGPU)
		}, map[string]int64{"a": 160}},
		{"a hole stops the prefix", func(t *testing.T, x *Index) {
			id := register(t, x, "a", 1, 16)[0]
			hs := hold(t, x, id, prompt[:480], 16, TierGPU)
			drop(t, x, id, hs[10:11], AllTiers)
		}, map[string]int64{"a": 160}},
		{"any tier counts", func(t *testing.T, x *Index) {
			id := register(t, x, "a", 1, 16)[0]
			hold(t, x, id, prompt[:320], 16, TierGPU)
			hold(t, x, id, prompt[:640], 16, TierCPUPinned)
		}, map[string]int64{"a": 640}},
		{"removing one tier keeps the other", func(t *testing.T, x *Index) {
			id := register(t, x, "a", 1, 16)[0]
			hs := hold(t, x, id, prompt[:320], 16, TierGPU|TierDisk)
			drop(t, x, id, hs, TierGPU)
		}, map[string]int64{"a": 320}},
		{"a remove without medium clears every tier", func(t *testing.T, x *Index) {
			id := register(t, x, "a", 1, 16)[0]
			hs := hold(t, x, id, prompt[:320], 16, TierGPU|TierDisk|TierExternal)
			drop(t, x, id, hs[:1], RemoveTiers(events.MediumNone))
		}, map[string]int64{}},
		{"DP ranks: the best rank counts", func(t *testing.T, x *Index) {
			ids := register(t, x, "a", 2, 16)
			hold(t, x, ids[0], prompt[:64], 16, TierGPU)
			hold(t, x, ids[1], prompt[:512], 16, TierGPU)
		}, map[string]int64{"a": 512}},
		{"block sizes per engine", func(t *testing.T, x *Index) {
			hold(t, x, register(t, x, "a", 1, 16)[0], prompt[:256], 16, TierGPU)
			hold(t, x, register(t, x, "b", 1, 64)[0], prompt[:512], 64, TierGPU)
		}, map[string]int64{"a": 256, "b": 512}},
		{"other models are not candidates", func(t *testing.T, x *Index) {
			ids, _ := x.SetWorker("z", "other", 1, 16)
			hold(t, x, ids[0], prompt, 16, TierGPU)
		}, map[string]int64{}},
		{"many owners of one block", func(t *testing.T, x *Index) {
			for _, w := range []string{"a", "b", "c", "d", "e"} {
				hold(t, x, register(t, x, w, 1, 16)[0], prompt[:96], 16, TierGPU)
			}
		}, map[string]int64{"a": 96, "b": 96, "c": 96, "d": 96, "e": 96}},
	}
	for _, key := range []string{BlockKeyEngine, BlockKeyRouter} {
		for _, shards := range []int{1, 3, 8} {
			for _, tt := range tests {
				t.Run(key+"/"+tt.name, func(t *testing.T) {
					x := newKeyedIndex(t, shards, 1<<20, key)
					tt.setup(t, x)
					got := lookup(t, x, "m", prompt)
					if len(got) != len(tt.want) {
						t.Fatalf("shards=%d: got %v, want %v", shards, got, tt.want)
					}
					for w, n := range tt.want {
						if got[w] != n {
							t.Fatalf("shards=%d: got %v, want %v", shards, got, tt.want)
						}
					}
				})
			}
		}
	}
}

// TestIndexLookupNamesRanks: a worker's match names the DP ranks holding its longest prefix
// (several when they tie), in Lookup, MatchHashes and the memo.
func TestIndexLookupNamesRanks(t *testing.T) {
	prompt := seqTokens(0, 640)
	for _, shards := range []int{1, 3} {
		x := newTestIndex(t, shards, 1<<20)
		ids := register(t, x, "a", 4, 16)
		hold(t, x, ids[0], prompt[:64], 16, TierGPU)
		hold(t, x, ids[1], prompt[:512], 16, TierGPU)
		hold(t, x, ids[3], prompt[:512], 16, TierGPU)
		hold(t, x, register(t, x, "b", 1, 16)[0], prompt[:32], 16, TierGPU)
		var l kv.Lookup
		if err := x.Lookup(context.Background(), "m", prompt, &l); err != nil {
			t.Fatal(err)
		}
		if l.Tokens("a") != 512 || l.Ranks("a") != 1<<1|1<<3 || l.Tokens("b") != 32 || l.Ranks("b") != 1 {
			t.Fatalf("shards=%d: %+v", shards, l.Matches)
		}
		var h kv.Lookup
		if err := x.MatchHashes(context.Background(), "m", 16, hashing.AppendBlockHashes(nil, prompt, 16), len(prompt), &h); err != nil ||
			!slices.Equal(h.Matches, l.Matches) {
			t.Fatalf("shards=%d: MatchHashes %+v %v, Lookup %+v", shards, h.Matches, err, l.Matches)
		}
		memo := kv.NewPrefixMemo("m", prompt)
		memo.Resolve(context.Background(), x)
		if memo.MatchedRanks("a") != 1<<1|1<<3 || memo.MatchedRanks("c") != 0 {
			t.Fatalf("shards=%d: memo ranks %b", shards, memo.MatchedRanks("a"))
		}
	}
}

func TestIndexLongPromptAcrossWaves(t *testing.T) {
	for _, key := range []string{BlockKeyEngine, BlockKeyRouter} {
		x := newKeyedIndex(t, 4, 1<<20, key)
		prompt := seqTokens(7, 100_000)
		hold(t, x, register(t, x, "full", 1, 16)[0], prompt, 16, TierGPU)
		hold(t, x, register(t, x, "half", 1, 16)[0], prompt[:50_000], 16, TierGPU)
		hold(t, x, register(t, x, "edge", 1, 16)[0], prompt[:64*16], 16, TierGPU) // exactly the first wave
		got := lookup(t, x, "m", prompt)
		if got["full"] != 100_000 || got["half"] != 50_000 || got["edge"] != 1024 {
			t.Fatalf("%s: got %v", key, got)
		}
	}
}

func TestIndexClearsAreImmediate(t *testing.T) {
	x := newTestIndex(t, 4, 1<<20)
	prompt := seqTokens(0, 512)
	a := register(t, x, "a", 2, 16)
	b := register(t, x, "b", 1, 16)
	hold(t, x, a[0], prompt, 16, TierGPU)
	hold(t, x, a[1], prompt[:128], 16, TierGPU)
	hold(t, x, b[0], prompt, 16, TierGPU)

	x.Owners().Clear(a[0]) // engine restart of rank 0
	if got := lookup(t, x, "m", prompt); got["a"] != 128 || got["b"] != 512 {
		t.Fatalf("after clearing rank 0: %v", got)
	}
	// Operations stamped before the clear are dropped when they arrive late.
	stale := x.Owners().Epoch(a[0]) - 1
	w := x.NewWriter()
	for _, h := range hashing.AppendBlockHashes(nil, prompt, 16) {
		w.Store(a[0], stale, h, TierGPU)
	}
	w.Flush()
	if got := lookup(t, x, "m", prompt); got["a"] != 128 {
		t.Fatalf("a late stale store resurrected ownership: %v", got)
	}
	if !x.RemoveWorker("a") || x.RemoveWorker("a") {
		t.Fatal("RemoveWorker reports")
	}
	if got := lookup(t, x, "m", prompt); len(got) != 1 || got["b"] != 512 {
		t.Fatalf("after removal: %v", got)
	}
	st := x.Stats()
	if st.Blocks != 32 || st.Pruned == 0 {
		t.Fatalf("removal did not prune: %+v", st)
	}
	// A reused owner ID starts clean.
	c := register(t, x, "c", 2, 16)
	if !slices.Contains(c, a[0]) && !slices.Contains(c, a[1]) {
		t.Fatalf("owner IDs %v not reused from %v", c, a)
	}
	if got := lookup(t, x, "m", prompt); got["c"] != 0 {
		t.Fatalf("reused IDs inherited blocks: %v", got)
	}
}

func TestIndexMemoryBoundEvictsLeastRecentlyUsed(t *testing.T) {
	x := newTestIndex(t, 1, 100)
	id := register(t, x, "a", 1, 16)[0]
	hot := seqTokens(0, 16*40)
	hold(t, x, id, hot, 16, TierGPU)
	for i := range 20 {
		// Keep the hot prefix referenced while cold blocks stream in.
		if got := lookup(t, x, "m", hot); got["a"] != int64(len(hot)) {
			t.Fatalf("round %d: hot prefix lost: %v", i, got)
		}
		hold(t, x, id, seqTokens(1_000_000+i*1000, 16*30), 16, TierGPU)
	}
	st := x.Stats()
	if st.Blocks > 100 || st.Evicted == 0 {
		t.Fatalf("bound not enforced: %+v", st)
	}
	if got := lookup(t, x, "m", hot); got["a"] != int64(len(hot)) {
		t.Fatalf("hot prefix evicted: %v", got)
	}
}

func TestShardSpillAndPrune(t *testing.T) {
	owners, ids := testOwners(t, "a", "b", "c", "d")
	s := NewShard(owners, 10)
	b := &ShardBatch{}
	for _, id := range ids {
		b.Ops = append(b.Ops, ShardOp{Hash: 42, Owner: uint16(id), Epoch: owners.Epoch(id), Tiers: TierGPU})
	}
	s.Apply(b)
	if st := s.Stats(); st.Blocks != 1 || st.Spilled != 3 || st.SpillCap != 4 {
		t.Fatalf("stats %+v", st)
	}
	owners.Clear(ids[0])
	owners.Clear(ids[2])
	s.Prune()
	bitsOf := make([]uint16, 8)
	for i, id := range ids {
		bitsOf[id] = uint16(i + 1)
	}
	q := &ShardQuery{Hash: []int64{42, 43}, Bits: bitsOf, Words: 1}
	s.Match(q)
	if want := uint64(1<<1 | 1<<3); len(q.Sets) != 2 || q.Sets[0] != want || q.Sets[1] != 0 {
		t.Fatalf("owner sets after prune %b, want %b and none", q.Sets, want)
	}
	if st := s.Stats(); st.Spilled != 1 || st.Pruned != 2 {
		t.Fatalf("stats after prune %+v", st)
	}
	// Removing the remaining owners deletes the block.
	s.Apply(&ShardBatch{Ops: []ShardOp{
		{Hash: 42, Owner: uint16(ids[1]), Epoch: owners.Epoch(ids[1]), Tiers: AllTiers, Remove: true},
		{Hash: 42, Owner: uint16(ids[3]), Epoch: owners.Epoch(ids[3]), Tiers: AllTiers, Remove: true},
	}})
	if st := s.Stats(); st.Blocks != 0 || st.Spilled != 0 {
		t.Fatalf("stats after removal %+v", st)
	}
}

// busyHost refuses every batch.
type busyHost struct{ *LockedShards }

func (busyHost) Apply(int, *ShardBatch) error { return ErrShardBusy }

func TestWriterClearsOwnersOfRefusedBatches(t *testing.T) {
	var host *LockedShards
	x, err := New(Config{Shards: 2, Host: func(s []*Shard) (ShardHost, error) {
		host = NewLockedShards(s)
		return host, nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	id := register(t, x, "a", 1, 16)[0]
	prompt := seqTokens(0, 320)
	hold(t, x, id, prompt, 16, TierGPU)
	x.host = busyHost{host}
	w := x.NewWriter()
	w.Remove(id, x.Owners().Epoch(id), hashing.AppendBlockHashes(nil, prompt, 16)[3], TierGPU)
	if d := w.Flush(); d != 1 {
		t.Fatalf("dropped %d", d)
	}
	x.host = host
	if got := lookup(t, x, "m", prompt); len(got) != 0 {
		t.Fatalf("a lost remove left stale ownership: %v", got)
	}
	if c := x.Metrics().Ingest(); c.OpsDroppedBusy != 1 || c.ClearsDropped != 1 {
		t.Fatalf("counts %+v", c)
	}
}

// stuckHost never answers a match.
type stuckHost struct{ *LockedShards }

func (stuckHost) Match(ctx context.Context, _ []*ShardQuery) error {
	<-ctx.Done()
	return ctx.Err()
}

// holdStripes makes every stripe of x's shards odd, as a writer does while it changes a
// block: direct reads give up and leave their queries to the host. It returns the release.
func holdStripes(x *Index) (release func()) {
	for _, s := range x.shards {
		for i := range s.seqs {
			s.seqs[i].Add(1)
		}
	}
	return func() {
		for _, s := range x.shards {
			s.seqs.release()
		}
	}
}

// TestLookupTimeoutIsUnavailable: a lookup whose reads fall back to a host that does not
// answer gives up at its deadline, unavailable.
func TestLookupTimeoutIsUnavailable(t *testing.T) {
	x, err := New(Config{Shards: 2, LookupTimeout: 1, Host: func(s []*Shard) (ShardHost, error) {
		return stuckHost{NewLockedShards(s)}, nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	register(t, x, "a", 1, 16)
	defer holdStripes(x)()
	var l kv.Lookup
	err = x.Lookup(context.Background(), "m", seqTokens(0, 64), &l)
	if !errors.Is(err, kv.ErrUnavailable) || len(l.Matches) != 0 {
		t.Fatalf("err = %v, matches %v", err, l.Matches)
	}
	if c := x.Metrics().LocalLookups(); c.Unavailable != 1 {
		t.Fatalf("counts %+v", c)
	}
}

func TestOwnersRegistration(t *testing.T) {
	o := NewOwners()
	ids, err := o.SetWorker("a", "m", 3, 16)
	if err != nil || len(ids) != 3 {
		t.Fatalf("ids %v err %v", ids, err)
	}
	e := o.Epoch(ids[2])
	again, _ := o.SetWorker("a", "m", 2, 16) // shrink: rank 2 goes away
	if !slices.Equal(again, ids[:2]) || o.Epoch(ids[2]) == e {
		t.Fatalf("shrink: %v, epoch %d→%d", again, e, o.Epoch(ids[2]))
	}
	e0 := o.Epoch(ids[0])
	if !o.SetBlockSize("a", 32) || o.Epoch(ids[0]) == e0 || o.Info(ids[0]).BlockSize != 32 {
		t.Fatal("a block-size change must clear and record")
	}
	if _, ok := o.Lookup("a", 1); !ok {
		t.Fatal("rank 1 not found")
	}
	if _, err := o.SetWorker("", "m", 1, 16); err == nil {
		t.Fatal("empty worker accepted")
	}
	if _, err := o.SetWorker("b", "m", 1, 0); err == nil {
		t.Fatal("zero block size accepted")
	}
	if o.Len() != 2 || !slices.Equal(o.Workers(), []string{"a"}) {
		t.Fatalf("len %d workers %v", o.Len(), o.Workers())
	}
}

func TestPrefixMemo(t *testing.T) {
	x := newTestIndex(t, 2, 1<<16)
	prompt := seqTokens(0, 256)
	hold(t, x, register(t, x, "a", 1, 16)[0], prompt, 16, TierGPU)
	memo := kv.NewPrefixMemo("m", prompt)
	if ok, unavailable, _ := memo.Status(); ok || !unavailable {
		t.Fatal("an unresolved memo must read as unavailable")
	}
	r := memo.Resolve(context.Background(), x)
	if r2 := memo.Resolve(context.Background(), x); r2 != r || x.Stats().Queries == 0 {
		t.Fatal("second resolve did not reuse the first")
	}
	queries := x.Stats().Queries
	memo.Resolve(context.Background(), x)
	if x.Stats().Queries != queries {
		t.Fatal("memoized lookup asked the index again")
	}
	if memo.MatchedTokens("a") != 256 || memo.MatchedTokens("b") != 0 {
		t.Fatalf("matched %d", memo.MatchedTokens("a"))
	}
	if ok, _, _ := memo.Status(); !ok {
		t.Fatal("status")
	}
	rej := memo.Resolve(context.Background(), failingSource{kv.ErrRejected})
	if ok, unavailable, err := rej.Status(); ok || unavailable || !errors.Is(err, kv.ErrRejected) {
		t.Fatalf("rejected status %v %v %v", ok, unavailable, err)
	}
	un := memo.Resolve(context.Background(), failingSource{kv.ErrUnavailable})
	if ok, unavailable, err := un.Status(); ok || !unavailable || err != nil || un.MatchedTokens("a") != 0 {
		t.Fatalf("unavailable status %v %v %v", ok, unavailable, err)
	}
	memo.Reset("m", prompt)
	if _, ok := memo.Resolved(x); ok {
		t.Fatal("reset kept an entry")
	}
}

type failingSource struct{ err error }

func (f failingSource) Lookup(context.Context, string, []uint32, *kv.Lookup) error { return f.err }

// TestLookupEveryShortPromptLength looks up every prompt length from 0 to three blocks and
// one token, for the block sizes engines use, against an index that holds each prompt: a
// prompt shorter than one block once sliced past its end on the SHA-extension path (run
// the package with -tags purego too for the crypto/sha256 path; make test does).
func TestLookupEveryShortPromptLength(t *testing.T) {
	for _, bs := range []int{1, 4, 16, 32, 64, 65} {
		x := newTestIndex(t, 2, 1<<14)
		id := register(t, x, "a", 1, bs)[0]
		for n := 0; n <= 3*bs+1; n++ {
			prompt := seqTokens(1000*bs+n*7, n)
			hold(t, x, id, prompt, bs, TierGPU)
			got := lookup(t, x, "m", prompt)
			want := map[string]int64{}
			if n > 0 {
				want["a"] = int64(n)
			}
			if len(got) != len(want) || got["a"] != want["a"] {
				t.Fatalf("block size %d, %d tokens: matches %v, want %v", bs, n, got, want)
			}
		}
	}
}

// lateHost is a ShardHost whose Match gives up at once, as a host does when the lookup's
// deadline passes, while its shards go on reading the queries (bits included) on their own
// goroutines.
type lateHost struct {
	*LockedShards
	wg sync.WaitGroup
}

func (h *lateHost) Match(_ context.Context, qs []*ShardQuery) error {
	for _, q := range qs {
		if q == nil {
			continue
		}
		h.wg.Go(func() {
			n := 0
			for _, b := range q.Bits {
				n += int(b)
			}
			_ = n
		})
	}
	return context.DeadlineExceeded
}

// TestLookupLeavesAbandonedQueriesAlone: after a lookup gave up on its shards, it must not
// write to what they may still read (the owner bits): the race detector once caught the
// cleanup of a timed-out lookup under load.
func TestLookupLeavesAbandonedQueriesAlone(t *testing.T) {
	h := &lateHost{}
	x, err := New(Config{Shards: 2, MaxBlocks: 1024, Host: func(s []*Shard) (ShardHost, error) {
		h.LockedShards = NewLockedShards(s)
		return h, nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer x.Close()
	register(t, x, "a", 1, 16)
	defer holdStripes(x)()
	var l kv.Lookup
	if err := x.Lookup(context.Background(), "m", seqTokens(0, 64), &l); !errors.Is(err, kv.ErrUnavailable) {
		t.Fatalf("lookup: %v, want ErrUnavailable", err)
	}
	h.wg.Wait()
}

// answeringHost is a host whose shards finish the write they were in (the held stripes)
// before they answer a query, as a shard actor does: it counts the queries it answers.
type answeringHost struct {
	*LockedShards
	release func()
	queries int
}

func (h *answeringHost) Match(ctx context.Context, qs []*ShardQuery) error {
	h.release()
	for _, q := range qs {
		if q != nil {
			h.queries++
		}
	}
	return h.LockedShards.Match(ctx, qs)
}

// TestLookupReadsShardsDirectly: a lookup reads the shards on its own goroutine and asks the
// host nothing; while a shard's blocks are being written under the read (held stripes) it
// falls back to the host, and gets the same answer.
func TestLookupReadsShardsDirectly(t *testing.T) {
	h := &answeringHost{}
	x, err := New(Config{Shards: 2, MaxBlocks: 1 << 16, Host: func(s []*Shard) (ShardHost, error) {
		h.LockedShards = NewLockedShards(s)
		return h, nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer x.Close()
	id := register(t, x, "a", 1, 16)[0]
	held := seqTokens(0, 16*300)
	hold(t, x, id, held, 16, TierGPU)
	h.release = func() {}
	if got := lookup(t, x, "m", held); got["a"] != int64(len(held)) || h.queries != 0 {
		t.Fatalf("direct: matched %v, %d host queries", got, h.queries)
	}
	h.release = holdStripes(x)
	if got := lookup(t, x, "m", held); got["a"] != int64(len(held)) || h.queries == 0 {
		t.Fatalf("fallback: matched %v, %d host queries", got, h.queries)
	}
	if st := x.Stats(); st.Fallbacks == 0 {
		t.Fatalf("no fallback counted: %+v", st)
	}
}
