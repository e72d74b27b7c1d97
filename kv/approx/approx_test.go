package approx

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/VictoriaMetrics/metrics"

	"switchyard/kv"
	"switchyard/kv/index"
)

func seqOf(vals ...uint32) []uint32 { return vals }

// ramp returns n symbols starting at from.
func ramp(from, n int) []uint32 {
	s := make([]uint32, n)
	for i := range s {
		s[i] = uint32(from + i)
	}
	return s
}

func newTestTree() (*approxTree, func(string) *atomic.Int64, map[string]*atomic.Int64) {
	counters := map[string]*atomic.Int64{}
	res := func(w string) *atomic.Int64 {
		if counters[w] == nil {
			counters[w] = new(atomic.Int64)
		}
		return counters[w]
	}
	return newApproxTree(), res, counters
}

func matchMap(ms []kv.Match) map[string]int64 {
	out := map[string]int64{}
	for _, m := range ms {
		out[m.Worker] = m.Tokens
	}
	return out
}

// checkTree verifies the tree's invariants: a holder of a node holds its parent, every
// tenant's size is the symbols of the nodes it holds, the totals add up, no node is empty.
func checkTree(t *testing.T, tr *approxTree, counters map[string]*atomic.Int64) {
	t.Helper()
	sizes := make([]int64, len(tr.tenants))
	var total, nodes int64
	tr.walk(&tr.root, func(n *approxNode) {
		if n == &tr.root {
			return
		}
		nodes++
		total += int64(len(n.edge))
		if len(n.edge) == 0 {
			t.Fatalf("node with an empty edge")
		}
		if len(n.holders) == 0 {
			t.Fatalf("node %v has no holder", n.edge)
		}
		if n.parent.children[n.edge[0]] != n {
			t.Fatalf("node %v is not its parent's child", n.edge)
		}
		for _, h := range n.holders {
			sizes[h.tenant] += int64(len(n.edge))
			if n.parent != &tr.root && n.parent.holder(h.tenant) < 0 {
				t.Fatalf("tenant %q holds %v but not its parent", tr.tenants[h.tenant].id, n.edge)
			}
		}
	})
	if total != tr.total || nodes != tr.nodes {
		t.Fatalf("tree counts %d symbols in %d nodes, walk finds %d in %d", tr.total, tr.nodes, total, nodes)
	}
	for i, tn := range tr.tenants {
		if tn.live && tn.size != sizes[i] {
			t.Fatalf("tenant %q size %d, holds %d", tn.id, tn.size, sizes[i])
		}
	}
	for w, c := range counters {
		var want int64
		if i, ok := tr.tenantIdx[w]; ok {
			want = tr.tenants[i].size
		}
		if c.Load() != want {
			t.Fatalf("resident counter of %q = %d, tree holds %d", w, c.Load(), want)
		}
	}
}

func TestApproxTreeMatch(t *testing.T) {
	tr, res, counters := newTestTree()
	a, b := tr.tenant("a", res), tr.tenant("b", res)
	tr.insert(seqOf(1, 2, 3, 4, 5, 6), a)
	tr.insert(seqOf(1, 2, 3, 9, 9), b) // splits after 1,2,3
	tr.insert(seqOf(1, 2, 3, 4), b)    // b now holds 1,2,3,4 (splits 4 from 5,6)
	tr.insert(seqOf(7, 7), a)
	checkTree(t, tr, counters)
	tests := []struct {
		q    []uint32
		want map[string]int64
	}{
		{seqOf(1, 2, 3, 4, 5, 6, 7), map[string]int64{"a": 6, "b": 4}},
		{seqOf(1, 2, 3, 4, 5), map[string]int64{"a": 5, "b": 4}},
		{seqOf(1, 2, 3, 9), map[string]int64{"a": 3, "b": 4}},
		{seqOf(1, 2), map[string]int64{"a": 2, "b": 2}},
		{seqOf(7, 7, 7), map[string]int64{"a": 2}},
		{seqOf(8), map[string]int64{}},
		{nil, map[string]int64{}},
	}
	for _, tt := range tests {
		got := matchMap(tr.match(tt.q, nil))
		if fmt.Sprint(got) != fmt.Sprint(tt.want) {
			t.Errorf("match(%v) = %v, want %v", tt.q, got, tt.want)
		}
	}
	// a: 1,2,3 + 4 + 5,6 + 7,7 = 8 symbols; b: 1,2,3 + 9,9 + 4 = 6.
	if got := [2]int64{counters["a"].Load(), counters["b"].Load()}; got != [2]int64{8, 6} {
		t.Errorf("resident = %v, want [8 6]", got)
	}
	if tr.total != 10 { // 1,2,3 | 4 | 5,6 | 9,9 | 7,7
		t.Errorf("total = %d, want 10", tr.total)
	}
}

func TestApproxTreeEvictsLeastRecentlyUsed(t *testing.T) {
	tr, res, counters := newTestTree()
	a := tr.tenant("a", res)
	tr.insert(ramp(100, 10), a) // oldest
	tr.insert(ramp(200, 10), a)
	tr.insert(ramp(300, 10), a)
	tr.insert(ramp(100, 10), a) // touched again: now the newest
	if got := tr.evict(20); got != 10 {
		t.Fatalf("evicted %d symbols, want 10", got)
	}
	checkTree(t, tr, counters)
	got := matchMap(tr.match(ramp(200, 10), nil))
	if len(got) != 0 {
		t.Errorf("the least recently used prefix survived: %v", got)
	}
	for _, from := range []int{100, 300} {
		if got := matchMap(tr.match(ramp(from, 10), nil)); got["a"] != 10 {
			t.Errorf("prefix %d lost: %v", from, got)
		}
	}
	if tr.evict(20) != 0 {
		t.Errorf("a tree within budget evicted")
	}
}

func TestApproxTreeEvictionKeepsSharedPrefixForOthers(t *testing.T) {
	tr, res, counters := newTestTree()
	a, b := tr.tenant("a", res), tr.tenant("b", res)
	shared := ramp(0, 8)
	tr.insert(append(slices.Clone(shared), ramp(100, 8)...), a)
	tr.insert(append(slices.Clone(shared), ramp(200, 8)...), b)
	tr.insert(ramp(500, 8), a)
	tr.insert(ramp(600, 8), a)
	// a holds 32 symbols, b 16: trimming each to 16 releases a's oldest leaf, then its part
	// of the shared node, which stays for b; a keeps its newest prefixes.
	tr.evict(16)
	checkTree(t, tr, counters)
	if got := matchMap(tr.match(append(slices.Clone(shared), ramp(200, 8)...), nil)); got["b"] != 16 || got["a"] != 0 {
		t.Errorf("after eviction: %v, want b 16 and nothing of a", got)
	}
	for _, from := range []int{500, 600} {
		if got := matchMap(tr.match(ramp(from, 8), nil)); got["a"] != 8 {
			t.Errorf("a's prefix %d lost: %v", from, got)
		}
	}
}

func TestApproxTreeRemove(t *testing.T) {
	tr, res, counters := newTestTree()
	a, b := tr.tenant("a", res), tr.tenant("b", res)
	tr.insert(ramp(0, 20), a)
	tr.insert(ramp(0, 10), b)
	tr.insert(ramp(50, 5), b)
	tr.remove("a")
	checkTree(t, tr, counters)
	if got := matchMap(tr.match(ramp(0, 20), nil)); fmt.Sprint(got) != "map[b:10]" {
		t.Errorf("after removing a: %v", got)
	}
	if tr.total != 15 || counters["a"].Load() != 0 {
		t.Errorf("total %d, a resident %d; want 15 and 0", tr.total, counters["a"].Load())
	}
	tr.remove("b")
	tr.remove("nobody")
	checkTree(t, tr, counters)
	if tr.total != 0 || tr.nodes != 0 {
		t.Errorf("empty tree keeps %d symbols in %d nodes", tr.total, tr.nodes)
	}
	// The freed index is reused by the next tenant.
	c := tr.tenant("c", res)
	tr.insert(ramp(0, 3), c)
	checkTree(t, tr, counters)
	if c != a && c != b {
		t.Errorf("tenant index %d not reused", c)
	}
}

// TestApproxTreeRandomOps checks the invariants under a random mix of inserts, evictions
// and removals over shared prefixes.
func TestApproxTreeRandomOps(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	tr, res, counters := newTestTree()
	workers := []string{"w1", "w2", "w3", "w4"}
	for i := range 3000 {
		switch r := rng.IntN(100); {
		case r < 85:
			// Prompts from a few families sharing prefixes of random length.
			fam := rng.IntN(5)
			n := 1 + rng.IntN(40)
			seq := make([]uint32, n)
			for j := range seq {
				seq[j] = uint32(fam*1000 + j)
				if j > rng.IntN(n+1) {
					seq[j] = uint32(rng.IntN(50))
				}
			}
			tr.insert(seq, tr.tenant(workers[rng.IntN(len(workers))], res))
		case r < 95:
			tr.evict(int64(rng.IntN(200)))
		default:
			tr.remove(workers[rng.IntN(len(workers))])
		}
		if i%50 == 0 {
			checkTree(t, tr, counters)
		}
	}
	checkTree(t, tr, counters)
}

func newTestApprox(t *testing.T, shards, maxTree int) *Index {
	t.Helper()
	x, err := New(Config{Shards: shards, MaxTreeSize: maxTree})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = x.Close() })
	return x
}

func TestApproxIndexLookup(t *testing.T) {
	x := newTestApprox(t, 4, 1<<20)
	prefix := ramp(1000, 100) // longer than ShardPrefix: prompts sharing it share a shard
	x.Record("m", "w1", append(slices.Clone(prefix), ramp(1, 20)...))
	x.Record("m", "w2", ramp(5000, 50))
	x.Record("other", "w3", append(slices.Clone(prefix), ramp(1, 20)...))
	var l kv.Lookup
	if err := x.Lookup(context.Background(), "m", append(slices.Clone(prefix), ramp(7, 30)...), &l); err != nil {
		t.Fatal(err)
	}
	if l.QueryTokens != 130 || fmt.Sprint(l.Matches) != "[{w1 100 0}]" {
		t.Errorf("lookup = %d %v, want 130 [{w1 100 0}] (ranks unknown)", l.QueryTokens, l.Matches)
	}
	if got := [3]int64{x.Resident("w1"), x.Resident("w2"), x.Resident("nobody")}; got != [3]int64{120, 50, 0} {
		t.Errorf("resident = %v, want [120 50 0]", got)
	}
	x.RemoveWorker("w1")
	if err := x.Lookup(context.Background(), "m", prefix, &l); err != nil || len(l.Matches) != 0 {
		t.Errorf("after removal: %v %v", l.Matches, err)
	}
	if x.Resident("w1") != 0 {
		t.Errorf("removed worker resident %d", x.Resident("w1"))
	}
	if st := x.Stats(); st.Recorded != 3 || st.Symbols != 50+120 {
		t.Errorf("stats %+v", st)
	}
}

// TestApproxIndexBoundedBetweenEvictions: without any periodic eviction, unique prompts
// never make a shard hold more than twice each worker's budget.
func TestApproxIndexBoundedBetweenEvictions(t *testing.T) {
	const maxTree = 4096
	x := newTestApprox(t, 2, maxTree)
	for i := range 2000 {
		x.Record("m", fmt.Sprint("w", i%3), ramp(i*1000, 100))
		if s := x.Symbols(); s > 2*maxTree*3 {
			t.Fatalf("after %d prompts the tree holds %d symbols, over the bound %d", i+1, s, 2*maxTree*3)
		}
	}
	if x.Stats().BoundEvictedSymbols == 0 {
		t.Errorf("the bound never evicted")
	}
	x.Evict()
	for _, w := range []string{"w0", "w1", "w2"} {
		if r := x.Resident(w); r > maxTree {
			t.Errorf("after an eviction %s holds %d symbols, over max_tree_size %d", w, r, maxTree)
		}
	}
}

// refusingHost refuses every write and fails every query.
type refusingHost struct{}

func (refusingHost) Post(int, Op) error { return index.ErrShardBusy }
func (refusingHost) Ask(context.Context, int, *Query) error {
	return context.DeadlineExceeded
}

func TestApproxIndexRefusals(t *testing.T) {
	x, err := New(Config{Shards: 2, MaxTreeSize: 1024,
		Host: func([]*Shard) (Host, error) { return refusingHost{}, nil }})
	if err != nil {
		t.Fatal(err)
	}
	defer x.Close()
	x.Record("m", "w", ramp(0, 10))
	var l kv.Lookup
	err = x.Lookup(context.Background(), "m", ramp(0, 10), &l)
	if !errors.Is(err, kv.ErrUnavailable) {
		t.Errorf("lookup error %v, want ErrUnavailable", err)
	}
	if st := x.Stats(); st.Dropped != 1 || st.Recorded != 0 || st.Unavailable != 1 {
		t.Errorf("stats %+v", st)
	}
	if _, err := New(Config{Shards: 1, MaxTreeSize: 10}); err == nil {
		t.Error("max tree size 10 accepted")
	}
}

// TestApproxIndexCloseUnregisters: the index's series are on the set it was given while it
// runs, and gone after Close (a rebuilt index registers them afresh).
func TestApproxIndexCloseUnregisters(t *testing.T) {
	set := metrics.NewSet()
	x, err := New(Config{Shards: 2, MaxTreeSize: 1024, Metrics: set})
	if err != nil {
		t.Fatal(err)
	}
	x.Record("m", "w", ramp(0, 10))
	var b strings.Builder
	set.WritePrometheus(&b)
	for _, name := range []string{metricApproxSymbols + " 10", metricApproxRecorded + " 1", metricApproxNodes} {
		if !strings.Contains(b.String(), name) {
			t.Errorf("no %q while the index runs:\n%s", name, b.String())
		}
	}
	if err := x.Close(); err != nil {
		t.Fatal(err)
	}
	b.Reset()
	set.WritePrometheus(&b)
	if strings.Contains(b.String(), "switchyard_cache_approx_") {
		t.Errorf("series left after Close:\n%s", b.String())
	}
}

func TestTextSymbols(t *testing.T) {
	if got := TextSymbols([]uint32{9}, []byte("ab")); fmt.Sprint(got) != "[9 97 98]" {
		t.Errorf("TextSymbols = %v", got)
	}
}
