package engine

import (
	"errors"
	"slices"
	"strings"
	"testing"
)

// labelled returns workers of stage s whose transfer_backend labels are backends, in order.
func labelled(t *testing.T, s Stage, prefix string, backends ...string) []*Worker {
	t.Helper()
	ws := testWorkers(t, "llama", s, prefix, len(backends))
	for i, b := range backends {
		if b != "" {
			ws[i].SetLabels(map[string]string{"transfer_backend": b, "zone": "a"})
		}
	}
	return ws
}

func pdBucketOf(id string, rank int, pre, dec []*Worker, rule Compatibility) *Bucket {
	ids := func(ws []*Worker) []string {
		var out []string
		for _, w := range ws {
			out = append(out, w.ID)
		}
		return out
	}
	return &Bucket{ID: id, Rank: rank, MaxInput: Unbounded, MaxContext: Unbounded,
		Prefill: NewEngineGroup("llama", StagePrefill, ids(pre), NewRoundRobin(nil, nil)),
		Decode:  NewEngineGroup("llama", StageDecode, ids(dec), NewRoundRobin(nil, nil)),
		Compat:  rule}
}

func TestCompatibilityPairs(t *testing.T) {
	p := labelled(t, StagePrefill, "P", "nixl", "")[0:2]
	d := labelled(t, StageDecode, "D", "nixl", "mooncake", "")
	rule := Compatibility{"transfer_backend"}
	tests := []struct {
		p, d *Worker
		want bool
	}{
		{p[0], d[0], true},
		{p[0], d[1], false},
		{p[0], d[2], false}, // a label one side lacks is empty on that side
		{p[1], d[2], true},  // both lack it
		{p[1], d[0], false},
	}
	for _, tt := range tests {
		if got := rule.Pairs(tt.p, tt.d); got != tt.want {
			t.Errorf("Pairs(%s, %s) = %v, want %v", tt.p, tt.d, got, tt.want)
		}
	}
	if !(Compatibility{}).Pairs(p[0], d[1]) {
		t.Error("the empty rule refuses a pair")
	}
}

// TestPDPairsAreCompatible: in a mixed fleet of two transfer backends, every pair a bucket
// selects shares the prefill engine's backend, over many picks with round-robin rotating
// both groups.
func TestPDPairsAreCompatible(t *testing.T) {
	pre := labelled(t, StagePrefill, "P", "nixl", "mooncake", "nixl", "mooncake")
	dec := labelled(t, StageDecode, "D", "mooncake", "nixl", "mooncake", "nixl", "mooncake")
	set := mustSet(t, pre, dec)
	b := pdBucketOf("b", 0, pre, dec, Compatibility{"transfer_backend", "zone"})
	seen := map[string]int{} // decode picks by transfer backend
	for i := range 1000 {
		p, err := pickEngines(b, set.Load(), breq("llama", 10, -1))
		if err != nil {
			t.Fatalf("pick %d: %v", i, err)
		}
		if p.Prefill.Worker.Label("transfer_backend") != p.Decode.Worker.Label("transfer_backend") {
			t.Fatalf("pick %d: incompatible pair %s (%s) + %s (%s)", i, p.Prefill.Worker, p.Prefill.Worker.Labels(),
				p.Decode.Worker, p.Decode.Worker.Labels())
		}
		seen[p.Decode.Worker.Label("transfer_backend")]++
	}
	if seen["nixl"] == 0 || seen["mooncake"] == 0 {
		t.Fatalf("decode picks by backend: %v, want both", seen)
	}
}

func TestPDIncompatibleMovesToTheNextBucket(t *testing.T) {
	sp := labelled(t, StagePrefill, "SP", "nixl")
	sd := labelled(t, StageDecode, "SD", "mooncake")
	lp := labelled(t, StagePrefill, "LP", "nixl")
	ld := labelled(t, StageDecode, "LD", "mooncake", "nixl")
	set := mustSet(t, sp, sd, lp, ld)
	rule := Compatibility{"transfer_backend"}
	short := pdBucketOf("short", 0, sp, sd, rule)
	long := pdBucketOf("long", 1, lp, ld, rule)

	// The short bucket alone: the typed reason, with the prefill engine named.
	_, err := pickEngines(short, set.Load(), breq("llama", 10, -1))
	var pe *PickError
	if !errors.As(err, &pe) || pe.Outcome != OutcomePDIncompatible || pe.Stage != StageDecode || !pe.Advances() ||
		!errors.Is(err, ErrPDIncompatible) {
		t.Fatalf("short bucket: %v", err)
	}
	if len(pe.Rejections) != 1 || pe.Rejections[0] != (Rejection{BucketID: "short", Stage: StageDecode, WorkerID: sp[0].ID, Limit: LimitPDIncompatible}) {
		t.Fatalf("rejections %v", pe.Rejections)
	}
	if !strings.Contains(pe.Error(), "pd_incompatible in bucket short (stage decode): no decode engine shares transfer_backend=nixl with prefill engine "+sp[0].ID) {
		t.Fatalf("error text %q", pe.Error())
	}

	// The bucket loop discards the short prefill pick and takes a whole pair from long.
	var tried []string
	p, err := selectEngines([]*Bucket{short, long}, nil, func(b *Bucket) (BucketPick, error) {
		tried = append(tried, b.ID)
		return pickEngines(b, set.Load(), breq("llama", 10, -1))
	})
	if err != nil || p.BucketID != "long" || p.Prefill.Worker != lp[0] || p.Decode.Worker != ld[1] {
		t.Fatalf("pick %+v, %v", p, err)
	}
	if !slices.Equal(tried, []string{"short", "long"}) {
		t.Fatalf("tried %v", tried)
	}

	// When every bucket fails, the 503's rejections carry pd_incompatible.
	_, err = selectEngines([]*Bucket{short}, nil, func(b *Bucket) (BucketPick, error) {
		return pickEngines(b, set.Load(), breq("llama", 10, -1))
	})
	if !errors.As(err, &pe) || pe.Outcome != OutcomeNoAdmissibleEngine || len(pe.Rejections) != 1 ||
		pe.Rejections[0].Limit != LimitPDIncompatible {
		t.Fatalf("exhausted: %v", err)
	}
}

// TestPDIncompatiblePolicyResultIsRefused: a decode policy that returns an engine outside
// the compatible candidates is an OutsideCandidates error, not a pair.
func TestPDIncompatiblePolicyResultIsRefused(t *testing.T) {
	pre := labelled(t, StagePrefill, "P", "nixl")
	dec := labelled(t, StageDecode, "D", "nixl", "mooncake")
	set := mustSet(t, pre, dec)
	rogue := &fixedPolicy{fn: func(c []*Worker, _ *PickRequest) (Pick, error) {
		if len(c) != 1 || c[0] != dec[0] {
			t.Errorf("decode candidates %v, want only %s", c, dec[0])
		}
		return Pick{Worker: dec[1]}, nil
	}}
	b := pdBucketOf("b", 0, pre, dec, Compatibility{"transfer_backend"})
	b.Decode = NewEngineGroup("llama", StageDecode, nil, rogue)
	_, err := pickEngines(b, set.Load(), breq("llama", 10, -1))
	if !errors.Is(err, ErrOutsideCandidates) {
		t.Fatalf("err %v", err)
	}
	// The rule does not stay on the group after the pick: a plain Pick sees every engine.
	rogue.fn = func(c []*Worker, _ *PickRequest) (Pick, error) { return Pick{Worker: c[len(c)-1]}, nil }
	if p, err := b.Decode.Pick(set.Load(), "b", breq("llama", 10, -1)); err != nil || p.Worker != dec[1] {
		t.Fatalf("plain pick after PickFor: %v %v", p.Worker, err)
	}
}
