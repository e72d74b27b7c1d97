package engine

import (
	"errors"
	"math"
	"strings"
	"testing"

	"switchyard/load"
)

// bypassBucket is a PD bucket of prefill P0 and decode D0 (which can prefill when capable)
// with the bypass below 100 tokens.
func bypassBucket(t *testing.T, capable bool) (*Bucket, *Registry, *Worker, *Worker) {
	t.Helper()
	p := testWorkers(t, "llama", StagePrefill, "P", 1)[0]
	d := testWorkers(t, "llama", StageDecode, "D", 1)[0]
	d.CanPrefill = capable
	reg, err := NewRegistry([]*Worker{p, d})
	if err != nil {
		t.Fatal(err)
	}
	b := &Bucket{ID: "pd", MaxInput: Unbounded, MaxContext: Unbounded, BypassBelow: 100,
		Prefill: NewEngineGroup("llama", StagePrefill, nil, NewRoundRobin(nil, nil)),
		Decode:  NewEngineGroup("llama", StageDecode, nil, NewRoundRobin(nil, nil))}
	return b, reg, p, d
}

func TestBucketPDBypass(t *testing.T) {
	for _, tc := range []struct {
		name    string
		capable bool
		input   int64
		prefix  PrefixMatcher
		bypass  bool
	}{
		{name: "short prompt", capable: true, input: 99, bypass: true},
		{name: "at the threshold", capable: true, input: 100},
		{name: "long prompt mostly cached on the decode engine", capable: true, input: 1000,
			prefix: &fakePrefix{matched: map[string]int64{"D0aa": 950}}, bypass: true},
		{name: "long prompt cached elsewhere", capable: true, input: 1000,
			prefix: &fakePrefix{matched: map[string]int64{"P0aa": 950}}},
		{name: "failed lookup counts the whole prompt", capable: true, input: 1000,
			prefix: &fakePrefix{matched: map[string]int64{"D0aa": 950}, unavailable: true}},
		{name: "decode engine that cannot prefill", capable: false, input: 10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, reg, p, d := bypassBucket(t, tc.capable)
			got, err := pickEngines(b, reg, &BucketRequest{Model: "llama", InputTokens: tc.input, ExpectedPeak: -1, Prefix: tc.prefix})
			if err != nil {
				t.Fatal(err)
			}
			if tc.bypass {
				if !got.Bypass || got.IsPD() || got.Plain.Worker != d || got.Prefill.Worker != nil || got.BucketID != "pd" {
					t.Fatalf("want the decode engine alone, got %+v", got)
				}
				return
			}
			if got.Bypass || !got.IsPD() || got.Prefill.Worker != p || got.Decode.Worker != d {
				t.Fatalf("want the pair, got %+v", got)
			}
		})
	}
}

// TestBucketPDBypassKeepsPairsCompatible: with the bypass on the decode group picks first, so
// a request that is not bypassed takes a prefill engine compatible with that decode engine
// (Compat), and fails with OutcomePDIncompatible at the prefill stage when none is.
func TestBucketPDBypassKeepsPairsCompatible(t *testing.T) {
	ps := labelled(t, StagePrefill, "P", "nixl", "mooncake")
	ds := labelled(t, StageDecode, "D", "mooncake")
	reg, err := NewRegistry(append(append([]*Worker{}, ps...), ds...))
	if err != nil {
		t.Fatal(err)
	}
	b := pdBucketOf("pd", 0, ps, ds, Compatibility{"transfer_backend"})
	b.BypassBelow = 100
	for i := range 4 {
		got, err := pickEngines(b, reg, &BucketRequest{Model: "llama", InputTokens: 1000, ExpectedPeak: -1})
		if err != nil {
			t.Fatalf("pick %d: %v", i, err)
		}
		if got.Bypass || got.Decode.Worker != ds[0] || got.Prefill.Worker != ps[1] {
			t.Fatalf("pick %d: %s+%s, want P1 (mooncake) with D0 (mooncake)", i, got.Prefill.Worker, got.Decode.Worker)
		}
	}

	only := pdBucketOf("nixl", 0, ps[:1], ds, Compatibility{"transfer_backend"})
	only.BypassBelow = 100
	_, err = pickEngines(only, reg, &BucketRequest{Model: "llama", InputTokens: 1000, ExpectedPeak: -1})
	var pe *PickError
	if !errors.As(err, &pe) || pe.Outcome != OutcomePDIncompatible || pe.Stage != StagePrefill ||
		len(pe.Rejections) != 1 || pe.Rejections[0].WorkerID != ds[0].ID || pe.Rejections[0].Limit != LimitPDIncompatible {
		t.Fatalf("no compatible prefill engine: %v", err)
	}
	if !strings.Contains(pe.Detail, "no prefill engine shares") {
		t.Errorf("detail %q", pe.Detail)
	}
}

// TestBucketEstimateCountsTheBypass: a PD bucket's SLO estimate of a request its decode
// engine takes alone is that engine's own time to first token (it prefills the request),
// not the prefill group's; a request that is not bypassed gets the prefill group's; and a
// bucket without a prefill engine still has engines for the requests the bypass takes.
func TestBucketEstimateCountsTheBypass(t *testing.T) {
	b, _, p, d := bypassBucket(t, true)
	set := mustSet(t, []*Worker{p, d})
	tab := loadTable(t, map[*Worker]load.RankReport{p: native(4, 3, 8000, 100), d: native(4, 0, 0, 100)})
	for _, w := range []*Worker{p, d} {
		w.Counters.Rates().Prefill.Observe(2000, 0.1) // 50µs a token
		w.Counters.Rates().Decode.Observe(5, 0.01)
	}
	req := func(input int64) *BucketRequest {
		return &BucketRequest{Model: "llama", InputTokens: input, ExpectedPeak: -1, Now: t0}
	}
	tests := []struct {
		name  string
		input int64
		ttft  float64 // seconds
	}{
		{"bypassed: the decode engine prefills 50 tokens", 50, 50 * 50e-6},
		{"paired: the prefill engine's 8,000 waiting and 1,000 own tokens", 1000, 9000 * 50e-6},
	}
	for _, tt := range tests {
		e := b.Estimate(set.Load(), req(tt.input), tab.Load())
		if !e.Engines || !e.KnownTTFT || math.Abs(e.TTFT-tt.ttft) > 1e-9 || !e.KnownTPOT || math.Abs(e.TPOT-0.01) > 1e-9 {
			t.Errorf("%s: estimate %+v, want TTFT %v and TPOT 0.01", tt.name, e, tt.ttft)
		}
	}
	// Without a healthy prefill engine, only the bypassed request has engines.
	set.SetHealthy(p.ID, false)
	if e := b.Estimate(set.Load(), req(50), tab.Load()); !e.Engines || math.Abs(e.TTFT-50*50e-6) > 1e-9 {
		t.Errorf("bypassed, no prefill engine: %+v", e)
	}
	if e := b.Estimate(set.Load(), req(1000), tab.Load()); e.Engines {
		t.Errorf("paired, no prefill engine: %+v", e)
	}
	// A decode engine that cannot prefill never takes the request alone.
	set.SetHealthy(p.ID, true)
	d.CanPrefill = false
	if e := b.Estimate(set.Load(), req(50), tab.Load()); math.Abs(e.TTFT-8050*50e-6) > 1e-9 {
		t.Errorf("decode engine that cannot prefill: %+v", e)
	}
}
