//go:build !race

package actors

import (
	"math/rand/v2"
	"testing"

	"switchyard/engine"
)

// TestAffinityAllocations locks in the allocation budget of the affinity hot path: a lookup
// round trip, a first bind at the scope bound (one eviction), and a bound session_aware pick
// allocate nothing.
func TestAffinityAllocations(t *testing.T) {
	s, clk, _ := newAffStore(t, AffinityOptions{MaxBindings: 64})
	now := clk.Now()
	mustBind(t, s, affScope, "k", "", "W1", now)
	if n := testing.AllocsPerRun(1000, func() {
		if w, err := s.Lookup(affScope, "k", now); err != nil || w != "W1" {
			t.Fatal(w, err)
		}
	}); n != 0 {
		t.Fatalf("lookup: %v allocs, want 0", n)
	}

	keys := affKeys(4096)
	for _, k := range keys[:64] {
		mustBind(t, s, affScope, k, "", "W1", now) // fill the scope: later binds evict
	}
	i := 64
	if n := testing.AllocsPerRun(1000, func() {
		if _, set, err := s.Bind(affScope, keys[i%len(keys)], "", "W1", now); err != nil || !set {
			t.Fatal(set, err)
		}
		i++
	}); n != 0 {
		t.Fatalf("first bind: %v allocs, want 0", n)
	}

	ws := workers("w", 8, engine.StagePlain)
	p := engine.NewSessionAware(engine.AdmissionLimits{MaxInFlight: 100}, nil, s, rand.New(rand.NewPCG(1, 1)))
	req := &engine.PickRequest{BucketRequest: affRequest(newAffClock(), "chat", ""), Stage: engine.StagePlain, BucketID: "b"}
	if _, err := p.Pick(ws, req); err != nil {
		t.Fatal(err)
	}
	if n := testing.AllocsPerRun(1000, func() {
		if pk, err := p.Pick(ws, req); err != nil || pk.Reason != engine.ReasonSessionPrimary {
			t.Fatal(pk, err)
		}
	}); n != 0 {
		t.Fatalf("bound session pick: %v allocs, want 0", n)
	}
}
