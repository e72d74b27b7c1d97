package engine

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"switchyard/config"
	"switchyard/kv"
	"switchyard/kv/hashing"
	"switchyard/kv/index"
	"switchyard/load"
)

// testCacheSettings are the documented defaults.
func testCacheSettings() CacheAwareSettings {
	return CacheAwareSettingsFromConfig(config.Default().CacheAware)
}

// fakePrefix is a hand-written PrefixMatcher: matched tokens per worker ID and a status.
type fakePrefix struct {
	matched     map[string]int64
	unavailable bool
	err         error
}

func (f *fakePrefix) MatchedTokens(id string) int64 { return f.matched[id] }
func (f *fakePrefix) Status() (bool, bool, error) {
	switch {
	case f.err != nil:
		return false, false, f.err
	case f.unavailable:
		return false, true, nil
	}
	return true, false, nil
}

// cacheReq is a prefill pick request of input tokens carrying prefix.
func cacheReq(input int64, prefix PrefixMatcher) *PickRequest {
	return &PickRequest{
		BucketRequest: &BucketRequest{Model: "llama", InputTokens: input, ExpectedPeak: -1, Now: t0, Prefix: prefix},
		Stage:         StagePrefill, BucketID: "b",
	}
}

// sortedWorkers returns n prefill workers sorted by ID, as a group hands them to a policy.
func sortedWorkers(t testing.TB, n int) []*Worker {
	t.Helper()
	ws := testWorkers(t, "llama", StagePrefill, "w", n)
	slices.SortFunc(ws, func(a, b *Worker) int { return cmp.Compare(a.ID, b.ID) })
	return ws
}

// waiting is a fresh native report with the given waiting requests.
func waiting(n int64) load.RankReport { return native(1, n, n*100, 1000) }

// newCache builds cache_aware with the threshold decision and the documented defaults, then
// mod; the latency decision has its own tests (cache_aware_latency_test.go).
func newCache(adm EngineAdmission, loads LoadReader, mod func(*CacheAwareSettings)) *CacheAware {
	s := testCacheSettings()
	s.Decision = DecisionThreshold
	if mod != nil {
		mod(&s)
	}
	return NewCacheAware(adm, loads, nil, s, testRNG(), nil)
}

func TestCacheAwareCandidateLimit(t *testing.T) {
	tests := []struct {
		name string
		n    int
		want int
	}{
		{"one engine", 1, 1},
		{"below the minimum", 5, 5},
		{"the minimum", 8, 8},
		{"ratio below the minimum", 100, 8},
		{"ratio above the minimum", 400, 20},
		{"ratio capped by the maximum", 1000, 32},
	}
	s := testCacheSettings()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := s.candidateLimit(tt.n); got != tt.want {
				t.Fatalf("candidateLimit(%d) = %d, want %d", tt.n, got, tt.want)
			}
		})
	}
}

func TestCacheAwareHolderSelection(t *testing.T) {
	ws := sortedWorkers(t, 4)
	a, b, c, d := ws[0], ws[1], ws[2], ws[3]
	tests := []struct {
		name     string
		input    int64
		matched  map[string]int64
		reports  map[*Worker]load.RankReport
		mod      func(*CacheAwareSettings)
		want     *Worker
		reason   string
		fallback bool // the pick is a fallback: only its reason is checked
	}{
		{name: "longest prefix wins", input: 8000,
			matched: map[string]int64{a.ID: 2048, b.ID: 6000, c.ID: 4096},
			want:    b, reason: ReasonCacheCandidate},
		{name: "below the minimum hit is a miss", input: 8000,
			matched: map[string]int64{a.ID: 1023}, reason: ReasonCacheMissFallback, fallback: true},
		{name: "exactly the minimum hit is usable", input: 8000,
			matched: map[string]int64{a.ID: 1024}, want: a, reason: ReasonCacheCandidate},
		{name: "ratio gate rejects a short share", input: 8000,
			matched: map[string]int64{a.ID: 2048},
			mod:     func(s *CacheAwareSettings) { s.MinMatchRatio = 0.5 },
			reason:  ReasonCacheMissFallback, fallback: true},
		{name: "ratio gate admits a long share", input: 8000,
			matched: map[string]int64{a.ID: 4096},
			mod:     func(s *CacheAwareSettings) { s.MinMatchRatio = 0.5 },
			want:    a, reason: ReasonCacheCandidate},
		{name: "equal hits: lower pressure wins", input: 8000,
			matched: map[string]int64{a.ID: 4096, b.ID: 4096},
			reports: map[*Worker]load.RankReport{a: waiting(3), b: waiting(1)},
			want:    b, reason: ReasonCacheCandidate},
		{name: "equal hits and pressure: lower ID wins", input: 8000,
			matched: map[string]int64{b.ID: 4096, a.ID: 4096},
			reports: map[*Worker]load.RankReport{a: waiting(2), b: waiting(2)},
			want:    a, reason: ReasonCacheCandidate},
		{name: "within the margin fewer uncached still wins below the guard", input: 8000,
			matched: map[string]int64{a.ID: 4096, b.ID: 4000},
			reports: map[*Worker]load.RankReport{a: waiting(4), b: waiting(0)},
			want:    a, reason: ReasonCacheCandidate},
		{name: "within the margin the pressure guard prefers the idle holder", input: 8000,
			matched: map[string]int64{a.ID: 4096, b.ID: 4000},
			reports: map[*Worker]load.RankReport{a: waiting(5), b: waiting(0)},
			want:    b, reason: ReasonCacheCandidate},
		{name: "beyond the margin the guard does not apply", input: 8000,
			matched: map[string]int64{a.ID: 4096, b.ID: 3000},
			reports: map[*Worker]load.RankReport{a: waiting(7), b: waiting(0)},
			want:    a, reason: ReasonCacheCandidate},
		{name: "guard needs both reports", input: 8000,
			matched: map[string]int64{a.ID: 4096, b.ID: 4000},
			reports: map[*Worker]load.RankReport{a: waiting(7)},
			want:    a, reason: ReasonCacheCandidate},
		{name: "matched above the input is clamped", input: 2000,
			matched: map[string]int64{a.ID: 5000, b.ID: 2000},
			reports: map[*Worker]load.RankReport{a: waiting(2), b: waiting(1)},
			want:    b, reason: ReasonCacheCandidate},
		{name: "holder past the soft gate is avoided", input: 8000,
			matched: map[string]int64{a.ID: 6000, b.ID: 2000},
			reports: map[*Worker]load.RankReport{a: waiting(8), b: waiting(0), c: waiting(0), d: waiting(0)},
			want:    b, reason: ReasonCacheCandidate},
		{name: "unknown load passes the soft gate", input: 8000,
			matched: map[string]int64{a.ID: 6000, b.ID: 2000},
			want:    a, reason: ReasonCacheCandidate},
		{name: "gate disabled keeps a queued holder", input: 8000,
			matched: map[string]int64{a.ID: 6000},
			reports: map[*Worker]load.RankReport{a: waiting(50), b: waiting(0), c: waiting(0), d: waiting(0)},
			mod:     func(s *CacheAwareSettings) { s.WorkerQueueLimit = 0 },
			want:    a, reason: ReasonCacheCandidate},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := newCache(nil, loadTable(t, tt.reports), tt.mod)
			got, err := p.Pick(ws, cacheReq(tt.input, &fakePrefix{matched: tt.matched}))
			if err != nil {
				t.Fatal(err)
			}
			if got.Reason != tt.reason || (!tt.fallback && got.Worker != tt.want) {
				t.Fatalf("pick = %v (%s), want %v (%s)", got.Worker, got.Reason, tt.want, tt.reason)
			}
		})
	}
}

func TestCacheAwareBoundsKeepTheLongestHolders(t *testing.T) {
	ws := sortedWorkers(t, 20)
	matched := map[string]int64{}
	reports := map[*Worker]load.RankReport{}
	for i, w := range ws {
		matched[w.ID] = int64(2000 + 100*i) // the later, the longer
		reports[w] = waiting(int64(20 - i)) // the later, the less waiting... but never a guard win
	}
	// Make the shortest holder irresistible on pressure; it lies outside the bound of 8.
	reports[ws[0]] = waiting(0)
	p := newCache(nil, loadTable(t, reports), func(s *CacheAwareSettings) {
		s.SwitchMargin = 1 << 40
		s.PressureGuard = 0
		s.WorkerQueueLimit = 0
	})
	got, err := p.Pick(ws, cacheReq(10000, &fakePrefix{matched: matched}))
	if err != nil {
		t.Fatal(err)
	}
	if got.Reason != ReasonCacheCandidate || slices.Index(ws, got.Worker) < len(ws)-8 {
		t.Fatalf("pick %v (%s) is not among the 8 longest holders", got.Worker, got.Reason)
	}
}

func TestCacheAwareSaturationPin(t *testing.T) {
	ws := sortedWorkers(t, 3)
	a, b, c := ws[0], ws[1], ws[2]
	matched := map[string]int64{a.ID: 6000, b.ID: 5000}
	tests := []struct {
		name    string
		reports map[*Worker]load.RankReport
		reject  map[string]bool
		floor   float64
		want    *Worker
		reason  string
		wantErr error
	}{
		{name: "all queued: pin the least pressured holder",
			reports: map[*Worker]load.RankReport{a: waiting(12), b: waiting(9), c: waiting(20)},
			floor:   1, want: b, reason: ReasonSaturationPin},
		{name: "an unknown queue counts as saturated",
			reports: map[*Worker]load.RankReport{a: waiting(12), b: waiting(9)},
			floor:   1, want: b, reason: ReasonSaturationPin},
		{name: "an idle engine elsewhere: fall back to it",
			reports: map[*Worker]load.RankReport{a: waiting(12), b: waiting(9), c: waiting(0)},
			floor:   1, want: c, reason: ReasonCacheMissFallback},
		{name: "a lower floor pins with an idle engine left",
			reports: map[*Worker]load.RankReport{a: waiting(12), b: waiting(9), c: waiting(0)},
			floor:   0.6, want: b, reason: ReasonSaturationPin},
		{name: "the pin still passes hard admission",
			reports: map[*Worker]load.RankReport{a: waiting(12), b: waiting(9), c: waiting(20)},
			reject:  map[string]bool{b.ID: true},
			floor:   1, want: a, reason: ReasonSaturationPin},
		{name: "no admissible holder: the fallback excludes them",
			reports: map[*Worker]load.RankReport{a: waiting(12), b: waiting(9), c: waiting(20)},
			reject:  map[string]bool{a.ID: true, b.ID: true},
			floor:   1, want: c, reason: ReasonCacheMissFallback},
		{name: "everything rejected: NoAdmissibleEngine with every rejection",
			reports: map[*Worker]load.RankReport{a: waiting(12), b: waiting(9), c: waiting(20)},
			reject:  map[string]bool{a.ID: true, b.ID: true, c.ID: true},
			floor:   1, wantErr: ErrNoAdmissibleEngine},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			adm := &countingAdmission{reject: tt.reject}
			p := newCache(adm, loadTable(t, tt.reports), func(s *CacheAwareSettings) { s.SaturationFloor = tt.floor })
			got, err := p.Pick(ws, cacheReq(8000, &fakePrefix{matched: matched}))
			if tt.wantErr != nil {
				var pe *PickError
				if !errors.Is(err, tt.wantErr) || !errors.As(err, &pe) || len(pe.Rejections) != len(tt.reject) {
					t.Fatalf("err = %v, want %v with %d rejections", err, tt.wantErr, len(tt.reject))
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got.Worker != tt.want || got.Reason != tt.reason {
				t.Fatalf("pick = %v (%s), want %v (%s)", got.Worker, got.Reason, tt.want, tt.reason)
			}
		})
	}
}

func TestCacheAwareExplicitAdmission(t *testing.T) {
	ws := sortedWorkers(t, 4)
	a, b := ws[0], ws[1]
	matched := map[string]int64{a.ID: 6000, b.ID: 5000}
	t.Run("a rejected holder yields to the next", func(t *testing.T) {
		adm := &countingAdmission{reject: map[string]bool{a.ID: true}}
		got, err := newCache(adm, nil, nil).Pick(ws, cacheReq(8000, &fakePrefix{matched: matched}))
		if err != nil || got.Worker != b || got.Reason != ReasonCacheCandidate {
			t.Fatalf("pick %v (%s), err %v", got.Worker, got.Reason, err)
		}
		if adm.calls != 2 {
			t.Fatalf("admission calls = %d, want one per evaluated holder (2)", adm.calls)
		}
	})
	t.Run("rejected holders never become the cold fallback", func(t *testing.T) {
		adm := &countingAdmission{reject: map[string]bool{a.ID: true, b.ID: true}}
		p := newCache(adm, nil, nil)
		for i := range 50 {
			got, err := p.Pick(ws, cacheReq(8000, &fakePrefix{matched: matched}))
			if err != nil {
				t.Fatal(err)
			}
			if got.Worker == a || got.Worker == b || got.Reason != ReasonCacheMissFallback {
				t.Fatalf("pick %d: %v (%s)", i, got.Worker, got.Reason)
			}
		}
	})
	t.Run("fallback rejection after holder rejections is NoAdmissibleEngine", func(t *testing.T) {
		adm := &countingAdmission{reject: map[string]bool{ws[0].ID: true, ws[1].ID: true, ws[2].ID: true, ws[3].ID: true}}
		_, err := newCache(adm, nil, nil).Pick(ws, cacheReq(8000, &fakePrefix{matched: matched}))
		var pe *PickError
		if !errors.As(err, &pe) || pe.Outcome != OutcomeNoAdmissibleEngine || len(pe.Rejections) != 3 || !pe.Advances() {
			t.Fatalf("err = %v", err)
		}
	})
}

func TestCacheAwareMissFallback(t *testing.T) {
	ws := sortedWorkers(t, 6)
	reports := map[*Worker]load.RankReport{}
	for i, w := range ws {
		reports[w] = native(1, int64(6-i), int64(600-100*i), 1000) // the last is the least loaded
	}
	tab := loadTable(t, reports)
	t.Run("k covering the group takes the exact minimum", func(t *testing.T) {
		p := newCache(nil, tab, func(s *CacheAwareSettings) { s.MinLoadChoices = 6 })
		for range 20 {
			got, err := p.Pick(ws, cacheReq(8000, nil))
			if err != nil || got.Worker != ws[5] || got.Reason != ReasonCacheMissFallback {
				t.Fatalf("pick %v (%s), err %v", got.Worker, got.Reason, err)
			}
		}
	})
	t.Run("power of two never picks the most loaded", func(t *testing.T) {
		p := newCache(nil, tab, nil)
		seen := map[*Worker]int{}
		for range 600 {
			got, err := p.Pick(ws, cacheReq(8000, nil))
			if err != nil {
				t.Fatal(err)
			}
			seen[got.Worker]++
		}
		if seen[ws[0]] != 0 || seen[ws[5]] < seen[ws[1]] {
			t.Fatalf("distribution %v", seen)
		}
	})
	t.Run("engines past the soft gate are avoided when others remain", func(t *testing.T) {
		reports := map[*Worker]load.RankReport{}
		for _, w := range ws {
			reports[w] = waiting(30)
		}
		reports[ws[2]] = waiting(3)
		p := newCache(nil, loadTable(t, reports), nil)
		for range 20 {
			if got, _ := p.Pick(ws, cacheReq(8000, nil)); got.Worker != ws[2] {
				t.Fatalf("pick %v, want the only engine under the gate", got.Worker)
			}
		}
	})
	t.Run("exact-minimum ties are spread", func(t *testing.T) {
		p := newCache(nil, nil, func(s *CacheAwareSettings) { s.MinLoadChoices = 64 })
		seen := map[*Worker]bool{}
		for range 200 {
			got, _ := p.Pick(ws, cacheReq(8000, nil))
			seen[got.Worker] = true
		}
		if len(seen) < 4 {
			t.Fatalf("ties went to %d engines only", len(seen))
		}
	})
}

func TestCacheAwarePrefixStatus(t *testing.T) {
	ws := sortedWorkers(t, 3)
	t.Run("unavailable source falls back and is counted", func(t *testing.T) {
		p := newCache(nil, nil, nil)
		got, err := p.Pick(ws, cacheReq(8000, &fakePrefix{unavailable: true}))
		if err != nil || got.Reason != ReasonCacheMissFallback {
			t.Fatalf("pick %v (%s), err %v", got.Worker, got.Reason, err)
		}
		if c := p.Metrics().Counts(); c.SourceUnavailable != 1 || c.Unavailable != 1 || c.Fallback != 1 {
			t.Fatalf("counts %+v", c)
		}
	})
	t.Run("rejected query is an invalid signal", func(t *testing.T) {
		_, err := newCache(nil, nil, nil).Pick(ws, cacheReq(8000, &fakePrefix{err: kv.ErrRejected}))
		if !errors.Is(err, ErrInvalidSignal) || !errors.Is(err, kv.ErrRejected) {
			t.Fatalf("err = %v", err)
		}
	})
	t.Run("decode groups are refused", func(t *testing.T) {
		req := cacheReq(8000, nil)
		req.Stage = StageDecode
		_, err := newCache(nil, nil, nil).Pick(testWorkers(t, "llama", StageDecode, "d", 2), req)
		if !errors.Is(err, ErrInvalidConfiguration) {
			t.Fatalf("err = %v", err)
		}
	})
	t.Run("decisions are counted by outcome", func(t *testing.T) {
		p := newCache(nil, nil, nil)
		_, _ = p.Pick(ws, cacheReq(8000, &fakePrefix{matched: map[string]int64{ws[1].ID: 4096}}))
		_, _ = p.Pick(ws, cacheReq(8000, &fakePrefix{matched: map[string]int64{ws[1].ID: 100}}))
		_, _ = p.Pick(ws, cacheReq(8000, &fakePrefix{matched: map[string]int64{}}))
		_, _ = p.Pick(ws, cacheReq(8000, nil))
		c := p.Metrics().Counts()
		if c.Candidate != 1 || c.Fallback != 3 || c.BelowThreshold != 1 || c.NoHolder != 1 || c.NoLookup != 1 {
			t.Fatalf("counts %+v", c)
		}
	})
}

// TestCacheAwareMemoBySource: a memo resolved for another source does not leak into this
// policy's decision; a local index is resolved on first use and memoized.
func TestCacheAwareMemoBySource(t *testing.T) {
	ws := sortedWorkers(t, 3)
	idx, err := index.New(index.Config{Shards: 2})
	if err != nil {
		t.Fatal(err)
	}
	tokens := make([]uint32, 4096)
	for i := range tokens {
		tokens[i] = uint32(i)
	}
	storeTokens(t, idx, ws[2].ID, tokens[:2048])
	other := &countingSource{matches: []kv.Match{{Worker: ws[0].ID, Tokens: 4096}}}
	memo := kv.NewPrefixMemo("llama", tokens)
	memo.Resolve(context.Background(), other)
	p := NewCacheAware(nil, nil, idx, testCacheSettings(), testRNG(), nil)
	for range 3 {
		got, err := p.Pick(ws, cacheReq(4096, memo))
		if err != nil || got.Worker != ws[2] || got.Reason != ReasonCacheCandidate {
			t.Fatalf("pick %v (%s), err %v", got.Worker, got.Reason, err)
		}
	}
	if r, ok := memo.Resolved(idx); !ok || r.Lookup.Tokens(ws[2].ID) != 2048 {
		t.Fatal("the local lookup was not memoized")
	}
	if other.calls != 1 {
		t.Fatalf("other source asked %d times", other.calls)
	}
	t.Run("an unresolved remote source is a miss, not a lookup in the pick", func(t *testing.T) {
		remote := &countingSource{}
		p := NewCacheAware(nil, nil, remote, testCacheSettings(), testRNG(), nil)
		got, err := p.Pick(ws, cacheReq(4096, kv.NewPrefixMemo("llama", tokens)))
		if err != nil || got.Reason != ReasonCacheMissFallback || remote.calls != 0 {
			t.Fatalf("pick %v (%s), err %v, remote calls %d", got.Worker, got.Reason, err, remote.calls)
		}
	})
}

// countingSource is a hand-written CacheSource answering fixed matches.
type countingSource struct {
	matches []kv.Match
	calls   int
}

func (s *countingSource) Lookup(_ context.Context, _ string, tokens []uint32, dst *kv.Lookup) error {
	s.calls++
	dst.Reset()
	dst.QueryTokens = len(tokens)
	dst.Matches = append(dst.Matches, s.matches...)
	return nil
}

// storeTokens records in idx that worker (one rank, block size 16) holds tokens.
func storeTokens(t testing.TB, idx *index.Index, worker string, tokens []uint32) {
	t.Helper()
	ids, err := idx.SetWorker(worker, "llama", 1, 16)
	if err != nil {
		t.Fatal(err)
	}
	w := idx.NewWriter()
	ep := idx.Owners().Epoch(ids[0])
	for _, h := range hashing.AppendBlockHashes(nil, tokens, 16) {
		w.Store(ids[0], ep, h, index.TierGPU)
	}
	if d := w.Flush(); d != 0 {
		t.Fatalf("%d operations dropped", d)
	}
}

// TestCacheAwareNeverOutsideCandidates runs the hit path over random states: the pick is
// always a candidate with a reason, and the result does not depend on the candidates' order
// (no pairwise comparator sorts them).
func TestCacheAwareNeverOutsideCandidates(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 9))
	for trial := range 200 {
		n := 1 + rng.IntN(40)
		ws := sortedWorkers(t, n)
		matched := map[string]int64{}
		reports := map[*Worker]load.RankReport{}
		for _, w := range ws {
			if rng.IntN(3) > 0 {
				matched[w.ID] = int64(rng.IntN(8000))
			}
			switch rng.IntN(4) {
			case 0: // unknown
			case 1:
				reports[w] = basic(int64(rng.IntN(5)), int64(rng.IntN(12)), 100)
			default:
				r := native(int64(rng.IntN(5)), int64(rng.IntN(12)), int64(rng.IntN(3)*500), 100)
				if rng.IntN(2) == 0 {
					r.Fields |= load.HasPrefillQueue
					r.HasCounters = false
				}
				reports[w] = r
			}
		}
		tab := loadTable(t, reports)
		prefix := &fakePrefix{matched: matched}
		pick := func(c []*Worker) Pick {
			got, err := newCache(nil, tab, nil).Pick(c, cacheReq(8000, prefix))
			if err != nil {
				t.Fatalf("trial %d: %v", trial, err)
			}
			return got
		}
		got := pick(ws)
		if !slices.Contains(ws, got.Worker) || got.Reason == "" {
			t.Fatalf("trial %d: pick %v (%q) outside the candidates", trial, got.Worker, got.Reason)
		}
		if got.Reason == ReasonCacheMissFallback {
			continue // the fallback samples at random
		}
		shuffled := slices.Clone(ws)
		rng.Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
		if again := pick(shuffled); again.Worker != got.Worker {
			t.Fatalf("trial %d: order changed the pick: %v then %v", trial, got.Worker, again.Worker)
		}
	}
}

func TestFactoryBuildsCacheAware(t *testing.T) {
	cfg := config.Default()
	plain := config.Policy{Type: config.PolicyCacheAware}
	cfg.Models = map[string]config.Model{"llama": {Buckets: []config.Bucket{{ID: "b", Groups: config.Groups{Plain: &config.Group{Policy: &plain}}}}}}
	if _, err := BuildResolvers(cfg, Deps{}); !errors.Is(err, ErrInvalidConfiguration) {
		t.Fatalf("without a cache source: err = %v", err)
	}
	idx, err := index.New(index.Config{})
	if err != nil {
		t.Fatal(err)
	}
	rs, err := BuildResolvers(cfg, Deps{Cache: idx})
	if err != nil {
		t.Fatal(err)
	}
	if got := rs["llama"].Buckets()[0].Plain.Policy().Name(); got != PolicyCacheAware {
		t.Fatalf("policy %q", got)
	}
	b := &builder{cfg: cfg, deps: Deps{Cache: idx}}
	if _, err := b.policy(plain, StageDecode, "p"); !errors.Is(err, ErrInvalidConfiguration) {
		t.Fatalf("decode: err = %v", err)
	}
}

func ExampleCacheAware() {
	ws := []*Worker{
		NewWorker("a", "http://127.0.0.1:1", "llama", StagePlain, nil),
		NewWorker("b", "http://127.0.0.1:2", "llama", StagePlain, nil),
	}
	p := NewCacheAware(nil, nil, nil, CacheAwareSettingsFromConfig(config.Default().CacheAware), rand.New(rand.NewPCG(1, 1)), nil)
	req := &PickRequest{BucketRequest: &BucketRequest{Model: "llama", InputTokens: 4000, ExpectedPeak: -1,
		Prefix: &fakePrefix{matched: map[string]int64{"b": 3072}}}, Stage: StagePlain, BucketID: "short"}
	pick, _ := p.Pick(ws, req)
	fmt.Println(pick.Worker, pick.Reason)
	// Output: b cache_candidate
}

func TestCacheAwareTypedNilMemo(t *testing.T) {
	ws := sortedWorkers(t, 3)
	var memo *kv.PrefixMemo
	got, err := newCache(nil, nil, nil).Pick(ws, cacheReq(8000, memo))
	if err != nil || got.Reason != ReasonCacheMissFallback {
		t.Fatalf("pick %v (%s), err %v", got.Worker, got.Reason, err)
	}
}
