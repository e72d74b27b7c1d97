//go:build !race

package engine

import (
	"testing"
	"time"
)

// TestSLOOrderAllocations locks in that the slo order of a usual bucket list, with the
// estimates it makes, does not allocate.
func TestSLOOrderAllocations(t *testing.T) {
	f := newSLOFleet(t)
	req := sloReq(1000, 200*time.Millisecond, 0)
	reg := f.set.Load()
	dst := make([]*Bucket, 0, 4)
	if n := testing.AllocsPerRun(1000, func() {
		bs, _ := f.res.Resolve(dst[:0], req.InputTokens, req.ExpectedPeak)
		f.res.Order(bs, req, reg)
	}); n != 0 {
		t.Fatalf("Resolve+Order: %v allocs, want 0", n)
	}
}
