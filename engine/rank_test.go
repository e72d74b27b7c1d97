package engine

import (
	"errors"
	"slices"
	"testing"
	"time"

	"switchyard/load"
)

// rankTable publishes one report per rank of w (dp = len(reports)) at t0.
func rankTable(t testing.TB, w *Worker, reports ...load.RankReport) *load.Table {
	t.Helper()
	agg := load.NewAggregator(5 * time.Second)
	agg.SetWorker(w.ID, len(reports), w.Counters)
	for i, r := range reports {
		r.DPRank = i
		agg.Ingest(w.ID, r)
	}
	tab := load.NewTable()
	tab.Store(agg.Snapshot(t0))
	return tab
}

func dpWorker(t *testing.T, dp int) *Worker {
	w := testWorkers(t, "llama", StagePlain, "dp", 1)[0]
	w.DPSize = dp
	return w
}

func rankGroup(w *Worker, loads LoadReader, maxWaiting int64) (*EngineGroup, *Registry) {
	g := NewEngineGroup("llama", StagePlain, nil, NewRoundRobin(nil, nil))
	g.SetRankDispatch(loads, maxWaiting)
	reg, _ := NewRegistry([]*Worker{w})
	return g, reg
}

func rankOf(t *testing.T, g *EngineGroup, reg *Registry) int {
	t.Helper()
	p, err := g.Pick(reg, "b", &BucketRequest{Model: "llama", ExpectedPeak: -1, Now: t0})
	if err != nil {
		t.Fatal(err)
	}
	if !p.HasRank {
		t.Fatal("a multi-rank engine's pick has no rank")
	}
	return p.Rank
}

func TestRankDispatchWithoutReportsShares(t *testing.T) {
	w := dpWorker(t, 4)
	g, reg := rankGroup(w, nil, 0)
	counts := make([]int, 4)
	for range 40 {
		counts[rankOf(t, g, reg)]++
	}
	for r, n := range counts {
		if n != 10 {
			t.Fatalf("rank %d got %d of 40 requests: %v", r, n, counts)
		}
	}
}

func TestRankDispatchFollowsRankLoad(t *testing.T) {
	w := dpWorker(t, 2)
	// Rank 0 queues 3 requests, rank 1 none: the next three go to rank 1 (each counted as
	// one more waiting there since the report), then they alternate.
	tab := rankTable(t, w, native(4, 3, 0, 100), native(4, 0, 0, 100))
	g, reg := rankGroup(w, tab, 0)
	var got []int
	for range 5 {
		got = append(got, rankOf(t, g, reg))
	}
	want := []int{1, 1, 1, 0, 1}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("ranks %v, want %v", got, want)
		}
	}
	// A new report (rank 1 now busy) resets the correction.
	agg := load.NewAggregator(5 * time.Second)
	agg.SetWorker(w.ID, 2, w.Counters)
	r0, r1 := native(1, 0, 0, 100), native(8, 6, 0, 100)
	r0.At, r1.At = t0.Add(time.Second), t0.Add(time.Second)
	r1.DPRank = 1
	agg.Ingest(w.ID, r0)
	agg.Ingest(w.ID, r1)
	tab.Store(agg.Snapshot(t0.Add(time.Second)))
	if r := rankOf(t, g, reg); r != 0 {
		t.Fatalf("after the new report: rank %d, want 0", r)
	}
}

func TestRankDispatchPerRankCap(t *testing.T) {
	w := dpWorker(t, 2)
	tab := rankTable(t, w, native(4, 2, 0, 100), native(4, 1, 0, 100))
	g, reg := rankGroup(w, tab, 2)
	if r := rankOf(t, g, reg); r != 1 {
		t.Fatalf("rank %d, want 1 (rank 0 is at the cap)", r)
	}
	// Rank 1 now holds 1 reported + 1 sent = 2: every rank is at the cap.
	_, err := g.Pick(reg, "b", &BucketRequest{Model: "llama", ExpectedPeak: -1, Now: t0})
	var pe *PickError
	if !errors.Is(err, ErrAdmissionRejected) || !errors.As(err, &pe) || pe.Rejections[0].Limit != LimitWaitingPerRank || pe.Rejections[0].WorkerID != w.ID {
		t.Fatalf("err = %v, want a max_waiting_per_rank rejection", err)
	}
}

func TestRankDispatchOnlyForMultiRankEngines(t *testing.T) {
	w := dpWorker(t, 1)
	g, reg := rankGroup(w, nil, 0)
	p, err := g.Pick(reg, "b", &BucketRequest{Model: "llama", ExpectedPeak: -1, Now: t0})
	if err != nil || p.HasRank {
		t.Fatalf("single-rank engine: %+v %v", p, err)
	}
	w2 := dpWorker(t, 2)
	g2 := NewEngineGroup("llama", StagePlain, nil, NewRoundRobin(nil, nil))
	reg2, _ := NewRegistry([]*Worker{w2})
	if p, _ := g2.Pick(reg2, "b", &BucketRequest{Model: "llama", ExpectedPeak: -1, Now: t0}); p.HasRank {
		t.Fatal("a group without rank dispatch chose a rank")
	}
}

// rankPrefix is a prefix lookup that knows the ranks holding each engine's prefix.
type rankPrefix struct {
	fakePrefix
	ranks map[string]uint64
}

func (f *rankPrefix) MatchedRanks(id string) uint64 { return f.ranks[id] }

// TestRankDispatchPrefersPrefixHolders: in a cache_aware group the rank holding the request's
// longest prefix wins while it waits at most the pressure guard beyond the least loaded rank
// (the requests sent to it since the report count); ranks tied on the prefix share by load;
// a lookup that failed, found nothing, or knows no ranks leaves the choice to load, and so
// does a group that does not prefer prefixes.
func TestRankDispatchPrefersPrefixHolders(t *testing.T) {
	w := dpWorker(t, 4)
	idle := native(4, 0, 0, 100)
	pick := func(g *EngineGroup, reg *Registry, prefix PrefixMatcher) int {
		t.Helper()
		p, err := g.Pick(reg, "b", &BucketRequest{Model: "llama", ExpectedPeak: -1, Now: t0, Prefix: prefix})
		if err != nil || !p.HasRank {
			t.Fatalf("%+v %v", p, err)
		}
		return p.Rank
	}
	held := &rankPrefix{fakePrefix: fakePrefix{matched: map[string]int64{w.ID: 1000}}, ranks: map[string]uint64{w.ID: 1 << 2}}
	t.Run("holder within the guard", func(t *testing.T) {
		g, reg := rankGroup(w, rankTable(t, w, idle, idle, idle, idle), 0)
		g.SetRankPrefix(4)
		var got []int
		for range 7 {
			got = append(got, pick(g, reg, held))
		}
		// Rank 2 takes requests until it waits 5 more than the others (guard 4); then the
		// rotation goes on from the rank after it.
		if want := []int{2, 2, 2, 2, 2, 3, 0}; !slices.Equal(got, want) {
			t.Fatalf("ranks %v, want %v", got, want)
		}
	})
	t.Run("holder over the guard by its report", func(t *testing.T) {
		g, reg := rankGroup(w, rankTable(t, w, idle, idle, native(4, 6, 0, 100), idle), 0)
		g.SetRankPrefix(4)
		if r := pick(g, reg, held); r == 2 {
			t.Fatal("rank 2 waits 6 more than the others, yet took the request")
		}
	})
	t.Run("holder at the cap", func(t *testing.T) {
		g, reg := rankGroup(w, rankTable(t, w, idle, idle, native(4, 2, 0, 100), idle), 2)
		g.SetRankPrefix(4)
		if r := pick(g, reg, held); r == 2 {
			t.Fatal("rank 2 is at max_waiting_per_rank, yet took the request")
		}
	})
	t.Run("tied holders share", func(t *testing.T) {
		g, reg := rankGroup(w, rankTable(t, w, idle, idle, idle, idle), 0)
		g.SetRankPrefix(4)
		two := &rankPrefix{fakePrefix: held.fakePrefix, ranks: map[string]uint64{w.ID: 1<<1 | 1<<3}}
		var got []int
		for range 4 {
			got = append(got, pick(g, reg, two))
		}
		if want := []int{1, 3, 1, 3}; !slices.Equal(got, want) {
			t.Fatalf("ranks %v, want %v", got, want)
		}
	})
	for _, tc := range []struct {
		name   string
		prefix PrefixMatcher
		on     bool
	}{
		{"failed lookup", &rankPrefix{fakePrefix: fakePrefix{matched: held.matched, unavailable: true}, ranks: held.ranks}, true},
		{"no prefix on the engine", &rankPrefix{fakePrefix: fakePrefix{}, ranks: held.ranks}, true},
		{"ranks unknown", &fakePrefix{matched: held.matched}, true},
		{"group not preferring prefixes", held, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g, reg := rankGroup(w, rankTable(t, w, idle, idle, idle, idle), 0)
			if tc.on {
				g.SetRankPrefix(4)
			}
			var got []int
			for range 4 {
				got = append(got, pick(g, reg, tc.prefix))
			}
			if want := []int{0, 1, 2, 3}; !slices.Equal(got, want) {
				t.Fatalf("ranks %v, want the load's rotation %v", got, want)
			}
		})
	}
}
