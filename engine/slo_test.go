package engine

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"switchyard/load"
)

// fakeMemo is a PrefixMatcher with fixed matches.
type fakeMemo struct {
	matched map[string]int64
	ok      bool
}

func (m *fakeMemo) MatchedTokens(id string) int64             { return m.matched[id] }
func (m *fakeMemo) Status() (ok, unavailable bool, err error) { return m.ok, !m.ok, nil }

func TestUncachedTokens(t *testing.T) {
	w := NewWorker("a", "http://127.0.0.1:1", "llama", StagePlain, nil)
	tests := []struct {
		name   string
		input  int64
		prefix PrefixMatcher
		want   int64
	}{
		{"no lookup", 1000, nil, 1000},
		{"matched prefix", 1000, &fakeMemo{ok: true, matched: map[string]int64{"a": 640}}, 360},
		{"whole prompt cached still computes one token", 1000, &fakeMemo{ok: true, matched: map[string]int64{"a": 5000}}, 1},
		{"unavailable lookup", 1000, &fakeMemo{ok: false, matched: map[string]int64{"a": 640}}, 1000},
		{"empty prompt", 0, nil, 1},
	}
	for _, tt := range tests {
		req := &BucketRequest{Model: "llama", InputTokens: tt.input, Prefix: tt.prefix}
		if got := UncachedTokens(req, w); got != tt.want {
			t.Errorf("%s: %d, want %d", tt.name, got, tt.want)
		}
	}
}

// sloFleet is two plain buckets of the same lengths, fast and slow by their learned rates.
type sloFleet struct {
	set              *WorkerSet
	loaded, idle     []*Worker
	first, second    *Bucket
	res, resCapacity *BucketResolver
	tab              *load.Table
}

// newSLOFleet builds bucket "a-loaded" (rank 0, first in capacity order) whose engines have
// learned 50µs per prefill token and report 8,000 waiting tokens, and bucket "b-idle"
// (rank 1) whose engines learned the same rate and report nothing waiting.
func newSLOFleet(t *testing.T) *sloFleet {
	f := &sloFleet{
		loaded: testWorkers(t, "llama", StagePlain, "L", 2),
		idle:   testWorkers(t, "llama", StagePlain, "I", 2),
	}
	f.set = mustSet(t, f.loaded, f.idle)
	reports := map[*Worker]load.RankReport{}
	for _, w := range f.loaded {
		reports[w] = native(4, 3, 8000, 100)
	}
	for _, w := range f.idle {
		reports[w] = native(4, 0, 0, 100)
	}
	f.tab = loadTable(t, reports)
	for _, w := range append(slices.Clone(f.loaded), f.idle...) {
		w.Counters.Rates().Prefill.Observe(2000, 0.1) // 50µs a token
		w.Counters.Rates().Decode.Observe(5, 0.01)
	}
	ids := func(ws []*Worker) []string { return []string{ws[0].ID, ws[1].ID} }
	f.first = &Bucket{ID: "a-loaded", Rank: 0, MaxInput: 4096, MaxContext: Unbounded,
		Plain: NewEngineGroup("llama", StagePlain, ids(f.loaded), NewRoundRobin(nil, nil))}
	f.second = &Bucket{ID: "b-idle", Rank: 1, MaxInput: 4096, MaxContext: Unbounded,
		Plain: NewEngineGroup("llama", StagePlain, ids(f.idle), NewRoundRobin(nil, nil))}
	f.res = NewBucketResolver("llama", []*Bucket{f.second, f.first}, WithSLOOrder(f.tab))
	f.resCapacity = NewBucketResolver("llama", []*Bucket{f.second, f.first})
	return f
}

func sloReq(input int64, ttft, tpot time.Duration) *BucketRequest {
	return &BucketRequest{Model: "llama", InputTokens: input, ExpectedPeak: -1, Now: t0, SLO: SLOTargets{TTFT: ttft, TPOT: tpot}}
}

func TestBucketEstimate(t *testing.T) {
	f := newSLOFleet(t)
	req := sloReq(1000, 0, 0)
	e := f.first.Estimate(f.set.Load(), req, f.tab.Load())
	// 8,000 waiting and 1,000 own tokens at 50µs.
	if !e.Engines || !e.KnownTTFT || math.Abs(e.TTFT-0.45) > 1e-9 || !e.KnownTPOT || math.Abs(e.TPOT-0.01) > 1e-9 {
		t.Fatalf("loaded bucket estimate %+v", e)
	}
	e = f.second.Estimate(f.set.Load(), req, f.tab.Load())
	if math.Abs(e.TTFT-0.05) > 1e-9 {
		t.Fatalf("idle bucket estimate %+v", e)
	}
	// One engine the router knows nothing of makes the bucket's best TTFT 0, not known.
	fresh := testWorkers(t, "llama", StagePlain, "N", 1)
	set := mustSet(t, f.loaded, f.idle, fresh)
	b := &Bucket{ID: "n", MaxInput: Unbounded, MaxContext: Unbounded,
		Plain: NewEngineGroup("llama", StagePlain, []string{f.loaded[0].ID, fresh[0].ID}, NewRoundRobin(nil, nil))}
	if e = b.Estimate(set.Load(), req, f.tab.Load()); e.TTFT != 0 || e.KnownTTFT || !e.Engines {
		t.Fatalf("bucket with an unknown engine %+v", e)
	}
	// No healthy engine: no estimate, an infinite violation.
	set.SetHealthy(f.loaded[0].ID, false)
	set.SetHealthy(fresh[0].ID, false)
	if e = b.Estimate(set.Load(), req, f.tab.Load()); e.Engines || !math.IsInf(e.Violation(SLOTargets{TTFT: time.Second}), 1) {
		t.Fatalf("bucket without engines %+v", e)
	}
}

func TestViolation(t *testing.T) {
	e := BucketEstimate{TTFT: 0.3, TPOT: 0.02, Engines: true}
	tests := []struct {
		t    SLOTargets
		want float64
	}{
		{SLOTargets{}, 0},
		{SLOTargets{TTFT: 300 * time.Millisecond}, 0},
		{SLOTargets{TTFT: 200 * time.Millisecond}, 0.5},
		{SLOTargets{TPOT: 10 * time.Millisecond}, 1},
		{SLOTargets{TTFT: 200 * time.Millisecond, TPOT: 10 * time.Millisecond}, 1.5},
	}
	for _, tt := range tests {
		if got := e.Violation(tt.t); math.Abs(got-tt.want) > 1e-9 {
			t.Errorf("Violation(%+v) = %v, want %v", tt.t, got, tt.want)
		}
	}
}

func TestResolverOrder(t *testing.T) {
	f := newSLOFleet(t)
	reg := f.set.Load()
	tests := []struct {
		name      string
		res       *BucketResolver
		req       *BucketRequest
		wantOrder BucketOrder
		want      []string
	}{
		{"capacity resolver", f.resCapacity, sloReq(1000, 200*time.Millisecond, 0), OrderCapacity, []string{"a-loaded", "b-idle"}},
		{"slo resolver, no target", f.res, sloReq(1000, 0, 0), OrderCapacity, []string{"a-loaded", "b-idle"}},
		{"slo resolver, the loaded bucket misses", f.res, sloReq(1000, 200*time.Millisecond, 0), OrderSLO, []string{"b-idle", "a-loaded"}},
		{"slo resolver, both meet: capacity order", f.res, sloReq(1000, time.Second, 0), OrderSLO, []string{"a-loaded", "b-idle"}},
		{"slo resolver, both miss: least violation first", f.res, sloReq(1000, 10*time.Millisecond, 0), OrderSLO, []string{"b-idle", "a-loaded"}},
		{"slo resolver, both meet the TPOT target", f.res, sloReq(1000, 0, 20*time.Millisecond), OrderSLO, []string{"a-loaded", "b-idle"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			bs, err := tt.res.Resolve(nil, tt.req.InputTokens, tt.req.ExpectedPeak)
			if err != nil {
				t.Fatal(err)
			}
			if got := tt.res.Order(bs, tt.req, reg); got != tt.wantOrder {
				t.Fatalf("order %v, want %v", got, tt.wantOrder)
			}
			var ids []string
			for _, b := range bs {
				ids = append(ids, b.ID)
			}
			if !slices.Equal(ids, tt.want) {
				t.Fatalf("buckets %v, want %v", ids, tt.want)
			}
		})
	}
}

// TestOrderBySLOKeepsTheBucketSet: whatever the estimates, ordering is a permutation of
// the resolver's output (no bucket added, none dropped), the buckets that meet come first
// in capacity order, the others follow by non-decreasing violation.
func TestOrderBySLOKeepsTheBucketSet(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for round := range 200 {
		n := 1 + rng.IntN(maxOrdered+4) // also past the allocation-free size
		var buckets []*Bucket
		var all [][]*Worker
		for i := range n {
			ws := testWorkers(t, "llama", StagePlain, "w"+string(rune('a'+i%26))+string(rune('a'+i/26)), 1)
			if rng.IntN(4) > 0 {
				ws[0].Counters.Rates().Prefill.Observe(1000, rng.Float64()) // else unknown
			}
			all = append(all, ws)
			buckets = append(buckets, &Bucket{ID: ws[0].ID, Rank: i, MaxInput: Unbounded, MaxContext: Unbounded,
				Plain: NewEngineGroup("llama", StagePlain, []string{ws[0].ID}, NewRoundRobin(nil, nil))})
		}
		set := mustSet(t, all...)
		req := sloReq(1000, 500*time.Millisecond, 0)
		ordered := slices.Clone(buckets)
		OrderBySLO(ordered, req, set.Load(), nil)
		if len(ordered) != n {
			t.Fatalf("round %d: %d buckets, want %d", round, len(ordered), n)
		}
		for _, b := range buckets {
			if !slices.Contains(ordered, b) {
				t.Fatalf("round %d: bucket %s dropped", round, b.ID)
			}
		}
		prevV, prevRank := -1.0, -1
		for _, b := range ordered {
			e := b.Estimate(set.Load(), req, nil)
			v := e.Violation(req.SLO)
			if v < prevV || (v == prevV && b.Rank < prevRank) {
				t.Fatalf("round %d: %s (violation %v, rank %d) after violation %v rank %d", round, b.ID, v, b.Rank, prevV, prevRank)
			}
			prevV, prevRank = v, b.Rank
		}
	}
}

// TestSLOOrderKeepsTheInvariants runs the bucket loop after the slo order on PD buckets:
// every selection is a pair from one bucket, and only the length-compatible buckets are
// ever asked.
func TestSLOOrderKeepsTheInvariants(t *testing.T) {
	sp, sd := testWorkers(t, "llama", StagePrefill, "SP", 1), testWorkers(t, "llama", StageDecode, "SD", 1)
	lp, ld := testWorkers(t, "llama", StagePrefill, "LP", 1), testWorkers(t, "llama", StageDecode, "LD", 1)
	xp, xd := testWorkers(t, "llama", StagePrefill, "XP", 1), testWorkers(t, "llama", StageDecode, "XD", 1)
	set := mustSet(t, sp, sd, lp, ld, xp, xd)
	short := pdBucketOf("short", 0, sp, sd, nil)
	long := pdBucketOf("long", 1, lp, ld, nil)
	tiny := pdBucketOf("tiny", 0, xp, xd, nil)
	short.MaxInput, long.MaxInput, tiny.MaxInput = 4096, 32768, 100
	// short's prefill engine is slow, long's fast; tiny is fast but too small.
	sp[0].Counters.Rates().Prefill.Observe(1000, 2)
	lp[0].Counters.Rates().Prefill.Observe(1000, 0.05)
	xp[0].Counters.Rates().Prefill.Observe(1000, 0.01)
	res := NewBucketResolver("llama", []*Bucket{long, short, tiny}, WithSLOOrder(nil))
	req := sloReq(1000, 300*time.Millisecond, 0)
	bs, _ := res.Resolve(nil, req.InputTokens, req.ExpectedPeak)
	if o := res.Order(bs, req, set.Load()); o != OrderSLO {
		t.Fatalf("order %v", o)
	}
	var tried []string
	p, err := selectEngines(bs, req, func(b *Bucket) (BucketPick, error) {
		tried = append(tried, b.ID)
		return pickEngines(b, set.Load(), req)
	})
	if err != nil || p.BucketID != "long" || p.Prefill.Worker != lp[0] || p.Decode.Worker != ld[0] {
		t.Fatalf("pick %+v %v", p, err)
	}
	// long's decode group empty: the loop falls back to short, a whole pair from there.
	set.SetHealthy(ld[0].ID, false)
	tried = nil
	p, err = selectEngines(bs, req, func(b *Bucket) (BucketPick, error) {
		tried = append(tried, b.ID)
		return pickEngines(b, set.Load(), req)
	})
	if err != nil || p.BucketID != "short" || p.Prefill.Worker != sp[0] || p.Decode.Worker != sd[0] {
		t.Fatalf("fallback pick %+v %v", p, err)
	}
	if !slices.Equal(tried, []string{"long", "short"}) {
		t.Fatalf("tried %v: tiny must never be asked", tried)
	}
}

// TestEstimateSkipsEnginesThatFailed: a retried request's estimate leaves out the engines
// that failed for it, as its picks will.
func TestEstimateSkipsEnginesThatFailed(t *testing.T) {
	ws := testWorkers(t, "llama", StagePlain, "w", 2)
	ws[0].Counters.Rates().Prefill.Observe(1000, 0.05)
	ws[1].Counters.Rates().Prefill.Observe(1000, 1)
	set := mustSet(t, ws)
	b := &Bucket{ID: "b", MaxInput: Unbounded, MaxContext: Unbounded,
		Plain: NewEngineGroup("llama", StagePlain, nil, NewRoundRobin(nil, nil))}
	req := sloReq(1000, 200*time.Millisecond, 0)
	if e := b.Estimate(set.Load(), req, nil); math.Abs(e.TTFT-0.05) > 1e-9 {
		t.Fatalf("first attempt: %+v", e)
	}
	req.RetryAfter(&BucketPick{BucketID: "b", Plain: Pick{Worker: ws[0]}}, StagePlain)
	if e := b.Estimate(set.Load(), req, nil); math.Abs(e.TTFT-1) > 1e-9 || !e.Engines {
		t.Fatalf("retry without w0: %+v", e)
	}
	req.RetryAfter(&BucketPick{BucketID: "b", Plain: Pick{Worker: ws[1]}}, StagePlain)
	if e := b.Estimate(set.Load(), req, nil); e.Engines {
		t.Fatalf("every engine failed: %+v", e)
	}
}
