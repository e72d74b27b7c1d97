package engine

import (
	"context"
	"errors"
	"testing"

	"switchyard/config"
	"switchyard/kv"
	"switchyard/kv/approx"
	"switchyard/load"
)

func approxSettings() CacheAwareSettings {
	c := config.Default().CacheAware
	c.Source = config.CacheSourceApproximate
	return CacheAwareSettingsFromConfig(c)
}

func newApproxIndex(t *testing.T) *approx.Index {
	t.Helper()
	x, err := approx.New(approx.Config{Shards: 2, MaxTreeSize: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = x.Close() })
	return x
}

// symbols returns n symbols starting at from.
func symbols(from, n int) []uint32 {
	s := make([]uint32, n)
	for i := range s {
		s[i] = uint32(from + i)
	}
	return s
}

// approxReq looks seq up in x and returns the prefill pick request carrying the memo.
func approxReq(t *testing.T, x *approx.Index, seq []uint32) *PickRequest {
	t.Helper()
	memo := kv.NewPrefixMemo("llama", seq)
	if r := memo.Resolve(context.Background(), x); r.Err != nil {
		t.Fatal(r.Err)
	}
	return cacheReq(int64(len(seq))/4, memo) // InputTokens differs: the ratio uses the lookup's length
}

func TestCacheAwareApproximate(t *testing.T) {
	ws := sortedWorkers(t, 3)
	a, b, c := ws[0], ws[1], ws[2]
	prompt := func(suffix int) []uint32 { return append(symbols(1000, 100), symbols(suffix, 50)...) }
	tests := []struct {
		name     string
		recorded map[*Worker][][]uint32
		inflight map[*Worker]int
		mod      func(*ApproxSettings)
		reject   map[string]bool
		query    []uint32
		want     *Worker
		reason   string
		wantErr  Outcome
	}{
		{name: "a repeated prompt with another suffix goes to its holder",
			recorded: map[*Worker][][]uint32{b: {prompt(1)}, c: {symbols(9000, 300)}},
			query:    prompt(2), want: b, reason: ReasonCacheCandidate},
		{name: "the longest holder wins",
			recorded: map[*Worker][][]uint32{a: {symbols(1000, 60)}, b: {prompt(1)}},
			query:    prompt(2), want: b, reason: ReasonCacheCandidate},
		{name: "equal holders: the fewer in flight",
			recorded: map[*Worker][][]uint32{a: {prompt(1)}, b: {prompt(3)}},
			inflight: map[*Worker]int{a: 3, b: 1},
			query:    prompt(2), want: b, reason: ReasonCacheCandidate},
		{name: "at the threshold is a miss: the engine holding least",
			// b holds 100 of 150 symbols: a share of 0.67, not above a threshold of 0.7.
			recorded: map[*Worker][][]uint32{a: {symbols(5000, 400)}, b: {prompt(1)}, c: {symbols(7000, 120)}},
			mod:      func(s *ApproxSettings) { s.CacheThreshold = 0.7 },
			query:    prompt(2), want: c, reason: ReasonCacheMissFallback},
		{name: "a new prompt goes to the engine holding least",
			recorded: map[*Worker][][]uint32{a: {symbols(5000, 400)}, b: {prompt(1)}},
			query:    symbols(20000, 80), want: c, reason: ReasonCacheMissFallback},
		{name: "an empty tree: fewest in flight, then lowest ID",
			inflight: map[*Worker]int{a: 1},
			query:    symbols(20000, 80), want: b, reason: ReasonCacheMissFallback},
		{name: "imbalance overrides the cache",
			recorded: map[*Worker][][]uint32{b: {prompt(1)}},
			inflight: map[*Worker]int{a: 2, b: 10, c: 5},
			mod:      func(s *ApproxSettings) { s.BalanceAbs, s.BalanceRel = 4, 1.5 },
			query:    prompt(2), want: a, reason: ReasonLoadBalance},
		{name: "within the absolute threshold the cache decides",
			recorded: map[*Worker][][]uint32{b: {prompt(1)}},
			inflight: map[*Worker]int{a: 2, b: 6, c: 4},
			mod:      func(s *ApproxSettings) { s.BalanceAbs, s.BalanceRel = 4, 1.5 },
			query:    prompt(2), want: b, reason: ReasonCacheCandidate},
		{name: "within the relative threshold the cache decides",
			recorded: map[*Worker][][]uint32{b: {prompt(1)}},
			inflight: map[*Worker]int{a: 20, b: 28, c: 25},
			mod:      func(s *ApproxSettings) { s.BalanceAbs, s.BalanceRel = 4, 1.5 },
			query:    prompt(2), want: b, reason: ReasonCacheCandidate},
		{name: "a rejected holder falls to the least holding other engine",
			recorded: map[*Worker][][]uint32{b: {prompt(1)}, a: {symbols(5000, 400)}},
			reject:   map[string]bool{b.ID: true},
			query:    prompt(2), want: c, reason: ReasonCacheMissFallback},
		{name: "a rejected fallback is AdmissionRejected",
			reject: map[string]bool{a.ID: true},
			query:  symbols(1, 10), wantErr: OutcomeAdmissionRejected},
		{name: "a rejected holder and fallback: NoAdmissibleEngine",
			recorded: map[*Worker][][]uint32{b: {prompt(1)}, a: {symbols(5000, 400)}},
			reject:   map[string]bool{b.ID: true, c.ID: true},
			query:    prompt(2), wantErr: OutcomeNoAdmissibleEngine},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			x := newApproxIndex(t)
			for w, seqs := range tt.recorded {
				for _, s := range seqs {
					x.Record("llama", w.ID, s)
				}
			}
			tr := load.NewTracker()
			cands := make([]*Worker, len(ws))
			for i, w := range ws {
				cands[i] = NewWorker(w.ID, w.URL, w.Model, w.Stage, tr.Counters(w.ID))
			}
			byID := map[string]*Worker{}
			for _, w := range cands {
				byID[w.ID] = w
			}
			for w, n := range tt.inflight {
				inflight(t, tr, byID[w.ID], n)
			}
			s := approxSettings()
			if tt.mod != nil {
				tt.mod(s.Approx)
			}
			adm := &countingAdmission{reject: tt.reject}
			p := NewCacheAware(adm, nil, x, s, testRNG(), nil)
			got, err := p.Pick(cands, approxReq(t, x, tt.query))
			if tt.wantErr != 0 {
				var pe *PickError
				if !errors.As(err, &pe) || pe.Outcome != tt.wantErr {
					t.Fatalf("Pick = %v, %v; want outcome %v", got.Worker, err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got.Worker.ID != tt.want.ID || got.Reason != tt.reason {
				t.Fatalf("Pick = %s (%s), want %s (%s)", got.Worker.ID, got.Reason, tt.want.ID, tt.reason)
			}
		})
	}
}

// TestCacheAwareApproximateSpreadsDistinctPrompts: distinct prompts recorded where they go
// spread over every engine, and their repeats come back to them.
func TestCacheAwareApproximateSpreadsDistinctPrompts(t *testing.T) {
	ws := sortedWorkers(t, 4)
	x := newApproxIndex(t)
	p := NewCacheAware(nil, nil, x, approxSettings(), testRNG(), nil)
	first := map[int]string{}
	per := map[string]int{}
	for round := range 2 {
		for i := range 12 {
			seq := append(symbols(i*10000, 200), symbols(round*7, 20)...)
			got, err := p.Pick(ws, approxReq(t, x, seq))
			if err != nil {
				t.Fatal(err)
			}
			x.Record("llama", got.Worker.ID, seq)
			if round == 0 {
				first[i] = got.Worker.ID
				per[got.Worker.ID]++
				continue
			}
			if got.Worker.ID != first[i] || got.Reason != ReasonCacheCandidate {
				t.Errorf("repeat of prompt %d went to %s (%s), first to %s", i, got.Worker.ID, got.Reason, first[i])
			}
		}
	}
	for _, w := range ws {
		if per[w.ID] != 3 {
			t.Errorf("12 distinct prompts over 4 engines: %v, want 3 each", per)
			break
		}
	}
}
