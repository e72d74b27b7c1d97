//go:build !race

package engine

import (
	"testing"
)

// TestHashingPickAllocations locks in that consistent_hash and prefix_hash picks, and a DP
// rank pick, allocate nothing once the ring is built.
func TestHashingPickAllocations(t *testing.T) {
	ws := testWorkers(t, "llama", StagePlain, "w", 16)
	ch := NewConsistentHash(AdmissionLimits{MaxRunning: 1 << 40}, nil, 160, 1.25)
	ph := NewPrefixHash(AdmissionLimits{MaxRunning: 1 << 40}, nil, 8, 160, 1.25)
	req := hashReq("user-42")
	req.TokenIDs = []uint32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	for name, p := range map[string]Policy{"consistent_hash": ch, "prefix_hash": ph} {
		if _, err := p.Pick(ws, req); err != nil { // builds the ring
			t.Fatal(err)
		}
		if n := testing.AllocsPerRun(100, func() { _, _ = p.Pick(ws, req) }); n != 0 {
			t.Errorf("%s: %v allocations per pick", name, n)
		}
	}
	w := dpWorker(t, 4)
	g, reg := rankGroup(w, nil, 0)
	br := &BucketRequest{Model: "llama", ExpectedPeak: -1, Now: t0}
	if _, err := g.Pick(reg, "b", br); err != nil {
		t.Fatal(err)
	}
	if n := testing.AllocsPerRun(100, func() { _, _ = g.Pick(reg, "b", br) }); n != 0 {
		t.Errorf("rank pick: %v allocations", n)
	}
}
